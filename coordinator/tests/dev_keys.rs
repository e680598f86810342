//! network-security W5: the `--dev` role keys are public (derived from a
//! constant in the source), so a coordinator outside `--dev` refuses a
//! configuration that authorises one as validator or trainer, with a typed
//! error naming the role and the key; so do `run` and `check-config` of the
//! real binary. With `--dev` the same file is accepted.

use std::process::Command;

use coordinator::node::{Config, ConfigError, refuse_dev_keys};
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::Role;

fn dev_key(role: Role) -> tributary_protocol::identity::PublicKey {
    tributary_protocol::dev::key(role).public()
}

#[test]
fn a_dev_key_is_a_typed_refusal() {
    let own = |seed: u8| Keypair::from_seed([seed; 32]).public().to_string();
    let mut cfg = Config { validators: vec![own(7), own(8)], trainer: Some(own(9)), ..Config::default() };
    assert_eq!(refuse_dev_keys(&cfg), Ok(()));

    cfg.validators.push(dev_key(Role::Validator).to_string());
    assert_eq!(
        refuse_dev_keys(&cfg),
        Err(ConfigError::DevKey { role: Role::Validator, key: dev_key(Role::Validator) })
    );
    // Any spelling, and a dev key of another role.
    cfg.validators.pop();
    cfg.trainer = Some(format!(" {} ", dev_key(Role::Trainer).to_string().to_uppercase()));
    assert_eq!(refuse_dev_keys(&cfg), Err(ConfigError::DevKey { role: Role::Trainer, key: dev_key(Role::Trainer) }));
    cfg.trainer = Some(dev_key(Role::Validator).to_string());
    let e = refuse_dev_keys(&cfg).unwrap_err();
    assert_eq!(e, ConfigError::DevKey { role: Role::Trainer, key: dev_key(Role::Validator) });
    let msg = e.to_string();
    assert!(msg.contains("public --dev key") && msg.contains("coordinator keygen"), "{msg}");
}

#[test]
fn the_binary_refuses_dev_keys_outside_dev() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("coordinator.toml");
    let text = format!(
        "data_dir = {:?}\nmodel = \"/nonexistent/model.gguf\"\nvalidators = [\"{}\"]\n",
        dir.path().join("data"),
        dev_key(Role::Validator)
    );
    std::fs::write(&file, text).unwrap();
    let run = |args: &[&str]| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_coordinator")).args(args).env("RUST_BACKTRACE", "0").output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let f = file.to_str().unwrap();
    for args in
        [&["run", "--config", f][..], &["run", "--config", f, "--check-config"], &["check-config", "--config", f]]
    {
        let (ok, text) = run(args);
        assert!(!ok, "{args:?} started with a dev key: {text}");
        assert!(text.contains("public --dev key"), "{args:?}: {text}");
    }
    // With --dev the keys pass (the genesis must exist: check-config refuses a missing one).
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"").unwrap();
    let (ok, text) = run(&["run", "--dev", "--config", f, "--model", model.to_str().unwrap(), "--check-config"]);
    assert!(ok && text.contains("config=ok"), "--dev: {text}");
    assert!(!dir.path().join("data").exists(), "nothing was started");
}
