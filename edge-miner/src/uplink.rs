//! The miner's uplink to the coordinator: connect (pinned certificate, key
//! proof), learn the window and its assignment, stream signed rollouts with
//! pipelined acknowledgements, and on a lost connection reconnect with
//! exponential backoff and resume without duplicates (the coordinator's
//! `Progress` says which slots are already stored). The connection and its
//! retried requests are the client roles' shared [`tributary_net::Client`].

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use tributary_net::{Backoff, Client, ClientConfig, ClientError, KeyPin, Session};
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    self, Blob, ErrorCode, Frame, GetProgress, GetWindow, NetworkId, Outcome, RejectReason, Role, Submit, SubmitBatch,
    WindowInfo,
};

/// Uplink failures.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// The coordinator stayed unreachable through every attempt, refused us
    /// (role, key, version) or a request, or answered out of protocol.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No window is open.
    #[error("no window open")]
    NoWindow,
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct UplinkConfig {
    /// The coordinator's QUIC address.
    pub addr: SocketAddr,
    /// Its certificate fingerprint (hex).
    pub fingerprint: String,
    /// The coordinator key this miner accepts (its network).
    pub coordinator_key: KeyPin,
    /// First retry delay.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Connection attempts before giving up.
    pub max_attempts: u32,
}

impl UplinkConfig {
    /// Defaults: 200 ms doubling to 30 s, 20 attempts.
    pub fn new(addr: SocketAddr, fingerprint: impl Into<String>) -> Self {
        Self {
            addr,
            fingerprint: fingerprint.into(),
            coordinator_key: KeyPin::Any,
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            max_attempts: 20,
        }
    }
}

/// The most rollouts the uplink puts in one `SubmitBatch` frame.
pub const BATCH_ROLLOUTS: usize = 64;

/// Splits `pending` (indices into `encoded`) into frames: runs of at most
/// [`BATCH_ROLLOUTS`] rollouts and [`wire::MAX_BATCH_LEN`] bytes.
fn frames_of(pending: &[usize], encoded: &[Vec<u8>]) -> Vec<std::ops::Range<usize>> {
    let budget = wire::MAX_BATCH_LEN as usize - 1024;
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, &i) in pending.iter().enumerate() {
        let len = encoded[i].len() + 8;
        if k > start && (k - start == BATCH_ROLLOUTS || bytes + len > budget) {
            out.push(start..k);
            (start, bytes) = (k, 0);
        }
        bytes += len;
    }
    if start < pending.len() {
        out.push(start..pending.len());
    }
    out
}

/// What became of a batch of rollouts.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SubmitReport {
    /// Digests acknowledged durable (now or in an earlier connection).
    pub stored: Vec<[u8; 32]>,
    /// Refused, by index in the batch.
    pub refused: Vec<(usize, RejectReason)>,
}

/// Tries of a request whose connection was lost (reconnecting between them, at once).
const REQUEST_TRIES: u32 = 3;

/// The uplink.
#[derive(Debug)]
pub struct Uplink {
    cfg: UplinkConfig,
    client: Client,
    seq: u64,
}

impl Uplink {
    /// An uplink for `key`; nothing connects until first use.
    pub fn new(cfg: UplinkConfig, key: Keypair) -> Self {
        let client = Client::new(ClientConfig {
            coordinator_key: cfg.coordinator_key.clone(),
            connect: Backoff { min: cfg.min_backoff, max: cfg.max_backoff, attempts: cfg.max_attempts },
            request: Backoff { min: Duration::ZERO, max: Duration::ZERO, attempts: REQUEST_TRIES },
            ..ClientConfig::new(cfg.addr, cfg.fingerprint.clone(), key, Role::Miner)
        });
        Self { cfg, client, seq: 0 }
    }

    /// Connects if needed, retrying with exponential backoff.
    async fn session(&mut self) -> Result<&mut Session, UplinkError> {
        Ok(self.client.session().await?)
    }

    /// The network of the coordinator this uplink is connected to (connecting if needed).
    pub async fn network(&mut self) -> Result<NetworkId, UplinkError> {
        Ok(self.client.network().await?)
    }

    /// Drops the connection (the next call reconnects).
    pub fn disconnect(&mut self) {
        self.client.disconnect();
    }

