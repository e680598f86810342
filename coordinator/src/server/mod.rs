//! The QUIC server: handshake, ingestion with durable acknowledgements,
//! serving, verdicts, checkpoints and rate limits, around [`Core`] and [`Store`].

mod answers;
mod beacon;
mod connections;
mod ingest;
mod reads;
mod requests;
mod retention;
mod trainer;
mod verdicts;

pub use connections::{Server, address_prefix};
pub use ingest::{DoorRefusal, Seal, door, door_check};
pub use trainer::receive_trainer_stats;

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::wire::{self, ErrorCode, ErrorFrame, Frame};

use crate::core::Core;
use crate::relay::Relay;
use crate::store::{Store, StoreError};

use beacon::beacon_meta_key;
use connections::ConnCounts;
use ingest::{WriteJob, writer_loop};

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
    /// Authenticated connections open at once, in all.
    pub max_connections: u32,
    /// Of `max_connections`, the slots only validators and the trainer may
    /// take: miners share the rest.
    pub reserved_role_connections: u32,
    /// Connections open at once that have not authenticated yet (their own
    /// cap: a flood of them never takes an authenticated role's slot; past
    /// it the oldest is closed).
    pub max_unauthenticated: u32,
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
    /// Checkpoint payload KiB per second per miner key (burst: one second's
    /// worth): bytes, not requests, bound what one key pulls.
    pub relay_kib_per_sec: u32,
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
            reserved_role_connections: 64,
            max_unauthenticated: 256,
            max_connections_per_address: 64,
            max_connections_per_key: 8,
            idle_timeout_ms: 300_000,
            handshake_timeout_ms: 10_000,
            penalties_per_sec: 2,
            relay_inflight_mib: 256,
            relay_kib_per_sec: 32 << 10,
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

/// Milliseconds since the Unix epoch (the one clock every role reads).
pub use tributary_net::now_ms;

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
    relay_rate: DefaultKeyedRateLimiter<PublicKey>,
    rollout_limit: DefaultKeyedRateLimiter<PublicKey>,
    request_limit: DefaultKeyedRateLimiter<PublicKey>,
    penalty_limit: DefaultDirectRateLimiter,
    conns: Mutex<ConnCounts>,
    relay_budget: crate::relay::RelayBudget,
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
    /// (connections open in all, connections from `ip`'s address prefix).
    pub fn connections(&self, ip: IpAddr) -> (u32, u32) {
        let c = self.conns();
        (c.authed + c.pending.len() as u32, c.by_prefix.get(&address_prefix(ip)).copied().unwrap_or(0))
    }

    /// KiB of checkpoint payload read for answers and not yet sent, in all.
    pub fn relay_inflight_kib(&self) -> usize {
        self.relay_budget.inflight_kib()
    }

    /// The relay's budget: each key's share, the write deadline.
    pub fn relay_budget(&self) -> &crate::relay::RelayBudget {
        &self.relay_budget
    }

    /// Logs a refusal at warn, at most once a second per `kind` (with the
    /// number not logged since).
    fn warn_refusal(&self, kind: &'static str, detail: impl FnOnce() -> String) {
        if let Some(suppressed) = self.warn.allow(kind) {
            tracing::warn!(kind, suppressed, "{}", detail());
        }
    }
}

/// The relay's per-key quota: `per_sec` KiB a second, a burst of one
/// second's worth and never less than one piece.
fn relay_quota(per_sec: u32) -> Quota {
    let piece = (crate::relay::PIECE_LEN >> 10) as u32;
    let burst = NonZeroU32::new(per_sec.max(piece)).unwrap_or(NonZeroU32::MIN);
    quota(per_sec).allow_burst(burst)
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
        relay_rate: RateLimiter::keyed(relay_quota(limits.relay_kib_per_sec)),
        rollout_limit: RateLimiter::keyed(quota(limits.rollouts_per_sec)),
        request_limit: RateLimiter::keyed(quota(limits.requests_per_sec)),
        penalty_limit: RateLimiter::direct(quota(limits.penalties_per_sec)),
        conns: Mutex::new(ConnCounts::default()),
        relay_budget: crate::relay::RelayBudget::new(limits.relay_inflight_mib.max(4), crate::relay::WRITE_DEADLINE),
        ingest_budget: Arc::new(Semaphore::new((limits.ingest_inflight_mib.max(8) as usize) << 10)),
        warn: WarnThrottle::default(),
        recheck,
        archiving: std::sync::atomic::AtomicBool::new(false),
        list_cap: std::sync::atomic::AtomicUsize::new(0),
        admin_changes: std::sync::atomic::AtomicU64::new(0),
        readers: std::sync::OnceLock::new(),
    }))
}

fn err(code: ErrorCode, detail: &str) -> Frame {
    Frame::Error(ErrorFrame { code, detail: detail.into() })
}
