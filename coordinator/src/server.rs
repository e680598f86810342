//! The QUIC server: handshake, ingestion with durable acknowledgements,
//! serving, verdicts, checkpoints and rate limits, around [`Core`] and [`Store`].

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::Instrument;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{self, Keypair, PublicKey};
use tributary_protocol::rollout::{self, Rollout, RolloutLimits};
use tributary_protocol::wire::{
    self, Ack, BatchAnswer, Challenge, ErrorCode, ErrorFrame, Frame, Outcome, Progress, Refused, RejectReason, Reveal,
    Role, Rollouts, VerdictAck, Welcome,
};

use crate::core::{Candidate, Core};
use crate::net::{self, NetError};
use crate::relay::{Payload, Relay, RelayError};
use crate::store::{Store, StoreError, StoredRollout};

/// Rate limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connection attempts per second per source address.
    pub connections_per_sec: u32,
    /// Submitted KiB per second per miner key (burst: one second's worth).
    pub kib_per_sec: u32,
    /// Submissions per second per miner key.
    pub rollouts_per_sec: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self { connections_per_sec: 20, kib_per_sec: 64 << 10, rollouts_per_sec: 20_000 }
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct WriteJob {
    rollouts: Vec<StoredRollout>,
    done: oneshot::Sender<Result<(), String>>,
}

/// State shared by every connection.
pub struct Shared {
    /// The state machine.
    pub core: Mutex<Core>,
    /// The database.
    pub store: Arc<Store>,
    /// The coordinator's key.
    pub key: Keypair,
    /// The checkpoint relay.
    pub relay: Arc<Relay>,
    writer: mpsc::Sender<WriteJob>,
    conn_limit: DefaultKeyedRateLimiter<IpAddr>,
    byte_limit: DefaultKeyedRateLimiter<PublicKey>,
    rollout_limit: DefaultKeyedRateLimiter<PublicKey>,
}

impl Shared {
    /// Locks the core (a poisoned lock is recovered: the core has no invariants a panic can break half-way).
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn quota(per_sec: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(per_sec.max(1)).unwrap_or(NonZeroU32::MIN))
}

/// Builds the shared state: restores the core from the store and starts the group-commit writer thread.
pub fn shared(
    mut core: Core,
    store: Arc<Store>,
    key: Keypair,
    limits: Limits,
    relay: Arc<Relay>,
) -> Result<Arc<Shared>, StoreError> {
    for c in store.candidates()? {
        core.restore(&c);
    }
    for (from, ann) in store.checkpoints()? {
        core.restore_checkpoint(from, ann.body.id);
    }
    for v in store.verdicts()? {
        core.apply_verdict(&v.body);
    }
    core.prune(now_ms());
    let (tx, rx) = mpsc::channel::<WriteJob>(1024);
    let st = store.clone();
    std::thread::Builder::new()
        .name("redb-writer".into())
        .spawn(move || writer_loop(st, rx))
        .map_err(|e| StoreError::Db(redb::Error::Io(e)))?;
    Ok(Arc::new(Shared {
        core: Mutex::new(core),
        store,
        key,
        relay,
        writer: tx,
        conn_limit: RateLimiter::keyed(quota(limits.connections_per_sec)),
        byte_limit: RateLimiter::keyed(quota(limits.kib_per_sec)),
        rollout_limit: RateLimiter::keyed(quota(limits.rollouts_per_sec)),
    }))
}

/// The most rollouts the writer gathers into one transaction.
const MAX_COMMIT_ROLLOUTS: usize = 4096;

