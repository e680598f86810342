//! Closed windows on object storage (issue 21): a window's rollouts, once its
//! submissions are closed, written as immutable, content-addressed segment
//! objects plus a manifest written last, through the `object_store` crate
//! (the local filesystem by default; S3 and compatible stores by URL).
//!
//! Layout under the store's root (or the URL's prefix):
//!
//! ```text
//! windows/<window, 20 digits>/seg-<blake3 of the object, hex>.bin   postcard(Segment)
//! windows/<window, 20 digits>/manifest.json                        Manifest, written last
//! checkpoints/<content id>.gguf                                     every published checkpoint's full file
//! deltas/<blake3 of the payload>.delta                              every delta the trainer published
//! weights/<window, 20 digits>.bin                                   each signed weights document (postcard)
//! ```
//!
//! Checkpoints, deltas and weights documents are content-addressed by what a
//! reader already trusts (the trainer-signed content id, the payload hash of
//! a path step, the window of a document signed by the coordinator's key):
//! [`tributary_protocol::wire::store_key`] names them, for the coordinator
//! that writes and the miners that download them over HTTP(S) alike.
//!
//! A reader lists nothing: it reads the manifest, then each segment, and
//! checks every segment's bytes against the hash in its name and in the
//! manifest, and the rollout count against the manifest, so a torn or edited
//! object is a typed error, never a silent short window. Writing a window
//! again (after a crash between segments and manifest) writes the same
//! segment names (the content is a deterministic function of the stored
//! window) and then the manifest.
//!
//! The coordinator signs only what it archived (issue 29): the manifest its
//! archiver wrote after the window closed is also kept in the coordinator's
//! own database ([`record_manifest`]), and [`Readers`] sign that record,
//! never bytes read back from the store. A manifest found in the store that
//! disagrees with the coordinator's (planted by anyone who can write to the
//! store) is an alarm — an error log and `tributary_archive_conflicts_total`
//! — and is overwritten; archiving goes on. Every object read back is read
//! with a size limit ([`ArchiveError::TooLarge`]), and a window is written
//! segment by segment ([`WindowWriter`]): at most one segment in memory.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::io::AsyncReadExt;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    ManifestBody, ManifestSegment, NetworkId, SegmentObject, SignedManifest, WeightsDoc, store_segment_key,
    store_weights_key,
};

/// The manifest format written by this build. Version 2: rollouts in
/// (miner, digest) order, each segment with its first and last miner, so a
/// reader fetches only the segments of the miners it wants. Version 1
/// manifests (digest order, no miner ranges) are still read whole.
pub const MANIFEST_VERSION: u32 = 2;

/// How long a presigned segment URL handed to a reader works.
pub const PRESIGN_SECS: u64 = 3600;

/// The most rollout bytes in one segment object.
pub const SEGMENT_BYTES: usize = 64 << 20;

/// Errors of the archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The store URL is not one this build understands.
    #[error(
        "object store `{0}`: expected file:///ABSOLUTE/PATH or a folder path (s3:// needs the coordinator's `s3` feature)"
    )]
    Url(String),
    /// The object store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A segment's bytes do not match its content address.
    #[error("window {window}: segment {key} does not match its hash")]
    Corrupt {
        /// The window.
        window: WindowId,
        /// The object key.
        key: String,
    },
    /// A manifest or segment does not decode, or disagrees with itself.
    #[error("window {window}: {what}")]
    Malformed {
        /// The window.
        window: WindowId,
        /// What is wrong.
        what: String,
    },
    /// An object is larger than a reader of its kind takes: nothing of it
    /// was kept.
    #[error("object {key} is larger than {max} bytes")]
    TooLarge {
        /// The object key.
        key: String,
        /// The most bytes read.
        max: u64,
    },
    /// A local file to be stored could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A local file is not the content its object key names (its length or
    /// blake3 differs from the relay's record): nothing was stored.
    #[error("{path} is not the content of {key} (length or hash differs)")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The object key it was to be stored under.
        key: String,
    },
}

/// Bytes read from a local file per part of a streamed upload.
const PART_BYTES: usize = 8 << 20;

/// The largest manifest object read back (a manifest lists at most
/// [`tributary_protocol::wire::MAX_MANIFEST_SEGMENTS`] segments of a few
/// hundred bytes each).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// One segment as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentEntry {
    /// The object key, relative to the store's root.
    pub key: String,
    /// blake3 of the object's bytes, hex (also in the key).
    pub blake3: String,
    /// The object's size in bytes.
    pub bytes: u64,
    /// Rollouts in it.
    pub rollouts: u64,
    /// The miner of its first and of its last rollout, hex (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub miners: Option<(String, String)>,
}

/// A closed window's manifest: everything a reader needs to fetch and verify
/// the window's rollouts.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// The window.
    pub window: WindowId,
    /// Rollouts in the window (the sum over segments).
    pub rollouts: u64,
    /// The segments, in the order of the stored window (rollout digest order).
    pub segments: Vec<SegmentEntry>,
}

/// A segment object: encoded rollouts, each exactly as the miner signed it
/// ([`SegmentObject`], shared with readers).
type Segment = SegmentObject;

/// Closed windows in an object store.
#[derive(Clone, Debug)]
pub struct Archive {
    store: Arc<dyn ObjectStore>,
    url: String,
    /// Presigns GET URLs (S3): the signer and the key prefix under it.
    signer: Option<(Presigner, String)>,
}

/// What presigns GET URLs: S3's signer (the `s3` feature); nothing otherwise.
#[cfg(feature = "s3")]
type Presigner = Arc<dyn object_store::signer::Signer>;
/// What presigns GET URLs: S3's signer (the `s3` feature); nothing otherwise.
#[cfg(not(feature = "s3"))]
type Presigner = std::convert::Infallible;

