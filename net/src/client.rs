//! The client runtime the validator and the trainer share (and the miner's
//! uplink sits on): one connection to the coordinator that reconnects with
//! backoff ([`Client`]), a request retried across a lost connection
//! ([`Client::request`]), every paged list read the same way
//! ([`Paged`], [`Client::pages`]), a closed window read through
//! [`Client::window_index`] and [`Client::miner_rollouts`] (the
//! coordinator, after any other [`WindowSource`] a role adds), a signed
//! checkpoint upload ([`Client::publish_checkpoint`]), a resumable, verified
//! relay download into a file ([`Client::download`]), and one error type,
//! [`ClientError`].

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    self, Blob, CheckpointChunk, Confirmation, Confirmations, ErrorCode, FetchRollouts, Frame, GetCheckpoint,
    GetConfirmations, GetDelta, GetStanding, GetWindow, GetWindowIndex, MAX_CHUNK_LEN, MinerStanding, MinerWork,
    NetworkId, PathStep, PublishCheckpoint, Role, Rollouts, Standing, WindowIndex, WindowInfo,
};

use crate::{Backoff, ConnectFailure, KeyPin, NetError, Session};

/// Why a client's request failed (a failing rollout or miner is data, never one of these).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator stayed unreachable through every attempt.
    #[error("coordinator unreachable after {attempts} attempts: {last}")]
    Unreachable {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: NetError,
    },
    /// The coordinator refused us (role, key, version) or a request (an error frame).
    #[error("refused by the coordinator: {0}")]
    Refused(NetError),
    /// The coordinator answered out of protocol.
    #[error("unexpected answer {0:?}")]
    Unexpected(wire::Tag),
}

impl ClientError {
    /// The error code of a refusal (an error frame), if this is one.
    pub fn refusal(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused(NetError::Refused(code, _)) => Some(*code),
            _ => None,
        }
    }

    /// Whether trying again later (on a new connection) can cure it: the
    /// coordinator was unreachable, or refused for a reason no retry is
    /// barred from ("not yet", rate limits); not a final refusal
    /// ([`NetError::is_final`]) nor an answer out of protocol.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Refused(e) => !e.is_final(),
            ClientError::Unexpected(_) => false,
        }
    }
}

/// Where and as whom a [`Client`] connects, and how it retries.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The coordinator's QUIC address.
    pub addr: SocketAddr,
    /// Its certificate pin spec ([`crate::Pin::parse`]).
    pub pin: String,
    /// The coordinator key accepted (the network).
    pub coordinator_key: KeyPin,
    /// This client's key.
    pub key: Keypair,
    /// Its role.
    pub role: Role,
    /// How connecting is retried ([`Session::connect_with_backoff`]).
    pub connect: Backoff,
    /// How a request whose connection was lost is retried: `attempts` tries
    /// in all, each on a new connection, waiting from `min` doubling to `max`
    /// between them. An error frame is never retried.
    pub request: Backoff,
    /// Runs before each wait while reconnecting (metrics).
    pub on_retry: fn(&NetError, Duration),
}

impl ClientConfig {
    /// Connection and requests retried from 200 ms doubling to 30 s, 20 attempts each.
    pub fn new(addr: SocketAddr, pin: impl Into<String>, key: Keypair, role: Role) -> Self {
        let backoff = Backoff { min: Duration::from_millis(200), max: Duration::from_secs(30), attempts: 20 };
        Self {
            addr,
            pin: pin.into(),
            coordinator_key: KeyPin::Any,
            key,
            role,
            connect: backoff,
            request: backoff,
            on_retry: |_, _| {},
        }
    }
}

/// The boxed future a [`WindowSource`] answers with: `Ok(None)` when the
/// source does not have what was asked (the next source is asked).
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<Option<T>, SourceError>> + Send + 'a>>;