/// Group commit: every job waiting (up to [`MAX_COMMIT_ROLLOUTS`] rollouts,
/// from any number of connections) is written in one durable transaction,
/// and each job is answered only after that commit.
fn writer_loop(store: Arc<Store>, mut rx: mpsc::Receiver<WriteJob>) {
    while let Some(first) = rx.blocking_recv() {
        let mut count = first.rollouts.len();
        let mut jobs = vec![first];
        while count < MAX_COMMIT_ROLLOUTS {
            let Ok(j) = rx.try_recv() else { break };
            count += j.rollouts.len();
            jobs.push(j);
        }
        // Moved, not copied: each rollout's bytes go to the database once.
        let mut all: Vec<StoredRollout> = Vec::with_capacity(jobs.iter().map(|j| j.rollouts.len()).sum());
        let mut done = Vec::with_capacity(jobs.len());
        for j in jobs {
            all.extend(j.rollouts);
            done.push(j.done);
        }
        let started = Instant::now();
        let res = store.put_rollouts(&all).map_err(|e| e.to_string());
        if let Err(e) = &res {
            tracing::error!(error = %e, rollouts = all.len(), "storing rollouts failed; their submissions are refused");
        }
        metrics::histogram!("tributary_redb_commit_seconds").record(started.elapsed().as_secs_f64());
        for d in done {
            let _ = d.send(res.clone());
        }
    }
}

/// Why a rollout failed the stateless door checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorRefusal {
    /// The reason sent back.
    pub reason: RejectReason,
    /// For a bad signature: the window and the miner the rollout names (only
    /// that miner can have sent bytes signed over its own key that fail).
    pub signer: Option<(u64, PublicKey)>,
}

impl From<RejectReason> for DoorRefusal {
    fn from(reason: RejectReason) -> Self {
        Self { reason, signer: None }
    }
}

/// Door checks that need no state: size, decoding, schema, signature.
pub fn door_check(bytes: &[u8]) -> Result<(Rollout, Candidate), RejectReason> {
    door(bytes).map_err(|r| r.reason)
}

/// [`door_check`], telling who signed a rollout whose signature fails.
pub fn door(bytes: &[u8]) -> Result<(Rollout, Candidate), DoorRefusal> {
    if bytes.len() > wire::MAX_ROLLOUT_LEN as usize {
        return Err(RejectReason::Oversized.into());
    }
    let r = Rollout::decode(bytes, &RolloutLimits::DEFAULT).map_err(|_| RejectReason::Malformed)?;
    let n = r.tokens.len();
    let p = r.prompt_len as usize;
    if p == 0 || p >= n || r.logprobs.len() != n - p || r.sketches.len() != n || !r.reward.is_finite() {
        return Err(RejectReason::Schema.into());
    }
    // The digest names the rollout and is what the miner signed: one encode,
    // one hash (the same computation as `Rollout::digest` and `Rollout::verify_signature`).
    let digest = r.digest();
    if rollout::verify_digest(&r.miner, &digest, &r.signature).is_err() {
        return Err(DoorRefusal { reason: RejectReason::BadSignature, signer: Some((r.window, PublicKey(r.miner))) });
    }
    let content = r.content_hash();
    let c = Candidate {
        window: r.window,
        checkpoint: r.checkpoint,
        env: r.env,
        group: r.group,
        index: r.rollout,
        task_id: r.task_id,
        miner: PublicKey(r.miner),
        digest,
        content,
    };
    Ok((r, c))
}

/// Records the coordinator's own hard verdict on `miner`'s `window` when a
/// refusal is one only that miner can have caused ([`Core::door_penalty`]).
fn penalise(sh: &Shared, now: u64, window: u64, miner: &PublicKey, reason: RejectReason) {
    let body = sh.core().door_penalty(now, window, miner, reason, sh.key.public());
    let Some(body) = body else { return };
    let v = wire::Verdict::sign(body, &sh.key);
    match sh.store.put_verdict(&v) {
        Ok(()) => {
            sh.core().apply_verdict(&v.body);
            metrics::counter!("tributary_door_penalties_total", "reason" => reason.as_str()).increment(1);
            tracing::warn!(miner = %miner.short(), window, reason = reason.as_str(), "miner failed at the door");
        }
        Err(e) => tracing::error!(error = %e, "storing a door penalty"),
    }
}

