//! `validator run`: the validator as a network service.
//!
//! For every window `W`, once the coordinator reveals `W`'s challenge secret
//! (checked against the commitment published at open), the service fetches
//! `W`'s rollouts, picks a sample ([`SampleConfig`]), proves each sampled
//! rollout on the reference model of the window's checkpoint (downloaded
//! from the coordinator's relay when missing) and posts one signed verdict per
//! miner. The checks are [`tributary_protocol::verify`]'s, fed with the
//! evidence of [`crate::check::rollout_evidence`]; this module adds what only
//! a networked validator can do:
//!
//! - the **generation contract** comes from the coordinator's
//!   [`WindowInfo`] (environment, difficulty, dataset, temperature,
//!   `max_new_tokens`): a rollout generated otherwise fails its structure check;
//! - **signatures** are checked again (a rollout the coordinator should have
//!   refused is a hard failure, not trust);
//! - **copies across miners**: rollouts of different miners with the same
//!   prompt and completion. The proof tells the owner from the copier (a
//!   task and seeded draws are bound to the miner's key), so the miner whose
//!   copy fails its checks is named as the copier and the owner, whose copy
//!   passes, is never penalised; when every copy passes (an honest
//!   coincidence) nobody is;
//! - **bad input**: bytes that do not decode are counted and logged, never
//!   a panic; a coordinator that goes away is retried with backoff.
//!
//! **Restarts.** Progress is kept in `progress.json` in the service folder:
//! the next window to verify and the miners whose verdicts on it the
//! coordinator has already acknowledged (written right after each
//! acknowledgement), with the coordinator's certificate fingerprint. A
//! restarted service resumes there (progress saved against another
//! coordinator is ignored): every window gets its verdicts, and an
//! acknowledged verdict is not posted again.
//!
//! **Pace.** Windows are verified in order. If verification falls more than
//! one window behind the clock the service logs a warning and sets the
//! `tributary_validator_windows_behind` gauge; it never skips a window.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tributary_net::{Backoff, ConnectFailure, NetError, Session};
use tributary_policy::{PolicyError, ReferenceModel};
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{ArithEnv, EnvId, Environment, Gsm8kEnv, SatEnv, task_seed};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::sketch::SketchKey;
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::{self, Assignment, CheckKind, Severity, Status, VerifyParams};
use tributary_protocol::window::{Schedule, WindowId, verify_reveal};
use tributary_protocol::wire::{
    FetchRollouts, Frame, GetCheckpoint, GetCheckpointPath, GetReveal, GetWindow, Role, Verdict, VerdictBody,
    WindowInfo,
};

use crate::check::{self, CheckError};

/// Service failures (a failing miner is a verdict, never one of these).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The coordinator stayed unreachable through every retry.
    #[error("coordinator unreachable after {attempts} attempts: {last}")]
    Unreachable {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: NetError,
    },
    /// The coordinator refused us (role, key, version) or a request.
    #[error("refused by the coordinator: {0}")]
    Refused(NetError),
    /// The coordinator answered out of protocol.
    #[error("unexpected answer {0:?}")]
    Unexpected(tributary_protocol::wire::Tag),
    /// The revealed challenge secret does not match the window's commitment.
    #[error("window {0}: the revealed challenge secret does not match its commitment")]
    BadReveal(WindowId),
    /// A downloaded checkpoint is not the one asked for.
    #[error("checkpoint {want}: {detail}")]
    BadCheckpoint {
        /// The id asked for.
        want: ContentId,
        /// What was wrong.
        detail: String,
    },
    /// The checkpoint could not be read.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The reference model failed.
    #[error("reference model: {0}")]
    Policy(#[from] PolicyError),
    /// The check pipeline failed (not a miner's fault).
    #[error("check: {0}")]
    Check(#[from] CheckError),
    /// The window's environment cannot be set up here.
    #[error("environment: {0}")]
    Env(String),
    /// Local I/O.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// `progress.json` is malformed.
    #[error("progress.json: {0}")]
    Progress(String),
}

/// Which miners and rollouts of a window are checked (grail §7.3 shape).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleConfig {
    /// Fraction of the window's miners checked.
    pub miner_fraction: f64,
    /// At least this many miners (when there are that many).
    pub min_miners: usize,
    /// At most this many miners.
    pub max_miners: usize,
    /// Rollouts checked per miner (whole groups, chosen by the challenge secret); 0: all.
    pub rollouts_per_miner: usize,
}

