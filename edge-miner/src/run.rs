//! `edge-miner run`: mine against a coordinator.
//!
//! Three parts, joined by bounded channels:
//! - the **generator**, a blocking thread that owns the llama.cpp model: it
//!   takes a job (a window and the groups still to do), generates one group at
//!   a time and hands each group's signed rollouts back; between groups (the
//!   batch boundary) it swaps in a staged model when the window needs it;
//! - the **uplink** loop (tokio): learns the window, asks the coordinator which
//!   slots are already stored, sends the generator the rest, and streams each
//!   group as it is done ([`crate::uplink`]);
//! - the **sync** task (tokio, its own connection): fetches, verifies and
//!   stages the next checkpoint while generation continues ([`crate::sync`]).
//!
//! A rollout always carries the content id of the model that generated it,
//! and the generator only runs a window whose checkpoint is the one loaded:
//! when the window needs a checkpoint the miner lacks, nothing is generated
//! until the sync has it.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tributary_net::now_ms;
use tributary_net::shutdown::CancellationToken;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::{EnvSpec, Environment, completion_reward, task_seed};
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::WindowInfo;

use crate::backend::{BackendError, DrawKey, GeneratedSeq, GroupRequest};
use crate::llama::{LlamaConfig, LlamaCppBackend};
use crate::sync::{self, LoadedBackend, Loader, Models, Retired, SyncConfig, SyncError, SyncEvent};
use crate::uplink::{Uplink, UplinkConfig, UplinkError};

/// A hook over each group's rollouts before they are signed: the seam for
/// adversarial miners (`--attack`, feature `adversary`). Honest miners have none.
pub trait Tamper: Send {
    /// May change the group's rollouts in any way; they are signed afterwards.
    fn tamper(&mut self, info: &WindowInfo, group: &mut Vec<Rollout>);

    /// May change the signed rollouts (signature attacks); nothing by default.
    fn after_sign(&mut self, _info: &WindowInfo, _group: &mut Vec<Rollout>) {}
}

