//! The checkpoint relay: every published checkpoint kept once on disk (full
//! files as anchors, deltas as the trainer uploaded them) with its metadata
//! in redb, served in chunks to any number of peers from that one copy.
//!
//! Layout of the relay folder:
//!
//! ```text
//! full/<id>.gguf            every checkpoint as a full file (genesis, uploaded
//!                           fulls, and deltas materialised on arrival)
//! delta/<base>-<id>.delta   every delta payload the trainer uploaded
//! incoming/                 uploads in progress
//! ```
//!
//! A peer asks for the path from the checkpoint it holds to the one it wants
//! ([`Relay::path`]): the chain of deltas when one links them (at most
//! [`MAX_PATH_STEPS`] long and smaller than the full file), otherwise the full
//! checkpoint. Every payload is fetched by offset, so downloads resume.
//! Uploads are verified before they are visible: the payload hash, then the
//! content id of the full file (a delta is applied to the base's full file,
//! which checks the base and result ids).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_protocol::checkpoint::{CheckpointError, ContentId, content_id_of};
use tributary_protocol::delta::{self, DeltaError};
use tributary_protocol::gguf;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    CheckpointKind, CheckpointPath, MAX_PATH_STEPS, NetworkId, PathStep, PublishCheckpoint,
};

/// Bytes served per chunk (below [`tributary_protocol::wire::MAX_CHUNK_LEN`]).
pub const CHUNK_LEN: usize = 4 << 20;

/// Bytes a server reads and writes at a time while it sends a chunk
/// ([`ChunkReader`]): what a connection whose peer stops reading holds.
pub const PIECE_LEN: usize = 256 << 10;

/// How long the write of one piece of a chunk may take by default: a peer
/// that reads slower than [`PIECE_LEN`] in this time (13 KiB/s) is
/// disconnected and resumes from what it holds.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(20);

/// Relay failures.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// File I/O.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// No such checkpoint or delta.
    #[error("unknown checkpoint {0}")]
    NotFound(ContentId),
    /// The uploaded payload is not what was announced.
    #[error("payload refused: {0}")]
    BadPayload(String),
    /// The delta does not apply.
    #[error("delta refused: {0}")]
    Delta(#[from] DeltaError),
    /// A different checkpoint was already published for the window.
    #[error("window {window} already has checkpoint {existing}")]
    WindowTaken {
        /// The window.
        window: WindowId,
        /// The checkpoint published for it.
        existing: ContentId,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RelayError + '_ {
    move |source| RelayError::Io { path: path.to_owned(), source }
}

/// Deletes a file if it is there; returns the bytes it held.
fn remove_file(path: &Path) -> Result<u64, RelayError> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(path)(e)),
    };
    match std::fs::remove_file(path) {
        Ok(()) => Ok(len),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io(path)(e)),
    }
}

/// A chunk of a payload open for sending ([`Relay::open_chunk`]): its
/// length is known before its bytes are read, so a server writes the frame
/// header, then the bytes a piece at a time.
#[derive(Debug)]
pub struct ChunkReader {
    file: File,
    path: PathBuf,
    len: usize,
    remaining: usize,
    kind: &'static str,
    served: Arc<AtomicU64>,
}

impl ChunkReader {
    /// The chunk's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chunk is empty (the offset is at or past the end).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// The next up to `max` bytes of the chunk (empty once all are read).
    ///
    /// Blocking (reads a file).
    pub fn read_piece(&mut self, max: usize) -> Result<Vec<u8>, RelayError> {
        let n = self.remaining.min(max);
        let mut buf = vec![0u8; n];
        self.file.read_exact(&mut buf).map_err(io(&self.path))?;
        self.remaining -= n;
        metrics::counter!("tributary_relay_bytes_total", "kind" => self.kind).increment(n as u64);
        self.served.fetch_add(n as u64, Ordering::Relaxed);
        Ok(buf)
    }
}

/// The relay's budget of payload bytes read for answers and not yet handed
/// to QUIC (KiB): one global pool, of which each key may hold at most its
/// share, so that a few keys whose connections stop reading cannot take
/// it all. A permit covers one piece ([`PIECE_LEN`]) and is released once
/// the piece is written, or when the write's deadline passes and the
/// connection is closed.
#[derive(Debug)]
pub struct RelayBudget {
    total: Arc<tokio::sync::Semaphore>,
    total_kib: usize,
    per_key_kib: u32,
    keys: Mutex<HashMap<PublicKey, Arc<tokio::sync::Semaphore>>>,
    write_deadline_ms: AtomicU64,
}

