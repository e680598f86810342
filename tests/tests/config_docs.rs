//! The documented configurations in `docs/config/` cannot drift from the
//! code: each file is read by the real parser of the binary that uses it
//! (`coordinator run --check-config`, `validator run --check-config`,
//! `trainer run --check-config`, `edge-miner run --check-config`), as
//! written and with every commented-out key switched on; and every key the
//! parser knows (it lists them when refusing an unknown one) is documented
//! in the file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target profile folder").to_path_buf();
    for b in ["coordinator", "validator", "trainer", "edge-miner"] {
        assert!(dir.join(b).is_file(), "{b} missing: run `cargo build --workspace` first");
    }
    dir
}

/// The command that reads a documented config file.
fn check(name: &str, file: &Path) -> Output {
    let (bin, before, after): (&str, &[&str], &[&str]) = match name {
        "coordinator.toml" => ("coordinator", &["run", "--config"], &["--check-config"]),
        "validator.toml" => ("validator", &["run", "--config"], &["--check-config"]),
        "trainer.toml" => ("trainer", &["run", "--config"], &["--check-config"]),
        "miner.toml" => ("edge-miner", &["run", "--config"], &["--check-config"]),
        other => panic!("docs/config/{other}: no parser known to this test (add it here)"),
    };
    let mut cmd = Command::new(bin_dir().join(bin));
    cmd.args(before).arg(file).args(after).env("RUST_BACKTRACE", "0");
    if name == "coordinator.toml" {
        // The documented genesis path is the operator's; check-config refuses
        // one that does not exist (installer.rs), so a stand-in file takes its place.
        let model = Path::new(env!("CARGO_TARGET_TMPDIR")).join("config_docs-genesis.gguf");
        std::fs::write(&model, b"").unwrap();
        cmd.arg("--model").arg(model);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `key = value` (a line that sets a key), its key.
fn key_of(line: &str) -> Option<&str> {
    let (k, _) = line.split_once(" = ")?;
    (!k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')).then_some(k)
}

#[test]
fn every_config_doc_parses_and_documents_every_key() {
    let tmp = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(root().join("docs/config")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let doc = std::fs::read_to_string(&path).unwrap();

        // As written.
        let out = check(&name, &path);
        assert!(out.status.success(), "{name} does not parse:\n{}", text(&out));

        // Every commented-out key switched on (not `ca`, the alternative to
        // `fingerprint`, nor placeholders like "<64 hex digits>").
        let mut switched = 0;
        let all_on: Vec<&str> = doc
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if key_of(rest).is_some_and(|k| k != "ca") && !rest.contains('<') => {
                    switched += 1;
                    rest
                }
                _ => l,
            })
            .collect();
        let on = tmp.path().join(&name);
        std::fs::write(&on, all_on.join("\n")).unwrap();
        let out = check(&name, &on);
        assert!(
            out.status.success(),
            "{name} with its {switched} commented-out keys switched on does not parse:\n{}",
            text(&out)
        );

        // A typo is refused, and the refusal lists every key the parser
        // knows: each one must be documented.
        std::fs::write(&on, format!("{doc}\nzz_not_a_key = 1\n")).unwrap();
        let out = check(&name, &on);
        let t = text(&out);
        assert!(!out.status.success(), "{name}: an unknown key was accepted");
        assert!(t.contains("unknown field `zz_not_a_key`"), "{name}: {t}");
        let expected =
            t.split_once("expected one of ").map(|(_, r)| r).unwrap_or_else(|| panic!("{name}: no key list in\n{t}"));
        let keys: Vec<&str> =
            expected.lines().next().unwrap().split(", ").map(|k| k.trim().trim_matches('`')).collect();
        assert!(keys.len() >= 5, "{name}: {keys:?}");
        let documented: Vec<&str> = doc.lines().filter_map(|l| key_of(l.strip_prefix("# ").unwrap_or(l))).collect();
        for k in &keys {
            assert!(documented.contains(k), "docs/config/{name} does not document `{k}`");
        }
        seen.push(name);
    }
    seen.sort();
    assert_eq!(seen, ["coordinator.toml", "miner.toml", "trainer.toml", "validator.toml"]);
}

#[test]
fn flags_override_the_config_file() {
    let out = Command::new(bin_dir().join("validator"))
        .args(["run", "--config"])
        .arg(root().join("docs/config/validator.toml"))
        .args(["--batch", "3", "--all", "--coordinator", "127.0.0.1:7000", "--check-config"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for line in ["batch = 3", "all = true", "coordinator = \"127.0.0.1:7000\"", "batch_tokens = 8192"] {
        assert!(t.lines().any(|l| l == line), "no `{line}` in\n{t}");
    }
    // Both pins at once are refused.
    let out = Command::new(bin_dir().join("trainer"))
        .args(["run", "--config"])
        .arg(root().join("docs/config/trainer.toml"))
        .args(["--ca", "/nonexistent.pem", "--fingerprint", "ab", "--check-config"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    // The miner's flags over its file.
    let out = Command::new(bin_dir().join("edge-miner"))
        .args(["run", "--config"])
        .arg(root().join("docs/config/miner.toml"))
        .args(["--gpu-layers", "7", "--backend", "wgpu", "--check-config"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.lines().any(|l| l == "gpu_layers = 7") && t.lines().any(|l| l == "backend = \"wgpu\""), "{t}");
}
