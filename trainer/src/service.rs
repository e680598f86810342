//! `trainer run`: the trainer as a network service.
//!
//! Every window `W` whose submissions have closed is trained on once: the
//! service reads `W`'s contract
//! ([`WindowInfo`](tributary_protocol::wire::WindowInfo)) and index (its
//! miners and their groups; banned miners are already left out by the coordinator) and
//! walks it miner by miner, never holding the whole window: it keeps each
//! group's rank, then fetches again in rank order only what it proves and
//! trains on (at most [`SelectConfig::max_train_groups`] groups a step), and
//! selects groups as [`crate::select::select_proven`] does (every group that enters
//! the batch is proven by the trainer itself, [`crate::proof`], with the
//! weights of the checkpoint it names, and its old-policy log-probs are the
//! trainer's own), takes one GRPO step (or, while the proven groups number
//! fewer than [`SelectConfig::min_train_groups`], keeps them in
//! `pending.postcard` for the next windows' groups and publishes nothing), exports the BF16 checkpoint and
//! publishes it for the current window ([`crate::publish`]: a signed full
//! or delta payload, never two different checkpoints for one window), then
//! uploads it, then sends the step's signed report ([`TrainerStats`]: loss,
//! entropy, clip fractions, reward, kept/dropped groups, delta size) that the
//! coordinator's dashboard draws. Progress (`service.json`: the next window
//! to train on, the last publication and report confirmed by the
//! coordinator) and the trainer state are saved after each step, so a
//! restarted service resumes where it stopped and re-uploads a publication
//! (and re-sends a report, kept in `stats.bin`) the coordinator did not confirm.
//!
//! Verdicts ([`Frame::GetStanding`]) are a second gate: a (miner, window)
//! that failed, or a miner not in good standing, is dropped; the trainer
//! does not wait for verdicts. A rollout that fails the trainer's proof
//! drops its group (never the step), is logged at warn with the figures,
//! counted in `trainer_rollouts_rejected_total{check}` and recorded in
//! `rejected/<window>.jsonl` ([`RejectRecord`]). The digests of the rollouts
//! of each step's batch are written to `batches/<window>.json`
//! ([`BatchRecord`]). Both folders keep the last [`KEEP_RECORDS`] files.
//! A group that passes with a token other than the trainer's own draw is
//! proven work (posted as passing); the trainer re-generates such rollouts
//! from the first off-draw position with its own draws and trains the
//! group with them (logged at info, `trainer_rollouts_repaired_total`), up
//! to `ProofConfig::max_repairs_per_window` (`max_repairs_per_miner` of
//! them for one miner); beyond it the group is dropped
//! as `off_draw` ([`GroupProof::OffDraw`], logged at info, counted in
//! `trainer_rollouts_off_draw_total`).
//!
//! What the proof found goes back to the coordinator as the trainer's signed
//! verdict per (window, miner) it looked at: the digests it proved passing
//! (which refute a validator's false evidence on them) and each failure's
//! evidence (the trainer's own proof failure bans the miner). A miner's
//! first proof failure in a window is posted at once (with what the proof
//! passed of it before), and its other groups there are not proven; a
//! window spends at most [`SelectConfig::max_failed_proofs`] failed proofs
//! ([`ProofBudget`]). The rest is posted after the round. A group that is
//! not the window's whole group is refused before any check and recorded
//! (check `group_size`), never posted. A network
//! error does not end [`Service::run`]: it reconnects with backoff and
//! retries the round.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tch::Device;
use tokio_util::sync::CancellationToken;
use tributary_net::beacon::{Contributor, ContributorConfig};
use tributary_net::{Backoff, Client, ClientConfig, ClientError, KeyPin, NetError, now_ms};
use tributary_protocol::checkpoint::{Checkpoint, ContentId};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::window::{Schedule, WindowId};
use tributary_protocol::wire::{
    CheckpointKind, Frame, GetStanding, MinerStanding, NetworkId, Role, TrainerStats, TrainerStatsBody, Verdict,
    VerdictBody,
};

use crate::proof::{GroupProof, ProofConfig, ProofError, Prover, RejectRecord};
use crate::publish::{Publication, PublishError, Publisher};
use crate::select::{
    DropReason, GroupKey, ProofBudget, Screened, SelectConfig, Selection, Standing, TrainGroup, apply_proof,
    checkpoint_problem, rank_order, screen,
};
use crate::state::{self, StateError, write_atomic};
use crate::train::{Sample, StepStats, TrainConfig, TrainError, Trainer};

