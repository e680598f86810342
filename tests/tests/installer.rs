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
        "installers/install-roles.sh",
    ] {
        assert!(listed.contains(&format!("{f}: OK")), "{f} not in SHA256SUMS:\n{listed}");
    }
    // A tampered file fails the check.
    std::fs::write(stage.join("runbook.md"), "tampered").unwrap();
    let o = Command::new("sha256sum").args(["-c", "--quiet", "SHA256SUMS"]).current_dir(&stage).output().unwrap();
    assert!(!o.status.success());

    // The archive's own installer, outside any source checkout, installs the
    // archive's miner (`--from-release FILE`, checked against SHA256SUMS beside it).
    let prefix = tmp.path().join("prefix");
    let fp = "ab".repeat(32);
    let from_release_with = |args: &[&std::ffi::OsStr]| {
        Command::new("bash")
            .arg(stage.join("installers/install-miner.sh"))
            .args(["--coordinator", "127.0.0.1:4433", "--fingerprint", &fp, "--accel", "cpu", "--no-doctor"])
            .args(["--no-service", "--prefix"])
            .arg(&prefix)
            .arg("--from-release")
            .args(args)
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let from_release = |archive: &Path| from_release_with(&[archive.as_os_str()]);
    let out = from_release(Path::new(&archive));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("SHA-256 ok"), "{t}");
    let o = Command::new(prefix.join("bin/edge-miner")).arg("--version").output().unwrap();
    assert!(o.status.success() && text(&o).contains("protocol "), "{}", text(&o));
    assert!(prefix.join("etc/tributary/miner.toml").is_file());
    // A changed archive (a byte appended) is refused before anything is installed.
    let bad_dir = tmp.path().join("bad");
    std::fs::create_dir_all(&bad_dir).unwrap();
    let bad = bad_dir.join(Path::new(&archive).file_name().unwrap());
    let mut bytes = std::fs::read(&archive).unwrap();
    bytes.push(0);
    std::fs::write(&bad, bytes).unwrap();
    std::fs::copy(tmp.path().join("SHA256SUMS"), bad_dir.join("SHA256SUMS")).unwrap();
    std::fs::remove_dir_all(&prefix).unwrap();
    let out = from_release(&bad);
    assert!(!out.status.success() && text(&out).contains("SHA-256 mismatch"), "{}", text(&out));
    assert!(!prefix.join("bin/edge-miner").exists(), "a tampered archive was installed");
    assert!(text(&out).contains("the file has "), "{}", text(&out));
    // A wrong --sha256 is refused the same way.
    let wrong = "0".repeat(64);
    let out = from_release_with(&[Path::new(&archive).as_os_str(), "--sha256".as_ref(), wrong.as_ref()]);
    assert!(!out.status.success() && text(&out).contains("SHA-256 mismatch"), "{}", text(&out));
    assert!(!prefix.join("bin/edge-miner").exists(), "installed against a wrong --sha256");
    // A miner's archive (the same, without the other roles' binaries, so the
    // rest stays quick): rebuilt around a changed binary with a SHA256SUMS to
    // match, it is refused by the archive's own list of its files; intact, it
    // installs from a URL (the archive and the SHA256SUMS beside it downloaded).
    let miner = tmp.path().join("miner");
    std::fs::create_dir_all(&miner).unwrap();
    let name = stage.file_name().unwrap().to_str().unwrap().to_string();
    let o = Command::new("bash")
        .args(["-euo", "pipefail", "-c"])
        .arg(
            r#"cd "$0" && tar -xzf "$1" && n="$2" && rm -f "$n"/bin/{coordinator,validator,trainer}
grep -v -e ' bin/coordinator$' -e ' bin/validator$' -e ' bin/trainer$' "$n/SHA256SUMS" > sums && mv sums "$n/SHA256SUMS"
mkdir good bad && tar -cf - "$n" | gzip -1 > "good/$n.tar.gz" && (cd good && sha256sum "$n.tar.gz" > SHA256SUMS)
printf x >> "$n/bin/edge-miner" && tar -cf - "$n" | gzip -1 > "bad/$n.tar.gz" && (cd bad && sha256sum "$n.tar.gz" > SHA256SUMS)"#,
        )
        .arg(&miner)
        .arg(&archive)
        .arg(&name)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = from_release(&miner.join(format!("bad/{name}.tar.gz")));
    let t = text(&out);
    assert!(!out.status.success() && t.contains("bin/edge-miner does not match its SHA-256"), "{t}");
    assert!(!prefix.join("bin/edge-miner").exists(), "an archive with a changed binary was installed");
    let url = serve_files(&miner.join("good"));
    let out = from_release_with(&[format!("{url}/{name}.tar.gz").as_ref()]);
    let t = text(&out);
    assert!(out.status.success() && t.contains("downloading ") && t.contains("SHA-256 ok"), "{t}");
    let o = Command::new(prefix.join("bin/edge-miner")).arg("--version").output().unwrap();
    assert!(o.status.success() && text(&o).contains("protocol "), "{}", text(&o));

    // The archive's roles installer, with no arguments but a prefix, installs
    // the archive's coordinator, validator and trainer and their units; the
    // libtorch they link comes along, and they run with an empty environment.
    let roles = tmp.path().join("roles");
    let o = Command::new("bash")
        .arg(stage.join("installers/install-roles.sh"))
        .arg("--prefix")
        .arg(&roles)
        .arg("--link")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(roles.join("lib/systemd/system/tributary-validator.service").is_file(), "{}", text(&o));
    for b in ["coordinator", "validator", "trainer"] {
        let o = Command::new(roles.join("bin").join(b)).arg("--version").env_clear().output().unwrap();
        assert!(o.status.success() && text(&o).contains("protocol "), "{b}: {}", text(&o));
    }
}