fn window_dir(window: WindowId) -> String {
    format!("windows/{window:020}")
}

fn manifest_key(window: WindowId) -> Path {
    Path::from(format!("{}/manifest.json", window_dir(window)))
}

impl Archive {
    /// Opens the store a URL names: `file:///ABSOLUTE/PATH` or a plain folder
    /// path (created if missing); with the `s3` feature also
    /// `s3://BUCKET[/PREFIX]`, configured from the environment
    /// (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`).
    pub fn open(url: &str) -> Result<Self, ArchiveError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            return Self::open_s3(url, rest);
        }
        let dir = url.strip_prefix("file://").unwrap_or(url);
        if dir.is_empty() || url.contains("://") && !url.starts_with("file://") {
            return Err(ArchiveError::Url(url.to_owned()));
        }
        Self::local(FsPath::new(dir))
    }

    /// A store in a local folder (created if missing).
    pub fn local(dir: &FsPath) -> Result<Self, ArchiveError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            ArchiveError::Store(object_store::Error::Generic { store: "LocalFileSystem", source: e.into() })
        })?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
        Ok(Self { store: Arc::new(store), url: format!("file://{}", dir.display()), signer: None })
    }

    #[cfg(not(feature = "s3"))]
    fn open_s3(url: &str, _rest: &str) -> Result<Self, ArchiveError> {
        Err(ArchiveError::Url(url.to_owned()))
    }

    #[cfg(feature = "s3")]
    fn open_s3(url: &str, rest: &str) -> Result<Self, ArchiveError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ArchiveError::Url(url.to_owned()));
        }
        let s3 = Arc::new(object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).build()?);
        let prefix = prefix.trim_end_matches('/');
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            s3.clone()
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(s3.clone(), prefix))
        };
        Ok(Self { store, url: url.to_owned(), signer: Some((s3, prefix.to_owned())) })
    }

    /// The store's URL, for logs.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes `window`'s rollouts (each encoded as stored, with its miner),
    /// segments first and the manifest last; returns the manifest. Rollouts
    /// are kept in (miner, given) order: give each miner's in digest order.
    /// Idempotent for the same rollouts; over a manifest that differs (a
    /// planted one, say) it alarms and writes its own ([`WindowWriter::finish`]).
    /// Holds every rollout: the archiver streams through [`Archive::window_writer`].
    pub async fn put_window(
        &self,
        window: WindowId,
        mut rollouts: Vec<(PublicKey, Vec<u8>)>,
    ) -> Result<Manifest, ArchiveError> {
        rollouts.sort_by_key(|(m, _)| *m);
        let mut w = self.window_writer(window);
        for (m, r) in rollouts {
            w.push(m, r).await?;
        }
        w.finish().await
    }

    /// A writer of `window`'s segments, fed rollouts in miner order.
    pub fn window_writer(&self, window: WindowId) -> WindowWriter<'_> {
        WindowWriter {
            archive: self,
            window,
            segments: Vec::new(),
            total: 0,
            chunk: Vec::new(),
            chunk_bytes: 0,
            first: None,
            last: None,
        }
    }

    /// Reads an object whole, at most `max` bytes of it (a larger one is
    /// [`ArchiveError::TooLarge`] before its body is read); `None` if absent.
    async fn read_capped(&self, key: &str, max: u64) -> Result<Option<Vec<u8>>, ArchiveError> {
        let r = match self.store.get(&Path::from(key)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let too_large = || ArchiveError::TooLarge { key: key.to_owned(), max };
        if r.meta.size > max {
            return Err(too_large());
        }
        let bytes = r.bytes().await?;
        if bytes.len() as u64 > max {
            return Err(too_large());
        }
        Ok(Some(bytes.to_vec()))
    }

    /// `window`'s manifest, or `None` if the window is not archived (yet).
    /// Read with a limit of [`MAX_MANIFEST_BYTES`]. What the store holds is
    /// not what readers are handed: they get the coordinator's own record
    /// ([`recorded_manifest`]).
    pub async fn manifest(&self, window: WindowId) -> Result<Option<Manifest>, ArchiveError> {
        let Some(bytes) = self.read_capped(manifest_key(window).as_ref(), MAX_MANIFEST_BYTES).await? else {
            return Ok(None);
        };
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| ArchiveError::Malformed { window, what: format!("manifest: {e}") })?;
        if m.version != MANIFEST_VERSION && m.version != 1 {
            return Err(ArchiveError::Malformed {
                window,
                what: format!("manifest version {} (this build reads {MANIFEST_VERSION})", m.version),
            });
        }
        if m.window != window || m.segments.iter().map(|s| s.rollouts).sum::<u64>() != m.rollouts {
            return Err(ArchiveError::Malformed { window, what: "manifest disagrees with itself".into() });
        }
        Ok(Some(m))
    }

    /// One segment's rollouts, checked against the manifest's entry.
    pub async fn read_segment(&self, window: WindowId, entry: &SegmentEntry) -> Result<Vec<Vec<u8>>, ArchiveError> {
        let expected = format!("{}/seg-{}.bin", window_dir(window), entry.blake3);
        if entry.key != expected {
            return Err(ArchiveError::Malformed { window, what: format!("segment key {} is not its hash", entry.key) });
        }
        if entry.bytes > tributary_protocol::wire::MAX_SEGMENT_BYTES {
            return Err(ArchiveError::TooLarge {
                key: entry.key.clone(),
                max: tributary_protocol::wire::MAX_SEGMENT_BYTES,
            });
        }
        let bytes = self.read_capped(&entry.key, entry.bytes).await?.ok_or_else(|| {
            ArchiveError::Store(object_store::Error::NotFound {
                path: entry.key.clone(),
                source: "segment listed in the manifest is missing".into(),
            })
        })?;
        if bytes.len() as u64 != entry.bytes || blake3::hash(&bytes).to_hex().as_str() != entry.blake3 {
            return Err(ArchiveError::Corrupt { window, key: entry.key.clone() });
        }
        let seg = Segment::decode(&bytes)
            .map_err(|e| ArchiveError::Malformed { window, what: format!("segment {}: {e}", entry.key) })?;
        if seg.window != window || seg.rollouts.len() as u64 != entry.rollouts {
            return Err(ArchiveError::Malformed {
                window,
                what: format!("segment {} disagrees with the manifest", entry.key),
            });
        }
        Ok(seg.rollouts)
    }

    /// Whether the store holds an object of `len` bytes at `key` (the key
    /// names the content, so its size is the check a writer can afford).
    pub async fn holds(&self, key: &str, len: u64) -> Result<bool, ArchiveError> {
        match self.store.head(&Path::from(key)).await {
            Ok(meta) => Ok(meta.size == len),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Stores the local file `file` at `key` unless the store holds `len`
    /// bytes there already; returns whether it wrote. The file is streamed in
    /// parts (a checkpoint need not fit in memory) and checked on the way
    /// against `len` and `hash`: a file that is not that content aborts the
    /// upload ([`ArchiveError::Mismatch`]), so the store never holds other
    /// bytes under a content address. An object of another size there (an
    /// edit, a different writer) is replaced.
    pub async fn put_file(&self, key: &str, file: &FsPath, len: u64, hash: &[u8; 32]) -> Result<bool, ArchiveError> {
        if self.holds(key, len).await? {
            return Ok(false);
        }
        let io = |source| ArchiveError::Io { path: file.to_owned(), source };
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let upload = self.store.put_multipart(&Path::from(key)).await?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; PART_BYTES];
        let mut total = 0u64;
        let read: Result<(), ArchiveError> = async {
            loop {
                let n = f.read(&mut buf).await.map_err(io)?;
                if n == 0 {
                    return Ok(());
                }
                total += n as u64;
                if total > len {
                    return Err(ArchiveError::Mismatch { path: file.to_owned(), key: key.to_owned() });
                }
                hasher.update(&buf[..n]);
                w.wait_for_capacity(2).await?;
                w.write(&buf[..n]);
            }
        }
        .await;
        let whole = total == len && hasher.finalize().as_bytes() == hash;
        match read {
            Ok(()) if whole => {
                w.finish().await?;
                Ok(true)
            }
            res => {
                if let Err(e) = w.abort().await {
                    tracing::warn!(error = %e, key, "aborting a refused upload");
                }
                res?;
                Err(ArchiveError::Mismatch { path: file.to_owned(), key: key.to_owned() })
            }
        }
    }

    /// Stores a signed weights document under [`store_weights_key`] (its
    /// postcard encoding); idempotent.
    pub async fn put_weights(&self, doc: &WeightsDoc) -> Result<(), ArchiveError> {
        let bytes = doc.encode();
        let key = store_weights_key(doc.body.window);
        if self.holds(&key, bytes.len() as u64).await? {
            return Ok(());
        }
        self.store.put(&Path::from(key), PutPayload::from(bytes)).await?;
        Ok(())
    }

    /// The signed weights document of `window` as stored, or `None`. The
    /// caller checks its signature ([`WeightsDoc::verify`]).
    /// Read with a limit of [`tributary_protocol::wire::MAX_WEIGHTS_DOC_LEN`].
    pub async fn weights(&self, window: WindowId) -> Result<Option<WeightsDoc>, ArchiveError> {
        let max = u64::from(tributary_protocol::wire::MAX_WEIGHTS_DOC_LEN);
        let Some(bytes) = self.read_capped(&store_weights_key(window), max).await? else { return Ok(None) };
        let doc: WeightsDoc = postcard::from_bytes(&bytes)
            .map_err(|e| ArchiveError::Malformed { window, what: format!("weights document: {e}") })?;
        if doc.body.window != window {
            return Err(ArchiveError::Malformed { window, what: "weights document of another window".into() });
        }
        Ok(Some(doc))
    }

    /// An object's bytes (a checkpoint, a delta), at most `max` of them
    /// ([`ArchiveError::TooLarge`] past it), or `None` if absent.
    pub async fn get(&self, key: &str, max: u64) -> Result<Option<Vec<u8>>, ArchiveError> {
        self.read_capped(key, max).await
    }

    /// Every rollout of an archived window, in order, or `None` if the window
    /// is not archived.
    pub async fn read_window(&self, window: WindowId) -> Result<Option<Vec<Vec<u8>>>, ArchiveError> {
        let Some(m) = self.manifest(window).await? else { return Ok(None) };
        let mut out = Vec::with_capacity(usize::try_from(m.rollouts).unwrap_or(0));
        for s in &m.segments {
            out.extend(self.read_segment(window, s).await?);
        }
        Ok(Some(out))
    }
}

