//! Checkpoint sync: fetch, verify and prepare the next model while generation
//! continues on the current one.
//!
//! The miner keeps two model files, `slot-0.gguf` and `slot-1.gguf`, in its
//! models folder. One is *active* (llama.cpp runs it); the other is free or
//! *staged* (verified, loaded, waiting to be swapped in at a batch boundary).
//! A new checkpoint is prepared in the free slot:
//!
//! - by **deltas**: the free slot is first brought to the active checkpoint
//!   (replaying the deltas that last moved the other slot, in place; a full
//!   copy only as a last resort), then each delta of the path is applied in
//!   place through a memory map ([`delta::apply_in_place`] checks the base
//!   and result content ids and restores the bytes on a mismatch);
//! - by a **full download**: resumable (`download.part` and `download.id`),
//!   checked against the payload hash and the content id, then renamed onto
//!   the slot.
//!
//! A payload that fails any check is refused: the sync retries, and falls
//! back from deltas to a full download. Nothing unverified is ever loaded.
//!
//! When the coordinator names an object store's public URL for the path
//! ([`CheckpointPath::store_url`]), each payload is first downloaded from
//! there over HTTP(S) ([`crate::store_http`]) and checked exactly as a
//! relayed one; any failure (unreachable, missing, wrong bytes, a stall)
//! fetches that payload from the relay instead.
//!
//! Everything slow about a new model happens here, off the generation
//! thread: the loader's work (for llama.cpp, mapping the file, after
//! widening BF16 to F32 when layers are offloaded to a GPU) and a warm-up
//! decode that faults in every weight page and runs the first graph
//! allocation. The generator's swap is a pointer
//! exchange; it hands the old model back ([`SlotState::retired`]) and this
//! task drops it on a blocking thread before the old slot is written again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tributary_net::ClientError;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta::{self, DeltaError, DeltaLimits};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    CheckpointPath, Frame, GetCheckpoint, GetCheckpointPath, GetDelta, NetworkId, PathStep,
};

use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};

use crate::backend::{Backend, BackendError, DrawKey, GroupRequest};
use crate::store_http::{StoreClient, Timeouts};
use crate::uplink::{Uplink, UplinkError};

/// Number of model files a miner keeps.
pub const SLOTS: usize = 2;

/// Largest delta payload a miner accepts (deltas are small; a bigger one is refused).
pub const MAX_DELTA_LEN: u64 = 1 << 30;

/// A loaded model, ready to generate.
pub type LoadedBackend = Box<dyn Backend + Send>;

/// Loads a model file into a backend (llama.cpp by default; a seam for other engines).
pub type Loader = Arc<dyn Fn(&Path) -> Result<LoadedBackend, BackendError> + Send + Sync>;

