//! The QUIC server: handshake, ingestion with durable acknowledgements,
//! serving, verdicts, checkpoints and rate limits, around [`Core`] and [`Store`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tracing::Instrument;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::{self, Keypair, PublicKey};
use tributary_protocol::rollout::{self, Rollout, RolloutLimits};
use tributary_protocol::window::{Schedule, WindowId};
use tributary_protocol::wire::{
    self, Ack, BatchAnswer, Challenge, ErrorCode, ErrorFrame, Frame, Outcome, Progress, Refused, RejectReason, Role,
    Rollouts, Tag, VerdictAck, Welcome,
};

use crate::core::{Candidate, Core, Shape};
use crate::net::{self, NetError};
use crate::relay::{CHUNK_LEN, Payload, Relay, RelayError};
use crate::store::{Store, StoreError, StoredRollout};

/// Rate limits and resource bounds of the QUIC server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connection attempts per second per source address (IPv4) or /64
    /// (IPv6), counted only once the address is validated (QUIC Retry).
    pub connections_per_sec: u32,
    /// Submitted KiB per second per miner key (burst: one second's worth).
    pub kib_per_sec: u32,
    /// Submissions per second per miner key.
    pub rollouts_per_sec: u32,
    /// Other requests per second per miner key (burst: one second's worth).
    pub requests_per_sec: u32,
    /// Connections open at once, in all.
    pub max_connections: u32,
    /// Connections open at once from one address (IPv4) or /64 (IPv6).
    pub max_connections_per_address: u32,
    /// Authenticated connections open at once per key.
    pub max_connections_per_key: u32,
    /// A miner connection that sends no frame for this long is closed (ms).
    pub idle_timeout_ms: u64,
    /// A connection must have opened its stream and finished the handshake
    /// this long after it is up (ms).
    pub handshake_timeout_ms: u64,
    /// Door penalties (coordinator-signed verdicts) recorded per second, in all.
    pub penalties_per_sec: u32,
    /// MiB of checkpoint payload read for answers at once, in all (each
    /// connection holds at most one chunk).
    pub relay_inflight_mib: u32,
    /// MiB of submissions read and not yet answered, in all.
    pub ingest_inflight_mib: u32,
    /// Windows of rollouts kept (0: all).
    pub keep_windows: u64,
    /// Free MiB the database's disk must keep before a commit of rollouts.
    pub min_free_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections_per_sec: 20,
            kib_per_sec: 64 << 10,
            rollouts_per_sec: 20_000,
            requests_per_sec: 200,
            max_connections: 2048,
            max_connections_per_address: 64,
            max_connections_per_key: 8,
            idle_timeout_ms: 300_000,
            handshake_timeout_ms: 10_000,
            penalties_per_sec: 2,
            relay_inflight_mib: 256,
            ingest_inflight_mib: 256,
            keep_windows: 240,
            min_free_mib: 1024,
        }
    }
}

/// A frame's body must arrive this long after its header.
const BODY_DEADLINE: Duration = Duration::from_secs(60);

/// The most rollout bytes in one `Rollouts` answer (half the frame limit:
/// one more rollout never takes it past the limit).
pub const ROLLOUTS_ANSWER_BYTES: usize = (wire::MAX_BODY_LEN / 2) as usize;

/// Answers queued per connection (request/response clients have a few in flight).
const ANSWER_QUEUE: usize = 64;

/// Milliseconds since the Unix epoch (the one clock every role reads).
pub use tributary_net::now_ms;

struct WriteJob {
    rollouts: Vec<StoredRollout>,
    /// Per rollout: whether it was stored (`false`: its window had closed
    /// before the commit), or why the commit failed.
    done: oneshot::Sender<Result<Vec<bool>, String>>,
}

/// Seals windows: a rollout becomes durable only in a commit that began
/// before its window closed, and a fetch of a closed window waits for the
/// commit in progress, so every reader of a closed window sees the same set.
pub struct Seal {
    lock: Mutex<()>,
    schedule: Schedule,
}

impl Seal {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Which address prefix a connection counts against: the IPv4 address, or
/// the /64 of an IPv6 one (one host commonly holds a whole /64).
pub fn address_prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[derive(Debug, Default)]
struct ConnCounts {
    total: u32,
    by_prefix: HashMap<IpAddr, u32>,
    by_key: HashMap<PublicKey, u32>,
}

/// An open connection's place in the global and per-address counts.
struct AddressSlot {
    sh: Arc<Shared>,
    prefix: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut c = self.sh.conns();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_prefix.get_mut(&self.prefix) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_prefix.remove(&self.prefix);
            }
        }
        metrics::gauge!("tributary_connections").set(f64::from(c.total));
    }
}

/// An authenticated connection's place in its key's count.
struct KeySlot {
    sh: Arc<Shared>,
    key: PublicKey,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut c = self.sh.conns();
        if let Some(n) = c.by_key.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_key.remove(&self.key);
            }
        }
    }
}

/// At most one warning per second per kind: a flood of refusals is logged
/// with the count of those not logged, not one line each.
#[derive(Debug, Default)]
struct WarnThrottle(Mutex<HashMap<&'static str, (Option<Instant>, u64)>>);

impl WarnThrottle {
    /// `Some(suppressed since the last warning)` if this one is to be logged.
    fn allow(&self, kind: &'static str) -> Option<u64> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(kind).or_insert((None, 0));
        let now = Instant::now();
        if e.0.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            e.1 += 1;
            return None;
        }
        let suppressed = e.1;
        *e = (Some(now), 0);
        Some(suppressed)
    }
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
    seal: Arc<Seal>,
    limits: Limits,
    conn_limit: DefaultKeyedRateLimiter<IpAddr>,
    byte_limit: DefaultKeyedRateLimiter<PublicKey>,
    rollout_limit: DefaultKeyedRateLimiter<PublicKey>,
    request_limit: DefaultKeyedRateLimiter<PublicKey>,
    penalty_limit: DefaultDirectRateLimiter,
    conns: Mutex<ConnCounts>,
    relay_budget: Arc<Semaphore>,
    ingest_budget: Arc<Semaphore>,
    warn: WarnThrottle,
    /// The model-free re-check of failures validators report ([`crate::bans`]).
    recheck: Option<crate::bans::Rechecker>,
    /// Closed windows are archived to an object store ([`crate::archive`]):
    /// retention deletes only windows already archived.
    archiving: std::sync::atomic::AtomicBool,
    /// A lower byte cap on list answers than their own (0: none).
    list_cap: std::sync::atomic::AtomicUsize,
    /// Operator actions applied live (bans, unbans, cleared validators):
    /// a snapshot made before the latest one is stale ([`crate::dashboard`]).
    admin_changes: std::sync::atomic::AtomicU64,
    /// Closed windows' manifests for readers ([`crate::archive::Readers`]).
    readers: std::sync::OnceLock<crate::archive::Readers>,
}

impl Shared {
    /// This coordinator's network: what every signed document it takes or
    /// signs names ([`wire::NetworkId::of`] its key).
    pub fn network(&self) -> wire::NetworkId {
        wire::NetworkId::of(&self.key.public())
    }