/// Errors that stop the miner.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The coordinator refused us or is gone.
    #[error("uplink: {0}")]
    Uplink(#[from] UplinkError),
    /// The models folder is unusable.
    #[error("models: {0}")]
    Sync(#[from] SyncError),
    /// Generation failed.
    #[error("generation: {0}")]
    Generate(String),
    /// A bad setting.
    #[error("configuration: {0}")]
    Config(String),
}

/// Everything `run` needs.
pub struct RunConfig {
    /// Where the coordinator is.
    pub uplink: UplinkConfig,
    /// The miner's key.
    pub key: Keypair,
    /// The models folder (two slot files, downloads).
    pub models_dir: PathBuf,
    /// A model to start from (else the slots, else a download from the relay).
    pub model: Option<PathBuf>,
    /// Loads a model file.
    pub loader: Loader,
    /// GSM8K JSONL (needed when the coordinator's environment is gsm8k; it
    /// must be the file whose blake3 the window names).
    pub gsm8k: Option<PathBuf>,
    /// How often to ask for the window when idle.
    pub poll: Duration,
    /// How often the sync asks for a newer checkpoint.
    pub sync_poll: Duration,
    /// Progress bar for full downloads.
    pub progress: bool,
    /// Optional rollout hook (adversarial miners only).
    pub tamper: Option<Box<dyn Tamper>>,
    /// Mine at most this many of the window's assigned groups (the first
    /// ones), for a miner with less capacity; `None`: all of them.
    pub max_groups: Option<u32>,
}

impl std::fmt::Debug for RunConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunConfig")
            .field("uplink", &self.uplink)
            .field("miner", &self.key.public())
            .field("models_dir", &self.models_dir)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl RunConfig {
    /// Defaults: llama.cpp on `threads` CPU threads, polls of 500 ms (window)
    /// and 1 s (checkpoints). The generation contract (environment,
    /// difficulty, temperature, `max_new_tokens`) comes from each window's
    /// [`WindowInfo`], never from the miner's configuration.
    pub fn new(uplink: UplinkConfig, key: Keypair, models_dir: PathBuf, threads: usize) -> Self {
        Self {
            uplink,
            key,
            models_dir,
            model: None,
            loader: llama_loader(threads, 0),
            gsm8k: None,
            poll: Duration::from_millis(500),
            sync_poll: Duration::from_secs(1),
            progress: false,
            tamper: None,
            max_groups: None,
        }
    }
}

/// A [`Loader`] for llama.cpp.
pub fn llama_loader(threads: usize, gpu_layers: u32) -> Loader {
    Arc::new(move |path| {
        let b = LlamaCppBackend::load(&LlamaConfig { model: path.to_owned(), threads, gpu_layers })?;
        Ok(Box::new(b) as LoadedBackend)
    })
}

/// What the miner reports as it goes.
#[derive(Debug, Clone)]
pub enum RunEvent {
    /// A group was submitted.
    Submitted {
        /// Its window.
        window: WindowId,
        /// The checkpoint that generated it.
        checkpoint: ContentId,
        /// Rollouts stored (acknowledged).
        stored: usize,
        /// Rollouts refused, with the reasons.
        refused: Vec<tributary_protocol::wire::RejectReason>,
    },
    /// A staged model was swapped in at a batch boundary (sent once the
    /// first group on it is generated).
    Swapped {
        /// Its content id.
        id: ContentId,
        /// How long generation stopped: from the end of the last group on the
        /// old model (its last token) to the first group on the new model
        /// starting to decode. Includes handing the last group over, any wait
        /// for the window that uses the new model or for the model itself
        /// (when it was not staged in time), and the swap.
        pause: Duration,
        /// The swap's own part of `pause`: from the batch boundary at which the
        /// generator found the staged model to the first group on it starting.
        swap: Duration,
        /// When generation on the new model started.
        at: Instant,
        /// How long the first group on the new model took to generate (a
        /// cold model would show here, not in `pause`).
        first_group: Duration,
        /// How long the last group on the old model took, for comparison.
        prev_group: Option<Duration>,
    },
    /// A window's groups are all stored.
    WindowDone {
        /// The window.
        window: WindowId,
    },
    /// Something from the sync task.
    Sync(SyncEvent),
}

/// Figures of a run.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Windows whose every group is stored.
    pub windows: u64,
    /// Rollouts acknowledged.
    pub stored: u64,
    /// Rollouts refused.
    pub refused: u64,
}

enum GenOut {
    /// A group and how long generating it took.
    Group(Vec<Rollout>, Duration),
    NeedModel,
    Failed(String),
    Done,
}

struct Job {
    info: WindowInfo,
    groups: Vec<u32>,
    /// Cancelled when the window closes, the miner stops or a submission
    /// fails: the generator ends the job after the group in progress.
    cancel: CancellationToken,
    out: mpsc::Sender<GenOut>,
}

/// The blocking side: owns the running model.
struct Generator {
    models: Arc<Models>,
    loader: Loader,
    current: Option<(ContentId, LoadedBackend)>,
    tokenizer: Option<Tokenizer>,
    key: Keypair,
    gsm8k: Option<PathBuf>,
    /// The last environment built, and the settings it was built from.
    env: Option<(EnvSpec, Environment)>,
    tamper: Option<Box<dyn Tamper>>,
    events: Option<mpsc::UnboundedSender<RunEvent>>,
    /// Duration of the last group generated.
    last_group: Option<Duration>,
    /// When the last group generated ended.
    last_end: Option<Instant>,
    /// A swap whose first group on the new model is not generated yet.
    swap: Option<PendingSwap>,
}

/// A swap being timed until the new model's first group.
struct PendingSwap {
    id: ContentId,
    began: Instant,
    prev_end: Option<Instant>,
    prev_group: Option<Duration>,
}