/// Serves the files of `dir` over plain HTTP on loopback (GET only), for the
/// life of the test: the address `http://127.0.0.1:PORT`.
fn serve_files(dir: &Path) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = req.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
            let file = (!path.contains("..")).then(|| std::fs::read(dir.join(&path)).ok()).flatten();
            let _ = match file {
                Some(body) => s
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                            .as_bytes(),
                    )
                    .and_then(|_| s.write_all(&body)),
                None => s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            };
        }
    });
    format!("http://{addr}")
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

/// Lines from a child's pipe, read on a thread until `until` matches one
/// (returned with every line before it), then the pipe is closed: the child
/// writes on into a pipe nobody reads (`| head -1`, a terminal that went away).
fn read_then_close(pipe: impl std::io::Read + Send + 'static, until: &'static str) -> mpsc::Receiver<Vec<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let done = line.contains(until);
            seen.push(line);
            if done {
                break;
            }
        }
        let _ = tx.send(seen);
        // The reader drops here: the pipe's read end is closed.
    });
    rx
}

/// `kill -TERM`, then the exit status within `secs` (None if still running).
fn terminate(child: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("running kill");
    assert!(sent.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// One plain HTTP GET's status line and body (the coordinator's dashboard port).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connecting to the coordinator's HTTP port");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A coordinator and a miner whose stderr *and* stdout close (`role 2>&1 |
/// head -1`, `ssh host 'role &'`, a closed terminal) keep working, and stop
/// in order on SIGTERM: exit 0, the database closed cleanly. Before
/// `log_internal_errors(false)` every log line after the close panicked in
/// the task that wrote it (tracing-subscriber reported the failed write with
/// `eprintln!`), and the stop handler, which logged "stopping" before
/// cancelling, died before it cancelled: SIGTERM did nothing.
#[test]
fn services_whose_stderr_and_stdout_close_keep_running_and_stop_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("coordinator");
    let mut coord = Command::new(bin_dir().join("coordinator"))
        .args(["run", "--dev", "--data"])
        .arg(&data)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn coordinator");
    let out = read_then_close(coord.stdout.take().unwrap(), "data=");
    let err = read_then_close(coord.stderr.take().unwrap(), "coordinator running");
    let out = out.recv_timeout(Duration::from_secs(120)).expect("the coordinator's address lines");
    let value = |k: &str| out.iter().find_map(|l| l.strip_prefix(k)).map(str::to_string).expect(k);
    let (quic, fingerprint, http) = (value("quic="), value("fingerprint="), value("http=http://"));
    let coord_log = err.recv_timeout(Duration::from_secs(120)).expect("the coordinator's log");

    let miner_data = tmp.path().join("miner");
    let mut miner = Command::new(bin_dir().join("edge-miner"))
        .args(["run", "--dev", "--coordinator", &quic, "--fingerprint", &fingerprint, "--metrics", "127.0.0.1:0"])
        .arg("--data")
        .arg(&miner_data)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn miner");
    let miner_out = read_then_close(miner.stdout.take().unwrap(), "metrics=");
    // The miner's one line per window: its stderr closes after the first.
    let miner_err = read_then_close(miner.stderr.take().unwrap(), "window mined");
    let miner_key = miner_out.recv_timeout(Duration::from_secs(120)).expect("miner= line");
    let miner_log = miner_err.recv_timeout(Duration::from_secs(180)).expect("the miner's log");
    assert!(
        miner_log.last().is_some_and(|l| l.contains("window mined")),
        "no per-window line:\n{}",
        miner_log.join("\n")
    );

    // Both go on logging into closed pipes for a while (a window closes, groups are submitted).
    std::thread::sleep(Duration::from_secs(4));
    assert!(coord.try_wait().unwrap().is_none(), "the coordinator ended with its pipes closed");
    assert!(miner.try_wait().unwrap().is_none(), "the miner ended with its pipes closed");
    let page = http_get(&http, "/api/miners");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let key = miner_key.iter().find_map(|l| l.strip_prefix("miner=")).expect("miner=KEY").to_string();
    assert!(page.contains(&key), "the coordinator does not list the miner {key}:\n{page}");
    let miner_metrics = miner_key.iter().find_map(|l| l.strip_prefix("metrics=http://")).expect("metrics= line");
    let miner_metrics = miner_metrics.trim_end_matches("/metrics").to_string();
    check_metrics_and_dashboards(&http_get(&http, "/metrics"), &http_get(&miner_metrics, "/metrics"));
    assert!(http_get(&http, "/health").starts_with("HTTP/1.1 200"));
    assert!(http_get(&http, "/ready").starts_with("HTTP/1.1 200"));

    let miner_status = terminate(&mut miner, 60);
    let coord_status = terminate(&mut coord, 30);
    for child in [&mut miner, &mut coord] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(miner_status.is_some_and(|s| s.success()), "miner after SIGTERM: {miner_status:?}");
    assert!(coord_status.is_some_and(|s| s.success()), "coordinator after SIGTERM: {coord_status:?}");
    // In order: the database was closed, not left for redb to repair.
    let repaired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = repaired.clone();
    let db = redb::Builder::new()
        .set_repair_callback(move |_| flag.store(true, std::sync::atomic::Ordering::Relaxed))
        .create(data.join("coordinator.redb"))
        .expect("opening the database");
    drop(db);
    assert!(!repaired.load(std::sync::atomic::Ordering::Relaxed), "the database needed a repair after SIGTERM");

    // A pipe is not a terminal: no colour codes; and llama.cpp's pooling notice is gone.
    for (name, log) in [("coordinator", &coord_log), ("miner", &miner_log)] {
        assert!(
            !log.iter().any(|l| l.contains('\u{1b}')),
            "colour codes in the {name}'s piped log:\n{}",
            log.join("\n")
        );
    }
    assert!(!miner_log.iter().any(|l| l.contains("pooling_type")), "{}", miner_log.join("\n"));
}

/// Logs for files and journald: no colour codes when stderr is a file, and
/// `--log-format json` writes one JSON object per line.
#[test]
fn log_files_have_no_colour_codes_and_json_is_one_object_per_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, format) in [None, Some("json")].into_iter().enumerate() {
        let log = tmp.path().join(format!("coordinator-{i}.log"));
        let mut cmd = Command::new(bin_dir().join("coordinator"));
        if let Some(f) = format {
            cmd.args(["--log-format", f]);
        }
        let mut child = cmd
            .args(["run", "--dev", "--data"])
            .arg(tmp.path().join(format!("data-{i}")))
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let text = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("coordinator running") || std::time::Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(text.contains("coordinator running"), "{text}");
        assert!(!text.contains('\u{1b}'), "colour codes in a log file:\n{text}");
        if format.is_some() {
            for line in text.lines() {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
            }
        }
    }
}

