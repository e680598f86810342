//! Publication: at each window boundary, the new BF16 checkpoint as a signed
//! announcement plus a payload — a sparse delta against the previously
//! published checkpoint, or the full checkpoint every `full_every` windows
//! (and the first time).
//!
//! Layout of the publisher's folder:
//!
//! ```text
//! published.json                 [{window, id, kind, base}] in order (the record)
//! checkpoints/<id>.gguf          the last `keep` published checkpoints (the next delta's base)
//! windows/<window>/announce.bin  postcard(PublishCheckpoint), signed by the trainer
//! windows/<window>/payload       the delta or full GGUF the announcement describes
//! ```
//!
//! Retention ([`Publisher::set_retention`]): the files of the last `keep`
//! publications stay (the last is the next delta's base, the others let the
//! trainer prove rollouts that name them); older ones are deleted after each
//! publication. The record keeps every publication.
//!
//! The record for a window is written (atomically) before its artefacts, and
//! the artefacts are a deterministic function of the record (deltas are
//! deterministic, ed25519 signatures too), so a crash never leads to two
//! different checkpoints for one window: publishing a window again with the
//! same checkpoint re-creates the artefacts, with a different one is refused.

use std::path::{Path, PathBuf};

use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::delta::{self, DeltaError};
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{CheckpointBody, CheckpointKind, NetworkId, PublishCheckpoint};

use crate::state::{StateError, write_atomic};