impl Generator {
    /// Makes `id` the running model if it is active or staged; `false` if the miner lacks it.
    fn ensure_model(&mut self, id: ContentId) -> Result<bool, RunError> {
        if self.current.as_ref().is_some_and(|(c, _)| *c == id) {
            return Ok(true);
        }
        let t0 = Instant::now();
        let mut st = self.models.state();
        if st.staged.as_ref().is_some_and(|s| s.id == id) {
            if let Some(staged) = st.staged.take() {
                // The old model goes back to the sync task, which drops it off
                // this thread before its slot can be written again.
                let old_slot = st.active;
                st.active = Some(staged.slot);
                st.need = None;
                if let Some((_, backend)) = self.current.replace((staged.id, staged.backend)) {
                    st.retired.push(Retired { slot: old_slot, backend });
                }
            }
            drop(st);
            self.models.wake.notify_one();
            self.swap = Some(PendingSwap { id, began: t0, prev_end: self.last_end, prev_group: self.last_group });
            return Ok(true);
        }
        if self.current.is_none() && st.active_id() == Some(id) {
            let slot = st.active.unwrap_or(0);
            drop(st);
            let b = (self.loader)(&self.models.slot_path(slot)).map_err(|e| RunError::Generate(e.to_string()))?;
            self.current = Some((id, b));
            return Ok(true);
        }
        st.need = Some(id);
        drop(st);
        self.models.wake.notify_one();
        Ok(false)
    }

    /// The window's environment ([`Environment::for_window`]), built once per
    /// distinct setting (a GSM8K file is read and hashed once, not per job).
    fn environment(&mut self, info: &WindowInfo) -> Result<Environment, RunError> {
        let spec = info.env_spec();
        if let Some((have, env)) = &self.env
            && *have == spec
        {
            return Ok(env.clone());
        }
        let env = Environment::for_window(info, self.gsm8k.as_deref()).map_err(|e| RunError::Config(e.to_string()))?;
        self.env = Some((spec, env.clone()));
        Ok(env)
    }

    fn run_job(&mut self, job: &Job) -> GenOut {
        // A swap left untimed by a failed job is not reported with a stale start.
        self.swap = None;
        let env = match self.environment(&job.info) {
            Ok(e) => e,
            Err(e) => return GenOut::Failed(e.to_string()),
        };
        for &g in &job.groups {
            if job.cancel.is_cancelled() {
                break;
            }
            match self.ensure_model(job.info.checkpoint) {
                Ok(true) => {}
                Ok(false) => return GenOut::NeedModel,
                Err(e) => return GenOut::Failed(e.to_string()),
            }
            match self.group(&job.info, &env, g) {
                Ok(rs) => {
                    let took = self.last_group.unwrap_or_default();
                    if job.out.blocking_send(GenOut::Group(rs, took)).is_err() {
                        return GenOut::Done;
                    }
                }
                Err(e) => return GenOut::Failed(e.to_string()),
            }
        }
        GenOut::Done
    }