/// Writes one window's segments as rollouts arrive (in miner order), each
/// segment as soon as the next rollout would not fit in it: at most one
/// segment's rollouts (and its encoding) are held, not the window.
#[derive(Debug)]
pub struct WindowWriter<'a> {
    archive: &'a Archive,
    window: WindowId,
    segments: Vec<SegmentEntry>,
    total: u64,
    chunk: Vec<Vec<u8>>,
    chunk_bytes: usize,
    first: Option<PublicKey>,
    last: Option<PublicKey>,
}

impl WindowWriter<'_> {
    /// Adds `miner`'s next rollout (miners in key order, each one's in
    /// digest order); writes the segment before it first when the rollout
    /// would make it pass [`SEGMENT_BYTES`].
    pub async fn push(&mut self, miner: PublicKey, rollout: Vec<u8>) -> Result<(), ArchiveError> {
        if self.last.is_some_and(|l| miner < l) {
            return Err(ArchiveError::Malformed { window: self.window, what: "rollouts out of miner order".into() });
        }
        if !self.chunk.is_empty() && self.chunk_bytes + rollout.len() > SEGMENT_BYTES {
            self.flush().await?;
        }
        self.first.get_or_insert(miner);
        self.last = Some(miner);
        self.chunk_bytes += rollout.len();
        self.chunk.push(rollout);
        Ok(())
    }

    /// Rollout bytes held for the segment not written yet.
    pub fn held_bytes(&self) -> usize {
        self.chunk_bytes
    }

    async fn flush(&mut self) -> Result<(), ArchiveError> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let seg = Segment { window: self.window, rollouts: std::mem::take(&mut self.chunk) };
        self.chunk_bytes = 0;
        let miners = self.first.take().zip(self.last).map(|(f, l)| (hex::encode(f.0), hex::encode(l.0)));
        let bytes = seg.encode();
        let rollouts = seg.rollouts.len() as u64;
        drop(seg);
        let hash = blake3::hash(&bytes);
        let key = store_segment_key(self.window, hash.as_bytes());
        let entry = SegmentEntry {
            key: key.clone(),
            blake3: hash.to_hex().to_string(),
            bytes: bytes.len() as u64,
            rollouts,
            miners,
        };
        self.archive.store.put(&Path::from(key), PutPayload::from(bytes)).await?;
        self.total += rollouts;
        self.segments.push(entry);
        Ok(())
    }

    /// Writes the last segment, then the manifest; returns it. A manifest
    /// already in the store that is the same is left; one that differs, or
    /// does not read, was not written by this coordinator for this content
    /// (a planted one, an edit): an alarm (error log,
    /// `tributary_archive_conflicts_total`), and it is overwritten with the
    /// coordinator's own, so archiving goes on.
    pub async fn finish(mut self) -> Result<Manifest, ArchiveError> {
        self.flush().await?;
        let window = self.window;
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            window,
            rollouts: self.total,
            segments: std::mem::take(&mut self.segments),
        };
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| ArchiveError::Malformed { window, what: format!("manifest: {e}") })?;
        let found = match self.archive.manifest(window).await {
            Ok(None) => None,
            Ok(Some(old)) if old == manifest => return Ok(manifest),
            Ok(Some(old)) => Some(format!("{} rollouts in {} segments", old.rollouts, old.segments.len())),
            Err(e @ (ArchiveError::Malformed { .. } | ArchiveError::TooLarge { .. })) => Some(e.to_string()),
            Err(e) => return Err(e),
        };
        if let Some(found) = found {
            metrics::counter!("tributary_archive_conflicts_total").increment(1);
            tracing::error!(
                window,
                found,
                ours = manifest.rollouts,
                store = self.archive.url(),
                "the object store holds a manifest this coordinator did not write for this window \
                 (someone else can write to the store): it is replaced, and only the coordinator's \
                 own record is ever signed"
            );
        }
        self.archive.store.put(&manifest_key(window), PutPayload::from(bytes)).await?;
        Ok(manifest)
    }
}

