//! Durable state in one redb file: meta (master secret, genesis), rollouts,
//! verdicts, checkpoints, the signed weights document of every interval and
//! the trainer's signed step reports. A write returns only after its transaction is
//! committed with `Durability::Immediate`, so whatever was acknowledged
//! survives a `kill -9`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{MinerWork, PublishCheckpoint, TrainerStats, Verdict, WeightsDoc};

use crate::core::{Candidate, Shape};
use crate::relay;

const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
// Rollouts are an append-only log: a commit appends to [`BODIES`] and
// [`ENTRIES`] (keys grow within a window, so no page of older data is
// rewritten); the digest-ordered index that validators page through is
// derived from the log when a window is read ([`Store::rollouts`]), in
// sorted runs, off the ingestion path.
/// (window, arrival number) → the rollout's bytes as received.
const BODIES: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("rollout_bodies");
/// (window, arrival number) → postcard(IndexEntry): what rebuilds the core.
const ENTRIES: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("rollout_entries");
/// window BE ‖ digest → arrival number (u64 LE) ‖ miner: digest order, for paging.
const DIGESTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollout_digests");
/// window → the first arrival number of that window not yet in [`DIGESTS`].
const INDEXED: TableDefinition<'_, u64, u64> = TableDefinition::new("rollout_digests_through");
/// window BE ‖ miner ‖ digest → arrival number (u64 LE) ‖ group (u32 LE) ‖
/// bytes (u32 LE): each miner's rollouts together, for fetching one miner
/// and for a window's index ([`Store::window_index`]), derived like [`DIGESTS`].
const MINERS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollout_miners");
/// window → the first arrival number of that window not yet in [`MINERS`].
const MINERS_INDEXED: TableDefinition<'_, u64, u64> = TableDefinition::new("rollout_miners_through");
/// The next arrival number (u64 LE), in [`META`].
const NEXT_SEQ: &str = "next_rollout_seq";
/// Layout before arrival-ordered bodies: window BE ‖ digest → encoded
/// rollout, and → postcard(LegacyIndexEntry). Migrated at open.
const LEGACY_ROLLOUTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollouts");
const LEGACY_INDEX: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollout_index");
/// window BE ‖ miner ‖ validator → postcard(Verdict).
const VERDICTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("verdicts");
/// from-window BE → postcard(PublishCheckpoint).
const CHECKPOINTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("checkpoints");
/// content id → postcard(relay::Entry) (the payload files live in the relay folder).
const RELAY: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("relay_entries");
/// interval (the last window the weights account for) → postcard(WeightsDoc), written once.
const WEIGHTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("weights_documents");
/// publication window → postcard(TrainerStats).
const TRAINER_STATS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("trainer_stats");

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb failed.
    #[error("database: {0}")]
    Db(Box<redb::Error>),
    /// A stored value did not decode (corruption or a version mismatch).
    #[error("corrupt stored value in {0}")]
    Corrupt(&'static str),
    /// The database was written in a format this build does not read.
    #[error(
        "{} was written {found}; this build reads store format {FORMAT_VERSION}. Run the build that wrote it, \
         or move the data folder aside and start a new network (a new master secret, coordinator key and \
         certificate: miners, validators and the trainer must pin the new ones)",
        path.display()
    )]
    Format {
        /// The database file.
        path: PathBuf,
        /// What it holds.
        found: Found,
    },
}

/// The store format this build writes and reads, recorded in `meta` when a
/// database is created. Raise it with any change to a table's layout or to
/// the encoding of a stored value that older records would not decode under.
pub const FORMAT_VERSION: u32 = 1;

/// The meta key of [`FORMAT_VERSION`] (u32 LE).
pub const FORMAT_KEY: &str = "format_version";

/// The meta key of the trainer's signed announcement of the genesis checkpoint.
pub const GENESIS_ANNOUNCEMENT: &str = "genesis_announcement";

/// What an unreadable database holds ([`StoreError::Format`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Another format version (a newer build's, or an older one's).
    Version(u32),
    /// No format version, and records of this table that do not decode as
    /// this build writes them (a build from before format versions).
    Unreadable(String),
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::Version(v) if *v > FORMAT_VERSION => write!(f, "by a newer build (store format {v})"),
            Found::Version(v) => write!(f, "by an older build (store format {v})"),
            Found::Unreadable(t) => {
                write!(f, "by a build from before store format versions (its `{t}` records do not decode)")
            }
        }
    }
}

/// Opens (creating) a table; a table of another key or value type is a
/// database of another format.
fn create_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::WriteTransaction,
    t: TableDefinition<'_, K, V>,
    path: &Path,
) -> Result<(), StoreError> {
    match tx.open_table(t) {
        Ok(_) => Ok(()),
        Err(redb::TableError::TableTypeMismatch { .. }) => {
            Err(StoreError::Format { path: path.to_path_buf(), found: Found::Unreadable(t.name().into()) })
        }
        Err(e) => Err(e.into()),
    }
}

/// The first and last values of a table.
fn ends<K: redb::Key + 'static>(t: &redb::Table<'_, K, &'static [u8]>) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut out = Vec::new();
    if let Some((_, v)) = t.first()? {
        out.push(v.value().to_vec());
    }
    if let Some((_, v)) = t.last()? {
        out.push(v.value().to_vec());
    }
    Ok(out)
}

fn all_decode<T: serde::de::DeserializeOwned>(values: &[Vec<u8>]) -> bool {
    values.iter().all(|v| postcard::from_bytes::<T>(v).is_ok())
}