fn count_reject(reason: RejectReason) {
    metrics::counter!("tributary_rollouts_rejected_total", "reason" => reason.as_str()).increment(1);
}

/// A running QUIC server.
pub struct Server {
    /// The bound address.
    pub addr: SocketAddr,
    /// The endpoint.
    pub endpoint: quinn::Endpoint,
    /// Shared state.
    pub shared: Arc<Shared>,
}

impl Server {
    /// Binds and starts accepting connections.
    pub fn start(
        listen: SocketAddr,
        cert_der: Vec<u8>,
        key_der: Vec<u8>,
        shared: Arc<Shared>,
    ) -> Result<Self, NetError> {
        // The reset key follows the certificate key: after a restart on the
        // same folder, the predecessor's clients are reset at once.
        let endpoint = net::server_endpoint(listen, cert_der, key_der)?;
        let addr = endpoint.local_addr()?;
        let ep = endpoint.clone();
        let sh = shared.clone();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let ip = incoming.remote_address().ip();
                if sh.conn_limit.check_key(&ip).is_err() {
                    metrics::counter!("tributary_connections_refused_total", "reason" => "rate_limited").increment(1);
                    incoming.refuse();
                    continue;
                }
                let sh = sh.clone();
                tokio::spawn(async move {
                    match incoming.await {
                        Ok(conn) => {
                            metrics::gauge!("tributary_connections").increment(1.0);
                            if let Err(e) = handle_connection(conn, sh).await {
                                tracing::debug!(error = %e, "connection ended");
                            }
                            metrics::gauge!("tributary_connections").decrement(1.0);
                        }
                        Err(e) => tracing::debug!(error = %e, "handshake failed"),
                    }
                });
            }
        });
        Ok(Self { addr, endpoint, shared })
    }
}

async fn send_error(send: &mut quinn::SendStream, code: ErrorCode, detail: &str) {
    let _ = net::write_frame(send, &Frame::Error(ErrorFrame { code, detail: detail.into() })).await;
}

async fn handle_connection(conn: quinn::Connection, sh: Arc<Shared>) -> Result<(), NetError> {
    let (mut send, mut recv) = conn.accept_bi().await?;
    let handshake = tokio::time::timeout(Duration::from_secs(10), handshake(&mut send, &mut recv, &sh)).await;
    let (role, peer) = match handshake {
        Ok(Ok(Some(x))) => x,
        Ok(Ok(None)) => {
            linger(&mut send).await;
            conn.close(1u32.into(), b"handshake refused");
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            conn.close(1u32.into(), b"handshake timeout");
            return Ok(());
        }
    };
    let span = tracing::info_span!("peer", role = role.as_str(), key = %peer.short());
    span.in_scope(|| tracing::info!("authenticated"));
    // Answers go out in request order, as their results become ready.
    let (ans_tx, mut ans_rx) = mpsc::channel::<oneshot::Receiver<Frame>>(4096);
    let writer = tokio::spawn(async move {
        while let Some(rx) = ans_rx.recv().await {
            let Ok(frame) = rx.await else { continue };
            let close = matches!(&frame, Frame::Error(e) if e.code.closes_connection());
            if net::write_frame(&mut send, &frame).await.is_err() {
                break;
            }
            if close {
                break;
            }
        }
        send
    });
    let result = serve_requests(&conn, &mut recv, &sh, role, peer, &ans_tx).instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(?result, "connection finished"));
    drop(ans_tx);
    if let Ok(mut send) = writer.await {
        if !matches!(result, Ok(false)) {
            linger(&mut send).await;
        }
    }
    match &result {
        Err(NetError::Wire(_)) => conn.close(2u32.into(), b"malformed frame"),
        Ok(true) => conn.close(3u32.into(), b"protocol violation"),
        _ => {}
    }
    result.map(|_| ())
}