impl Archive {
    /// GET URLs for `keys` that a reader without credentials can follow, and
    /// when they expire (ms since the epoch, 0: never): presigned for
    /// [`PRESIGN_SECS`] when the store can sign (S3), else under
    /// `public_base` (the configured `store_url`), else `None`.
    pub async fn reader_urls(
        &self,
        keys: &[&str],
        public_base: Option<&str>,
        now_ms: u64,
    ) -> Option<(Vec<String>, u64)> {
        // Without the `s3` feature nothing presigns.
        #[cfg(not(feature = "s3"))]
        let _ = (&self.signer, now_ms);
        #[cfg(feature = "s3")]
        if let Some((signer, prefix)) = &self.signer {
            let expires = std::time::Duration::from_secs(PRESIGN_SECS);
            let mut urls = Vec::with_capacity(keys.len());
            for k in keys {
                let path = if prefix.is_empty() { Path::from(*k) } else { Path::from(format!("{prefix}/{k}")) };
                match signer.signed_url(object_store::signer::Method::GET, &path, expires).await {
                    Ok(u) => urls.push(u.to_string()),
                    Err(e) => {
                        tracing::warn!(error = %e, key = k, "presigning a segment URL failed");
                        return None;
                    }
                }
            }
            return Some((urls, now_ms + PRESIGN_SECS * 1000));
        }
        let base = public_base?.trim_end_matches('/');
        Some((keys.iter().map(|k| format!("{base}/{k}")).collect(), 0))
    }
}

impl Manifest {
    /// The manifest as the coordinator signs it for readers; `None` for a
    /// version 1 manifest (no miner ranges) or one that does not convert.
    pub fn signed(&self, key: &Keypair) -> Option<SignedManifest> {
        let mut segments = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            let (first, last) = s.miners.as_ref()?;
            let miner = |h: &str| hex::decode(h).ok()?.try_into().ok().map(PublicKey);
            segments.push(ManifestSegment {
                key: s.key.clone(),
                blake3: hex::decode(&s.blake3).ok()?.try_into().ok()?,
                bytes: s.bytes,
                rollouts: s.rollouts,
                first_miner: miner(first)?,
                last_miner: miner(last)?,
            });
        }
        let body = ManifestBody { window: self.window, rollouts: self.rollouts, segments, coordinator: key.public() };
        Some(SignedManifest::sign(body, key, &NetworkId::of(&key.public())))
    }
}