/// The first table of an unversioned database whose first or last record
/// does not decode as this build writes it (`None`: they all do).
fn undecodable(tx: &redb::WriteTransaction) -> Result<Option<&'static str>, StoreError> {
    if !all_decode::<IndexEntry>(&ends(&tx.open_table(ENTRIES)?)?) {
        return Ok(Some("rollout_entries"));
    }
    if !all_decode::<Verdict>(&ends(&tx.open_table(VERDICTS)?)?) {
        return Ok(Some("verdicts"));
    }
    if !all_decode::<PublishCheckpoint>(&ends(&tx.open_table(CHECKPOINTS)?)?) {
        return Ok(Some("checkpoints"));
    }
    if !all_decode::<relay::Entry>(&ends(&tx.open_table(RELAY)?)?) {
        return Ok(Some("relay_entries"));
    }
    if !all_decode::<WeightsDoc>(&ends(&tx.open_table(WEIGHTS)?)?) {
        return Ok(Some("weights_documents"));
    }
    if !all_decode::<TrainerStats>(&ends(&tx.open_table(TRAINER_STATS)?)?) {
        return Ok(Some("trainer_stats"));
    }
    Ok(None)
}

macro_rules! db_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(Box::new(e.into())) }
        }
    )*};
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Db(Box::new(e))
    }
}

/// A page of rollouts: their bytes, and the digest to resume after if more follow.
pub type Page = (Vec<Vec<u8>>, Option<[u8; 32]>);
/// Rollouts in arrival order: (arrival number, bytes) pairs, and whether more follow.
pub type ArrivalPage = (Vec<(u64, Vec<u8>)>, bool);
db_from!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

/// What the index keeps of a stored rollout (enough to rebuild the core).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct IndexEntry {
    miner: PublicKey,
    group: u32,
    index: u32,
    task_id: u64,
    content: [u8; 32],
    checkpoint: ContentId,
    env: EnvId,
    digest: [u8; 32],
}

/// The index entry of the layout before [`BODIES`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct LegacyIndexEntry {
    miner: PublicKey,
    group: u32,
    index: u32,
    task_id: u64,
    content: [u8; 32],
    checkpoint: ContentId,
    env: EnvId,
}

fn decode_entry(v: &[u8]) -> Result<IndexEntry, StoreError> {
    postcard::from_bytes(v).map_err(|_| StoreError::Corrupt("index"))
}

/// A [`DIGESTS`] value: arrival number ‖ miner.
fn digest_value(seq: u64, miner: &PublicKey) -> [u8; 40] {
    let mut v = [0u8; 40];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v[8..].copy_from_slice(miner.as_bytes());
    v
}

fn split_digest_value(v: &[u8]) -> Result<(u64, PublicKey), StoreError> {
    let (s, m) = v.split_at_checked(8).ok_or(StoreError::Corrupt("digest index"))?;
    let seq = u64::from_le_bytes(s.try_into().map_err(|_| StoreError::Corrupt("digest index"))?);
    Ok((seq, PublicKey(m.try_into().map_err(|_| StoreError::Corrupt("digest index"))?)))
}

fn split_key(key: &[u8]) -> Result<(WindowId, [u8; 32]), StoreError> {
    let (w, d) = key.split_at_checked(8).ok_or(StoreError::Corrupt("index key"))?;
    let window = u64::from_be_bytes(w.try_into().map_err(|_| StoreError::Corrupt("index key"))?);
    let digest: [u8; 32] = d.try_into().map_err(|_| StoreError::Corrupt("index key"))?;
    Ok((window, digest))
}

/// A [`MINERS`] key: window BE ‖ miner ‖ digest.
fn miner_key(window: WindowId, miner: &PublicKey, digest: &[u8; 32]) -> [u8; 72] {
    let mut k = [0u8; 72];
    k[..8].copy_from_slice(&window.to_be_bytes());
    k[8..40].copy_from_slice(miner.as_bytes());
    k[40..].copy_from_slice(digest);
    k
}

fn split_miner_key(key: &[u8]) -> Result<(PublicKey, [u8; 32]), StoreError> {
    let bad = || StoreError::Corrupt("miner index");
    let m: [u8; 32] = key.get(8..40).ok_or_else(bad)?.try_into().map_err(|_| bad())?;
    let d: [u8; 32] = key.get(40..72).ok_or_else(bad)?.try_into().map_err(|_| bad())?;
    Ok((PublicKey(m), d))
}

/// A [`MINERS`] value: arrival number ‖ group ‖ bytes.
fn miner_value(seq: u64, group: u32, len: u32) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v[8..12].copy_from_slice(&group.to_le_bytes());
    v[12..].copy_from_slice(&len.to_le_bytes());
    v
}

