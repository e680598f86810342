//! Which validators judge which miners in a window, and which of each
//! miner's groups they prove: a pure rule anyone recomputes from the
//! window's revealed challenge secret, the network's [`Spec`] (the sorted set
//! of authorised validators, the committee size and each validator's
//! per-window budget) and the groups each miner stored.
//!
//! **Every miner, not a sample of miners.** The budget is spread over all
//! miners that submitted: with `V` validators of `B` rollouts each, groups of
//! `S` rollouts, committees of `k` and `M` miners, each miner's committee has
//! one *prover*, which proves the miner's sampled groups ahead of time, and
//! `k − 1` *confirmers*, which prove only the rollouts a failing verdict
//! cites, on demand (the coordinator lists them, `GetConfirmations`). Every
//! validator proves for at most `⌈M/V⌉` miners, and each miner gets
//! `g = ⌊⌊B/S⌋ / ⌈M/V⌉⌋` groups. While `g ≥ 1`, every miner that submitted
//! is judged in every window. When the budget cannot cover one group per
//! miner (`g = 0`) the rule still fills it: the first `V·⌊B/S⌋` miners in an
//! order fixed by the challenge secret get one group each and the rest none
//! that window (see `docs/validators.md`: their weight is extrapolated from
//! the windows in which they were judged, and the trainer's gradient gate
//! still proves whatever it trains on).
//!
//! **Balance.** Validators are put in an order drawn from the challenge
//! secret; the `i`-th miner (in its own drawn order) gets the validators at
//! positions `i, i+1, …, i+k−1` modulo `V`, the first its prover. The `k`
//! are distinct when `k ≤ V`; every validator proves `⌊c/V⌋` or `⌈c/V⌉` of
//! the `c` covered miners, so no validator's proving exceeds its budget (with
//! full groups) and two validators' shares differ.
//!
//! **Which groups.** Each miner's groups are ranked by a hash of the
//! challenge secret, the window, the miner and the group: unknown to the
//! miner when it submits, different for every miner. Only the prover proves
//! them ahead of time: a second member proving the same groups would double
//! the network's proving for nothing unless one of them fails, so the second
//! opinion is bought only when a failure asks for it.
//!
//! A validator proves what it is assigned and may prove more
//! ([`rank_for_validator`] orders extra miners by a validator's own key, so
//! extras from different validators differ).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::identity::PublicKey;
use crate::prf::Seed;
use crate::window::WindowId;

/// blake3 key-derivation context of every draw of this module.
pub const ASSIGN_DOMAIN: &str = crate::domain::context::VALIDATOR_ASSIGNMENT;

/// Validators per miner when the network does not say otherwise.
pub const DEFAULT_COMMITTEE: u32 = 2;

/// Rollouts one validator proves per window when the network does not say
/// otherwise (4096: at the default 32 groups of 16, one group of each of 128
/// miners per validator with committees of 2 and 1 validator; see
/// `docs/validators.md` for sizing).
pub const DEFAULT_BUDGET: u32 = 4096;

/// The network's assignment settings, published with every reveal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// The authorised validators (the rule sorts and deduplicates them).
    pub validators: Vec<PublicKey>,
    /// Validators per miner (at most the number of validators).
    pub committee: u32,
    /// Rollouts each validator proves ahead of time per window, at most (its
    /// assigned share as a prover; confirmations come on top, on demand).
    pub budget: u32,
}

impl Spec {
    /// A spec over `validators` with the default committee and budget.
    pub fn new(validators: impl IntoIterator<Item = PublicKey>) -> Self {
        Self { validators: validators.into_iter().collect(), committee: DEFAULT_COMMITTEE, budget: DEFAULT_BUDGET }
    }

    /// The validators, sorted and distinct.
    pub fn sorted_validators(&self) -> Vec<PublicKey> {
        let set: BTreeSet<PublicKey> = self.validators.iter().copied().collect();
        set.into_iter().collect()
    }
}