/// Returns `Ok(true)` if the connection must be closed for a violation.
async fn serve_requests(
    _conn: &quinn::Connection,
    recv: &mut quinn::RecvStream,
    sh: &Arc<Shared>,
    role: Role,
    peer: PublicKey,
    answers: &mpsc::Sender<oneshot::Receiver<Frame>>,
) -> Result<bool, NetError> {
    let ready = |f: Frame| {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(f);
        rx
    };
    let mut ingest = Ingest::new();
    loop {
        let frame = match net::read_frame(recv).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(false),
            Err(NetError::Wire(e)) => {
                metrics::counter!("tributary_frames_refused_total", "reason" => "malformed").increment(1);
                let _ = answers
                    .send(ready(Frame::Error(ErrorFrame { code: ErrorCode::Malformed, detail: e.to_string() })))
                    .await;
                return Err(NetError::Wire(e));
            }
            Err(e) => return Err(e),
        };
        let now = now_ms();
        let answer = match (role, frame) {
            (_, Frame::GetWindow(g)) => {
                let core = sh.core();
                let w = g.window.or_else(|| core.current_window(now));
                match w.and_then(|w| core.window_info(w, now)) {
                    Some(info) => Frame::WindowInfo(info),
                    None => err(ErrorCode::NotYet, "window not open"),
                }
            }
            (_, Frame::GetReveal(g)) => match sh.core().reveal(g.window, now) {
                Some(secret) => Frame::Reveal(Reveal { window: g.window, secret: secret.0 }),
                None => err(ErrorCode::NotYet, "submissions still open"),
            },
            (_, Frame::GetWeights(_)) => match crate::weights::latest(sh) {
                Ok(Some(doc)) => Frame::Weights(doc),
                Ok(None) => err(ErrorCode::NotYet, "no weights document signed yet"),
                Err(e) => err(ErrorCode::Internal, &e.to_string()),
            },
            (Role::Miner, Frame::GetProgress(g)) => {
                Frame::Progress(Progress { window: g.window, slots: sh.core().progress(g.window, &peer) })
            }
            (Role::Miner, Frame::Submit(s)) => {
                let rx = ingest.submit(sh, &peer, s.seq, vec![s.rollout.0], false, now).await;
                if answers.send(rx).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Miner, Frame::SubmitBatch(b)) => {
                let items = b.rollouts.into_iter().map(|r| r.0).collect();
                let rx = ingest.submit(sh, &peer, b.seq, items, true, now).await;
                if answers.send(rx).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::FetchRollouts(f)) => fetch(sh, role, f, now),
            (Role::Validator | Role::Trainer, Frame::GetStanding(g)) => {
                Frame::Standing(wire::Standing { window: g.window, miners: sh.core().standing(g.window) })
            }
            (Role::Validator, Frame::PostVerdict(v)) => {
                let ok = v.verify().is_ok();
                let res = sh.core().record_verdict(now, &v.body, ok);
                match res {
                    Ok(()) => match sh.store.put_verdict(&v) {
                        Ok(()) => Frame::VerdictAck(VerdictAck { window: v.body.window, miner: v.body.miner }),
                        Err(e) => err(ErrorCode::Internal, &e.to_string()),
                    },
                    Err(e) => err(ErrorCode::BadSignature, &e.to_string()),
                }
            }
            (Role::Trainer, Frame::PostTrainerStats(s)) => crate::dashboard::receive_trainer_stats(sh, s),
            (Role::Trainer, Frame::PublishCheckpoint(p)) => match receive_checkpoint(sh, recv, p, now).await {
                Ok(f) => f,
                Err(e) => return Err(e),
            },
            (_, Frame::GetCheckpointPath(g)) => {
                sh.relay.note_holds(peer, g.have);
                match sh.relay.path(g.have, g.want) {
                    Ok(p) => Frame::CheckpointPath(p),
                    Err(e) => relay_err(&e),
                }
            }
            (_, Frame::GetCheckpoint(g)) => {
                if answers.send(read_payload(sh, Payload::Full(g.id), g.id, g.offset)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (_, Frame::GetDelta(g)) => {
                let what = Payload::Delta { base: g.base, id: g.id };
                if answers.send(read_payload(sh, what, g.id, g.offset)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (_, other) => {
                metrics::counter!("tributary_frames_refused_total", "reason" => "unexpected").increment(1);
                let _ = answers
                    .send(ready(err(
                        ErrorCode::UnexpectedFrame,
                        &format!("{:?} not allowed for {}", other.tag(), role.as_str()),
                    )))
                    .await;
                return Ok(true);
            }
        };
        if answers.send(ready(answer)).await.is_err() {
            return Ok(false);
        }
    }
}

/// Finishes the stream and gives the peer a bounded moment to read the last
/// frame before the connection is closed (a close discards unsent data).
async fn linger(send: &mut quinn::SendStream) {
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_millis(500), send.stopped()).await;
}

fn relay_err(e: &RelayError) -> Frame {
    let code = match e {
        RelayError::NotFound(_) => ErrorCode::NotFound,
        RelayError::BadPayload(_) | RelayError::Delta(_) | RelayError::WindowTaken { .. } => ErrorCode::Malformed,
        RelayError::Io { .. } => ErrorCode::Internal,
    };
    err(code, &e.to_string())
}

/// Reads a payload chunk off the connection's task (file I/O).
fn read_payload(sh: &Arc<Shared>, what: Payload, id: ContentId, offset: u64) -> oneshot::Receiver<Frame> {
    let (tx, rx) = oneshot::channel();
    let relay = sh.relay.clone();
    tokio::task::spawn_blocking(move || {
        let f = match relay.read(what, offset) {
            Ok(data) => Frame::CheckpointChunk(wire::CheckpointChunk { id, offset, data: wire::Blob(data) }),
            Err(e) => relay_err(&e),
        };
        let _ = tx.send(f);
    });
    rx
}

fn err(code: ErrorCode, detail: &str) -> Frame {
    Frame::Error(ErrorFrame { code, detail: detail.into() })
}

async fn handshake(
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    sh: &Shared,
) -> Result<Option<(Role, PublicKey)>, NetError> {
    let hello = match net::read_frame(recv).await? {
        Some(Frame::Hello(h)) => h,
        _ => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Hello").await;
            return Ok(None);
        }
    };
    if hello.version != wire::PROTOCOL_VERSION {
        send_error(send, ErrorCode::Version, "unsupported protocol version").await;
        return Ok(None);
    }
    if !sh.core().access().permits(hello.role, &hello.key) {
        metrics::counter!("tributary_connections_refused_total", "reason" => "unauthorized").increment(1);
        send_error(send, ErrorCode::Unauthorized, "key may not take this role").await;
        return Ok(None);
    }
    let nonce: [u8; 32] = rand::random();
    let coordinator = sh.key.public();
    net::write_frame(send, &Frame::Challenge(Challenge { nonce, coordinator })).await?;
    let auth = match net::read_frame(recv).await? {
        Some(Frame::Auth(a)) => a,
        _ => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Auth").await;
            return Ok(None);
        }
    };
    let msg = wire::handshake_bytes(&nonce, &coordinator, &hello);
    if hello.key.verify(identity::domain::HANDSHAKE, &msg, &auth.signature).is_err() {
        metrics::counter!("tributary_connections_refused_total", "reason" => "bad_handshake").increment(1);
        send_error(send, ErrorCode::BadHandshake, "signature does not verify").await;
        return Ok(None);
    }
    let schedule = *sh.core().schedule();
    net::write_frame(send, &Frame::Welcome(Welcome { now_ms: now_ms(), schedule })).await?;
    Ok(Some((hello.role, hello.key)))
}