/// Manifests signed for readers, newest windows kept.
const MANIFEST_CACHE: usize = 64;

/// The prefix of the store's meta keys holding each archived window's
/// manifest as the coordinator wrote it (the record readers are signed).
pub const MANIFEST_RECORD_PREFIX: &str = "archived_manifest/";

/// Archived windows whose manifest records are kept behind the archive's
/// progress (readers of older windows read from the coordinator, or not at all).
pub const MANIFEST_RECORDS_KEPT: u64 = 1024;

/// Records `m` as the manifest this coordinator archived for its window:
/// the only manifest [`Readers`] sign. Written by the archiver after the
/// window closed and its segments and manifest are in the store.
pub fn record_manifest(store: &crate::store::Store, m: &Manifest) -> Result<(), crate::store::StoreError> {
    // A manifest always serializes (strings and numbers).
    let bytes = serde_json::to_vec(m).unwrap_or_default();
    store.put_meta(&format!("{MANIFEST_RECORD_PREFIX}{}", m.window), &bytes)
}

/// The manifest this coordinator recorded for `window`, or `None`.
pub fn recorded_manifest(
    store: &crate::store::Store,
    window: WindowId,
) -> Result<Option<Manifest>, crate::store::StoreError> {
    let Some(bytes) = store.meta(&format!("{MANIFEST_RECORD_PREFIX}{window}"))? else { return Ok(None) };
    match serde_json::from_slice::<Manifest>(&bytes) {
        Ok(m) if m.window == window => Ok(Some(m)),
        Ok(_) | Err(_) => {
            tracing::error!(window, "the recorded manifest of an archived window does not decode");
            Ok(None)
        }
    }
}

/// Deletes the manifest records of windows before `before`.
pub fn prune_manifest_records(store: &crate::store::Store, before: WindowId) -> Result<u64, crate::store::StoreError> {
    store.prune_window_meta(MANIFEST_RECORD_PREFIX, before)
}

/// What the coordinator hands validators and the trainer so that they read
/// closed windows from the store ([`tributary_protocol::wire::WindowManifest`]).
#[derive(Debug)]
pub struct Readers {
    archive: Archive,
    records: Arc<crate::store::Store>,
    public_base: Option<String>,
    cache: std::sync::Mutex<std::collections::BTreeMap<WindowId, Arc<SignedManifest>>>,
}

impl Readers {
    /// Readers of `archive`, whose objects are public under `public_base`
    /// (the configured `store_url`) unless the store presigns; the manifests
    /// signed are the ones recorded in `records` ([`record_manifest`]).
    pub fn new(archive: Archive, records: Arc<crate::store::Store>, public_base: Option<String>) -> Self {
        Self { archive, records, public_base, cache: Default::default() }
    }

    /// The answer to a reader's [`tributary_protocol::wire::GetWindowManifest`]
    /// for `window`: the signed manifest and a URL per segment, or no
    /// manifest (not archived yet, a version 1 manifest, no URL a reader can
    /// use, or the record failed to read: the reader fetches from the
    /// coordinator). The manifest is the coordinator's own record of what
    /// its archiver wrote after the window closed, never the store's
    /// `manifest.json`: whoever can write to the store cannot get a window
    /// signed.
    pub async fn answer(
        &self,
        window: WindowId,
        key: &Keypair,
        now_ms: u64,
    ) -> tributary_protocol::wire::WindowManifest {
        let none = tributary_protocol::wire::WindowManifest { window, manifest: None, urls: vec![], expires_ms: 0 };
        let cached = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&window).cloned();
        let signed = match cached {
            Some(m) => m,
            None => {
                let m = match recorded_manifest(&self.records, window) {
                    Ok(Some(m)) => m,
                    Ok(None) => return none,
                    Err(e) => {
                        tracing::warn!(window, error = %e, "reading an archived window's record for a reader");
                        return none;
                    }
                };
                let Some(signed) = m.signed(key) else { return none };
                let signed = Arc::new(signed);
                let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                c.insert(window, signed.clone());
                while c.len() > MANIFEST_CACHE {
                    c.pop_first();
                }
                signed
            }
        };
        let keys: Vec<&str> = signed.body.segments.iter().map(|s| s.key.as_str()).collect();
        let Some((urls, expires_ms)) = self.archive.reader_urls(&keys, self.public_base.as_deref(), now_ms).await
        else {
            return none;
        };
        tributary_protocol::wire::WindowManifest { window, manifest: Some((*signed).clone()), urls, expires_ms }
    }
}