/// Sync failures.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// File I/O.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The coordinator could not be reached or refused.
    #[error("uplink: {0}")]
    Uplink(#[from] UplinkError),
    /// A payload failed a check (length, hash, content id).
    #[error("payload refused: {0}")]
    BadPayload(String),
    /// A delta failed to decode or apply.
    #[error("delta refused: {0}")]
    Delta(#[from] DeltaError),
    /// The model did not load.
    #[error("loading the model: {0}")]
    Load(#[from] BackendError),
    /// No slot is free (both hold live models).
    #[error("no free model slot")]
    NoFreeSlot,
    /// The checkpoint's announcement is not the trainer's.
    #[error("checkpoint announcement refused: {0}")]
    Announcement(String),
}

/// The file (in the models folder) holding the trainer key this miner
/// trusts: pinned from the first signed announcement it sees.
pub const TRAINER_PIN_FILE: &str = "trainer.pub";

/// Checks the trainer's signed announcement of a path's target before
/// anything is downloaded: its signature, that it names the target, that
/// its signer is the trainer this miner pinned (the first one it saw, kept
/// in [`TRAINER_PIN_FILE`]), and that every step delivering the announced
/// payload carries the announced hash. A path without an announcement is
/// refused, the genesis checkpoint's too: its trainer announces it once (a
/// `--dev` coordinator signs it with the public dev trainer key).
pub fn check_announcement(dir: &Path, network: &NetworkId, path: &CheckpointPath) -> Result<(), SyncError> {
    let refuse = |m: String| Err(SyncError::Announcement(m));
    let Some(a) = &path.announcement else {
        return refuse(format!("{} has no trainer announcement (not announced by the trainer yet)", path.target));
    };
    if let Err(e) = a.verify(network) {
        return refuse(format!("trainer announcement of {}: {e}", a.body.id));
    }
    if a.body.id != path.target {
        return refuse(format!("announcement names {}, path ends at {}", a.body.id, path.target));
    }
    let pin = dir.join(TRAINER_PIN_FILE);
    match std::fs::read_to_string(&pin) {
        Ok(text) => {
            let pinned: tributary_protocol::identity::PublicKey =
                text.trim().parse().map_err(|e| SyncError::Announcement(format!("{}: {e}", pin.display())))?;
            if pinned != a.body.trainer {
                return refuse(format!("signed by {}, this miner trusts trainer {pinned}", a.body.trainer));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&pin, format!("{}\n", a.body.trainer)).map_err(io(&pin))?;
            tracing::info!(trainer = %a.body.trainer, "trainer key pinned");
        }
        Err(e) => return Err(SyncError::Io { path: pin, source: e }),
    }
    let announced_base = match a.body.kind {
        tributary_protocol::wire::CheckpointKind::Full => None,
        tributary_protocol::wire::CheckpointKind::Delta { base } => Some(base),
    };
    for s in &path.steps {
        if s.id == path.target && s.base == announced_base && s.payload_hash != a.body.payload_hash {
            return refuse(format!("step to {} is not the announced payload", s.id));
        }
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SyncError + '_ {
    move |source| SyncError::Io { path: path.to_owned(), source }
}

/// Content id of a GGUF file (memory-mapped), or `None` if it is not one.
pub fn file_content_id(path: &Path) -> Option<ContentId> {
    tributary_protocol::checkpoint::file_content_id(path).ok()
}

/// A model staged for the next swap.
pub struct Staged {
    /// The slot its file is in.
    pub slot: usize,
    /// Its content id.
    pub id: ContentId,
    /// The first window that uses it.
    pub from_window: WindowId,
    /// The loaded model.
    pub backend: LoadedBackend,
    /// When it became ready.
    pub ready_at: Instant,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("slot", &self.slot)
            .field("id", &self.id)
            .field("from_window", &self.from_window)
            .finish()
    }
}

/// A model the generator swapped out, waiting to be dropped by the sync task
/// (off the generation thread). Its slot is not written before it is dropped.
pub struct Retired {
    /// The slot whose file it ran (or was widened from), if known.
    pub slot: Option<usize>,
    /// The model.
    pub backend: LoadedBackend,
}

impl std::fmt::Debug for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retired").field("slot", &self.slot).finish_non_exhaustive()
    }
}

/// What the slots hold, shared by the sync task and the generator.
#[derive(Debug, Default)]
pub struct SlotState {
    /// Verified content of each slot file (`None`: unknown or being written).
    pub ids: [Option<ContentId>; SLOTS],
    /// The slot the generator runs.
    pub active: Option<usize>,
    /// A loaded model waiting to be swapped in.
    pub staged: Option<Staged>,
    /// The checkpoint the current window needs, when the miner lacks it.
    pub need: Option<ContentId>,
    /// Deltas (base, result, bytes) of the last preparation, to replay onto the other slot.
    pub last_chain: Vec<(ContentId, ContentId, Vec<u8>)>,
    /// Models swapped out and not dropped yet; the sync drops them before it
    /// frees a slot.
    pub retired: Vec<Retired>,
}

impl SlotState {
    /// Content id of the active model.
    pub fn active_id(&self) -> Option<ContentId> {
        self.active.and_then(|s| self.ids[s])
    }
}

/// The models folder and the state shared between sync and generation.
#[derive(Debug)]
pub struct Models {
    dir: PathBuf,
    state: Mutex<SlotState>,
    /// Wakes the sync task (a window needs a checkpoint the miner lacks).
    pub wake: tokio::sync::Notify,
}

