//! Durable state in one redb file: meta (master secret, genesis), rollouts,
//! verdicts, checkpoints, the signed weights document of every interval and
//! the trainer's signed step reports. A write returns only after its transaction is
//! committed with `Durability::Immediate`, so whatever was acknowledged
//! survives a `kill -9`.

use std::path::Path;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::{PublishCheckpoint, TrainerStats, Verdict, WeightsDoc};
use tributary_protocol::window::WindowId;

use crate::core::Candidate;
use crate::relay;

const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
/// window BE ‖ digest → encoded rollout.
const ROLLOUTS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollouts");
/// window BE ‖ digest → postcard(IndexEntry).
const INDEX: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("rollout_index");
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
    Db(#[from] redb::Error),
    /// A stored value did not decode (corruption or a version mismatch).
    #[error("corrupt stored value in {0}")]
    Corrupt(&'static str),
}

macro_rules! db_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.into()) }
        }
    )*};
}
db_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

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
}

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

/// The coordinator's database.
#[derive(Debug)]
pub struct Store {
    db: Database,
}

impl Store {
    /// Opens (or creates) the database file and its tables.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::create(path)?;
        let tx = db.begin_write()?;
        {
            tx.open_table(META)?;
            tx.open_table(ROLLOUTS)?;
            tx.open_table(INDEX)?;
            tx.open_table(VERDICTS)?;
            tx.open_table(CHECKPOINTS)?;
            tx.open_table(RELAY)?;
            tx.open_table(WEIGHTS)?;
            tx.open_table(TRAINER_STATS)?;
        }
        tx.commit()?;
        Ok(Self { db })
    }

    /// A meta value.
    pub fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(META)?;
        Ok(t.get(key)?.map(|v| v.value().to_vec()))
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

    /// Stores a batch of rollouts in one durable transaction.
    pub fn put_rollouts(&self, batch: &[StoredRollout]) -> Result<(), StoreError> {
        let tx = self.db.begin_write()?;
        {
            let mut rollouts = tx.open_table(ROLLOUTS)?;
            let mut index = tx.open_table(INDEX)?;
            for r in batch {
                let c = &r.candidate;
                let key = rollout_key(c.window, &c.digest);
                rollouts.insert(key.as_slice(), r.bytes.as_slice())?;
                let entry = IndexEntry {
                    miner: c.miner,
                    group: c.group,
                    index: c.index,
                    task_id: c.task_id,
                    content: c.content,
                    checkpoint: c.checkpoint,
                    env: c.env,
                };
                let v = postcard::to_stdvec(&entry).map_err(|_| StoreError::Corrupt("index"))?;
                index.insert(key.as_slice(), v.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Every stored rollout's door facts, for rebuilding the core at startup.
    pub fn candidates(&self) -> Result<Vec<Candidate>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(INDEX)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let key = k.value();
            let (w, d) = key.split_at_checked(8).ok_or(StoreError::Corrupt("index key"))?;
            let window = u64::from_be_bytes(w.try_into().map_err(|_| StoreError::Corrupt("index key"))?);
            let digest: [u8; 32] = d.try_into().map_err(|_| StoreError::Corrupt("index key"))?;
            let e: IndexEntry = postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("index"))?;
            out.push(Candidate {
                window,
                checkpoint: e.checkpoint,
                env: e.env,
                group: e.group,
                index: e.index,
                task_id: e.task_id,
                miner: e.miner,
                digest,
                content: e.content,
            });
        }
        Ok(out)
    }

    /// A page of a window's rollouts (by digest order), optionally of one miner.
    pub fn rollouts(
        &self,
        window: WindowId,
        miner: Option<&PublicKey>,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<(Vec<Vec<u8>>, Option<[u8; 32]>), StoreError> {
        let tx = self.db.begin_read()?;
        let rollouts = tx.open_table(ROLLOUTS)?;
        let index = tx.open_table(INDEX)?;
        let start = match after {
            Some(d) => {
                let mut k = rollout_key(window, &d).to_vec();
                k.push(0);
                k
            }
            None => window.to_be_bytes().to_vec(),
        };
        let end = window.saturating_add(1).to_be_bytes();
        let mut items = Vec::new();
        let mut last = None;
        for item in index.range(start.as_slice()..end.as_slice())? {
            let (k, v) = item?;
            let key = k.value().to_vec();
            if let Some(m) = miner {
                let e: IndexEntry = postcard::from_bytes(v.value()).map_err(|_| StoreError::Corrupt("index"))?;
                if e.miner != *m {
                    continue;
                }
            }
            if items.len() == limit {
                return Ok((items, last));
            }
            let bytes = rollouts.get(key.as_slice())?.ok_or(StoreError::Corrupt("rollouts"))?;
            items.push(bytes.value().to_vec());
            last = key.get(8..40).and_then(|d| d.try_into().ok());
        }
        Ok((items, None))
    }

    /// Number of stored rollouts.
    pub fn rollout_count(&self) -> Result<u64, StoreError> {
        let tx = self.db.begin_read()?;
        Ok(tx.open_table(ROLLOUTS)?.len()?)
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
        Ok(out)
    }

    /// Stores a checkpoint announcement (in force from `from`) and its relay
    /// entry (the payload is already filed in the relay folder) in one transaction.
    pub fn put_checkpoint(&self, from: WindowId, ann: &PublishCheckpoint, entry: &relay::Entry) -> Result<(), StoreError> {
        let val = postcard::to_stdvec(ann).map_err(|_| StoreError::Corrupt("checkpoint"))?;
        let e = postcard::to_stdvec(entry).map_err(|_| StoreError::Corrupt("relay entry"))?;
        let tx = self.db.begin_write()?;
        tx.open_table(CHECKPOINTS)?.insert(from, val.as_slice())?;
        tx.open_table(RELAY)?.insert(entry.id.0.as_slice(), e.as_slice())?;
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
