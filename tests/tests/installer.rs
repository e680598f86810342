//! `installers/install-miner.sh` (CPU path, into a throwaway prefix, reusing
//! the binaries this workspace already built so llama.cpp is not built twice),
//! `edge-miner doctor` against a local coordinator, and `scripts/release.sh`.
//!
//! These run the real binaries in the workspace's target folder (`cargo
//! build --workspace` or `cargo test --workspace` builds them first).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use edge_miner::doctor::MinerConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The folder holding the workspace's binaries (this test runs from its `deps/`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target profile folder").to_path_buf();
    for b in ["edge-miner", "coordinator"] {
        assert!(dir.join(b).is_file(), "{} missing: run `cargo build --workspace` first", dir.join(b).display());
    }
    dir
}

/// A `coordinator run --dev` child process, killed on drop.
struct DevCoordinator {
    child: Child,
    quic: String,
    fingerprint: String,
    /// Its stderr (the tracing log), shown when an install fails.
    log: PathBuf,
}

/// `coordinator run --dev --data DATA` with its stdout piped and its log in
/// `DATA.log`: the child and the log's path.
fn spawn_dev_coordinator(data: &Path) -> (Child, PathBuf) {
    let log = data.with_extension("log");
    let child = Command::new(bin_dir().join("coordinator"))
        .args(["run", "--dev", "--data"])
        .arg(data)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("coordinator log"))
        .spawn()
        .expect("spawn coordinator");
    (child, log)
}

impl DevCoordinator {
    fn start(data: &Path) -> Self {
        let (mut child, log) = spawn_dev_coordinator(data);
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        // Reads to the end, also after `start` has what it needs: the
        // coordinator's stdout stays open for its whole life.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut quic, mut fingerprint) = (None, None);
        while quic.is_none() || fingerprint.is_none() {
            let line = rx.recv_timeout(Duration::from_secs(120)).expect("coordinator did not print its addresses");
            if let Some(v) = line.strip_prefix("quic=") {
                quic = Some(v.to_string());
            }
            if let Some(v) = line.strip_prefix("fingerprint=") {
                fingerprint = Some(v.to_string());
            }
        }
        Self { child, quic: quic.unwrap_or_default(), fingerprint: fingerprint.unwrap_or_default(), log }
    }

    /// The coordinator's log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DevCoordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn installer() -> Command {
    let mut c = Command::new("bash");
    c.arg(root().join("installers/install-miner.sh"));
    c
}