impl Models {
    /// Opens the models folder, checking what each slot file holds.
    pub fn open(dir: &Path) -> Result<Arc<Self>, SyncError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut state = SlotState::default();
        for s in 0..SLOTS {
            state.ids[s] = file_content_id(&slot_path(dir, s));
        }
        Ok(Arc::new(Self { dir: dir.to_owned(), state: Mutex::new(state), wake: tokio::sync::Notify::new() }))
    }

    /// Locks the shared state.
    pub fn state(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file of slot `s`.
    pub fn slot_path(&self, s: usize) -> PathBuf {
        slot_path(&self.dir, s)
    }

    /// Installs a model file into a slot (unless one already holds it) and
    /// makes it the active slot. Returns its content id.
    pub fn install_active(&self, model: &Path) -> Result<ContentId, SyncError> {
        let id = file_content_id(model)
            .ok_or_else(|| SyncError::BadPayload(format!("{} is not a GGUF file", model.display())))?;
        let mut st = self.state();
        let slot = match st.ids.iter().position(|i| *i == Some(id)) {
            Some(s) => s,
            None => {
                let s = 0;
                st.ids[s] = None;
                copy_atomic(model, &self.slot_path(s))?;
                st.ids[s] = Some(id);
                s
            }
        };
        st.active = Some(slot);
        Ok(id)
    }

    /// Makes the slot holding `id` active (at startup), if any slot does.
    pub fn activate(&self, id: ContentId) -> bool {
        let mut st = self.state();
        match st.ids.iter().position(|i| *i == Some(id)) {
            Some(s) => {
                st.active = Some(s);
                true
            }
            None => false,
        }
    }
}

fn slot_path(dir: &Path, s: usize) -> PathBuf {
    dir.join(format!("slot-{s}.gguf"))
}

fn copy_atomic(from: &Path, to: &Path) -> Result<(), SyncError> {
    let tmp = to.with_extension("copy.tmp");
    std::fs::copy(from, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, to).map_err(io(to))
}

/// Applies a delta in place to the file `path` through a memory map.
fn apply_to_file(path: &Path, bytes: &[u8]) -> Result<ContentId, SyncError> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let d = delta::decode(bytes, &DeltaLimits::for_base_len(len))?;
    // SAFETY: the slot is free: no backend maps it while the sync writes it.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.map_err(io(path))?;
    delta::apply_in_place(&d, &mut map)?;
    map.flush().map_err(io(path))?;
    Ok(d.result)
}

/// How the sync task behaves.
#[derive(Clone)]
pub struct SyncConfig {
    /// How often to ask for a newer checkpoint.
    pub poll: Duration,
    /// Attempts per checkpoint before waiting for the next poll.
    pub attempts: u32,
    /// Shows a progress bar for full downloads.
    pub progress: bool,
    /// Loads a verified model file.
    pub loader: Loader,
}

impl std::fmt::Debug for SyncConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncConfig").field("poll", &self.poll).field("attempts", &self.attempts).finish_non_exhaustive()
    }
}

/// What the sync reports.
#[derive(Debug, Clone)]
pub enum SyncEvent {
    /// A checkpoint is verified, loaded and staged.
    Staged {
        /// Its content id.
        id: ContentId,
        /// Payload bytes downloaded for it.
        bytes: u64,
        /// Of those, bytes downloaded from the object store over HTTP(S)
        /// (the rest came through the coordinator's relay).
        from_store: u64,
        /// Whether it came as deltas.
        by_delta: bool,
        /// When it was ready.
        at: Instant,
        /// Time spent bringing the free slot to it (download, deltas, checks).
        prepare: Duration,
        /// Time spent loading and warming it up.
        load: Duration,
    },
    /// A payload was refused.
    Refused {
        /// The checkpoint.
        id: ContentId,
        /// Why.
        reason: String,
    },
}

/// Drops models on a blocking thread (unmapping and freeing a model's
/// memory takes long enough to be felt on an async worker).
async fn drop_off_thread(old: Vec<LoadedBackend>) {
    if old.is_empty() {
        return;
    }
    let t0 = Instant::now();
    let n = old.len();
    if let Err(e) = tokio::task::spawn_blocking(move || drop(old)).await {
        tracing::warn!(error = %e, "dropping a swapped-out model");
    }
    tracing::debug!(models = n, secs = t0.elapsed().as_secs_f64(), "swapped-out models dropped");
}

/// Drops the models the generator swapped out.
async fn drop_retired(models: &Models) {
    let old: Vec<LoadedBackend> = models.state().retired.drain(..).map(|r| r.backend).collect();
    drop_off_thread(old).await;
}