/// A piece's share of the [`RelayBudget`]: the key's and the global, both
/// returned when it drops.
#[derive(Debug)]
pub struct RelayPermit {
    _key: tokio::sync::OwnedSemaphorePermit,
    _total: tokio::sync::OwnedSemaphorePermit,
}

impl RelayBudget {
    /// A budget of `total_mib` MiB (at least two pieces), each key's share
    /// `total_mib / 16` (at least one piece), and `write_deadline` per piece.
    pub fn new(total_mib: u32, write_deadline: Duration) -> Self {
        let piece_kib = PIECE_LEN >> 10;
        let total_kib = (total_mib as usize * 1024).max(2 * piece_kib);
        let per_key_kib = u32::try_from((total_kib / 16).max(piece_kib)).unwrap_or(u32::MAX);
        Self {
            total: Arc::new(tokio::sync::Semaphore::new(total_kib)),
            total_kib,
            per_key_kib,
            keys: Mutex::new(HashMap::new()),
            write_deadline_ms: AtomicU64::new(u64::try_from(write_deadline.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// How long writing one piece may take.
    pub fn write_deadline(&self) -> Duration {
        Duration::from_millis(self.write_deadline_ms.load(Ordering::Relaxed).max(1))
    }

    /// Sets how long writing one piece may take (tests, and operators'
    /// tools, shorten it).
    pub fn set_write_deadline(&self, d: Duration) {
        self.write_deadline_ms.store(u64::try_from(d.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Each key's share, in KiB.
    pub fn per_key_kib(&self) -> u32 {
        self.per_key_kib
    }

    /// KiB held now, in all.
    pub fn inflight_kib(&self) -> usize {
        self.total_kib.saturating_sub(self.total.available_permits())
    }

    /// KiB `key` holds now.
    pub fn key_inflight_kib(&self, key: &PublicKey) -> usize {
        lock(&self.keys).get(key).map_or(0, |s| (self.per_key_kib as usize).saturating_sub(s.available_permits()))
    }

    /// Waits for `kib` of `key`'s share (behind the key's own earlier
    /// requests only), then for as much of the global pool (first come,
    /// first served among keys within their share).
    pub async fn acquire(&self, key: PublicKey, kib: u32) -> RelayPermit {
        let kib = kib.clamp(1, self.per_key_kib);
        let share = lock(&self.keys)
            .entry(key)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_key_kib as usize)))
            .clone();
        // Neither semaphore is ever closed.
        let key_permit = share.acquire_many_owned(kib).await.expect("the relay budget is never closed");
        let total = self.total.clone().acquire_many_owned(kib).await.expect("the relay budget is never closed");
        RelayPermit { _key: key_permit, _total: total }
    }

    /// Forgets the keys that hold and wait for nothing.
    pub fn prune(&self) {
        lock(&self.keys).retain(|_, s| Arc::strong_count(s) > 1);
    }

    /// Keys with a share held or awaited (or not pruned yet).
    pub fn keys(&self) -> usize {
        lock(&self.keys).len()
    }
}

/// What the relay keeps of one checkpoint (its redb metadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Content id.
    pub id: ContentId,
    /// Publication order (0 for genesis).
    pub seq: u64,
    /// The window the trainer published it for.
    pub window: WindowId,
    /// The first window that uses it.
    pub from_window: WindowId,
    /// Bytes of the full file.
    pub full_len: u64,
    /// blake3 of the full file.
    pub full_hash: [u8; 32],
    /// The uploaded delta, if the trainer published one: (base, bytes, blake3).
    pub delta: Option<(ContentId, u64, [u8; 32])>,
}

/// What a peer holds and runs, as the relay last saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PeerCheckpoint {
    /// Checkpoint of the peer's last accepted rollout.
    pub generating: Option<ContentId>,
    /// Checkpoint the peer said it holds when it last asked for a path.
    pub holds: Option<ContentId>,
    /// When the peer was last noted (ms since the epoch).
    #[serde(skip)]
    pub seen_ms: u64,
}

/// Which payload to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// The full file of a checkpoint.
    Full(ContentId),
    /// The delta from `base` to `id`.
    Delta {
        /// Base.
        base: ContentId,
        /// Result.
        id: ContentId,
    },
}

/// What the object store holds of the relay's checkpoints, when one is
/// configured ([`crate::upkeep::store_checkpoints`] writes them).
#[derive(Debug, Default)]
struct StoreView {
    /// The public base URL miners download from, if one is configured.
    url: Option<String>,
    /// Checkpoints whose full file and delta the store holds.
    stored: HashSet<ContentId>,
}

/// The relay.
#[derive(Debug)]
pub struct Relay {
    dir: PathBuf,
    entries: Mutex<BTreeMap<ContentId, Entry>>,
    peers: Mutex<HashMap<PublicKey, PeerCheckpoint>>,
    /// The trainer's signed announcement of each published checkpoint.
    announcements: Mutex<HashMap<ContentId, PublishCheckpoint>>,
    /// `Some` once checkpoints are written to an object store.
    store: Mutex<Option<StoreView>>,
    /// Wakes the task that writes new checkpoints to the store.
    uploads: tokio::sync::Notify,
    /// Payload bytes served to peers ([`Relay::read`]) since the start.
    served: Arc<AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// blake3 of a file, streamed.
pub fn hash_file(path: &Path) -> Result<(u64, [u8; 32]), RelayError> {
    let mut f = File::open(path).map_err(io(path))?;
    let mut h = blake3::Hasher::new();
    let n = std::io::copy(&mut f, &mut h).map_err(io(path))?;
    Ok((n, *h.finalize().as_bytes()))
}

/// Content id of a GGUF file (memory-mapped, not read into memory).
pub fn file_content_id(path: &Path) -> Result<ContentId, RelayError> {
    tributary_protocol::checkpoint::file_content_id(path).map_err(|e| match e {
        CheckpointError::Io { source, .. } => io(path)(source),
        other => RelayError::BadPayload(format!("not a GGUF file: {other}")),
    })
}

impl Relay {
    /// Opens the relay folder with the entries the store kept.
    pub fn open(dir: &Path, entries: Vec<Entry>) -> Result<Self, RelayError> {
        for sub in ["full", "delta", "incoming"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        // Uploads a crash or a lost connection left half-written.
        for e in std::fs::read_dir(dir.join("incoming")).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let entries = entries.into_iter().map(|e| (e.id, e)).collect();
        Ok(Self {
            dir: dir.to_owned(),
            entries: Mutex::new(entries),
            peers: Mutex::new(HashMap::new()),
            announcements: Mutex::new(HashMap::new()),
            store: Mutex::new(None),
            uploads: tokio::sync::Notify::new(),
            served: Arc::new(AtomicU64::new(0)),
        })
    }

    /// From now on checkpoints are written to an object store: retention
    /// deletes only checkpoints the store holds ([`Relay::mark_stored`]), and
    /// a path whose every step the store holds carries `url`
    /// ([`CheckpointPath::store_url`]), the base URL miners download from.
    pub fn use_store(&self, url: Option<String>) {
        let mut st = lock(&self.store);
        let stored = st.take().map(|v| v.stored).unwrap_or_default();
        *st = Some(StoreView { url, stored });
    }

    /// Records that the store holds `id`'s full file and delta.
    pub fn mark_stored(&self, id: ContentId) {
        if let Some(v) = lock(&self.store).as_mut() {
            v.stored.insert(id);
        }
    }

    /// Whether the store holds `id`'s full file and delta (as far as this
    /// coordinator knows since it started).
    pub fn is_stored(&self, id: &ContentId) -> bool {
        lock(&self.store).as_ref().is_some_and(|v| v.stored.contains(id))
    }

    /// Resolves when a checkpoint was added since the last call (for the
    /// task that writes them to the store).
    pub async fn new_checkpoint(&self) {
        self.uploads.notified().await;
    }

    /// Payload bytes this relay served to peers since it started (full files
    /// and deltas): the coordinator's checkpoint egress.
    pub fn bytes_served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// The store's URL for a path, if the store holds every step of it.
    fn store_url_for(&self, steps: &[PathStep]) -> Option<String> {
        let st = lock(&self.store);
        let v = st.as_ref()?;
        let url = v.url.as_ref()?;
        (!steps.is_empty() && steps.iter().all(|s| v.stored.contains(&s.id))).then(|| url.clone())
    }

    /// Keeps the trainer's signed announcement of a checkpoint, sent with
    /// every path that ends at it ([`CheckpointPath::announcement`]).
    pub fn set_announcement(&self, ann: PublishCheckpoint) {
        lock(&self.announcements).insert(ann.body.id, ann);
    }

    /// The signed announcement of a checkpoint, if one is kept.
    pub fn announcement(&self, id: &ContentId) -> Option<PublishCheckpoint> {
        lock(&self.announcements).get(id).cloned()
    }

    /// Whether `ann` is `trainer`'s announcement, for `network`, of the full
    /// file of `entry` (what the genesis checkpoint's announcement must be:
    /// its whole-file length and hash).
    pub fn announces_full(ann: &PublishCheckpoint, entry: &Entry, trainer: &PublicKey, network: &NetworkId) -> bool {
        let b = &ann.body;
        b.id == entry.id
            && b.kind == CheckpointKind::Full
            && b.len == entry.full_len
            && b.payload_hash == entry.full_hash
            && b.trainer == *trainer
            && ann.verify(network).is_ok()
    }

    /// Serves `bytes` as the full file of checkpoint `id` (publication
    /// `seq`, window 0) with no announcement: the relay never parses what it
    /// serves, so benches and tests of the serving path use any bytes.
    pub fn insert_unannounced(&self, id: ContentId, seq: u64, bytes: &[u8]) -> Result<Entry, RelayError> {
        let path = self.full_path(&id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::write(&path, bytes).map_err(io(&path))?;
        let entry = Entry {
            id,
            seq,
            window: 0,
            from_window: 0,
            full_len: bytes.len() as u64,
            full_hash: *blake3::hash(bytes).as_bytes(),
            delta: None,
        };
        self.insert(entry.clone());
        Ok(entry)
    }

    /// Path of a checkpoint's full file.
    pub fn full_path(&self, id: &ContentId) -> PathBuf {
        full_path(&self.dir, id)
    }

    /// Path of a delta payload.
    pub fn delta_path(&self, base: &ContentId, id: &ContentId) -> PathBuf {
        self.dir.join("delta").join(format!("{base}-{id}.delta"))
    }

    /// A fresh file name for an upload in progress.
    pub fn incoming_path(&self, id: &ContentId) -> PathBuf {
        self.dir.join("incoming").join(format!("{id}.{}.part", rand::random::<u64>()))
    }

    /// Every entry, in publication order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = lock(&self.entries).values().cloned().collect();
        v.sort_by_key(|e| e.seq);
        v
    }

    /// One entry.
    pub fn entry(&self, id: &ContentId) -> Option<Entry> {
        lock(&self.entries).get(id).cloned()
    }

    /// The genesis entry for a full file already at [`Relay::full_path`] (or
    /// `None` if there is no such file: a network without a relayed genesis).
    pub fn genesis_entry(&self, id: ContentId) -> Result<Option<Entry>, RelayError> {
        if let Some(e) = self.entry(&id) {
            return Ok(Some(e));
        }
        let path = self.full_path(&id);
        if !path.is_file() {
            return Ok(None);
        }
        let (full_len, full_hash) = hash_file(&path)?;
        Ok(Some(Entry { id, seq: 0, window: 0, from_window: 0, full_len, full_hash, delta: None }))
    }

    /// Makes an entry visible (after the caller stored it durably).
    pub fn insert(&self, e: Entry) {
        lock(&self.entries).insert(e.id, e);
        self.uploads.notify_one();
    }

    /// Verifies an uploaded payload (already checked against the announced
    /// hash and length, at `upload`) and files it: a full file is checked by
    /// content id, a delta is applied to its base's full file. Returns the
    /// new entry (not yet inserted); the upload file is consumed.
    ///
    /// Blocking (hashes and writes files).
    pub fn ingest(&self, ann: &PublishCheckpoint, upload: &Path, from_window: WindowId) -> Result<Entry, RelayError> {
        let body = &ann.body;
        let res = self.ingest_inner(ann, upload, from_window);
        let _ = std::fs::remove_file(upload);
        if res.is_err() {
            tracing::warn!(id = %body.id, "checkpoint upload refused");
        }
        res
    }

    fn ingest_inner(&self, ann: &PublishCheckpoint, upload: &Path, from_window: WindowId) -> Result<Entry, RelayError> {
        let body = &ann.body;
        let seq = lock(&self.entries).values().map(|e| e.seq).max().map_or(1, |s| s + 1);
        let full = self.full_path(&body.id);
        let delta = match body.kind {
            CheckpointKind::Full => {
                let found = file_content_id(upload)?;
                if found != body.id {
                    return Err(RelayError::BadPayload(format!(
                        "full file has content id {found}, announced {}",
                        body.id
                    )));
                }
                std::fs::rename(upload, &full).map_err(io(&full))?;
                None
            }
            CheckpointKind::Delta { base } => {
                let base_full = self.full_path(&base);
                if !base_full.is_file() {
                    return Err(RelayError::NotFound(base));
                }
                let bytes = std::fs::read(upload).map_err(io(upload))?;
                let (b, r) = delta::peek_ids(&bytes)?;
                if b != base || r != body.id {
                    return Err(RelayError::BadPayload(format!(
                        "delta goes {b} -> {r}, announced {base} -> {}",
                        body.id
                    )));
                }
                // Applies to a copy of the base and checks base and result ids.
                delta::apply_file(&bytes, &base_full, &full)?;
                let dpath = self.delta_path(&base, &body.id);
                std::fs::rename(upload, &dpath).map_err(io(&dpath))?;
                Some((base, body.len, body.payload_hash))
            }
        };
        let (full_len, full_hash) = match (&delta, body.kind) {
            (None, CheckpointKind::Full) => (body.len, body.payload_hash),
            _ => hash_file(&full)?,
        };
        Ok(Entry { id: body.id, seq, window: body.window, from_window, full_len, full_hash, delta })
    }

    /// The way from `have` to `want`. Without `want`, the latest publication;
    /// with a store URL ([`Relay::use_store`]), the latest one the store
    /// holds (not older than `have`), so that miners polling between a
    /// publication and its upload wait for the store instead of all
    /// downloading from the relay; a miner whose window needs a newer one
    /// asks for it by id and gets it from the relay at once.
    pub fn path(&self, have: Option<ContentId>, want: Option<ContentId>) -> Result<CheckpointPath, RelayError> {
        let entries = lock(&self.entries);
        let target = match want {
            Some(id) => entries.get(&id).ok_or(RelayError::NotFound(id))?,
            None => {
                let newest = entries.values().max_by_key(|e| e.seq).ok_or(RelayError::NotFound(ContentId([0; 32])))?;
                let floor = have.and_then(|h| entries.get(&h)).map(|e| e.seq);
                let st = lock(&self.store);
                let stored = st
                    .as_ref()
                    .filter(|v| v.url.is_some())
                    .and_then(|v| entries.values().filter(|e| v.stored.contains(&e.id)).max_by_key(|e| e.seq));
                match stored {
                    Some(e) if floor.is_none_or(|f| e.seq >= f) => e,
                    _ => newest,
                }
            }
        };
        let mut out = CheckpointPath {
            target: target.id,
            from_window: target.from_window,
            steps: Vec::new(),
            announcement: lock(&self.announcements).get(&target.id).cloned(),
            store_url: None,
        };
        if have == Some(target.id) {
            return Ok(out);
        }
        if let Some(have) = have {
            let mut chain = Vec::new();
            let mut cur = target;
            let mut bytes = 0u64;
            while let Some((base, len, hash)) = cur.delta {
                chain.push(PathStep { id: cur.id, base: Some(base), len, payload_hash: hash });
                bytes = bytes.saturating_add(len);
                if base == have || chain.len() >= MAX_PATH_STEPS {
                    break;
                }
                match entries.get(&base) {
                    Some(e) => cur = e,
                    None => break,
                }
            }
            let linked = chain.last().is_some_and(|s| s.base == Some(have));
            if linked && bytes < target.full_len {
                chain.reverse();
                out.steps = chain;
                out.store_url = self.store_url_for(&out.steps);
                return Ok(out);
            }
        }
        out.steps.push(PathStep { id: target.id, base: None, len: target.full_len, payload_hash: target.full_hash });
        out.store_url = self.store_url_for(&out.steps);
        Ok(out)
    }

    /// Up to [`CHUNK_LEN`] bytes of a payload from `offset` (empty at or past the end).
    ///
    /// Blocking (reads a file).
    pub fn read(&self, what: Payload, offset: u64) -> Result<Vec<u8>, RelayError> {
        let mut chunk = self.open_chunk(what, offset)?;
        chunk.read_piece(CHUNK_LEN)
    }

    /// The chunk of a payload from `offset` (up to [`CHUNK_LEN`] bytes, none
    /// at or past the end), open to be read piece by piece
    /// ([`ChunkReader::read_piece`]): a server that sends it holds one piece
    /// at a time, never the chunk. The file stays readable if retention
    /// deletes it meanwhile.
    ///
    /// Blocking (opens a file).
    pub fn open_chunk(&self, what: Payload, offset: u64) -> Result<ChunkReader, RelayError> {
        let path = match what {
            Payload::Full(id) => {
                if !lock(&self.entries).contains_key(&id) {
                    return Err(RelayError::NotFound(id));
                }
                self.full_path(&id)
            }
            Payload::Delta { base, id } => {
                let known = lock(&self.entries).get(&id).is_some_and(|e| e.delta.is_some_and(|d| d.0 == base));
                if !known {
                    return Err(RelayError::NotFound(id));
                }
                self.delta_path(&base, &id)
            }
        };
        let mut file = File::open(&path).map_err(io(&path))?;
        let len = file.metadata().map_err(io(&path))?.len();
        let start = offset.min(len);
        file.seek(SeekFrom::Start(start)).map_err(io(&path))?;
        let remaining = usize::try_from(len - start).unwrap_or(usize::MAX).min(CHUNK_LEN);
        let kind = if matches!(what, Payload::Full(_)) { "full" } else { "delta" };
        Ok(ChunkReader { file, path, len: remaining, remaining, kind, served: self.served.clone() })
    }

    /// The entries retention deletes: all but the `keep` most recent
    /// publications, the ones in `in_use`, genesis (publication 0), any in
    /// force only after window `after` (announced ahead) and, once
    /// checkpoints go to an object store ([`Relay::use_store`]), any the
    /// store does not hold yet.
    pub fn past_retention(&self, keep: usize, in_use: &HashSet<ContentId>, after: WindowId) -> Vec<ContentId> {
        let entries = self.entries();
        let newest = entries.len().saturating_sub(keep);
        let st = lock(&self.store);
        entries[..newest]
            .iter()
            .filter(|e| e.seq != 0 && !in_use.contains(&e.id) && e.from_window <= after)
            .filter(|e| st.as_ref().is_none_or(|v| v.stored.contains(&e.id)))
            .map(|e| e.id)
            .collect()
    }

    /// Forgets checkpoints (the caller deleted their records) and deletes
    /// their full files and deltas. Returns the bytes freed.
    ///
    /// Blocking (deletes files).
    pub fn remove(&self, ids: &[ContentId]) -> Result<u64, RelayError> {
        let gone: Vec<Entry> = {
            let mut entries = lock(&self.entries);
            ids.iter().filter_map(|id| entries.remove(id)).collect()
        };
        {
            let mut anns = lock(&self.announcements);
            for id in ids {
                anns.remove(id);
            }
        }
        if let Some(v) = lock(&self.store).as_mut() {
            for id in ids {
                v.stored.remove(id);
            }
        }
        let mut freed = 0u64;
        for e in &gone {
            let mut files = vec![self.full_path(&e.id)];
            files.extend(e.delta.map(|(base, _, _)| self.delta_path(&base, &e.id)));
            for f in files {
                freed += remove_file(&f)?;
            }
        }
        Ok(freed)
    }

    /// Deletes the payload files no entry names (left by a crash between a
    /// retention's record deletion and its file deletion, or by an upload
    /// that never became an entry). Call at start, before any upload.
    /// Returns how many went.
    pub fn remove_orphans(&self) -> Result<usize, RelayError> {
        let named: HashSet<PathBuf> = self
            .entries()
            .iter()
            .flat_map(|e| {
                let mut v = vec![self.full_path(&e.id)];
                v.extend(e.delta.map(|(base, _, _)| self.delta_path(&base, &e.id)));
                v
            })
            .collect();
        let mut n = 0;
        for sub in ["full", "delta"] {
            let dir = self.dir.join(sub);
            for item in std::fs::read_dir(&dir).map_err(io(&dir))? {
                let path = item.map_err(io(&dir))?.path();
                if path.is_file() && !named.contains(&path) {
                    tracing::info!(file = %path.display(), "relay file no checkpoint names deleted");
                    remove_file(&path)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// Notes the checkpoint a peer said it holds.
    pub fn note_holds(&self, peer: PublicKey, id: Option<ContentId>) {
        let mut peers = lock(&self.peers);
        let p = peers.entry(peer).or_default();
        p.holds = id;
        p.seen_ms = tributary_net::now_ms();
    }

    /// Notes the checkpoint of a peer's accepted rollout.
    pub fn note_generating(&self, peer: PublicKey, id: ContentId) {
        let mut peers = lock(&self.peers);
        let p = peers.entry(peer).or_default();
        p.generating = Some(id);
        p.seen_ms = tributary_net::now_ms();
    }

    /// Forgets peers last noted before `before_ms`; returns how many are left.
    pub fn prune_peers(&self, before_ms: u64) -> usize {
        let mut peers = lock(&self.peers);
        peers.retain(|_, p| p.seen_ms >= before_ms);
        peers.shrink_to_fit();
        peers.len()
    }

    /// What every peer holds and runs.
    pub fn peers(&self) -> HashMap<PublicKey, PeerCheckpoint> {
        lock(&self.peers).clone()
    }
}

/// Path of a checkpoint's full file in the relay folder `dir`.
pub fn full_path(dir: &Path, id: &ContentId) -> PathBuf {
    dir.join("full").join(format!("{id}.gguf"))
}

/// Installs a genesis checkpoint's full file into the relay folder `dir`
/// (atomically, only if absent) and returns its content id.
pub fn install_full(dir: &Path, bytes: &[u8]) -> Result<ContentId, RelayError> {
    let header = gguf::parse_header(bytes).map_err(|e| RelayError::BadPayload(format!("not a GGUF file: {e}")))?;
    let id = content_id_of(&header, bytes);
    let path = full_path(dir, &id);
    if path.is_file() {
        return Ok(id);
    }
    let parent = dir.join("full");
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let tmp = parent.join(format!(".{id}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(id)
}

/// Summary of the relay per checkpoint for operators (`GET /api/checkpoints`).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointJson {
    /// Content id (hex).
    pub id: String,
    /// The window the trainer published it for.
    pub window: WindowId,
    /// The first window that uses it.
    pub from_window: WindowId,
    /// Bytes of the full file.
    pub full_bytes: u64,
    /// Bytes of the delta, if one was published.
    pub delta_bytes: Option<u64>,
    /// The delta's base (hex).
    pub base: Option<String>,
}

impl From<&Entry> for CheckpointJson {
    fn from(e: &Entry) -> Self {
        Self {
            id: e.id.to_string(),
            window: e.window,
            from_window: e.from_window,
            full_bytes: e.full_len,
            delta_bytes: e.delta.map(|d| d.1),
            base: e.delta.map(|d| d.0.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u8, seq: u64, base: Option<u8>, delta_len: u64, full_len: u64) -> Entry {
        Entry {
            id: ContentId([id; 32]),
            seq,
            window: seq,
            from_window: seq + 1,
            full_len,
            full_hash: [id; 32],
            delta: base.map(|b| (ContentId([b; 32]), delta_len, [id ^ 0xff; 32])),
        }
    }

    #[test]
    fn paths_prefer_short_delta_chains() {
        let dir = tempfile::tempdir().unwrap();
        let r = Relay::open(
            dir.path(),
            vec![
                entry(1, 0, None, 0, 1000),
                entry(2, 1, Some(1), 10, 1000),
                entry(3, 2, Some(2), 10, 1000),
                entry(4, 3, None, 0, 1000),
                entry(5, 4, Some(4), 900, 1000),
                entry(6, 5, Some(5), 900, 1000),
            ],
        )
        .unwrap();
        let ids = |p: &CheckpointPath| p.steps.iter().map(|s| (s.id.0[0], s.base.map(|b| b.0[0]))).collect::<Vec<_>>();
        // Up to date.
        assert!(r.path(Some(ContentId([3; 32])), Some(ContentId([3; 32]))).unwrap().steps.is_empty());
        // A delta chain links 1 to 3.
        assert_eq!(
            ids(&r.path(Some(ContentId([1; 32])), Some(ContentId([3; 32]))).unwrap()),
            vec![(2, Some(1)), (3, Some(2))]
        );
        // Nothing held, or an unknown id: the full file.
        assert_eq!(ids(&r.path(None, Some(ContentId([3; 32]))).unwrap()), vec![(3, None)]);
        assert_eq!(ids(&r.path(Some(ContentId([9; 32])), Some(ContentId([3; 32]))).unwrap()), vec![(3, None)]);
        // The chain breaks at a full publication (4): from 3 the full 6.
        let p = r.path(Some(ContentId([3; 32])), None).unwrap();
        assert_eq!(p.target, ContentId([6; 32]));
        assert_eq!(ids(&p), vec![(6, None)]);
        // Deltas larger than the full file together: the full file.
        assert_eq!(ids(&r.path(Some(ContentId([4; 32])), None).unwrap()), vec![(6, None)]);
        assert_eq!(ids(&r.path(Some(ContentId([5; 32])), None).unwrap()), vec![(6, Some(5))]);
        assert!(matches!(r.path(None, Some(ContentId([7; 32]))), Err(RelayError::NotFound(_))));
    }

    /// With a store URL, a miner asking for the latest checkpoint gets the
    /// latest one the store holds, with the URL, until a newer one is
    /// stored; one asking by id, or already holding a newer one, gets it
    /// from the relay.
    #[test]
    fn with_a_store_the_latest_is_the_latest_stored() {
        let dir = tempfile::tempdir().unwrap();
        let r = Relay::open(
            dir.path(),
            vec![entry(1, 0, None, 0, 1000), entry(2, 1, Some(1), 10, 1000), entry(3, 2, Some(2), 10, 1000)],
        )
        .unwrap();
        let c = |i: u8| ContentId([i; 32]);
        r.use_store(Some("https://cdn.example".into()));
        // Nothing stored yet: the newest, from the relay.
        let p = r.path(None, None).unwrap();
        assert_eq!((p.target, p.store_url), (c(3), None));
        r.mark_stored(c(1));
        r.mark_stored(c(2));
        let p = r.path(Some(c(1)), None).unwrap();
        assert_eq!((p.target, p.store_url.as_deref()), (c(2), Some("https://cdn.example")));
        let p = r.path(Some(c(2)), None).unwrap();
        assert!(p.steps.is_empty() && p.target == c(2), "{p:?}");
        // Asked by id, or from a newer checkpoint than the store has: the relay.
        let p = r.path(Some(c(2)), Some(c(3))).unwrap();
        assert_eq!((p.target, p.store_url), (c(3), None));
        let p = r.path(Some(c(3)), None).unwrap();
        assert!(p.steps.is_empty() && p.target == c(3), "{p:?}");
        r.mark_stored(c(3));
        let p = r.path(Some(c(2)), None).unwrap();
        assert_eq!((p.target, p.store_url.as_deref()), (c(3), Some("https://cdn.example")));
        // A store without a public URL: the newest, as without a store.
        let r2 = Relay::open(dir.path(), vec![entry(1, 0, None, 0, 1000), entry(2, 1, Some(1), 10, 1000)]).unwrap();
        r2.use_store(None);
        assert_eq!(r2.path(None, None).unwrap().target, c(2));
    }

    #[test]
    fn reads_are_bounded_and_resumable() {
        let dir = tempfile::tempdir().unwrap();
        let r = Relay::open(dir.path(), vec![]).unwrap();
        let id = ContentId([1; 32]);
        assert!(matches!(r.read(Payload::Full(id), 0), Err(RelayError::NotFound(_))));
        let data: Vec<u8> = (0..CHUNK_LEN + 100).map(|i| i as u8).collect();
        std::fs::write(r.full_path(&id), &data).unwrap();
        r.insert(entry(1, 0, None, 0, data.len() as u64));
        let a = r.read(Payload::Full(id), 0).unwrap();
        assert_eq!(a.len(), CHUNK_LEN);
        let b = r.read(Payload::Full(id), a.len() as u64).unwrap();
        assert_eq!([a, b].concat(), data);
        assert!(r.read(Payload::Full(id), u64::MAX).unwrap().is_empty());
        // A delta that was never published is not served.
        assert!(r.read(Payload::Delta { base: id, id: ContentId([2; 32]) }, 0).is_err());
    }

    #[test]
    fn a_chunk_is_read_piece_by_piece_and_deleted_files_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        let r = Relay::open(dir.path(), vec![]).unwrap();
        let id = ContentId([1; 32]);
        let data: Vec<u8> = (0..CHUNK_LEN + 100).map(|i| (i * 7) as u8).collect();
        std::fs::write(r.full_path(&id), &data).unwrap();
        r.insert(entry(1, 0, None, 0, data.len() as u64));
        let mut c = r.open_chunk(Payload::Full(id), 50).unwrap();
        assert_eq!((c.len(), c.remaining()), (CHUNK_LEN, CHUNK_LEN));
        // Retention deletes the file while the chunk is being sent.
        std::fs::remove_file(r.full_path(&id)).unwrap();
        let mut got = Vec::new();
        loop {
            let p = c.read_piece(PIECE_LEN).unwrap();
            if p.is_empty() {
                break;
            }
            assert!(p.len() <= PIECE_LEN);
            got.extend(p);
        }
        assert_eq!(got, data[50..50 + CHUNK_LEN]);
        assert_eq!(c.remaining(), 0);
    }

    /// Issue 29 item 2: a key holds at most its share of the relay budget;
    /// another key is served from the rest meanwhile, and what is released
    /// goes back to the pool.
    #[tokio::test]
    async fn a_key_holds_at_most_its_share_of_the_relay_budget() {
        let b = RelayBudget::new(16, WRITE_DEADLINE);
        let piece = (PIECE_LEN >> 10) as u32;
        assert_eq!(b.per_key_kib(), 1024);
        let (greedy, honest) = (PublicKey([1; 32]), PublicKey([2; 32]));
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(b.acquire(greedy, piece).await);
        }
        assert_eq!(b.key_inflight_kib(&greedy), 1024);
        // The greedy key's next piece waits for its own share...
        let more = tokio::time::timeout(Duration::from_millis(100), b.acquire(greedy, piece)).await;
        assert!(more.is_err(), "a key took more than its share");
        // ... while another key is served at once.
        let h = tokio::time::timeout(Duration::from_millis(100), b.acquire(honest, piece)).await;
        assert!(h.is_ok(), "another key was not served");
        assert_eq!(b.inflight_kib(), 1024 + 256);
        drop(held);
        drop(h);
        assert_eq!(b.inflight_kib(), 0);
        b.prune();
        assert_eq!(b.keys(), 0);
    }
}