impl SampleConfig {
    /// Every rollout of every miner (tests, small networks).
    pub const ALL: SampleConfig =
        SampleConfig { miner_fraction: 1.0, min_miners: usize::MAX, max_miners: usize::MAX, rollouts_per_miner: 0 };

    /// grail's: a quarter of the miners, at least 2, at most 35; 64 rollouts each.
    pub const GRAIL: SampleConfig =
        SampleConfig { miner_fraction: 0.25, min_miners: 2, max_miners: 35, rollouts_per_miner: 64 };

    /// How many of `n` miners are checked.
    pub fn miners_checked(&self, n: usize) -> usize {
        let by_fraction = (self.miner_fraction.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        by_fraction.max(self.min_miners).min(self.max_miners).min(n)
    }
}

/// The service's configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The coordinator's QUIC address.
    pub coordinator: SocketAddr,
    /// Its certificate fingerprint (hex).
    pub fingerprint: String,
    /// The validator key (authorised by the coordinator).
    pub key: Keypair,
    /// Folder of downloaded checkpoints.
    pub dir: PathBuf,
    /// Which rollouts are checked.
    pub sample: SampleConfig,
    /// Most rollouts per forward pass.
    pub batch: usize,
    /// Most padded tokens per forward pass.
    pub batch_tokens: usize,
    /// The GSM8K JSONL file, when the network's environment is gsm8k.
    pub gsm8k: Option<PathBuf>,
    /// Verification constants.
    pub params: VerifyParams,
    /// How often to look at the clock when idle.
    pub poll: Duration,
    /// First reconnection delay (doubling).
    pub min_backoff: Duration,
    /// Longest reconnection delay.
    pub max_backoff: Duration,
    /// Attempts per request before giving up (the coordinator is gone).
    pub max_attempts: u32,
    /// First window to verify when the folder holds no progress (default:
    /// the window in progress at start); a restart resumes from `progress.json`.
    pub start_window: Option<WindowId>,
}

/// `progress.json`: where a restarted service resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// The coordinator's certificate fingerprint (progress saved against
    /// another network is ignored).
    pub coordinator: String,
    /// The next window to verify.
    pub next_window: WindowId,
    /// Miners whose verdicts on `next_window` the coordinator acknowledged.
    pub posted: Vec<PublicKey>,
}

impl Progress {
    fn path(dir: &std::path::Path) -> PathBuf {
        dir.join("progress.json")
    }