/// What `check-config` says of the object store settings: `key=value`
/// lines (`archive`, `store_url`, `readers`: how validators and the trainer
/// read closed windows), or why they would not work. Opens nothing and
/// sends nothing: `archive` must be a folder, `file:///ABSOLUTE/PATH` or (a
/// build with the `s3` feature) `s3://BUCKET[/PREFIX]` with `AWS_*`
/// credentials in the environment; `store_url` must be an `http(s)://`
/// base URL with a host (and a numeric port, if any) and no query or
/// fragment (object keys are appended to it), and needs `archive`.
pub fn check_settings(archive: Option<&str>, store_url: Option<&str>) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    let mut s3 = false;
    match archive {
        None => lines.push("archive=-".to_string()),
        Some(url) => {
            if let Some(rest) = url.strip_prefix("s3://") {
                if !cfg!(feature = "s3") {
                    return Err(format!("archive `{url}`: this coordinator is built without the `s3` feature"));
                }
                if rest.split('/').next().is_none_or(str::is_empty) {
                    return Err(format!("archive `{url}`: expected s3://BUCKET[/PREFIX]"));
                }
                let missing: Vec<&str> = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
                    .into_iter()
                    .filter(|v| std::env::var(v).map_or(true, |x| x.is_empty()))
                    .collect();
                if !missing.is_empty() {
                    return Err(format!("archive `{url}`: {} not set in the environment", missing.join(", ")));
                }
                s3 = true;
            } else if url.contains("://") && !url.starts_with("file://") || url.is_empty() {
                return Err(ArchiveError::Url(url.to_owned()).to_string());
            } else if url.strip_prefix("file://").is_some_and(|p| !p.starts_with('/')) {
                return Err(format!("archive `{url}`: file:// needs an absolute path (file:///...)"));
            }
            lines.push(format!("archive={url}"));
        }
    }
    match store_url {
        None => lines.push("store_url=-".to_string()),
        Some(url) => {
            if archive.is_none() {
                return Err(format!("store_url `{url}`: needs `archive` (the store it is the public URL of)"));
            }
            let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
            let Some(rest) = rest else {
                return Err(format!("store_url `{url}`: expected http:// or https://"));
            };
            let host = rest.split('/').next().unwrap_or("");
            let (name, port) = match host.rsplit_once(':') {
                Some((n, p)) if !n.ends_with(']') || host.starts_with('[') => (n, Some(p)),
                _ => (host, None),
            };
            if url.len() > tributary_protocol::wire::MAX_STORE_URL_LEN
                || name.is_empty()
                || port.is_some_and(|p| p.parse::<u16>().is_err())
                || url.contains(['?', '#'])
                || url.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(format!(
                    "store_url `{url}`: expected http(s)://HOST[:PORT][/PATH], no query or fragment, at most {} bytes",
                    tributary_protocol::wire::MAX_STORE_URL_LEN
                ));
            }
            lines.push(format!("store_url={url}"));
        }
    }
    let readers = if s3 {
        "presigned"
    } else if store_url.is_some() {
        "store_url"
    } else {
        "coordinator"
    };
    lines.push(format!("readers={readers}"));
    Ok(lines)
}

/// The store's meta key holding the first window not yet archived (8 bytes LE).
pub const ARCHIVED_UPTO: &str = "archived_upto";

/// The first window not yet archived, per the store (`None`: archiving never ran).
pub fn archived_upto(store: &crate::store::Store) -> Result<Option<WindowId>, crate::store::StoreError> {
    Ok(store.meta(ARCHIVED_UPTO)?.and_then(|v| v.try_into().ok()).map(u64::from_le_bytes))
}

/// The store's meta key holding the first window whose weights document is
/// not stored yet (8 bytes LE).
pub const WEIGHTS_STORED_UPTO: &str = "weights_stored_upto";