/// `--version` on every binary names the git commit and the protocol
/// version; `completions bash` writes a completion script.
#[test]
fn every_binary_has_version_and_completions() {
    let dir = bin_dir();
    let protocol = format!("protocol {})", tributary_protocol::wire::PROTOCOL_VERSION);
    for b in ["coordinator", "edge-miner", "validator", "trainer"] {
        let o = Command::new(dir.join(b)).arg("--version").output().unwrap();
        let t = text(&o);
        assert!(o.status.success(), "{b} --version: {t}");
        assert!(t.starts_with(&format!("{b} {}", env!("CARGO_PKG_VERSION"))), "{b}: {t}");
        assert!(t.contains("(commit ") && t.contains(&protocol), "{b}: {t}");
        let o = Command::new(dir.join(b)).args(["completions", "bash"]).output().unwrap();
        let t = text(&o);
        assert!(o.status.success() && t.contains("complete -F") && t.contains(&format!(" {b}\n")), "{b}: {t}");
    }
    // Help texts speak to operators: no code paths; llama.cpp's names for quantization types;
    // a dataset file is --gsm8k, not --data (the data folder).
    for (b, sub) in [
        ("coordinator", "run"),
        ("edge-miner", "run"),
        ("edge-miner", "generate"),
        ("edge-miner", "quantize"),
        ("validator", "run"),
        ("validator", "check"),
        ("trainer", "run"),
    ] {
        let o = Command::new(dir.join(b)).args([sub, "--help"]).output().unwrap();
        let t = text(&o);
        assert!(o.status.success() && !t.contains("::"), "{b} {sub} --help names code:\n{t}");
        if sub == "quantize" {
            assert!(t.contains("Q4_0") && t.contains("Q8_0") && !t.contains("q4-0"), "{t}");
        }
        if sub == "generate" || sub == "check" {
            assert!(t.contains("--gsm8k") && !t.contains("--data"), "{b} {sub}: {t}");
        }
    }
}

