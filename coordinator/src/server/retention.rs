//! Retention: old windows' rollouts and challenge records leave the store,
//! idle keys and addresses leave the rate limiters.

use tributary_protocol::window::WindowId;

use super::beacon::BEACON_META_PREFIX;
use super::*;

/// A peer not heard from for this long leaves the relay's table of what
/// each peer holds (the dashboard's checkpoint column).
pub(super) const PEER_IDLE_MS: u64 = 3_600_000;

impl Shared {
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

    /// Forgets what the core and the relay keep of closed windows and idle
    /// keys ([`Core::prune`], [`crate::relay::Relay::prune_peers`]): run as
    /// windows close, so memory is bounded by the span the rules read.
    pub fn prune_books(&self, now: u64) {
        self.core().prune(now);
        self.relay.prune_peers(now.saturating_sub(PEER_IDLE_MS));
    }

    /// Forgets rate-limiter state of keys and addresses that are idle.
    pub fn prune_limiters(&self) {
        for l in [&self.byte_limit, &self.rollout_limit, &self.request_limit, &self.relay_rate] {
            l.retain_recent();
            l.shrink_to_fit();
        }
        self.conn_limit.retain_recent();
        self.relay_budget.prune();
        self.conn_limit.shrink_to_fit();
    }
}