    /// Locks the core (a poisoned lock is recovered: the core has no invariants a panic can break half-way).
    pub fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conns(&self) -> MutexGuard<'_, ConnCounts> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once every submission handed to the group-commit writer
    /// before the call is committed (or refused) and answered: an empty job
    /// queued behind them ([`Node::shutdown`](crate::node::Node::shutdown)).
    pub async fn flush_commits(&self) {
        let (done, rx) = oneshot::channel();
        if self.writer.send(WriteJob { rollouts: Vec::new(), done }).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Holds the commit of rollouts: while the guard lives no rollout becomes
    /// durable (the writer waits), and fetches of closed windows wait too.
    /// For tests and maintenance.
    pub fn hold_commits(&self) -> MutexGuard<'_, ()> {
        self.seal.lock()
    }

    /// From now on retention deletes only windows already archived
    /// ([`crate::upkeep::archive_closed_windows`] runs).
    pub fn set_archiving(&self) {
        self.archiving.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Validators and the trainer are handed closed windows' manifests in
    /// this store (`GetWindowManifest`); once set, it stays.
    pub fn set_readers(&self, readers: crate::archive::Readers) {
        let _ = self.readers.set(readers);
    }

    /// Caps every paged list answer (window index, standing, weights
    /// parts) at `bytes` (0: each its own cap), so a client is seen reading
    /// a long list across many pages. For tests.
    pub fn set_list_answer_bytes(&self, bytes: usize) {
        self.list_cap.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records an operator action applied to the core (ban, unban, cleared
    /// validator): the dashboard's snapshots made before it are not served again.
    pub fn note_admin_change(&self) {
        self.admin_changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many operator actions were applied live ([`Shared::note_admin_change`]).
    pub fn admin_changes(&self) -> u64 {
        self.admin_changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A list answer's byte cap: `default`, or lower if so set.
    fn list_answer_bytes(&self, default: usize) -> usize {
        match self.list_cap.load(std::sync::atomic::Ordering::Relaxed) {
            0 => default,
            n => n.min(default),
        }
    }

    /// The server's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Connections open now: in all, and from `ip`'s prefix.
    pub fn connections(&self, ip: IpAddr) -> (u32, u32) {
        let c = self.conns();
        (c.total, c.by_prefix.get(&address_prefix(ip)).copied().unwrap_or(0))
    }

    /// KiB of checkpoint payload read for answers and not yet sent, in all.
    pub fn relay_inflight_kib(&self) -> usize {
        (self.limits.relay_inflight_mib as usize * 1024).saturating_sub(self.relay_budget.available_permits())
    }

    /// Logs a refusal at warn, at most once a second per `kind` (with the
    /// number not logged since).
    fn warn_refusal(&self, kind: &'static str, detail: impl FnOnce() -> String) {
        if let Some(suppressed) = self.warn.allow(kind) {
            tracing::warn!(kind, suppressed, "{}", detail());
        }
    }

    fn take_address_slot(self: &Arc<Self>, ip: IpAddr) -> Result<AddressSlot, &'static str> {
        let prefix = address_prefix(ip);
        let mut c = self.conns();
        if c.total >= self.limits.max_connections {
            return Err("max_connections");
        }
        let n = c.by_prefix.entry(prefix).or_insert(0);
        if *n >= self.limits.max_connections_per_address {
            return Err("max_connections_per_address");
        }
        *n += 1;
        c.total += 1;
        metrics::gauge!("tributary_connections").set(f64::from(c.total));
        Ok(AddressSlot { sh: self.clone(), prefix })
    }

    fn take_key_slot(self: &Arc<Self>, key: PublicKey) -> Option<KeySlot> {
        let mut c = self.conns();
        let n = c.by_key.entry(key).or_insert(0);
        if *n >= self.limits.max_connections_per_key {
            return None;
        }
        *n += 1;
        Some(KeySlot { sh: self.clone(), key })
    }

    /// Deletes the rollouts of windows older than the retention
    /// (`keep_windows` before the current one). Returns how many went.
    pub fn apply_retention(&self, now: u64) -> u64 {
        let keep = self.limits.keep_windows;
        let Some(current) = self.core().current_window(now) else { return 0 };
        if keep == 0 || current <= keep {
            return 0;
        }
        let mut before = current - keep;
        if self.archiving.load(std::sync::atomic::Ordering::Relaxed) {
            // Nothing leaves redb before it is in the object store.
            match crate::archive::archived_upto(&self.store) {
                Ok(Some(upto)) => before = before.min(upto),
                Ok(None) => return 0,
                Err(e) => {
                    tracing::error!(error = %e, "retention: archive progress unreadable");
                    return 0;
                }
            }
        }
        self.prune_beacon_records(current, before);
        match self.store.prune_rollouts(before) {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(rollouts = n, before, "old windows' rollouts deleted (retention)");
                }
                n
            }
            Err(e) => {
                tracing::error!(error = %e, "retention failed");
                0
            }
        }
    }

    /// Deletes the challenge contributions of windows before `before` (the
    /// retention's), keeping those a restart reads back to fix committees
    /// (`max(ban_windows, weight_windows) + 2` windows before `current`).
    fn prune_beacon_records(&self, current: WindowId, before: WindowId) {
        let kept = {
            let core = self.core();
            core.config().ban_windows.max(core.config().weight_windows) + 2
        };
        let before = before.min(current.saturating_sub(kept));
        match self.store.prune_window_meta(BEACON_META_PREFIX, before) {
            Ok(n) if n > 0 => tracing::info!(windows = n, before, "old windows' challenge contributions deleted"),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "retention of challenge contributions failed"),
        }
    }

    /// Forgets rate-limiter state of keys and addresses that are idle.
    pub fn prune_limiters(&self) {
        for l in [&self.byte_limit, &self.rollout_limit, &self.request_limit] {
            l.retain_recent();
            l.shrink_to_fit();
        }
        self.conn_limit.retain_recent();
        self.conn_limit.shrink_to_fit();
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
    // The coordinator's own verdicts (door penalties, re-checks) confirm a failure by themselves.
    core.set_coordinator(key.public());
    // Contributions to the challenges before the verdicts: they fix the
    // committees a confirmation needs.
    let current = core.current_window(now_ms()).unwrap_or(0);
    let kept = core.config().ban_windows.max(core.config().weight_windows) + 2;
    for w in current.saturating_sub(kept)..=current.saturating_add(crate::core::BEACON_COMMIT_AHEAD) {
        if let Some(bytes) = store.meta(&beacon_meta_key(w))? {
            match postcard::from_bytes::<crate::core::BeaconBook>(&bytes) {
                Ok(book) => core.restore_beacon(w, book),
                Err(e) => tracing::warn!(window = w, error = %e, "unreadable challenge contributions"),
            }
        }
    }
    for v in store.verdicts()? {
        core.apply_verdict(&v.body);
    }
    let recheck = match crate::bans::Rechecker::open(&relay.full_path(&core.config().genesis_checkpoint), None) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "no model-free re-check of failures: each needs a second validator or the trainer");
            None
        }
    };
    // Without its own re-check, model-free evidence also waits for a confirmer.
    core.set_model_free_recheck(recheck.is_some());
    core.prune(now_ms());
    let (tx, rx) = mpsc::channel::<WriteJob>(1024);
    let st = store.clone();
    let seal = Arc::new(Seal { lock: Mutex::new(()), schedule: *core.schedule() });
    let ws = seal.clone();
    let min_free = limits.min_free_mib.saturating_mul(1 << 20);
    std::thread::Builder::new()
        .name("redb-writer".into())
        .spawn(move || writer_loop(st, rx, ws, min_free))
        .map_err(|e| StoreError::from(redb::Error::Io(e)))?;
    Ok(Arc::new(Shared {
        core: Mutex::new(core),
        store,
        key,
        relay,
        writer: tx,
        seal,
        limits,
        conn_limit: RateLimiter::keyed(quota(limits.connections_per_sec)),
        byte_limit: RateLimiter::keyed(quota(limits.kib_per_sec)),
        rollout_limit: RateLimiter::keyed(quota(limits.rollouts_per_sec)),
        request_limit: RateLimiter::keyed(quota(limits.requests_per_sec)),
        penalty_limit: RateLimiter::direct(quota(limits.penalties_per_sec)),
        conns: Mutex::new(ConnCounts::default()),
        relay_budget: Arc::new(Semaphore::new((limits.relay_inflight_mib.max(4) as usize) << 10)),
        ingest_budget: Arc::new(Semaphore::new((limits.ingest_inflight_mib.max(8) as usize) << 10)),
        warn: WarnThrottle::default(),
        recheck,
        archiving: std::sync::atomic::AtomicBool::new(false),
        list_cap: std::sync::atomic::AtomicUsize::new(0),
        admin_changes: std::sync::atomic::AtomicU64::new(0),
        readers: std::sync::OnceLock::new(),
    }))
}