    /// The progress saved in `dir`, if any.
    pub fn load(dir: &std::path::Path) -> Result<Option<Progress>, ServiceError> {
        match std::fs::read(Self::path(dir)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| ServiceError::Progress(e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Saves to `dir` atomically (temporary file, fsync, rename).
    fn save(&self, dir: &std::path::Path) -> Result<(), ServiceError> {
        use std::io::Write as _;
        let path = Self::path(dir);
        let tmp = path.with_extension("json.part");
        let bytes = serde_json::to_vec(self).map_err(|e| ServiceError::Progress(e.to_string()))?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }
}

impl ServiceConfig {
    /// Defaults: grail sampling, batches of 8 rollouts / 8192 tokens, polls of
    /// 500 ms, backoff 200 ms doubling to 30 s, 20 attempts.
    pub fn new(coordinator: SocketAddr, fingerprint: impl Into<String>, key: Keypair, dir: PathBuf) -> Self {
        Self {
            coordinator,
            fingerprint: fingerprint.into(),
            key,
            dir,
            sample: SampleConfig::GRAIL,
            batch: 8,
            batch_tokens: 8192,
            gsm8k: None,
            params: VerifyParams::DEFAULT,
            poll: Duration::from_millis(500),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            max_attempts: 20,
            start_window: None,
        }
    }
}

/// One miner's findings in one window (what is signed, plus details).
#[derive(Debug, Clone, PartialEq)]
pub struct MinerReport {
    /// The verdict body that is signed and posted.
    pub body: VerdictBody,
    /// Failed checks seen, by check (`"copy"`, `"signature"`, `"malformed"` besides [`CheckKind`]s).
    pub failed: BTreeMap<String, u32>,
}

impl MinerReport {
    /// Whether the check named `name` failed at least once.
    pub fn failed(&self, name: &str) -> bool {
        self.failed.contains_key(name)
    }
}

/// What one window's verification found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowReport {
    /// The window.
    pub window: WindowId,
    /// Rollouts fetched.
    pub fetched: usize,
    /// Bytes that did not decode as a rollout (not attributable to a miner).
    pub undecodable: usize,
    /// Rollouts run through the reference model.
    pub proved: usize,
    /// Per miner.
    pub miners: BTreeMap<PublicKey, MinerReport>,
    /// Seconds spent verifying.
    pub seconds: f64,
}

/// The name of a check in reports, metrics and verdict reasons.
pub fn check_name(kind: CheckKind) -> &'static str {
    match kind {
        CheckKind::Structure => "structure",
        CheckKind::Prompt => "prompt",
        CheckKind::Reward => "reward",
        CheckKind::Sketch => "sketch",
        CheckKind::Logprob => "logprob",
        CheckKind::Sampling => "sampling",
        CheckKind::SamplingCoverage => "sampling_coverage",
        CheckKind::Distribution => "distribution",
        CheckKind::Termination => "termination",
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A connection to the coordinator that reconnects with exponential backoff.
struct Client {
    cfg: ServiceConfig,
    session: Option<Session>,
    schedule: Option<Schedule>,
}

impl Client {
    async fn session(&mut self) -> Result<&mut Session, ServiceError> {
        if self.session.is_none() {
            let backoff =
                Backoff { min: self.cfg.min_backoff, max: self.cfg.max_backoff, attempts: self.cfg.max_attempts };
            let on_retry = |_: &NetError, _| metrics::counter!("tributary_validator_reconnects_total").increment(1);
            let s = Session::connect_with_backoff(
                self.cfg.coordinator,
                &self.cfg.fingerprint,
                &self.cfg.key,
                Role::Validator,
                backoff,
                on_retry,
            )
            .await
            .map_err(|f| match f {
                ConnectFailure::Refused(e) => ServiceError::Refused(e),
                ConnectFailure::Unreachable { attempts, last } => ServiceError::Unreachable { attempts, last },
            })?;
            self.schedule = Some(s.welcome.schedule);
            self.session = Some(s);
        }
        self.session.as_mut().ok_or(ServiceError::Unexpected(tributary_protocol::wire::Tag::Error))
    }

    /// Sends a request and returns its answer; a lost connection is retried
    /// (reconnecting with backoff), an error frame is returned as `Refused`.
    async fn request(&mut self, frame: &Frame) -> Result<Frame, ServiceError> {
        let mut tries = 0;
        let mut delay = self.cfg.min_backoff;
        loop {
            tries += 1;
            let s = self.session().await?;
            match s.request(frame).await {
                Ok(f) => return Ok(f),
                Err(e @ NetError::Refused(..)) => return Err(ServiceError::Refused(e)),
                Err(e) if tries >= self.cfg.max_attempts => {
                    return Err(ServiceError::Unreachable { attempts: tries, last: e });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "connection lost, reconnecting");
                    self.session = None;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.cfg.max_backoff);
                }
            }
        }
    }

    async fn schedule(&mut self) -> Result<Schedule, ServiceError> {
        self.session().await?;
        self.schedule.ok_or(ServiceError::Unexpected(tributary_protocol::wire::Tag::Welcome))
    }
}

/// The reference model of one checkpoint, with its tokenizer.
struct Loaded {
    id: ContentId,
    model: ReferenceModel,
    tokenizer: Tokenizer,
}

/// The running validator.
pub struct Service {
    cfg: ServiceConfig,
    client: Client,
    loaded: Option<Loaded>,
    gsm8k: Option<Gsm8kEnv>,
    next_window: Option<WindowId>,
    posted: Vec<PublicKey>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("next_window", &self.next_window).finish_non_exhaustive()
    }
}