/// Runs one tiny group (a one-token prompt, one new token) on a freshly
/// loaded model, so its weight pages are resident and its first decode's
/// one-time work is done before the generator swaps it in.
pub fn warm_up(backend: &mut (dyn Backend + Send)) -> Result<(), BackendError> {
    let seed = Seed([0; 32]);
    let key = SketchKey::derive(&seed, backend.hidden_size());
    let req = GroupRequest {
        prompt: &[0],
        group_size: 1,
        max_new_tokens: 1,
        temperature: 0.0,
        draw: DrawKey { sampling_seed: seed, miner: [0; 32], group: 0 },
        sketch_key: &key,
        sketch_params: SketchParams::DEFAULT,
        eog: &[],
    };
    backend.generate_group(&req).map(drop)
}

/// Loads a verified model file and warms it up (on the calling thread).
fn load_warm(loader: &Loader, file: &Path) -> Result<LoadedBackend, BackendError> {
    let t0 = Instant::now();
    let mut backend = loader(file)?;
    let loaded = t0.elapsed();
    // A model that loads but fails the warm-up is still staged: the warm-up
    // only moves work off the generator.
    if let Err(e) = warm_up(backend.as_mut()) {
        tracing::warn!(error = %e, "warm-up of the staged model failed");
    }
    tracing::debug!(
        load_secs = loaded.as_secs_f64(),
        warm_secs = (t0.elapsed() - loaded).as_secs_f64(),
        "model loaded and warmed"
    );
    Ok(backend)
}

/// The shortest wait after a failed sync round (doubling up to the poll
/// interval while rounds keep failing).
pub const SYNC_RETRY_MIN: Duration = Duration::from_millis(250);

/// The sync task: polls for the latest (or needed) checkpoint and stages it.
/// Runs until `stop` is cancelled. (A token has no sender to drop: the
/// `watch::Receiver` it replaced returned from `changed()` at once, forever,
/// once its sender was gone, and this loop then asked for the checkpoint path
/// thousands of times a second: 3,734 rounds in fault_miner_drop, which the
/// coordinator's request budget refused.)
pub async fn run_sync(
    mut uplink: Uplink,
    models: Arc<Models>,
    cfg: SyncConfig,
    events: Option<tokio::sync::mpsc::UnboundedSender<SyncEvent>>,
    stop: tributary_net::shutdown::CancellationToken,
) {
    let emit = |e: SyncEvent| {
        if let Some(tx) = &events {
            let _ = tx.send(e);
        }
    };
    let mut backoff = Duration::ZERO;
    loop {
        if stop.is_cancelled() {
            return;
        }
        if let Err(e) = sync_once(&mut uplink, &models, &cfg, &emit).await {
            // A failed round waits whatever wakes the task: a generator with
            // no model asks again every few milliseconds, and a coordinator
            // answering RateLimited was asked in a loop (213,456 refused
            // requests in 18 s of fault_miner_drop) that never let its budget
            // refill.
            backoff = (backoff * 2).clamp(SYNC_RETRY_MIN, cfg.poll.max(SYNC_RETRY_MIN));
            tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "checkpoint sync failed; retrying");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.cancelled() => {}
            }
            continue;
        }
        backoff = Duration::ZERO;
        tokio::select! {
            _ = tokio::time::sleep(cfg.poll) => {}
            _ = models.wake.notified() => {}
            _ = stop.cancelled() => {}
        }
    }
}

async fn ask_path(
    uplink: &mut Uplink,
    have: Option<ContentId>,
    want: Option<ContentId>,
) -> Result<CheckpointPath, SyncError> {
    match uplink.request(&Frame::GetCheckpointPath(GetCheckpointPath { have, want })).await? {
        Frame::CheckpointPath(p) => Ok(p),
        f => Err(UplinkError::from(ClientError::Unexpected(f.tag())).into()),
    }
}