/// In-flight submission bytes per connection (KiB): past this, the
/// connection's reader waits for answers, and QUIC flow control slows the sender.
const INFLIGHT_KIB: usize = 64 << 10;

/// Submissions of at least this many rollouts have their door checks on the
/// blocking pool; smaller ones on their own task.
const BLOCKING_CHECKS: usize = 4;

/// One connection's ingestion pipeline. Door checks (decoding, signature) of
/// successive submissions run in parallel on their own tasks; admission
/// (window, assignment, dedupe) and the write queue follow the submission
/// order; each answer goes out, in order, once its rollouts are durable.
struct Ingest {
    inflight: Arc<Semaphore>,
    /// Fires once the previous submission has been admitted and queued.
    admitted: Option<oneshot::Receiver<()>>,
}

impl Ingest {
    fn new() -> Self {
        Self { inflight: Arc::new(Semaphore::new(INFLIGHT_KIB)), admitted: None }
    }

    /// Takes a submission of one (`Submit`) or several (`SubmitBatch`)
    /// encoded rollouts; the receiver yields its answer frame.
    async fn submit(
        &mut self,
        sh: &Arc<Shared>,
        peer: &PublicKey,
        seq: u64,
        items: Vec<Vec<u8>>,
        batch: bool,
        now: u64,
    ) -> oneshot::Receiver<Frame> {
        let (tx, rx) = oneshot::channel();
        let started = Instant::now();
        let kib: usize = items.iter().map(|b| b.len().div_ceil(1024).max(1)).sum();
        let permits = u32::try_from(kib.min(INFLIGHT_KIB)).unwrap_or(u32::MAX);
        // The semaphore is never closed; without a permit the submission simply goes unthrottled.
        let permit = self.inflight.clone().acquire_many_owned(permits).await.ok();
        // Rate limits, per rollout, in submission order.
        let mut bytes_in = 0u64;
        let items: Vec<Option<Vec<u8>>> = items
            .into_iter()
            .map(|bytes| {
                let kib = NonZeroU32::new((bytes.len() as u32).div_ceil(1024).max(1)).unwrap_or(NonZeroU32::MIN);
                let ok = matches!(sh.byte_limit.check_key_n(peer, kib), Ok(Ok(())))
                    && sh.rollout_limit.check_key(peer).is_ok();
                bytes_in += bytes.len() as u64 * u64::from(ok);
                ok.then_some(bytes)
            })
            .collect();
        metrics::counter!("tributary_rollout_bytes_total").increment(bytes_in);
        let (admitted_tx, admitted_rx) = oneshot::channel();
        let previous = self.admitted.replace(admitted_rx);
        let (sh, peer) = (sh.clone(), *peer);
        tokio::spawn(async move {
            let outcomes = ingest(&sh, peer, items, previous, admitted_tx, now, started).await;
            let answer = match (batch, outcomes.first()) {
                (false, Some(Outcome::Stored(digest))) => Frame::Ack(Ack { seq, digest: *digest }),
                (false, Some(Outcome::Refused(reason))) => Frame::Refused(Refused { seq, reason: *reason }),
                _ => Frame::BatchAnswer(BatchAnswer { seq, outcomes }),
            };
            let _ = tx.send(answer);
            drop(permit);
        });
        rx
    }
}