fn split_miner_value(v: &[u8]) -> Result<(u64, u32, u32), StoreError> {
    let bad = || StoreError::Corrupt("miner index");
    let seq = u64::from_le_bytes(v.get(..8).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    let group = u32::from_le_bytes(v.get(8..12).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    let len = u32::from_le_bytes(v.get(12..16).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    Ok((seq, group, len))
}

/// What a [`MinerWork`] entry costs on the wire besides its groups (key,
/// varint counts), at most.
const MINER_WORK_OVERHEAD: usize = 32 + 5 + 10 + 5;

/// Bytes available to unprivileged writers on the file system holding `dir`.
#[cfg(unix)]
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `s` points to writable memory
    // of the struct statvfs fills; it is read only after a successful call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `s`.
    let s = unsafe { s.assume_init() };
    // The field widths differ between platforms (u32 on some).
    #[allow(clippy::unnecessary_cast)]
    let (avail, frsize) = (s.f_bavail as u64, s.f_frsize as u64);
    Some(avail.saturating_mul(frsize))
}

#[cfg(not(unix))]
fn free_bytes(_dir: &Path) -> Option<u64> {
    None
}

/// The most rollout bytes [`Store::rollouts`] puts in one page.
pub const PAGE_BYTES: usize = 16 << 20;

/// A rollout to store.
#[derive(Debug, Clone)]
pub struct StoredRollout {
    /// Its door-check facts.
    pub candidate: Candidate,
    /// Its encoding.
    pub bytes: Vec<u8>,
}

fn rollout_key(window: WindowId, digest: &[u8; 32]) -> [u8; 40] {
    let mut k = [0u8; 40];
    k[..8].copy_from_slice(&window.to_be_bytes());
    k[8..].copy_from_slice(digest);
    k
}

/// The next arrival number recorded in `meta` (0 in a new database).
fn next_seq(meta: &redb::Table<'_, &str, &[u8]>) -> Result<u64, StoreError> {
    match meta.get(NEXT_SEQ)? {
        Some(v) => Ok(u64::from_le_bytes(v.value().try_into().map_err(|_| StoreError::Corrupt("meta"))?)),
        None => Ok(0),
    }
}

/// Moves rollouts stored in the digest-keyed layout into [`BODIES`] and
/// [`ENTRIES`], inside the opening transaction (all or nothing).
fn migrate(tx: &redb::WriteTransaction) -> Result<(), StoreError> {
    let mut meta = tx.open_table(META)?;
    let mut seq = next_seq(&meta)?;
    let first = seq;
    {
        let old_index = tx.open_table(LEGACY_INDEX)?;
        let old_bodies = tx.open_table(LEGACY_ROLLOUTS)?;
        let mut bodies = tx.open_table(BODIES)?;
        let mut entries = tx.open_table(ENTRIES)?;
        for item in old_index.iter()? {
            let (k, v) = item?;
            let (window, digest) = split_key(k.value())?;
            let e: LegacyIndexEntry = postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("index"))?;
            let bytes = old_bodies.get(k.value())?.ok_or(StoreError::Corrupt("rollouts"))?;
            bodies.insert((window, seq), bytes.value())?;
            let entry = IndexEntry {
                miner: e.miner,
                group: e.group,
                index: e.index,
                task_id: e.task_id,
                content: e.content,
                checkpoint: e.checkpoint,
                env: e.env,
                digest,
            };
            let v = postcard::to_stdvec(&entry).map_err(|_| StoreError::Corrupt("index"))?;
            entries.insert((window, seq), v.as_slice())?;
            seq += 1;
        }
    }
    meta.insert(NEXT_SEQ, seq.to_le_bytes().as_slice())?;
    drop(meta);
    tx.delete_table(LEGACY_INDEX)?;
    tx.delete_table(LEGACY_ROLLOUTS)?;
    tracing::info!(rollouts = seq - first, "moved stored rollouts to the arrival-ordered layout");
    Ok(())
}

/// The coordinator's database.
#[derive(Debug)]
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Rollout bodies and verdicts read out since open ([`Store::rows_read`]).
    reads: AtomicU64,
}

