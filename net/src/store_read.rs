//! Closed windows read from the object store instead of the coordinator
//! (issue 21): a [`WindowSource`] for the validator's and the trainer's
//! [`crate::client::Client`].
//!
//! For a window it asks the coordinator once for the window's signed
//! manifest and a GET URL per segment (`GetWindowManifest`; public URLs
//! under the store's base URL, or URLs presigned for a private bucket),
//! then downloads only the segments whose miner range holds the miner asked
//! for, over HTTP(S). Nothing downloaded is trusted: every segment's length
//! and blake3 must be the ones the coordinator signed, and it must decode to
//! rollouts of the window in the manifest's miner order; the reader then
//! checks every rollout's signature as it does for the coordinator's. On any
//! failure the client falls back to the coordinator. Once a window's
//! manifest is held, its rollouts are read with no request to the
//! coordinator at all, so a coordinator that goes down does not stop
//! readers of closed windows.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    Frame, GetWindowManifest, MAX_SEGMENT_BYTES, ManifestError, ManifestSegment, SegmentObject, SignedManifest,
};

use crate::Session;
use crate::client::{SourceFuture, WindowSource};

/// Why the store could not answer (the client then asks the coordinator).
#[derive(Debug, thiserror::Error)]
pub enum StoreReadError {
    /// The coordinator's manifest answer is not one to use.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Asking the coordinator for the manifest failed.
    #[error("asking for the manifest: {0}")]
    Net(#[from] crate::NetError),
    /// The coordinator answered the manifest request with another frame.
    #[error("manifest request answered with {0:?}")]
    Unexpected(tributary_protocol::wire::Tag),
    /// The GET failed (connection, TLS, timeout).
    #[error("GET {key}: {source}")]
    Request {
        /// The segment's key.
        key: String,
        /// The cause.
        source: Box<ureq::Error>,
    },
    /// The store answered with a status other than 200.
    #[error("GET {key}: status {status}")]
    Status {
        /// The segment's key.
        key: String,
        /// The status.
        status: u16,
    },
    /// Reading the body failed.
    #[error("GET {key}: {source}")]
    Body {
        /// The segment's key.
        key: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The bytes are not the ones the coordinator signed (length or blake3).
    #[error("segment {key} is not the content the manifest signs")]
    Corrupt {
        /// The segment's key.
        key: String,
    },
    /// The segment decodes to something other than the manifest says.
    #[error("segment {key}: {what}")]
    Malformed {
        /// The segment's key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

/// How long an answer without a manifest (not archived yet) is believed
/// before the coordinator is asked again.
const NO_MANIFEST_FOR: Duration = Duration::from_secs(2);

/// Windows whose manifests are held at once.
const HELD_WINDOWS: usize = 4;

/// A presigned URL is renewed this long before it expires.
const RENEW_BEFORE_MS: u64 = 60_000;

/// The total deadline of one segment's GET: this much time, plus the
/// segment's length at [`MIN_BYTES_PER_SEC`]. A store that drips its answer
/// cannot hold a reader past it (the per-read timeout alone restarts at
/// every byte).
const DEADLINE_BASE: Duration = Duration::from_secs(30);

/// The slowest transfer a segment's deadline allows for.
const MIN_BYTES_PER_SEC: u64 = 256 << 10;

/// How long one segment's GET may take in all.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    base: Duration,
    min_bytes_per_sec: u64,
}

impl Deadline {
    fn for_len(&self, bytes: u64) -> Duration {
        self.base + Duration::from_millis(bytes.saturating_mul(1000) / self.min_bytes_per_sec.max(1))
    }
}

/// A window's manifest as held: checked, with its segment URLs.
#[derive(Debug)]
struct Held {
    manifest: SignedManifest,
    urls: Vec<String>,
    expires_ms: u64,
}

#[derive(Debug)]
enum Known {
    Held(Arc<Held>),
    NotArchived(Instant),
}

/// One downloaded, checked segment: each rollout with its miner.
type Loaded = Arc<Vec<(PublicKey, Vec<u8>)>>;

/// Figures of what a [`StoreSource`] read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreReadStats {
    /// Segments downloaded and checked.
    pub segments: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Manifests the coordinator was asked for.
    pub manifest_requests: u64,
}

/// The last segment downloaded: its object key, its hash and what it held.
type LastSegment = (String, [u8; 32], Loaded);

/// A [`WindowSource`] over the object store's archived windows.
#[derive(Debug, Clone)]
pub struct StoreSource {
    agent: ureq::Agent,
    windows: Arc<Mutex<BTreeMap<WindowId, Known>>>,
    /// The last segment downloaded (miners are read in key order, so a
    /// segment holding several is downloaded once).
    last: Arc<Mutex<Option<LastSegment>>>,
    stats: Arc<Mutex<StoreReadStats>>,
    deadline: Deadline,
}

impl Default for StoreSource {
    fn default() -> Self {
        Self::new()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl StoreSource {
    /// A source with HTTP timeouts of 5 s to connect, 15 s to the headers
    /// and 30 s between two reads of a body, and a total deadline per
    /// segment of 30 s plus its length at 256 KiB/s.
    pub fn new() -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(15)))
            .timeout_per_read(Some(Duration::from_secs(30)))
            .build();
        Self {
            agent: ureq::Agent::new_with_config(config),
            windows: Default::default(),
            last: Default::default(),
            stats: Default::default(),
            deadline: Deadline { base: DEADLINE_BASE, min_bytes_per_sec: MIN_BYTES_PER_SEC },
        }
    }

    /// The same source with another total deadline per segment: `base` plus
    /// the segment's length at `min_bytes_per_sec`.
    pub fn with_deadline(mut self, base: Duration, min_bytes_per_sec: u64) -> Self {
        self.deadline = Deadline { base, min_bytes_per_sec };
        self
    }

    /// What it read so far.
    pub fn stats(&self) -> StoreReadStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `window`'s manifest is held (its rollouts can be read without
    /// the coordinator while its URLs work).
    pub fn holds(&self, window: WindowId) -> bool {
        matches!(self.windows.lock().unwrap_or_else(|p| p.into_inner()).get(&window), Some(Known::Held(_)))
    }

    /// The window's manifest: held, or asked of the coordinator (again when
    /// presigned URLs are about to expire, or a "not archived" answer is old).
    /// Without a session only what is held answers.
    async fn manifest(
        &self,
        session: Option<&mut Session>,
        window: WindowId,
    ) -> Result<Option<Arc<Held>>, StoreReadError> {
        let known = match self.windows.lock().unwrap_or_else(|p| p.into_inner()).get(&window) {
            Some(Known::Held(h)) if h.expires_ms == 0 || now_ms() + RENEW_BEFORE_MS < h.expires_ms => {
                return Ok(Some(h.clone()));
            }
            Some(Known::NotArchived(at)) if at.elapsed() < NO_MANIFEST_FOR => return Ok(None),
            Some(Known::Held(h)) => Some(h.clone()),
            _ => None,
        };
        let Some(session) = session else { return Ok(known) };
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).manifest_requests += 1;
        let answer = match session.request(&Frame::GetWindowManifest(GetWindowManifest { window })).await {
            Ok(Frame::WindowManifest(a)) => a,
            Ok(f) => return Err(StoreReadError::Unexpected(f.tag())),
            // Renewing failed (the coordinator is gone, say): the URLs held may still work.
            Err(_) if known.is_some() => return Ok(known),
            Err(e) => return Err(e.into()),
        };
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match answer.checked(window, &session.coordinator)? {
            None => {
                windows.insert(window, Known::NotArchived(Instant::now()));
                None
            }
            Some(m) => {
                let held =
                    Arc::new(Held { manifest: m.clone(), urls: answer.urls.clone(), expires_ms: answer.expires_ms });
                windows.insert(window, Known::Held(held.clone()));
                Some(held)
            }
        };
        while windows.len() > HELD_WINDOWS {
            windows.pop_first();
        }
        Ok(entry)
    }