/// Errors of publication.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// File I/O.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing a file atomically failed.
    #[error("{0}")]
    State(#[from] StateError),
    /// The checkpoint is invalid.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The delta could not be made.
    #[error("delta: {0}")]
    Delta(#[from] DeltaError),
    /// The record is malformed.
    #[error("published.json: {0}")]
    Json(#[from] serde_json::Error),
    /// A different checkpoint was already published for this window.
    #[error("window {window} already published as {existing}, refusing {new}")]
    WindowAlreadyPublished {
        /// The window.
        window: u64,
        /// What was published.
        existing: ContentId,
        /// What was offered now.
        new: ContentId,
    },
    /// Windows must increase.
    #[error("window {window} is before the last published window {last}")]
    WindowRegressed {
        /// The window offered.
        window: u64,
        /// The last published window.
        last: u64,
    },
}

/// One published checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The window it was published for.
    pub window: u64,
    /// Its content id.
    pub id: ContentId,
    /// Delta base, or `None` for a full payload.
    pub base: Option<ContentId>,
}

/// What [`Publisher::publish`] produced.
#[derive(Clone, Debug)]
pub struct Publication {
    /// The signed announcement.
    pub announcement: PublishCheckpoint,
    /// Its payload file.
    pub payload: PathBuf,
    /// The full checkpoint file.
    pub checkpoint: PathBuf,
    /// Payload bytes.
    pub payload_len: u64,
    /// Full checkpoint bytes.
    pub checkpoint_len: u64,
    /// Changed / total elements against the base (deltas only).
    pub changed: Option<(u64, u64)>,
}

/// Publishes one checkpoint per window into a folder.
#[derive(Debug)]
pub struct Publisher {
    dir: PathBuf,
    key: Keypair,
    network: NetworkId,
    full_every: u64,
    records: Vec<Record>,
    keep: usize,
}

impl Publisher {
    /// Opens (or creates) a publisher folder; announcements are signed for
    /// `network`, a full payload every `full_every` publications (at least 1).
    pub fn open(dir: &Path, key: Keypair, network: NetworkId, full_every: u64) -> Result<Self, PublishError> {
        let mk =
            |p: PathBuf| std::fs::create_dir_all(&p).map_err(|source| PublishError::Io { path: p.clone(), source });
        mk(dir.join("checkpoints"))?;
        mk(dir.join("windows"))?;
        let path = dir.join("published.json");
        let records = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(PublishError::Io { path, source }),
        };
        Ok(Publisher { dir: dir.to_owned(), key, network, full_every: full_every.max(1), records, keep: 0 })
    }

    /// Keeps the checkpoint and payload files of the last `keep` publications
    /// (at least the last one); 0 keeps everything.
    pub fn set_retention(&mut self, keep: usize) {
        self.keep = keep;
    }

    /// Deletes the files of publications older than the last `keep`, except a
    /// checkpoint a kept publication also names; returns how many files and
    /// folders went. Called after every publication.
    pub fn prune(&self) -> Result<usize, PublishError> {
        if self.keep == 0 || self.records.len() <= self.keep {
            return Ok(0);
        }
        let (old, kept) = self.records.split_at(self.records.len() - self.keep.max(1));
        let mut removed = 0;
        for rec in old {
            let wdir = self.window_dir(rec.window);
            match std::fs::remove_dir_all(&wdir) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(PublishError::Io { path: wdir, source }),
            }
            if kept.iter().any(|k| k.id == rec.id) {
                continue;
            }
            let cpath = self.checkpoint_path(&rec.id);
            match std::fs::remove_file(&cpath) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(PublishError::Io { path: cpath, source }),
            }
        }
        Ok(removed)
    }

    /// Every publication, oldest first.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Content ids published, oldest first (for staleness checks).
    pub fn published_ids(&self) -> Vec<ContentId> {
        self.records.iter().map(|r| r.id).collect()
    }

    /// The last publication.
    pub fn last(&self) -> Option<&Record> {
        self.records.last()
    }

    /// Path of a published checkpoint.
    pub fn checkpoint_path(&self, id: &ContentId) -> PathBuf {
        self.dir.join("checkpoints").join(format!("{id}.gguf"))
    }

    fn window_dir(&self, window: u64) -> PathBuf {
        self.dir.join("windows").join(window.to_string())
    }

    /// Publishes `gguf` (a BF16 checkpoint file's bytes) for `window`.
    /// Idempotent for the same checkpoint; refuses a different one for a
    /// window already published, and windows before the last.
    pub fn publish(&mut self, window: u64, gguf: Vec<u8>) -> Result<Publication, PublishError> {
        let new = Checkpoint::from_bytes(gguf)?;
        let id = new.content_id();
        if let Some(pos) = self.records.iter().position(|r| r.window == window) {
            let rec = self.records[pos].clone();
            if rec.id != id {
                return Err(PublishError::WindowAlreadyPublished { window, existing: rec.id, new: id });
            }
            return self.artefacts(&rec, &new);
        }
        if let Some(last) = self.records.last()
            && window < last.window
        {
            return Err(PublishError::WindowRegressed { window, last: last.window });
        }
        let cpath = self.checkpoint_path(&id);
        if !cpath.exists() {
            write_atomic(&cpath, new.bytes())?;
        }
        let since_full = self.records.iter().rev().take_while(|r| r.base.is_some()).count() as u64;
        let base = match self.records.last() {
            Some(prev) if since_full + 1 < self.full_every => Some(prev.id),
            _ => None,
        };
        let rec = Record { window, id, base };
        self.records.push(rec.clone());
        if let Err(e) = write_atomic(&self.dir.join("published.json"), &serde_json::to_vec_pretty(&self.records)?) {
            self.records.pop();
            return Err(e.into());
        }
        let publication = self.artefacts(&rec, &new)?;
        match self.prune() {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, keep = self.keep, "old publications pruned"),
            // The publication stands; the next one prunes again.
            Err(e) => tracing::warn!(error = %e, "pruning old publications failed"),
        }
        Ok(publication)
    }

    /// (Re)creates a recorded publication's payload and announcement.
    fn artefacts(&self, rec: &Record, new: &Checkpoint) -> Result<Publication, PublishError> {
        let wdir = self.window_dir(rec.window);
        std::fs::create_dir_all(&wdir).map_err(|source| PublishError::Io { path: wdir.clone(), source })?;
        let (payload, kind, changed) = match rec.base {
            None => (new.bytes().to_vec(), CheckpointKind::Full, None),
            Some(base_id) => {
                let base = Checkpoint::open(&self.checkpoint_path(&base_id))?;
                let bytes = delta::encode(&base, new)?;
                let stats = delta::change_stats(base.bytes(), new.bytes())?;
                (bytes, CheckpointKind::Delta { base: base_id }, Some(stats))
            }
        };
        let body = CheckpointBody {
            id: rec.id,
            kind,
            len: payload.len() as u64,
            payload_hash: *blake3::hash(&payload).as_bytes(),
            window: rec.window,
            trainer: self.key.public(),
        };
        let announcement = PublishCheckpoint::sign(body, &self.key, &self.network);
        let ppath = wdir.join("payload");
        write_atomic(&ppath, &payload)?;
        let announce = postcard::to_stdvec(&announcement).unwrap_or_default();
        write_atomic(&wdir.join("announce.bin"), &announce)?;
        if let Some((c, t)) = changed {
            metrics::gauge!("tributary_trainer_delta_bytes").set(payload.len() as f64);
            metrics::gauge!("tributary_trainer_delta_change_fraction").set(c as f64 / t.max(1) as f64);
        }
        metrics::gauge!("tributary_trainer_published_window").set(rec.window as f64);
        Ok(Publication {
            announcement,
            payload: ppath,
            checkpoint: self.checkpoint_path(&rec.id),
            payload_len: payload.len() as u64,
            checkpoint_len: new.bytes().len() as u64,
            changed,
        })
    }
}
