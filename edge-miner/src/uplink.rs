//! The miner's uplink to the coordinator: connect (pinned certificate, key
//! proof), learn the window and its assignment, stream signed rollouts with
//! pipelined acknowledgements, and on a lost connection reconnect with
//! exponential backoff and resume without duplicates (the coordinator's
//! `Progress` says which slots are already stored).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use tributary_net::{NetError, Session};
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::wire::{
    Blob, ErrorCode, Frame, GetProgress, GetWindow, RejectReason, Role, Submit, WindowInfo,
};
use tributary_protocol::window::WindowId;

/// Uplink failures.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// Every connection attempt failed.
    #[error("could not reach the coordinator after {attempts} attempts: {last}")]
    Unreachable {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: NetError,
    },
    /// The coordinator refused us for good (role, key, version).
    #[error("refused by the coordinator: {0}")]
    Refused(NetError),
    /// The coordinator answered out of protocol.
    #[error("unexpected answer {0:?}")]
    Unexpected(tributary_protocol::wire::Tag),
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
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            max_attempts: 20,
        }
    }
}

/// What became of a batch of rollouts.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SubmitReport {
    /// Digests acknowledged durable (now or in an earlier connection).
    pub stored: Vec<[u8; 32]>,
    /// Refused, by index in the batch.
    pub refused: Vec<(usize, RejectReason)>,
}

/// The uplink.
#[derive(Debug)]
pub struct Uplink {
    cfg: UplinkConfig,
    key: Keypair,
    session: Option<Session>,
    seq: u64,
}

fn fatal(e: &NetError) -> bool {
    matches!(e, NetError::Refused(code, _) if matches!(code, ErrorCode::Unauthorized | ErrorCode::Version | ErrorCode::BadHandshake))
}

impl Uplink {
    /// An uplink for `key`; nothing connects until first use.
    pub fn new(cfg: UplinkConfig, key: Keypair) -> Self {
        Self { cfg, key, session: None, seq: 0 }
    }

    /// Connects if needed, retrying with exponential backoff.
    async fn session(&mut self) -> Result<&mut Session, UplinkError> {
        if self.session.is_none() {
            let mut delay = self.cfg.min_backoff;
            let mut attempt = 0;
            let s = loop {
                attempt += 1;
                match Session::connect(self.cfg.addr, &self.cfg.fingerprint, &self.key, Role::Miner).await {
                    Ok(s) => break s,
                    Err(e) if fatal(&e) => return Err(UplinkError::Refused(e)),
                    Err(e) if attempt >= self.cfg.max_attempts => {
                        return Err(UplinkError::Unreachable { attempts: attempt, last: e });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, ?delay, "coordinator unreachable, retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(self.cfg.max_backoff);
                    }
                }
            };
            tracing::info!(coordinator = %s.coordinator, "connected");
            self.session = Some(s);
        }
        self.session.as_mut().ok_or(UplinkError::NoWindow)
    }

    /// Drops the connection (the next call reconnects).
    pub fn disconnect(&mut self) {
        self.session = None;
    }

    /// Sends a request and waits for its answer, reconnecting (at most
    /// twice) if the connection was lost; an error frame is [`UplinkError::Refused`].
    pub async fn request(&mut self, frame: &Frame) -> Result<Frame, UplinkError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let s = self.session().await?;
            match s.request(frame).await {
                Ok(f) => return Ok(f),
                Err(e @ NetError::Refused(..)) => return Err(UplinkError::Refused(e)),
                Err(e) if tries >= 3 => return Err(UplinkError::Unreachable { attempts: tries, last: e }),
                Err(_) => self.disconnect(),
            }
        }
    }

    /// The window open now, with this miner's assignment parameters.
    pub async fn window(&mut self) -> Result<WindowInfo, UplinkError> {
        match self.request(&Frame::GetWindow(GetWindow { window: None })).await {
            Ok(Frame::WindowInfo(w)) => Ok(w),
            Ok(f) => Err(UplinkError::Unexpected(f.tag())),
            Err(UplinkError::Refused(NetError::Refused(ErrorCode::NotYet, _))) => Err(UplinkError::NoWindow),
            Err(e) => Err(e),
        }
    }

    /// The (group, index) slots of ours already stored in `window`.
    pub async fn progress(&mut self, window: WindowId) -> Result<HashSet<(u32, u32)>, UplinkError> {
        match self.request(&Frame::GetProgress(GetProgress { window })).await? {
            Frame::Progress(p) => Ok(p.slots.into_iter().collect()),
            f => Err(UplinkError::Unexpected(f.tag())),
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
            let mut failed = false;
            for (k, &i) in pending.iter().enumerate() {
                let f = Frame::Submit(Submit { seq: base + k as u64, rollout: Blob(rollouts[i].encode()) });
                if s.send(&f).await.is_err() {
                    failed = true;
                    break;
                }
            }
            if !failed {
                for _ in 0..pending.len() {
                    match s.recv().await {
                        Ok(Frame::Ack(a)) => {
                            if let Some(&i) = a.seq.checked_sub(base).and_then(|k| pending.get(k as usize)) {
                                done[i] = true;
                                report.stored.push(a.digest);
                            }
                        }
                        Ok(Frame::Refused(r)) => {
                            if let Some(&i) = r.seq.checked_sub(base).and_then(|k| pending.get(k as usize)) {
                                // Refusals other than a transient one are final.
                                if !matches!(r.reason, RejectReason::Internal | RejectReason::RateLimited) {
                                    done[i] = true;
                                    if r.reason != RejectReason::Duplicate {
                                        report.refused.push((i, r.reason));
                                    } else {
                                        report.stored.push(rollouts[i].digest());
                                    }
                                }
                            }
                        }
                        Ok(f) => return Err(UplinkError::Unexpected(f.tag())),
                        Err(e) if fatal(&e) => return Err(UplinkError::Refused(e)),
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
    use tributary_protocol::rollout::SamplingParams;

    fn rollout(info: &WindowInfo, key: &Keypair, group: u32, index: u32) -> Rollout {
        let n = 96u32;
        let mut r = Rollout {
            window: info.window,
            checkpoint: info.checkpoint,
            env: info.env,
            group,
            rollout: index,
            task_id: task_seed(&info.seed, key.public().as_bytes(), group),
            sampling: SamplingParams { temperature: 0.7, max_new_tokens: 64 },
            tokens: (0..n).map(|i| (i * 31 + group * 1000 + index * 7) % 49152).collect(),
            prompt_len: 32,
            logprobs: vec![-0.5; 64],
            sketches: (0..n).map(|i| i ^ (group << 8) ^ index).collect(),
            reward: 0.0,
            miner: [0; 32],
            signature: [0; 64],
        };
        r.sign(key);
        r
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
        let all: Vec<Rollout> = (0..2).flat_map(|g| (0..4).map(move |i| (g, i))).map(|(g, i)| rollout(&info, &key, g, i)).collect();
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
