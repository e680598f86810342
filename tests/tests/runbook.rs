//! Runs `docs/runbook.md` as written: every ```` ```sh ```` block (not those
//! marked `not-run-by-test`), in order, with bash, against a local
//! coordinator. The paths block is replaced by a scratch folder; a stand-in
//! `systemctl` on `PATH` starts and stops that coordinator (other units are
//! only reported). After each section the test checks the effect over QUIC
//! and HTTP: the new validator key is admitted and the old one refused, the
//! window length changed without renumbering, the ban is in force at once on
//! the running coordinator (the live path, through its admin socket), kept
//! across a restart, and then lifted live, a restore keeps the certificate,
//! and after the CA section a client pinning the CA connects while the old
//! fingerprint is refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use tributary_net::{NetError, Session};
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{ErrorCode, Role};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target profile folder").to_path_buf();
    assert!(dir.join("coordinator").is_file(), "run `cargo build --workspace` first");
    dir
}

/// The runbook's shell blocks: (section heading, run by the test?, code).
fn blocks(md: &str) -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut lines = md.lines();
    while let Some(l) = lines.next() {
        if let Some(h) = l.strip_prefix("## ") {
            heading = h.trim().to_string();
        }
        if let Some(info) = l.strip_prefix("```sh") {
            let run = !info.contains("not-run-by-test");
            let code: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            out.push((heading.clone(), run, code.join("\n")));
        }
    }
    out
}

const SYSTEMCTL: &str = r#"#!/usr/bin/env bash
# Test stand-in for systemctl: runs the runbook's coordinator as a child process.
set -euo pipefail
verb="$1"; shift
[ "${1:-}" = "--now" ] && shift
for unit in "$@"; do
  case "$unit" in
    tributary-coordinator|tributary-coordinator.service) ;;
    *) echo "systemctl (test stand-in): $verb $unit not managed here"; continue ;;
  esac
  stop() {
    if [ -f "$SHIM_STATE/pid" ]; then
      pid=$(cat "$SHIM_STATE/pid")
      kill -INT "$pid" 2>/dev/null || true
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$SHIM_STATE/pid"
    fi
  }
  start() {
    : > "$SHIM_STATE/out"
    coordinator run --config "$COORD_CONFIG" > "$SHIM_STATE/out" 2> "$SHIM_STATE/err" &
    echo $! > "$SHIM_STATE/pid"
    for _ in $(seq 600); do
      grep -q '^data=' "$SHIM_STATE/out" && return 0
      kill -0 "$(cat "$SHIM_STATE/pid")" 2>/dev/null || { cat "$SHIM_STATE/err" >&2; rm -f "$SHIM_STATE/pid"; return 1; }
      sleep 0.1
    done
    echo "coordinator did not start" >&2; return 1
  }
  case "$verb" in
    start|enable) start ;;
    stop) stop ;;
    restart) stop; start ;;
    *) echo "systemctl (test stand-in): $verb not supported" >&2; exit 2 ;;
  esac
done
"#;

fn free_port(udp: bool) -> u16 {
    if udp {
        std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    } else {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }
}

struct Env {
    vars: BTreeMap<&'static str, String>,
    path: String,
    state: PathBuf,
}

impl Env {
    fn bash(&self, code: &str) -> (bool, String) {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", code])
            .current_dir(root())
            .envs(self.vars.iter().map(|(k, v)| (*k, v.as_str())))
            .env("PATH", &self.path)
            .env("SHIM_STATE", &self.state)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.bash("systemctl stop tributary-coordinator");
    }
}

async fn connect(addr: SocketAddr, fp: &str, key: &Keypair, role: Role) -> Result<Session, NetError> {
    Session::connect(addr, fp, key, role).await
}

fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in\n{text}"))
        .trim()
        .to_string()
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runbook_commands_work_as_written() {
    let md = std::fs::read_to_string(root().join("docs/runbook.md")).unwrap();
    let blocks = blocks(&md);
    assert!(blocks.iter().filter(|b| b.1).count() >= 8, "runbook lost its runnable blocks");

    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let shim = t.join("shim");
    std::fs::create_dir_all(&shim).unwrap();
    std::fs::write(shim.join("systemctl"), SYSTEMCTL).unwrap();
    Command::new("chmod").arg("+x").arg(shim.join("systemctl")).status().unwrap();
    // The genesis model: the tiny test model (the real one takes minutes to prepare).
    let genesis = t.join("genesis.gguf");
    let src = tributary_protocol::checkpoint::Checkpoint::open(&tributary_assets::smollm2_q4_1()).unwrap();
    tributary_protocol::tiny::write_tiny(3, &src, &genesis).unwrap();
    let miner = Keypair::generate();
    let (quic_port, http_port) = (free_port(true), free_port(false));
    for d in ["etc", "var/validator", "backups", "ca"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    let vars: BTreeMap<&'static str, String> = [
        ("COORD_CONFIG", t.join("etc/coordinator.toml")),
        ("COORD_DATA", t.join("var/coordinator")),
        ("KEYS", t.join("etc")),
        ("VALIDATOR_DATA", t.join("var/validator")),
        ("GENESIS", genesis.clone()),
        ("BACKUP_DIR", t.join("backups")),
        ("CA_DIR", t.join("ca")),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.display().to_string()))
    .chain([
        ("QUIC_PORT", quic_port.to_string()),
        ("HTTP_PORT", http_port.to_string()),
        ("MINER", miner.public().to_string()),
        ("RUST_BACKTRACE", "0".to_string()),
    ])
    .collect();
    let env = Env {
        path: format!("{}:{}:{}", shim.display(), bin_dir().display(), std::env::var("PATH").unwrap_or_default()),
        vars,
        state: t.to_path_buf(),
    };
    let addr: SocketAddr = format!("127.0.0.1:{quic_port}").parse().unwrap();
    let validator_key = || Keypair::load(&t.join("var/validator/validator.key")).unwrap();

    let mut fingerprint = String::new();
    let mut old_validator = None;
    let mut ran = 0;
    let mut ca_checked = false;
    for (section, run, code) in &blocks {
        if code.starts_with("# Paths and names used below") {
            // Every variable the runbook uses is one the test sets.
            for line in code.lines().filter(|l| !l.starts_with('#')) {
                let name = line.split('=').next().unwrap_or_default();
                assert!(env.vars.contains_key(name), "runbook variable {name} unknown to the test");
            }
            continue;
        }
        if !run {
            continue;
        }
        if section == "Rotate the validator key" {
            old_validator = Some(validator_key());
        }
        let (ok, out) = env.bash(code);
        assert!(ok, "runbook section {section:?} failed:\n{code}\n---\n{out}");
        ran += 1;
        match section.as_str() {
            "Start a network" if code.contains("coordinator fingerprint") => {
                fingerprint = field(&out, "fingerprint");
                assert!(out.contains("\"id\""), "no checkpoint listed:\n{out}");
                // The configured validator key is admitted over QUIC.
                connect(addr, &fingerprint, &validator_key(), Role::Validator).await.unwrap();
            }
            "Rotate the validator key" => {
                let old = old_validator.take().unwrap();
                let new = validator_key();
                assert_ne!(old.public(), new.public());
                connect(addr, &fingerprint, &new, Role::Validator).await.unwrap();
                match connect(addr, &fingerprint, &old, Role::Validator).await {
                    Err(NetError::Refused(ErrorCode::Unauthorized, _)) => {}
                    other => panic!("old validator key not refused: {:?}", other.map(|s| s.coordinator)),
                }
            }
            "Change the window length" => {
                let s = connect(addr, &fingerprint, &Keypair::generate(), Role::Miner).await.unwrap();
                assert_eq!(s.welcome.schedule.length_ms(), 120_000);
                // Window numbers carried on: the clock is not back at window 0 of a fresh genesis.
                let w = s.welcome.schedule.window_at(s.welcome.now_ms).unwrap();
                assert!(w >= 1, "windows renumbered: {w}");
            }
            "Ban or unban a miner" => {
                // The coordinator was not stopped: the command went through its admin socket.
                assert!(!code.contains("systemctl"), "the ban section should not need a restart:\n{code}");
                assert!(out.contains("applied=live"), "{out}");
                let banned_now = || {
                    let v: serde_json::Value = serde_json::from_str(&http_get(http_port, "/api/miners")).unwrap();
                    v[miner.public().to_string()]["banned"].clone()
                };
                let banned = code.contains("coordinator ban ");
                // /api/miners is a snapshot at most a second old (dashboard::SNAPSHOT_MS).
                let mut seen = banned_now();
                for _ in 0..30 {
                    if seen == serde_json::Value::Bool(banned) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    seen = banned_now();
                }
                assert_eq!(seen, serde_json::Value::Bool(banned));
                if banned {
                    // A live ban is stored too: a restart keeps it.
                    let (ok, text) = env.bash("systemctl restart tributary-coordinator");
                    assert!(ok, "{text}");
                    assert_eq!(banned_now(), serde_json::Value::Bool(true), "the ban did not survive a restart");
                }
            }
            "Back up and restore the coordinator" if code.contains("LATEST") => {
                assert_eq!(field(&out, "fingerprint"), fingerprint, "a restore must keep the certificate");
                assert!(out.contains("window_ms=120000"), "{out}");
                connect(addr, &fingerprint, &validator_key(), Role::Validator).await.unwrap();
            }
            "Use your own certificate authority" => {
                let new_fp = field(&out, "fingerprint");
                assert_ne!(new_fp, fingerprint, "install-cert did not change the certificate");
                let pin = tributary_net::read_ca(&t.join("ca/ca.pem")).unwrap();
                connect(addr, &pin, &validator_key(), Role::Validator).await.unwrap();
                connect(addr, &new_fp, &validator_key(), Role::Validator).await.unwrap();
                let err = connect(addr, &fingerprint, &validator_key(), Role::Validator).await.unwrap_err();
                assert!(err.to_string().contains("fingerprint"), "{err}");
                ca_checked = true;
            }
            _ => {}
        }
    }
    assert!(ran >= 8, "only {ran} blocks ran");
    assert!(ca_checked, "the CA section did not run");
    assert!(!fingerprint.is_empty(), "the start section did not run");
}
