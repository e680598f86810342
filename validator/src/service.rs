//! `validator run`: the validator as a network service.
//!
//! The service contributes to every window's challenge: a task on its own
//! connection ([`tributary_net::beacon::Contributor`]) commits to this
//! validator's contribution while the window is open and reveals it when
//! its submissions close ([`tributary_protocol::beacon`]).
//!
//! For every window `W`, once the coordinator reveals `W`'s challenge (the
//! coordinator's secret checked against the commitment published at open,
//! every contribution against its signed commitment, and the challenge
//! recomputed from them: [`tributary_protocol::beacon::check_reveal`]; a
//! reveal that lists this validator's own contribution as withheld is logged
//! as an error), the service reads `W`'s index (`GetWindowIndex`: every
//! miner's stored groups, the assignment's input), fetches the rollouts of
//! only the miners it judges (never the whole window), proves the groups the window's assignment gives this
//! validator ([`tributary_protocol::assign`], from the reveal: the
//! authorised validators, committee size and budget) plus any extras of its
//! [`SampleConfig`], each on the reference model of the window's checkpoint (downloaded
//! from the coordinator's relay when missing) and posts one signed verdict per
//! miner. The judgement is [`crate::judge`]'s (the same as `validator
//! check`'s); this module adds what only a networked validator can do:
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
//! **Memory.** The reference model of a BF16 checkpoint (every publication)
//! is held as BF16 with f32 arithmetic
//! ([`ReferenceModel::load_for_inference`]): 2 bytes a matrix element, the
//! same results as f32-held weights (`tributary_validator_model_bytes`).
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tributary_net::beacon::{Contributor, ContributorConfig};
use tributary_net::{Backoff, Client, ClientConfig, ClientError, DownloadError, KeyPin, now_ms};
use tributary_policy::{PolicyError, ReferenceModel};
use tributary_protocol::assign;
use tributary_protocol::beacon::Inclusion;
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{EnvSpec, Environment};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::prf::Seed;
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::VerifyParams;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    ErrorCode, Frame, GetCheckpointPath, GetConfirmations, GetReveal, MAX_CONFIRMATIONS_PAGE, Role, Verdict, WindowInfo,
};

use crate::judge::{Contract, Judge, JudgeConfig, JudgeError, judged_miners};
pub use crate::judge::{MinerReport, SampleConfig, WindowReport};