    /// A segment's rollouts with their miners: the last one downloaded, or
    /// downloaded now and checked against the manifest.
    async fn segment(&self, window: WindowId, seg: &ManifestSegment, url: &str) -> Result<Loaded, StoreReadError> {
        if let Some((k, h, l)) = &*self.last.lock().unwrap_or_else(|p| p.into_inner())
            && *k == seg.key
            && *h == seg.blake3
        {
            return Ok(l.clone());
        }
        let (agent, seg2, url) = (self.agent.clone(), seg.clone(), url.to_owned());
        let total = self.deadline.for_len(seg.bytes);
        let bytes = tokio::task::spawn_blocking(move || get(&agent, &seg2, &url, total))
            .await
            .map_err(|e| StoreReadError::Malformed { key: seg.key.clone(), what: format!("download task: {e}") })??;
        let loaded = Arc::new(check_segment(window, seg, &bytes)?);
        {
            let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            s.segments += 1;
            s.bytes += bytes.len() as u64;
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((seg.key.clone(), seg.blake3, loaded.clone()));
        Ok(loaded)
    }

    /// Every rollout of `miner` in an archived `window`, or `None` if the
    /// coordinator has no manifest for it (or, without a session, none is held).
    pub async fn read_miner(
        &self,
        session: Option<&mut Session>,
        window: WindowId,
        miner: PublicKey,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreReadError> {
        let Some(held) = self.manifest(session, window).await? else { return Ok(None) };
        let mut out = Vec::new();
        for (seg, url) in held.manifest.body.segments.iter().zip(&held.urls) {
            if !seg.may_hold(&miner) {
                continue;
            }
            let loaded = self.segment(window, seg, url).await?;
            out.extend(loaded.iter().filter(|(m, _)| *m == miner).map(|(_, r)| r.clone()));
        }
        Ok(Some(out))
    }
}

/// GETs a segment: status 200 and at most the signed length, all of it
/// within `total` (a timeout is [`StoreReadError::Request`] or [`StoreReadError::Body`]).
fn get(agent: &ureq::Agent, seg: &ManifestSegment, url: &str, total: Duration) -> Result<Vec<u8>, StoreReadError> {
    let key = || seg.key.clone();
    if seg.bytes > MAX_SEGMENT_BYTES {
        return Err(StoreReadError::Corrupt { key: key() });
    }
    let resp = agent
        .get(url)
        .config()
        .timeout_global(Some(total))
        .build()
        .call()
        .map_err(|e| StoreReadError::Request { key: key(), source: Box::new(e) })?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(StoreReadError::Status { key: key(), status });
    }
    let mut out = Vec::with_capacity(seg.bytes as usize);
    resp.into_body()
        .into_reader()
        .take(seg.bytes + 1)
        .read_to_end(&mut out)
        .map_err(|source| StoreReadError::Body { key: key(), source })?;
    Ok(out)
}

/// Checks a segment's bytes against its signed entry and decodes it: its
/// rollouts, each with its miner, in miner order within the entry's range.
pub fn check_segment(
    window: WindowId,
    seg: &ManifestSegment,
    bytes: &[u8],
) -> Result<Vec<(PublicKey, Vec<u8>)>, StoreReadError> {
    let key = || seg.key.clone();
    if bytes.len() as u64 != seg.bytes || *blake3::hash(bytes).as_bytes() != seg.blake3 {
        return Err(StoreReadError::Corrupt { key: key() });
    }
    let bad = |what: String| StoreReadError::Malformed { key: key(), what };
    let obj = SegmentObject::decode(bytes).map_err(|e| bad(e.to_string()))?;
    if obj.window != window || obj.rollouts.len() as u64 != seg.rollouts {
        return Err(bad("another window, or another count than the manifest's".into()));
    }
    let mut out = Vec::with_capacity(obj.rollouts.len());
    let mut prev = seg.first_miner;
    for r in obj.rollouts {
        let miner = Rollout::decode(&r, &RolloutLimits::DEFAULT)
            .map(|d| PublicKey(d.miner))
            .map_err(|e| bad(format!("a rollout does not decode: {e}")))?;
        if miner < prev || miner > seg.last_miner {
            return Err(bad("rollouts out of the manifest's miner order".into()));
        }
        prev = miner;
        out.push((miner, r));
    }
    Ok(out)
}

impl WindowSource for StoreSource {
    fn name(&self) -> &str {
        "object store"
    }