/// Weights documents written to the store per pass at most (older ones on a
/// first pass stay in redb only).
pub const WEIGHTS_PER_PASS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` rollouts of `len` bytes, ten per miner, in miner order.
    fn rollouts(n: usize, len: usize) -> Vec<(PublicKey, Vec<u8>)> {
        (0..n).map(|i| (PublicKey([(i / 10) as u8; 32]), (0..len).map(|j| (i * 31 + j) as u8).collect())).collect()
    }

    fn bytes(rs: &[(PublicKey, Vec<u8>)]) -> Vec<Vec<u8>> {
        rs.iter().map(|(_, r)| r.clone()).collect()
    }

    #[tokio::test]
    async fn a_window_round_trips_through_the_local_store_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::open(dir.path().join("objects").to_str().unwrap()).unwrap();
        assert_eq!(a.manifest(7).await.unwrap(), None);
        assert_eq!(a.read_window(7).await.unwrap(), None);
        let rs = rollouts(50, 1000);
        let m = a.put_window(7, rs.clone()).await.unwrap();
        assert_eq!(m.rollouts, 50);
        assert_eq!(a.read_window(7).await.unwrap(), Some(bytes(&rs)));
        // Again with the same rollouts: the same manifest.
        assert_eq!(a.put_window(7, rs.clone()).await.unwrap(), m);
        // Another handle on the same folder (a reader elsewhere) reads it.
        let b = Archive::open(&format!("file://{}", dir.path().join("objects").display())).unwrap();
        assert_eq!(b.read_window(7).await.unwrap(), Some(bytes(&rs)));
        // An empty window has a manifest with no segments.
        let e = a.put_window(8, Vec::new()).await.unwrap();
        assert_eq!((e.rollouts, e.segments.len()), (0, 0));
        assert_eq!(a.read_window(8).await.unwrap(), Some(Vec::new()));
    }

    #[tokio::test]
    async fn large_windows_split_into_segments_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(dir.path()).unwrap();
        // 3 rollouts of 30 MiB, given out of miner order: two segments (64
        // MiB holds two), in miner order, each naming its first and last miner.
        let rs: Vec<(PublicKey, Vec<u8>)> =
            [2u8, 0, 1].iter().map(|&i| (PublicKey([i; 32]), vec![i; 30 << 20])).collect();
        let m = a.put_window(1, rs.clone()).await.unwrap();
        assert_eq!(m.segments.iter().map(|s| s.rollouts).collect::<Vec<_>>(), [2, 1]);
        let k = |i: u8| hex::encode([i; 32]);
        assert_eq!(m.segments[0].miners, Some((k(0), k(1))));
        assert_eq!(m.segments[1].miners, Some((k(2), k(2))));
        let sorted: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 30 << 20]).collect();
        assert_eq!(a.read_window(1).await.unwrap(), Some(sorted));
    }

    #[tokio::test]
    async fn an_edited_or_torn_object_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(dir.path()).unwrap();
        let m = a.put_window(3, rollouts(10, 100)).await.unwrap();
        let seg = dir.path().join(&m.segments[0].key);
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&seg, &bytes).unwrap();
        assert!(matches!(a.read_window(3).await, Err(ArchiveError::Corrupt { window: 3, .. })));
        bytes.truncate(10);
        std::fs::write(&seg, &bytes).unwrap();
        assert!(matches!(a.read_window(3).await, Err(ArchiveError::Corrupt { window: 3, .. })));
        std::fs::remove_file(&seg).unwrap();
        assert!(matches!(a.read_window(3).await, Err(ArchiveError::Store(_))));
        // A manifest that lies about its counts, or from another version.
        let mpath = dir.path().join("windows/00000000000000000003/manifest.json");
        let mut bad = m.clone();
        bad.rollouts += 1;
        std::fs::write(&mpath, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(matches!(a.manifest(3).await, Err(ArchiveError::Malformed { window: 3, .. })));
        let mut v3 = m.clone();
        v3.version = MANIFEST_VERSION + 1;
        std::fs::write(&mpath, serde_json::to_vec(&v3).unwrap()).unwrap();
        assert!(matches!(a.manifest(3).await, Err(ArchiveError::Malformed { window: 3, .. })));
        std::fs::write(&mpath, b"{not json").unwrap();
        assert!(matches!(a.manifest(3).await, Err(ArchiveError::Malformed { window: 3, .. })));
    }

    fn records(dir: &FsPath) -> Arc<crate::store::Store> {
        Arc::new(crate::store::Store::open(&dir.join("coordinator.redb")).unwrap())
    }

    #[tokio::test]
    async fn readers_get_a_signed_manifest_with_a_url_per_segment() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(&dir.path().join("objects")).unwrap();
        let db = records(dir.path());
        let key = Keypair::generate();
        let m = a.put_window(4, rollouts(30, 100)).await.unwrap();
        record_manifest(&db, &m).unwrap();
        // No URL a reader can follow (a local store, no store_url): no manifest.
        let none = Readers::new(a.clone(), db.clone(), None).answer(4, &key, 1).await;
        assert_eq!((none.manifest, none.urls.len()), (None, 0));
        let r = Readers::new(a.clone(), db.clone(), Some("https://cdn.example/net/".into()));
        let ans = r.answer(4, &key, 1).await;
        let signed = ans.checked(4, &key.public()).unwrap().unwrap();
        assert_eq!(signed.body.rollouts, 30);
        assert_eq!(
            ans.urls,
            m.segments.iter().map(|s| format!("https://cdn.example/net/{}", s.key)).collect::<Vec<_>>()
        );
        assert_eq!(ans.expires_ms, 0);
        // Another key, another window, a window not archived: refused or none.
        assert!(ans.checked(4, &Keypair::generate().public()).is_err());
        assert!(ans.checked(5, &key.public()).is_err());
        assert_eq!(r.answer(9, &key, 1).await.manifest, None);
        // A version 1 manifest (no miner ranges) is not handed to readers.
        let mut v1 = m.clone();
        v1.version = 1;
        v1.segments.iter_mut().for_each(|s| s.miners = None);
        assert!(v1.signed(&key).is_none());
    }

    /// Issue 29 item 4: a manifest in the store that this coordinator did
    /// not record is never signed, and a record is signed as recorded,
    /// whatever the store's `manifest.json` says.
    #[tokio::test]
    async fn readers_sign_only_the_coordinators_own_record() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(&dir.path().join("objects")).unwrap();
        let db = records(dir.path());
        let key = Keypair::generate();
        let r = Readers::new(a.clone(), db.clone(), Some("https://cdn.example/".into()));
        // Planted: a whole window in the store, no record.
        a.put_window(6, rollouts(3, 100)).await.unwrap();
        assert_eq!(r.answer(6, &key, 1).await.manifest, None, "a planted manifest was signed");
        // The coordinator's record (no rollouts) is what readers get, though
        // the store still holds the planted manifest.
        let ours = Manifest { version: MANIFEST_VERSION, window: 6, rollouts: 0, segments: vec![] };
        record_manifest(&db, &ours).unwrap();
        let ans = r.answer(6, &key, 1).await;
        assert_eq!(ans.checked(6, &key.public()).unwrap().unwrap().body.rollouts, 0);
        assert_eq!(a.manifest(6).await.unwrap().unwrap().rollouts, 3);
        // Records go with their window's retention.
        record_manifest(&db, &Manifest { window: 9, ..ours.clone() }).unwrap();
        assert_eq!(prune_manifest_records(&db, 7).unwrap(), 1);
        assert_eq!(recorded_manifest(&db, 6).unwrap(), None);
        assert!(recorded_manifest(&db, 9).unwrap().is_some());
    }

    /// Issue 29 item 4: a manifest already in the store that differs from
    /// the coordinator's (planted before the window closed) is overwritten
    /// with the coordinator's, not a conflict that stops the archiver.
    #[tokio::test]
    async fn a_planted_manifest_is_overwritten_not_a_stuck_archiver() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(dir.path()).unwrap();
        a.put_window(7, rollouts(49, 1000)).await.unwrap();
        let rs = rollouts(50, 1000);
        let m = a.put_window(7, rs.clone()).await.expect("the archiver goes on");
        assert_eq!(a.manifest(7).await.unwrap(), Some(m));
        assert_eq!(a.read_window(7).await.unwrap(), Some(bytes(&rs)));
        // Garbage where a manifest goes: replaced as well.
        std::fs::create_dir_all(dir.path().join("windows/00000000000000000008")).unwrap();
        std::fs::write(dir.path().join("windows/00000000000000000008/manifest.json"), b"{not json").unwrap();
        assert_eq!(a.put_window(8, rs.clone()).await.unwrap().rollouts, 50);
    }

    /// Issue 29 item 7: every object is read with a limit; a larger one is a
    /// typed error before its body is read.
    #[tokio::test]
    async fn objects_past_their_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(dir.path()).unwrap();
        let mdir = dir.path().join("windows/00000000000000000003");
        std::fs::create_dir_all(&mdir).unwrap();
        std::fs::write(mdir.join("manifest.json"), vec![b' '; MAX_MANIFEST_BYTES as usize + 1]).unwrap();
        assert!(matches!(a.manifest(3).await, Err(ArchiveError::TooLarge { .. })));
        std::fs::create_dir_all(dir.path().join("deltas")).unwrap();
        std::fs::write(dir.path().join("deltas/x.delta"), [7u8; 11]).unwrap();
        assert!(matches!(a.get("deltas/x.delta", 10).await, Err(ArchiveError::TooLarge { max: 10, .. })));
        assert_eq!(a.get("deltas/x.delta", 11).await.unwrap(), Some(vec![7u8; 11]));
        assert_eq!(a.get("deltas/none.delta", 11).await.unwrap(), None);
        // A segment longer than its manifest entry says.
        let m = a.put_window(4, rollouts(10, 100)).await.unwrap();
        let seg = dir.path().join(&m.segments[0].key);
        let mut long = std::fs::read(&seg).unwrap();
        long.extend_from_slice(&[0; 4096]);
        std::fs::write(&seg, &long).unwrap();
        assert!(matches!(a.read_window(4).await, Err(ArchiveError::TooLarge { .. })));
        // A weights document past the protocol's limit is never read.
        let wpath = dir.path().join(store_weights_key(5));
        std::fs::create_dir_all(wpath.parent().unwrap()).unwrap();
        let f = std::fs::File::create(&wpath).unwrap();
        f.set_len(u64::from(tributary_protocol::wire::MAX_WEIGHTS_DOC_LEN) + 1).unwrap();
        assert!(matches!(a.weights(5).await, Err(ArchiveError::TooLarge { .. })));
    }

    /// Issue 29 item 7: the archiver streams: a segment is in the store as
    /// soon as the next rollout does not fit, and the writer holds at most
    /// one segment's rollouts; rollouts out of miner order are refused.
    #[tokio::test]
    async fn a_window_is_written_segment_by_segment() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::local(dir.path()).unwrap();
        let mut w = a.window_writer(2);
        let seg_dir = dir.path().join("windows/00000000000000000002");
        let written = || std::fs::read_dir(&seg_dir).map(|d| d.count()).unwrap_or(0);
        w.push(PublicKey([0; 32]), vec![0; 30 << 20]).await.unwrap();
        w.push(PublicKey([1; 32]), vec![1; 30 << 20]).await.unwrap();
        assert_eq!(written(), 0);
        w.push(PublicKey([2; 32]), vec![2; 30 << 20]).await.unwrap();
        assert_eq!(written(), 1, "the first segment is written once the third rollout does not fit");
        assert_eq!(w.held_bytes(), 30 << 20);
        let err = w.push(PublicKey([1; 32]), vec![1; 10]).await;
        assert!(matches!(err, Err(ArchiveError::Malformed { window: 2, .. })));
        let m = w.finish().await.unwrap();
        assert_eq!((m.rollouts, m.segments.len()), (3, 2));
        // The same rollouts through put_window: the same manifest.
        let rs: Vec<(PublicKey, Vec<u8>)> = (0..3u8).map(|i| (PublicKey([i; 32]), vec![i; 30 << 20])).collect();
        assert_eq!(a.put_window(2, rs).await.unwrap(), m);
    }

    #[test]
    fn check_config_refuses_store_settings_that_would_not_work() {
        let ok = |a: Option<&str>, u: Option<&str>| check_settings(a, u).unwrap().join(" ");
        assert_eq!(ok(None, None), "archive=- store_url=- readers=coordinator");
        assert_eq!(ok(Some("objects"), None), "archive=objects store_url=- readers=coordinator");
        assert_eq!(
            ok(Some("file:///srv/objects"), Some("https://cdn.example:8443/net/")),
            "archive=file:///srv/objects store_url=https://cdn.example:8443/net/ readers=store_url"
        );
        for (a, u) in [
            (None, Some("https://cdn.example/")),
            (Some("objects"), Some("ftp://cdn.example/")),
            (Some("objects"), Some("https://")),
            (Some("objects"), Some("https://:80/x")),
            (Some("objects"), Some("https://cdn.example:port/")),
            (Some("objects"), Some("https://cdn.example/?x=1")),
            (Some("objects"), Some("https://cdn example/")),
            (Some("gs://bucket"), None),
            (Some("file://relative"), None),
            (Some(""), None),
        ] {
            assert!(check_settings(a, u).is_err(), "{a:?} {u:?}");
        }
        #[cfg(not(feature = "s3"))]
        assert!(check_settings(Some("s3://bucket/p"), None).unwrap_err().contains("`s3` feature"));
    }

    #[test]
    fn urls_this_build_does_not_know_are_refused() {
        for bad in ["", "http://x/y", "gs://bucket"] {
            assert!(matches!(Archive::open(bad), Err(ArchiveError::Url(_))), "{bad}");
        }
        #[cfg(not(feature = "s3"))]
        assert!(matches!(Archive::open("s3://bucket/prefix"), Err(ArchiveError::Url(_))));
    }
}