/// A [`WindowSource`]'s failure (logged, then the next source is asked).
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Somewhere other than the coordinator's QUIC door that a closed window's
/// index and rollouts can be read from (an object store holding archived
/// windows, say). A [`Client`] asks its sources in the order they were
/// added ([`Client::add_window_source`]) and the coordinator last. A source
/// gets the client's session if it has one (it is not reconnected for a
/// source: a source that already knows the window answers while the
/// coordinator is away), to ask the coordinator what it needs (a window's
/// signed manifest, say); it keeps what it learns behind `&self` (interior
/// mutability). What a source answers must be what the
/// coordinator would: the source checks it against what the coordinator
/// signed (and every rollout is still checked by whoever reads it).
pub trait WindowSource: Send + Sync {
    /// A name for logs.
    fn name(&self) -> &str;
    /// The window's index: every miner that stored rollouts, with its groups.
    /// The default has none (the coordinator's is read).
    fn index<'a>(&'a self, session: Option<&'a mut Session>, window: WindowId) -> SourceFuture<'a, Vec<MinerWork>> {
        let _ = (session, window);
        Box::pin(async { Ok(None) })
    }
    /// Every stored rollout (encoded) of one miner in the window.
    fn miner_rollouts<'a>(
        &'a self,
        session: Option<&'a mut Session>,
        window: WindowId,
        miner: PublicKey,
    ) -> SourceFuture<'a, Vec<Vec<u8>>>;
}

/// A list request the coordinator answers page by page (every list answer
/// is paged and capped by bytes): the request is its own pager.
pub trait Paged {
    /// Where the next page starts.
    type Cursor: Copy + PartialEq;
    /// One entry of a page.
    type Item;
    /// The request for the page after `after` (`None`: the first page).
    fn ask(&self, after: Option<Self::Cursor>) -> Frame;
    /// The page an answer holds; the answer's tag when it is not a page of
    /// this request.
    fn page(&self, answer: Frame) -> Result<Page<Self::Item, Self::Cursor>, wire::Tag>;
}

/// One page of a paged answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<I, C> {
    /// Its entries.
    pub items: Vec<I>,
    /// Where the next page starts (`None`: this is the last).
    pub next: Option<C>,
}

impl Paged for GetWindowIndex {
    type Cursor = PublicKey;
    type Item = MinerWork;
    fn ask(&self, after: Option<PublicKey>) -> Frame {
        Frame::GetWindowIndex(GetWindowIndex { window: self.window, after })
    }
    fn page(&self, answer: Frame) -> Result<Page<MinerWork, PublicKey>, wire::Tag> {
        match answer {
            Frame::WindowIndex(WindowIndex { window, miners, next }) if window == self.window => {
                Ok(Page { items: miners, next })
            }
            f => Err(f.tag()),
        }
    }
}

impl Paged for FetchRollouts {
    type Cursor = [u8; 32];
    type Item = Blob;
    fn ask(&self, after: Option<[u8; 32]>) -> Frame {
        Frame::FetchRollouts(FetchRollouts { after, ..self.clone() })
    }
    fn page(&self, answer: Frame) -> Result<Page<Blob, [u8; 32]>, wire::Tag> {
        match answer {
            Frame::Rollouts(Rollouts { window, items, next }) if window == self.window => Ok(Page { items, next }),
            f => Err(f.tag()),
        }
    }
}

impl Paged for GetStanding {
    type Cursor = PublicKey;
    type Item = (PublicKey, MinerStanding);
    fn ask(&self, after: Option<PublicKey>) -> Frame {
        Frame::GetStanding(GetStanding { window: self.window, after })
    }
    fn page(&self, answer: Frame) -> Result<Page<(PublicKey, MinerStanding), PublicKey>, wire::Tag> {
        match answer {
            Frame::Standing(Standing { window, miners, next }) if window == self.window => {
                Ok(Page { items: miners, next })
            }
            f => Err(f.tag()),
        }
    }
}

impl Paged for GetConfirmations {
    type Cursor = (WindowId, PublicKey);
    type Item = Confirmation;
    fn ask(&self, after: Option<(WindowId, PublicKey)>) -> Frame {
        Frame::GetConfirmations(GetConfirmations { after, limit: self.limit })
    }
    fn page(&self, answer: Frame) -> Result<Page<Confirmation, (WindowId, PublicKey)>, wire::Tag> {
        match answer {
            Frame::Confirmations(Confirmations { items, next }) => Ok(Page { items, next }),
            f => Err(f.tag()),
        }
    }
}

/// Rollouts asked for per page of [`Client::miner_rollouts`].
pub const ROLLOUTS_PAGE: u32 = 256;