    /// Sends a request and waits for its answer, reconnecting (at most
    /// twice) if the connection was lost; an error frame is
    /// [`ClientError::Refused`].
    pub async fn request(&mut self, frame: &Frame) -> Result<Frame, UplinkError> {
        Ok(self.client.request(frame).await?)
    }

    /// The window open now, with this miner's assignment parameters.
    pub async fn window(&mut self) -> Result<WindowInfo, UplinkError> {
        match self.request(&Frame::GetWindow(GetWindow { window: None })).await {
            Ok(Frame::WindowInfo(w)) => Ok(w),
            Ok(f) => Err(ClientError::Unexpected(f.tag()).into()),
            Err(UplinkError::Client(e)) if e.refusal() == Some(ErrorCode::NotYet) => Err(UplinkError::NoWindow),
            Err(e) => Err(e),
        }
    }

    /// The (group, index) slots of ours already stored in `window`.
    pub async fn progress(&mut self, window: WindowId) -> Result<HashSet<(u32, u32)>, UplinkError> {
        match self.request(&Frame::GetProgress(GetProgress { window })).await? {
            Frame::Progress(p) => Ok(p.slots.into_iter().collect()),
            f => Err(ClientError::Unexpected(f.tag()).into()),
        }
    }

    /// Streams signed rollouts (pipelined) until each is stored or refused.
    /// After a lost connection it reconnects and skips what the coordinator
    /// already stored, so nothing is sent twice once acknowledged.
    pub async fn submit(&mut self, rollouts: &[Rollout]) -> Result<SubmitReport, UplinkError> {
        let mut report = SubmitReport::default();
        let mut done = vec![false; rollouts.len()];
        let mut rounds = 0;
        while done.iter().any(|d| !d) {
            rounds += 1;
            if rounds > self.cfg.max_attempts {
                return Err(UplinkError::NoWindow);
            }
            // Skip slots the coordinator already holds (from an earlier connection).
            let windows: HashSet<WindowId> = rollouts.iter().map(|r| r.window).collect();
            for w in windows {
                let stored = self.progress(w).await?;
                for (i, r) in rollouts.iter().enumerate() {
                    if !done[i] && r.window == w && stored.contains(&(r.group, r.rollout)) {
                        done[i] = true;
                        report.stored.push(r.digest());
                    }
                }
            }
            let pending: Vec<usize> = (0..rollouts.len()).filter(|i| !done[*i]).collect();
            if pending.is_empty() {
                break;
            }
            let base = self.seq;
            self.seq += pending.len() as u64;
            let s = self.session().await?;
            // Several rollouts ready: one frame per run of them, answered together.
            let mut encoded: Vec<Vec<u8>> =
                (0..rollouts.len()).map(|i| if done[i] { Vec::new() } else { rollouts[i].encode() }).collect();
            let runs = frames_of(&pending, &encoded);
            let mut failed = false;
            for run in &runs {
                let seq = base + run.start as u64;
                let f = if run.len() == 1 {
                    Frame::Submit(Submit { seq, rollout: Blob(std::mem::take(&mut encoded[pending[run.start]])) })
                } else {
                    let batch = pending[run.clone()].iter().map(|&i| Blob(std::mem::take(&mut encoded[i]))).collect();
                    Frame::SubmitBatch(SubmitBatch { seq, rollouts: batch })
                };
                if s.send(&f).await.is_err() {
                    failed = true;
                    break;
                }
            }
            let mut settle = |seq: u64, outcome: Outcome| {
                let Some(&i) = seq.checked_sub(base).and_then(|k| pending.get(k as usize)) else { return };
                match outcome {
                    Outcome::Stored(digest) => {
                        done[i] = true;
                        report.stored.push(digest);
                    }
                    // Refusals other than a transient one are final.
                    Outcome::Refused(RejectReason::Internal | RejectReason::RateLimited) => {}
                    Outcome::Refused(RejectReason::Duplicate) => {
                        done[i] = true;
                        report.stored.push(rollouts[i].digest());
                    }
                    Outcome::Refused(reason) => {
                        done[i] = true;
                        report.refused.push((i, reason));
                    }
                }
            };
            if !failed {
                for _ in 0..runs.len() {
                    match s.recv().await {
                        Ok(Frame::Ack(a)) => settle(a.seq, Outcome::Stored(a.digest)),
                        Ok(Frame::Refused(r)) => settle(r.seq, Outcome::Refused(r.reason)),
                        Ok(Frame::BatchAnswer(b)) => {
                            for (k, o) in b.outcomes.into_iter().enumerate() {
                                settle(b.seq + k as u64, o);
                            }
                        }
                        Ok(f) => return Err(ClientError::Unexpected(f.tag()).into()),
                        Err(e) if e.is_final() => return Err(ClientError::Refused(e).into()),
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            if failed {
                self.disconnect();
                tokio::time::sleep(self.cfg.min_backoff).await;
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coordinator::node::{self, Config};
    use tributary_protocol::checkpoint::ContentId;
    use tributary_protocol::env::task_seed;

    fn rollout(info: &WindowInfo, key: &Keypair, group: u32, index: u32) -> Rollout {
        // Within the window's generation contract, which the coordinator enforces.
        let completion = info.sampling.max_new_tokens;
        let n = 32 + completion;
        let mut r = Rollout {
            window: info.window,
            checkpoint: info.checkpoint,
            env: info.env,
            group,
            rollout: index,
            task_id: task_seed(&info.seed, key.public().as_bytes(), group),
            sampling: info.sampling,
            tokens: (0..n).map(|i| (i * 31 + group * 1000 + index * 7) % 49152).collect(),
            prompt_len: 32,
            logprobs: vec![-0.5; completion as usize],
            sketches: (0..n).map(|i| i ^ (group << 8) ^ index).collect(),
            reward: 0.0,
            miner: [0; 32],
            signature: [0; 64],
        };
        r.sign(key);
        r
    }

    #[test]
    fn frames_split_by_count_and_bytes() {
        let small: Vec<Vec<u8>> = vec![vec![0; 100]; 200];
        let all: Vec<usize> = (0..200).collect();
        let runs = frames_of(&all, &small);
        assert_eq!(runs, vec![0..64, 64..128, 128..192, 192..200]);
        let big: Vec<Vec<u8>> = vec![vec![0; 3 << 20]; 5];
        let runs = frames_of(&[0, 2, 3, 4], &big);
        assert_eq!(runs, vec![0..2, 2..4], "at most two 3 MiB rollouts fit a batch");
        assert!(frames_of(&[], &big).is_empty());
    }

    #[tokio::test]
    async fn streams_and_resumes_without_duplicates() {
        let within = |d| Duration::from_secs(d);
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::dev(dir.path().to_path_buf());
        cfg.window_ms = 600_000;
        let n = tokio::time::timeout(within(30), node::start(&cfg, ContentId([1; 32]))).await.unwrap().unwrap();
        let key = Keypair::from_seed([11; 32]);
        let mut up = Uplink::new(UplinkConfig::new(n.quic, n.fingerprint.clone()), key.clone());
        let info = tokio::time::timeout(within(30), up.window()).await.unwrap().unwrap();
        let all: Vec<Rollout> =
            (0..2).flat_map(|g| (0..4).map(move |i| (g, i))).map(|(g, i)| rollout(&info, &key, g, i)).collect();
        let first = tokio::time::timeout(within(30), up.submit(&all[..3])).await.unwrap().unwrap();
        assert_eq!(first.stored.len(), 3);
        assert!(first.refused.is_empty());
        // Lose the connection, then resubmit everything: the first three are
        // recognised as stored and not sent again; the rest are acknowledged.
        up.disconnect();
        let second = tokio::time::timeout(within(30), up.submit(&all)).await.unwrap().unwrap();
        assert_eq!(second.stored.len(), all.len());
        assert!(second.refused.is_empty());
        let m = n.shared.core().miners()[&key.public()].clone();
        assert_eq!(m.accepted, all.len() as u64);
        assert_eq!(m.rejected.get("duplicate"), None, "nothing was sent twice");
        assert_eq!(n.shared.store.rollout_count().unwrap(), all.len() as u64);
        // A bad rollout is reported with its reason.
        let mut bad = rollout(&info, &key, 3, 0);
        bad.task_id ^= 1;
        bad.sign(&key);
        let r = tokio::time::timeout(within(30), up.submit(&[bad])).await.unwrap().unwrap();
        assert_eq!(r.refused, vec![(0, RejectReason::Unassigned)]);
    }
}
