//! A validator's or the trainer's part in each window's challenge
//! ([`tributary_protocol::beacon`]): a task on its own connection that
//! commits to the contribution of the current and the next window, and
//! reveals each one once the window's submissions close.
//!
//! It runs beside the role's main loop because that loop can be busy for a
//! whole window (a verification, a training step): a commitment made late
//! is refused, a reveal made late is left out of the challenge and recorded
//! against the party. Committing a window ahead keeps the commitment in time;
//! the contribution is derived from the key, so a restarted party commits
//! and reveals the same secret (the coordinator acknowledges a repeat).
//!
//! Exclusion is loud (review finding H): once a window's challenge is
//! fixed, the task reads the public reveal of every window whose commitment
//! the coordinator acknowledged, and a contribution that is neither mixed in
//! nor listed as withheld (the coordinator acknowledged it and dropped it,
//! so the challenge was mixed without this party) is logged at error and
//! listed by [`Contributor::excluded`]; a reveal refused after an
//! acknowledged commitment is logged at error too.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tributary_protocol::beacon::{self, Inclusion};
use tributary_protocol::identity::Keypair;
use tributary_protocol::window::{Schedule, WindowId};
use tributary_protocol::wire::{BeaconReveal, ErrorCode, Frame, GetReveal, Role};

use crate::shutdown::CancellationToken;
use crate::{Backoff, ConnectFailure, KeyPin, NetError, Session, now_ms};

/// Where and as whom a [`Contributor`] connects.
#[derive(Debug, Clone)]
pub struct ContributorConfig {
    /// The coordinator's QUIC address.
    pub coordinator: SocketAddr,
    /// Its certificate pin.
    pub fingerprint: String,
    /// The coordinator key accepted.
    pub coordinator_key: KeyPin,
    /// The contributing validator's or trainer's key.
    pub key: Keypair,
    /// Its role.
    pub role: Role,
    /// How often it looks at the clock.
    pub poll: Duration,
}

/// The running contribution task; stopped when dropped.
#[derive(Debug)]
pub struct Contributor {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
    book: Arc<Mutex<Book>>,
}

/// What the task knows of its windows, shared with the role.
#[derive(Debug, Default)]
struct Book {
    /// Windows whose commitment the coordinator acknowledged.
    acknowledged: BTreeSet<WindowId>,
    /// Acknowledged windows whose reveal left this party out without
    /// listing it as withheld.
    excluded: BTreeSet<WindowId>,
}

impl Contributor {
    /// Starts the task (on the current tokio runtime).
    pub fn spawn(cfg: ContributorConfig) -> Self {
        let stop = CancellationToken::new();
        let s = stop.clone();
        let book = Arc::new(Mutex::new(Book::default()));
        let b = book.clone();
        let handle = tokio::spawn(async move { run(cfg, s, b).await });
        Self { stop, handle, book }
    }

    /// Whether the coordinator acknowledged this party's commitment for
    /// `window` (kept for the last few windows).
    pub fn acknowledged(&self, window: WindowId) -> bool {
        self.book.lock().is_ok_and(|b| b.acknowledged.contains(&window))
    }

    /// Windows (of the last few) whose public reveal left out this party's
    /// acknowledged commitment without listing it as withheld.
    pub fn excluded(&self) -> Vec<WindowId> {
        self.book.lock().map(|b| b.excluded.iter().copied().collect()).unwrap_or_default()
    }
}

/// Alarms when `party`, whose commitment for `reveal.window` the
/// coordinator acknowledged (`acknowledged`), is in neither the reveal's
/// contributions nor its withheld list: logs an error. Returns where the
/// contribution stands.
pub fn check_inclusion(
    reveal: &tributary_protocol::wire::Reveal,
    party: &tributary_protocol::identity::PublicKey,
    acknowledged: bool,
) -> Inclusion {
    let inc = beacon::inclusion(reveal, party);
    if inc == Inclusion::Absent && acknowledged {
        tracing::error!(
            window = reveal.window,
            party = %party.short(),
            contributions = reveal.contributions.len(),
            "the coordinator acknowledged this party's commitment but its reveal lists it neither as a contribution \
             nor as withheld: the challenge was mixed without it"
        );
    }
    inc
}

impl Drop for Contributor {
    fn drop(&mut self) {
        self.stop.cancel();
        self.handle.abort();
    }
}

/// Windows before the current one whose reveal is still tried (a restart
/// may find its last commitment unrevealed).
const REVEAL_BEHIND: u64 = 2;