impl Service {
    /// Connects (with backoff) and prepares the model folder; resumes from
    /// the folder's `progress.json` if there is one.
    pub async fn open(cfg: ServiceConfig) -> Result<Self, ServiceError> {
        std::fs::create_dir_all(cfg.dir.join("models"))?;
        let mut client = Client { cfg: cfg.clone(), session: None, schedule: None };
        let schedule = client.schedule().await?;
        let (next_window, posted) = match Progress::load(&cfg.dir)? {
            Some(p) if p.coordinator.eq_ignore_ascii_case(cfg.fingerprint.trim()) => (p.next_window, p.posted),
            _ => (cfg.start_window.unwrap_or_else(|| schedule.window_at(now_ms()).unwrap_or(0)), Vec::new()),
        };
        Ok(Self { cfg, client, loaded: None, gsm8k: None, next_window: Some(next_window), posted })
    }

    fn save_progress(&self) -> Result<(), ServiceError> {
        let Some(next_window) = self.next_window else { return Ok(()) };
        let coordinator = self.cfg.fingerprint.trim().to_ascii_lowercase();
        Progress { coordinator, next_window, posted: self.posted.clone() }.save(&self.cfg.dir)
    }

    /// The next window to verify.
    pub fn next_window(&self) -> Option<WindowId> {
        self.next_window
    }

    /// Verifies the next window if its submissions have closed (posting the
    /// verdicts); `None` if it is not closed yet.
    pub async fn step(&mut self) -> Result<Option<WindowReport>, ServiceError> {
        let schedule = self.client.schedule().await?;
        let Some(w) = self.next_window else { return Ok(None) };
        let now = now_ms();
        if now < schedule.closes_at(w) {
            return Ok(None);
        }
        let current = schedule.window_at(now).unwrap_or(0);
        let behind = current.saturating_sub(w.saturating_add(1));
        metrics::gauge!("tributary_validator_windows_behind").set(behind as f64);
        if behind > 0 {
            tracing::warn!(window = w, current, behind, "verification is behind the clock");
        }
        let report = self.verify_window(w).await?;
        self.post(&report).await?;
        self.next_window = Some(w + 1);
        self.posted.clear();
        self.save_progress()?;
        Ok(Some(report))
    }

    /// Runs until `stop` is set.
    pub async fn run(&mut self, stop: Arc<AtomicBool>) -> Result<(), ServiceError> {
        while !stop.load(Ordering::Relaxed) {
            match self.step().await? {
                Some(r) => {
                    let failed = r.miners.values().filter(|m| m.body.hard_failure).count();
                    println!(
                        "window={} miners={} failed={} rollouts={} proved={} seconds={:.2}",
                        r.window,
                        r.miners.len(),
                        failed,
                        r.fetched,
                        r.proved,
                        r.seconds
                    );
                }
                None => tokio::time::sleep(self.cfg.poll).await,
            }
        }
        Ok(())
    }

    async fn window_info(&mut self, w: WindowId) -> Result<WindowInfo, ServiceError> {
        match self.client.request(&Frame::GetWindow(GetWindow { window: Some(w) })).await? {
            Frame::WindowInfo(i) if i.window == w => Ok(i),
            f => Err(ServiceError::Unexpected(f.tag())),
        }
    }

    async fn reveal(&mut self, info: &WindowInfo) -> Result<Seed, ServiceError> {
        match self.client.request(&Frame::GetReveal(GetReveal { window: info.window })).await? {
            Frame::Reveal(r) if r.window == info.window => {
                if !verify_reveal(info.window, &info.commitment, &r.secret) {
                    return Err(ServiceError::BadReveal(info.window));
                }
                Ok(Seed(r.secret))
            }
            f => Err(ServiceError::Unexpected(f.tag())),
        }
    }