/// One round: find the target, prepare it in the free slot, load and stage it.
pub async fn sync_once(
    uplink: &mut Uplink,
    models: &Arc<Models>,
    cfg: &SyncConfig,
    emit: &impl Fn(SyncEvent),
) -> Result<(), SyncError> {
    drop_retired(models).await;
    let (active, staged, need) = {
        let st = models.state();
        (st.active_id(), st.staged.as_ref().map(|s| s.id), st.need)
    };
    let want = need.filter(|n| Some(*n) != active && Some(*n) != staged);
    let path = ask_path(uplink, active, want).await?;
    let target = path.target;
    if Some(target) == active || Some(target) == staged {
        return Ok(());
    }
    let network = uplink.network().await?;
    if let Err(e) = check_announcement(&models.dir, &network, &path) {
        emit(SyncEvent::Refused { id: target, reason: e.to_string() });
        return Err(e);
    }
    // Free a slot: a staged model that is no longer wanted is dropped, and so
    // is a model swapped out since the start of this round, before the slot
    // it ran from can be written (no swap can follow: nothing is staged).
    let old: Vec<LoadedBackend> = {
        let mut st = models.state();
        let staged = st.staged.take().map(|s| s.backend);
        st.retired.drain(..).map(|r| r.backend).chain(staged).collect()
    };
    drop_off_thread(old).await;
    let slot = {
        let st = models.state();
        let active_slot = st.active;
        (0..SLOTS).find(|s| Some(*s) != active_slot).ok_or(SyncError::NoFreeSlot)?
    };
    let started = Instant::now();
    let mut last_err = None;
    let mut prepared = None;
    for attempt in 0..cfg.attempts.max(1) {
        // First attempt: the path as given; later ones: a full download.
        let (steps, store_url) = if attempt == 0 {
            (path.steps.clone(), path.store_url.clone())
        } else {
            let full = ask_path(uplink, None, Some(target)).await?;
            check_announcement(&models.dir, &network, &full)?;
            (full.steps, full.store_url)
        };
        let store = store_url.and_then(|u| match StoreClient::new(&u, Timeouts::default()) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "store url ignored; downloading from the relay");
                None
            }
        });
        match prepare(uplink, models, slot, active, &steps, target, store.as_ref(), cfg.progress).await {
            Ok(got) => {
                prepared = Some((got, steps.iter().all(|s| s.base.is_some()) && !steps.is_empty()));
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, %target, attempt, "checkpoint refused");
                emit(SyncEvent::Refused { id: target, reason: e.to_string() });
                last_err = Some(e);
            }
        }
    }
    let Some(((bytes, from_store), by_delta)) = prepared else {
        return Err(last_err.unwrap_or(SyncError::NoFreeSlot));
    };
    let prepare = started.elapsed();
    let file = models.slot_path(slot);
    let loader = cfg.loader.clone();
    let backend = tokio::task::spawn_blocking(move || load_warm(&loader, &file))
        .await
        .map_err(|e| SyncError::Load(BackendError::Load(e.to_string())))??;
    let at = Instant::now();
    {
        let mut st = models.state();
        st.staged = Some(Staged { slot, id: target, from_window: path.from_window, backend, ready_at: at });
    }
    let load = at.duration_since(started) - prepare;
    tracing::info!(%target, bytes, from_store, by_delta, ?prepare, ?load, "checkpoint staged");
    emit(SyncEvent::Staged { id: target, bytes, from_store, by_delta, at, prepare, load });
    Ok(())
}

