//! Bans and flags: who is banned through when, the coordinator's door
//! penalties, the soft-failure gate, and validators flagged (refuted or
//! withholding) whose verdicts are set aside until an operator clears them.

use std::collections::HashMap;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::verify;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{RejectReason, VerdictBody};

use crate::bans::ValidatorStatus;

use super::*;

/// The most probability with which an honest miner may be banned by one
/// verdict's soft failures (issue 15: soft checks never ban an honest miner).
pub const SOFT_BAN_PROBABILITY: f64 = 1e-6;

/// Distinct checked counts whose soft-ban threshold the core remembers.
pub(super) const MAX_MEMO_THRESHOLDS: usize = 4096;

impl Core {
    /// Whether `miner` is banned during `window`.
    pub fn is_banned(&self, miner: &PublicKey, window: WindowId) -> bool {
        self.miners.get(miner).and_then(|m| m.banned_through).is_some_and(|through| window <= through)
    }

    /// Operator override (`coordinator ban`/`unban`, see [`crate::admin`]):
    /// `miner` is banned through `through` (inclusive), or not at all with
    /// `None`; later verdicts extend it as usual.
    pub fn set_banned_through(&mut self, miner: PublicKey, through: Option<WindowId>) {
        self.miners.entry(miner).or_default().banned_through = through;
    }

    /// The verdict the coordinator itself records when the authenticated
    /// miner submits what only it can be blamed for in `window`: a rollout
    /// signed over its own key that does not verify, or one made with a
    /// checkpoint other than the window's. `None` for every other refusal.
    /// Apply it with [`Core::apply_verdict`] (and store it).
    pub fn door_penalty(
        &self,
        now_ms: u64,
        window: WindowId,
        miner: &PublicKey,
        reason: RejectReason,
        coordinator: PublicKey,
    ) -> Option<VerdictBody> {
        if !matches!(reason, RejectReason::BadSignature | RejectReason::StaleCheckpoint) {
            return None;
        }
        // Only for a window taking submissions (a made-up window number must not
        // make the coordinator record arbitrary penalties), once per window.
        if !self.cfg.schedule.accepts(window, now_ms)
            || self.verdicts.get(&(window, *miner)).is_some_and(|by| by.contains_key(&coordinator))
        {
            return None;
        }
        let mut body =
            VerdictBody { checked: 1, hard_failure: true, ..VerdictBody::empty(window, *miner, coordinator) };
        body.add_reason(&format!("door: {}", reason.as_str()));
        Some(body)
    }

    /// Whether `validator`'s verdicts are set aside: its evidence was
    /// refuted, or it is withholding its reveals ([`Core::withholding`]).
    pub fn is_flagged(&self, validator: &PublicKey) -> bool {
        self.tribunal.is_flagged(validator) || self.withholding(validator, self.clock.get())
    }

    /// The authorised validators (and any flagged key): flagged or not,
    /// refutations, verdicts that count (`/api/validators`).
    pub fn validator_statuses(&self) -> Vec<ValidatorStatus> {
        let mut counted: HashMap<PublicKey, usize> = HashMap::new();
        for v in self.verdicts.values().flat_map(|by| by.keys()) {
            *counted.entry(*v).or_default() += 1;
        }
        let validators = self.cfg.access.validators.iter().copied();
        let mut statuses = self.tribunal.statuses(validators, |k| counted.get(k).copied().unwrap_or(0));
        let now = self.clock.get();
        let withheld = self.withheld(now);
        for s in &mut statuses {
            let Ok(k) = s.key.parse::<PublicKey>() else { continue };
            if let Some(ws) = withheld.get(&k) {
                s.beacon_withheld.clone_from(ws);
            }
            s.withholding = self.withholding(&k, now);
            s.flagged |= s.withholding;
        }
        statuses
    }

    /// An operator clears `validator` (or the trainer): its verdicts count
    /// again (failures they confirm ban), until another refutation, and its
    /// withheld reveals so far no longer make it withholding. Returns its
    /// refutations so far, which [`Core::restore_clear`] takes back at start
    /// (the withholding clear is not kept across a restart: the flag comes
    /// back while its windows are in the kept span).
    pub fn clear_validator(&mut self, validator: &PublicKey) -> usize {
        if let Some(last) = self.beacon.iter().rev().find(|(_, b)| b.commits.contains_key(validator)).map(|(w, _)| *w) {
            self.withhold_cleared.insert(*validator, last);
        }
        let n = self.tribunal.clear(validator);
        self.restore_set_aside(validator);
        n
    }

    /// Re-applies an operator's clear of `validator` (at start, after the verdicts).
    pub fn restore_clear(&mut self, validator: PublicKey, refutations: usize) {
        self.tribunal.set_cleared(validator, refutations);
        self.restore_set_aside(&validator);
    }

    pub(super) fn restore_set_aside(&mut self, validator: &PublicKey) {
        if self.tribunal.is_flagged(validator) {
            return;
        }
        if self.withholding(validator, self.clock.get()) {
            return;
        }
        let mut back = Vec::new();
        for (k, by) in self.set_aside.iter_mut() {
            if let Some(v) = by.remove(validator) {
                back.push((*k, v));
            }
        }
        self.set_aside.retain(|_, by| !by.is_empty());
        for (k, v) in back {
            self.verdicts.entry(k).or_default().insert(*validator, v);
            if self.confirmed(k.0, &k.1) {
                self.ban(k.0, k.1);
            }
        }
    }

    pub(super) fn set_aside_verdicts(&mut self, validator: &PublicKey) {
        for (k, by) in self.verdicts.iter_mut() {
            if let Some(v) = by.remove(validator) {
                self.set_aside.entry(*k).or_default().insert(*validator, v);
            }
        }
        self.verdicts.retain(|_, by| !by.is_empty());
    }

    pub(super) fn ban(&mut self, window: WindowId, miner: PublicKey) {
        let m = self.miners.entry(miner).or_default();
        let through = window.saturating_add(self.cfg.ban_windows);
        m.banned_through = Some(m.banned_through.map_or(through, |t| t.max(through)));
        if !m.failures.contains(&window) {
            m.failures.push(window);
        }
    }

    /// The soft failures among `checked` rollouts that ban: at least the
    /// configured floor, and never fewer than an honest miner (soft-failure
    /// rate [`verify::HONEST_SOFT_FAILURE_RATE`], calibrated) reaches with
    /// probability above [`SOFT_BAN_PROBABILITY`]. A small sample can then
    /// never ban on soft failures alone.
    pub fn soft_ban_threshold(&self, checked: u32) -> u32 {
        if let Some(t) = self.soft_thresholds.borrow().get(&checked) {
            return *t;
        }
        let gate = verify::soft_ban_threshold(checked, verify::HONEST_SOFT_FAILURE_RATE, SOFT_BAN_PROBABILITY);
        let t = gate.max(self.cfg.soft_failure_threshold.max(1));
        let mut memo = self.soft_thresholds.borrow_mut();
        if memo.len() < MAX_MEMO_THRESHOLDS {
            memo.insert(checked, t);
        }
        t
    }
}