type Checked = Option<Result<(Candidate, Vec<u8>), DoorRefusal>>;

/// The stateless door checks of a submission's rollouts (`None`: rate limited).
fn check_all(items: Vec<Option<Vec<u8>>>) -> Vec<Checked> {
    items.into_iter().map(|item| item.map(|bytes| door(&bytes).map(|(_, c)| (c, bytes)))).collect()
}

/// Checks, admits, stores and counts one submission's rollouts; returns
/// their outcomes in order. Nothing is `Stored` before its commit.
async fn ingest(
    sh: &Arc<Shared>,
    peer: PublicKey,
    items: Vec<Option<Vec<u8>>>,
    previous: Option<oneshot::Receiver<()>>,
    admitted: oneshot::Sender<()>,
    now: u64,
    started: Instant,
) -> Vec<Outcome> {
    let n = items.len();
    let checked = if items.iter().flatten().count() >= BLOCKING_CHECKS {
        tokio::task::spawn_blocking(move || check_all(items)).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "door checks failed");
            vec![Some(Err(RejectReason::Internal.into())); n]
        })
    } else {
        check_all(items)
    };
    // Admission follows the submission order of the connection.
    if let Some(p) = previous {
        let _ = p.await;
    }
    let mut outcomes = vec![Outcome::Refused(RejectReason::Internal); n];
    let mut to_store = Vec::with_capacity(n);
    let mut slots = Vec::with_capacity(n);
    {
        let mut core = sh.core();
        for (i, c) in checked.into_iter().enumerate() {
            let mut penalty = None;
            let reason = match c {
                None => {
                    core.count_rejection(Some(&peer), RejectReason::RateLimited);
                    RejectReason::RateLimited
                }
                Some(Err(refusal)) => {
                    core.count_rejection(Some(&peer), refusal.reason);
                    // Signed over the peer's own key yet not verifying: only the peer can have sent that.
                    if let Some((window, _)) = refusal.signer.filter(|(_, s)| *s == peer) {
                        penalty = Some(window);
                    }
                    refusal.reason
                }
                Some(Ok((candidate, bytes))) => match core.admit(now, &peer, &candidate) {
                    Ok(()) => {
                        slots.push(i);
                        to_store.push(StoredRollout { candidate, bytes });
                        continue;
                    }
                    Err(reason) => {
                        penalty = Some(candidate.window);
                        reason
                    }
                },
            };
            count_reject(reason);
            outcomes[i] = Outcome::Refused(reason);
            if let Some(window) = penalty {
                // In force before the next rollout is admitted, as for a stream of single submissions.
                drop(core);
                penalise(sh, now, window, &peer, reason);
                core = sh.core();
            }
        }
    }
    let candidates: Vec<Candidate> = to_store.iter().map(|r| r.candidate.clone()).collect();
    let done = if to_store.is_empty() {
        None
    } else {
        let (done_tx, done_rx) = oneshot::channel();
        match sh.writer.send(WriteJob { rollouts: to_store, done: done_tx }).await {
            Ok(()) => Some(done_rx),
            Err(_) => None,
        }
    };
    let _ = admitted.send(());
    if candidates.is_empty() {
        return outcomes;
    }
    let stored = match done {
        Some(rx) => matches!(rx.await, Ok(Ok(()))),
        None => false,
    };
    {
        let mut core = sh.core();
        for (c, &i) in candidates.iter().zip(&slots) {
            if stored {
                core.commit(c);
                outcomes[i] = Outcome::Stored(c.digest);
            } else {
                core.abort(c);
                count_reject(RejectReason::Internal);
            }
        }
    }
    if stored {
        if let Some(last) = candidates.last() {
            sh.relay.note_generating(last.miner, last.checkpoint);
        }
        metrics::counter!("tributary_rollouts_accepted_total").increment(candidates.len() as u64);
        metrics::histogram!("tributary_ingest_latency_seconds").record(started.elapsed().as_secs_f64());
    }
    outcomes
}