/// Brings `slot` to `target` following `steps`, each payload from `store`
/// when there is one and it delivers, else from the relay; returns the
/// payload bytes downloaded and, of those, the bytes from the store.
#[allow(clippy::too_many_arguments)]
async fn prepare(
    uplink: &mut Uplink,
    models: &Arc<Models>,
    slot: usize,
    active: Option<ContentId>,
    steps: &[PathStep],
    target: ContentId,
    store: Option<&StoreClient>,
    progress: bool,
) -> Result<(u64, u64), SyncError> {
    let file = models.slot_path(slot);
    if models.state().ids[slot] == Some(target) {
        return Ok((0, 0));
    }
    let mut bytes = 0u64;
    let mut from_store = 0u64;
    let mut chain = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step.base {
            None => {
                let from_http = match store {
                    Some(c) => match download_full_http(c, models, step, progress).await {
                        Ok(n) => Some(n),
                        Err(e) => {
                            tracing::warn!(error = %e, id = %step.id, "full checkpoint from the store refused; from the relay");
                            None
                        }
                    },
                    None => None,
                };
                match from_http {
                    Some(n) => {
                        bytes += n;
                        from_store += n;
                    }
                    None => bytes += download_full(uplink, models, step, progress).await?,
                }
                let part = models.dir.join("download.part");
                models.state().ids[slot] = None;
                std::fs::rename(&part, &file).map_err(io(&file))?;
                let _ = std::fs::remove_file(models.dir.join("download.id"));
                models.state().ids[slot] = Some(step.id);
                chain.clear();
            }
            Some(base) => {
                if i == 0 {
                    let t0 = Instant::now();
                    bring_to(models, slot, base, active)?;
                    tracing::debug!(secs = t0.elapsed().as_secs_f64(), "free slot brought to the delta base");
                }
                if step.len > MAX_DELTA_LEN {
                    return Err(SyncError::BadPayload(format!("delta of {} bytes", step.len)));
                }
                let payload = match store {
                    Some(c) => match delta_http(c, step, base, progress).await {
                        Ok(p) => {
                            from_store += p.len() as u64;
                            Some(p)
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, id = %step.id, "delta from the store refused; from the relay");
                            None
                        }
                    },
                    None => None,
                };
                let payload = match payload {
                    Some(p) => p,
                    None => {
                        fetch(uplink, step, |offset| Frame::GetDelta(GetDelta { base, id: step.id, offset })).await?
                    }
                };
                bytes += payload.len() as u64;
                check_payload(step, &payload)?;
                let prev = models.state().ids[slot];
                models.state().ids[slot] = None;
                let f = file.clone();
                let p = payload.clone();
                let res = tokio::task::spawn_blocking(move || apply_to_file(&f, &p))
                    .await
                    .map_err(|e| SyncError::BadPayload(e.to_string()))?;
                // On error apply_in_place left (or restored) the base bytes.
                models.state().ids[slot] = if res.is_ok() { Some(step.id) } else { prev };
                res?;
                chain.push((base, step.id, payload));
            }
        }
    }
    if models.state().ids[slot] != Some(target) {
        return Err(SyncError::BadPayload(format!("path did not end at {target}")));
    }
    models.state().last_chain = chain;
    Ok((bytes, from_store))
}

/// A progress bar for a payload of `len` bytes, at `offset`.
fn progress_bar(len: u64, offset: u64, what: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len).with_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bytes}}/{{total_bytes}} [{{bar:30}}] {{bytes_per_sec}}, eta {{eta}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b.set_position(offset);
    b
}

/// Payloads at least this long get a progress bar (when bars are on).
const BAR_BYTES: u64 = 16 << 20;

