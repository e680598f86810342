//! `kl_beta` is gone (issue 31): the trainer keeps no reference model, so a
//! KL coefficient could only do nothing. A configuration that sets it is
//! refused with the parser's unknown-key error naming it, before anything
//! starts; the same file without it is accepted.

use std::process::Command;

fn check_config(toml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trainer.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(["run", "--config"])
        .arg(&path)
        .arg("--check-config")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

const BASE: &str = "coordinator = \"127.0.0.1:4433\"\n\
fingerprint = \"0000000000000000000000000000000000000000000000000000000000000000\"\n\
entropy_coef = 0.001\n";

#[test]
fn a_config_that_sets_kl_beta_is_refused() {
    let (ok, text) = check_config(BASE);
    assert!(ok, "the file without kl_beta parses:\n{text}");
    assert!(!text.contains("kl_beta"), "no KL key is printed back:\n{text}");
    for value in ["0.0", "0.1"] {
        let (ok, text) = check_config(&format!("{BASE}kl_beta = {value}\n"));
        assert!(!ok, "kl_beta = {value} must be refused:\n{text}");
        assert!(text.contains("unknown field `kl_beta`"), "the error names the key:\n{text}");
    }
}