fn fetch(sh: &Shared, role: Role, f: wire::FetchRollouts, now: u64) -> Frame {
    let core = sh.core();
    if core.reveal(f.window, now).is_none() {
        return err(ErrorCode::NotYet, "window's submissions have not closed");
    }
    if role == Role::Trainer {
        if let Some(m) = &f.miner {
            if core.is_banned(m, f.window) {
                return Frame::Rollouts(Rollouts { window: f.window, items: vec![], next: None });
            }
        }
    }
    drop(core);
    // Keep each answer well under the frame limit.
    let limit = (f.limit as usize).clamp(1, 256);
    match sh.store.rollouts(f.window, f.miner.as_ref(), f.after, limit) {
        Ok((items, next)) => {
            let items = if role == Role::Trainer {
                let core = sh.core();
                items
                    .into_iter()
                    .filter(|b| {
                        Rollout::decode(b, &RolloutLimits::DEFAULT)
                            .is_ok_and(|r| !core.is_banned(&PublicKey(r.miner), f.window))
                    })
                    .collect()
            } else {
                items
            };
            Frame::Rollouts(Rollouts { window: f.window, items: items.into_iter().map(wire::Blob).collect(), next })
        }
        Err(e) => err(ErrorCode::Internal, &e.to_string()),
    }
}

