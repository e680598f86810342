//! The challenge beacon: validators' and the trainer's commitments to, and
//! reveals of, contributions to each window's challenge, and who withholds them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tributary_protocol::beacon;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{BeaconCommit, BeaconReveal, Contribution, Reveal, Role};

use super::*;

/// Windows ahead of the current one a contribution may be committed for
/// (a party commits early so a long verification cannot make it miss the close).
pub const BEACON_COMMIT_AHEAD: u64 = 2;

/// The shortest reveal period a node gives contributions (its grace, if longer).
pub const MIN_REVEAL_MS: u64 = 2_000;

/// Withheld reveals in a row after which a party is *withholding*
/// ([`Core::withholding`]): its commitments are refused and a validator's
/// verdicts are set aside until an operator clears it or the withheld
/// windows leave the kept span. One more than a crash can cause: a party
/// commits at most [`BEACON_COMMIT_AHEAD`] windows ahead of the one it is
/// in, so a party that stops withholds at most that many plus one in a row.
pub const WITHHOLD_LIMIT: usize = BEACON_COMMIT_AHEAD as usize + 2;

/// One window's commitments to, and reveals of, contributions to its
/// challenge ([`tributary_protocol::beacon`]); what the store keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeaconBook {
    /// Signed commitments, by party.
    pub commits: BTreeMap<PublicKey, BeaconCommit>,
    /// Secrets revealed in time, by party (each opens its commitment).
    pub reveals: BTreeMap<PublicKey, [u8; 32]>,
}

impl BeaconBook {
    /// Parties that committed and have not revealed.
    pub fn unrevealed(&self) -> impl Iterator<Item = &PublicKey> {
        self.commits.keys().filter(|k| !self.reveals.contains_key(k))
    }
}

/// Why a commitment or a reveal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BeaconRefusal {
    /// The signer is neither a configured validator nor the trainer.
    #[error("not a configured validator or the trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A commitment after the window's submissions closed.
    #[error("the window's submissions have closed")]
    Closed,
    /// A commitment too far ahead of the current window.
    #[error("more than {BEACON_COMMIT_AHEAD} windows ahead")]
    TooEarly,
    /// Another commitment of this party for this window is recorded.
    #[error("another commitment for this window is recorded")]
    Conflict,
    /// A reveal before the window's submissions closed.
    #[error("the window's submissions have not closed")]
    NotClosed,
    /// A reveal without a commitment.
    #[error("no commitment for this window")]
    NotCommitted,
    /// A reveal after the window's challenge was fixed.
    #[error("the window's challenge is fixed")]
    Fixed,
    /// The party withheld its last [`WITHHOLD_LIMIT`] reveals in a row.
    #[error("withheld its last {WITHHOLD_LIMIT} reveals in a row: contributions refused until cleared")]
    Withholding,
    /// The secret does not open the commitment.
    #[error("the secret does not match the commitment")]
    Mismatch,
}

impl Core {
    /// Whether `window`'s challenge is fixed at `now_ms`: its submissions
    /// have closed and every committed contribution is revealed, or the
    /// reveal period (`reveal_ms`) after the close has passed.
    pub fn challenge_fixed(&self, window: WindowId, now_ms: u64) -> bool {
        let closes = self.cfg.schedule.closes_at(window);
        if now_ms < closes {
            return false;
        }
        let all_in = self.beacon.get(&window).is_none_or(|b| b.unrevealed().next().is_none());
        all_in || now_ms >= closes.saturating_add(self.cfg.reveal_ms)
    }

    /// The mix of the coordinator's secret and the contributions revealed so far.
    pub(super) fn mixed_challenge(&self, window: WindowId) -> Seed {
        let empty = BTreeMap::new();
        let reveals = self.beacon.get(&window).map_or(&empty, |b| &b.reveals);
        beacon::mix(&self.network(), window, &self.secrets(window).challenge.0, reveals)
    }

    /// What the coordinator alone could compute for `window`: the mix with
    /// no contribution (a network without validators, or before any reveal).
    pub fn coordinator_only_challenge(&self, window: WindowId) -> Seed {
        beacon::mix(&self.network(), window, &self.secrets(window).challenge.0, &BTreeMap::new())
    }

    /// Records a validator's or the trainer's signed commitment to its
    /// contribution to a window's challenge. `Ok(true)` if new (store it),
    /// `Ok(false)` if the same commitment was already recorded.
    pub fn record_commit(&mut self, now_ms: u64, c: &BeaconCommit, signature_ok: bool) -> Result<bool, BeaconRefusal> {
        let party = c.body.party;
        if !self.cfg.access.permits(Role::Validator, &party) && !self.cfg.access.permits(Role::Trainer, &party) {
            return Err(BeaconRefusal::Unauthorized);
        }
        if !signature_ok || c.network != self.network() {
            return Err(BeaconRefusal::BadSignature);
        }
        let w = c.body.window;
        if self.closed(w, now_ms) {
            return Err(BeaconRefusal::Closed);
        }
        if w > self.current_window(now_ms).unwrap_or(0).saturating_add(BEACON_COMMIT_AHEAD) {
            return Err(BeaconRefusal::TooEarly);
        }
        let known = self.beacon.get(&w).and_then(|b| b.commits.get(&party)).is_some();
        if !known && self.withholding(&party, now_ms) {
            return Err(BeaconRefusal::Withholding);
        }
        let book = self.beacon.entry(w).or_default();
        match book.commits.get(&party) {
            Some(old) if old.body.commitment == c.body.commitment => Ok(false),
            Some(_) => Err(BeaconRefusal::Conflict),
            None => {
                book.commits.insert(party, c.clone());
                Ok(true)
            }
        }
    }