    async fn fetch(&mut self, w: WindowId) -> Result<Vec<Vec<u8>>, ServiceError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let req = Frame::FetchRollouts(FetchRollouts { window: w, miner: None, after, limit: 256 });
            match self.client.request(&req).await? {
                Frame::Rollouts(r) => {
                    out.extend(r.items.into_iter().map(|b| b.0));
                    match r.next {
                        Some(n) if Some(n) != after => after = Some(n),
                        _ => return Ok(out),
                    }
                }
                f => return Err(ServiceError::Unexpected(f.tag())),
            }
        }
    }

    /// Makes `id` the loaded reference model, downloading the full file from
    /// the relay if it is not in the models folder.
    async fn ensure_model(&mut self, id: ContentId) -> Result<(), ServiceError> {
        if self.loaded.as_ref().is_some_and(|l| l.id == id) {
            return Ok(());
        }
        let path = self.cfg.dir.join("models").join(format!("{id}.gguf"));
        if !path.exists() {
            let bytes = self.download(id).await?;
            let tmp = path.with_extension("part");
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, &path)?;
        }
        let ckpt = Checkpoint::open(&path)?;
        if ckpt.content_id() != id {
            let _ = std::fs::remove_file(&path);
            return Err(ServiceError::BadCheckpoint { want: id, detail: format!("file holds {}", ckpt.content_id()) });
        }
        let tokenizer = Tokenizer::from_gguf_file(&path).map_err(|e| ServiceError::Env(e.to_string()))?;
        self.loaded = None;
        let model = tokio::task::block_in_place(|| ReferenceModel::load(&ckpt, tributary_policy::default_device()))?;
        tracing::info!(%id, "reference model loaded");
        self.loaded = Some(Loaded { id, model, tokenizer });
        Ok(())
    }

    async fn download(&mut self, id: ContentId) -> Result<Vec<u8>, ServiceError> {
        let path = match self
            .client
            .request(&Frame::GetCheckpointPath(GetCheckpointPath { have: None, want: Some(id) }))
            .await?
        {
            Frame::CheckpointPath(p) => p,
            f => return Err(ServiceError::Unexpected(f.tag())),
        };
        let step = match path.steps.as_slice() {
            [s] if s.id == id && s.base.is_none() => s.clone(),
            _ => return Err(ServiceError::BadCheckpoint { want: id, detail: "the relay offers no full file".into() }),
        };
        // The announced length is bounded before anything is allocated for it.
        if step.len > 64 << 30 {
            return Err(ServiceError::BadCheckpoint { want: id, detail: format!("{} bytes", step.len) });
        }
        let mut bytes = Vec::new();
        while (bytes.len() as u64) < step.len {
            let offset = bytes.len() as u64;
            match self.client.request(&Frame::GetCheckpoint(GetCheckpoint { id, offset })).await? {
                Frame::CheckpointChunk(c) if c.id == id && c.offset == offset && !c.data.0.is_empty() => {
                    if offset + c.data.0.len() as u64 > step.len {
                        return Err(ServiceError::BadCheckpoint { want: id, detail: "longer than announced".into() });
                    }
                    bytes.extend_from_slice(&c.data.0);
                }
                f => return Err(ServiceError::Unexpected(f.tag())),
            }
        }
        if blake3::hash(&bytes).as_bytes() != &step.payload_hash {
            return Err(ServiceError::BadCheckpoint { want: id, detail: "payload hash mismatch".into() });
        }
        Ok(bytes)
    }

    fn environment(&mut self, info: &WindowInfo) -> Result<Environment, ServiceError> {
        Ok(match info.env {
            EnvId::Arith => Environment::Arith(ArithEnv::new(info.difficulty)),
            EnvId::Sat => Environment::Sat(SatEnv),
            EnvId::Gsm8k => {
                if self.gsm8k.is_none() {
                    let path = self.cfg.gsm8k.as_ref().ok_or_else(|| {
                        ServiceError::Env("the window's environment is gsm8k: give --gsm8k FILE".into())
                    })?;
                    let bytes = std::fs::read(path)?;
                    if info.dataset.is_some_and(|d| &d != blake3::hash(&bytes).as_bytes()) {
                        return Err(ServiceError::Env(format!("{} is not the window's dataset", path.display())));
                    }
                    self.gsm8k = Some(Gsm8kEnv::load(path).map_err(|e| ServiceError::Env(e.to_string()))?);
                }
                Environment::Gsm8k(self.gsm8k.clone().ok_or_else(|| ServiceError::Env("gsm8k".into()))?)
            }
        })
    }

    /// Fetches and verifies window `w` (its submissions must have closed);
    /// posts nothing.
    pub async fn verify_window(&mut self, w: WindowId) -> Result<WindowReport, ServiceError> {
        let started = Instant::now();
        let info = self.window_info(w).await?;
        let challenge = self.reveal(&info).await?;
        let blobs = self.fetch(w).await?;
        self.ensure_model(info.checkpoint).await?;
        let env = self.environment(&info)?;
        let loaded = self.loaded.as_ref().ok_or(ServiceError::Env("no model".into()))?;
        let judge = Judge { info: &info, challenge, env: &env, loaded, cfg: &self.cfg };
        let mut report = tokio::task::block_in_place(|| judge.window(blobs))?;
        report.seconds = started.elapsed().as_secs_f64();
        metrics::histogram!("tributary_validator_window_seconds").record(report.seconds);
        metrics::counter!("tributary_validator_rollouts_proved_total").increment(report.proved as u64);
        Ok(report)
    }

    /// Signs and posts one verdict per miner.
    pub async fn post(&mut self, report: &WindowReport) -> Result<(), ServiceError> {
        let resuming = self.next_window == Some(report.window);
        for m in report.miners.values() {
            if resuming && self.posted.contains(&m.body.miner) {
                continue;
            }
            let v = Verdict::sign(m.body.clone(), &self.cfg.key);
            match self.client.request(&Frame::PostVerdict(v)).await? {
                Frame::VerdictAck(a) if a.window == report.window && a.miner == m.body.miner => {
                    let outcome = if m.body.hard_failure { "failed" } else { "passed" };
                    metrics::counter!("tributary_validator_verdicts_total", "outcome" => outcome).increment(1);
                    if resuming {
                        // Saved before the next await: a restart never posts it again.
                        self.posted.push(m.body.miner);
                        self.save_progress()?;
                    }
                }
                f => return Err(ServiceError::Unexpected(f.tag())),
            }
        }
        Ok(())
    }
}

