//! A real S3-compatible object store for tests: a single-node Garage
//! started by `scripts/garage.sh` in a temporary folder, stopped on drop.

use std::path::PathBuf;
use std::process::Command;

/// A running single-node Garage with one bucket and a key for it.
pub struct Garage {
    /// `AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP` (what the coordinator's
    /// `s3://` archive reads from its environment).
    pub env: Vec<(String, String)>,
    /// The bucket.
    pub bucket: String,
    pid: u32,
    _dir: tempfile::TempDir,
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.pid.to_string()).status();
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The garage binary: `$GARAGE_BIN`, `garage` on `PATH`, or the cache's
/// (`TRIBUTARY_GARAGE=1 scripts/setup.sh` installs it there).
pub fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GARAGE_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("garage"))
        .find(|p| p.is_file());
    let cache = std::env::var_os("TRIBUTARY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tributary")));
    on_path.or_else(|| cache.map(|c| c.join("garage/bin/garage")).filter(|p| p.is_file()))
}

impl Garage {
    /// Starts one (`scripts/garage.sh`), or says why it cannot.
    pub fn start() -> Result<Garage, String> {
        let bin = binary().ok_or("no garage binary (GARAGE_BIN, PATH, or TRIBUTARY_GARAGE=1 scripts/setup.sh)")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new(repo_root().join("scripts/garage.sh"))
            .arg(dir.path())
            .env("GARAGE_BIN", &bin)
            .output()
            .map_err(|e| format!("scripts/garage.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!("scripts/garage.sh failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let text = std::fs::read_to_string(dir.path().join("env")).map_err(|e| e.to_string())?;
        let mut env = Vec::new();
        let (mut bucket, mut pid) = (String::new(), 0u32);
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else { continue };
            match k {
                "GARAGE_BUCKET" => bucket = v.to_owned(),
                "GARAGE_PID" => pid = v.parse().map_err(|e| format!("GARAGE_PID: {e}"))?,
                _ => env.push((k.to_owned(), v.to_owned())),
            }
        }
        if bucket.is_empty() || pid == 0 {
            return Err(format!("scripts/garage.sh wrote no bucket or pid: {text}"));
        }
        Ok(Garage { env, bucket, pid, _dir: dir })
    }

    /// The value of one of [`Garage::env`].
    pub fn var(&self, key: &str) -> &str {
        self.env.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v.as_str())
    }
}