async fn run(cfg: ContributorConfig, stop: CancellationToken, book: Arc<Mutex<Book>>) {
    let backoff = Backoff { min: Duration::from_millis(200), max: Duration::from_secs(10), attempts: u32::MAX };
    let mut state = Duties::default();
    while !stop.is_cancelled() {
        let session = Session::connect_with_backoff(
            cfg.coordinator,
            &cfg.fingerprint,
            &cfg.coordinator_key,
            &cfg.key,
            cfg.role,
            backoff,
            |_, _| {},
        )
        .await;
        let mut session = match session {
            Ok(s) => s,
            Err(ConnectFailure::Refused(e)) => {
                tracing::error!(error = %e, "challenge contributions: refused by the coordinator, giving up");
                return;
            }
            Err(ConnectFailure::Unreachable { last, .. }) => {
                tracing::warn!(error = %last, "challenge contributions: coordinator unreachable");
                continue;
            }
        };
        let schedule = session.welcome.schedule;
        while !stop.is_cancelled() {
            if let Err(e) = duties(&mut session, &cfg.key, &schedule, &mut state, &book).await {
                tracing::warn!(error = %e, "challenge contributions: connection lost, reconnecting");
                break;
            }
            let _ = stop.run_until_cancelled(tokio::time::sleep(cfg.poll)).await;
        }
    }
}

/// The task's own progress, by window.
#[derive(Debug, Default)]
struct Duties {
    committed: BTreeSet<WindowId>,
    revealed: BTreeSet<WindowId>,
    /// Acknowledged windows whose public reveal was checked.
    checked: BTreeSet<WindowId>,
}

/// One pass: commit to the current and next windows, reveal every closed
/// window of the last few, and check the public reveal of each acknowledged
/// one once it is fixed. A refusal other than "not yet" settles a window
/// (logged): retrying could not change it.
async fn duties(
    session: &mut Session,
    key: &Keypair,
    schedule: &Schedule,
    state: &mut Duties,
    book: &Mutex<Book>,
) -> Result<(), NetError> {
    let Duties { committed, revealed, checked } = state;
    let now = now_ms();
    let Some(current) = schedule.window_at(now) else { return Ok(()) };
    let network = session.network();
    let acked = |w: WindowId| book.lock().is_ok_and(|b| b.acknowledged.contains(&w));
    for w in current..=current.saturating_add(1) {
        if committed.contains(&w) {
            continue;
        }
        match session.request(&Frame::PostBeaconCommit(beacon::commit(key, &network, w))).await {
            Ok(Frame::BeaconAck(a)) if a.window == w => {
                tracing::debug!(window = w, "committed to a contribution");
                committed.insert(w);
                if let Ok(mut b) = book.lock() {
                    b.acknowledged.insert(w);
                }
            }
            Ok(f) => return Err(NetError::Unexpected(f.tag())),
            Err(NetError::Refused(ErrorCode::NotYet, _)) => {}
            Err(NetError::Refused(code, detail)) => {
                tracing::warn!(window = w, ?code, %detail, "commitment refused");
                committed.insert(w);
            }
            Err(e) => return Err(e),
        }
    }
    for w in current.saturating_sub(REVEAL_BEHIND)..current {
        if revealed.contains(&w) || now < schedule.closes_at(w) {
            continue;
        }
        let secret = beacon::contribution_secret(key, &network, w);
        match session.request(&Frame::PostBeaconReveal(BeaconReveal { window: w, secret })).await {
            Ok(Frame::BeaconAck(a)) if a.window == w => {
                tracing::debug!(window = w, "revealed a contribution");
                revealed.insert(w);
            }
            Ok(f) => return Err(NetError::Unexpected(f.tag())),
            Err(NetError::Refused(ErrorCode::NotYet, _)) => {}
            Err(NetError::Refused(code, detail)) if acked(w) => {
                // The coordinator acknowledged the commitment: it has it, or dropped it.
                tracing::error!(window = w, ?code, %detail, "reveal refused although the commitment was acknowledged");
                revealed.insert(w);
            }
            Err(NetError::Refused(code, detail)) => {
                // No commitment (started after the close) or already fixed.
                tracing::debug!(window = w, ?code, %detail, "reveal refused");
                revealed.insert(w);
            }
            Err(e) => return Err(e),
        }
    }
    // The public reveal of every acknowledged window, once fixed.
    let party = key.public();
    for w in current.saturating_sub(REVEAL_BEHIND)..current {
        if checked.contains(&w) || !acked(w) || now < schedule.closes_at(w) {
            continue;
        }
        match session.request(&Frame::GetReveal(GetReveal { window: w })).await {
            Ok(Frame::Reveal(r)) if r.window == w => {
                if check_inclusion(&r, &party, true) == Inclusion::Absent
                    && let Ok(mut b) = book.lock()
                {
                    b.excluded.insert(w);
                }
                checked.insert(w);
            }
            Ok(f) => return Err(NetError::Unexpected(f.tag())),
            Err(NetError::Refused(ErrorCode::NotYet, _)) => {}
            Err(NetError::Refused(code, detail)) => {
                tracing::debug!(window = w, ?code, %detail, "reveal not readable");
                checked.insert(w);
            }
            Err(e) => return Err(e),
        }
    }
    let oldest = current.saturating_sub(REVEAL_BEHIND + 1);
    committed.retain(|w| *w >= oldest);
    revealed.retain(|w| *w >= oldest);
    checked.retain(|w| *w >= oldest);
    if let Ok(mut b) = book.lock() {
        b.acknowledged.retain(|w| *w >= oldest);
        b.excluded.retain(|w| *w >= oldest);
    }
    Ok(())
}
