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

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tributary_protocol::beacon;
use tributary_protocol::identity::Keypair;
use tributary_protocol::window::{Schedule, WindowId};
use tributary_protocol::wire::{BeaconReveal, ErrorCode, Frame, Role};

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
}

impl Contributor {
    /// Starts the task (on the current tokio runtime).
    pub fn spawn(cfg: ContributorConfig) -> Self {
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move { run(cfg, s).await });
        Self { stop, handle }
    }
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

async fn run(cfg: ContributorConfig, stop: CancellationToken) {
    let backoff = Backoff { min: Duration::from_millis(200), max: Duration::from_secs(10), attempts: u32::MAX };
    let mut committed: BTreeSet<WindowId> = BTreeSet::new();
    let mut revealed: BTreeSet<WindowId> = BTreeSet::new();
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
            if let Err(e) = duties(&mut session, &cfg.key, &schedule, &mut committed, &mut revealed).await {
                tracing::warn!(error = %e, "challenge contributions: connection lost, reconnecting");
                break;
            }
            let _ = stop.run_until_cancelled(tokio::time::sleep(cfg.poll)).await;
        }
    }
}

/// One pass: commit to the current and next windows, reveal every closed
/// window of the last few. A refusal other than "not yet" settles a window
/// (logged): retrying could not change it.
async fn duties(
    session: &mut Session,
    key: &Keypair,
    schedule: &Schedule,
    committed: &mut BTreeSet<WindowId>,
    revealed: &mut BTreeSet<WindowId>,
) -> Result<(), NetError> {
    let now = now_ms();
    let Some(current) = schedule.window_at(now) else { return Ok(()) };
    let network = session.network();
    for w in current..=current.saturating_add(1) {
        if committed.contains(&w) {
            continue;
        }
        match session.request(&Frame::PostBeaconCommit(beacon::commit(key, &network, w))).await {
            Ok(Frame::BeaconAck(a)) if a.window == w => {
                tracing::debug!(window = w, "committed to a contribution");
                committed.insert(w);
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
            Err(NetError::Refused(code, detail)) => {
                // No commitment (started after the close) or already fixed.
                tracing::debug!(window = w, ?code, %detail, "reveal refused");
                revealed.insert(w);
            }
            Err(e) => return Err(e),
        }
    }
    let oldest = current.saturating_sub(REVEAL_BEHIND + 1);
    committed.retain(|w| *w >= oldest);
    revealed.retain(|w| *w >= oldest);
    Ok(())
}