/// The prefix of the store's meta keys of each window's challenge contributions.
const BEACON_META_PREFIX: &str = "beacon/";

/// The store's meta key of a window's contributions to its challenge.
fn beacon_meta_key(window: WindowId) -> String {
    format!("{BEACON_META_PREFIX}{window}")
}

/// Stores the window's contributions after a new commitment or reveal, then
/// answers; a refusal is logged and answered as an error.
fn beacon_answer(
    sh: &Arc<Shared>,
    peer: PublicKey,
    window: WindowId,
    res: Result<bool, crate::core::BeaconRefusal>,
) -> Frame {
    match res {
        Ok(false) => Frame::BeaconAck(wire::BeaconAck { window }),
        Ok(true) => {
            let book = sh.core().beacon_book(window).cloned().unwrap_or_default();
            match postcard::to_stdvec(&book) {
                Ok(bytes) => match sh.store.put_meta(&beacon_meta_key(window), &bytes) {
                    Ok(()) => Frame::BeaconAck(wire::BeaconAck { window }),
                    Err(e) => err(ErrorCode::Internal, &e.to_string()),
                },
                Err(e) => err(ErrorCode::Internal, &e.to_string()),
            }
        }
        Err(e) => {
            sh.warn_refusal("beacon", || format!("contribution of {} to window {window} refused: {e}", peer.short()));
            let code = match e {
                crate::core::BeaconRefusal::NotClosed => ErrorCode::NotYet,
                crate::core::BeaconRefusal::Unauthorized => ErrorCode::Unauthorized,
                crate::core::BeaconRefusal::BadSignature | crate::core::BeaconRefusal::Mismatch => {
                    ErrorCode::BadSignature
                }
                _ => ErrorCode::NotFound,
            };
            err(code, &e.to_string())
        }
    }
}

/// The most rollouts the writer gathers into one transaction.
const MAX_COMMIT_ROLLOUTS: usize = 4096;

/// Group commit: every job waiting (up to [`MAX_COMMIT_ROLLOUTS`] rollouts,
/// from any number of connections) is written in one durable transaction,
/// and each job is answered only after that commit. Admission is decided
/// by commit time: under the [`Seal`], a rollout whose window has closed is
/// left out (its submission is refused as `WrongWindow`).
fn writer_loop(store: Arc<Store>, mut rx: mpsc::Receiver<WriteJob>, seal: Arc<Seal>, min_free: u64) {
    while let Some(first) = rx.blocking_recv() {
        let mut count = first.rollouts.len();
        let mut jobs = vec![first];
        while count < MAX_COMMIT_ROLLOUTS {
            let Ok(j) = rx.try_recv() else { break };
            count += j.rollouts.len();
            jobs.push(j);
        }
        let guard = seal.lock();
        let now = now_ms();
        // Moved, not copied: each rollout's bytes go to the database once.
        let mut all: Vec<StoredRollout> = Vec::with_capacity(jobs.iter().map(|j| j.rollouts.len()).sum());
        let mut done = Vec::with_capacity(jobs.len());
        let mut late = 0usize;
        for j in jobs {
            let mut flags = Vec::with_capacity(j.rollouts.len());
            for r in j.rollouts {
                let open = now < seal.schedule.closes_at(r.candidate.window);
                flags.push(open);
                if open {
                    all.push(r);
                } else {
                    late += 1;
                }
            }
            done.push((j.done, flags));
        }
        let started = Instant::now();
        // A nearly full disk refuses new rollouts (the miner retries) before
        // redb hits an I/O error; everything stored is still served.
        let free = store.free_bytes();
        let res = if all.is_empty() {
            Ok(())
        } else if free.is_some_and(|f| f < min_free) {
            metrics::counter!("tributary_rollouts_refused_disk_full_total").increment(all.len() as u64);
            Err(format!("disk nearly full: {} MiB free, {} MiB kept free", free.unwrap_or(0) >> 20, min_free >> 20))
        } else {
            store.put_rollouts(&all).map_err(|e| {
                if Store::is_poisoned(&e) {
                    // redb refuses everything after an I/O error until it is
                    // reopened: exit so the supervisor restarts the coordinator
                    // (every acknowledged rollout is durable).
                    tracing::error!(error = %e, "database unusable after an I/O error; exiting for a restart");
                    std::process::exit(75);
                }
                e.to_string()
            })
        };
        drop(guard);
        if late > 0 {
            tracing::warn!(late, "rollouts refused: their window closed before they could be committed");
        }
        if let Err(e) = &res {
            tracing::error!(error = %e, rollouts = all.len(), "storing rollouts failed; their submissions are refused");
        }
        metrics::histogram!("tributary_redb_commit_seconds").record(started.elapsed().as_secs_f64());
        for (d, flags) in done {
            let _ = d.send(res.clone().map(|()| flags));
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
    let shape = Shape {
        sampling: r.sampling,
        prompt_len: r.prompt_len,
        completion_len: (n - p) as u32,
        max_token: r.tokens.iter().copied().max().unwrap_or(0),
        bytes: bytes.len() as u32,
    };
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
        shape,
    };
    Ok((r, c))
}

/// Records the coordinator's own hard verdict on `miner`'s `window` when a
/// refusal is one only that miner can have caused ([`Core::door_penalty`]),
/// and logs it at warn with its figures (the checkpoint the rollout named,
/// if it decoded, and the one its window uses) and the ban it starts.
fn penalise(sh: &Shared, now: u64, window: u64, miner: &PublicKey, reason: RejectReason, named: Option<ContentId>) {
    let body = sh.core().door_penalty(now, window, miner, reason, sh.key.public());
    let Some(body) = body else { return };
    // Each penalty is a signature and an fsync'd write: fresh keys must not
    // buy them without bound (the rollout is refused all the same).
    if sh.penalty_limit.check().is_err() {
        metrics::counter!("tributary_door_penalties_skipped_total").increment(1);
        sh.warn_refusal("penalty_rate", || {
            format!(
                "door penalty not recorded (global limit {}/s): miner {} window {window} reason {}",
                sh.limits.penalties_per_sec,
                miner.short(),
                reason.as_str()
            )
        });
        return;
    }
    let v = wire::Verdict::sign(body, &sh.key, &sh.network());
    match sh.store.put_verdict(&v) {
        Ok(()) => {
            let mut core = sh.core();
            core.apply_verdict(&v.body);
            let banned_through = core.miners().get(miner).and_then(|m| m.banned_through);
            let window_checkpoint = core.checkpoint_for(window);
            drop(core);
            metrics::counter!("tributary_door_penalties_total", "reason" => reason.as_str()).increment(1);
            tracing::warn!(
                miner = %miner.short(),
                window,
                reason = reason.as_str(),
                named_checkpoint = ?named.map(|c| c.to_string()),
                %window_checkpoint,
                ?banned_through,
                "miner failed at the door"
            );
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
                // Address validation first (QUIC Retry): a spoofed source never
                // returns the token, so it costs no state and no per-address budget.
                if !incoming.remote_address_validated() {
                    if incoming.may_retry() {
                        let _ = incoming.retry();
                    } else {
                        incoming.ignore();
                    }
                    continue;
                }
                let remote = incoming.remote_address();
                let prefix = address_prefix(remote.ip());
                if sh.conn_limit.check_key(&prefix).is_err() {
                    metrics::counter!("tributary_connections_refused_total", "reason" => "rate_limited").increment(1);
                    sh.warn_refusal("connection_rate", || {
                        format!("connection refused: more than {}/s from {prefix}", sh.limits.connections_per_sec)
                    });
                    incoming.refuse();
                    continue;
                }
                let slot = match sh.take_address_slot(remote.ip()) {
                    Ok(s) => s,
                    Err(which) => {
                        metrics::counter!("tributary_connections_refused_total", "reason" => which).increment(1);
                        let (total, here) = sh.connections(remote.ip());
                        sh.warn_refusal(which, || {
                            format!(
                                "connection refused ({which}): {total} open (cap {}), {here} from {prefix} (cap {})",
                                sh.limits.max_connections, sh.limits.max_connections_per_address
                            )
                        });
                        incoming.refuse();
                        continue;
                    }
                };
                let sh = sh.clone();
                tokio::spawn(async move {
                    match incoming.await {
                        Ok(conn) => {
                            if let Err(e) = handle_connection(conn, sh).await {
                                tracing::debug!(error = %e, "connection ended");
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "handshake failed"),
                    }
                    drop(slot);
                });
            }
        });
        // Idle keys and addresses leave the limiters; windows past the
        // retention leave the store.
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let Some(sh) = weak.upgrade() else { break };
                sh.prune_limiters();
                let s = sh.clone();
                let _ = tokio::task::spawn_blocking(move || s.apply_retention(now_ms())).await;
            }
        });
        Ok(Self { addr, endpoint, shared })
    }
}