/// Service failures (a failing miner is a verdict, never one of these).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The coordinator stayed unreachable through every retry, refused us
    /// (role, key, version) or a request, or answered out of protocol.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Downloading a checkpoint from the relay failed.
    #[error("download: {0}")]
    Download(#[from] DownloadError),
    /// The window's reveal does not hold (the coordinator's secret, a
    /// contribution, or the challenge mixed from them).
    #[error("window {0}: bad reveal: {1}")]
    BadReveal(WindowId, tributary_protocol::beacon::BeaconError),
    /// The window's challenge is not fixed yet (contributions are still being revealed).
    #[error("window {0}: challenge not fixed yet")]
    NotRevealed(WindowId),
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
    /// The judge failed (not a miner's fault).
    #[error("judge: {0}")]
    Judge(#[from] JudgeError),
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

/// How long a stop signal waits for the window in progress (its report
/// posted and saved) before the service stops without it.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// The service's configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The coordinator's QUIC address.
    pub coordinator: SocketAddr,
    /// Its certificate fingerprint (hex).
    pub fingerprint: String,
    /// The coordinator key this validator accepts (its network).
    pub coordinator_key: KeyPin,
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
    /// Where the reference model runs (`validator run --device`; default
    /// [`tributary_policy::default_device`]).
    pub device: tch::Device,
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
    /// How the judge works under this configuration.
    pub fn judge_config(&self) -> JudgeConfig {
        JudgeConfig {
            params: self.params,
            sample: self.sample,
            batch: self.batch,
            batch_tokens: self.batch_tokens,
            check_signatures: true,
        }
    }

    /// The coordinator connection: connecting and each request retried with
    /// this configuration's backoff, reconnections counted in
    /// `tributary_validator_reconnects_total`.
    pub fn client_config(&self) -> ClientConfig {
        let backoff = Backoff { min: self.min_backoff, max: self.max_backoff, attempts: self.max_attempts };
        ClientConfig {
            coordinator_key: self.coordinator_key.clone(),
            connect: backoff,
            request: backoff,
            on_retry: |_, _| metrics::counter!("tributary_validator_reconnects_total").increment(1),
            ..ClientConfig::new(self.coordinator, self.fingerprint.clone(), self.key.clone(), Role::Validator)
        }
    }

    /// Defaults: the assignment only, batches of 8 rollouts / 8192 tokens, polls of
    /// 500 ms, backoff 200 ms doubling to 30 s, 20 attempts.
    pub fn new(coordinator: SocketAddr, fingerprint: impl Into<String>, key: Keypair, dir: PathBuf) -> Self {
        Self {
            coordinator,
            fingerprint: fingerprint.into(),
            coordinator_key: KeyPin::Any,
            key,
            dir,
            sample: SampleConfig::ASSIGNED,
            batch: 8,
            batch_tokens: 8192,
            gsm8k: None,
            params: VerifyParams::DEFAULT,
            poll: Duration::from_millis(500),
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            max_attempts: 20,
            device: tributary_policy::default_device(),
            start_window: None,
        }
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
    /// The environment of the last window verified, by its settings.
    env: Option<(EnvSpec, Environment)>,
    next_window: Option<WindowId>,
    posted: Vec<PublicKey>,
    /// Confirmations answered, with the rollouts they cited ([`Service::confirm_pending`]).
    answered: std::collections::BTreeMap<(WindowId, PublicKey), Vec<[u8; 32]>>,
    /// This validator's contributions to each window's challenge (stopped when dropped).
    contributor: Contributor,
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
        let mut client = Client::new(cfg.client_config());
        // Closed windows from the object store when the coordinator hands
        // out their manifests (issue 21), else from the coordinator.
        client.add_window_source(Box::new(tributary_net::store_read::StoreSource::new()));
        let schedule = client.welcome().await?.schedule;
        let (next_window, posted) = match Progress::load(&cfg.dir)? {
            Some(p) if p.coordinator.eq_ignore_ascii_case(cfg.fingerprint.trim()) => (p.next_window, p.posted),
            _ => (cfg.start_window.unwrap_or_else(|| schedule.window_at(now_ms()).unwrap_or(0)), Vec::new()),
        };
        let contributor = Contributor::spawn(ContributorConfig {
            coordinator: cfg.coordinator,
            fingerprint: cfg.fingerprint.clone(),
            coordinator_key: cfg.coordinator_key.clone(),
            key: cfg.key.clone(),
            role: Role::Validator,
            poll: cfg.poll.min(Duration::from_millis(250)),
        });
        Ok(Self {
            cfg,
            client,
            loaded: None,
            env: None,
            next_window: Some(next_window),
            posted,
            answered: std::collections::BTreeMap::new(),
            contributor,
        })
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
        let schedule = self.client.welcome().await?.schedule;
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
        let report = match self.verify_window(w).await {
            Err(ServiceError::NotRevealed(_)) => return Ok(None),
            r => r?,
        };
        self.post(&report).await?;
        self.next_window = Some(w + 1);
        self.posted.clear();
        self.save_progress()?;
        Ok(Some(report))
    }

    /// Runs until `stop` is cancelled (at once when it waits; after the
    /// window in progress otherwise, or [`STOP_GRACE`] after the signal if
    /// that window cannot finish, e.g. with the coordinator gone: its work
    /// is not saved as done, so a restart does it again), handing each
    /// window's report to `on_window`.
    pub async fn run(
        &mut self,
        stop: CancellationToken,
        mut on_window: impl FnMut(&WindowReport),
    ) -> Result<(), ServiceError> {
        while !stop.is_cancelled() {
            let outcome = {
                let step = async {
                    if let Err(e) = self.confirm_pending().await {
                        tracing::warn!(error = %e, "confirmations failed (tried again on the next pass)");
                    }
                    self.step().await
                };
                tokio::pin!(step);
                tokio::select! {
                    r = &mut step => Some(r),
                    () = stop.cancelled() => tokio::time::timeout(STOP_GRACE, &mut step).await.ok(),
                }
            };
            let Some(outcome) = outcome else {
                tracing::warn!(
                    grace = ?STOP_GRACE,
                    "stopping with the window in progress unfinished (not saved: a restart verifies it again)"
                );
                break;
            };
            match outcome? {
                Some(r) => {
                    let failed = r.miners.values().filter(|m| m.body.hard_failure).count();
                    tracing::info!(
                        window = r.window,
                        miners = r.miners.len(),
                        failed,
                        rollouts = r.fetched,
                        proved = r.proved,
                        seconds = r.seconds,
                        "window verified"
                    );
                    on_window(&r);
                }
                None => {
                    let _ = stop.run_until_cancelled(tokio::time::sleep(self.cfg.poll)).await;
                }
            }
        }
        Ok(())
    }

    /// The window's challenge, recomputed from the public reveal, and the
    /// assignment settings; [`ServiceError::NotRevealed`] while it is not fixed.
    async fn reveal(&mut self, info: &WindowInfo) -> Result<(Seed, assign::Spec), ServiceError> {
        let w = info.window;
        let answer = match self.client.request(&Frame::GetReveal(GetReveal { window: w })).await {
            Err(e) if e.refusal() == Some(ErrorCode::NotYet) => return Err(ServiceError::NotRevealed(w)),
            a => a?,
        };
        match answer {
            Frame::Reveal(r) if r.window == w => {
                let network = self.client.network().await?;
                let challenge = tributary_protocol::beacon::check_reveal(&r, &network, &info.commitment)
                    .map_err(|e| ServiceError::BadReveal(w, e))?;
                let me = self.cfg.key.public();
                // Acknowledged and in neither list: dropped silently (logged at error).
                let acked = self.contributor.acknowledged(w);
                if tributary_net::beacon::check_inclusion(&r, &me, acked) == Inclusion::Absent && acked {
                    metrics::counter!("tributary_validator_contributions_excluded_total").increment(1);
                }
                if r.withheld.iter().any(|c| c.body.party == me) {
                    metrics::counter!("tributary_validator_contributions_withheld_total").increment(1);
                    tracing::error!(
                        window = w,
                        "the coordinator lists this validator's contribution as withheld (revealed late, or dropped)"
                    );
                }
                tracing::debug!(window = w, contributions = r.contributions.len(), "challenge fixed");
                Ok((challenge, r.assign))
            }
            f => Err(ClientError::Unexpected(f.tag()).into()),
        }
    }

    /// Every rollout of the given miners, and of no other: what the
    /// validator holds of a window is what it judges.
    async fn fetch_miners(&mut self, w: WindowId, miners: &[PublicKey]) -> Result<Vec<Vec<u8>>, ServiceError> {
        let mut out = Vec::new();
        for m in miners {
            self.client.each_rollout_page(w, m, |page| out.extend(page)).await?;
        }
        Ok(out)
    }

    /// Makes `id` the loaded reference model, downloading the full file from
    /// the relay if it is not in the models folder.
    async fn ensure_model(&mut self, id: ContentId) -> Result<(), ServiceError> {
        if self.loaded.as_ref().is_some_and(|l| l.id == id) {
            return Ok(());
        }
        let path = self.cfg.dir.join("models").join(format!("{id}.gguf"));
        if !path.exists() {
            let part = path.with_extension("part");
            self.download(id, &part).await?;
            std::fs::rename(&part, &path)?;
        }
        let ckpt = Checkpoint::open(&path)?;
        if ckpt.content_id() != id {
            let _ = std::fs::remove_file(&path);
            return Err(ServiceError::BadCheckpoint { want: id, detail: format!("file holds {}", ckpt.content_id()) });
        }
        let tokenizer = Tokenizer::from_gguf_file(&path).map_err(|e| ServiceError::Env(e.to_string()))?;
        self.loaded = None;
        // Held as BF16 with f32 arithmetic when the checkpoint's matrices are
        // BF16 (every publication): half the memory, the same bits.
        let model = tokio::task::block_in_place(|| ReferenceModel::load_for_inference(&ckpt, self.cfg.device))?;
        metrics::gauge!("tributary_validator_model_bytes").set(model.parameter_bytes() as f64);
        tracing::info!(%id, bytes = model.parameter_bytes(), "reference model loaded");
        self.loaded = Some(Loaded { id, model, tokenizer });
        if let Err(e) = crate::models::prune(&self.cfg.dir.join("models"), crate::models::KEEP_MODELS, &path) {
            tracing::warn!(error = %e, "could not prune the models folder");
        }
        Ok(())
    }

    /// Downloads checkpoint `id`'s full file from the relay into `part`
    /// (resuming a partial download of it), checked against the announced
    /// length and hash.
    async fn download(&mut self, id: ContentId, part: &std::path::Path) -> Result<(), ServiceError> {
        let path = match self
            .client
            .request(&Frame::GetCheckpointPath(GetCheckpointPath { have: None, want: Some(id) }))
            .await?
        {
            Frame::CheckpointPath(p) => p,
            f => return Err(ClientError::Unexpected(f.tag()).into()),
        };
        let step = match path.steps.as_slice() {
            [s] if s.id == id && s.base.is_none() => s.clone(),
            _ => return Err(ServiceError::BadCheckpoint { want: id, detail: "the relay offers no full file".into() }),
        };
        // The announced length is bounded before anything is written for it.
        if step.len > 64 << 30 {
            return Err(ServiceError::BadCheckpoint { want: id, detail: format!("{} bytes", step.len) });
        }
        // A partial file of this checkpoint (it is named after it) resumes.
        let have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        let from = if have <= step.len { have } else { 0 };
        self.client.download(&step, part, from, |_| {}).await?;
        Ok(())
    }

    /// The window's environment, built once per set of settings.
    fn environment(&mut self, info: &WindowInfo) -> Result<&Environment, ServiceError> {
        let spec = info.env_spec();
        if self.env.as_ref().is_none_or(|(s, _)| *s != spec) {
            let env = Environment::for_window(info, self.cfg.gsm8k.as_deref())
                .map_err(|e| ServiceError::Env(e.to_string()))?;
            self.env = Some((spec, env));
        }
        self.env.as_ref().map(|(_, e)| e).ok_or_else(|| ServiceError::Env("no environment".into()))
    }

    /// Fetches and verifies window `w` (its submissions must have closed);
    /// posts nothing.
    pub async fn verify_window(&mut self, w: WindowId) -> Result<WindowReport, ServiceError> {
        let started = Instant::now();
        let info = self.client.window_info(w).await?;
        let (challenge, spec) = self.reveal(&info).await?;
        let validator = self.cfg.key.public();
        // The assignment from the window's index; then only the miners judged are fetched.
        let work: BTreeMap<PublicKey, BTreeSet<u32>> =
            self.client.window_index(w).await?.into_iter().map(|m| (m.miner, m.groups.into_iter().collect())).collect();
        let sample = self.cfg.sample;
        let judged: Vec<PublicKey> = {
            let env = self.environment(&info)?;
            let contract = Contract::of_window(&info, env, challenge);
            let a = assign::Assignment::compute(&spec, w, &challenge, info.group_size, &work);
            judged_miners(&sample, &contract, &validator, &a, &work).into_keys().collect()
        };
        let blobs = self.fetch_miners(w, &judged).await?;
        self.ensure_model(info.checkpoint).await?;
        let cfg = self.cfg.judge_config();
        self.environment(&info)?;
        let (Some(loaded), Some((_, env))) = (self.loaded.as_ref(), self.env.as_ref()) else {
            return Err(ServiceError::Env("no model or environment".into()));
        };
        let contract = Contract::of_window(&info, env, challenge);
        let judge = Judge::new(&cfg, &loaded.tokenizer, &loaded.model);
        let mut report =
            tokio::task::block_in_place(|| judge.window_indexed(&contract, validator, &spec, Some(&work), blobs))?;
        report.seconds = started.elapsed().as_secs_f64();
        metrics::histogram!("tributary_validator_window_seconds").record(report.seconds);
        metrics::counter!("tributary_validator_rollouts_proved_total").increment(report.proved as u64);
        metrics::counter!("tributary_validator_undecodable_total").increment(report.undecodable as u64);
        for m in report.miners.values() {
            for (check, n) in &m.failed {
                metrics::counter!("tributary_validator_check_failures_total", "check" => check.clone())
                    .increment(u64::from(*n));
            }
        }
        Ok(report)
    }

    /// Signs and posts one verdict per miner.
    pub async fn post(&mut self, report: &WindowReport) -> Result<(), ServiceError> {
        let resuming = self.next_window == Some(report.window);
        let network = self.client.network().await?;
        for m in report.miners.values() {
            if resuming && self.posted.contains(&m.body.miner) {
                continue;
            }
            let v = Verdict::sign(m.body.clone(), &self.cfg.key, &network);
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
                f => return Err(ClientError::Unexpected(f.tag()).into()),
            }
        }
        Ok(())
    }

    /// Confirmations on demand (issue 16): for every failure the coordinator
    /// lists as waiting for this validator (`GetConfirmations`, paged: this
    /// validator is in the miner's committee and the claimant's evidence
    /// needs the model), proves only the rollouts the claim cites on the
    /// reference model of the claim's window and posts the verdict as usual.
    /// Each confirmation is answered once: a cited rollout the coordinator
    /// does not hold cannot be proved and is not asked for again.
    pub async fn confirm_pending(&mut self) -> Result<Vec<WindowReport>, ServiceError> {
        let mut waiting = Vec::new();
        let answered = &self.answered;
        let req = GetConfirmations { after: None, limit: MAX_CONFIRMATIONS_PAGE };
        self.client
            .pages(&req, |page| {
                waiting.extend(page.into_iter().filter(|c| answered.get(&(c.window, c.miner)) != Some(&c.digests)))
            })
            .await?;
        let mut reports = Vec::new();
        for c in waiting {
            let started = Instant::now();
            let info = self.client.window_info(c.window).await?;
            let (challenge, _) = self.reveal(&info).await?;
            let blobs = self.fetch_miners(c.window, &[c.miner]).await?;
            self.ensure_model(info.checkpoint).await?;
            self.environment(&info)?;
            let cfg = self.cfg.judge_config();
            let validator = self.cfg.key.public();
            let (Some(loaded), Some((_, env))) = (self.loaded.as_ref(), self.env.as_ref()) else {
                return Err(ServiceError::Env("no model or environment".into()));
            };
            let contract = Contract::of_window(&info, env, challenge);
            let judge = Judge::new(&cfg, &loaded.tokenizer, &loaded.model);
            let mut report = tokio::task::block_in_place(|| {
                judge.confirm(&contract, validator, c.miner, &c.digests, &c.groups, blobs)
            })?;
            report.seconds = started.elapsed().as_secs_f64();
            metrics::counter!("tributary_validator_rollouts_proved_total").increment(report.proved as u64);
            let network = self.client.network().await?;
            for m in report.miners.values() {
                let v = Verdict::sign(m.body.clone(), &self.cfg.key, &network);
                match self.client.request(&Frame::PostVerdict(v)).await? {
                    Frame::VerdictAck(a) if a.window == c.window && a.miner == c.miner => {
                        let outcome = if m.body.hard_failure { "confirmed" } else { "refuted" };
                        metrics::counter!("tributary_validator_confirmations_total", "outcome" => outcome).increment(1);
                    }
                    f => return Err(ClientError::Unexpected(f.tag()).into()),
                }
            }
            self.answered.insert((c.window, c.miner), c.digests);
            reports.push(report);
        }
        let oldest = self.next_window.unwrap_or(0).saturating_sub(64);
        self.answered.retain(|(w, _), _| *w >= oldest);
        Ok(reports)
    }
}
