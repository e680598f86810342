//! The validator's folder of downloaded checkpoints (`DATA/models`).
//!
//! The service downloads each checkpoint it proves against as a full file
//! (~260 MiB for SmolLM2-135M in BF16, gigabytes for the models a network
//! trains), one per publication. Kept forever, a 30-window bench grew one
//! validator's folder to 3.1 GiB in 13 windows; [`prune`] keeps it to the few
//! checkpoints rollouts may still name.

use std::path::{Path, PathBuf};

/// Checkpoint files kept in the models folder besides the loaded one: a
/// window's rollouts name the checkpoint in force when they were generated,
/// at most a couple of publications behind the newest.
pub const KEEP_MODELS: usize = 3;

/// Deletes the oldest `*.gguf` files of `dir` (by modification time) so that
/// at most `keep` remain, never `current` (the loaded model). Partial
/// downloads (`*.part`) older than the newest file go too. Returns the
/// removed paths; a file that cannot be removed is logged and left.
pub fn prune(dir: &Path, keep: usize, current: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if !matches!(ext, Some("gguf") | Some("part")) || path == current {
            continue;
        }
        let modified = entry.metadata()?.modified()?;
        files.push((modified, path));
    }
    // Newest first; the current file counts towards `keep`.
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut kept = usize::from(current.exists());
    let mut removed = Vec::new();
    for (_, path) in files {
        let is_model = path.extension().and_then(|e| e.to_str()) == Some("gguf");
        if is_model && kept < keep {
            kept += 1;
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not remove an old checkpoint"),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn file(dir: &Path, name: &str, age_s: u64) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, name).unwrap();
        let t = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(t).unwrap();
        p
    }

    #[test]
    fn keeps_the_newest_and_the_loaded_model() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // The loaded model is the oldest file: it stays whatever its age.
        let current = file(d, "a.gguf", 500);
        let b = file(d, "b.gguf", 400);
        let c = file(d, "c.gguf", 300);
        let e = file(d, "e.gguf", 200);
        let f = file(d, "f.gguf", 100);
        let part = file(d, "g.part", 50);
        let other = file(d, "progress.json", 600);
        let mut removed = prune(d, 3, &current).unwrap();
        removed.sort();
        assert_eq!(removed, vec![b.clone(), c.clone(), part.clone()]);
        for p in [&current, &e, &f, &other] {
            assert!(p.exists(), "{}", p.display());
        }
        // Idempotent.
        assert!(prune(d, 3, &current).unwrap().is_empty());
    }
}