async fn send_error(send: &mut quinn::SendStream, code: ErrorCode, detail: &str) {
    let _ = net::write_frame(send, &Frame::Error(ErrorFrame { code, detail: detail.into() })).await;
}

/// What the connection's writer sends next, in request order.
enum Answer {
    /// A frame ready now or once its work is done (submissions).
    Ready(oneshot::Receiver<Frame>),
    /// A checkpoint payload chunk, read only when the writer gets to it, so
    /// a peer that does not read its answers makes the server hold at most
    /// one chunk per connection (and the relay budget caps them all).
    Payload { what: Payload, id: ContentId, offset: u64 },
    /// An answer computed when the writer gets to it, off the async workers
    /// (store reads of any size: rollouts, standing, weights).
    Later(LaterAnswer),
}

/// How an [`Answer::Later`] is computed.
type LaterAnswer = Box<dyn FnOnce(&Arc<Shared>) -> Frame + Send>;

async fn handle_connection(conn: quinn::Connection, sh: Arc<Shared>) -> Result<(), NetError> {
    // One deadline for the first stream and the whole handshake: a
    // connection that never opens a stream, or stalls in the handshake, goes.
    let deadline = Duration::from_millis(sh.limits.handshake_timeout_ms.max(1));
    let hs = tokio::time::timeout(deadline, async {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let r = handshake(&conn, &mut send, &mut recv, &sh).await;
        Ok::<_, NetError>((send, recv, r))
    })
    .await;
    let (mut send, mut recv, (role, peer, _key_slot)) = match hs {
        Ok(Ok((send, recv, Ok(Some(x))))) => (send, recv, x),
        Ok(Ok((mut send, _, Ok(None)))) => {
            linger(&mut send).await;
            conn.close(1u32.into(), b"handshake refused");
            return Ok(());
        }
        Ok(Ok((_, _, Err(e)))) | Ok(Err(e)) => return Err(e),
        Err(_) => {
            metrics::counter!("tributary_connections_refused_total", "reason" => "handshake_timeout").increment(1);
            let remote = conn.remote_address();
            sh.warn_refusal("handshake_timeout", || {
                format!("connection from {remote} closed: no handshake within {deadline:?}")
            });
            conn.close(1u32.into(), b"handshake timeout");
            return Ok(());
        }
    };
    let span = tracing::info_span!("peer", role = role.as_str(), key = %peer.short());
    span.in_scope(|| tracing::info!("authenticated"));
    // Answers go out in request order, as their results become ready.
    let (ans_tx, mut ans_rx) = mpsc::channel::<Answer>(ANSWER_QUEUE);
    let wsh = sh.clone();
    let writer = tokio::spawn(async move {
        while let Some(a) = ans_rx.recv().await {
            let (frame, permit) = match a {
                Answer::Ready(rx) => match rx.await {
                    Ok(f) => (f, None),
                    Err(_) => continue,
                },
                Answer::Payload { what, id, offset } => payload_answer(&wsh, what, id, offset).await,
                Answer::Later(f) => {
                    let s = wsh.clone();
                    let frame = tokio::task::spawn_blocking(move || f(&s))
                        .await
                        .unwrap_or_else(|e| err(ErrorCode::Internal, &e.to_string()));
                    (frame, None)
                }
            };
            let close = matches!(&frame, Frame::Error(e) if e.code.closes_connection());
            let sent = net::write_frame(&mut send, &frame).await;
            drop(frame);
            drop(permit);
            if sent.is_err() || close {
                break;
            }
        }
        send
    });
    let result = serve_requests(&conn, &mut recv, &sh, role, peer, &ans_tx).instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(?result, "connection finished"));
    drop(ans_tx);
    if let Ok(mut send) = writer.await
        && !matches!(result, Ok(false))
    {
        linger(&mut send).await;
    }
    match &result {
        Err(NetError::Wire(_)) => conn.close(2u32.into(), b"malformed frame"),
        Ok(true) => conn.close(3u32.into(), b"protocol violation"),
        _ => {}
    }
    result.map(|_| ())
}

/// Whether `role` may send a frame with `tag` after the handshake (checked
/// on the header, before the body is read).
fn allowed(role: Role, tag: Tag) -> bool {
    use Tag as T;
    let any = matches!(
        tag,
        T::GetWindow | T::GetReveal | T::GetWeights | T::GetCheckpointPath | T::GetCheckpoint | T::GetDelta
    );
    any || match role {
        Role::Miner => matches!(tag, T::GetProgress | T::Submit | T::SubmitBatch),
        Role::Validator => matches!(
            tag,
            T::FetchRollouts
                | T::GetWindowIndex
                | T::GetWindowManifest
                | T::GetStanding
                | T::PostVerdict
                | T::PostBeaconCommit
                | T::PostBeaconReveal
                | T::GetConfirmations
        ),
        Role::Trainer => matches!(
            tag,
            T::FetchRollouts
                | T::GetWindowIndex
                | T::GetWindowManifest
                | T::GetStanding
                | T::PostTrainerStats
                | T::PublishCheckpoint
                | T::PostVerdict
                | T::PostBeaconCommit
                | T::PostBeaconReveal
        ),
    }
}