/// Why a relay download failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The request failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The local file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The relay sent something other than the payload announced.
    #[error("checkpoint {id}: {why}")]
    Payload {
        /// The payload's checkpoint.
        id: ContentId,
        /// What was wrong.
        why: &'static str,
    },
}

/// A connection to the coordinator, made on first use and again after a
/// loss, with requests retried across losses ([`ClientConfig::request`]).
pub struct Client {
    cfg: ClientConfig,
    session: Option<Session>,
    sources: Vec<Box<dyn WindowSource>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources: Vec<&str> = self.sources.iter().map(|s| s.name()).collect();
        f.debug_struct("Client")
            .field("addr", &self.cfg.addr)
            .field("role", &self.cfg.role)
            .field("connected", &self.session.is_some())
            .field("sources", &sources)
            .finish()
    }
}

impl Client {
    /// A client; nothing connects until first use.
    pub fn new(cfg: ClientConfig) -> Self {
        Self { cfg, session: None, sources: Vec::new() }
    }

    /// Its configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// Reads closed windows from `source` before the coordinator.
    pub fn add_window_source(&mut self, source: Box<dyn WindowSource>) {
        self.sources.push(source);
    }

    /// The session, connecting (with [`ClientConfig::connect`]'s backoff) if there is none.
    pub async fn session(&mut self) -> Result<&mut Session, ClientError> {
        if self.session.is_none() {
            let c = &self.cfg;
            let s = Session::connect_with_backoff(
                c.addr,
                &c.pin,
                &c.coordinator_key,
                &c.key,
                c.role,
                c.connect,
                c.on_retry,
            )
            .await
            .map_err(|f| match f {
                ConnectFailure::Refused(e) => ClientError::Refused(e),
                ConnectFailure::Unreachable { attempts, last } => ClientError::Unreachable { attempts, last },
            })?;
            tracing::info!(coordinator = %s.coordinator, role = ?c.role, "connected");
            self.session = Some(s);
        }
        self.session.as_mut().ok_or(ClientError::Unexpected(wire::Tag::Welcome))
    }

    /// Drops the connection (the next request reconnects).
    pub fn disconnect(&mut self) {
        self.session = None;
    }

    /// The network of the coordinator (connecting if needed).
    pub async fn network(&mut self) -> Result<NetworkId, ClientError> {
        Ok(self.session().await?.network())
    }

    /// The coordinator's greeting on the current connection (connecting if needed).
    pub async fn welcome(&mut self) -> Result<&wire::Welcome, ClientError> {
        Ok(&self.session().await?.welcome)
    }

    /// Sends a request and returns its answer. A lost connection is retried
    /// on a new one ([`ClientConfig::request`]); an error frame is
    /// [`ClientError::Refused`], at once.
    pub async fn request(&mut self, frame: &Frame) -> Result<Frame, ClientError> {
        let retry = self.cfg.request;
        let mut tries = 0;
        let mut delay = retry.min;
        loop {
            tries += 1;
            let s = self.session().await?;
            match s.request(frame).await {
                Ok(f) => return Ok(f),
                Err(e @ NetError::Refused(..)) => return Err(ClientError::Refused(e)),
                Err(e) => {
                    self.disconnect();
                    if tries >= retry.attempts {
                        return Err(ClientError::Unreachable { attempts: tries, last: e });
                    }
                    tracing::warn!(error = %e, retry_in = ?delay, "connection lost, reconnecting");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(retry.max);
                }
            }
        }
    }

    /// Every page of a paged request, handed to `each` as it arrives (the
    /// caller decides what of it to hold). Stops at the last page, or when
    /// the coordinator names the cursor it was just given (no loop).
    pub async fn pages<P: Paged>(&mut self, req: &P, mut each: impl FnMut(Vec<P::Item>)) -> Result<(), ClientError> {
        let mut after = None;
        loop {
            let answer = self.request(&req.ask(after)).await?;
            let Page { items, next } = req.page(answer).map_err(ClientError::Unexpected)?;
            each(items);
            match next {
                Some(n) if Some(n) != after => after = Some(n),
                _ => return Ok(()),
            }
        }
    }

    /// Every entry of a paged request.
    pub async fn paged<P: Paged>(&mut self, req: &P) -> Result<Vec<P::Item>, ClientError> {
        let mut out = Vec::new();
        self.pages(req, |page| out.extend(page)).await?;
        Ok(out)
    }