    /// Records the authenticated `party`'s reveal of its contribution.
    /// `Ok(true)` if new (store it), `Ok(false)` if already recorded.
    pub fn record_reveal(&mut self, now_ms: u64, party: &PublicKey, r: &BeaconReveal) -> Result<bool, BeaconRefusal> {
        if !self.closed(r.window, now_ms) {
            return Err(BeaconRefusal::NotClosed);
        }
        let Some(commit) = self.beacon.get(&r.window).and_then(|b| b.commits.get(party)) else {
            return Err(BeaconRefusal::NotCommitted);
        };
        if !beacon::opens(commit, &r.secret) {
            return Err(BeaconRefusal::Mismatch);
        }
        if self.beacon.get(&r.window).is_some_and(|b| b.reveals.get(party) == Some(&r.secret)) {
            return Ok(false);
        }
        if self.challenge_fixed(r.window, now_ms) {
            return Err(BeaconRefusal::Fixed);
        }
        self.beacon.entry(r.window).or_default().reveals.insert(*party, r.secret);
        self.committees.borrow_mut().remove(&r.window);
        Ok(true)
    }

    /// `window`'s commitments and reveals (what the store keeps).
    pub fn beacon_book(&self, window: WindowId) -> Option<&BeaconBook> {
        self.beacon.get(&window)
    }

    /// Re-adds a window's commitments and reveals found in the store at
    /// startup (no checks; before the verdicts, whose committees it fixes).
    pub fn restore_beacon(&mut self, window: WindowId, book: BeaconBook) {
        self.committees.borrow_mut().remove(&window);
        self.beacon.insert(window, book);
    }

    /// The published reveal of `window` once its challenge is fixed: the
    /// coordinator's secret, the contributions revealed (with their signed
    /// commitments), the commitments withheld, the challenge and the
    /// assignment settings. Anyone checks it with [`beacon::check_reveal`].
    pub fn reveal_frame(&self, window: WindowId, now_ms: u64) -> Option<Reveal> {
        let challenge = self.reveal(window, now_ms)?;
        let book = self.beacon.get(&window).cloned().unwrap_or_default();
        let contributions = book
            .reveals
            .iter()
            .filter_map(|(k, s)| book.commits.get(k).map(|c| Contribution { commit: c.clone(), secret: *s }))
            .collect();
        let withheld: Vec<BeaconCommit> = book.unrevealed().filter_map(|k| book.commits.get(k).cloned()).collect();
        if !withheld.is_empty() && self.withheld_logged.borrow_mut().insert(window) {
            for c in &withheld {
                tracing::warn!(window, party = %c.body.party, "a committed contribution to the challenge was not revealed in time");
            }
        }
        Some(Reveal {
            window,
            secret: self.secrets(window).challenge.0,
            contributions,
            withheld,
            challenge: challenge.0,
            trainer: self.cfg.access.trainer,
            assign: self.assign_spec(),
        })
    }

    /// Windows (still kept) in which each party committed a contribution and
    /// did not reveal it before the challenge was fixed at `now_ms`.
    pub fn withheld(&self, now_ms: u64) -> BTreeMap<PublicKey, Vec<WindowId>> {
        let mut out: BTreeMap<PublicKey, Vec<WindowId>> = BTreeMap::new();
        for (w, b) in &self.beacon {
            if self.challenge_fixed(*w, now_ms) {
                for k in b.unrevealed() {
                    out.entry(*k).or_default().push(*w);
                }
            }
        }
        out
    }

    /// Withheld reveals in a row of `party` among the windows up to `upto`
    /// for which `fixed` holds (newest first, stopping at a revealed one or
    /// at the last window an operator cleared).
    pub(super) fn withheld_streak(&self, party: &PublicKey, upto: WindowId, fixed: impl Fn(WindowId) -> bool) -> usize {
        let cleared = self.withhold_cleared.get(party).copied();
        let mut n = 0;
        for (w, b) in self.beacon.range(..=upto).rev() {
            if cleared.is_some_and(|c| *w <= c) {
                break;
            }
            if !b.commits.contains_key(party) || !fixed(*w) {
                continue;
            }
            if b.reveals.contains_key(party) {
                break;
            }
            n += 1;
        }
        n
    }

    /// Whether `party` (a validator or the trainer) withheld its last
    /// [`WITHHOLD_LIMIT`] reveals in a row, as of `now_ms`: its commitments
    /// are refused (its contributions stop counting) and a validator's
    /// verdicts are set aside, until an operator clears it
    /// ([`Core::clear_validator`]) or the withheld windows leave the kept
    /// span (`max(ban_windows, weight_windows) + 2` windows).
    pub fn withholding(&self, party: &PublicKey, now_ms: u64) -> bool {
        self.withheld_streak(party, WindowId::MAX, |w| self.challenge_fixed(w, now_ms)) >= WITHHOLD_LIMIT
    }

    /// Whether `party` was withholding when its verdict on `window` came:
    /// counted over the windows up to `window`, every one of them fixed by
    /// then (a validator's verdict is taken only once its window's challenge
    /// is), so a restart that restores the verdicts decides the same.
    pub(super) fn withholding_at(&self, party: &PublicKey, window: WindowId) -> bool {
        self.withheld_streak(party, window, |_| true) >= WITHHOLD_LIMIT
    }
}