    fn miner_rollouts<'a>(
        &'a self,
        session: Option<&'a mut Session>,
        window: WindowId,
        miner: PublicKey,
    ) -> SourceFuture<'a, Vec<Vec<u8>>> {
        Box::pin(async move { self.read_miner(session, window, miner).await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A store that sends a 200 with `len` bytes announced, then one byte
    /// every 20 ms (it would take `len` × 20 ms), each within any per-read timeout.
    fn dripping_store(len: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else { return };
            let mut req = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut req);
            let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
            for _ in 0..len {
                if s.write_all(&[0]).and_then(|()| s.flush()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        format!("http://{addr}/windows/seg.bin")
    }

    /// Issue 29 item 7: a store that drips a segment cannot hold a reader
    /// past the segment's total deadline: the reader gets a typed error (and
    /// falls back to the coordinator) instead of waiting for 1,000 × 20 ms.
    #[test]
    fn a_dripping_store_cannot_hold_a_reader_past_its_deadline() {
        let url = dripping_store(1000);
        let seg = ManifestSegment {
            key: "windows/seg.bin".into(),
            blake3: [0; 32],
            bytes: 1000,
            rollouts: 1,
            first_miner: PublicKey([0; 32]),
            last_miner: PublicKey([0; 32]),
        };
        let source = StoreSource::new().with_deadline(Duration::from_millis(500), 1 << 30);
        let (agent, total) = (source.agent.clone(), source.deadline.for_len(seg.bytes));
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        std::thread::spawn(move || {
            let _ = tx.send(get(&agent, &seg, &url, total));
        });
        let res = rx.recv_timeout(Duration::from_secs(8)).expect("the reader is still held by the dripping store");
        assert!(
            matches!(res, Err(StoreReadError::Request { .. } | StoreReadError::Body { .. })),
            "a timeout error expected: {res:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(8));
    }
}