/// `check-config` says ok only to configurations that can run: each value
/// that cannot work is refused naming its key (and, for a missing file, the
/// command that makes it); a relative path follows the config file; the
/// error is one line, its cause once, without a backtrace even with
/// RUST_BACKTRACE=1. The miner's check refuses a malformed fingerprint and
/// an address without a port.
#[test]
fn check_config_refuses_values_that_cannot_work() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = std::fs::read_to_string(root().join("docs/config/coordinator.toml")).unwrap();
    let coordinator_check = |config: &str| {
        let file = tmp.path().join("etc/coordinator.toml");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, config).unwrap();
        // From another working directory: relative paths follow the file, not the cwd.
        let o = Command::new(bin_dir().join("coordinator"))
            .args(["run", "--check-config", "--config"])
            .arg(&file)
            .current_dir(root())
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        (o.status.success(), text(&o))
    };
    // As documented, the genesis model is not on this machine: refused, saying how to make it.
    let (ok, t) = coordinator_check(&doc);
    assert!(!ok, "check-config accepted a missing model:\n{t}");
    assert!(t.contains("`model`") && t.contains("trainer init-base --out"), "{t}");
    assert!(!t.contains("backtrace") && t.matches("error:").count() == 1, "{t}");
    for line in t.lines().filter(|l| !l.is_empty()) {
        assert_eq!(t.matches(line).count(), 1, "printed twice: {line}\n{t}");
    }
    // A relative model path next to the file: found.
    std::fs::write(tmp.path().join("etc/base.gguf"), b"").unwrap();
    let set = |text: &str, key: &str, value: &str| -> String {
        text.lines()
            .map(|l| if l.starts_with(&format!("{key} = ")) { format!("{key} = {value}") } else { l.to_string() })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let good = set(&doc, "model", "\"base.gguf\"");
    let (ok, t) = coordinator_check(&good);
    assert!(ok, "{t}");
    assert!(t.contains(&format!("model={}", tmp.path().join("etc/base.gguf").display())), "{t}");
    for (key, value) in [("difficulty", "5000"), ("group_size", "1"), ("temperature", "-1.5"), ("window_ms", "0")] {
        let (ok, t) = coordinator_check(&set(&good, key, value));
        assert!(!ok, "{key} = {value} accepted:\n{t}");
        assert!(t.contains(&format!("`{key} = {value}`")), "{key}: {t}");
    }

    let fp = "ab".repeat(32);
    let miner = |coordinator: &str, fingerprint: &str| {
        let o = Command::new(bin_dir().join("edge-miner"))
            .args(["run", "--check-config", "--coordinator", coordinator, "--fingerprint", fingerprint])
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        (o.status.success(), text(&o))
    };
    let (ok, t) = miner("127.0.0.1:4433", &fp);
    assert!(ok, "{t}");
    let (ok, t) = miner("127.0.0.1:4433", "abc");
    assert!(!ok && t.contains("64 hex digits"), "{t}");
    let (ok, t) = miner("localhost", &fp);
    assert!(!ok && t.contains("localhost"), "{t}");
    assert!(!t.contains("backtrace"), "{t}");
}