/// Service failures.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The coordinator could not be reached, refused, or answered out of protocol.
    #[error("network: {0}")]
    Client(#[from] ClientError),
    /// Training failed.
    #[error("training: {0}")]
    Train(#[from] TrainError),
    /// Saving or loading state failed.
    #[error("state: {0}")]
    State(#[from] StateError),
    /// Publishing failed.
    #[error("publish: {0}")]
    Publish(#[from] PublishError),
    /// The genesis checkpoint is unusable.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] tributary_protocol::checkpoint::CheckpointError),
    /// `service.json` is malformed.
    #[error("service.json: {0}")]
    Json(#[from] serde_json::Error),
    /// `stats.bin` is malformed.
    #[error("stats.bin: {0}")]
    Stats(#[from] postcard::Error),
    /// `pending.postcard` (the groups kept for a step below its floor) is malformed.
    #[error("pending.postcard: {0}")]
    Pending(postcard::Error),
    /// Reading a payload failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The proof could not be set up.
    #[error("proof: {0}")]
    Proof(#[from] ProofError),
}

/// Files kept in `rejected/` and in `batches/`.
pub const KEEP_RECORDS: usize = 64;

/// `batches/<window>.json`: what one GRPO step trained on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatchRecord {
    /// The window the step's checkpoint was published for.
    pub window: WindowId,
    /// The optimiser step.
    pub step: u64,
    /// The windows whose rollouts were selected.
    pub trained: Vec<WindowId>,
    /// Digests (hex) of every rollout in the batch.
    pub digests: Vec<String>,
}

/// The service's configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The coordinator's QUIC address.
    pub coordinator: SocketAddr,
    /// Its certificate fingerprint.
    pub fingerprint: String,
    /// The coordinator key this trainer accepts (its network).
    pub coordinator_key: KeyPin,
    /// The trainer key (authorised by the coordinator).
    pub key: Keypair,
    /// State folder (trainer state, publications, progress).
    pub dir: PathBuf,
    /// The genesis checkpoint (the layout template of every export).
    pub genesis: PathBuf,
    /// Optimiser settings.
    pub train: TrainConfig,
    /// Selection settings.
    pub select: SelectConfig,
    /// A full payload every this many publications.
    pub full_every: u64,
    /// Treat rollouts of miners not yet judged as passed (dev networks
    /// without validators). Either way they are proven by the trainer and
    /// trained without waiting for a verdict; only the standing reported
    /// to [`crate::select::select_proven`] differs.
    pub trust_unjudged: bool,
    /// How often to check the clock.
    pub poll: Duration,
    /// Where training runs (`trainer run --device`).
    pub device: Device,
    /// Publications whose files stay on disk (0: all; [`Publisher::set_retention`]).
    pub keep_publications: usize,
}

impl ServiceConfig {
    /// The coordinator connection: one connection attempt and one try per
    /// request. The service retries whole rounds instead ([`Service::run`]):
    /// after a lost connection it re-sends what the coordinator did not
    /// confirm before anything else.
    pub fn client_config(&self) -> ClientConfig {
        let once = Backoff { min: Duration::ZERO, max: Duration::ZERO, attempts: 1 };
        ClientConfig {
            coordinator_key: self.coordinator_key.clone(),
            connect: once,
            request: once,
            ..ClientConfig::new(self.coordinator, self.fingerprint.clone(), self.key.clone(), Role::Trainer)
        }
    }
}

/// `service.json`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// The next window to train on.
    pub next_window: WindowId,
    /// The last publication (window) the coordinator confirmed.
    pub uploaded: Option<WindowId>,
    /// The last step report (its publication window) the coordinator confirmed.
    #[serde(default)]
    pub stats_sent: Option<WindowId>,
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    /// Windows trained on.
    pub windows: Vec<WindowId>,
    /// Rollouts fetched.
    pub rollouts: usize,
    /// Groups trained on.
    pub groups: usize,
    /// The checkpoint published, if a step was taken.
    pub published: Option<(WindowId, ContentId)>,
    /// Digests of the rollouts in the step's batch.
    pub batch: Vec<[u8; 32]>,
    /// Rollouts that failed the trainer's proof.
    pub rejected: Vec<RejectRecord>,
    /// The most rollouts the round held in memory at once.
    pub peak_held: usize,
    /// Proven groups kept for a later step because they were fewer than
    /// [`SelectConfig::min_train_groups`] (0 when the round stepped).
    pub pending: usize,
    /// Where the round's time went.
    pub times: RoundTimes,
}

/// Wall-clock seconds of a round's phases (also the histogram
/// `tributary_trainer_round_phase_seconds{phase}` and the round's log line):
/// what a stepping round costs against the window length.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoundTimes {
    /// Reading the windows' rollouts and proving their groups.
    pub take: f64,
    /// The part of `take` spent in the proof (evidence forwards, checks,
    /// re-generations).
    pub prove: f64,
    /// The optimiser step (forward and backward on the kept groups).
    pub step: f64,
    /// Exporting the BF16 checkpoint and writing its publication.
    pub export: f64,
    /// Saving the fp32 masters and AdamW moments (and the stats).
    pub save: f64,
    /// Uploading the publication to the coordinator.
    pub upload: f64,
}

impl RoundTimes {
    fn record(&self, stepped: bool) {
        let h = |phase: &'static str, s: f64| {
            metrics::histogram!("tributary_trainer_round_phase_seconds", "phase" => phase).record(s);
        };
        h("take", self.take);
        h("prove", self.prove);
        if stepped {
            h("step", self.step);
            h("export", self.export);
            h("save", self.save);
            h("upload", self.upload);
        }
    }
}

/// Seconds since `t`, to the millisecond.
fn secs(t: std::time::Instant) -> f64 {
    to_ms(t.elapsed().as_secs_f64())
}

/// `s` seconds rounded to the millisecond.
fn to_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// `pending.postcard`: the proven groups of windows before `next_window`
/// that a step below [`SelectConfig::min_train_groups`] did not take. It
/// is written before `service.json` advances to `next_window`, and read only
/// while `service.json` says the same window: a crash between the two
/// takes those windows again (the file is then ignored), and a step past
/// it leaves the file behind as stale. No group is trained twice or lost.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Pending {
    next_window: WindowId,
    groups: Vec<TrainGroup>,
}

/// The running service.
pub struct Service {
    cfg: ServiceConfig,
    client: Client,
    schedule: Schedule,
    trainer: Trainer,
    template: Checkpoint,
    publisher: Publisher,
    progress: Progress,
    prover: Prover,
    /// The trainer's contributions to each window's challenge
    /// ([`tributary_protocol::beacon`]), on their own connection so a
    /// training step never delays a reveal; stopped when dropped.
    _contributor: Contributor,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("progress", &self.progress).finish_non_exhaustive()
    }
}