/// One window's judgement over its fetched bytes (pure but for the model).
struct Judge<'a> {
    info: &'a WindowInfo,
    challenge: Seed,
    env: &'a Environment,
    loaded: &'a Loaded,
    cfg: &'a ServiceConfig,
}

/// A sampled rollout on its way through the checks.
struct Item {
    rollout: Rollout,
    prompt: Vec<u32>,
    reward: f32,
    content: [u8; 32],
    outcome: Option<Result<verify::Verdict, String>>,
}

fn deterministic_rank(seed: &Seed, miner: &PublicKey) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("tributary 2025 validator sample v1");
    h.update(&seed.0);
    h.update(miner.as_bytes());
    *h.finalize().as_bytes()
}

impl Judge<'_> {
    fn window(&self, blobs: Vec<Vec<u8>>) -> Result<WindowReport, ServiceError> {
        let mut report = WindowReport { window: self.info.window, fetched: blobs.len(), ..Default::default() };
        let limits = RolloutLimits::DEFAULT;
        let mut by_miner: BTreeMap<PublicKey, Vec<Rollout>> = BTreeMap::new();
        for b in &blobs {
            match Rollout::decode(b, &limits) {
                Ok(r) => by_miner.entry(PublicKey(r.miner)).or_default().push(r),
                Err(e) => {
                    report.undecodable += 1;
                    metrics::counter!("tributary_validator_undecodable_total").increment(1);
                    tracing::warn!(window = self.info.window, error = %e, "fetched bytes are not a rollout");
                }
            }
        }
        // Sample miners (deterministic in the challenge secret: unknown to miners at submission).
        let mut miners: Vec<PublicKey> = by_miner.keys().copied().collect();
        miners.sort_by_key(|m| deterministic_rank(&self.challenge, m));
        miners.truncate(self.cfg.sample.miners_checked(miners.len()));
        let mut items: Vec<(PublicKey, usize, Item)> = Vec::new();
        for m in &miners {
            let all = by_miner.remove(m).unwrap_or_default();
            let total = all.len();
            let sampled = self.sample_rollouts(all);
            let mut mr = MinerReport {
                body: VerdictBody {
                    window: self.info.window,
                    miner: *m,
                    validator: self.cfg.key.public(),
                    checked: 0,
                    valid: 0,
                    estimated_valid: 0,
                    hard_failure: false,
                    soft_failures: 0,
                    reasons: vec![],
                },
                failed: BTreeMap::new(),
            };
            mr.body.checked = u32::try_from(sampled.len()).unwrap_or(u32::MAX);
            report.miners.insert(*m, mr);
            for r in sampled {
                items.push((*m, total, self.prepare(r)));
            }
        }
        self.prove(&mut items, &mut report)?;
        self.copies(&mut items);
        // Verdict bodies.
        for (m, total, it) in &items {
            let Some(mr) = report.miners.get_mut(m) else { continue };
            let r = &it.rollout;
            match &it.outcome {
                Some(Ok(v)) => {
                    if v.accepted() && !v.soft_failed() {
                        mr.body.valid += 1;
                    }
                    if v.soft_failed() {
                        mr.body.soft_failures += 1;
                    }
                    if !v.accepted() {
                        mr.body.hard_failure = true;
                    }
                    for c in &v.checks {
                        if let Status::Fail(f) = &c.status {
                            let name = check_name(c.kind);
                            *mr.failed.entry(name.to_owned()).or_default() += 1;
                            metrics::counter!("tributary_validator_check_failures_total", "check" => name).increment(1);
                            let sev = if c.severity == Severity::Hard { "hard" } else { "soft" };
                            mr.body
                                .add_reason(&format!("{name} ({sev}) group {} rollout {}: {f:?}", r.group, r.rollout));
                        }
                    }
                }
                Some(Err(reason)) => {
                    mr.body.hard_failure = true;
                    let name = reason.split(':').next().unwrap_or("malformed").to_owned();
                    *mr.failed.entry(name).or_default() += 1;
                    mr.body.add_reason(&format!("group {} rollout {}: {reason}", r.group, r.rollout));
                }
                None => {}
            }
            let checked = f64::from(mr.body.checked.max(1));
            mr.body.estimated_valid =
                ((f64::from(mr.body.valid) * *total as f64 / checked).round() as u64).min(u64::from(u32::MAX)) as u32;
        }
        for mr in report.miners.values_mut() {
            if mr.body.hard_failure {
                mr.body.estimated_valid = 0;
            }
        }
        Ok(report)
    }

    /// Whole groups, in an order fixed by the challenge secret, until the
    /// per-miner budget is reached (all when the budget is 0 or not smaller).
    fn sample_rollouts(&self, mut all: Vec<Rollout>) -> Vec<Rollout> {
        let budget = self.cfg.sample.rollouts_per_miner;
        if budget == 0 || all.len() <= budget {
            return all;
        }
        let rank = |g: u32| {
            let mut h = blake3::Hasher::new_derive_key("tributary 2025 validator group sample v1");
            h.update(&self.challenge.0);
            h.update(&g.to_le_bytes());
            *h.finalize().as_bytes()
        };
        all.sort_by_key(|r| (rank(r.group), r.rollout));
        let mut out = Vec::new();
        let mut groups = 0u32;
        let mut last = None;
        for r in all {
            if last != Some(r.group) {
                if out.len() >= budget {
                    break;
                }
                groups += 1;
                last = Some(r.group);
            }
            out.push(r);
        }
        let _ = groups;
        out
    }

    fn prepare(&self, rollout: Rollout) -> Item {
        let content = rollout.content_hash();
        let mut it = Item { rollout, prompt: vec![], reward: f32::NAN, content, outcome: None };
        let r = &it.rollout;
        if r.verify_signature().is_err() {
            it.outcome = Some(Err("signature: the rollout's signature does not verify".into()));
            return it;
        }
        let task = self.env.task(task_seed(&self.info.seed, &r.miner, r.group));
        match self.loaded.tokenizer.encode(&self.env.prompt_text(&task)) {
            Ok(p) => it.prompt = p,
            Err(e) => {
                it.outcome = Some(Err(format!("environment: prompt does not tokenize: {e}")));
                return it;
            }
        }
        match check::recompute_reward(&self.loaded.tokenizer, self.env, &task, r.completion()) {
            Ok(x) => it.reward = x,
            Err(e) => it.outcome = Some(Err(format!("structure: {e}"))),
        }
        it
    }

    fn assignment<'b>(&'b self, it: &'b Item, eos: &'b [u32]) -> Assignment<'b> {
        let r = &it.rollout;
        Assignment {
            window: self.info.window,
            checkpoint: self.info.checkpoint,
            env: self.info.env,
            miner: r.miner,
            task_id: task_seed(&self.info.seed, &r.miner, r.group),
            sampling: self.info.sampling,
            prompt_tokens: &it.prompt,
            groups_per_miner: self.info.groups_per_miner,
            group_size: self.info.group_size,
            vocab_size: u32::try_from(self.loaded.model.dims().vocab_size).unwrap_or(u32::MAX),
            eos_tokens: eos,
            sampling_seed: self.info.seed,
            challenge_secret: self.challenge,
        }
    }

    /// Structure first, then the model checks in batches.
    fn prove(&self, items: &mut [(PublicKey, usize, Item)], report: &mut WindowReport) -> Result<(), ServiceError> {
        let params = &self.cfg.params;
        let eos: Vec<u32> = self.loaded.tokenizer.eog_ids().collect();
        let context = self.loaded.model.dims().context_length;
        let mut to_run = Vec::new();
        for (k, (_, _, it)) in items.iter_mut().enumerate() {
            if it.outcome.is_some() {
                continue;
            }
            let a = self.assignment(it, &eos);
            let s = verify::check_structure(&it.rollout, &a, params);
            if s.failed() {
                it.outcome = Some(Ok(verify::Verdict { checks: vec![s], sampling_counts: Default::default() }));
            } else if it.rollout.tokens.len() > context {
                it.outcome =
                    Some(Err(format!("structure: {} tokens exceed the context of {context}", it.rollout.tokens.len())));
            } else {
                to_run.push(k);
            }
        }
        let key = SketchKey::derive(&self.info.seed, self.loaded.model.dims().d_model);
        let refs: Vec<&Rollout> = to_run.iter().map(|&k| &items[k].2.rollout).collect();
        let plan = check::plan_batches(&refs, self.cfg.batch.max(1), self.cfg.batch_tokens.max(1));
        let mut results: Vec<(usize, verify::Verdict)> = Vec::with_capacity(to_run.len());
        for batch in plan {
            let batch_items: Vec<(&Rollout, Vec<usize>)> =
                batch.iter().map(|&j| (refs[j], verify::challenged(refs[j], &self.challenge, params))).collect();
            let evidence = check::rollout_evidence(
                &self.loaded.model,
                &key,
                self.loaded.tokenizer.eos_id(),
                &batch_items,
                params,
            )?;
            for (&j, ev) in batch.iter().zip(evidence) {
                let it = &items[to_run[j]].2;
                let a = self.assignment(it, &eos);
                let v = verify::verify_rollout(&it.rollout, &a, it.reward, &ev, params).map_err(CheckError::from)?;
                results.push((to_run[j], v));
            }
        }
        report.proved += results.len();
        for (k, v) in results {
            items[k].2.outcome = Some(Ok(v));
        }
        Ok(())
    }

    /// Copies across miners: the same prompt and completion under two keys.
    /// A copy that fails its checks is flagged as copied from a miner whose
    /// copy passes; when every copy passes, nobody is flagged.
    fn copies(&self, items: &mut [(PublicKey, usize, Item)]) {
        let mut by_content: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for (k, (_, _, it)) in items.iter().enumerate() {
            by_content.entry(it.content).or_default().push(k);
        }
        let passed = |it: &Item| matches!(&it.outcome, Some(Ok(v)) if v.accepted());
        for ks in by_content.values() {
            let owners: Vec<PublicKey> = ks.iter().filter(|&&k| passed(&items[k].2)).map(|&k| items[k].0).collect();
            let Some(owner) = owners.first().copied() else { continue };
            for &k in ks {
                let (m, _, it) = &mut items[k];
                if *m != owner && !passed(it) {
                    let mut detail = String::new();
                    let _ = write!(
                        detail,
                        "copy: same prompt and completion as miner {} (whose rollout passes)",
                        owner.short()
                    );
                    if let Some(Ok(v)) = &it.outcome {
                        let failed: Vec<&str> = v.failures().map(|(c, _)| check_name(c)).collect();
                        let _ = write!(detail, "; own checks failed: {}", failed.join(", "));
                    }
                    it.outcome = Some(Err(detail));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_sizes() {
        assert_eq!(SampleConfig::ALL.miners_checked(7), 7);
        assert_eq!(SampleConfig::GRAIL.miners_checked(1), 1);
        assert_eq!(SampleConfig::GRAIL.miners_checked(3), 2);
        assert_eq!(SampleConfig::GRAIL.miners_checked(40), 10);
        assert_eq!(SampleConfig::GRAIL.miners_checked(1000), 35);
    }
}