/// Prometheus conventions on live `/metrics` pages (the coordinator's and the
/// miner's): a `# HELP` for every metric, `_seconds` histograms with buckets
/// (not summaries), every counter of the role there from the start, build
/// info and process metrics. And docs/grafana: every metric the dashboard and
/// the alert rules name is exported — live for the coordinator and the miner,
/// listed in `tributary_net::metrics::METRICS` for the validator and trainer.
fn check_metrics_and_dashboards(coordinator: &str, miner: &str) {
    use tributary_net::metrics::{Kind, METRICS};
    for (role, page) in [("coordinator", coordinator), ("miner", miner)] {
        assert!(page.starts_with("HTTP/1."), "{role}: {page}");
        let series: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("tributary_") || l.starts_with("process_"))
            .map(|l| l.split(['{', ' ']).next().unwrap_or(""))
            .collect();
        let names: std::collections::BTreeSet<&str> = series
            .iter()
            .map(|n| n.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count"))
            .collect();
        for n in &names {
            assert!(page.contains(&format!("# HELP {n} ")), "{role}: no HELP for {n}:\n{page}");
        }
        for m in METRICS.iter().filter(|m| m.role == role && m.kind == Kind::Counter) {
            assert!(names.contains(m.name), "{role}: counter {} missing at start:\n{page}", m.name);
        }
        for m in METRICS.iter().filter(|m| m.kind == Kind::Histogram && names.contains(m.name)) {
            assert!(series.contains(&format!("{}_bucket", m.name).as_str()), "{role}: {} has no buckets", m.name);
            assert!(page.contains(&format!("# TYPE {} histogram", m.name)), "{role}: {} is not a histogram", m.name);
        }
        assert!(page.contains("tributary_build_info{") && page.contains(&format!("role=\"{role}\"")), "{role}");
        assert!(names.contains("process_resident_memory_bytes"), "{role}: no process metrics");
    }
    let live = |name: &str| {
        [coordinator, miner].iter().any(|p| ["{", " ", "_bucket"].iter().any(|t| p.contains(&format!("\n{name}{t}"))))
    };
    for file in ["docs/grafana/tributary.json", "docs/grafana/alerts.yml"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let mut named = 0;
        for (i, _) in text.match_indices("tributary_").chain(text.match_indices("process_")) {
            let name: String = text[i..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if name == "tributary_" || text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '-') {
                continue; // a job name or a word, not a metric
            }
            named += 1;
            let base = name.trim_end_matches("_bucket");
            let listed = METRICS.iter().find(|m| m.name == base);
            match listed.map(|m| m.role) {
                Some("coordinator" | "miner") => assert!(live(base), "{file}: {base} is not on a live /metrics"),
                Some(_) => {}
                None => assert!(base.starts_with("process_") && live(base), "{file}: {base} is exported by no role"),
            }
        }
        assert!(named > 5, "{file}: {named} metric names");
    }
}