/// Returns `Ok(true)` if the connection must be closed for a violation.
async fn serve_requests(
    conn: &quinn::Connection,
    recv: &mut quinn::RecvStream,
    sh: &Arc<Shared>,
    role: Role,
    peer: PublicKey,
    answers: &mpsc::Sender<Answer>,
) -> Result<bool, NetError> {
    let ready = |f: Frame| {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(f);
        Answer::Ready(rx)
    };
    let malformed = |e: &wire::WireError| {
        metrics::counter!("tributary_frames_refused_total", "reason" => "malformed").increment(1);
        sh.warn_refusal("malformed_frame", || format!("{} {}: malformed frame: {e}", role.as_str(), peer.short()));
        ready(Frame::Error(ErrorFrame { code: ErrorCode::Malformed, detail: e.to_string() }))
    };
    // Miners must keep talking; the configured validator and trainer keys may
    // stay silent (a training step takes minutes).
    let idle = (role == Role::Miner).then(|| Duration::from_millis(sh.limits.idle_timeout_ms.max(1)));
    let mut ingest = Ingest::new();
    loop {
        let header = match idle {
            Some(d) => match tokio::time::timeout(d, net::read_header(recv)).await {
                Ok(h) => h,
                Err(_) => {
                    metrics::counter!("tributary_connections_closed_total", "reason" => "idle").increment(1);
                    sh.warn_refusal("idle_timeout", || {
                        format!("miner {} closed: no frame for {} ms", peer.short(), sh.limits.idle_timeout_ms)
                    });
                    conn.close(4u32.into(), b"idle");
                    return Ok(false);
                }
            },
            None => net::read_header(recv).await,
        };
        let (tag, len) = match header {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(false),
            Err(NetError::Wire(e)) => {
                let _ = answers.send(malformed(&e)).await;
                return Err(NetError::Wire(e));
            }
            Err(e) => return Err(e),
        };
        if !allowed(role, tag) {
            metrics::counter!("tributary_frames_refused_total", "reason" => "unexpected").increment(1);
            sh.warn_refusal("unexpected_frame", || {
                format!("{} {}: {tag:?} ({len} bytes) not allowed, connection closed", role.as_str(), peer.short())
            });
            let detail = format!("{tag:?} not allowed for {}", role.as_str());
            let _ = answers.send(ready(err(ErrorCode::UnexpectedFrame, &detail))).await;
            return Ok(true);
        }
        let frame = match tokio::time::timeout(BODY_DEADLINE, net::read_body(recv, tag, len)).await {
            Ok(Ok(f)) => f,
            Ok(Err(NetError::Wire(e))) => {
                let _ = answers.send(malformed(&e)).await;
                return Err(NetError::Wire(e));
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                sh.warn_refusal("body_deadline", || {
                    format!(
                        "{} {}: {tag:?} body of {len} bytes not sent within {BODY_DEADLINE:?}",
                        role.as_str(),
                        peer.short()
                    )
                });
                return Ok(true);
            }
        };
        // A miner's requests other than submissions have their own budget
        // (the configured validators and trainer are trusted keys).
        if role == Role::Miner
            && !matches!(tag, Tag::Submit | Tag::SubmitBatch)
            && sh.request_limit.check_key(&peer).is_err()
        {
            metrics::counter!("tributary_requests_refused_total", "reason" => "rate_limited").increment(1);
            sh.warn_refusal("request_rate", || {
                format!("miner {}: {tag:?} refused (more than {}/s)", peer.short(), sh.limits.requests_per_sec)
            });
            if answers.send(ready(err(ErrorCode::RateLimited, "too many requests"))).await.is_err() {
                return Ok(false);
            }
            continue;
        }
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
            (_, Frame::GetReveal(g)) => match sh.core().reveal_frame(g.window, now) {
                Some(r) => Frame::Reveal(r),
                None => err(ErrorCode::NotYet, "submissions still open or contributions still being revealed"),
            },
            (Role::Validator | Role::Trainer, Frame::PostBeaconCommit(c)) => {
                let ok = c.body.party == peer && c.verify(&sh.network()).is_ok();
                let window = c.body.window;
                let res = sh.core().record_commit(now, &c, ok);
                beacon_answer(sh, peer, window, res)
            }
            (Role::Validator | Role::Trainer, Frame::PostBeaconReveal(r)) => {
                let window = r.window;
                let res = sh.core().record_reveal(now, &peer, &r);
                beacon_answer(sh, peer, window, res)
            }
            (_, Frame::GetWeights(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| weights_part(sh, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Miner, Frame::GetProgress(g)) => {
                Frame::Progress(Progress { window: g.window, slots: sh.core().progress(g.window, &peer) })
            }
            (Role::Miner, Frame::Submit(s)) => {
                let rx = ingest.submit(sh, &peer, s.seq, vec![s.rollout.0], false, now).await;
                if answers.send(Answer::Ready(rx)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Miner, Frame::SubmitBatch(b)) => {
                let items = b.rollouts.into_iter().map(|r| r.0).collect();
                let rx = ingest.submit(sh, &peer, b.seq, items, true, now).await;
                if answers.send(Answer::Ready(rx)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::FetchRollouts(f)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| fetch(sh, role, f)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::GetStanding(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| standing_page(sh, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::GetWindowIndex(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| window_index(sh, role, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::PostVerdict(v)) => {
                // Only the authenticated validator's (or trainer's) own verdicts, signed for this network.
                let ok = v.body.validator == peer && v.verify(&sh.network()).is_ok();
                let res = {
                    let mut core = sh.core();
                    core.record_verdict(now, &v.body, ok).map(|()| {
                        let b = &v.body;
                        if core.claims_failure(b) {
                            log_failure(&core, b, role.as_str());
                        }
                    })
                };
                match res {
                    Ok(()) => match sh.store.put_verdict(&v) {
                        // A failure waiting for confirmation: the coordinator
                        // re-runs what it can without a model first, so the
                        // ack comes after its own confirmation, if any.
                        Ok(())
                            if v.body.hard_failed().next().is_some()
                                && sh.core().pending(v.body.window, &v.body.miner) =>
                        {
                            let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| {
                                recheck(sh, &v.body);
                                Frame::VerdictAck(VerdictAck { window: v.body.window, miner: v.body.miner })
                            }));
                            if answers.send(later).await.is_err() {
                                return Ok(false);
                            }
                            continue;
                        }
                        Ok(()) => Frame::VerdictAck(VerdictAck { window: v.body.window, miner: v.body.miner }),
                        Err(e) => err(ErrorCode::Internal, &e.to_string()),
                    },
                    Err(e) => {
                        sh.warn_refusal("verdict", || format!("verdict from {} refused: {e}", peer.short()));
                        err(ErrorCode::BadSignature, &e.to_string())
                    }
                }
            }
            (Role::Validator | Role::Trainer, Frame::GetWindowManifest(g)) => match sh.readers.get() {
                // Archived means closed: the archiver takes only closed windows.
                Some(r) => Frame::WindowManifest(r.answer(g.window, &sh.key, now).await),
                None => Frame::WindowManifest(wire::WindowManifest {
                    window: g.window,
                    manifest: None,
                    urls: vec![],
                    expires_ms: 0,
                }),
            },
            (Role::Validator, Frame::GetConfirmations(g)) => confirmations_answer(sh, &peer, &g),
            (Role::Trainer, Frame::PostTrainerStats(s)) => receive_trainer_stats(sh, s),
            (Role::Trainer, Frame::PublishCheckpoint(p)) => receive_checkpoint(sh, recv, peer, p).await?,
            (_, Frame::GetCheckpointPath(g)) => {
                sh.relay.note_holds(peer, g.have);
                match sh.relay.path(g.have, g.want) {
                    Ok(p) => Frame::CheckpointPath(p),
                    Err(e) => relay_err(&e),
                }
            }
            (_, Frame::GetCheckpoint(g)) => {
                if answers
                    .send(Answer::Payload { what: Payload::Full(g.id), id: g.id, offset: g.offset })
                    .await
                    .is_err()
                {
                    return Ok(false);
                }
                continue;
            }
            (_, Frame::GetDelta(g)) => {
                let what = Payload::Delta { base: g.base, id: g.id };
                if answers.send(Answer::Payload { what, id: g.id, offset: g.offset }).await.is_err() {
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

/// The failures waiting for the authenticated validator's confirmation
/// (`Core::confirmations`): one page.
fn confirmations_answer(sh: &Shared, peer: &PublicKey, g: &wire::GetConfirmations) -> Frame {
    Frame::Confirmations(sh.core().confirmations(peer, g.after, g.limit))
}

/// Logs a verdict that says its miner failed: banned once confirmed, else
/// pending (with the evidence a second party would re-check).
fn log_failure(core: &Core, b: &wire::VerdictBody, signer_role: &str) {
    let through = core.miners().get(&b.miner).and_then(|m| m.banned_through);
    let evidence: Vec<String> = b
        .evidence
        .iter()
        .map(|e| format!("{} {} at {:?}: {:?}", hex::encode(&e.digest[..8]), e.check.as_str(), e.position, e.figures))
        .collect();
    let what = if core.fails(b) {
        "miner failed a verdict and is banned"
    } else {
        "miner failed a verdict: pending until a second party confirms it"
    };
    tracing::warn!(
        miner = %b.miner.short(),
        window = b.window,
        signer = %b.validator.short(),
        role = signer_role,
        checked = b.checked,
        valid = b.valid,
        hard = b.hard_failure,
        soft = b.soft_failures,
        banned_through = ?through,
        reasons = ?b.reasons,
        evidence = ?evidence,
        "{what}"
    );
}

/// Takes a trainer's step report (the QUIC `PostTrainerStats` frame, on a
/// connection authenticated as the trainer): checked against the configured
/// trainer key and its signature, stored, acknowledged. A refused report
/// stores nothing.
pub fn receive_trainer_stats(shared: &Shared, stats: wire::TrainerStats) -> Frame {
    let ok = stats.verify(&shared.network()).is_ok();
    let refuse = |code: ErrorCode, e: &dyn std::fmt::Display| {
        metrics::counter!("tributary_trainer_stats_refused_total").increment(1);
        tracing::warn!(error = %e, "trainer stats refused");
        Frame::Error(ErrorFrame { code, detail: e.to_string() })
    };
    match shared.core().check_trainer_stats(&stats.body, ok) {
        Ok(()) => {}
        Err(e @ (crate::core::StatsError::Unauthorized | crate::core::StatsError::BadSignature)) => {
            return refuse(ErrorCode::BadSignature, &e);
        }
        Err(e @ crate::core::StatsError::Malformed(_)) => return refuse(ErrorCode::Malformed, &e),
    }
    if let Err(e) = shared.store.put_trainer_stats(&stats) {
        return refuse(ErrorCode::Internal, &e);
    }
    let b = &stats.body;
    metrics::gauge!("tributary_trainer_loss").set(b.loss);
    metrics::gauge!("tributary_trainer_entropy").set(b.entropy);
    metrics::gauge!("tributary_trainer_step").set(b.step as f64);
    tracing::info!(window = b.window, step = b.step, loss = b.loss, "trainer stats stored");
    Frame::TrainerStatsAck(wire::TrainerStatsAck { window: b.window })
}

/// Re-runs the model-free checks ([`crate::bans::Rechecker`]) on the stored
/// rollouts a pending failure's hard evidence names; a failure found there
/// is the coordinator's own, signed, stored and applied as its verdict,
/// which confirms the miner's failure (and bans it).
fn recheck(sh: &Shared, body: &wire::VerdictBody) {
    let Some(rc) = &sh.recheck else { return };
    let (w, m) = (body.window, body.miner);
    let digests: std::collections::BTreeSet<[u8; 32]> = body.hard_failed().copied().collect();
    let info = {
        let core = sh.core();
        if !core.pending(w, &m) {
            return;
        }
        match core.window_info(w, now_ms()) {
            Some(i) => i,
            None => return,
        }
    };
    let mut after = None;
    let mut found = None;
    while found.is_none() {
        let (items, next) = match sh.store.rollouts_within(w, Some(&m), after, 256, ROLLOUTS_ANSWER_BYTES) {
            Ok(page) => page,
            Err(e) => {
                tracing::error!(error = %e, "reading rollouts to re-check a failure");
                return;
            }
        };
        found = items
            .iter()
            .filter_map(|b| Rollout::decode(b, &RolloutLimits::DEFAULT).ok())
            .filter(|r| digests.contains(&r.digest()))
            .find_map(|r| rc.check(&r, &info));
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let Some(e) = found else { return };
    let mut v = wire::VerdictBody { checked: 1, hard_failure: true, ..wire::VerdictBody::empty(w, m, sh.key.public()) };
    v.add_reason(&format!(
        "coordinator re-check: {} fails (group {} rollout {}, {:?})",
        e.check.as_str(),
        e.group,
        e.rollout,
        e.figures
    ));
    v.add_evidence(e);
    let signed = wire::Verdict::sign(v, &sh.key, &sh.network());
    match sh.store.put_verdict(&signed) {
        Ok(()) => {
            let mut core = sh.core();
            core.apply_verdict(&signed.body);
            log_failure(&core, &signed.body, "coordinator");
        }
        Err(e) => tracing::error!(error = %e, "storing the coordinator's re-check verdict"),
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

/// Reads a payload chunk for the writer, within the relay budget; the
/// permit is held until the chunk is sent.
async fn payload_answer(
    sh: &Arc<Shared>,
    what: Payload,
    id: ContentId,
    offset: u64,
) -> (Frame, Option<OwnedSemaphorePermit>) {
    let kib = (CHUNK_LEN >> 10) as u32;
    let permit = sh.relay_budget.clone().acquire_many_owned(kib).await.ok();
    let relay = sh.relay.clone();
    let frame = tokio::task::spawn_blocking(move || match relay.read(what, offset) {
        Ok(data) => Frame::CheckpointChunk(wire::CheckpointChunk { id, offset, data: wire::Blob(data) }),
        Err(e) => relay_err(&e),
    })
    .await
    .unwrap_or_else(|e| err(ErrorCode::Internal, &e.to_string()));
    (frame, permit)
}

fn err(code: ErrorCode, detail: &str) -> Frame {
    Frame::Error(ErrorFrame { code, detail: detail.into() })
}

/// The handshake: `Hello`, `Challenge`, `Auth` (a signature bound to this
/// TLS session, [`net::handshake_message`]), `Welcome`. The key's
/// connection slot is taken before the welcome.
async fn handshake(
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    sh: &Arc<Shared>,
) -> Result<Option<(Role, PublicKey, KeySlot)>, NetError> {
    let only = |want: Tag| move |tag: Tag, _| if tag == want { Ok(()) } else { Err(NetError::Unexpected(tag)) };
    let hello = match net::read_frame_with(recv, only(Tag::Hello)).await {
        Ok(Some(Frame::Hello(h))) => h,
        Ok(_) | Err(NetError::Unexpected(_)) => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Hello").await;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if hello.version != wire::PROTOCOL_VERSION {
        send_error(send, ErrorCode::Version, "unsupported protocol version").await;
        return Ok(None);
    }
    if !sh.core().access().permits(hello.role, &hello.key) {
        metrics::counter!("tributary_connections_refused_total", "reason" => "unauthorized").increment(1);
        sh.warn_refusal("unauthorized", || {
            format!("handshake refused: key {} may not take role {}", hello.key.short(), hello.role.as_str())
        });
        send_error(send, ErrorCode::Unauthorized, "key may not take this role").await;
        return Ok(None);
    }
    let nonce: [u8; 32] = rand::random();
    let coordinator = sh.key.public();
    let proof = sh.key.sign(identity::domain::COORDINATOR_HANDSHAKE, &net::coordinator_proof_message(conn, &nonce)?);
    net::write_frame(send, &Frame::Challenge(Challenge { nonce, coordinator, proof })).await?;
    let auth = match net::read_frame_with(recv, only(Tag::Auth)).await {
        Ok(Some(Frame::Auth(a))) => a,
        Ok(_) | Err(NetError::Unexpected(_)) => {
            send_error(send, ErrorCode::UnexpectedFrame, "expected Auth").await;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let msg = net::handshake_message(conn, &nonce, &coordinator, &hello)?;
    if hello.key.verify(identity::domain::HANDSHAKE, &msg, &auth.signature).is_err() {
        metrics::counter!("tributary_connections_refused_total", "reason" => "bad_handshake").increment(1);
        sh.warn_refusal("bad_handshake", || {
            format!("handshake refused: key {} signature does not verify on this session", hello.key.short())
        });
        send_error(send, ErrorCode::BadHandshake, "signature does not verify").await;
        return Ok(None);
    }
    let Some(slot) = sh.take_key_slot(hello.key) else {
        metrics::counter!("tributary_connections_refused_total", "reason" => "max_connections_per_key").increment(1);
        sh.warn_refusal("max_connections_per_key", || {
            format!(
                "handshake refused: key {} already has {} connections open",
                hello.key.short(),
                sh.limits.max_connections_per_key
            )
        });
        send_error(send, ErrorCode::RateLimited, "too many connections for this key").await;
        return Ok(None);
    };
    let schedule = *sh.core().schedule();
    net::write_frame(send, &Frame::Welcome(Welcome { now_ms: now_ms(), schedule })).await?;
    Ok(Some((hello.role, hello.key, slot)))
}

/// In-flight submission bytes per connection (KiB): past this, the
/// connection's reader waits for answers, and QUIC flow control slows the sender.
const INFLIGHT_KIB: usize = 16 << 10;

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
        // The semaphores are never closed; without a permit the submission simply goes unthrottled.
        let permit = self.inflight.clone().acquire_many_owned(permits).await.ok();
        // And within the budget of all connections together.
        let global = sh.ingest_budget.clone().acquire_many_owned(permits).await.ok();
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
            drop(global);
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
                        penalty = Some((window, None));
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
                        penalty = Some((candidate.window, Some(candidate.checkpoint)));
                        if reason == RejectReason::RateLimited {
                            let (bytes, miners) = core.window_usage(candidate.window);
                            let cfg = core.config();
                            let (max_bytes, max_miners) = (cfg.max_window_bytes, cfg.max_window_miners);
                            sh.warn_refusal("window_budget", || {
                                format!(
                                    "rollout of {} refused: window {} holds {bytes} bytes of {max_bytes} and \
                                     {miners} miners of {max_miners}",
                                    peer.short(),
                                    candidate.window
                                )
                            });
                        }
                        if reason == RejectReason::Schema {
                            let s = candidate.shape;
                            sh.warn_refusal("contract", || {
                                format!(
                                    "rollout of {} refused: outside window {}'s generation contract (temperature \
                                     {} max_new_tokens {} prompt {} completion {} max token {})",
                                    peer.short(),
                                    candidate.window,
                                    s.sampling.temperature,
                                    s.sampling.max_new_tokens,
                                    s.prompt_len,
                                    s.completion_len,
                                    s.max_token
                                )
                            });
                        }
                        reason
                    }
                },
            };
            count_reject(reason);
            sh.warn_refusal(reason.as_str(), || format!("rollout from {} refused: {}", peer.short(), reason.as_str()));
            outcomes[i] = Outcome::Refused(reason);
            if let Some((window, named)) = penalty {
                // In force before the next rollout is admitted, as for a stream of single submissions.
                drop(core);
                penalise(sh, now, window, &peer, reason, named);
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
    let stored: Vec<Option<bool>> = match done {
        Some(rx) => match rx.await {
            Ok(Ok(flags)) => flags.into_iter().map(Some).collect(),
            _ => vec![None; candidates.len()],
        },
        None => vec![None; candidates.len()],
    };
    let mut accepted = 0u64;
    {
        let mut core = sh.core();
        for ((c, &i), stored) in candidates.iter().zip(&slots).zip(stored) {
            match stored {
                Some(true) => {
                    core.commit(c);
                    outcomes[i] = Outcome::Stored(c.digest);
                    accepted += 1;
                }
                // Its window closed before the commit: refused, as at the door.
                Some(false) => {
                    core.abort(c);
                    count_reject(RejectReason::WrongWindow);
                    outcomes[i] = Outcome::Refused(RejectReason::WrongWindow);
                }
                None => {
                    core.abort(c);
                    count_reject(RejectReason::Internal);
                }
            }
        }
    }
    if accepted > 0 {
        if let Some(last) = candidates.last() {
            sh.relay.note_generating(last.miner, last.checkpoint);
        }
        metrics::counter!("tributary_rollouts_accepted_total").increment(accepted);
        metrics::histogram!("tributary_ingest_latency_seconds").record(started.elapsed().as_secs_f64());
    }
    outcomes
}

/// A page of a closed window's rollouts, at most [`ROLLOUTS_ANSWER_BYTES`]
/// of them. Blocking: waits for a commit in progress ([`Seal`]) and reads the store.
fn fetch(sh: &Arc<Shared>, role: Role, f: wire::FetchRollouts) -> Frame {
    let now = now_ms();
    let core = sh.core();
    if !core.closed(f.window, now) {
        return err(ErrorCode::NotYet, "window's submissions have not closed");
    }
    if role == Role::Trainer
        && let Some(m) = &f.miner
        && core.is_banned(m, f.window)
    {
        return Frame::Rollouts(Rollouts { window: f.window, items: vec![], next: None });
    }
    drop(core);
    // The window closed at `now`: a commit still running may add to it, any
    // later one leaves it out. Wait for the running one.
    drop(sh.seal.lock());
    let limit = (f.limit as usize).clamp(1, 256);
    match sh.store.rollouts_within(f.window, f.miner.as_ref(), f.after, limit, ROLLOUTS_ANSWER_BYTES) {
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

/// A page of a closed window's index ([`Store::window_index`]), at most
/// [`wire::WINDOW_INDEX_ANSWER_BYTES`] of entries; the trainer's leaves out
/// banned miners, as its fetches do. Blocking, like [`fetch`].
fn window_index(sh: &Arc<Shared>, role: Role, g: &wire::GetWindowIndex) -> Frame {
    if !sh.core().closed(g.window, now_ms()) {
        return err(ErrorCode::NotYet, "window's submissions have not closed");
    }
    drop(sh.seal.lock());
    let banned: std::collections::HashSet<PublicKey> = if role == Role::Trainer {
        let core = sh.core();
        core.miners().keys().filter(|m| core.is_banned(m, g.window)).copied().collect()
    } else {
        Default::default()
    };
    let keep = |m: &PublicKey| !banned.contains(m);
    match sh.store.window_index(g.window, g.after.as_ref(), sh.list_answer_bytes(wire::WINDOW_INDEX_ANSWER_BYTES), keep)
    {
        Ok((miners, next)) => Frame::WindowIndex(wire::WindowIndex { window: g.window, miners, next }),
        Err(e) => err(ErrorCode::Internal, &e.to_string()),
    }
}

/// What one standing entry costs on the wire, at most (key, variant).
const STANDING_ENTRY_BYTES: usize = 33;

/// A page of a window's standing: miners after `g.after` in key order, at
/// most [`wire::STANDING_ANSWER_BYTES`] of entries.
fn standing_page(sh: &Arc<Shared>, g: &wire::GetStanding) -> Frame {
    let mut all = sh.core().standing(g.window);
    all.sort_unstable_by_key(|(m, _)| *m);
    let per_page = (sh.list_answer_bytes(wire::STANDING_ANSWER_BYTES) / STANDING_ENTRY_BYTES).max(1);
    let from = g.after.map_or(0, |a| all.partition_point(|(m, _)| *m <= a));
    let rest = all.get(from..).unwrap_or_default();
    let miners: Vec<_> = rest.iter().take(per_page).copied().collect();
    let next = (rest.len() > miners.len()).then(|| miners.last().map(|(m, _)| *m)).flatten();
    Frame::Standing(wire::Standing { window: g.window, miners, next })
}

/// Part of a weights document's bytes: the latest, or the one of `g.window`.
fn weights_part(sh: &Arc<Shared>, g: &wire::GetWeights) -> Frame {
    let doc = match g.window {
        Some(w) => sh.store.weights_doc(w),
        None => sh.store.latest_weights_doc(),
    };
    let doc = match doc {
        Ok(Some(d)) => d,
        Ok(None) => return err(ErrorCode::NotYet, "no weights document signed for that interval yet"),
        Err(e) => return err(ErrorCode::Internal, &e.to_string()),
    };
    let bytes = doc.encode();
    let part = sh.list_answer_bytes(wire::WEIGHTS_PART_BYTES);
    let start = usize::try_from(g.offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(part).min(bytes.len());
    let data = wire::Blob(bytes.get(start..end).unwrap_or_default().to_vec());
    Frame::Weights(wire::WeightsPart { window: doc.body.window, len: bytes.len() as u64, offset: g.offset, data })
}

/// Removes an upload's partial file unless it was handed on.
struct PartFile(Option<std::path::PathBuf>);

impl Drop for PartFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

async fn receive_checkpoint(
    sh: &Arc<Shared>,
    recv: &mut quinn::RecvStream,
    peer: PublicKey,
    p: wire::PublishCheckpoint,
) -> Result<Frame, NetError> {
    use tokio::io::AsyncWriteExt;
    // Payloads are bounded: 64 GiB at most, streamed to a file chunk by chunk in order.
    if p.body.len > 64 << 30 {
        return Ok(err(ErrorCode::Malformed, "checkpoint too large"));
    }
    let upload = sh.relay.incoming_path(&p.body.id);
    // A failed or abandoned upload leaves no file behind.
    let mut part = PartFile(Some(upload.clone()));
    let mut file = tokio::fs::File::create(&upload).await?;
    let mut hasher = blake3::Hasher::new();
    let mut got = 0u64;
    let mut refusal = None;
    while got < p.body.len {
        let next = tokio::time::timeout(BODY_DEADLINE, net::read_frame(recv))
            .await
            .map_err(|_| NetError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "checkpoint chunk")))?;
        match next?.ok_or(NetError::Closed)? {
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
        if let Frame::Error(e) = &f {
            tracing::warn!(id = %p.body.id, window = p.body.window, code = ?e.code, detail = %e.detail, "checkpoint refused");
        }
        Ok(f)
    };
    if let Some(f) = refusal {
        return refuse(f);
    }
    if hasher.finalize().as_bytes() != &p.body.payload_hash {
        return refuse(err(ErrorCode::Malformed, "payload hash mismatch"));
    }
    // Signed by the authenticated trainer, for this network.
    if p.body.trainer != peer || p.verify(&sh.network()).is_err() {
        return refuse(err(ErrorCode::BadSignature, "checkpoint announcement signature"));
    }
    // The trainer's announcement of the genesis checkpoint (which the relay
    // holds from the start): kept and stored, so miners check the first model too.
    if let Some(e) = sh.relay.entry(&p.body.id)
        && sh.relay.announcement(&e.id).is_none()
        && e.id == sh.core().config().genesis_checkpoint
    {
        if !Relay::announces_full(&p, &e, &peer, &sh.network()) {
            return refuse(err(ErrorCode::Malformed, "not an announcement of the genesis file"));
        }
        if let Err(e) =
            sh.store.put_meta(crate::store::GENESIS_ANNOUNCEMENT, &postcard::to_stdvec(&p).unwrap_or_default())
        {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        sh.relay.set_announcement(p.clone());
        tracing::info!(id = %p.body.id, "genesis checkpoint announced by the trainer");
    }
    // Idempotent for the same checkpoint; never two checkpoints for one window.
    if sh.relay.entry(&p.body.id).is_some() {
        return Ok(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }));
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
    let relay = sh.relay.clone();
    let ann = p.clone();
    let incoming = part.0.take().unwrap_or_else(|| upload.clone());
    // The window it takes effect from is decided once it is durable, below.
    let ingested = tokio::task::spawn_blocking(move || relay.ingest(&ann, &incoming, 0)).await;
    let mut entry = match ingested {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return refuse(relay_err(&e)),
        Err(e) => return refuse(err(ErrorCode::Internal, &e.to_string())),
    };
    // In force from the first window that opens after it is durable: stored
    // with the window that is next now, applied only if that window still
    // has not opened once the write is done (else stored again, later).
    let mut from = sh.core().checkpoint_from(now_ms(), &p.body);
    loop {
        entry.from_window = from;
        if let Err(e) = sh.store.put_checkpoint(from, &p, &entry) {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        let next = {
            let mut core = sh.core();
            if core.publish_checkpoint_from(now_ms(), from, &p.body) {
                break;
            }
            core.checkpoint_from(now_ms(), &p.body)
        };
        tracing::warn!(id = %p.body.id, from, next, "a window opened while the checkpoint was being stored; moved");
        if let Err(e) = sh.store.delete_checkpoint(from) {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        from = next;
    }
    sh.relay.set_announcement(p.clone());
    sh.relay.insert(entry);
    metrics::counter!("tributary_checkpoints_published_total").increment(1);
    tracing::info!(id = %p.body.id, window = p.body.window, from, "checkpoint published");
    Ok(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }))
}
