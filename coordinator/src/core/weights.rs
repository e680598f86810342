//! Weights: the superlinear weights over the windows ending at an interval,
//! and when each interval's document is due.

use std::collections::BTreeMap;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::verify;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{VerdictBody, WeightsBody};

use super::*;

impl Core {
    /// Superlinear weights over the `weight_windows` windows ending at
    /// `upto`, paid for proven work only (issue 28 item 2), normalised by
    /// what each miner was asked to do and by what was checked (grail's A/C,
    /// over the whole span rather than per window).
    ///
    /// Per miner: `A` = rollouts it stored in whole groups in the span (a
    /// subset of a group counts nothing: issue 28 item 4), each window
    /// capped at `unique_cap_per_window` (the door already caps it at what
    /// the miner was assigned, `groups_per_miner × group_size`); `C` =
    /// rollouts checked and `S` = soft-failed ones, from the most
    /// conservative counted verdict of each window it was judged in. The
    /// score is `A · q`, where `q` is the share of checked rollouts that
    /// passed *beyond an honest miner's own noise*:
    /// `q = 1 − max(0, S − h·C − 2·√(h(1−h)C)) / C` with `h` the calibrated
    /// honest soft-failure rate ([`verify::HONEST_SOFT_FAILURE_RATE`]) (where
    /// soft failures do not count, `q = 1`). The weight is
    /// `score^weight_exponent`, normalised.
    ///
    /// The verdicts that count are the coordinator's, the trainer's and
    /// those of validators in the miner's committee ([`Core::member`]),
    /// not set aside. The weight is zero if, in the span:
    /// - no rollout of the miner passed a proof that counts (a validator's,
    ///   the trainer's or the coordinator's) on a digest the store holds;
    /// - a verdict that counts claims a hard failure on evidence the store
    ///   holds ([`Core::claim_holds`]), *confirmed or not*: an unconfirmed
    ///   failure costs the weight at once (a ban still needs confirmation),
    ///   so a single validator, whose failures nobody can confirm, still
    ///   stops paying a cheater; a refuted claim's verdict is set aside and
    ///   costs nothing;
    /// - the miner is banned.
    ///
    /// Why `A · q` and not a sum of per-window extrapolations: a window in
    /// which the budget left a miner unjudged does not count as zero work
    /// (`A` counts every window it stored whole groups in, `q` pools every
    /// window it was checked in), and an honest miner's soft-failure noise
    /// is not rewarded or punished, so two identical honest miners get the
    /// same score — under exponent 4 a 5 % difference in score is a 22 %
    /// difference in weight. A window whose rollouts the coordinator no
    /// longer holds (a retention shorter than the weights' span, then a
    /// restart) pays nothing: its passes cannot be checked against the
    /// store, and a verdict alone (a colluding validator's) is no work.
    pub fn weights(&self, upto: WindowId, coordinator: PublicKey) -> WeightsBody {
        self.delayed_weights(upto, 0, coordinator)
    }

    /// [`Core::weights`] with pay delayed by `delay` windows: the document
    /// of interval `upto` pays the work of the `weight_windows` windows
    /// ending at `upto − delay`, and a hard failure claimed in any window
    /// from the first of those through `upto` zeroes it. Work is paid only
    /// once `delay` more windows passed without a failure: what a miner
    /// that cheats on a small share of its rollouts earns before its first
    /// failure is caught (the simulator's `--economics` measures it). The
    /// signed documents use `crate::weights::PAY_DELAY_WINDOWS`. Nothing is
    /// paid before window `delay`.
    pub fn delayed_weights(&self, upto: WindowId, delay: u64, coordinator: PublicKey) -> WeightsBody {
        let Some(work_upto) = upto.checked_sub(delay) else {
            return WeightsBody { window: upto, weights: Vec::new(), coordinator };
        };
        let from = work_upto.saturating_sub(self.cfg.weight_windows.saturating_sub(1));
        let cap = self.cfg.unique_cap_per_window;
        let size = self.cfg.group_size;
        let lo = |w| (w, PublicKey([0; 32]));
        let hi = |w| (w, PublicKey([0xff; 32]));
        #[derive(Default)]
        struct Tally {
            asked: u64,
            checked: u64,
            soft: u64,
            proven: bool,
            failed: bool,
        }
        let mut tallies: BTreeMap<PublicKey, Tally> = BTreeMap::new();
        for ((_, miner), s) in self.submitted.range(lo(from)..=hi(work_upto)) {
            tallies.entry(*miner).or_default().asked += s.whole_rollouts(size).min(cap);
        }
        let proves = |v: &VerdictBody| v.passed.iter().any(|d| self.holds(v.window, &v.miner, d));
        for w in from..=upto {
            for v in self.tribunal.trainer_verdicts(w) {
                let t = tallies.entry(v.miner).or_default();
                t.failed |= self.claim_holds(v);
                t.proven |= proves(v);
            }
        }
        for ((w, miner), by_validator) in self.verdicts.range(lo(from)..=hi(upto)) {
            let t = tallies.entry(*miner).or_default();
            let counted: Vec<&VerdictBody> = by_validator.values().filter(|v| self.member(v)).collect();
            t.failed |= counted.iter().any(|v| self.claim_holds(v));
            t.proven |= counted.iter().any(|v| proves(v));
            if *w > work_upto {
                continue;
            }
            // The most conservative verdict: the lowest share of valid rollouts.
            let Some(v) = counted.iter().filter(|v| v.checked > 0).min_by(|a, b| {
                let share = |v: &VerdictBody| f64::from(v.valid) / f64::from(v.checked);
                share(a).total_cmp(&share(b)).then(a.valid.cmp(&b.valid))
            }) else {
                continue;
            };
            t.checked += u64::from(v.checked);
            t.soft += u64::from(v.checked.saturating_sub(v.valid));
        }
        let h = verify::HONEST_SOFT_FAILURE_RATE;
        let scores: Vec<(PublicKey, f64)> = tallies
            .into_iter()
            .filter(|(miner, t)| t.proven && !t.failed && !self.is_banned(miner, upto))
            .map(|(miner, t)| {
                let c = t.checked as f64;
                let tolerated = h * c + 2.0 * (h * (1.0 - h) * c).sqrt();
                let q = match (c > 0.0, self.soft_failures_count()) {
                    (true, true) => 1.0 - (t.soft as f64 - tolerated).max(0.0) / c,
                    _ => 1.0,
                };
                let score = t.asked as f64 * q.clamp(0.0, 1.0);
                (miner, score.powi(self.cfg.weight_exponent))
            })
            .filter(|(_, s)| *s > 0.0)
            .collect();
        let sum: f64 = scores.iter().map(|(_, s)| s).sum();
        let weights = if sum > 0.0 { scores.into_iter().map(|(k, s)| (k, s / sum)).collect() } else { Vec::new() };
        WeightsBody { window: upto, weights, coordinator }
    }

    /// The latest interval whose signed weights document is due at `now_ms`:
    /// window `W`'s once `W + 1` has ended (its verdicts are posted during
    /// `W + 1`). `None` before window 2.
    pub fn weights_interval(&self, now_ms: u64) -> Option<WindowId> {
        self.current_window(now_ms)?.checked_sub(2)
    }
}
