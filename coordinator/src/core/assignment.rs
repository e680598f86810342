//! Who works on what: each miner's assigned tasks, and which validators
//! judge which miners (the committees) once a window's challenge is fixed.

use std::collections::{BTreeMap, BTreeSet};

use tributary_protocol::assign;
use tributary_protocol::env::task_seed;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::window::WindowId;

use super::*;

impl Core {
    /// The task id of `miner`'s group `group` in `window`: what a rollout must claim.
    pub fn assigned_task(&self, window: WindowId, miner: &PublicKey, group: u32) -> u64 {
        task_seed(&self.secrets(window).seed, miner.as_bytes(), group)
    }

    /// The assignment settings published with every reveal: the authorised
    /// validators (sorted), the committee size and each validator's budget.
    pub fn assign_spec(&self) -> assign::Spec {
        let mut validators: Vec<PublicKey> = self.cfg.access.validators.iter().copied().collect();
        validators.sort_unstable();
        assign::Spec { validators, committee: self.cfg.committee, budget: self.cfg.validator_budget }
    }

    /// The challenge secret of `window` with the assignment settings, once
    /// its submissions have closed ([`Core::reveal`]).
    pub fn reveal_with_assignment(&self, window: WindowId, now_ms: u64) -> Option<(Seed, assign::Spec)> {
        self.reveal(window, now_ms).map(|s| (s, self.assign_spec()))
    }

    /// Which validators judge which of `window`'s miners, and on which
    /// groups: what every validator computes from the reveal
    /// ([`assign::Assignment::compute`]); `None` before the reveal.
    pub fn assignment(&self, window: WindowId, now_ms: u64) -> Option<assign::Assignment> {
        let (challenge, spec) = self.reveal_with_assignment(window, now_ms)?;
        let work: BTreeMap<PublicKey, BTreeSet<u32>> = self
            .submitted
            .range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32])))
            .map(|((_, m), s)| (*m, s.groups.clone()))
            .collect();
        Some(assign::Assignment::compute(&spec, window, &challenge, self.cfg.group_size, &work))
    }

    /// Whether `validator` is in `miner`'s committee for `window`, under the
    /// window's challenge as the contributions recorded fix it (validators'
    /// verdicts are taken only once it is fixed, [`Core::record_verdict`]).
    pub fn in_committee(&self, window: WindowId, miner: &PublicKey, validator: &PublicKey) -> bool {
        self.duty(window, miner).is_some_and(|d| d.committee.contains(validator))
    }

    /// `miner`'s duty in `window` (its committee, prover first, and the
    /// groups its prover proves) under the challenge as the contributions
    /// recorded fix it; `None` if it stored nothing there.
    pub fn duty(&self, window: WindowId, miner: &PublicKey) -> Option<assign::Duty> {
        if let Some(by_miner) = self.committees.borrow().get(&window) {
            return by_miner.get(miner).cloned();
        }
        let work: BTreeMap<PublicKey, BTreeSet<u32>> = self
            .submitted
            .range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32])))
            .map(|((_, m), s)| (*m, s.groups.clone()))
            .collect();
        let challenge = self.mixed_challenge(window);
        let a = assign::Assignment::compute(&self.assign_spec(), window, &challenge, self.cfg.group_size, &work);
        let duty = a.miners.get(miner).cloned();
        self.committees.borrow_mut().insert(window, a.miners);
        duty
    }
}