#[test]
fn dry_run_shows_every_step_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    let fp = "ab".repeat(32);
    // No Rust on PATH and an empty home: the dry run shows the rustup step.
    let out = installer()
        .args(["--dry-run", "--coordinator", "127.0.0.1:4433", "--fingerprint", &fp, "--prefix"])
        .arg(&prefix)
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", tmp.path())
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("accelerator:"), "{t}");
    if !Path::new("/usr/bin/cargo").exists() && !Path::new("/bin/cargo").exists() {
        assert!(t.contains("sh.rustup.rs"), "{t}");
    }
    assert!(t.contains("would run: cargo install --path"), "{t}");
    assert!(t.contains("--locked"), "{t}");
    assert!(t.contains("would run: ") && t.contains(" init --data "), "{t}");
    assert!(t.contains("would write ") && t.contains("miner.toml"), "{t}");
    assert!(t.contains("tributary-miner.service") || t.contains("org.tributary.miner.plist"), "{t}");
    assert!(t.contains(" doctor --config "), "{t}");
    assert!(!prefix.exists(), "a dry run created {}", prefix.display());

    // Bad arguments are refused before anything happens.
    let out = installer().args(["--coordinator", "nowhere", "--fingerprint", &fp, "--dry-run"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("HOST:PORT"));
    let out = installer().args(["--coordinator", "127.0.0.1:1", "--fingerprint", "xyz", "--dry-run"]).output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn cpu_install_into_prefix_ends_with_doctor_passing() {
    let tmp = tempfile::tempdir().unwrap();
    let coord = DevCoordinator::start(&tmp.path().join("coordinator"));
    let prefix = tmp.path().join("prefix");
    let install = || {
        installer()
            .args(["--coordinator", &coord.quic, "--fingerprint", &coord.fingerprint, "--accel", "cpu", "--prefix"])
            .arg(&prefix)
            .arg("--from-build")
            .arg(bin_dir())
            .output()
            .unwrap()
    };
    let out = install();
    let t = text(&out);
    assert!(out.status.success(), "{t}\ncoordinator log:\n{}", coord.log());
    assert!(t.contains("doctor: ready to mine"), "{t}\ncoordinator log:\n{}", coord.log());
    for check in ["backend", "key", "coordinator", "clock", "window", "memory", "disk"] {
        assert!(t.lines().any(|l| l.starts_with("ok") && l.contains(check)), "{check} not ok:\n{t}");
    }
    // Nothing went to systemd: the unit is in the prefix, with the real command.
    assert!(t.contains("systemctl --user link"), "{t}");
    let unit = std::fs::read_to_string(prefix.join("lib/systemd/user/tributary-miner.service")).unwrap();
    let bin = prefix.join("bin/edge-miner");
    let config = prefix.join("etc/tributary/miner.toml");
    assert!(unit.contains(&format!("ExecStart={} run --config {}", bin.display(), config.display())), "{unit}");
    let cfg = MinerConfig::load(&config).unwrap();
    assert_eq!(cfg.coordinator, coord.quic);
    assert_eq!(cfg.fingerprint.as_deref(), Some(coord.fingerprint.as_str()));
    assert_eq!(cfg.gpu_layers, 0);
    // The unit's command mines with that config: it loads the key the installer made.
    let mut miner = Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(miner.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let _ = miner.kill();
    let _ = miner.wait();
    let installed_key = tributary_protocol::identity::Keypair::load(&cfg.data.join("miner.key")).unwrap();
    assert_eq!(first.trim(), format!("miner={}", installed_key.public()));
    let key_path = cfg.data.join("miner.key");
    let key = std::fs::read(&key_path).unwrap();

    // Re-running upgrades in place and keeps the key.
    let out = install();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("keeping the existing key"));
    assert_eq!(std::fs::read(&key_path).unwrap(), key);

    // The doctor fails, and says why, on a wrong pin, a missing key, and a dead coordinator.
    let doctor = |args: &[&str]| Command::new(&bin).arg("doctor").args(args).output().unwrap();
    let wrong = "0".repeat(64);
    let out = doctor(&["--coordinator", &coord.quic, "--fingerprint", &wrong, "--data", cfg.data.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FAIL coordinator"), "{}", text(&out));
    assert!(text(&out).contains("fingerprint"), "{}", text(&out));
    let empty = tmp.path().join("no-key");
    let out =
        doctor(&["--coordinator", &coord.quic, "--fingerprint", &coord.fingerprint, "--data", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FAIL key"), "{}", text(&out));
    assert!(text(&out).contains("edge-miner init"), "{}", text(&out));
    drop(coord);
    let out = doctor(&["--config", config.to_str().unwrap(), "--timeout", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FAIL coordinator"), "{}", text(&out));
}

/// A CA (`NAME/ca.pem`) made with openssl, as docs/runbook.md does, and, if
/// `coordinator_data` is given, a coordinator certificate signed by it,
/// installed there with `coordinator install-cert`.
fn openssl_ca(dir: &Path, name: &str, coordinator_data: Option<&Path>) -> PathBuf {
    let ca = dir.join(name);
    std::fs::create_dir_all(&ca).unwrap();
    let sh = |script: &str| {
        let o = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .env("CA", &ca)
            .env("COORDINATOR", bin_dir().join("coordinator"))
            .env("DATA", coordinator_data.unwrap_or(Path::new("")))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    };
    sh(
        r#"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=test CA" -keyout "$CA/ca.key" -out "$CA/ca.pem" 2>&1"#,
    );
    if coordinator_data.is_some() {
        sh(
            r#"openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=coordinator" -keyout "$CA/c.key" -out "$CA/c.csr" 2>&1
printf 'basicConstraints=CA:FALSE\n' > "$CA/c.ext"
openssl x509 -req -in "$CA/c.csr" -CA "$CA/ca.pem" -CAkey "$CA/ca.key" -CAcreateserial -days 30 -extfile "$CA/c.ext" -out "$CA/c.pem" 2>&1
"$COORDINATOR" install-cert --data "$DATA" --cert "$CA/c.pem" --key "$CA/c.key""#,
        );
    }
    ca.join("ca.pem")
}

#[test]
fn cpu_install_pinning_a_ca_ends_with_doctor_passing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("coordinator");
    let ca = openssl_ca(tmp.path(), "ca", Some(&data));
    let coord = DevCoordinator::start(&data);
    let prefix = tmp.path().join("prefix");
    let install = |pin: &[&str]| {
        installer()
            .args(["--coordinator", &coord.quic, "--accel", "cpu", "--no-service"])
            .args(pin)
            .arg("--prefix")
            .arg(&prefix)
            .arg("--from-build")
            .arg(bin_dir())
            .output()
            .unwrap()
    };
    // Both pins, or a file that is not a certificate, are refused.
    let out = install(&["--ca", ca.to_str().unwrap(), "--fingerprint", &coord.fingerprint, "--dry-run"]);
    assert!(!out.status.success() && text(&out).contains("not both"), "{}", text(&out));
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let out = install(&["--ca", junk.to_str().unwrap(), "--dry-run"]);
    assert!(!out.status.success() && text(&out).contains("not a PEM certificate"), "{}", text(&out));

    let out = install(&["--ca", ca.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}\ncoordinator log:\n{}", coord.log());
    assert!(t.contains("doctor: ready to mine"), "{t}\ncoordinator log:\n{}", coord.log());
    let config = prefix.join("etc/tributary/miner.toml");
    let cfg = MinerConfig::load(&config).unwrap();
    let installed_ca = prefix.join("etc/tributary/coordinator-ca.pem");
    assert_eq!((cfg.fingerprint.as_deref(), cfg.ca.as_deref()), (None, Some(installed_ca.as_path())));
    assert_eq!(std::fs::read(&installed_ca).unwrap(), std::fs::read(&ca).unwrap());

    // Another CA: the doctor fails and says so.
    let other = openssl_ca(tmp.path(), "other", None);
    let out = Command::new(prefix.join("bin/edge-miner"))
        .args(["doctor", "--config"])
        .arg(&config)
        .arg("--ca")
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not signed by the pinned CA"), "{}", text(&out));
}

#[test]
fn release_script_packages_binaries_with_checksums() {
    let dir = bin_dir();
    if ["validator", "trainer"].iter().any(|b| !dir.join(b).is_file()) {
        panic!("validator/trainer not built in {}: run `cargo build --workspace` first", dir.display());
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root().join("scripts/release.sh"))
        .args(["--profile", "dev", "--no-build", "--out"])
        .arg(tmp.path())
        .env("CARGO_TARGET_DIR", dir.parent().unwrap())
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let archive = t.lines().find_map(|l| l.strip_prefix("release=")).expect("release= line").to_string();
    assert!(Path::new(&archive).is_file());
    let check = |cwd: &Path| {
        let o = Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(cwd).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    check(tmp.path());
    let stage = Path::new(&archive).with_extension("").with_extension("");
    let listed = check(&stage);
    for f in [
        "bin/edge-miner",
        "bin/coordinator",
        "bin/validator",
        "bin/trainer",
        "systemd/tributary-coordinator.service",
        "config/coordinator.toml",
        "runbook.md",
        "installers/install-miner.sh",
    ] {
        assert!(listed.contains(&format!("{f}: OK")), "{f} not in SHA256SUMS:\n{listed}");
    }
    // A tampered file fails the check.
    std::fs::write(stage.join("runbook.md"), "tampered").unwrap();
    let o = Command::new("sha256sum").args(["-c", "--quiet", "SHA256SUMS"]).current_dir(&stage).output().unwrap();
    assert!(!o.status.success());
}

/// A coordinator whose reader goes away (a script that read its address and
/// quit, a closed terminal) keeps serving: its address lines are a courtesy,
/// not a reason to exit (CI once lost a run to `Broken pipe` here).
#[test]
fn a_coordinator_whose_stdout_closes_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, log) = spawn_dev_coordinator(&tmp.path().join("coordinator"));
    // Nobody will read it: the address lines meet a closed pipe.
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let running = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("coordinator running") {
            break true;
        }
        if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(running && alive, "the coordinator stopped when its stdout closed:\n{text}");
    assert!(text.contains("stdout"), "the lost address lines are not logged:\n{text}");
}