async fn receive_checkpoint(
    sh: &Arc<Shared>,
    recv: &mut quinn::RecvStream,
    p: wire::PublishCheckpoint,
    now: u64,
) -> Result<Frame, NetError> {
    use tokio::io::AsyncWriteExt;
    // Payloads are bounded: 64 GiB at most, streamed to a file chunk by chunk in order.
    if p.body.len > 64 << 30 {
        return Ok(err(ErrorCode::Malformed, "checkpoint too large"));
    }
    let upload = sh.relay.incoming_path(&p.body.id);
    let mut file = tokio::fs::File::create(&upload).await?;
    let mut hasher = blake3::Hasher::new();
    let mut got = 0u64;
    let mut refusal = None;
    while got < p.body.len {
        match net::read_frame(recv).await?.ok_or(NetError::Closed)? {
            Frame::CheckpointChunk(c) if c.id == p.body.id && c.offset == got => {
                if got + c.data.0.len() as u64 > p.body.len || c.data.0.is_empty() {
                    refusal = Some(err(ErrorCode::Malformed, "chunk empty or past the announced length"));
                    break;
                }
                hasher.update(&c.data.0);
                file.write_all(&c.data.0).await?;
                got += c.data.0.len() as u64;
            }
            _ => {
                refusal = Some(err(ErrorCode::UnexpectedFrame, "expected the next checkpoint chunk"));
                break;
            }
        }
    }
    file.sync_all().await?;
    drop(file);
    let refuse = |f: Frame| {
        let _ = std::fs::remove_file(&upload);
        Ok(f)
    };
    if let Some(f) = refusal {
        return refuse(f);
    }
    if hasher.finalize().as_bytes() != &p.body.payload_hash {
        return refuse(err(ErrorCode::Malformed, "payload hash mismatch"));
    }
    if p.verify().is_err() {
        return refuse(err(ErrorCode::BadSignature, "checkpoint announcement signature"));
    }
    // Idempotent for the same checkpoint; never two checkpoints for one window.
    if sh.relay.entry(&p.body.id).is_some() {
        return refuse(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }));
    }
    match sh.store.checkpoints() {
        Ok(all) => {
            if let Some((_, a)) = all.iter().find(|(_, a)| a.body.window == p.body.window) {
                let e = RelayError::WindowTaken { window: p.body.window, existing: a.body.id };
                return refuse(relay_err(&e));
            }
        }
        Err(e) => return refuse(err(ErrorCode::Internal, &e.to_string())),
    }
    let from = {
        let core = sh.core();
        let current = core.current_window(now).unwrap_or(0);
        p.body.window.max(current).saturating_add(1)
    };
    let relay = sh.relay.clone();
    let ann = p.clone();
    let ingested = tokio::task::spawn_blocking(move || relay.ingest(&ann, &upload, from)).await;
    let entry = match ingested {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return Ok(relay_err(&e)),
        Err(e) => return Ok(err(ErrorCode::Internal, &e.to_string())),
    };
    if let Err(e) = sh.store.put_checkpoint(from, &p, &entry) {
        return Ok(err(ErrorCode::Internal, &e.to_string()));
    }
    let from = sh.core().publish_checkpoint(now, &p.body);
    sh.relay.insert(entry);
    metrics::counter!("tributary_checkpoints_published_total").increment(1);
    tracing::info!(id = %p.body.id, window = p.body.window, from, "checkpoint published");
    Ok(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }))
}