/// One miner's duty in a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Duty {
    /// The validators that judge it (empty: not covered this window): the
    /// first is its prover, the others its confirmers.
    pub committee: Vec<PublicKey>,
    /// The groups its prover proves (a subset of the miner's stored groups).
    pub groups: Vec<u32>,
}

impl Duty {
    /// The validator that proves the miner's groups ahead of time.
    pub fn prover(&self) -> Option<&PublicKey> {
        self.committee.first()
    }

    /// The validators that prove, on demand, the rollouts a failure cites.
    pub fn confirmers(&self) -> &[PublicKey] {
        self.committee.get(1..).unwrap_or(&[])
    }
}

/// A window's assignment: a [`Duty`] for every miner that stored a group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The window.
    pub window: WindowId,
    /// Groups each covered miner gets proven (when it stored that many).
    pub groups_each: u32,
    /// Every miner with work, covered or not.
    pub miners: BTreeMap<PublicKey, Duty>,
}

fn draw(challenge: &Seed, window: WindowId, what: &[u8], a: &[u8], b: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(ASSIGN_DOMAIN);
    h.update(&challenge.0);
    h.update(&window.to_le_bytes());
    h.update(&[what.len() as u8]);
    h.update(what);
    h.update(a);
    h.update(b);
    *h.finalize().as_bytes()
}

/// A miner's groups in the order they are proven: ranked by the challenge
/// secret, the window and the miner (ties, impossible in practice, by group).
pub fn group_order(challenge: &Seed, window: WindowId, miner: &PublicKey, groups: &BTreeSet<u32>) -> Vec<u32> {
    let mut v: Vec<u32> = groups.iter().copied().collect();
    v.sort_by_cached_key(|g| (draw(challenge, window, b"group", miner.as_bytes(), &g.to_le_bytes()), *g));
    v
}

/// The order in which `validator` picks miners beyond its assignment (its
/// own key is in the draw, so two validators' extras differ).
pub fn rank_for_validator(challenge: &Seed, window: WindowId, validator: &PublicKey, miner: &PublicKey) -> [u8; 32] {
    draw(challenge, window, b"extra", validator.as_bytes(), miner.as_bytes())
}

impl Assignment {
    /// The assignment of `window` under `spec`, from its revealed
    /// `challenge` secret, its group size and the groups each miner stored
    /// (miners with no group are left out).
    pub fn compute(
        spec: &Spec,
        window: WindowId,
        challenge: &Seed,
        group_size: u32,
        work: &BTreeMap<PublicKey, BTreeSet<u32>>,
    ) -> Assignment {
        let mut out = Assignment { window, groups_each: 0, miners: BTreeMap::new() };
        let mut miners: Vec<PublicKey> = work.iter().filter(|(_, g)| !g.is_empty()).map(|(m, _)| *m).collect();
        for m in &miners {
            out.miners.insert(*m, Duty::default());
        }
        let mut validators = spec.sorted_validators();
        let v = validators.len() as u64;
        let k = u64::from(spec.committee).min(v);
        if k == 0 || miners.is_empty() {
            return out;
        }
        let slots = u64::from(spec.budget / group_size.max(1));
        let m = miners.len() as u64;
        let per_validator = m.div_ceil(v);
        let groups_each = slots / per_validator;
        let covered = if groups_each >= 1 { m } else { (v * slots).min(m) };
        let groups_each = groups_each.max(1).min(u64::from(u32::MAX)) as u32;
        miners.sort_by_cached_key(|p| (draw(challenge, window, b"miner", p.as_bytes(), &[]), *p));
        validators.sort_by_cached_key(|p| (draw(challenge, window, b"validator", p.as_bytes(), &[]), *p));
        out.groups_each = if covered > 0 { groups_each } else { 0 };
        for (i, miner) in miners.iter().take(covered as usize).enumerate() {
            let committee = (0..k).map(|j| validators[((i as u64 + j) % v) as usize]).collect();
            let groups = work.get(miner).map(|g| group_order(challenge, window, miner, g)).unwrap_or_default();
            let groups = groups.into_iter().take(groups_each as usize).collect();
            out.miners.insert(*miner, Duty { committee, groups });
        }
        out
    }

