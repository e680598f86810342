//! Verdicts: recording and applying validators', the trainer's and the
//! coordinator's own verdicts, confirmation of failures by a miner's committee,
//! the failures waiting for a confirmer, and each miner's standing.

use std::collections::BTreeMap;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    Confirmation, Confirmations, MAX_CONFIRMATION_DIGESTS, MAX_CONFIRMATION_GROUPS, MAX_CONFIRMATIONS_PAGE,
    MinerStanding, Role, VerdictBody,
};

use crate::bans::Party;

use super::*;

/// Why a verdict was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerdictError {
    /// The signer is neither a configured validator nor the trainer.
    #[error("not a configured validator or the trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// The window's submissions have not closed.
    #[error("window not closed")]
    NotClosed,
    /// Inconsistent counts.
    #[error("valid exceeds checked")]
    Inconsistent,
}

impl Core {
    /// Tells the core whether the coordinator re-checks model-free evidence
    /// itself ([`crate::bans::Rechecker`]; assumed until told otherwise).
    /// Without it a confirmer is asked for that evidence too.
    pub fn set_model_free_recheck(&mut self, rechecks: bool) {
        self.model_free_recheck = rechecks;
    }

    /// The failures waiting for `confirmer`'s proof, in (window, miner)
    /// order after `after`, at most `limit` (and [`MAX_CONFIRMATIONS_PAGE`]).
    /// A failure waits for the other members of the miner's committee when
    /// a member's counted verdict claims it, nobody has confirmed it yet, and
    /// its hard evidence cites rollouts the coordinator cannot re-check itself
    /// (model-based checks) that the confirmer's own verdict does not cover;
    /// a claim resting on a count of soft failures asks for the prover's
    /// groups instead. A rollout in dispute (a validator's claim refuted by
    /// another validator's pass alone, [`crate::bans::Tribunal::disputes`])
    /// waits for every other validator that is not flagged, committee or
    /// not: a second failure claim outvotes the pass. Answered by the
    /// confirmer's verdict on the miner.
    pub fn confirmations(
        &self,
        confirmer: &PublicKey,
        after: Option<(WindowId, PublicKey)>,
        limit: u32,
    ) -> Confirmations {
        let limit = limit.clamp(1, MAX_CONFIRMATIONS_PAGE) as usize;
        let start = match after {
            Some(a) => std::ops::Bound::Excluded(a),
            None => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::new();
        for (w, m) in self.disputed.range((start, std::ops::Bound::Unbounded)) {
            if let Some(c) = self.confirmation_for(confirmer, *w, m) {
                if items.len() == limit {
                    let next = items.last().map(|c: &Confirmation| (c.window, c.miner));
                    return Confirmations { items, next };
                }
                items.push(c);
            }
        }
        Confirmations { items, next: None }
    }

    /// What `confirmer` is asked to prove of `miner` in `window`, if anything.
    pub(super) fn confirmation_for(
        &self,
        confirmer: &PublicKey,
        window: WindowId,
        miner: &PublicKey,
    ) -> Option<Confirmation> {
        let duty = self.duty(window, miner)?;
        let ties = self.tie_breaks(confirmer, window, miner);
        if !self.pending(window, miner) || !duty.committee.contains(confirmer) {
            let mut claimants: Vec<PublicKey> = ties.iter().map(|(_, c)| *c).collect();
            claimants.dedup();
            let mut digests: Vec<[u8; 32]> = ties.into_iter().map(|(d, _)| d).collect();
            digests.truncate(MAX_CONFIRMATION_DIGESTS);
            return (!digests.is_empty()).then(|| Confirmation {
                window,
                miner: *miner,
                claimants,
                digests,
                groups: Vec::new(),
            });
        }
        let by = self.verdicts.get(&(window, *miner))?;
        // A member's claim, or an outsider's hard evidence (sent to the committee).
        let claims: Vec<&VerdictBody> = by
            .values()
            .filter(|v| {
                v.validator != *confirmer
                    && (duty.committee.contains(&v.validator) || v.hard_failure)
                    && self.party(&v.validator) == Party::Validator
                    && self.claim_holds(v)
            })
            .collect();
        if claims.is_empty() {
            return None;
        }
        let own = by.get(confirmer);
        let covered =
            |d: &[u8; 32]| own.is_some_and(|o| o.passed.contains(d) || o.evidence.iter().any(|e| e.digest == *d));
        let mut digests: Vec<[u8; 32]> = Vec::new();
        let mut groups = Vec::new();
        for v in &claims {
            let hard: Vec<_> = v.evidence.iter().filter(|e| e.hard).collect();
            for e in &hard {
                let needs_model = !e.check.model_free() || !self.model_free_recheck;
                let held = self.holds(window, miner, &e.digest);
                if needs_model && held && !covered(&e.digest) && !digests.contains(&e.digest) {
                    digests.push(e.digest);
                }
            }
            if !v.hard_failure && own.is_none() && duty.committee.contains(&v.validator) {
                groups.clone_from(&duty.groups);
            }
        }
        for (d, _) in ties {
            if !digests.contains(&d) {
                digests.push(d);
            }
        }
        digests.truncate(MAX_CONFIRMATION_DIGESTS);
        groups.truncate(MAX_CONFIRMATION_GROUPS);
        if digests.is_empty() && groups.is_empty() {
            return None;
        }
        Some(Confirmation {
            window,
            miner: *miner,
            claimants: claims.iter().map(|v| v.validator).collect(),
            digests,
            groups,
        })
    }

    /// The disputed rollouts ([`crate::bans::Tribunal::disputes`]: a
    /// validator's claim refuted by another validator's pass alone) of
    /// `miner` in `window` that `confirmer` is asked to break the tie on:
    /// it is neither party, not flagged, the store holds the rollout and its
    /// own verdict does not cover it yet. (digest, claimant) pairs.
    fn tie_breaks(&self, confirmer: &PublicKey, window: WindowId, miner: &PublicKey) -> Vec<([u8; 32], PublicKey)> {
        if self.party(confirmer) != Party::Validator || self.tribunal.is_flagged(confirmer) {
            return Vec::new();
        }
        let own = self.verdicts.get(&(window, *miner)).and_then(|by| by.get(confirmer));
        let covered =
            |d: &[u8; 32]| own.is_some_and(|o| o.passed.contains(d) || o.evidence.iter().any(|e| e.digest == *d));
        let mut out: Vec<([u8; 32], PublicKey)> = Vec::new();
        for (d, claimant, passer) in self.tribunal.disputes(window, miner) {
            if claimant != *confirmer
                && passer != *confirmer
                && self.holds(window, miner, &d)
                && !covered(&d)
                && !out.iter().any(|(x, _)| *x == d)
            {
                out.push((d, claimant));
            }
        }
        out
    }

    /// Records a verdict of a validator or of the trainer's proof: checks the
    /// signer and timing, then applies it ([`Core::apply_verdict`]).
    pub fn record_verdict(&mut self, now_ms: u64, body: &VerdictBody, signature_ok: bool) -> Result<(), VerdictError> {
        if !self.cfg.access.permits(Role::Validator, &body.validator)
            && !self.cfg.access.permits(Role::Trainer, &body.validator)
        {
            return Err(VerdictError::Unauthorized);
        }
        if !signature_ok {
            return Err(VerdictError::BadSignature);
        }
        if now_ms < self.cfg.schedule.closes_at(body.window) {
            return Err(VerdictError::NotClosed);
        }
        // A validator proves what the fixed challenge assigns it; before
        // that its committee (what confirms a failure) is not known.
        if self.party(&body.validator) == Party::Validator && !self.challenge_fixed(body.window, now_ms) {
            return Err(VerdictError::NotClosed);
        }
        if body.valid > body.checked {
            return Err(VerdictError::Inconsistent);
        }
        self.apply_verdict(body);
        Ok(())
    }

    /// What the verdicts say about every miner known in `window`: passed or
    /// failed once judged (failed: a confirmed failure, [`crate::bans`]);
    /// `Suspect` while a failure claimed by a member of its committee waits
    /// for confirmation ([`Core::counted_claim`]: a claim on a digest the
    /// store lacks, or from outside the committee, holds nobody `Suspect`),
    /// or if unjudged but banned or failed within the ban span.
    pub fn standing(&self, window: WindowId) -> Vec<(PublicKey, MinerStanding)> {
        let mut out: BTreeMap<PublicKey, MinerStanding> = BTreeMap::new();
        for ((_, miner), by) in self.verdicts.range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32]))) {
            let st = if by.values().any(|v| self.fails(v)) {
                MinerStanding::Failed
            } else if by.values().any(|v| self.counted_claim(v)) {
                MinerStanding::Suspect
            } else {
                MinerStanding::Passed
            };
            out.insert(*miner, st);
        }
        for v in self.tribunal.trainer_verdicts(window) {
            if self.claim_holds(v) {
                out.insert(v.miner, MinerStanding::Failed);
            }
        }
        for (miner, m) in &self.miners {
            let recent = m.failures.iter().any(|w| *w <= window && window <= w.saturating_add(self.cfg.ban_windows));
            if !out.contains_key(miner) && (recent || self.is_banned(miner, window)) {
                out.insert(*miner, MinerStanding::Suspect);
            }
        }
        out.into_iter().collect()
    }

    /// Whether a verdict fails its miner (and so bans it for `ban_windows`):
    /// it claims a failure, its signer counts (not a flagged validator), and
    /// the failure of its miner's window is confirmed ([`Core::confirmed`]).
    pub fn fails(&self, v: &VerdictBody) -> bool {
        self.counted_claim(v) && !self.tribunal.is_flagged(&v.validator) && self.confirmed(v.window, &v.miner)
    }

    /// Whether `v`'s failure claim stands on evidence (issue 28 item 7): a
    /// hard failure that is the coordinator's own (its door penalties cite
    /// no rollout) or cites a rollout of its miner and window that the store
    /// holds ([`Core::holds`]); or, where soft failures count, soft failures
    /// past the gate. A claim on digests the store lacks is void.
    pub fn claim_holds(&self, v: &VerdictBody) -> bool {
        let hard = v.hard_failure
            && (self.party(&v.validator) == Party::Coordinator
                || v.hard_failed().any(|d| self.holds(v.window, &v.miner, d)));
        hard || (self.soft_failures_count() && v.soft_failures >= self.soft_ban_threshold(v.checked))
    }

    /// Whether `v`'s signer judges its miner with standing: the coordinator,
    /// the trainer, or a member of the miner's committee for the window.
    pub fn member(&self, v: &VerdictBody) -> bool {
        self.party(&v.validator) != Party::Validator || self.in_committee(v.window, &v.miner, &v.validator)
    }

    /// A claim that counts against its miner: it holds ([`Core::claim_holds`])
    /// and comes from a member ([`Core::member`]). An outsider's claim is
    /// only sent to the committee for confirmation ([`Core::confirmations`]).
    pub fn counted_claim(&self, v: &VerdictBody) -> bool {
        self.claim_holds(v) && self.member(v)
    }

    /// Whether a verdict says its miner failed: a hard failure, or (where
    /// soft failures count, [`CoreConfig::soft_failure_threshold`] > 0) soft
    /// failures past the binomial gate.
    pub fn claims_failure(&self, v: &VerdictBody) -> bool {
        v.hard_failure || (self.soft_failures_count() && v.soft_failures >= self.soft_ban_threshold(v.checked))
    }

    /// Whether soft failures ban and weigh ([`CoreConfig::soft_failure_threshold`] > 0).
    pub fn soft_failures_count(&self) -> bool {
        self.cfg.soft_failure_threshold > 0
    }

    /// Whether `miner`'s failure in `window` is confirmed: by the
    /// coordinator itself (a door penalty, a model-free re-check), by the
    /// trainer's proof, or by two validators whose verdicts count and who
    /// are both members of the miner's committee for the window
    /// ([`Core::in_committee`]): a validator outside it, or one proving
    /// extras, can claim a failure but not confirm one.
    pub fn confirmed(&self, window: WindowId, miner: &PublicKey) -> bool {
        if self.tribunal.trainer_verdict(window, miner).is_some_and(|v| self.claim_holds(v)) {
            return true;
        }
        let mut validators = 0;
        for v in self.verdicts.get(&(window, *miner)).into_iter().flat_map(|by| by.values()) {
            if self.claim_holds(v) {
                match self.party(&v.validator) {
                    Party::Validator if self.in_committee(window, miner, &v.validator) => validators += 1,
                    Party::Validator => {}
                    Party::Coordinator | Party::Trainer => return true,
                }
            }
        }
        validators >= 2
    }

    /// Whether a verdict that counts (a member's, or an outsider's hard
    /// evidence on stored rollouts) fails `miner` in `window` but nobody
    /// confirmed it yet.
    pub fn pending(&self, window: WindowId, miner: &PublicKey) -> bool {
        let claimed = self
            .verdicts
            .get(&(window, *miner))
            .is_some_and(|by| by.values().any(|v| self.claim_holds(v) && (v.hard_failure || self.member(v))));
        claimed && !self.confirmed(window, miner)
    }

    /// Sets the coordinator's own key: its verdicts (door penalties,
    /// re-checks) confirm a failure by themselves. Set before restoring verdicts.
    pub fn set_coordinator(&mut self, key: PublicKey) {
        self.coordinator = Some(key);
    }

    /// The role of a verdict's signer.
    pub fn party(&self, signer: &PublicKey) -> Party {
        if self.coordinator.as_ref() == Some(signer) {
            Party::Coordinator
        } else if self.cfg.access.permits(Role::Trainer, signer) {
            Party::Trainer
        } else {
            Party::Validator
        }
    }

    /// The verdicts recorded on `miner` in `window`, by validator.
    pub fn verdicts_on(&self, window: WindowId, miner: &PublicKey) -> Vec<VerdictBody> {
        self.verdicts.get(&(window, *miner)).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// Applies a verdict without checks (startup restore): its evidence
    /// and passing proofs on rollouts the store holds go to the ban rules
    /// ([`crate::bans`]), which may flag a validator whose evidence they
    /// refute or whose pass the coordinator's or the trainer's proof
    /// contradicts (its verdicts are set aside); the trainer's verdict is
    /// kept apart from the validators' (it is no sample for the weights); a
    /// confirmed failure bans.
    pub fn apply_verdict(&mut self, body: &VerdictBody) {
        let party = self.party(&body.validator);
        let (w, m) = (body.window, body.miner);
        let committee = self.duty(w, &m).map(|d| d.committee).unwrap_or_default();
        let held: BTreeSet<[u8; 32]> = body
            .passed
            .iter()
            .chain(body.evidence.iter().map(|e| &e.digest))
            .filter(|d| self.holds(w, &m, d))
            .copied()
            .collect();
        let provers =
            body.hard_failed().filter(|d| held.contains(*d)).map(|d| (*d, self.provers_of(w, &m, d))).collect();
        let noted = self.tribunal.note(body, party, &crate::bans::Facts { committee, held, provers });
        for flagged in noted.flagged {
            tracing::warn!(validator = %flagged, "validator flagged: another party's proof contradicts its verdict");
            self.set_aside_verdicts(&flagged);
        }
        for back in noted.unflagged {
            tracing::info!(validator = %back, "validator no longer flagged: the failure it claimed was proven");
            self.restore_set_aside(&back);
        }
        let key = (body.window, body.miner);
        // A validator withholding its reveals when its verdict came: set aside like a refuted one.
        let aside = self.tribunal.is_flagged(&body.validator)
            || (party == Party::Validator && self.withholding_at(&body.validator, body.window));
        if party != Party::Trainer {
            let book = if aside { &mut self.set_aside } else { &mut self.verdicts };
            book.entry(key).or_default().insert(body.validator, body.clone());
        }
        // A claim refuted by a validator's pass alone waits for a tie-breaker.
        if party == Party::Validator
            && self.claim_holds(body)
            && (!aside || !self.tribunal.disputes(key.0, &key.1).is_empty())
        {
            self.disputed.insert(key);
        }
        if self.counted_claim(body) && !aside && self.confirmed(key.0, &key.1) {
            self.ban(key.0, key.1);
        }
    }

    /// Who proved `miner`'s rollout `digest` of `window` passing, in the
    /// verdicts that count (validators not set aside, and the trainer).
    pub(super) fn provers_of(&self, window: WindowId, miner: &PublicKey, digest: &[u8; 32]) -> Vec<(PublicKey, Party)> {
        let mut out: Vec<(PublicKey, Party)> = self
            .verdicts
            .get(&(window, *miner))
            .into_iter()
            .flat_map(|by| by.values())
            .filter(|v| v.passed.contains(digest))
            .map(|v| (v.validator, self.party(&v.validator)))
            .collect();
        if let Some(t) = self.tribunal.trainer_verdict(window, miner).filter(|t| t.passed.contains(digest)) {
            out.push((t.validator, Party::Trainer));
        }
        out
    }
}