    /// The contract of `window` (its checkpoint, seed, environment, sampling).
    pub async fn window_info(&mut self, window: WindowId) -> Result<WindowInfo, ClientError> {
        match self.request(&Frame::GetWindow(GetWindow { window: Some(window) })).await? {
            Frame::WindowInfo(i) if i.window == window => Ok(i),
            f => Err(ClientError::Unexpected(f.tag())),
        }
    }

    /// A closed window's index: every miner that stored rollouts (banned
    /// miners left out for the trainer), with its groups and counts; from the
    /// first [`WindowSource`] that has it, else from the coordinator, page by page.
    pub async fn window_index(&mut self, window: WindowId) -> Result<Vec<MinerWork>, ClientError> {
        for s in &self.sources {
            match s.index(self.session.as_mut(), window).await {
                Ok(Some(index)) => return Ok(index),
                Ok(None) => {}
                Err(e) => tracing::warn!(source = s.name(), window, error = %e, "window index: source failed"),
            }
        }
        self.paged(&GetWindowIndex { window, after: None }).await
    }

    /// Every stored rollout of `miner` in a closed window (encoded, as
    /// stored): from the first [`WindowSource`] that has them, else from the
    /// coordinator, page by page ([`ROLLOUTS_PAGE`] rollouts a page).
    pub async fn miner_rollouts(&mut self, window: WindowId, miner: &PublicKey) -> Result<Vec<Vec<u8>>, ClientError> {
        let mut out = Vec::new();
        self.each_rollout_page(window, miner, |page| out.extend(page)).await?;
        Ok(out)
    }