    /// The miners `validator` proves ahead of time (their prover), with the groups to prove.
    pub fn of_validator<'a>(&'a self, validator: &'a PublicKey) -> impl Iterator<Item = (&'a PublicKey, &'a Duty)> {
        self.miners.iter().filter(move |(_, d)| d.prover() == Some(validator))
    }

    /// The miners whose failures `validator` confirms on demand (it is in
    /// their committee and not their prover).
    pub fn confirmed_by<'a>(&'a self, validator: &'a PublicKey) -> impl Iterator<Item = (&'a PublicKey, &'a Duty)> {
        self.miners.iter().filter(move |(_, d)| d.confirmers().contains(validator))
    }

    /// Miners with work that no validator is assigned this window.
    pub fn uncovered(&self) -> impl Iterator<Item = &PublicKey> {
        self.miners.iter().filter(|(_, d)| d.committee.is_empty()).map(|(m, _)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(n: u32) -> PublicKey {
        PublicKey(*blake3::hash(&n.to_le_bytes()).as_bytes())
    }

    fn work(miners: u32, groups: u32) -> BTreeMap<PublicKey, BTreeSet<u32>> {
        (0..miners).map(|m| (key(1000 + m), (0..groups).collect())).collect()
    }

    fn spec(validators: u32, committee: u32, budget: u32) -> Spec {
        Spec { validators: (0..validators).map(key).collect(), committee, budget }
    }

    /// Rollouts each validator proves ahead of time (full groups of `size`).
    fn loads(a: &Assignment, size: u32) -> BTreeMap<PublicKey, u64> {
        let mut out = BTreeMap::new();
        for d in a.miners.values() {
            if let Some(v) = d.prover() {
                *out.entry(*v).or_default() += d.groups.len() as u64 * u64::from(size);
            }
        }
        out
    }

    #[test]
    fn two_validators_differ_and_cover_every_miner() {
        let s = spec(2, 1, 4096);
        let a = Assignment::compute(&s, 7, &Seed([3; 32]), 4, &work(10, 4));
        let mine = |v: u32| a.of_validator(&key(v)).map(|(m, _)| *m).collect::<BTreeSet<_>>();
        let (x, y) = (mine(0), mine(1));
        assert!(x.is_disjoint(&y) && x.len() == 5 && y.len() == 5);
        assert_eq!(x.union(&y).count(), 10);
        // Committees of 2 out of 2: both are in every committee, one proves.
        let a = Assignment::compute(&spec(2, 2, 4096), 7, &Seed([3; 32]), 4, &work(10, 4));
        assert!(a.miners.values().all(|d| d.committee.len() == 2 && d.groups.len() == 4));
        assert!(a.miners.values().all(|d| d.confirmers().len() == 1 && d.prover() != d.confirmers().first()));
    }

    /// Issue 16's compute goal: each covered miner's groups are proven ahead
    /// of time by one validator (its prover); the other members of its
    /// committee confirm on demand. With 2 validators and committees of 2,
    /// each proves half the miners and confirms the other half.
    #[test]
    fn one_prover_per_miner_and_the_others_confirm() {
        let a = Assignment::compute(&spec(2, 2, 4096), 7, &Seed([3; 32]), 4, &work(10, 4));
        let proves = |v: u32| a.of_validator(&key(v)).map(|(m, _)| *m).collect::<BTreeSet<_>>();
        let (x, y) = (proves(0), proves(1));
        assert_eq!((x.len(), y.len()), (5, 5), "each validator proves half the miners ahead of time");
        assert!(x.is_disjoint(&y));
        let confirms = |v: u32| a.confirmed_by(&key(v)).map(|(m, _)| *m).collect::<BTreeSet<_>>();
        assert_eq!((confirms(0), confirms(1)), (y, x), "and confirms the other half on demand");
    }

    #[test]
    fn a_short_budget_covers_what_it_can() {
        // 3 validators of 2 groups each: 6 miners of 10, one group each.
        let a = Assignment::compute(&spec(3, 2, 8), 1, &Seed([9; 32]), 4, &work(10, 4));
        assert_eq!(a.groups_each, 1);
        assert_eq!(a.uncovered().count(), 4);
        assert!(loads(&a, 4).values().all(|&l| l <= 8));
        // No budget at all: nobody.
        let a = Assignment::compute(&spec(3, 2, 3), 1, &Seed([9; 32]), 4, &work(10, 4));
        assert_eq!((a.groups_each, a.uncovered().count()), (0, 10));
        // No validators: nobody.
        let a = Assignment::compute(&spec(0, 2, 4096), 1, &Seed([9; 32]), 4, &work(10, 4));
        assert_eq!(a.uncovered().count(), 10);
    }

    #[test]
    fn group_orders_differ_between_miners_and_windows() {
        let groups: BTreeSet<u32> = (0..32).collect();
        let c = Seed([1; 32]);
        let a = group_order(&c, 1, &key(1), &groups);
        assert_ne!(a, group_order(&c, 1, &key(2), &groups));
        assert_ne!(a, group_order(&c, 2, &key(1), &groups));
        assert_ne!(a, group_order(&Seed([2; 32]), 1, &key(1), &groups));
        assert_eq!(a.iter().copied().collect::<BTreeSet<_>>(), groups);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Deterministic, independent of the order the validators are listed
        /// in; committees are distinct authorised validators of the
        /// configured size; groups are the miner's own; no validator is
        /// handed more than its budget; every miner is covered exactly when
        /// the budget allows one group each.
        #[test]
        fn the_rule(
            n_validators in 0u32..12,
            committee in 0u32..5,
            budget in 0u32..400,
            size in 1u32..9,
            n_miners in 0u32..60,
            max_groups in 1u32..9,
            secret in any::<[u8; 32]>(),
            window in 0u64..1000,
        ) {
            let s = spec(n_validators, committee, budget);
            let w: BTreeMap<PublicKey, BTreeSet<u32>> = (0..n_miners)
                .map(|m| (key(1000 + m), (0..1 + (m % max_groups)).map(|g| g * 3 % 97).collect()))
                .collect();
            let c = Seed(secret);
            let a = Assignment::compute(&s, window, &c, size, &w);
            let mut shuffled = s.clone();
            shuffled.validators.reverse();
            shuffled.validators.extend(s.validators.first().copied());
            prop_assert_eq!(&a, &Assignment::compute(&shuffled, window, &c, size, &w));
            prop_assert_eq!(a.miners.len(), n_miners as usize);
            let k = committee.min(n_validators) as usize;
            let authorised: BTreeSet<PublicKey> = s.validators.iter().copied().collect();
            for (m, d) in &a.miners {
                let members: BTreeSet<PublicKey> = d.committee.iter().copied().collect();
                prop_assert!(d.committee.is_empty() || d.committee.len() == k);
                prop_assert_eq!(members.len(), d.committee.len());
                prop_assert!(members.is_subset(&authorised));
                prop_assert_eq!(d.committee.is_empty(), d.groups.is_empty());
                let own = &w[m];
                prop_assert!(d.groups.iter().all(|g| own.contains(g)));
                prop_assert_eq!(d.groups.len(), (a.groups_each as usize).min(own.len()) * usize::from(!d.committee.is_empty()));
            }
            for l in loads(&a, size).values() {
                prop_assert!(*l <= u64::from(budget), "load {} over budget {}", l, budget);
            }
            // One prover per covered miner, balanced over the validators.
            let covered = a.miners.values().filter(|d| !d.committee.is_empty()).count();
            for v in &authorised {
                let proves = a.of_validator(v).count();
                prop_assert!(proves <= covered.div_ceil(n_validators.max(1) as usize), "{} proves {}", v, proves);
            }
            let per_validator = if n_validators == 0 { 0 } else { u64::from(n_miners).div_ceil(u64::from(n_validators)) };
            let affordable = k > 0 && u64::from(budget / size) >= per_validator;
            prop_assert_eq!(a.uncovered().count() == 0, affordable || n_miners == 0);
        }
    }
}
