//! Helpers shared by the loopback QUIC tests.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::task_seed;
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::wire::WindowInfo;

/// Every await in these tests is bounded.
pub(crate) async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("timed out")
}

/// E2's oversized rollout: a signed rollout of `n` tokens (one prompt token,
/// completion ids past any vocabulary) for `key`'s task `group`, claiming
/// `max_new_tokens = n` — within the frame limit, outside the window's contract.
pub(crate) fn oversized(info: &WindowInfo, key: &Keypair, group: u32, index: u32, n: usize) -> Rollout {
    let mut r = Rollout {
        window: info.window,
        checkpoint: info.checkpoint,
        env: info.env,
        group,
        rollout: index,
        task_id: task_seed(&info.seed, key.public().as_bytes(), group),
        sampling: info.sampling,
        tokens: (0..n as u32).map(|j| 0xF000_0000 | j).collect(),
        prompt_len: 1,
        logprobs: vec![-1.0; n - 1],
        sketches: vec![1_073_741_823; n],
        reward: 0.0,
        miner: [0; 32],
        signature: [0; 64],
    };
    r.sampling.max_new_tokens = n as u32;
    r.sign(key);
    r
}

/// A realistic signed rollout for `key`'s assigned task `group`, index `index`:
/// 64 prompt tokens and `completion` completion tokens, with the window's
/// sampling settings (the coordinator's `max_new_tokens` must allow `completion`).
pub(crate) fn rollout(info: &WindowInfo, key: &Keypair, group: u32, index: u32, completion: usize) -> Rollout {
    let prompt = 64usize;
    let n = prompt + completion;
    let salt = u32::from_le_bytes([key.public().0[0], key.public().0[1], group as u8, index as u8]);
    let mut r = Rollout {
        window: info.window,
        checkpoint: info.checkpoint,
        env: info.env,
        group,
        rollout: index,
        task_id: task_seed(&info.seed, key.public().as_bytes(), group),
        sampling: info.sampling,
        tokens: (0..n as u32).map(|i| (i.wrapping_mul(2654435761) ^ salt) % 49152).collect(),
        prompt_len: prompt as u32,
        logprobs: (0..completion).map(|i| -(i as f32) / 100.0).collect(),
        sketches: (0..n as u32).map(|i| i.wrapping_mul(7919) ^ salt).collect(),
        reward: 1.0,
        miner: [0; 32],
        signature: [0; 64],
    };
    r.sign(key);
    r
}

/// A checkpoint id that is not the window's.
pub(crate) fn other_checkpoint() -> ContentId {
    ContentId([0xAB; 32])
}

/// A `coordinator run --dev` child process (killed, not stopped, on drop).
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) quic: SocketAddr,
    pub(crate) fingerprint: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `coordinator run --dev` on `data` (long windows) and reads the
/// lines it prints first.
pub(crate) fn spawn(data: &std::path::Path) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["run", "--dev", "--window-ms", "600000", "--data"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut get = |prefix: &str| {
        // Bounded: the child prints these lines first or exits (closing stdout).
        let line = lines.next().expect("coordinator exited").unwrap();
        line.strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix}, got {line}")).to_string()
    };
    let quic = get("quic=").parse().unwrap();
    let _http = get("http=");
    let fingerprint = get("fingerprint=");
    let _checkpoint = get("checkpoint=");
    let _data = get("data=");
    Proc { child, quic, fingerprint }
}

/// Everything logged at warn and above in this test process, as text
/// ([`Logs::install`]): what an operator reading the coordinator's log sees.
#[derive(Clone, Default)]
pub(crate) struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Installs the process's subscriber writing into the returned buffer.
    pub(crate) fn install() -> Logs {
        let logs = Logs::default();
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .try_init()
            .expect("the first subscriber of this test process");
        logs
    }

    /// The first line holding every one of `parts`.
    pub(crate) fn line(&self, parts: &[&str]) -> Option<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        text.lines().find(|l| parts.iter().all(|p| l.contains(p))).map(str::to_string)
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}