impl Service {
    /// Connects and loads (or creates) the trainer state, with the default
    /// proof settings.
    pub async fn open(cfg: ServiceConfig) -> Result<Self, ServiceError> {
        Self::open_with(cfg, ProofConfig::default()).await
    }

    /// [`Service::open`] with proof settings (a GSM8K file, how many
    /// checkpoints to keep loaded).
    pub async fn open_with(cfg: ServiceConfig, proof: ProofConfig) -> Result<Self, ServiceError> {
        let mut client = Client::new(cfg.client_config());
        // Closed windows from the object store when the coordinator hands
        // out their manifests (issue 21), else from the coordinator.
        client.add_window_source(Box::new(tributary_net::store_read::StoreSource::new()));
        let schedule = client.welcome().await?.schedule;
        let network = client.network().await?;
        std::fs::create_dir_all(&cfg.dir)?;
        let template = Checkpoint::open(&cfg.genesis)?;
        let trainer = match state::load(&cfg.dir.join("state"), cfg.device, cfg.train)? {
            Some(t) => t,
            None => Trainer::from_checkpoint(&template, cfg.device, cfg.train)?,
        };
        let mut publisher = Publisher::open(&cfg.dir.join("publish"), cfg.key.clone(), network, cfg.full_every)?;
        publisher.set_retention(cfg.keep_publications);
        let progress = match std::fs::read(cfg.dir.join("service.json")) {
            Ok(b) => serde_json::from_slice(&b)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Progress { next_window: schedule.window_at(now_ms()).unwrap_or(0), uploaded: None, stats_sent: None }
            }
            Err(e) => return Err(e.into()),
        };
        let prover = Prover::new(&cfg.genesis, proof)?;
        let _contributor = Contributor::spawn(ContributorConfig {
            coordinator: cfg.coordinator,
            fingerprint: cfg.fingerprint.clone(),
            coordinator_key: cfg.coordinator_key.clone(),
            key: cfg.key.clone(),
            role: Role::Trainer,
            poll: cfg.poll.min(Duration::from_millis(250)),
        });
        let mut s = Self { cfg, client, schedule, trainer, template, publisher, progress, prover, _contributor };
        s.reupload().await?;
        s.announce_genesis().await?;
        Ok(s)
    }

    /// Progress so far.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    fn pending_path(&self) -> PathBuf {
        self.cfg.dir.join("pending.postcard")
    }

    /// The groups kept for this step by earlier rounds ([`Pending`]).
    fn load_pending(&self) -> Result<Vec<TrainGroup>, ServiceError> {
        read_pending(&self.pending_path(), self.progress.next_window)
    }

    fn save_progress(&self) -> Result<(), ServiceError> {
        write_atomic(&self.cfg.dir.join("service.json"), &serde_json::to_vec_pretty(&self.progress)?)?;
        Ok(())
    }

    /// Uploads the last publication, and sends the last step report, if the
    /// coordinator has not confirmed them.
    async fn reupload(&mut self) -> Result<(), ServiceError> {
        let Some(last) = self.publisher.last().cloned() else { return Ok(()) };
        if self.progress.uploaded != Some(last.window) {
            let bytes = std::fs::read(self.publisher.checkpoint_path(&last.id))?;
            let p = self.publisher.publish(last.window, bytes)?;
            self.upload(&p).await?;
            self.progress.uploaded = Some(last.window);
            self.save_progress()?;
        }
        let pending = match std::fs::read(self.stats_path()) {
            Ok(b) => Some(postcard::from_bytes::<TrainerStats>(&b)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(report) = pending
            && self.progress.stats_sent.is_none_or(|w| w < report.body.window)
        {
            self.send_stats(&report).await?;
        }
        Ok(())
    }

    /// Announces the genesis checkpoint (a signed announcement of the genesis
    /// file, uploaded once) when the coordinator holds no announcement of it,
    /// so miners check the first model against this trainer's key like every
    /// later one.
    async fn announce_genesis(&mut self) -> Result<(), ServiceError> {
        use tributary_protocol::wire;
        let id = self.template.content_id();
        let get = Frame::GetCheckpointPath(wire::GetCheckpointPath { have: None, want: Some(id) });
        match self.client.request(&get).await {
            Ok(Frame::CheckpointPath(p)) if p.announcement.is_none() => {}
            // Announced already; or the coordinator's genesis is another file (it refuses the path).
            Ok(_) => return Ok(()),
            Err(e) if e.refusal().is_some() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let bytes = self.template.bytes();
        let body = wire::CheckpointBody {
            id,
            kind: CheckpointKind::Full,
            len: bytes.len() as u64,
            payload_hash: *blake3::hash(bytes).as_bytes(),
            window: 0,
            trainer: self.cfg.key.public(),
        };
        let ann = wire::PublishCheckpoint::sign(body, &self.cfg.key, &self.client.network().await?);
        self.client.publish_checkpoint(&ann, bytes).await?;
        tracing::info!(%id, "genesis checkpoint announced");
        Ok(())
    }

    fn stats_path(&self) -> PathBuf {
        self.cfg.dir.join("stats.bin")
    }

    /// The signed report of the step that produced publication `p`.
    fn report(&self, p: &Publication, step: &StepStats, sel: &Selection, network: &NetworkId) -> TrainerStats {
        let b = &p.announcement.body;
        let trained = sel.kept.iter().flat_map(|g| g.rollouts.iter().map(|r| r.window));
        let first = trained.clone().min().unwrap_or(b.window).min(b.window);
        let last = trained.max().unwrap_or(b.window).min(b.window);
        let body = TrainerStatsBody {
            window: b.window,
            checkpoint: b.id,
            first_trained: first,
            last_trained: last,
            step: step.step,
            lr: step.lr,
            loss: step.loss,
            pg_loss: step.pg_loss,
            // No KL term (the trainer keeps no reference model): always 0.
            kl: 0.0,
            entropy: step.entropy,
            clip_low_frac: step.clip_low_frac,
            clip_high_frac: step.clip_high_frac,
            grad_norm: step.grad_norm,
            reward_mean: step.reward_mean,
            reward_std: step.reward_std,
            seqs: step.seqs as u64,
            tokens: step.tokens as u64,
            groups_kept: sel.kept.len() as u64,
            groups_dropped: sel.dropped.values().sum(),
            groups_held: sel.held_groups,
            payload_bytes: p.payload_len,
            checkpoint_bytes: p.checkpoint_len,
            delta: matches!(b.kind, CheckpointKind::Delta { .. }),
            change_fraction: p.changed.map(|(c, t)| c as f64 / t.max(1) as f64),
            trainer: self.cfg.key.public(),
        };
        TrainerStats::sign(body, &self.cfg.key, network)
    }

    /// Sends a step report and records the coordinator's acknowledgement.
    /// A report whose figures are not well formed (a non-finite loss) is
    /// logged and not sent: the coordinator would refuse it.
    async fn send_stats(&mut self, report: &TrainerStats) -> Result<(), ServiceError> {
        let window = report.body.window;
        if let Err(e) = report.body.check() {
            tracing::warn!(window, error = %e, "step report not sent");
            self.progress.stats_sent = Some(window);
            return self.save_progress();
        }
        match self.client.request(&Frame::PostTrainerStats(report.clone())).await? {
            Frame::TrainerStatsAck(a) if a.window == window => {
                self.progress.stats_sent = Some(window);
                self.save_progress()
            }
            f => Err(ClientError::Unexpected(f.tag()).into()),
        }
    }

    async fn upload(&mut self, p: &Publication) -> Result<(), ServiceError> {
        let payload = std::fs::read(&p.payload)?;
        let id = p.announcement.body.id;
        self.client.publish_checkpoint(&p.announcement, &payload).await?;
        tracing::info!(%id, window = p.announcement.body.window, bytes = payload.len(), "checkpoint uploaded");
        Ok(())
    }

    /// Screens, ranks and proves window `w`'s groups into `pick`, holding
    /// one miner's rollouts at a time besides the groups kept:
    ///
    /// 1. the window's index; a window whose checkpoint is stale is dropped
    ///    whole, unfetched (the door takes only the window's checkpoint);
    /// 2. miner by miner (a miner failed or not in good standing is dropped
    ///    unfetched), each group screened ([`screen`]) and only its key and
    ///    score kept;
    /// 3. in rank order, each group fetched again with its miner's groups
    ///    ranked within the quota still open, re-screened and proven until
    ///    the window's quota is filled (a group that fails its proof makes
    ///    room for the next, as in [`crate::select::select_proven`]).
    async fn take_window(
        &mut self,
        w: WindowId,
        published: &[ContentId],
        pick: &mut Pick,
        round: &mut Round,
    ) -> Result<(), ServiceError> {
        let cfg = self.cfg.select;
        let info = self.client.window_info(w).await?;
        let index = self.client.window_index(w).await?;
        let drop = |sel: &mut Selection, reason: DropReason, n: u64| {
            if n > 0 {
                *sel.dropped.entry(reason).or_default() += n;
            }
        };
        if let Some(reason) = checkpoint_problem(&info.checkpoint, published, &cfg) {
            drop(&mut pick.sel, reason, index.iter().map(|m| m.groups.len() as u64).sum());
            return Ok(());
        }
        self.hold_checkpoint(info.checkpoint);
        // What the validators' verdicts say (miners not listed are unjudged
        // and in good standing).
        let known: HashMap<PublicKey, MinerStanding> =
            self.client.paged(&GetStanding { window: w, after: None }).await?.into_iter().collect();
        let trust = self.cfg.trust_unjudged;
        let standing = move |miner: &[u8; 32], _: WindowId| match known.get(&PublicKey(*miner)) {
            Some(MinerStanding::Passed) => Standing::Passed,
            Some(MinerStanding::Failed) => Standing::Failed,
            Some(MinerStanding::Suspect) => Standing::Pending { good_standing: false },
            None if trust => Standing::Passed,
            None => Standing::Pending { good_standing: true },
        };
        let mut ranked: Vec<(f64, GroupKey)> = Vec::new();
        for m in &index {
            let unfetched = match standing(&m.miner.0, w) {
                Standing::Failed => Some(DropReason::FailedVerdict),
                Standing::Pending { good_standing: false } => Some(DropReason::BadStanding),
                _ => None,
            };
            if let Some(reason) = unfetched {
                drop(&mut pick.sel, reason, m.groups.len() as u64);
                continue;
            }
            let rollouts = self.fetch_miner(w, &m.miner).await?;
            round.rollouts += rollouts.len();
            round.peak_held = round.peak_held.max(pick.held() + rollouts.len());
            for (key, rs) in by_group(rollouts) {
                match screen(key, rs, published, &standing, &cfg, true) {
                    Screened::Survivor(g) => ranked.push((g.score, g.key)),
                    Screened::Dropped(reason) => drop(&mut pick.sel, reason, 1),
                    Screened::Held(_) => drop(&mut pick.sel, DropReason::Unprovable, 1),
                }
            }
        }
        ranked.sort_by(|a, b| rank_order((a.0, &a.1), (b.0, &b.1)));
        let mut kept = 0usize;
        let mut ahead: HashMap<GroupKey, TrainGroup> = HashMap::new();
        let mut budget = ProofBudget::new(&cfg);
        for (i, (_, key)) in ranked.iter().enumerate() {
            if kept >= cfg.max_groups_per_window {
                drop(&mut pick.sel, DropReason::RankedOut, 1);
                continue;
            }
            if let Err(reason) = budget.allows(&key.miner, standing(&key.miner, w)) {
                ahead.remove(key);
                drop(&mut pick.sel, reason, 1);
                continue;
            }
            let mut g = match ahead.remove(key) {
                Some(g) => g,
                None => {
                    let open = cfg.max_groups_per_window - kept;
                    let wanted: HashSet<GroupKey> =
                        ranked[i..].iter().take(open).map(|(_, k)| *k).filter(|k| k.miner == key.miner).collect();
                    let rollouts = self.fetch_miner(w, &PublicKey(key.miner)).await?;
                    round.peak_held = round.peak_held.max(pick.held() + held(&ahead) + rollouts.len());
                    for (k, rs) in by_group(rollouts) {
                        if wanted.contains(&k)
                            && let Screened::Survivor(g) = screen(k, rs, published, &standing, &cfg, true)
                        {
                            ahead.insert(k, g);
                        }
                    }
                    match ahead.remove(key) {
                        Some(g) => g,
                        // Gone between the two reads (retention): nothing to train on.
                        None => {
                            drop(&mut pick.sel, DropReason::Unprovable, 1);
                            continue;
                        }
                    }
                }
            };
            let t = std::time::Instant::now();
            let proved = tokio::task::block_in_place(|| self.prover.prove_group(&info, &g.rollouts));
            round.times.prove += t.elapsed().as_secs_f64();
            let proof = match proved {
                Ok(GroupProof::Rejected(recs)) => {
                    budget.record(&g.key.miner, true);
                    // The miner's first failure in the window: its verdict
                    // (what the proof passed of it so far, and this failure)
                    // goes out now, not after the round; its other groups
                    // in the window are not proven.
                    let miner = PublicKey(g.key.miner);
                    let passed = pick.proven.remove(&(w, miner)).unwrap_or_default();
                    self.record_rejected(&recs)?;
                    self.post_verdicts(&recs, BTreeMap::from([((w, miner), passed)])).await?;
                    pick.rejected.extend(recs.iter().cloned());
                    Some(GroupProof::Rejected(recs))
                }
                Ok(GroupProof::Incomplete(recs)) => {
                    pick.incomplete.extend(recs.iter().cloned());
                    Some(GroupProof::Incomplete(recs))
                }
                Ok(p @ (GroupProof::Proven { .. } | GroupProof::OffDraw(_))) => {
                    if let GroupProof::OffDraw(recs) = &p {
                        for r in recs {
                            tracing::info!(
                                window = w,
                                miner = %hex::encode(g.key.miner),
                                group = g.key.group,
                                rollout = r.rollout,
                                digest = %r.digest,
                                position = r.position,
                                off_draw = r.count,
                                "a token is not the trainer's own draw: proven, the group is not trained on"
                            );
                        }
                        metrics::counter!("tributary_trainer_rollouts_off_draw_total").increment(recs.len() as u64);
                    }
                    if let GroupProof::Proven { repaired, .. } = &p
                        && !repaired.is_empty()
                    {
                        tracing::info!(
                            window = w,
                            miner = %hex::encode(g.key.miner),
                            group = g.key.group,
                            rollouts = ?repaired.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                            "rollouts off the trainer's draw re-generated with its own draws: the group trains"
                        );
                        metrics::counter!("tributary_trainer_rollouts_repaired_total").increment(repaired.len() as u64);
                    }
                    budget.record(&g.key.miner, false);
                    let digests = g.rollouts.iter().map(Rollout::digest);
                    pick.proven.entry((w, PublicKey(g.key.miner))).or_default().extend(digests);
                    Some(p)
                }
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(window = w, group = g.key.group, error = %e, "proof could not run");
                    None
                }
            };
            match apply_proof(&mut g, proof) {
                Ok(()) => {
                    kept += 1;
                    pick.sel.kept.push(g);
                }
                Err(reason) => drop(&mut pick.sel, reason, 1),
            }
        }
        Ok(())
    }

    /// Every rollout of one miner in `window` (those that decode), page by page.
    async fn fetch_miner(&mut self, window: WindowId, miner: &PublicKey) -> Result<Vec<Rollout>, ServiceError> {
        let mut out = Vec::new();
        let decode = |b: &Vec<u8>| Rollout::decode(b, &RolloutLimits::DEFAULT).ok();
        self.client.each_rollout_page(window, miner, |page| out.extend(page.iter().filter_map(decode))).await?;
        Ok(out)
    }

    /// Loads `id`'s weights for the proof if the trainer still has the file
    /// (the genesis or one of its publications); a checkpoint it cannot
    /// load stays unheld, and rollouts naming it are dropped as stale.
    fn hold_checkpoint(&mut self, id: ContentId) {
        if self.prover.holds(&id) {
            return;
        }
        let path = if id == self.template.content_id() {
            self.cfg.genesis.clone()
        } else {
            self.publisher.checkpoint_path(&id)
        };
        if !path.exists() {
            tracing::warn!(checkpoint = %id, "rollouts name a checkpoint the trainer does not have: dropped as stale");
            return;
        }
        if let Err(e) = tokio::task::block_in_place(|| self.prover.load(id, &path)) {
            tracing::warn!(checkpoint = %id, error = %e, "checkpoint not loaded for the proof");
        }
    }

    /// Logs, counts and records rollouts that failed the proof.
    fn record_rejected(&self, rejected: &[RejectRecord]) -> Result<(), ServiceError> {
        if rejected.is_empty() {
            return Ok(());
        }
        let dir = self.cfg.dir.join("rejected");
        std::fs::create_dir_all(&dir)?;
        let mut by_window: std::collections::BTreeMap<WindowId, Vec<u8>> = std::collections::BTreeMap::new();
        for r in rejected {
            tracing::warn!(
                window = r.window,
                miner = %r.miner,
                group = r.group,
                rollout = r.rollout,
                digest = %r.digest,
                check = %r.check,
                position = ?r.position,
                detail = %r.detail,
                "rollout failed the trainer's proof: not trained"
            );
            metrics::counter!("tributary_trainer_rollouts_rejected_total", "check" => r.check.clone()).increment(1);
            let line = by_window.entry(r.window).or_default();
            line.extend(serde_json::to_vec(r)?);
            line.push(b'\n');
        }
        for (w, lines) in by_window {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{w}.jsonl")))?;
            f.write_all(&lines)?;
        }
        prune(&dir, KEEP_RECORDS)
    }

    /// Posts one signed verdict per (window, miner) the proof looked at: the
    /// digests it proved passing (what refutes a validator's false evidence)
    /// and the evidence of each failure (what confirms a validator's, or bans
    /// on its own: the trainer's proof is a party the coordinator trusts).
    async fn post_verdicts(
        &mut self,
        rejected: &[RejectRecord],
        proven: BTreeMap<(WindowId, PublicKey), Vec<[u8; 32]>>,
    ) -> Result<(), ServiceError> {
        let mut bodies: BTreeMap<(WindowId, PublicKey), VerdictBody> = BTreeMap::new();
        let trainer = self.cfg.key.public();
        for ((window, miner), digests) in proven {
            let b = bodies.entry((window, miner)).or_insert_with(|| VerdictBody::empty(window, miner, trainer));
            for d in digests {
                b.checked += 1;
                b.valid += 1;
                b.add_passed(d);
            }
        }
        for r in rejected {
            let Some(e) = &r.evidence else { continue };
            let Ok(miner) = r.miner.parse::<PublicKey>() else { continue };
            let b = bodies.entry((r.window, miner)).or_insert_with(|| VerdictBody::empty(r.window, miner, trainer));
            b.checked += 1;
            b.hard_failure = true;
            b.add_reason(&format!("trainer proof: {} group {} rollout {}: {}", r.check, r.group, r.rollout, r.detail));
            b.add_evidence(e.clone());
        }
        let network = self.client.network().await?;
        for (_, b) in bodies {
            let (window, miner) = (b.window, b.miner);
            let v = Verdict::sign(b, &self.cfg.key, &network);
            match self.client.request(&Frame::PostVerdict(v)).await {
                Ok(Frame::VerdictAck(a)) if a.window == window && a.miner == miner => {}
                Ok(f) => return Err(ClientError::Unexpected(f.tag()).into()),
                // A coordinator that takes no verdicts from this key: training goes on without.
                Err(ClientError::Refused(NetError::Refused(code, detail))) => {
                    tracing::warn!(window, miner = %miner.short(), ?code, %detail, "the trainer's verdict was refused");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Trains on every closed, untrained window (as many as
    /// [`SelectConfig::max_train_groups`] lets one step take) and publishes
    /// once for the current window. Does nothing while the current window is
    /// already published or no window has closed.
    pub async fn round(&mut self) -> Result<Round, ServiceError> {
        let now = now_ms();
        let current = self.schedule.window_at(now).unwrap_or(0);
        let mut round = Round::default();
        if self.publisher.last().is_some_and(|r| r.window >= current) {
            return Ok(round);
        }
        let genesis = self.template.content_id();
        let mut published = vec![genesis];
        published.extend(self.publisher.published_ids());
        let mut w = self.progress.next_window;
        if self.schedule.closes_at(w) > now {
            return Ok(round);
        }
        let mut pick = Pick::default();
        pick.sel.kept = self.load_pending()?;
        let carried = pick.sel.kept.len();
        let mut capped = false;
        let take = std::time::Instant::now();
        while self.schedule.closes_at(w) <= now {
            let quota = self.cfg.select.max_groups_per_window;
            if !pick.sel.kept.is_empty() && pick.sel.kept.len() + quota > self.cfg.select.max_train_groups {
                capped = true;
                break;
            }
            self.take_window(w, &published, &mut pick, &mut round).await?;
            round.windows.push(w);
            w += 1;
        }
        if round.windows.is_empty() {
            return Ok(round);
        }
        round.times.take = secs(take);
        round.times.prove = to_ms(round.times.prove);
        let Pick { mut sel, rejected, incomplete, proven } = pick;
        sel.kept.sort_by_key(|g| g.key);
        sel.record_metrics(carried);
        // The round's groups not trained on, by reason (for its log line).
        let dropped: Vec<String> = sel.dropped.iter().map(|(r, n)| format!("{}:{n}", r.as_str())).collect();
        let dropped = dropped.join(",");
        // Proof failures were recorded and posted when they happened; what
        // is left: incomplete groups (recorded, never posted) and the
        // verdicts of miners the proof only passed.
        self.record_rejected(&incomplete)?;
        self.post_verdicts(&[], proven).await?;
        round.rejected = rejected;
        round.rejected.extend(incomplete);
        // A step the memory cap ended steps whatever the floor says.
        let floor = self.cfg.select.min_train_groups.max(1);
        if !capped && !sel.kept.is_empty() && sel.kept.len() < floor {
            let pending = Pending { next_window: w, groups: sel.kept };
            let bytes = postcard::to_stdvec(&pending).map_err(ServiceError::Pending)?;
            write_atomic(&self.pending_path(), &bytes)?;
            round.pending = pending.groups.len();
            metrics::gauge!("tributary_trainer_groups_pending").set(round.pending as f64);
            round.times.record(false);
            tracing::info!(
                groups = round.pending,
                floor,
                next_window = w,
                take_s = round.times.take,
                prove_s = round.times.prove,
                %dropped,
                "kept for a later step (below the floor)"
            );
            self.progress.next_window = w;
            self.save_progress()?;
            return Ok(round);
        }
        metrics::gauge!("tributary_trainer_groups_pending").set(0.0);
        round.groups = sel.kept.len();
        self.progress.next_window = w;
        if !sel.kept.is_empty() {
            let samples = Sample::from_groups(&sel.kept);
            let t = std::time::Instant::now();
            let stats = tokio::task::block_in_place(|| self.trainer.step(&samples))?;
            round.times.step = secs(t);
            stats.record_metrics();
            round.batch = sel.kept.iter().flat_map(|g| g.rollouts.iter().map(Rollout::digest)).collect();
            self.record_batch(current, stats.step, &sel, &round.batch)?;
            let t = std::time::Instant::now();
            let bytes = tokio::task::block_in_place(|| self.trainer.export_checkpoint(&self.template))?;
            let p = self.publisher.publish(current, bytes)?;
            round.times.export = secs(t);
            let network = self.client.network().await?;
            let report = self.report(&p, &stats, &sel, &network);
            let t = std::time::Instant::now();
            state::save(&self.cfg.dir.join("state"), &self.trainer)?;
            write_atomic(&self.stats_path(), &postcard::to_stdvec(&report)?)?;
            self.save_progress()?;
            round.times.save = secs(t);
            let t = std::time::Instant::now();
            self.upload(&p).await?;
            round.times.upload = secs(t);
            self.progress.uploaded = Some(current);
            self.save_progress()?;
            self.send_stats(&report).await?;
            round.published = Some((current, p.announcement.body.id));
            round.times.record(true);
            let RoundTimes { take, prove, step, export, save, upload } = round.times;
            tracing::info!(
                step = stats.step,
                loss = stats.loss,
                groups = round.groups,
                take_s = take,
                prove_s = prove,
                step_s = step,
                export_s = export,
                save_s = save,
                upload_s = upload,
                %dropped,
                "trained"
            );
        }
        self.save_progress()?;
        match std::fs::remove_file(self.pending_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        Ok(round)
    }

    /// Writes `batches/<window>.json` for the step published for `window`.
    fn record_batch(
        &self,
        window: WindowId,
        step: u64,
        sel: &Selection,
        digests: &[[u8; 32]],
    ) -> Result<(), ServiceError> {
        let dir = self.cfg.dir.join("batches");
        std::fs::create_dir_all(&dir)?;
        let trained: std::collections::BTreeSet<WindowId> = sel.kept.iter().map(|g| g.key.window).collect();
        let rec = BatchRecord {
            window,
            step,
            trained: trained.into_iter().collect(),
            digests: digests.iter().map(hex::encode).collect(),
        };
        write_atomic(&dir.join(format!("{window}.json")), &serde_json::to_vec_pretty(&rec)?)?;
        prune(&dir, KEEP_RECORDS)
    }

    /// Runs rounds until `stop` is cancelled (at once when it waits; after
    /// the round in progress otherwise).
    /// A network failure (the coordinator restarting, a refusal such as
    /// "not yet" from a clock ahead of the coordinator's) does not end it:
    /// the service reconnects with backoff, re-sends what the coordinator did
    /// not confirm, and retries the round (nothing of a failed round was
    /// saved as done). A refusal no retry can cure, or an answer out of
    /// protocol ([`ClientError::is_transient`]), ends it.
    pub async fn run(&mut self, stop: CancellationToken) -> Result<(), ServiceError> {
        let mut backoff = RECONNECT_MIN;
        let mut connected = true;
        while !stop.is_cancelled() {
            let result = if connected { self.round().await } else { self.reconnect().await.map(|()| Round::default()) };
            match result {
                Ok(r) => {
                    connected = true;
                    backoff = RECONNECT_MIN;
                    if let Some((w, id)) = r.published {
                        tributary_net::announce(format_args!(
                            "published window={w} checkpoint={id} groups={} rollouts={}",
                            r.groups, r.rollouts
                        ));
                    }
                    let _ = stop.run_until_cancelled(tokio::time::sleep(self.cfg.poll)).await;
                }
                Err(ServiceError::Client(e)) if e.is_transient() => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "coordinator unreachable or refusing: reconnecting");
                    connected = false;
                    let _ = stop.run_until_cancelled(tokio::time::sleep(backoff)).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A new session with the coordinator, then what it did not confirm
    /// (the last publication, the last step report) sent again.
    async fn reconnect(&mut self) -> Result<(), ServiceError> {
        self.client.disconnect();
        self.client.session().await?;
        tracing::info!("reconnected to the coordinator");
        self.reupload().await
    }
}

/// What a round has picked so far: the selection, the proof's rejections
/// (already recorded and posted), the groups it refused as incomplete, and
/// the digests it proved of miners with no failure yet, by (window, miner).
#[derive(Default)]
struct Pick {
    sel: Selection,
    rejected: Vec<RejectRecord>,
    incomplete: Vec<RejectRecord>,
    proven: BTreeMap<(WindowId, PublicKey), Vec<[u8; 32]>>,
}

impl Pick {
    /// Rollouts held for training.
    fn held(&self) -> usize {
        self.sel.kept.iter().map(|g| g.rollouts.len()).sum()
    }
}

/// The groups of a [`Pending`] file at `path` if it was written for
/// `next_window` (what `service.json` says); none if there is no file or it
/// was written for another window: before a crash that kept `service.json`
/// behind (its windows are taken again), or before a step that took them.
fn read_pending(path: &Path, next_window: WindowId) -> Result<Vec<TrainGroup>, ServiceError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let p: Pending = postcard::from_bytes(&bytes).map_err(ServiceError::Pending)?;
    Ok(if p.next_window == next_window { p.groups } else { Vec::new() })
}

/// Rollouts held in groups.
fn held(groups: &HashMap<GroupKey, TrainGroup>) -> usize {
    groups.values().map(|g| g.rollouts.len()).sum()
}

/// Rollouts by group.
fn by_group(rollouts: Vec<Rollout>) -> BTreeMap<GroupKey, Vec<Rollout>> {
    let mut out: BTreeMap<GroupKey, Vec<Rollout>> = BTreeMap::new();
    for r in rollouts {
        out.entry(GroupKey::of(&r)).or_default().push(r);
    }
    out
}

/// The first wait before reconnecting to the coordinator.
const RECONNECT_MIN: Duration = Duration::from_millis(250);

/// The longest wait between reconnection attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// Removes all but the `keep` files of `dir` with the highest window number
/// (files are named `<window>.<ext>`).
fn prune(dir: &Path, keep: usize) -> Result<(), ServiceError> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let p = e.path();
            let w = p.file_stem()?.to_str()?.parse::<u64>().ok()?;
            Some((w, p))
        })
        .collect();
    if files.len() <= keep {
        return Ok(());
    }
    files.sort();
    for (_, p) in &files[..files.len() - keep] {
        std::fs::remove_file(p)?;
    }
    Ok(())
}

/// The batch records in a trainer folder (`batches/*.json`), oldest first.
pub fn batch_records(dir: &Path) -> Result<Vec<BatchRecord>, ServiceError> {
    let mut out = Vec::new();
    let d = dir.join("batches");
    if !d.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(d)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "json") {
            out.push(serde_json::from_slice::<BatchRecord>(&std::fs::read(&p)?)?);
        }
    }
    out.sort_by_key(|r| r.window);
    Ok(out)
}

/// The proof rejections recorded in a trainer folder (`rejected/*.jsonl`), by window.
pub fn rejected_records(dir: &Path) -> Result<Vec<RejectRecord>, ServiceError> {
    let mut out = Vec::new();
    let d = dir.join("rejected");
    if !d.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(d)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            for line in std::fs::read_to_string(&p)?.lines().filter(|l| !l.trim().is_empty()) {
                out.push(serde_json::from_str::<RejectRecord>(line)?);
            }
        }
    }
    out.sort_by_key(|r| (r.window, r.group, r.rollout));
    Ok(out)
}

pub use tributary_net::serve_metrics;

/// The `--dev` trainer folder's genesis file: the dev tiny model
/// ([`tributary_protocol::dev::ensure_genesis`]), written once.
pub fn dev_genesis(dir: &Path) -> Result<PathBuf, ServiceError> {
    Ok(tributary_protocol::dev::ensure_genesis(dir, &tributary_assets::smollm2_q4_1())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::env::EnvId;
    use tributary_protocol::rollout::SamplingParams;

    fn group(window: u64) -> TrainGroup {
        let rollouts: Vec<Rollout> = (0..2)
            .map(|i| Rollout {
                window,
                checkpoint: ContentId([7; 32]),
                env: EnvId::Arith,
                group: 0,
                rollout: i,
                task_id: 9,
                sampling: SamplingParams { temperature: 0.7, max_new_tokens: 8 },
                tokens: vec![1, 2, 3, 4],
                prompt_len: 2,
                logprobs: vec![-0.5, -0.25],
                sketches: vec![0; 4],
                reward: i as f32,
                miner: [3; 32],
                signature: [0; 64],
            })
            .collect();
        TrainGroup {
            key: GroupKey::of(&rollouts[0]),
            old_logprobs: rollouts.iter().map(|r| r.logprobs.clone()).collect(),
            advantages: vec![-1.0, 1.0],
            score: 0.5,
            rollouts,
        }
    }

    /// The kept groups are read back only for the window `service.json`
    /// names: a crash between writing them and advancing `service.json`
    /// takes their windows again instead of training them twice.
    #[test]
    fn kept_groups_are_read_back_only_for_the_window_they_were_written_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.postcard");
        assert!(read_pending(&path, 5).unwrap().is_empty(), "no file: nothing kept");
        let groups = vec![group(3), group(4)];
        let p = Pending { next_window: 5, groups: groups.clone() };
        write_atomic(&path, &postcard::to_stdvec(&p).unwrap()).unwrap();
        assert_eq!(read_pending(&path, 5).unwrap(), groups, "written for window 5, read at 5");
        assert!(read_pending(&path, 3).unwrap().is_empty(), "service.json behind: the windows are taken again");
        assert!(read_pending(&path, 6).unwrap().is_empty(), "a step took them");
        std::fs::write(&path, [0xff; 3]).unwrap();
        assert!(matches!(read_pending(&path, 5), Err(ServiceError::Pending(_))), "a damaged file is an error");
    }
}