impl Store {
    /// Opens (or creates) the database file and its tables. A new file gets
    /// [`FORMAT_VERSION`]; an existing one must carry it. A file from before
    /// format versions is taken (and stamped) only if its records decode
    /// as this build writes them; otherwise, or with another version, the
    /// answer is [`StoreError::Format`], which says what to do.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path)?;
        let tx = db.begin_write()?;
        let fresh = tx.list_tables()?.next().is_none();
        let format = |found: Found| StoreError::Format { path: path.to_path_buf(), found };
        if !fresh {
            let stored = match tx.open_table(META) {
                Ok(meta) => meta.get(FORMAT_KEY)?.map(|v| v.value().to_vec()),
                Err(redb::TableError::TableTypeMismatch { .. }) => {
                    return Err(format(Found::Unreadable("meta".into())));
                }
                Err(e) => return Err(e.into()),
            };
            match stored.map(|v| <[u8; 4]>::try_from(v.as_slice()).map(u32::from_le_bytes)) {
                Some(Ok(FORMAT_VERSION)) | None => {}
                Some(Ok(v)) => return Err(format(Found::Version(v))),
                Some(Err(_)) => return Err(format(Found::Unreadable("meta".into()))),
            }
        }
        create_table(&tx, META, path)?;
        create_table(&tx, BODIES, path)?;
        create_table(&tx, ENTRIES, path)?;
        create_table(&tx, DIGESTS, path)?;
        create_table(&tx, INDEXED, path)?;
        create_table(&tx, MINERS, path)?;
        create_table(&tx, MINERS_INDEXED, path)?;
        create_table(&tx, VERDICTS, path)?;
        create_table(&tx, CHECKPOINTS, path)?;
        create_table(&tx, RELAY, path)?;
        create_table(&tx, WEIGHTS, path)?;
        create_table(&tx, TRAINER_STATS, path)?;
        let legacy = tx.list_tables()?.any(|t| t.name() == LEGACY_INDEX.name());
        if legacy {
            migrate(&tx)?;
        }
        let versioned = tx.open_table(META)?.get(FORMAT_KEY)?.is_some();
        if !versioned {
            if !fresh {
                if let Some(table) = undecodable(&tx)? {
                    return Err(format(Found::Unreadable(table.into())));
                }
                tracing::info!(
                    version = FORMAT_VERSION,
                    "store from before format versions: its records decode, stamped"
                );
            }
            tx.open_table(META)?.insert(FORMAT_KEY, FORMAT_VERSION.to_le_bytes().as_slice())?;
        }
        tx.commit()?;
        Ok(Self { db, path: path.to_path_buf(), reads: AtomicU64::new(0) })
    }

    /// Rollout bodies and verdicts read out of the database since it was
    /// opened: what a reader such as the dashboard costs, in rows.
    pub fn rows_read(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn count_reads(&self, n: usize) {
        self.reads.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes free for this process on the database's file system (`None` if unknown).
    pub fn free_bytes(&self) -> Option<u64> {
        free_bytes(self.path.parent().unwrap_or(Path::new(".")))
    }

    /// Whether `e` left the database unusable until it is opened again
    /// (redb refuses every operation after an I/O error).
    pub fn is_poisoned(e: &StoreError) -> bool {
        matches!(e, StoreError::Db(b) if matches!(**b, redb::Error::PreviousIo))
    }

    /// A meta value.
    pub fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(META)?;
        Ok(t.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Stores a meta value (durably), replacing any.
    pub fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        tx.open_table(META)?.insert(key, value)?;
        tx.commit()?;
        Ok(())
    }

    /// Deletes the meta records `{prefix}{window}` of every window before
    /// `before` (per-window records kept in the meta table, such as each
    /// window's challenge contributions). Returns how many went.
    pub fn prune_window_meta(&self, prefix: &str, before: WindowId) -> Result<u64, StoreError> {
        let tx = self.db.begin_write()?;
        let mut n = 0u64;
        {
            let mut t = tx.open_table(META)?;
            let end = format!("{prefix}\u{10ffff}");
            t.retain_in(prefix..end.as_str(), |k, _| {
                let old = k.strip_prefix(prefix).and_then(|w| w.parse::<WindowId>().ok()).is_some_and(|w| w < before);
                n += u64::from(old);
                !old
            })?;
        }
        tx.commit()?;
        Ok(n)
    }

    /// Returns the meta value, or stores `init()` under `key` and returns it.
    pub fn meta_or_init(&self, key: &str, init: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>, StoreError> {
        if let Some(v) = self.meta(key)? {
            return Ok(v);
        }
        let v = init();
        let tx = self.db.begin_write()?;
        tx.open_table(META)?.insert(key, v.as_slice())?;
        tx.commit()?;
        Ok(v)
    }

    /// Stores a batch of rollouts in one durable transaction: each one's
    /// bytes as received and its index entry, appended under the next
    /// arrival number.
    pub fn put_rollouts(&self, batch: &[StoredRollout]) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut meta = tx.open_table(META)?;
            let mut seq = next_seq(&meta)?;
            let mut bodies = tx.open_table(BODIES)?;
            let mut entries = tx.open_table(ENTRIES)?;
            let mut v = Vec::with_capacity(192);
            for r in batch {
                let c = &r.candidate;
                bodies.insert((c.window, seq), r.bytes.as_slice())?;
                let entry = IndexEntry {
                    miner: c.miner,
                    group: c.group,
                    index: c.index,
                    task_id: c.task_id,
                    content: c.content,
                    checkpoint: c.checkpoint,
                    env: c.env,
                    digest: c.digest,
                };
                v.clear();
                postcard::to_io(&entry, &mut v).map_err(|_| StoreError::Corrupt("index"))?;
                entries.insert((c.window, seq), v.as_slice())?;
                seq += 1;
            }
            meta.insert(NEXT_SEQ, seq.to_le_bytes().as_slice())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every stored rollout's door facts, for rebuilding the core at startup.
    pub fn candidates(&self) -> Result<Vec<Candidate>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(ENTRIES)?;
        let bodies = tx.open_table(BODIES)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let (window, seq) = k.value();
            let e = decode_entry(v.value())?;
            // What it counts against its window's storage budget.
            let bytes = bodies.get((window, seq))?.map_or(0, |b| b.value().len() as u32);
            out.push(Candidate {
                window,
                checkpoint: e.checkpoint,
                env: e.env,
                group: e.group,
                index: e.index,
                task_id: e.task_id,
                miner: e.miner,
                digest: e.digest,
                content: e.content,
                shape: Shape { bytes, ..Shape::RESTORED },
            });
        }
        Ok(out)
    }

    /// Brings `window`'s digest and miner indexes up to date with its log:
    /// the entries appended since the last call go in, sorted, in one transaction.
    fn index_window(&self, window: WindowId) -> Result<(), StoreError> {
        {
            let tx = self.db.begin_read()?;
            let from_d = tx.open_table(INDEXED)?.get(window)?.map_or(0, |v| v.value());
            let from_m = tx.open_table(MINERS_INDEXED)?.get(window)?.map_or(0, |v| v.value());
            let from = from_d.min(from_m);
            if tx.open_table(ENTRIES)?.range((window, from)..=(window, u64::MAX))?.next().is_none() {
                return Ok(());
            }
        }
        let tx = self.db.begin_write()?;
        {
            let mut indexed = tx.open_table(INDEXED)?;
            let mut miners_indexed = tx.open_table(MINERS_INDEXED)?;
            // Read again: another reader may have indexed the window meanwhile.
            let from_d = indexed.get(window)?.map_or(0, |v| v.value());
            let from_m = miners_indexed.get(window)?.map_or(0, |v| v.value());
            let from = from_d.min(from_m);
            let entries = tx.open_table(ENTRIES)?;
            let bodies = tx.open_table(BODIES)?;
            let mut new = Vec::new();
            let mut next = from;
            for item in entries.range((window, from)..=(window, u64::MAX))? {
                let (k, v) = item?;
                let seq = k.value().1;
                let e = decode_entry(v.value())?;
                let len = bodies.get((window, seq))?.map_or(0, |b| b.value().len() as u32);
                new.push((e.digest, seq, e.miner, e.group, len));
                next = seq + 1;
            }
            new.sort_unstable_by_key(|(d, ..)| *d);
            let mut digests = tx.open_table(DIGESTS)?;
            let mut miners = tx.open_table(MINERS)?;
            for (digest, seq, miner, group, len) in &new {
                if *seq >= from_d {
                    digests.insert(rollout_key(window, digest).as_slice(), digest_value(*seq, miner).as_slice())?;
                }
                if *seq >= from_m {
                    let key = miner_key(window, miner, digest);
                    miners.insert(key.as_slice(), miner_value(*seq, *group, *len).as_slice())?;
                }
            }
            indexed.insert(window, next)?;
            miners_indexed.insert(window, next)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// A page of a closed window's index: its miners after `after`, in key
    /// order, with their rollout counts, bytes and groups, those `keep`
    /// refuses left out; at most `max_bytes` of entries (at least one). The
    /// cursor is the last miner looked at when more follow.
    pub fn window_index(
        &self,
        window: WindowId,
        after: Option<&PublicKey>,
        max_bytes: usize,
        keep: impl Fn(&PublicKey) -> bool,
    ) -> Result<(Vec<MinerWork>, Option<PublicKey>), StoreError> {
        self.index_window(window)?;
        let tx = self.db.begin_read()?;
        let miners = tx.open_table(MINERS)?;
        let start = match after {
            Some(m) => {
                let mut k = miner_key(window, m, &[0xff; 32]).to_vec();
                k.push(0);
                k
            }
            None => window.to_be_bytes().to_vec(),
        };
        let end = window.saturating_add(1).to_be_bytes();
        let mut out: Vec<MinerWork> = Vec::new();
        let mut total = 0usize;
        let mut current: Option<MinerWork> = None;
        let mut last_seen: Option<PublicKey> = None;
        // Each finished miner goes in if it fits (the first always does).
        let mut finish = |w: MinerWork, out: &mut Vec<MinerWork>| -> bool {
            if !keep(&w.miner) {
                return true;
            }
            let size = MINER_WORK_OVERHEAD + 5 * w.groups.len();
            if !out.is_empty() && total + size > max_bytes {
                return false;
            }
            total += size;
            out.push(w);
            true
        };
        for item in miners.range(start.as_slice()..end.as_slice())? {
            let (k, v) = item?;
            let (miner, _) = split_miner_key(k.value())?;
            let (_, group, len) = split_miner_value(v.value())?;
            if current.as_ref().is_some_and(|c| c.miner != miner) {
                let done = current.take().ok_or(StoreError::Corrupt("miner index"))?;
                let m = done.miner;
                if !finish(done, &mut out) {
                    return Ok((out, last_seen));
                }
                last_seen = Some(m);
            }
            let w = current.get_or_insert_with(|| MinerWork { miner, rollouts: 0, bytes: 0, groups: Vec::new() });
            w.rollouts = w.rollouts.saturating_add(1);
            w.bytes += u64::from(len);
            if let Err(i) = w.groups.binary_search(&group) {
                w.groups.insert(i, group);
            }
        }
        if let Some(done) = current.take()
            && !finish(done, &mut out)
        {
            return Ok((out, last_seen));
        }
        Ok((out, None))
    }

    /// A page of a window's rollouts (by digest order), optionally of one
    /// miner: at most `limit` of them and at most [`PAGE_BYTES`] of bytes.
    pub fn rollouts(
        &self,
        window: WindowId,
        miner: Option<&PublicKey>,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.rollouts_within(window, miner, after, limit, PAGE_BYTES)
    }

    /// [`Store::rollouts`] with at most `max_bytes` of rollout bytes in the
    /// page (always at least one rollout, so paging moves on). The page ends
    /// early with `next` set when the next rollout would pass either bound.
    pub fn rollouts_within(
        &self,
        window: WindowId,
        miner: Option<&PublicKey>,
        after: Option<[u8; 32]>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, StoreError> {
        self.index_window(window)?;
        if let Some(m) = miner {
            return self.miner_rollouts(window, m, after, limit, max_bytes);
        }
        let tx = self.db.begin_read()?;
        let bodies = tx.open_table(BODIES)?;
        let digests = tx.open_table(DIGESTS)?;
        let start = match after {
            Some(d) => {
                let mut k = rollout_key(window, &d).to_vec();
                k.push(0);
                k
            }
            None => window.to_be_bytes().to_vec(),
        };
        let end = window.saturating_add(1).to_be_bytes();
        let rows =
            digests.range(start.as_slice()..end.as_slice())?.map(|item| -> Result<([u8; 32], u64), StoreError> {
                let (k, v) = item?;
                Ok((split_key(k.value())?.1, split_digest_value(v.value())?.0))
            });
        self.fill_page(&bodies, window, rows, limit, max_bytes)
    }

    /// One page of rollout bodies from `rows` ((digest, arrival number) in
    /// digest order): at most `limit` rollouts and `max_bytes` of bytes, at
    /// least one; `next` is the last digest taken when more rows follow.
    fn fill_page(
        &self,
        bodies: &redb::ReadOnlyTable<(WindowId, u64), &[u8]>,
        window: WindowId,
        rows: impl Iterator<Item = Result<([u8; 32], u64), StoreError>>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, StoreError> {
        let mut items: Vec<Vec<u8>> = Vec::new();
        let mut total = 0usize;
        let mut last = None;
        for row in rows {
            let (digest, seq) = row?;
            if items.len() == limit {
                return Ok((items, last));
            }
            let bytes = bodies.get((window, seq))?.ok_or(StoreError::Corrupt("rollout bodies"))?;
            let len = bytes.value().len();
            if !items.is_empty() && total + len > max_bytes {
                return Ok((items, last));
            }
            total += len;
            items.push(bytes.value().to_vec());
            self.count_reads(1);
            last = Some(digest);
        }
        Ok((items, None))
    }

    /// [`Store::rollouts_within`] for one miner: its rollouts by digest,
    /// read from [`MINERS`] (only that miner's rows, not the window's).
    fn miner_rollouts(
        &self,
        window: WindowId,
        miner: &PublicKey,
        after: Option<[u8; 32]>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, StoreError> {
        let tx = self.db.begin_read()?;
        let bodies = tx.open_table(BODIES)?;
        let miners = tx.open_table(MINERS)?;
        let start = match after {
            Some(d) => {
                let mut k = miner_key(window, miner, &d).to_vec();
                k.push(0);
                k
            }
            None => miner_key(window, miner, &[0; 32]).to_vec(),
        };
        let mut end = miner_key(window, miner, &[0xff; 32]).to_vec();
        end.push(0);
        let rows = miners.range(start.as_slice()..end.as_slice())?.map(|item| -> Result<([u8; 32], u64), StoreError> {
            let (k, v) = item?;
            Ok((split_miner_key(k.value())?.1, split_miner_value(v.value())?.0))
        });
        self.fill_page(&bodies, window, rows, limit, max_bytes)
    }

    /// A window's stored rollouts in arrival order from arrival number
    /// `from`: (arrival number, bytes) pairs, at most `max_bytes` of them
    /// (at least one), and whether more follow. A reader that keeps the last
    /// number reads each rollout once.
    pub fn rollouts_since(&self, window: WindowId, from: u64, max_bytes: usize) -> Result<ArrivalPage, StoreError> {
        let tx = self.db.begin_read()?;
        let bodies = tx.open_table(BODIES)?;
        let mut items = Vec::new();
        let mut total = 0usize;
        for item in bodies.range((window, from)..=(window, u64::MAX))? {
            let (k, v) = item?;
            let len = v.value().len();
            if !items.is_empty() && total + len > max_bytes {
                self.count_reads(items.len());
                return Ok((items, true));
            }
            total += len;
            items.push((k.value().1, v.value().to_vec()));
        }
        self.count_reads(items.len());
        Ok((items, false))
    }

    /// Deletes the rollouts of every window before `before` (bodies, index
    /// entries, digest index); verdicts, checkpoints and weights documents
    /// stay. Returns how many rollouts went.
    pub fn prune_rollouts(&self, before: WindowId) -> Result<u64, StoreError> {
        if before == 0 {
            return Ok(0);
        }
        let tx = self.db.begin_write()?;
        let mut n = 0u64;
        {
            let mut bodies = tx.open_table(BODIES)?;
            let mut entries = tx.open_table(ENTRIES)?;
            let mut digests = tx.open_table(DIGESTS)?;
            let mut indexed = tx.open_table(INDEXED)?;
            let mut miners = tx.open_table(MINERS)?;
            let mut miners_indexed = tx.open_table(MINERS_INDEXED)?;
            bodies.retain_in(..(before, 0), |_, _| false)?;
            entries.retain_in(..(before, 0), |_, _| {
                n += 1;
                false
            })?;
            let end = before.to_be_bytes();
            digests.retain_in(..end.as_slice(), |_, _| false)?;
            indexed.retain_in(..before, |_, _| false)?;
            miners.retain_in(..end.as_slice(), |_, _| false)?;
            miners_indexed.retain_in(..before, |_, _| false)?;
        }
        tx.commit()?;
        Ok(n)
    }

    /// Number of stored rollouts.
    pub fn rollout_count(&self) -> Result<u64, StoreError> {
        let tx = self.db.begin_read()?;
        Ok(tx.open_table(ENTRIES)?.len()?)
    }

    /// Stores a verdict (replacing that validator's earlier verdict on the miner and window).
    pub fn put_verdict(&self, v: &Verdict) -> Result<(), StoreError> {
        let mut key = Vec::with_capacity(72);
        key.extend_from_slice(&v.body.window.to_be_bytes());
        key.extend_from_slice(v.body.miner.as_bytes());
        key.extend_from_slice(v.body.validator.as_bytes());
        let val = postcard::to_stdvec(v).map_err(|_| StoreError::Corrupt("verdict"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(VERDICTS)?.insert(key.as_slice(), val.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Every stored verdict.
    pub fn verdicts(&self) -> Result<Vec<Verdict>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(VERDICTS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (_, v) = item?;
            out.push(postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("verdict"))?);
        }
        self.count_reads(out.len());
        Ok(out)
    }

    /// The stored verdicts on windows `from` and later.
    pub fn verdicts_from(&self, from: WindowId) -> Result<Vec<Verdict>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(VERDICTS)?;
        let mut out = Vec::new();
        for item in t.range(from.to_be_bytes().as_slice()..)? {
            let (_, v) = item?;
            out.push(postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("verdict"))?);
        }
        self.count_reads(out.len());
        Ok(out)
    }

    /// Stores a checkpoint announcement (in force from `from`) and its relay
    /// entry (the payload is already filed in the relay folder) in one transaction.
    pub fn put_checkpoint(
        &self,
        from: WindowId,
        ann: &PublishCheckpoint,
        entry: &relay::Entry,
    ) -> Result<(), StoreError> {
        let val = postcard::to_stdvec(ann).map_err(|_| StoreError::Corrupt("checkpoint"))?;
        let e = postcard::to_stdvec(entry).map_err(|_| StoreError::Corrupt("relay entry"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(CHECKPOINTS)?.insert(from, val.as_slice())?;
        tx.open_table(RELAY)?.insert(entry.id.0.as_slice(), e.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Removes the announcement stored as in force from `from` (it is stored
    /// again under a later window, [`Store::put_checkpoint`]).
    pub fn delete_checkpoint(&self, from: WindowId) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        tx.open_table(CHECKPOINTS)?.remove(from)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores a relay entry on its own (the genesis checkpoint).
    pub fn put_relay_entry(&self, entry: &relay::Entry) -> Result<(), StoreError> {
        let e = postcard::to_stdvec(entry).map_err(|_| StoreError::Corrupt("relay entry"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(RELAY)?.insert(entry.id.0.as_slice(), e.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Deletes relay entries (checkpoint retention) in one transaction; the
    /// announcements stay (they say which checkpoint each window used).
    pub fn delete_relay_entries(&self, ids: &[ContentId]) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(RELAY)?;
            for id in ids {
                t.remove(id.0.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Every relay entry.
    pub fn relay_entries(&self) -> Result<Vec<relay::Entry>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RELAY)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (_, v) = item?;
            out.push(postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("relay entry"))?);
        }
        Ok(out)
    }

    /// Every checkpoint announcement with the window it is in force from.
    pub fn checkpoints(&self) -> Result<Vec<(WindowId, PublishCheckpoint)>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(CHECKPOINTS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            out.push((k.value(), postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("checkpoint"))?));
        }
        Ok(out)
    }
    /// Stores the signed weights document of interval `doc.body.window`
    /// unless one is already stored (a document, once published, never
    /// changes). Returns whether it was stored.
    pub fn put_weights_doc(&self, doc: &WeightsDoc) -> Result<bool, StoreError> {
        let val = doc.encode();
        let tx = self.db.begin_write()?;
        let stored = {
            let mut t = tx.open_table(WEIGHTS)?;
            if t.get(doc.body.window)?.is_some() {
                false
            } else {
                t.insert(doc.body.window, val.as_slice())?;
                true
            }
        };
        tx.commit()?;
        Ok(stored)
    }

    /// The weights document of interval `window`.
    pub fn weights_doc(&self, window: WindowId) -> Result<Option<WeightsDoc>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(WEIGHTS)?;
        t.get(window)?
            .map(|v| postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("weights document")))
            .transpose()
    }

    /// The latest weights document (of the newest interval signed), if any.
    pub fn latest_weights_doc(&self) -> Result<Option<WeightsDoc>, StoreError> {
        Ok(self.weights_docs(WindowId::MAX, 1)?.pop())
    }

    /// Up to `limit` weights documents of intervals ≤ `upto`, newest first.
    pub fn weights_docs(&self, upto: WindowId, limit: usize) -> Result<Vec<WeightsDoc>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(WEIGHTS)?;
        let mut out = Vec::new();
        for item in t.range(..=upto)?.rev().take(limit) {
            let (_, v) = item?;
            out.push(postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("weights document"))?);
        }
        Ok(out)
    }

    /// Stores the trainer's report for its publication window (a resent
    /// report replaces the earlier one).
    pub fn put_trainer_stats(&self, s: &TrainerStats) -> Result<(), StoreError> {
        let val = postcard::to_stdvec(s).map_err(|_| StoreError::Corrupt("trainer stats"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(TRAINER_STATS)?.insert(s.body.window, val.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// The trainer's reports for publication windows `from..=to`, oldest first.
    pub fn trainer_stats(&self, from: WindowId, to: WindowId) -> Result<Vec<TrainerStats>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(TRAINER_STATS)?;
        let mut out = Vec::new();
        if from > to {
            return Ok(out);
        }
        for item in t.range(from..=to)? {
            let (_, v) = item?;
            out.push(postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("trainer stats"))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(window: WindowId, miner: u8, i: u8) -> Candidate {
        Candidate {
            window,
            checkpoint: ContentId([1; 32]),
            env: EnvId::Arith,
            group: 0,
            index: u32::from(i),
            task_id: 3,
            miner: PublicKey([miner; 32]),
            digest: *blake3::hash(&[miner, i]).as_bytes(),
            content: [i; 32],
            shape: Shape { bytes: 10, ..Shape::RESTORED },
        }
    }

    fn stored(c: &Candidate) -> StoredRollout {
        StoredRollout { candidate: c.clone(), bytes: vec![c.digest[0]; 10] }
    }

    fn all(store: &Store, window: WindowId, miner: Option<&PublicKey>, page: usize) -> Vec<Vec<u8>> {
        let (mut out, mut after) = (Vec::new(), None);
        loop {
            let (items, next) = store.rollouts(window, miner, after, page).unwrap();
            out.extend(items);
            match next {
                Some(n) => after = Some(n),
                None => return out,
            }
        }
    }

    fn check_pages(store: &Store, cands: &[Candidate]) {
        for window in [4, 5] {
            for miner in [None, Some(PublicKey([2; 32]))] {
                let mut want: Vec<&Candidate> =
                    cands.iter().filter(|c| c.window == window && miner.is_none_or(|m| c.miner == m)).collect();
                want.sort_by_key(|c| c.digest);
                let want: Vec<Vec<u8>> = want.into_iter().map(|c| stored(c).bytes).collect();
                for page in [1, 2, 100] {
                    assert_eq!(all(store, window, miner.as_ref(), page), want, "window {window} page {page}");
                }
            }
        }
        let mut back = store.candidates().unwrap();
        back.sort_by_key(|c| (c.window, c.digest));
        let mut want = cands.to_vec();
        want.sort_by_key(|c| (c.window, c.digest));
        assert_eq!(back, want);
        assert_eq!(store.rollout_count().unwrap(), cands.len() as u64);
    }

    #[test]
    fn pages_in_digest_order_by_window_and_miner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let store = Store::open(&path).unwrap();
        let cands: Vec<Candidate> = (0..30).map(|i| cand(4 + u64::from(i % 2), 1 + i % 3, i)).collect();
        // Read between writes: the digest index catches up with the log each time.
        store.put_rollouts(&cands[..4].iter().map(stored).collect::<Vec<_>>()).unwrap();
        check_pages(&store, &cands[..4]);
        store.put_rollouts(&cands[4..9].iter().map(stored).collect::<Vec<_>>()).unwrap();
        store.put_rollouts(&cands[9..20].iter().map(stored).collect::<Vec<_>>()).unwrap();
        check_pages(&store, &cands[..20]);
        drop(store);
        let store = Store::open(&path).unwrap();
        store.put_rollouts(&cands[20..].iter().map(stored).collect::<Vec<_>>()).unwrap();
        check_pages(&store, &cands);
    }

    /// network-security E2: 40 rollouts of 1 MiB (the largest the door
    /// decodes) in one window; a page of up to 256 of them must stay under the
    /// frame limit, and paging must still reach every one.
    #[test]
    fn pages_are_capped_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.redb")).unwrap();
        let big = tributary_protocol::wire::MAX_ROLLOUT_LEN as usize;
        let cands: Vec<Candidate> = (0..40).map(|i| cand(3, 1, i)).collect();
        let rows: Vec<StoredRollout> =
            cands.iter().map(|c| StoredRollout { candidate: c.clone(), bytes: vec![c.digest[0]; big] }).collect();
        store.put_rollouts(&rows).unwrap();
        let (mut seen, mut after, mut pages) = (0, None, 0);
        loop {
            let (items, next) = store.rollouts(3, None, after, 256).unwrap();
            let bytes: usize = items.iter().map(Vec::len).sum();
            assert!(bytes <= PAGE_BYTES, "page of {bytes} bytes");
            assert!(!items.is_empty());
            seen += items.len();
            pages += 1;
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!((seen, pages), (40, 3));
        // One rollout larger than the budget still comes, alone.
        let (items, next) = store.rollouts_within(3, None, None, 256, 10).unwrap();
        assert_eq!(items.len(), 1);
        assert!(next.is_some());
    }

    /// network-security E3: stored rollouts are never deleted (before);
    /// retention removes whole windows, and what is kept still pages.
    #[test]
    fn retention_prunes_old_windows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("c.redb")).unwrap();
        let cands: Vec<Candidate> = (0..30).map(|i| cand(3 + u64::from(i % 3), 1 + i % 2, i)).collect();
        store.put_rollouts(&cands.iter().map(stored).collect::<Vec<_>>()).unwrap();
        assert_eq!(all(&store, 3, None, 7).len(), 10);
        assert_eq!(store.prune_rollouts(5).unwrap(), 20);
        assert!(all(&store, 3, None, 7).is_empty());
        assert!(all(&store, 4, None, 7).is_empty());
        assert_eq!(all(&store, 5, None, 7).len(), 10);
        assert_eq!(store.rollout_count().unwrap(), 10);
        assert!(store.candidates().unwrap().iter().all(|c| c.window == 5));
    }

    #[test]
    fn the_digest_keyed_layout_is_migrated_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let old: Vec<Candidate> = (0..3).map(|i| cand(7, 1, i)).collect();
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut bodies = tx.open_table(LEGACY_ROLLOUTS).unwrap();
                let mut index = tx.open_table(LEGACY_INDEX).unwrap();
                for c in &old {
                    let key = rollout_key(c.window, &c.digest);
                    bodies.insert(key.as_slice(), stored(c).bytes.as_slice()).unwrap();
                    let e = LegacyIndexEntry {
                        miner: c.miner,
                        group: c.group,
                        index: c.index,
                        task_id: c.task_id,
                        content: c.content,
                        checkpoint: c.checkpoint,
                        env: c.env,
                    };
                    index.insert(key.as_slice(), postcard::to_stdvec(&e).unwrap().as_slice()).unwrap();
                }
            }
            tx.commit().unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.rollout_count().unwrap(), 3);
        let new = cand(7, 1, 9);
        store.put_rollouts(&[stored(&new)]).unwrap();
        drop(store);
        // Reopened: the old tables are gone, nothing is moved twice, every rollout pages back.
        let store = Store::open(&path).unwrap();
        let tx = store.db.begin_read().unwrap();
        assert!(
            !tx.list_tables().unwrap().any(|t| t.name() == LEGACY_INDEX.name() || t.name() == LEGACY_ROLLOUTS.name())
        );
        let mut want: Vec<Candidate> = old.iter().chain([&new]).cloned().collect();
        want.sort_by_key(|c| c.digest);
        let mut back = store.candidates().unwrap();
        back.sort_by_key(|c| c.digest);
        assert_eq!(back, want);
        assert_eq!(all(&store, 7, None, 2), want.iter().map(|c| stored(c).bytes).collect::<Vec<_>>());
    }
}