/// A delta from the store, checked against the step (length, blake3) and its
/// base and result content ids before it is returned.
async fn delta_http(
    store: &StoreClient,
    step: &PathStep,
    base: ContentId,
    progress: bool,
) -> Result<Vec<u8>, SyncError> {
    if step.len > MAX_DELTA_LEN {
        return Err(SyncError::BadPayload(format!("delta of {} bytes", step.len)));
    }
    let (c, s) = (store.clone(), step.clone());
    let bar = (progress && step.len >= BAR_BYTES).then(|| progress_bar(step.len, 0, "delta (store)"));
    let b2 = bar.clone();
    let payload = tokio::task::spawn_blocking(move || c.get_bytes(&s, b2.as_ref()))
        .await
        .map_err(|e| SyncError::BadPayload(e.to_string()))?
        .map_err(|e| SyncError::BadPayload(e.to_string()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    check_payload(step, &payload)?;
    let (b, r) = delta::peek_ids(&payload)?;
    if b != base || r != step.id {
        return Err(SyncError::BadPayload(format!("delta goes {b} -> {r}, the path says {base} -> {}", step.id)));
    }
    Ok(payload)
}

/// Downloads a full checkpoint from the store into `download.part` (the file
/// the relay download resumes), resuming a partial download of the same
/// checkpoint; checks length, hash and content id. Returns the bytes received.
async fn download_full_http(
    store: &StoreClient,
    models: &Models,
    step: &PathStep,
    progress: bool,
) -> Result<u64, SyncError> {
    let (part, offset) = start_part(models, step)?;
    let bar = progress.then(|| progress_bar(step.len, offset, "checkpoint (store)"));
    let (c, s, p, b2) = (store.clone(), step.clone(), part.clone(), bar.clone());
    let got = tokio::task::spawn_blocking(move || c.get_to_file(&s, &p, offset, b2.as_ref()))
        .await
        .map_err(|e| SyncError::BadPayload(e.to_string()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let got = got.map_err(|e| SyncError::BadPayload(e.to_string()))?;
    verify_part(models, step).await?;
    Ok(got)
}

/// The partial download file and the bytes of `step` it already holds (0,
/// and a fresh id file, unless it holds the start of this checkpoint).
fn start_part(models: &Models, step: &PathStep) -> Result<(PathBuf, u64), SyncError> {
    let part = models.dir.join("download.part");
    let idfile = models.dir.join("download.id");
    let resume = std::fs::read_to_string(&idfile).ok().is_some_and(|s| s.trim() == step.id.to_string());
    let mut offset = if resume { std::fs::metadata(&part).map_or(0, |m| m.len()) } else { 0 };
    if offset > step.len {
        offset = 0;
    }
    if offset == 0 {
        std::fs::write(&idfile, step.id.to_string()).map_err(io(&idfile))?;
    }
    Ok((part, offset))
}

/// Checks `download.part` against the step: length, blake3 and content id.
/// A file that fails is deleted (with its id file): the next download starts over.
async fn verify_part(models: &Models, step: &PathStep) -> Result<(), SyncError> {
    let part = models.dir.join("download.part");
    let p = part.clone();
    let (hash, id) = tokio::task::spawn_blocking(move || {
        let hash = std::fs::File::open(&p).and_then(|mut f| {
            let mut h = blake3::Hasher::new();
            let n = std::io::copy(&mut f, &mut h)?;
            Ok((n, *h.finalize().as_bytes()))
        });
        (hash, file_content_id(&p))
    })
    .await
    .map_err(|e| SyncError::BadPayload(e.to_string()))?;
    let (len, hash) = hash.map_err(io(&part))?;
    if len != step.len || hash != step.payload_hash || id != Some(step.id) {
        let _ = std::fs::remove_file(&part);
        let _ = std::fs::remove_file(models.dir.join("download.id"));
        return Err(SyncError::BadPayload("full checkpoint length, hash or content id mismatch".into()));
    }
    Ok(())
}

/// Makes the free `slot` hold `base` (the active checkpoint): replays the
/// last deltas in place when they start from what the slot holds, else copies.
fn bring_to(models: &Models, slot: usize, base: ContentId, active: Option<ContentId>) -> Result<(), SyncError> {
    let (mut have, chain) = {
        let st = models.state();
        (st.ids[slot], st.last_chain.clone())
    };
    let file = models.slot_path(slot);
    for (b, r, bytes) in &chain {
        if have == Some(base) {
            break;
        }
        if have == Some(*b) {
            models.state().ids[slot] = None;
            let res = apply_to_file(&file, bytes);
            have = if res.is_ok() { Some(*r) } else { have };
            models.state().ids[slot] = have;
        }
    }
    if have == Some(base) {
        return Ok(());
    }
    // Last resort: copy the active file (it holds `base`).
    let src = {
        let st = models.state();
        match (st.active, active) {
            (Some(a), Some(id)) if id == base && st.ids[a] == Some(base) => models.slot_path(a),
            _ => return Err(SyncError::BadPayload(format!("no local copy of the delta base {base}"))),
        }
    };
    models.state().ids[slot] = None;
    copy_atomic(&src, &file)?;
    models.state().ids[slot] = Some(base);
    Ok(())
}

fn check_payload(step: &PathStep, payload: &[u8]) -> Result<(), SyncError> {
    if payload.len() as u64 != step.len {
        return Err(SyncError::BadPayload(format!("{} bytes, announced {}", payload.len(), step.len)));
    }
    if blake3::hash(payload).as_bytes() != &step.payload_hash {
        return Err(SyncError::BadPayload("payload hash mismatch".into()));
    }
    Ok(())
}

/// Fetches a payload chunk by chunk into memory (deltas).
async fn fetch(uplink: &mut Uplink, step: &PathStep, ask: impl Fn(u64) -> Frame) -> Result<Vec<u8>, SyncError> {
    let mut out = Vec::new();
    while (out.len() as u64) < step.len {
        let data = chunk(uplink, &ask, step.id, out.len() as u64).await?;
        if out.len() as u64 + data.len() as u64 > step.len {
            return Err(SyncError::BadPayload("delta longer than announced".into()));
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

async fn chunk(
    uplink: &mut Uplink,
    ask: &impl Fn(u64) -> Frame,
    id: ContentId,
    offset: u64,
) -> Result<Vec<u8>, SyncError> {
    match uplink.request(&ask(offset)).await? {
        Frame::CheckpointChunk(c) if c.id == id && c.offset == offset && !c.data.0.is_empty() => Ok(c.data.0),
        Frame::CheckpointChunk(_) => {
            Err(SyncError::BadPayload("chunk out of order, empty or for another checkpoint".into()))
        }
        f => Err(UplinkError::from(ClientError::Unexpected(f.tag())).into()),
    }
}

/// Downloads a full checkpoint into `download.part`, resuming a partial
/// download of the same checkpoint; checks length, hash and content id.
async fn download_full(
    uplink: &mut Uplink,
    models: &Models,
    step: &PathStep,
    progress: bool,
) -> Result<u64, SyncError> {
    use std::io::Write;
    let (part, mut offset) = start_part(models, step)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(offset == 0)
        .append(offset > 0)
        .open(&part)
        .map_err(io(&part))?;
    let bar = progress.then(|| progress_bar(step.len, offset, "checkpoint"));
    let start = offset;
    while offset < step.len {
        let id = step.id;
        let data = chunk(uplink, &|o| Frame::GetCheckpoint(GetCheckpoint { id, offset: o }), step.id, offset).await?;
        if offset + data.len() as u64 > step.len {
            return Err(SyncError::BadPayload("full checkpoint longer than announced".into()));
        }
        f.write_all(&data).map_err(io(&part))?;
        offset += data.len() as u64;
        if let Some(b) = &bar {
            b.set_position(offset);
        }
    }
    f.sync_all().map_err(io(&part))?;
    drop(f);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    verify_part(models, step).await?;
    Ok(step.len - start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::identity::Keypair;
    use tributary_protocol::wire::{CheckpointBody, CheckpointKind, PublishCheckpoint};

    const NET: NetworkId = NetworkId([3; 32]);

    fn path(trainer: &Keypair, id: ContentId, hash: [u8; 32]) -> CheckpointPath {
        let body = CheckpointBody {
            id,
            kind: CheckpointKind::Full,
            len: 10,
            payload_hash: [5; 32],
            window: 3,
            trainer: trainer.public(),
        };
        CheckpointPath {
            target: id,
            from_window: 4,
            steps: vec![PathStep { id, base: None, len: 10, payload_hash: hash }],
            announcement: Some(PublishCheckpoint::sign(body, trainer, &NET)),
            store_url: None,
        }
    }

    /// network-security W4: the coordinator alone cannot name a model. The
    /// first trainer key seen is pinned; a path signed by another key, a
    /// forged signature, an announcement of another checkpoint or a payload
    /// other than the announced one are refused before any download.
    #[test]
    fn announcements_are_the_pinned_trainers() {
        let dir = tempfile::tempdir().unwrap();
        let (trainer, other) = (Keypair::from_seed([1; 32]), Keypair::from_seed([2; 32]));
        let id = ContentId([9; 32]);
        check_announcement(dir.path(), &NET, &path(&trainer, id, [5; 32])).unwrap();
        assert!(dir.path().join(TRAINER_PIN_FILE).is_file());
        check_announcement(dir.path(), &NET, &path(&trainer, id, [5; 32])).unwrap();
        let refused =
            |p: &CheckpointPath| matches!(check_announcement(dir.path(), &NET, p), Err(SyncError::Announcement(_)));
        assert!(refused(&path(&other, id, [5; 32])), "another trainer");
        let mut forged = path(&trainer, id, [5; 32]);
        if let Some(a) = &mut forged.announcement {
            a.body.window += 1;
        }
        assert!(refused(&forged), "forged signature");
        let mut elsewhere = path(&trainer, id, [5; 32]);
        elsewhere.target = ContentId([8; 32]);
        assert!(refused(&elsewhere), "announcement of another checkpoint");
        assert!(refused(&path(&trainer, id, [6; 32])), "not the announced payload");
        // The trainer's announcement on another network (the same trainer key serving both).
        let other_net = NetworkId([4; 32]);
        let p = path(&trainer, id, [5; 32]);
        assert!(matches!(check_announcement(dir.path(), &other_net, &p), Err(SyncError::Announcement(_))));
        // A path without an announcement, the genesis checkpoint's too.
        let genesis = CheckpointPath { target: id, from_window: 0, steps: vec![], announcement: None, store_url: None };
        assert!(refused(&genesis), "an unannounced checkpoint");
    }
}