    /// [`Client::miner_rollouts`], a page at a time: `each` gets every page
    /// as it arrives (a source's whole answer as one page).
    pub async fn each_rollout_page(
        &mut self,
        window: WindowId,
        miner: &PublicKey,
        mut each: impl FnMut(Vec<Vec<u8>>),
    ) -> Result<(), ClientError> {
        for s in &self.sources {
            match s.miner_rollouts(self.session.as_mut(), window, *miner).await {
                Ok(Some(rollouts)) => {
                    each(rollouts);
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(source = s.name(), window, error = %e, "rollouts: source failed"),
            }
        }
        let req = FetchRollouts { window, miner: Some(*miner), after: None, limit: ROLLOUTS_PAGE };
        self.pages(&req, |page| each(page.into_iter().map(|b| b.0).collect())).await
    }

    /// Uploads a signed checkpoint announcement and its payload (full or
    /// delta) in chunks, and waits until the coordinator has stored it. Not
    /// retried: a lost connection fails it (the caller uploads again after
    /// reconnecting).
    pub async fn publish_checkpoint(&mut self, ann: &PublishCheckpoint, payload: &[u8]) -> Result<(), ClientError> {
        let id = ann.body.id;
        let s = self.session().await?;
        let answer = s.publish_checkpoint(ann, payload).await;
        match answer {
            Ok(Frame::CheckpointStored(st)) if st.id == id => Ok(()),
            Ok(f) => Err(ClientError::Unexpected(f.tag())),
            Err(e @ NetError::Refused(..)) => Err(ClientError::Refused(e)),
            Err(e) => {
                self.disconnect();
                Err(ClientError::Unreachable { attempts: 1, last: e })
            }
        }
    }

    /// Downloads one relay payload (`step`: the full checkpoint, or a delta
    /// from its base) into `part`, from byte `from` on (the bytes before it
    /// are the file's, from an earlier try of the same payload; 0 starts
    /// over), chunk by chunk, calling `progress` with the bytes held after
    /// each chunk. Checks each chunk, the length and the payload's blake3
    /// against `step`, fsyncs, and returns the bytes fetched now; a payload
    /// that fails its hash is removed.
    pub async fn download(
        &mut self,
        step: &PathStep,
        part: &Path,
        from: u64,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, DownloadError> {
        use std::io::Write as _;
        let io = |source| DownloadError::Io { path: part.to_path_buf(), source };
        let bad = |why| DownloadError::Payload { id: step.id, why };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(from == 0)
            .append(from > 0)
            .open(part)
            .map_err(io)?;
        if f.metadata().map_err(io)?.len() != from {
            return Err(bad("the partial file is not as long as the resumed offset"));
        }
        let id = step.id;
        let mut offset = from;
        while offset < step.len {
            let ask = match step.base {
                None => Frame::GetCheckpoint(GetCheckpoint { id, offset }),
                Some(base) => Frame::GetDelta(GetDelta { base, id, offset }),
            };
            let data = match self.request(&ask).await? {
                Frame::CheckpointChunk(c) if c.id == id && c.offset == offset && !c.data.0.is_empty() => c.data.0,
                Frame::CheckpointChunk(_) => return Err(bad("chunk out of order, empty or for another checkpoint")),
                f => return Err(ClientError::Unexpected(f.tag()).into()),
            };
            if offset + data.len() as u64 > step.len {
                return Err(bad("longer than announced"));
            }
            f.write_all(&data).map_err(io)?;
            offset += data.len() as u64;
            progress(offset);
        }
        f.sync_all().map_err(io)?;
        drop(f);
        let hash = tokio::task::block_in_place(|| {
            let mut h = blake3::Hasher::new();
            h.update_reader(std::fs::File::open(part)?)?;
            Ok(h.finalize())
        })
        .map_err(io)?;
        if hash.as_bytes() != &step.payload_hash {
            let _ = std::fs::remove_file(part);
            return Err(bad("payload hash mismatch"));
        }
        Ok(step.len - from)
    }
}

impl Session {
    /// Sends a signed checkpoint announcement and its payload in chunks of
    /// [`MAX_CHUNK_LEN`], and returns the coordinator's answer
    /// (`CheckpointStored`, or a refusal as [`NetError::Refused`]).
    pub async fn publish_checkpoint(&mut self, ann: &PublishCheckpoint, payload: &[u8]) -> Result<Frame, NetError> {
        let id = ann.body.id;
        self.send(&Frame::PublishCheckpoint(ann.clone())).await?;
        for (i, c) in payload.chunks(MAX_CHUNK_LEN as usize).enumerate() {
            let offset = (i * MAX_CHUNK_LEN as usize) as u64;
            self.send(&Frame::CheckpointChunk(CheckpointChunk { id, offset, data: Blob(c.to_vec()) })).await?;
        }
        self.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors() {
        let unreachable = ClientError::Unreachable { attempts: 3, last: NetError::Closed };
        assert!(unreachable.is_transient());
        let not_yet = ClientError::Refused(NetError::Refused(ErrorCode::NotYet, String::new()));
        assert!(not_yet.is_transient());
        assert_eq!(not_yet.refusal(), Some(ErrorCode::NotYet));
        let unauthorized = ClientError::Refused(NetError::Refused(ErrorCode::Unauthorized, String::new()));
        assert!(!unauthorized.is_transient());
        assert!(!ClientError::Unexpected(wire::Tag::Welcome).is_transient());
        assert_eq!(unreachable.refusal(), None);
    }

    #[test]
    fn pagers_match_only_their_own_pages() {
        let miner = PublicKey([7; 32]);
        let index = GetWindowIndex { window: 4, after: None };
        assert_eq!(index.ask(Some(miner)), Frame::GetWindowIndex(GetWindowIndex { window: 4, after: Some(miner) }));
        let page = Frame::WindowIndex(WindowIndex { window: 4, miners: vec![], next: Some(miner) });
        assert_eq!(index.page(page).map(|p| p.next), Ok(Some(miner)));
        let other = Frame::WindowIndex(WindowIndex { window: 5, miners: vec![], next: None });
        assert!(index.page(other).is_err(), "another window's page");
        let fetch = FetchRollouts { window: 4, miner: Some(miner), after: None, limit: 9 };
        let asked = FetchRollouts { window: 4, miner: Some(miner), after: Some([1; 32]), limit: 9 };
        assert_eq!(fetch.ask(Some([1; 32])), Frame::FetchRollouts(asked));
        assert!(fetch.page(Frame::Rollouts(Rollouts { window: 3, items: vec![], next: None })).is_err());
        let standing = GetStanding { window: 4, after: None };
        assert!(standing.page(Frame::Standing(Standing { window: 4, miners: vec![], next: None })).is_ok());
        let confirmations = GetConfirmations { after: None, limit: 2 };
        assert!(confirmations.page(Frame::Standing(Standing { window: 4, miners: vec![], next: None })).is_err());
    }
}