/// `installers/install-roles.sh` into a prefix: the validator and the trainer
/// load libtorch as an unprivileged user with an empty environment, from a
/// folder outside the source tree, as their systemd units run them
/// (`User=tributary-ROLE`, `ProtectHome=true`, no LD_LIBRARY_PATH). They
/// used to find libtorch only through the build's runpath into the builder's
/// virtual environment (`runuser -u nobody -- trainer --help`: "libtorch_cpu.so:
/// cannot open shared object file"). The libraries are hard-linked (`--link`:
/// the installed layout is the same as with copies, without copying ~450 MB).
#[test]
fn installed_roles_load_libtorch_as_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = bin_dir();
    let tmp = tempfile::tempdir().unwrap();
    // Readable by the unprivileged user (tempdir makes it 0700).
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let prefix = tmp.path().join("prefix");
    let out = Command::new("bash")
        .arg(root().join("installers/install-roles.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from-build")
        .arg(&dir)
        .arg("--link")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for f in ["bin/coordinator", "bin/validator", "bin/trainer", "lib/tributary/torch/lib/libtorch_cpu.so"] {
        assert!(prefix.join(f).is_file(), "{f} not installed:\n{t}");
    }
    // The units run the installed binaries.
    for role in ["coordinator", "validator", "trainer"] {
        let unit =
            std::fs::read_to_string(prefix.join(format!("lib/systemd/system/tributary-{role}.service"))).unwrap();
        let exec = format!("ExecStart={} run --config", prefix.join("bin").join(role).display());
        assert!(unit.contains(&exec), "{role}: {unit}");
    }

    // What the validator checks: a tiny model and two rollouts of it, in a folder the user can read.
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let model = work.join("tiny.gguf");
    let o = Command::new(dir.join("trainer")).args(["init-tiny", "--out"]).arg(&model).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let rollouts = work.join("rollouts.jsonl");
    let o = Command::new(dir.join("edge-miner"))
        .args(["generate", "--env", "arith", "--tasks", "1", "--group", "2", "--max-new-tokens", "16"])
        .args(["--seed", "7", "--threads", "1", "--model"])
        .arg(&model)
        .arg("--out")
        .arg(&rollouts)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for f in [&model, &rollouts] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let config = work.join("role.toml");
    std::fs::write(
        &config,
        format!(
            "coordinator = \"127.0.0.1:4433\"\nfingerprint = \"{}\"\ndata = \"/nonexistent/data\"\n",
            "ab".repeat(32)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();

    // As root, run each command as `nobody` (setpriv); otherwise as this user,
    // who cannot be kept out of the builder's folders, so the check that
    // libtorch comes from the prefix (ldd, below) is what counts.
    let root_user = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).is_file());
    assert!(!root_user || setpriv.is_some(), "setpriv (util-linux) is needed to run as nobody");
    let as_user = |bin: &str, args: &[&str]| {
        let exe = prefix.join("bin").join(bin);
        let mut c = match (root_user, setpriv) {
            (true, Some(s)) => {
                let mut c = Command::new(s);
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&exe);
                c
            }
            _ => Command::new(&exe),
        };
        let o = c.args(args).env_clear().current_dir(&work).output().unwrap();
        (o.status.success(), text(&o))
    };
    for bin in ["coordinator", "validator", "trainer"] {
        let (ok, t) = as_user(bin, &["--help"]);
        assert!(ok && t.contains("Usage:"), "{bin} --help as an unprivileged user:\n{t}");
    }
    for bin in ["validator", "trainer"] {
        let (ok, t) = as_user(bin, &["run", "--check-config", "--config", "role.toml"]);
        assert!(ok && t.contains("coordinator = \"127.0.0.1:4433\""), "{bin} run --check-config:\n{t}");
    }
    // libtorch computes: the reference model checks both rollouts.
    let (ok, t) = as_user(
        "validator",
        &["check", "--model", "tiny.gguf", "--rollouts", "rollouts.jsonl", "--seed", "7", "--threads", "1"],
    );
    assert!(ok && t.contains("checked 2: 2 accepted, 0 rejected"), "validator check:\n{t}");

    // Every library the installed roles load is a system library or one in the prefix.
    for bin in ["validator", "trainer"] {
        let o = Command::new("ldd").arg(prefix.join("bin").join(bin)).env_clear().output().unwrap();
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        for line in t.lines().filter(|l| l.contains("=>")) {
            let path = line.split("=>").nth(1).unwrap().split_whitespace().next().unwrap_or("");
            let system = ["/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/"].iter().any(|d| path.starts_with(d));
            let real = std::fs::canonicalize(path).unwrap_or_default();
            assert!(
                system || real.starts_with(prefix.join("lib/tributary").canonicalize().unwrap()),
                "the installed {bin} loads a library from outside the prefix: {line}\n{t}"
            );
        }
    }
}