    fn group(&mut self, info: &WindowInfo, env: &Environment, group: u32) -> Result<Vec<Rollout>, RunError> {
        let gen_err = |e: BackendError| RunError::Generate(e.to_string());
        if self.tokenizer.is_none() {
            let slot = self.models.state().active.unwrap_or(0);
            let t = Tokenizer::from_gguf_file(&self.models.slot_path(slot))
                .map_err(|e| RunError::Generate(e.to_string()))?;
            self.tokenizer = Some(t);
        }
        let (Some(tok), Some((checkpoint, backend))) = (&self.tokenizer, &mut self.current) else {
            return Err(RunError::Generate("no model loaded".into()));
        };
        let miner = *self.key.public().as_bytes();
        let task = env.task(task_seed(&info.seed, &miner, group));
        let prompt = tok.encode(&env.prompt_text(&task)).map_err(|e| RunError::Generate(e.to_string()))?;
        let key = SketchKey::derive(&info.seed, backend.hidden_size());
        let eog: Vec<u32> = tok.eog_ids().collect();
        let req = GroupRequest {
            prompt: &prompt,
            group_size: info.group_size as usize,
            max_new_tokens: info.sampling.max_new_tokens as usize,
            temperature: info.sampling.temperature,
            draw: DrawKey { sampling_seed: info.seed, miner, group },
            sketch_key: &key,
            sketch_params: SketchParams::DEFAULT,
            eog: &eog,
        };
        let started = Instant::now();
        let seqs = backend.generate_group(&req).map_err(gen_err)?;
        let ended = Instant::now();
        let took = ended.duration_since(started);
        self.last_group = Some(took);
        self.last_end = Some(ended);
        if let Some(s) = self.swap.take() {
            let swap = started.duration_since(s.began);
            let pause = started.duration_since(s.prev_end.unwrap_or(s.began));
            tracing::info!(
                id = %s.id,
                idle_before = %human(pause),
                swap = %human(swap),
                first_group = %human(took),
                "swapped to the new checkpoint"
            );
            if let Some(tx) = &self.events {
                let first_group = took;
                let _ = tx.send(RunEvent::Swapped {
                    id: s.id,
                    pause,
                    swap,
                    at: started,
                    first_group,
                    prev_group: s.prev_group,
                });
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        for (i, GeneratedSeq { completion, logprobs, sketches }) in seqs.into_iter().enumerate() {
            let reward =
                completion_reward(tok, env, &task, &completion).map_err(|e| RunError::Generate(e.to_string()))?;
            let mut tokens = prompt.clone();
            tokens.extend_from_slice(&completion);
            out.push(Rollout {
                window: info.window,
                checkpoint: *checkpoint,
                env: task.env,
                group,
                rollout: i as u32,
                task_id: task.id,
                sampling: info.sampling,
                tokens,
                prompt_len: prompt.len() as u32,
                logprobs,
                sketches,
                reward,
                miner,
                signature: [0; 64],
            });
        }
        if let Some(t) = &mut self.tamper {
            t.tamper(info, &mut out);
        }
        for r in &mut out {
            r.sign(&self.key);
        }
        if let Some(t) = &mut self.tamper {
            t.after_sign(info, &mut out);
        }
        Ok(out)
    }
}

/// How long a stopping miner still tries to submit the group it finished
/// (the coordinator answers in milliseconds when it is up; while it is down
/// the uplink would retry for minutes).
pub const STOP_SUBMIT_GRACE: Duration = Duration::from_secs(10);

/// Mines until `stop` is cancelled (or a fatal error). A stop waits for the
/// group being generated, submits it (within [`STOP_SUBMIT_GRACE`]) and
/// returns; a wait, or a request for the window or its progress (also one
/// waiting to reconnect), ends at once.
pub async fn run(
    cfg: RunConfig,
    stop: CancellationToken,
    events: Option<mpsc::UnboundedSender<RunEvent>>,
) -> Result<RunSummary, RunError> {
    let models = Models::open(&cfg.models_dir)?;
    match &cfg.model {
        Some(m) => {
            let id = models.install_active(m)?;
            tracing::info!(%id, "starting from {}", m.display());
        }
        None => {
            let first = models.state().ids.iter().flatten().next().copied();
            if let Some(id) = first {
                models.activate(id);
            }
        }
    }
    // The sync task, on its own connection.
    let (sync_tx, mut sync_rx) = mpsc::unbounded_channel();
    let sync_cfg = SyncConfig { poll: cfg.sync_poll, attempts: 3, progress: cfg.progress, loader: cfg.loader.clone() };
    let sync_task = tokio::spawn(sync::run_sync(
        Uplink::new(cfg.uplink.clone(), cfg.key.clone()),
        models.clone(),
        sync_cfg,
        Some(sync_tx),
        stop.clone(),
    ));
    if let Some(ev) = events.clone() {
        tokio::spawn(async move {
            while let Some(e) = sync_rx.recv().await {
                let _ = ev.send(RunEvent::Sync(e));
            }
        });
    }
    // The generator thread.
    let (job_tx, job_rx) = std::sync::mpsc::sync_channel::<Job>(1);
    let mut generator = Generator {
        models: models.clone(),
        loader: cfg.loader.clone(),
        current: None,
        tokenizer: None,
        key: cfg.key.clone(),
        gsm8k: cfg.gsm8k.clone(),
        env: None,
        tamper: cfg.tamper,
        events: events.clone(),
        last_group: None,
        last_end: None,
        swap: None,
    };
    let gen_thread = std::thread::Builder::new()
        .name("generator".into())
        .spawn(move || {
            while let Ok(job) = job_rx.recv() {
                let end = generator.run_job(&job);
                let _ = job.out.blocking_send(end);
            }
        })
        .map_err(|e| RunError::Generate(e.to_string()))?;

    let mut uplink = Uplink::new(cfg.uplink.clone(), cfg.key.clone());
    let mut summary = RunSummary::default();
    let mut finished: HashSet<WindowId> = HashSet::new();
    let emit = |e: RunEvent| {
        if let Some(tx) = &events {
            let _ = tx.send(e);
        }
    };
    let result = loop {
        if stop.is_cancelled() {
            break Ok(());
        }
        // Asking is no work in progress: a stop ends it, also while the
        // uplink waits to reconnect to a coordinator that is down.
        let info = match until_stopped(&stop, uplink.window()).await {
            None => break Ok(()),
            Some(Ok(i)) => i,
            Some(Err(UplinkError::NoWindow)) => {
                idle(&stop, cfg.poll).await;
                continue;
            }
            Some(Err(e)) => break Err(e.into()),
        };
        if finished.contains(&info.window) || now_ms() >= info.closes_at_ms {
            idle(&stop, cfg.poll).await;
            continue;
        }
        let stored = match until_stopped(&stop, uplink.progress(info.window)).await {
            None => break Ok(()),
            Some(Ok(s)) => s,
            Some(Err(e)) => break Err(e.into()),
        };
        let groups: Vec<u32> = (0..cfg.max_groups.map_or(info.groups_per_miner, |m| m.min(info.groups_per_miner)))
            .filter(|g| (0..info.group_size).any(|i| !stored.contains(&(*g, i))))
            .collect();
        if groups.is_empty() {
            finished.insert(info.window);
            summary.windows += 1;
            emit(RunEvent::WindowDone { window: info.window });
            continue;
        }
        let (out_tx, mut out_rx) = mpsc::channel(2);
        // A child of `stop`: cancelled with it, or alone at the window's close.
        let cancel = stop.child_token();
        if job_tx.send(Job { info: info.clone(), groups, cancel: cancel.clone(), out: out_tx }).is_err() {
            break Err(RunError::Generate("generator thread ended".into()));
        }
        let closes = Duration::from_millis(info.closes_at_ms.saturating_sub(now_ms()));
        let deadline = tokio::time::Instant::now() + closes;
        let mut fatal = None;
        let mut need_model = false;
        // Set once a stopping miner gave up on a submission: the groups
        // still queued are not tried.
        let mut abandon = false;
        let mut tally = WindowTally::default();
        loop {
            let out = tokio::select! {
                o = out_rx.recv() => o,
                _ = tokio::time::sleep_until(deadline) => { cancel.cancel(); out_rx.recv().await }
                _ = cancel.cancelled() => out_rx.recv().await,
            };
            match out {
                Some(GenOut::Group(rs, took)) => {
                    tally.groups += 1;
                    tally.rollouts += rs.len();
                    tally.tokens += rs.iter().map(|r| r.completion().len()).sum::<usize>();
                    tally.generating += took;
                    metrics::counter!("tributary_miner_rollouts_generated_total").increment(rs.len() as u64);
                    metrics::counter!("tributary_miner_completion_tokens_total")
                        .increment(rs.iter().map(|r| r.completion().len() as u64).sum());
                    metrics::histogram!("tributary_miner_group_seconds").record(took.as_secs_f64());
                    let checkpoint = rs.first().map(|r| r.checkpoint).unwrap_or(info.checkpoint);
                    // The group in progress is submitted after a stop, given
                    // STOP_SUBMIT_GRACE when the coordinator does not answer.
                    let submitted = if abandon {
                        None
                    } else {
                        tokio::select! {
                            r = uplink.submit(&rs) => Some(r),
                            _ = async {
                                stop.cancelled().await;
                                tokio::time::sleep(STOP_SUBMIT_GRACE).await;
                            } => None,
                        }
                    };
                    match submitted {
                        None => {
                            abandon = true;
                            tracing::warn!(
                                window = info.window,
                                rollouts = rs.len(),
                                "stopping: the coordinator did not answer; group abandoned"
                            );
                        }
                        Some(Ok(rep)) => {
                            summary.stored += rep.stored.len() as u64;
                            summary.refused += rep.refused.len() as u64;
                            tally.accepted += rep.stored.len();
                            tally.refused += rep.refused.len();
                            metrics::counter!("tributary_miner_rollouts_accepted_total")
                                .increment(rep.stored.len() as u64);
                            metrics::counter!("tributary_miner_rollouts_refused_total")
                                .increment(rep.refused.len() as u64);
                            if !rep.refused.is_empty() {
                                tracing::warn!(refused = ?rep.refused, "rollouts refused");
                            }
                            let refused = rep.refused.iter().map(|(_, r)| *r).collect();
                            emit(RunEvent::Submitted {
                                window: info.window,
                                checkpoint,
                                stored: rep.stored.len(),
                                refused,
                            });
                        }
                        Some(Err(e)) => {
                            cancel.cancel();
                            fatal.get_or_insert(RunError::from(e));
                        }
                    }
                }
                Some(GenOut::NeedModel) => need_model = true,
                Some(GenOut::Failed(e)) => {
                    fatal.get_or_insert(RunError::Generate(e));
                }
                Some(GenOut::Done) | None => break,
            }
        }
        if tally.groups > 0 {
            tally.log(info.window);
            metrics::counter!("tributary_miner_windows_total").increment(1);
        }
        if let Some(e) = fatal {
            break Err(e);
        }
        if need_model {
            idle(&stop, cfg.poll).await;
        }
    };
    drop(job_tx);
    sync_task.abort();
    let _ = tokio::task::spawn_blocking(move || gen_thread.join()).await;
    result.map(|()| summary)
}

/// What one window's job generated and the coordinator made of it: the
/// miner's one INFO line per window.
#[derive(Default)]
struct WindowTally {
    groups: usize,
    rollouts: usize,
    tokens: usize,
    accepted: usize,
    refused: usize,
    /// Time spent generating (the groups' own times, not the waits between).
    generating: Duration,
}

impl WindowTally {
    fn log(&self, window: WindowId) {
        let secs = self.generating.as_secs_f64();
        let tok_s = if secs > 0.0 { self.tokens as f64 / secs } else { 0.0 };
        tracing::info!(
            window,
            groups = self.groups,
            generated = self.rollouts,
            accepted = self.accepted,
            refused = self.refused,
            completion_tokens = self.tokens,
            tok_s = %format!("{tok_s:.1}"),
            generating = %human(self.generating),
            "window mined"
        );
    }
}

/// A duration for a log line, to the millisecond: `1m 23s 958ms`.
fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// `fut`'s output, or `None` once `stop` is cancelled first.
async fn until_stopped<T>(stop: &CancellationToken, fut: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::select! {
        r = fut => Some(r),
        _ = stop.cancelled() => None,
    }
}

async fn idle(stop: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.cancelled() => {}
    }
}
