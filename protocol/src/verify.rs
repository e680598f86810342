//! Pure verification of one rollout against the validator's own evidence.
//!
//! The validator re-runs the model (libtorch) on the rollout's tokens and
//! fills an [`Evidence`]: its own sketch at every position and, for every
//! completion token, the [`PositionEvidence`] of that token
//! ([`crate::sampling::token_stats`] of the logits that predict it). This
//! module turns rollout + assignment + evidence into a [`Verdict`]: one
//! [`CheckOutcome`] per check, each hard or soft, failures carrying the
//! figures. A failing miner is data, never an `Err`; `Err` only means the
//! validator's own evidence has the wrong shape.
//!
//! The checks that need no model run first, once for every role that
//! judges a rollout ([`ModelFreeCheck`]: the validator before its forward,
//! the trainer before its gradient gate's, the coordinator when it re-checks
//! a failure): signature, the prompt re-derived from the task, structure and
//! the window's [`Contract`], the model's context, the reward recomputed
//! from the completion.
//!
//! Checks, in order:
//! 1. **Structure** (hard): assignment fields, lengths (completion at most
//!    `max_new_tokens`), token ids < vocab, finite numbers, sketch values in
//!    the field, no end-of-generation token before the last position. If it
//!    fails, nothing else runs; it needs no model, so it runs first.
//! 2. **Prompt** (hard): the prompt tokens equal the assigned task's.
//! 3. **Reward** (hard): the recomputed reward equals the reported one,
//!    bit for bit: every role computes it with the same deterministic `f32`
//!    code ([`crate::env::completion_reward`]), so any difference, however
//!    small, is a miner's choice (review incentives-and-proof-2 finding A).
//! 4. **Sketch** (hard): at the challenged positions (from the revealed
//!    challenge secret and the rollout digest) the committed sketch is within
//!    `τ(p)` of the validator's.
//! 5. **Logprob** (hard): at **every** completion token
//!    `exp(|lp_miner − lp_ref|) − 1` ≤ [`VerifyParams::logprob_is_eps`]
//!    (grail takes the median, which leaves half the tokens free).
//! 6. **Sampling** (hard): at every completion position the seeded draw lies
//!    in the chosen token's CDF interval; a draw within ε of it (the most two
//!    honest implementations' CDFs differ) is ambiguous
//!    ([`sampling::check_draw`], which says why no smaller set is sound),
//!    and then at most [`VerifyParams::max_draw_gap`] of reference
//!    probability mass may lie between the chosen token and the token the
//!    validator's own logits draw, when the evidence carries it
//!    ([`sampling::check_draw_bounded`]): one position admits tokens of
//!    joint reference mass at most `2·max_draw_gap` besides the two
//!    straddling ones.
//! 7. **Sampling coverage** (hard): a rollout has at most
//!    [`VerifyParams::max_ambiguous`] ambiguous positions (a bound above the
//!    count an honest rollout of those tokens reaches,
//!    [`AmbiguityCap`]), and at most
//!    [`VerifyParams::max_off_draw`] positions whose draw lies outside the
//!    chosen token's reference interval (admitted only through the ε band:
//!    the only positions where a miner could have chosen another token).
//!    Calibrated on honest rollouts (`docs/calibration.md` §6).
//! 8. **Distribution** (soft): grail §2.1 statistics of the chosen tokens'
//!    sampling probabilities (skipped below `min_steps` tokens: with every
//!    position checked by 6, short completions need no statistical test).
//! 9. **Termination** (hard): grail §2.2 — completion at most `max_new_tokens`,
//!    end-of-generation only as the last token; if shorter than the limit,
//!    it ends in EOS, and `p₁(EOS) ≥ min_eos_prob` there unless the
//!    validator's own logits draw EOS at that position (the seeded draw lies
//!    in EOS's interval). grail needs the probability floor because it
//!    cannot check the draw; applied to proven draws it only rejects honest
//!    miners whose draw landed on an unlikely EOS (measured: 1 of 424 honest
//!    SmolLM2 rollouts, docs/calibration.md). The floor remains for the one
//!    case where the draw does not decide: EOS admitted as ambiguous, its
//!    interval within ε of the draw but not containing it.
//! 10. **Trainable** (not a check; [`Verdict::trainable`]): an accepted
//!     rollout whose every completion token is the reference's own seeded
//!     draw. An ambiguous position admits other tokens (an honest miner's
//!     arithmetic moves the interval edges a little), so a miner that picks
//!     one there and regenerates the rest honestly passes every check with
//!     another completion, and another reward: at a level where rewards vary
//!     such branches doubled a miner's chosen reward (`docs/calibration.md`
//!     §6b). Off-draw rollouts are proven work, paid and never a failure, but
//!     the trainer does not train on their groups: given the task, the seed
//!     and the reference, the trainable completion of each rollout index is
//!     unique, so nothing a miner chooses reaches the gradient. Honest
//!     rollouts leave the draw at ~1 % of rollouts on SmolLM2 (the cost of
//!     the rule: about that share of rollouts, their groups with them).

use crate::checkpoint::ContentId;
use crate::env::{EnvId, Environment, completion_reward, task_seed};
use crate::prf::Seed;
use crate::rollout::{Rollout, SamplingParams};
use crate::sampling::{self, SampleCheck};
use crate::sketch::{self, SketchParams};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::window::WindowId;
use crate::wire::WindowInfo;

/// What the validator knows about one position's chosen token (from its own
/// logits): exactly [`crate::sampling::TokenStats`].
pub use crate::sampling::TokenStats as PositionEvidence;

/// Thresholds of the statistical token-distribution check (grail.md §2.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DistributionParams {
    /// Below this many completion tokens the check is skipped.
    pub min_steps: usize,
    /// Suspicious if the median chosen-token probability is ≤ this.
    pub median_low_max: f64,
    /// Suspicious if the minimum is ≤ this.
    pub min_token_prob: f64,
    /// Suspicious if the 10th percentile (whole completion, or initial window) is ≤ this.
    pub q10_max: f64,
    /// Length of the initial window.
    pub initial_window: usize,
}

impl DistributionParams {
    /// grail's constants.
    pub const GRAIL: DistributionParams = DistributionParams {
        min_steps: 30,
        median_low_max: 0.30,
        min_token_prob: 1e-5,
        q10_max: 0.025,
        initial_window: 50,
    };
}

/// Every verification constant, in one place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerifyParams {
    /// Sketch parameters and tolerance.
    pub sketch: SketchParams,
    /// Challenged positions per rollout.
    pub challenge_k: usize,
    /// Per-token IS deviation bound `exp(|Δlp|) − 1` (grail: 0.10, on the median).
    pub logprob_is_eps: f64,
    /// Ambiguity margin ε of the sampling check.
    pub sample_eps: f64,
    /// Positions allowed clearly outside their interval (0: exact).
    pub max_sample_outside: usize,
    /// Most ambiguous positions a rollout may have, from the count its
    /// tokens make honest ([`AmbiguityCap::max`]).
    pub max_ambiguous: AmbiguityCap,
    /// Most positions per rollout whose draw lies outside the claimed
    /// token's reference interval (within ε).
    pub max_off_draw: usize,
    /// Most reference probability mass strictly between an ambiguous
    /// position's claimed token and the token the validator's logits draw
    /// ([`sampling::DEFAULT_MAX_DRAW_GAP`]).
    pub max_draw_gap: f64,
    /// Distribution check thresholds.
    pub distribution: DistributionParams,
    /// Minimum `p₁(EOS)` at an EOS ending (grail: 0.02).
    pub min_eos_prob: f64,
    /// Log-probs above this are impossible (rounding slack above 0).
    pub max_logprob: f32,
    /// Largest allowed temperature.
    pub max_temperature: f32,
}

impl VerifyParams {
    /// The protocol's current constants, calibrated on SmolLM2-135M
    /// (`docs/calibration.md`): honest |Δ logprob| is at most 4e-5 (median
    /// 1e-6; 6.8e-5 at most over 54 379 GSM8K positions) between the
    /// llama.cpp miner and the libtorch reference, so the per-token IS bound
    /// is 1e-3, 15× over the worst honest token (grail's 0.10 on the median
    /// was sized for bf16 drift);
    /// `sample_eps` is [`sampling::DEFAULT_SAMPLE_EPS`].
    pub const DEFAULT: VerifyParams = VerifyParams {
        sketch: SketchParams::DEFAULT,
        challenge_k: sketch::CHALLENGE_K,
        logprob_is_eps: 1e-3,
        sample_eps: sampling::DEFAULT_SAMPLE_EPS,
        max_sample_outside: 0,
        max_ambiguous: AmbiguityCap::DEFAULT,
        max_off_draw: 2,
        max_draw_gap: sampling::DEFAULT_MAX_DRAW_GAP,
        distribution: DistributionParams::GRAIL,
        min_eos_prob: 0.02,
        max_logprob: 1e-3,
        max_temperature: 4.0,
    };
}

/// The hard cap on a rollout's ambiguous positions, from what its tokens
/// make an honest rollout reach.
///
/// Given the tokens, an honest draw `u` at position `i` is uniform over the
/// chosen token's interval (width `p_i`, its sampling probability), and the
/// continuation depends on the token, not on where in the interval `u` fell;
/// so the position is ambiguous (within `ε` of an edge) with probability
/// `q_i = min(1, 2ε/p_i)`, independently of the others. The honest count is
/// a sum of independent Bernoulli(`q_i`) with mean `E = Σ q_i`
/// ([`AmbiguityCap::expected`]); the cap is `base + ⌈E + sigmas·√E⌉`
/// ([`AmbiguityCap::max`]). Above its mean plus one, such a count's tail
/// is at most a binomial's of the same mean (Hoeffding 1956) and that at
/// most a Poisson's (Anderson and Samuels 1967), so at `base` 8 and `sigmas`
/// 6 an honest rollout exceeds the cap with probability below 5e-10 at any
/// `E` (largest at `E` ≈ 400; `docs/calibration.md` §6). A fixed share of the
/// length (protocol 7: `8 + ⌊0.08·n⌋`) rejected honest rollouts of a flat
/// model, where most tokens have `p < 2ε` and most positions are ambiguous
/// (issue 30: 20 of 64 on SmolLM2's weights in the qwen2 layout).
///
/// The cap is not where a cheater's choice is bounded: a position whose
/// draw lies inside the claimed token's reference interval admits no other
/// token, and the positions where one could have been chosen are bounded by
/// [`VerifyParams::max_off_draw`]. The cap refuses evidence that is
/// implausible as a whole.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AmbiguityCap {
    /// Allowed whatever the tokens.
    pub base: usize,
    /// Standard deviations (of a Poisson count of mean `E`) allowed above `E`.
    pub sigmas: f64,
}

impl AmbiguityCap {
    /// Calibrated on honest rollouts (`docs/calibration.md` §6).
    pub const DEFAULT: AmbiguityCap = AmbiguityCap { base: 8, sigmas: 6.0 };

    /// The honest expectation `E = Σ min(1, 2ε/p_i)` of a rollout's
    /// ambiguous positions, from the reference's sampling probabilities of
    /// its tokens (a token of probability 0 counts 1).
    pub fn expected(ev: &[PositionEvidence], eps: f64) -> f64 {
        ev.iter()
            .map(|e| {
                let p = f64::from(e.prob_sampling);
                if p > 2.0 * eps { 2.0 * eps / p } else { 1.0 }
            })
            .sum()
    }

    /// The most ambiguous positions allowed where an honest rollout expects
    /// `expected` (a NaN expectation allows `base`).
    pub fn max(&self, expected: f64) -> usize {
        let e = if expected.is_finite() { expected.max(0.0) } else { 0.0 };
        self.base.saturating_add((e + self.sigmas * e.sqrt()).ceil() as usize)
    }

    /// Whether `ambiguous` positions are within the cap at `expected`.
    pub fn allows(&self, ambiguous: usize, expected: f64) -> bool {
        ambiguous <= self.max(expected)
    }
}

impl Default for VerifyParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What the validator expects of a rollout: the miner's assignment in the window.
#[derive(Debug, Clone)]
pub struct Assignment<'a> {
    /// The window.
    pub window: u64,
    /// The checkpoint miners had to use.
    pub checkpoint: ContentId,
    /// The window's environment.
    pub env: EnvId,
    /// The miner whose rollouts these are (the submitter's key).
    pub miner: [u8; 32],
    /// `task_seed(window_seed, miner, rollout.group)`.
    pub task_id: u64,
    /// The window's sampling parameters.
    pub sampling: SamplingParams,
    /// The tokenized prompt of the assigned task.
    pub prompt_tokens: &'a [u32],
    /// Groups per miner in the window (`group < groups_per_miner`).
    pub groups_per_miner: u32,
    /// Rollouts per group (`rollout < group_size`).
    pub group_size: u32,
    /// Vocabulary size (token ids must be below it).
    pub vocab_size: u32,
    /// End-of-generation token ids.
    pub eos_tokens: &'a [u32],
    /// The window's public seed (sampling draws).
    pub sampling_seed: Seed,
    /// The window's revealed challenge secret (challenged positions).
    pub challenge_secret: Seed,
}

/// What a window fixed for the rollouts in it: the coordinator's
/// [`WindowInfo`] (the generation contract) with the window's environment and
/// its revealed challenge secret, or an offline stand-in.
#[derive(Debug, Clone, Copy)]
pub struct Contract<'e> {
    /// The window.
    pub window: WindowId,
    /// The checkpoint miners had to use.
    pub checkpoint: ContentId,
    /// The window's environment.
    pub env: &'e Environment,
    /// Temperature and `max_new_tokens` every rollout must carry.
    pub sampling: SamplingParams,
    /// Groups per miner.
    pub groups_per_miner: u32,
    /// Rollouts per group.
    pub group_size: u32,
    /// The one miner the window is for (offline runs); `None`: any miner,
    /// each rollout judged as its signer's.
    pub miner: Option<[u8; 32]>,
    /// The window's public seed (tasks, draws, sketch coefficients).
    pub seed: Seed,
    /// The revealed challenge secret (challenged positions, sampling of
    /// groups); checks without the sketch check (the trainer's, the
    /// coordinator's) read none and may pass any value.
    pub challenge: Seed,
}

impl<'e> Contract<'e> {
    /// The contract of a coordinator's window; `env` is the window's
    /// environment ([`Environment::for_window`]).
    pub fn of_window(info: &WindowInfo, env: &'e Environment, challenge: Seed) -> Self {
        Self {
            window: info.window,
            checkpoint: info.checkpoint,
            env,
            sampling: info.sampling,
            groups_per_miner: info.groups_per_miner,
            group_size: info.group_size,
            miner: None,
            seed: info.seed,
            challenge,
        }
    }

    /// What this contract expects of `r`: its task (from the window's seed,
    /// the rollout's miner and group), whose prompt tokens are
    /// `prompt_tokens`, under a model of `vocab_size` tokens with the
    /// end-of-generation ids `eos_tokens`.
    pub fn assignment<'a>(
        &self,
        r: &Rollout,
        prompt_tokens: &'a [u32],
        vocab_size: u32,
        eos_tokens: &'a [u32],
    ) -> Assignment<'a> {
        Assignment {
            window: self.window,
            checkpoint: self.checkpoint,
            env: self.env.id(),
            miner: self.miner.unwrap_or(r.miner),
            task_id: task_seed(&self.seed, &r.miner, r.group),
            sampling: self.sampling,
            prompt_tokens,
            groups_per_miner: self.groups_per_miner,
            group_size: self.group_size,
            vocab_size,
            eos_tokens,
            sampling_seed: self.seed,
            challenge_secret: self.challenge,
        }
    }
}

/// The checks that need no model, in the protocol's order, cheapest first;
/// what the validator runs before its forward, the trainer before its
/// gradient gate's forward, and the coordinator when it re-checks a failure
/// ([`ModelFreeCheck::run`]):
/// 1. the signature (when [`ModelFreeCheck::signatures`] asks for it);
/// 2. the task and its prompt re-derived from the window's seed, the
///    rollout's miner and group;
/// 3. **Structure**: the window's contract (window, checkpoint, environment,
///    miner, task, sampling settings, indices), lengths (completion at most
///    `max_new_tokens`), ranges, end-of-generation only as the last token;
/// 4. **Prompt**: the rollout's prompt tokens are the task's;
/// 5. the model's context (when [`ModelFreeCheck::context`] names one);
/// 6. **Reward**: recomputed from the completion and compared.
#[derive(Debug, Clone, Copy)]
pub struct ModelFreeCheck<'t> {
    /// The network's tokenizer (every checkpoint of a network shares it).
    pub tokenizer: &'t Tokenizer,
    /// Its end-of-generation ids.
    pub eos_tokens: &'t [u32],
    /// The model's vocabulary size (token ids must be below it; the
    /// tokenizer's may be smaller).
    pub vocab_size: u32,
    /// The context of the model the checker runs next (`None`: no model, not checked).
    pub context: Option<usize>,
    /// Whether the rollout must carry a valid signature (offline records are
    /// unsigned; the trainer reads rollouts the coordinator's door checked).
    pub signatures: bool,
    /// Verification constants.
    pub params: &'t VerifyParams,
}

/// A rollout the model-free checks did not reject before its reward: what
/// the model's checks need next.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The assigned task's prompt tokens.
    pub prompt: Vec<u32>,
    /// The reward recomputed from the completion.
    pub reward: f32,
    /// The structure, prompt and reward outcomes. Only the reward can have
    /// failed: it is data here, not a [`Rejection`], so that a validator
    /// still proves the rollout and its verdict carries every failed check
    /// ([`Prepared::hard_failure`] for a caller that stops at it).
    pub verdict: Verdict,
}

impl Prepared {
    /// The reward check, if it failed.
    pub fn hard_failure(&self) -> Option<&CheckOutcome> {
        self.verdict.first_hard_failure()
    }
}

/// Why the model-free checks rejected a rollout before its reward.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// The rollout's signature does not verify.
    #[error("the rollout's signature does not verify")]
    Signature,
    /// The task's prompt does not tokenize.
    #[error("the task's prompt does not tokenize: {0}")]
    Environment(#[source] TokenizerError),
    /// The structure or prompt check failed: the checks run, the last one failed.
    #[error("{}", .0.first_hard_failure().map_or_else(String::new, CheckOutcome::to_line))]
    Failed(Verdict),
    /// More tokens than the model's context.
    #[error("{tokens} tokens exceed the model's context of {context}")]
    ExceedsContext {
        /// Tokens in the rollout.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
    /// The completion does not decode (its reward cannot be recomputed).
    #[error("the completion does not decode: {0}")]
    Undecodable(#[source] TokenizerError),
}

impl ModelFreeCheck<'_> {
    /// Runs the model-free checks on `r` under `c`, in order; stops at the
    /// first failure but the reward's ([`Prepared::verdict`]).
    pub fn run(&self, r: &Rollout, c: &Contract<'_>) -> Result<Prepared, Rejection> {
        if self.signatures && r.verify_signature().is_err() {
            return Err(Rejection::Signature);
        }
        let task = c.env.task(task_seed(&c.seed, &r.miner, r.group));
        let prompt = self.tokenizer.encode(&c.env.prompt_text(&task)).map_err(Rejection::Environment)?;
        let a = c.assignment(r, &prompt, self.vocab_size, self.eos_tokens);
        let structure = check_structure(r, &a, self.params);
        if structure.failed() {
            return Err(Rejection::Failed(Verdict::of_checks(vec![structure])));
        }
        let prompt_check = check_prompt(r, &a);
        if prompt_check.failed() {
            return Err(Rejection::Failed(Verdict::of_checks(vec![structure, prompt_check])));
        }
        if let Some(context) = self.context
            && r.tokens.len() > context
        {
            return Err(Rejection::ExceedsContext { tokens: r.tokens.len(), context });
        }
        let reward = completion_reward(self.tokenizer, c.env, &task, r.completion()).map_err(Rejection::Undecodable)?;
        let reward_check = check_reward(r, reward);
        Ok(Prepared { prompt, reward, verdict: Verdict::of_checks(vec![structure, prompt_check, reward_check]) })
    }
}

/// The validator's evidence for one rollout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// The validator's sketch at every position (`len == tokens.len()`);
    /// only challenged positions are read.
    pub sketches: Vec<u32>,
    /// One entry per completion token, in order: stats of token
    /// `prompt_len + i` under the logits at position `prompt_len + i − 1`,
    /// at the rollout's temperature.
    pub positions: Vec<PositionEvidence>,
}

/// The validator's evidence does not fit the rollout (a validator bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Wrong number of evidence sketches.
    #[error("evidence has {got} sketches for {expected} positions")]
    Sketches {
        /// Positions in the rollout.
        expected: usize,
        /// Sketches supplied.
        got: usize,
    },
    /// Wrong number of position entries.
    #[error("evidence has {got} entries for {expected} completion tokens")]
    Positions {
        /// Completion tokens in the rollout.
        expected: usize,
        /// Entries supplied.
        got: usize,
    },
}

/// Which check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CheckKind {
    /// Schema, lengths, ranges, assignment fields.
    Structure,
    /// Prompt equals the assigned task's.
    Prompt,
    /// Recomputed reward equals the reported one.
    Reward,
    /// Sketches at challenged positions.
    Sketch,
    /// Miner log-probs against the reference.
    Logprob,
    /// Exact seeded-sampling check at every position.
    Sampling,
    /// How many positions the sampling check could not decide (hard: capped).
    SamplingCoverage,
    /// grail's token-distribution statistics.
    Distribution,
    /// Length limit / EOS ending.
    Termination,
}

/// Hard failures reject the rollout; soft ones count toward a per-miner gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Rejects the rollout (and marks the miner).
    Hard,
    /// Statistical suspicion.
    Soft,
}

impl CheckKind {
    /// Every check, in the order [`verify_rollout`] runs them.
    pub const ALL: [CheckKind; 9] = [
        CheckKind::Structure,
        CheckKind::Prompt,
        CheckKind::Reward,
        CheckKind::Sketch,
        CheckKind::Logprob,
        CheckKind::Sampling,
        CheckKind::SamplingCoverage,
        CheckKind::Distribution,
        CheckKind::Termination,
    ];

    /// The check's severity.
    pub fn severity(self) -> Severity {
        match self {
            CheckKind::Distribution => Severity::Soft,
            _ => Severity::Hard,
        }
    }

    /// The check's name in reports, metrics and verdict reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Structure => "structure",
            CheckKind::Prompt => "prompt",
            CheckKind::Reward => "reward",
            CheckKind::Sketch => "sketch",
            CheckKind::Logprob => "logprob",
            CheckKind::Sampling => "sampling",
            CheckKind::SamplingCoverage => "sampling_coverage",
            CheckKind::Distribution => "distribution",
            CheckKind::Termination => "termination",
        }
    }
}

/// A failed check, with the figures.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// An assignment field differs (`field` names it).
    AssignmentMismatch {
        /// Which field: window, checkpoint, env, miner, task_id, sampling.
        field: &'static str,
    },
    /// Group or rollout index out of range.
    IndexOutOfRange {
        /// `"group"` or `"rollout"`.
        field: &'static str,
        /// The index.
        index: u32,
        /// The bound it must be below.
        bound: u32,
    },
    /// `prompt_len` is 0 or leaves no completion.
    BadPromptLen {
        /// The prompt length.
        prompt_len: u32,
        /// The token count.
        tokens: usize,
    },
    /// A list has the wrong length.
    LengthMismatch {
        /// `"logprobs"` or `"sketches"`.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A token id is not in the vocabulary.
    TokenOutOfVocab {
        /// Absolute position.
        position: usize,
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: u32,
    },
    /// A log-prob is NaN, infinite or positive.
    BadLogprob {
        /// Completion index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// A sketch value is not below `Q`.
    SketchOutOfField {
        /// Absolute position.
        position: usize,
        /// The value.
        value: u32,
    },
    /// The temperature is not in `[0, max]` (or not finite).
    BadTemperature {
        /// The value.
        value: f32,
    },
    /// The reported reward is not finite.
    BadReward {
        /// The value.
        value: f32,
    },
    /// Prompt tokens differ from the assigned task's.
    PromptMismatch {
        /// Expected prompt length.
        expected_len: usize,
        /// Reported prompt length.
        got_len: usize,
        /// First differing index (or the shorter length).
        first_diff: usize,
    },
    /// Reward differs from the recomputed one.
    RewardMismatch {
        /// Reported by the miner.
        reported: f32,
        /// Recomputed by the validator.
        recomputed: f32,
    },
    /// Sketches too far from the validator's at challenged positions.
    SketchMismatch {
        /// Positions that failed.
        failed: usize,
        /// Positions checked.
        checked: usize,
        /// The worst position (largest distance − tolerance).
        position: usize,
        /// Its distance.
        distance: u32,
        /// Its tolerance.
        tolerance: u32,
    },
    /// A log-prob deviates from the reference.
    LogprobDeviation {
        /// Median `exp(|Δ|) − 1` (for the record; the bound is on every token).
        median: f64,
        /// The bound.
        threshold: f64,
        /// Completion index of the largest |Δ|.
        worst_index: usize,
        /// That |Δ| in nats.
        worst_delta: f64,
    },
    /// Draws clearly outside the chosen tokens' CDF intervals.
    SampleOutside {
        /// Positions outside.
        outside: usize,
        /// First such absolute position.
        position: usize,
        /// Its draw.
        u: f64,
        /// Its interval start.
        lo: f64,
        /// Its interval end.
        hi: f64,
    },
    /// Too many positions within ε of an interval edge.
    TooManyAmbiguous {
        /// Ambiguous positions.
        ambiguous: usize,
        /// Completion positions.
        total: usize,
        /// How many an honest rollout of these tokens expects
        /// ([`AmbiguityCap::expected`]).
        expected: f64,
        /// The cap.
        max: usize,
    },
    /// Too many positions admitted although the draw lies outside the
    /// claimed token's reference interval.
    TooManyOffDraw {
        /// Such positions.
        off_draw: usize,
        /// The cap.
        max: usize,
    },
    /// An ambiguous position's claimed token lies farther (in reference
    /// probability mass) from the token the validator's logits draw than a
    /// position may admit.
    FarFromDraw {
        /// First such absolute position.
        position: usize,
        /// The claimed token.
        token: u32,
        /// The validator's draw.
        drawn: u32,
        /// The mass strictly between them.
        gap: f64,
        /// The bound on it.
        max: f64,
    },
    /// Chosen-token probabilities look unlike sampling from the model.
    Distribution {
        /// Median probability.
        median: f64,
        /// Minimum probability.
        min: f64,
        /// 10th percentile over the completion.
        q10: f64,
        /// 10th percentile over the initial window.
        q10_initial: f64,
    },
    /// Longer than `max_new_tokens`.
    TooLong {
        /// Completion length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// An end-of-generation token before the last position (the miner
    /// sampled past the end and chose where to stop).
    EosBeforeEnd {
        /// Completion index of the first one.
        index: usize,
        /// The token.
        token: u32,
        /// Completion length.
        len: usize,
    },
    /// Shorter than the limit but not ending in EOS.
    NoEos {
        /// The last token.
        last: u32,
    },
    /// Ends in EOS the model found unlikely.
    LowEosProb {
        /// `p₁(EOS)` at the last position.
        prob: f32,
        /// The bound.
        min: f64,
    },
}

/// Outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Passed.
    Pass,
    /// Not applicable (reason).
    Skipped(&'static str),
    /// Failed.
    Fail(Failure),
}

/// One check's result.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    /// Which check.
    pub kind: CheckKind,
    /// Its severity.
    pub severity: Severity,
    /// The result.
    pub status: Status,
}

impl CheckOutcome {
    fn new(kind: CheckKind, status: Status) -> Self {
        Self { kind, severity: kind.severity(), status }
    }

    fn of(kind: CheckKind, r: Result<(), Failure>) -> Self {
        Self::new(kind, r.map_or_else(Status::Fail, |()| Status::Pass))
    }

    /// Whether this check failed.
    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Fail(_))
    }

    /// The failure, if the check failed.
    pub fn failure(&self) -> Option<&Failure> {
        match &self.status {
            Status::Fail(f) => Some(f),
            _ => None,
        }
    }

    /// `check: status` on one line.
    fn to_line(&self) -> String {
        format!("{}: {:?}", self.kind.as_str(), self.status)
    }
}

/// The outcome of every check run on one rollout.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// One entry per check run.
    pub checks: Vec<CheckOutcome>,
    /// Positions the sampling check classified inside / ambiguous / outside.
    pub sampling_counts: SamplingCounts,
}

/// Tally of the sampling check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SamplingCounts {
    /// Draws inside the interval.
    pub inside: usize,
    /// Draws within ε of an edge.
    pub ambiguous: usize,
    /// Of those, draws outside the claimed token's reference interval: the
    /// claimed token is not the one the reference draws there.
    pub off_draw: usize,
    /// The first such absolute position.
    pub first_off_draw: Option<usize>,
    /// Draws clearly outside.
    pub outside: usize,
}

impl Verdict {
    /// The verdict of checks that involve no sampling draw.
    fn of_checks(checks: Vec<CheckOutcome>) -> Self {
        Self { checks, sampling_counts: SamplingCounts::default() }
    }

    /// No hard check failed.
    pub fn accepted(&self) -> bool {
        self.first_hard_failure().is_none()
    }

    /// Accepted, and every completion token is the one the reference's own
    /// logits draw at its position: the only rollouts a gradient may use
    /// (check 10 of the module doc). An accepted rollout with an off-draw
    /// position is proven work (paid, never a miner's failure), but its
    /// group is not trained on.
    pub fn trainable(&self) -> bool {
        self.accepted() && self.sampling_counts.off_draw == 0
    }

    /// The first hard check that failed, if any.
    pub fn first_hard_failure(&self) -> Option<&CheckOutcome> {
        self.checks.iter().find(|c| c.severity == Severity::Hard && c.failed())
    }

    /// Some soft check failed.
    pub fn soft_failed(&self) -> bool {
        self.checks.iter().any(|c| c.severity == Severity::Soft && c.failed())
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = (CheckKind, &Failure)> + '_ {
        self.checks.iter().filter_map(|c| match &c.status {
            Status::Fail(f) => Some((c.kind, f)),
            _ => None,
        })
    }

    /// The outcome of `kind`, if it ran.
    pub fn get(&self, kind: CheckKind) -> Option<&CheckOutcome> {
        self.checks.iter().find(|c| c.kind == kind)
    }
}

/// Structural check (cheap; run before any model work).
pub fn check_structure(r: &Rollout, a: &Assignment<'_>, p: &VerifyParams) -> CheckOutcome {
    CheckOutcome::of(CheckKind::Structure, structure(r, a, p))
}

fn structure(r: &Rollout, a: &Assignment<'_>, p: &VerifyParams) -> Result<(), Failure> {
    let mismatch = |field| Err(Failure::AssignmentMismatch { field });
    if r.window != a.window {
        return mismatch("window");
    }
    if r.checkpoint != a.checkpoint {
        return mismatch("checkpoint");
    }
    if r.env != a.env {
        return mismatch("env");
    }
    if r.miner != a.miner {
        return mismatch("miner");
    }
    if r.task_id != a.task_id {
        return mismatch("task_id");
    }
    let t = r.sampling.temperature;
    if !(t.is_finite() && (0.0..=p.max_temperature).contains(&t)) {
        return Err(Failure::BadTemperature { value: t });
    }
    if r.sampling.temperature.to_bits() != a.sampling.temperature.to_bits()
        || r.sampling.max_new_tokens != a.sampling.max_new_tokens
    {
        return mismatch("sampling");
    }
    if r.group >= a.groups_per_miner {
        return Err(Failure::IndexOutOfRange { field: "group", index: r.group, bound: a.groups_per_miner });
    }
    if r.rollout >= a.group_size {
        return Err(Failure::IndexOutOfRange { field: "rollout", index: r.rollout, bound: a.group_size });
    }
    let n = r.tokens.len();
    let pl = r.prompt_len as usize;
    if pl == 0 || pl >= n {
        return Err(Failure::BadPromptLen { prompt_len: r.prompt_len, tokens: n });
    }
    if r.logprobs.len() != n - pl {
        return Err(Failure::LengthMismatch { what: "logprobs", expected: n - pl, got: r.logprobs.len() });
    }
    if r.sketches.len() != n {
        return Err(Failure::LengthMismatch { what: "sketches", expected: n, got: r.sketches.len() });
    }
    if let Some((position, &token)) = r.tokens.iter().enumerate().find(|(_, t)| **t >= a.vocab_size) {
        return Err(Failure::TokenOutOfVocab { position, token, vocab: a.vocab_size });
    }
    if let Some((index, &value)) = r.logprobs.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v <= p.max_logprob))
    {
        return Err(Failure::BadLogprob { index, value });
    }
    if let Some((position, &value)) = r.sketches.iter().enumerate().find(|(_, s)| **s >= sketch::Q) {
        return Err(Failure::SketchOutOfField { position, value });
    }
    if !r.reward.is_finite() {
        return Err(Failure::BadReward { value: r.reward });
    }
    length_and_eos(r, a.eos_tokens)
}

/// Completion at most `max_new_tokens`, and no end-of-generation token
/// before its last position.
fn length_and_eos(r: &Rollout, eos_tokens: &[u32]) -> Result<(), Failure> {
    let c = r.completion();
    let max = r.sampling.max_new_tokens;
    if c.len() > max as usize {
        return Err(Failure::TooLong { len: c.len(), max });
    }
    if let Some((index, &token)) = c.iter().enumerate().find(|(i, t)| i + 1 < c.len() && eos_tokens.contains(t)) {
        return Err(Failure::EosBeforeEnd { index, token, len: c.len() });
    }
    Ok(())
}

/// Prompt check: the rollout's prompt tokens equal the assigned task's.
pub fn check_prompt(r: &Rollout, a: &Assignment<'_>) -> CheckOutcome {
    let got = r.prompt();
    let want = a.prompt_tokens;
    let res = if got == want {
        Ok(())
    } else {
        let first_diff = got.iter().zip(want).position(|(x, y)| x != y).unwrap_or(got.len().min(want.len()));
        Err(Failure::PromptMismatch { expected_len: want.len(), got_len: got.len(), first_diff })
    };
    CheckOutcome::of(CheckKind::Prompt, res)
}

/// Reward check: the reported reward's `f32` bits equal the recomputed
/// one's. Rewards are exact functions of the completion, computed by the
/// same code in every role (`0.0`, `1.0`, or the practice level's credit
/// with one correctly rounded division), so there is no honest difference
/// to tolerate: a tolerance let a miner choose its group's advantage signs
/// (a reward nudged by 1e-6, review incentives-and-proof-2 finding A) and
/// be paid for it. `-0.0` for `0.0` and any NaN fail.
pub fn check_reward(r: &Rollout, recomputed: f32) -> CheckOutcome {
    let ok = r.reward.to_bits() == recomputed.to_bits();
    let res = if ok { Ok(()) } else { Err(Failure::RewardMismatch { reported: r.reward, recomputed }) };
    CheckOutcome::of(CheckKind::Reward, res)
}

/// The challenged positions of `r` (see [`sketch::challenged_positions`]).
pub fn challenged(r: &Rollout, challenge_secret: &Seed, p: &VerifyParams) -> Vec<usize> {
    sketch::challenged_positions(challenge_secret, &r.digest(), r.prompt_len as usize, r.tokens.len(), p.challenge_k)
}

/// Sketch check at the challenged positions. `reference[p]` is the
/// validator's sketch at absolute position `p`; positions beyond either list
/// count as failures.
pub fn check_sketches(r: &Rollout, positions: &[usize], reference: &[u32], p: &VerifyParams) -> CheckOutcome {
    let mut failed = 0;
    let mut worst: Option<(i64, usize, u32, u32)> = None;
    for &pos in positions {
        let tol = sketch::tolerance(pos, &p.sketch);
        let dist = match (r.sketches.get(pos), reference.get(pos)) {
            (Some(&m), Some(&v)) => sketch::distance(m, v),
            _ => u32::MAX,
        };
        if dist > tol {
            failed += 1;
            let excess = i64::from(dist) - i64::from(tol);
            if worst.is_none_or(|w| excess > w.0) {
                worst = Some((excess, pos, dist, tol));
            }
        }
    }
    let res = match worst {
        None => Ok(()),
        Some((_, position, distance, tolerance)) => {
            Err(Failure::SketchMismatch { failed, checked: positions.len(), position, distance, tolerance })
        }
    };
    CheckOutcome::of(CheckKind::Sketch, res)
}

/// numpy-style median (mean of the two middle values) of sorted data.
fn median_sorted(x: &[f64]) -> f64 {
    let n = x.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { x[n / 2] } else { (x[n / 2 - 1] + x[n / 2]) / 2.0 }
}

/// numpy `quantile(x, q)` with linear interpolation, on sorted data.
pub fn quantile_sorted(x: &[f64], q: f64) -> f64 {
    let n = x.len();
    if n == 0 {
        return f64::NAN;
    }
    let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    x[lo] + (h - lo as f64) * (x[hi] - x[lo])
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Log-prob check: every completion token's `exp(|Δ|) − 1` within the bound
/// (a median would leave half the tokens' claimed log-probs free).
pub fn check_logprobs(r: &Rollout, ev: &[PositionEvidence], p: &VerifyParams) -> CheckOutcome {
    let deltas: Vec<f64> =
        r.logprobs.iter().zip(ev).map(|(&m, e)| (f64::from(m) - f64::from(e.logprob_t1)).abs()).collect();
    let devs =
        sorted(deltas.iter().map(|d| d.exp() - 1.0).map(|d| if d.is_nan() { f64::INFINITY } else { d }).collect());
    let median = median_sorted(&devs);
    let worst = devs.last().copied().unwrap_or(0.0);
    let res = if worst <= p.logprob_is_eps && deltas.len() == r.logprobs.len() {
        Ok(())
    } else {
        let (worst_index, worst_delta) =
            deltas.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, f64::NAN));
        Err(Failure::LogprobDeviation { median, threshold: p.logprob_is_eps, worst_index, worst_delta })
    };
    CheckOutcome::of(CheckKind::Logprob, res)
}

/// Exact seeded-sampling check at every completion position; also returns
/// the coverage (soft) outcome and the tally.
pub fn check_sampling(
    r: &Rollout,
    ev: &[PositionEvidence],
    sampling_seed: &Seed,
    p: &VerifyParams,
) -> (CheckOutcome, CheckOutcome, SamplingCounts) {
    let mut counts = SamplingCounts::default();
    let mut first: Option<(usize, f64, f64, f64)> = None;
    let mut far: Option<Failure> = None;
    let pl = r.prompt_len as usize;
    for (i, e) in ev.iter().enumerate() {
        let pos = pl + i;
        let u = sampling::draw_u(sampling_seed, &r.miner, r.group, r.rollout, pos as u32);
        let token = r.tokens.get(pos).copied().unwrap_or(u32::MAX);
        match sampling::check_draw_bounded(u, e, token, p.sample_eps, p.max_draw_gap) {
            SampleCheck::Inside => counts.inside += 1,
            SampleCheck::Ambiguous => {
                counts.ambiguous += 1;
                if !(e.cdf_lo <= u && u < e.cdf_hi) {
                    counts.off_draw += 1;
                    counts.first_off_draw.get_or_insert(pos);
                }
            }
            SampleCheck::Outside { u, lo, hi } => {
                counts.outside += 1;
                first.get_or_insert((pos, u, lo, hi));
            }
            SampleCheck::FarFromDraw { token, drawn, gap } => {
                counts.ambiguous += 1;
                far.get_or_insert(Failure::FarFromDraw { position: pos, token, drawn, gap, max: p.max_draw_gap });
            }
        }
    }
    let exact = match (first, far) {
        (Some((position, u, lo, hi)), _) if counts.outside > p.max_sample_outside => {
            Err(Failure::SampleOutside { outside: counts.outside, position, u, lo, hi })
        }
        (_, Some(f)) => Err(f),
        _ => Ok(()),
    };
    let total = ev.len();
    let expected = AmbiguityCap::expected(ev, p.sample_eps);
    let coverage = if !p.max_ambiguous.allows(counts.ambiguous, expected) {
        Err(Failure::TooManyAmbiguous {
            ambiguous: counts.ambiguous,
            total,
            expected,
            max: p.max_ambiguous.max(expected),
        })
    } else if counts.off_draw > p.max_off_draw {
        Err(Failure::TooManyOffDraw { off_draw: counts.off_draw, max: p.max_off_draw })
    } else {
        Ok(())
    };
    (CheckOutcome::of(CheckKind::Sampling, exact), CheckOutcome::of(CheckKind::SamplingCoverage, coverage), counts)
}

/// grail's token-distribution check on the chosen tokens' sampling probabilities.
pub fn check_distribution(ev: &[PositionEvidence], p: &VerifyParams) -> CheckOutcome {
    let d = &p.distribution;
    if ev.len() < d.min_steps {
        return CheckOutcome::new(CheckKind::Distribution, Status::Skipped("completion shorter than min_steps"));
    }
    let probs: Vec<f64> = ev.iter().map(|e| f64::from(e.prob_sampling)).collect();
    let all = sorted(probs.clone());
    let init = sorted(probs[..d.initial_window.min(probs.len())].to_vec());
    let median = median_sorted(&all);
    let min = all[0];
    let q10 = quantile_sorted(&all, 0.10);
    let q10_initial = quantile_sorted(&init, 0.10);
    let suspicious =
        !(median > d.median_low_max && min > d.min_token_prob && q10 > d.q10_max && q10_initial > d.q10_max);
    let res = if suspicious { Err(Failure::Distribution { median, min, q10, q10_initial }) } else { Ok(()) };
    CheckOutcome::of(CheckKind::Distribution, res)
}

/// Termination check (grail §2.2).
pub fn check_termination(
    r: &Rollout,
    ev: &[PositionEvidence],
    eos_tokens: &[u32],
    sampling_seed: &Seed,
    p: &VerifyParams,
) -> CheckOutcome {
    let len = r.completion().len();
    let max = r.sampling.max_new_tokens;
    let res = if let Err(f) = length_and_eos(r, eos_tokens) {
        Err(f)
    } else if len == max as usize {
        Ok(())
    } else {
        match (r.completion().last(), ev.last()) {
            (Some(&last), _) if !eos_tokens.contains(&last) => Err(Failure::NoEos { last }),
            (Some(_), Some(e)) if f64::from(e.prob_t1) < p.min_eos_prob && !eos_draw_proven(r, e, sampling_seed) => {
                Err(Failure::LowEosProb { prob: e.prob_t1, min: p.min_eos_prob })
            }
            (Some(_), Some(_)) => Ok(()),
            (None, _) | (_, None) => Err(Failure::NoEos { last: u32::MAX }),
        }
    };
    CheckOutcome::of(CheckKind::Termination, res)
}

/// Whether the validator's own logits draw the last token at the rollout's
/// last position: the seeded draw lies in its reference interval. Then EOS
/// is what the sampling rule chose, however unlikely; otherwise (EOS only
/// admitted because its interval lies within ε of the draw) the draw does not
/// decide, and the probability floor applies.
fn eos_draw_proven(r: &Rollout, last: &PositionEvidence, sampling_seed: &Seed) -> bool {
    let pos = r.tokens.len() - 1;
    let u = sampling::draw_u(sampling_seed, &r.miner, r.group, r.rollout, pos as u32);
    last.cdf_lo <= u && u < last.cdf_hi
}

/// Runs every check. `recomputed_reward` is the environment's reward of the
/// detokenized completion. If the structure check fails only it is reported.
pub fn verify_rollout(
    r: &Rollout,
    a: &Assignment<'_>,
    recomputed_reward: f32,
    evidence: &Evidence,
    p: &VerifyParams,
) -> Result<Verdict, VerifyError> {
    verify_with(r, a, recomputed_reward, &evidence.positions, Some(&evidence.sketches), p)
}

/// Every check but the sketch, on the per-position evidence alone: what a
/// trainer runs before a rollout may reach a gradient. The sketch check
/// proves the miner ran the model (its hidden states) and needs the
/// window's revealed challenge; the tokens themselves are proven by the
/// exact sampling check at every position, which is what training relies
/// on. If the structure check fails only it is reported.
pub fn verify_tokens(
    r: &Rollout,
    a: &Assignment<'_>,
    recomputed_reward: f32,
    ev: &[PositionEvidence],
    p: &VerifyParams,
) -> Result<Verdict, VerifyError> {
    verify_with(r, a, recomputed_reward, ev, None, p)
}

/// The checks of [`verify_rollout`], with the sketch check only when the
/// reference's sketches are given ([`verify_tokens`] runs without them).
fn verify_with(
    r: &Rollout,
    a: &Assignment<'_>,
    recomputed_reward: f32,
    ev: &[PositionEvidence],
    sketches: Option<&[u32]>,
    p: &VerifyParams,
) -> Result<Verdict, VerifyError> {
    let structure = check_structure(r, a, p);
    if structure.failed() {
        return Ok(Verdict::of_checks(vec![structure]));
    }
    if let Some(s) = sketches
        && s.len() != r.tokens.len()
    {
        return Err(VerifyError::Sketches { expected: r.tokens.len(), got: s.len() });
    }
    if ev.len() != r.completion().len() {
        return Err(VerifyError::Positions { expected: r.completion().len(), got: ev.len() });
    }
    let (sampling, coverage, counts) = check_sampling(r, ev, &a.sampling_seed, p);
    let mut checks = vec![structure, check_prompt(r, a), check_reward(r, recomputed_reward)];
    if let Some(s) = sketches {
        checks.push(check_sketches(r, &challenged(r, &a.challenge_secret, p), s, p));
    }
    checks.extend([
        check_logprobs(r, ev, p),
        sampling,
        coverage,
        check_distribution(ev, p),
        check_termination(r, ev, a.eos_tokens, &a.sampling_seed, p),
    ]);
    Ok(Verdict { checks, sampling_counts: counts })
}

/// Upper bound (95 %, Wilson) of the rate at which an honest rollout fails
/// some soft check: 3 of 128 honest arith rollouts at 64 new tokens
/// (docs/calibration.md §5), all on the distribution check.
pub const HONEST_SOFT_FAILURE_RATE: f64 = 0.067;

/// `P(X ≥ k)` for `X ~ Binomial(n, p)`.
pub fn binomial_tail(n: u32, p: f64, k: u32) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let ln_choose = |i: u32| -> f64 { (1..=i).map(|j| f64::from(n - i + j).ln() - f64::from(j).ln()).sum() };
    (k..=n)
        .map(|i| (ln_choose(i) + f64::from(i) * p.ln() + f64::from(n - i) * (-p).ln_1p()).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The fewest soft failures among `checked` rollouts that an honest miner
/// (soft-failure rate `honest_rate`) reaches with probability at most
/// `p_max`: a soft-failure ban below it would penalise honest miners more
/// often than that. `checked + 1` (never) when no count is unlikely enough.
pub fn soft_ban_threshold(checked: u32, honest_rate: f64, p_max: f64) -> u32 {
    (1..=checked).find(|&k| binomial_tail(checked, honest_rate, k) <= p_max).unwrap_or(checked.saturating_add(1))
}

impl Failure {
    /// The absolute token position the failure points at, when it points at one.
    pub fn position(&self, prompt_len: usize) -> Option<usize> {
        match *self {
            Failure::TokenOutOfVocab { position, .. }
            | Failure::SketchOutOfField { position, .. }
            | Failure::SampleOutside { position, .. }
            | Failure::FarFromDraw { position, .. }
            | Failure::SketchMismatch { position, .. } => Some(position),
            Failure::BadLogprob { index, .. } | Failure::EosBeforeEnd { index, .. } => Some(prompt_len + index),
            Failure::LogprobDeviation { worst_index, .. } => Some(prompt_len + worst_index),
            Failure::PromptMismatch { first_diff, .. } => Some(first_diff),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_numpy() {
        let x = [1.0, 2.0, 3.0, 4.0, 10.0];
        assert_eq!(median_sorted(&x), 3.0);
        assert_eq!(median_sorted(&x[..4]), 2.5);
        assert!((quantile_sorted(&x, 0.1) - 1.4).abs() < 1e-12);
        assert_eq!(quantile_sorted(&x, 0.0), 1.0);
        assert_eq!(quantile_sorted(&x, 1.0), 10.0);
        assert_eq!(quantile_sorted(&[7.0], 0.1), 7.0);
        assert!(quantile_sorted(&[], 0.1).is_nan());
    }

    #[test]
    fn soft_ban_thresholds_bound_the_honest_ban_rate() {
        // Binomial(4, 0.5): P(X ≥ 3) = 5/16.
        assert!((binomial_tail(4, 0.5, 3) - 5.0 / 16.0).abs() < 1e-12);
        assert_eq!(binomial_tail(4, 0.5, 0), 1.0);
        assert_eq!(binomial_tail(4, 0.5, 5), 0.0);
        assert_eq!(binomial_tail(4, 0.0, 1), 0.0);
        // The old gate (3 of 64) bans an honest miner in a large share of its verdicts.
        assert!(binomial_tail(64, HONEST_SOFT_FAILURE_RATE, 3) > 0.5);
        let k = soft_ban_threshold(64, HONEST_SOFT_FAILURE_RATE, 1e-6);
        assert!(binomial_tail(64, HONEST_SOFT_FAILURE_RATE, k) <= 1e-6);
        assert!(binomial_tail(64, HONEST_SOFT_FAILURE_RATE, k - 1) > 1e-6);
        assert_eq!(k, 17);
        assert_eq!(soft_ban_threshold(2, 0.9, 1e-6), 3, "never");
    }

    /// The model-free checks on a toy byte-level tokenizer and an arith task.
    mod model_free {
        use super::super::*;
        use crate::env::{ArithEnv, TaskAnswer};
        use crate::identity::Keypair;
        use crate::tokenizer::tests::{spec, toy};

        const MAX_NEW: u32 = 32;

        struct World {
            tok: Tokenizer,
            eos: Vec<u32>,
            env: Environment,
            key: Keypair,
            params: VerifyParams,
        }

        impl World {
            fn new() -> Self {
                let (t, ty, m) = toy();
                let tok = Tokenizer::from_spec(spec(&t, &ty, &m)).unwrap();
                let eos = tok.eog_ids().collect();
                let env = Environment::Arith(ArithEnv::new(3));
                Self { tok, eos, env, key: Keypair::from_seed([4; 32]), params: VerifyParams::DEFAULT }
            }

            fn contract(&self) -> Contract<'_> {
                let info = WindowInfo {
                    window: 5,
                    opens_at_ms: 0,
                    closes_at_ms: 1,
                    seed: Seed([7; 32]),
                    commitment: [0; 32],
                    checkpoint: ContentId([3; 32]),
                    env: EnvId::Arith,
                    groups_per_miner: 4,
                    group_size: 2,
                    sampling: SamplingParams { temperature: 0.7, max_new_tokens: MAX_NEW },
                    difficulty: 3,
                    dataset: None,
                    reward: self.env.reward_rule(),
                };
                Contract::of_window(&info, &self.env, Seed([8; 32]))
            }

            fn check(&self, context: Option<usize>) -> ModelFreeCheck<'_> {
                ModelFreeCheck {
                    tokenizer: &self.tok,
                    eos_tokens: &self.eos,
                    vocab_size: self.vocab(),
                    context,
                    signatures: true,
                    params: &self.params,
                }
            }

            /// The model's vocabulary: a few ids more than the tokenizer's.
            fn vocab(&self) -> u32 {
                self.tok.vocab_size() as u32 + 8
            }

            /// An honest rollout of group 1: the task's prompt, the right
            /// answer, end-of-generation last, the recomputed reward, signed.
            fn honest(&self, c: &Contract<'_>) -> Rollout {
                let miner = *self.key.public().as_bytes();
                let task = self.env.task(task_seed(&c.seed, &miner, 1));
                let TaskAnswer::Number(n) = &task.answer else { panic!("arith answers are numbers") };
                let mut tokens = self.tok.encode(&self.env.prompt_text(&task)).unwrap();
                let prompt_len = tokens.len();
                tokens.extend(self.tok.encode(&format!("Answer: {n}")).unwrap());
                tokens.push(self.tok.eos_id());
                let reward = completion_reward(&self.tok, &self.env, &task, &tokens[prompt_len..]).unwrap();
                assert_eq!(reward, 1.0);
                let mut r = Rollout {
                    window: c.window,
                    checkpoint: c.checkpoint,
                    env: EnvId::Arith,
                    group: 1,
                    rollout: 0,
                    task_id: task.id,
                    sampling: c.sampling,
                    prompt_len: prompt_len as u32,
                    logprobs: vec![-0.5; tokens.len() - prompt_len],
                    sketches: vec![0; tokens.len()],
                    tokens,
                    reward,
                    miner,
                    signature: [0; 64],
                };
                r.sign(&self.key);
                r
            }

            /// `r` edited by `f`, signed again.
            fn edited(&self, r: &Rollout, f: impl FnOnce(&mut Rollout)) -> Rollout {
                let mut r = r.clone();
                f(&mut r);
                r.sign(&self.key);
                r
            }
        }

        /// The failed checks of a rejection before the reward.
        fn failed(rejection: Result<Prepared, Rejection>) -> Vec<(CheckKind, Failure)> {
            match rejection {
                Err(Rejection::Failed(v)) => v.failures().map(|(k, f)| (k, f.clone())).collect(),
                other => panic!("expected a failed check, got {other:?}"),
            }
        }

        #[test]
        fn an_honest_rollout_passes_with_its_prompt_and_reward() {
            let w = World::new();
            let c = w.contract();
            let r = w.honest(&c);
            let p = w.check(Some(r.tokens.len())).run(&r, &c).unwrap();
            assert_eq!((p.prompt.as_slice(), p.reward), (r.prompt(), 1.0));
            assert!(p.hard_failure().is_none() && p.verdict.accepted(), "{:?}", p.verdict);
            let kinds: Vec<CheckKind> = p.verdict.checks.iter().map(|c| c.kind).collect();
            assert_eq!(kinds, [CheckKind::Structure, CheckKind::Prompt, CheckKind::Reward]);
        }

        #[test]
        fn a_wrong_window_fails_the_contract() {
            let w = World::new();
            let c = w.contract();
            let r = w.edited(&w.honest(&c), |r| r.window = 6);
            assert_eq!(
                failed(w.check(None).run(&r, &c)),
                [(CheckKind::Structure, Failure::AssignmentMismatch { field: "window" })]
            );
            let r = w.edited(&w.honest(&c), |r| r.checkpoint = ContentId([4; 32]));
            assert_eq!(
                failed(w.check(None).run(&r, &c)),
                [(CheckKind::Structure, Failure::AssignmentMismatch { field: "checkpoint" })]
            );
        }

        #[test]
        fn a_wrong_prompt_fails_before_the_context_and_the_reward() {
            let w = World::new();
            let c = w.contract();
            let r = w.edited(&w.honest(&c), |r| {
                r.tokens[5] += 1;
                r.reward = 0.5;
            });
            let f = failed(w.check(Some(3)).run(&r, &c));
            assert_eq!(f.len(), 1);
            assert!(matches!(f[0], (CheckKind::Prompt, Failure::PromptMismatch { first_diff: 5, .. })), "{f:?}");
        }

        #[test]
        fn a_fake_reward_fails_the_reward_check() {
            let w = World::new();
            let c = w.contract();
            let r = w.edited(&w.honest(&c), |r| r.reward = 1e30);
            let p = w.check(None).run(&r, &c).unwrap();
            let failure = p.hard_failure().map(|o| (o.kind, o.status.clone()));
            let want = Failure::RewardMismatch { reported: 1e30, recomputed: 1.0 };
            assert_eq!(failure, Some((CheckKind::Reward, Status::Fail(want))));
            assert!(!p.verdict.accepted());
        }

        /// Review incentives-and-proof-2 finding A: a reward nudged by at
        /// most 1e-6 (one `f32` step, or 1e-6 itself) used to pass; it is a
        /// hard reward failure, and the honest reward passes bit for bit.
        #[test]
        fn a_reward_nudged_by_one_step_fails_the_reward_check() {
            let w = World::new();
            let c = w.contract();
            let honest = w.honest(&c);
            assert!(w.check(None).run(&honest, &c).unwrap().verdict.accepted());
            for nudged in [f32::from_bits(1.0f32.to_bits() + 1), f32::from_bits(1.0f32.to_bits() - 1), 1.0 - 1e-6] {
                let r = w.edited(&honest, |r| r.reward = nudged);
                let p = w.check(None).run(&r, &c).unwrap();
                let failure = p.hard_failure().map(|o| (o.kind, o.status.clone()));
                let want = Failure::RewardMismatch { reported: nudged, recomputed: 1.0 };
                assert_eq!(failure, Some((CheckKind::Reward, Status::Fail(want))), "{nudged}");
            }
        }

        #[test]
        fn a_token_past_end_of_generation_fails_the_structure() {
            let w = World::new();
            let c = w.contract();
            let r = w.edited(&w.honest(&c), |r| {
                let at = r.prompt_len as usize + 1;
                r.tokens[at] = w.tok.eos_id();
            });
            let len = r.completion().len();
            assert_eq!(
                failed(w.check(None).run(&r, &c)),
                [(CheckKind::Structure, Failure::EosBeforeEnd { index: 1, token: w.tok.eos_id(), len })]
            );
        }

        #[test]
        fn an_over_long_sequence_fails_the_limit_or_the_context() {
            let w = World::new();
            let c = w.contract();
            let honest = w.honest(&c);
            // Past max_new_tokens: a structure failure, whatever the context.
            let r = w.edited(&honest, |r| {
                let last = r.tokens.len() - 1;
                let filler = r.tokens[last - 1];
                let extra = MAX_NEW as usize + 1 - r.completion().len();
                r.tokens.splice(last..last, std::iter::repeat_n(filler, extra));
                r.logprobs.extend(std::iter::repeat_n(-0.5, extra));
                r.sketches.extend(std::iter::repeat_n(0, extra));
            });
            assert_eq!(
                failed(w.check(None).run(&r, &c)),
                [(CheckKind::Structure, Failure::TooLong { len: MAX_NEW as usize + 1, max: MAX_NEW })]
            );
            // Within the contract but past the model's context.
            let tokens = honest.tokens.len();
            assert!(w.check(Some(tokens)).run(&honest, &c).is_ok());
            let e = w.check(Some(tokens - 1)).run(&honest, &c);
            assert!(
                matches!(e, Err(Rejection::ExceedsContext { tokens: t, context }) if t == tokens && context == tokens - 1),
                "{e:?}"
            );
        }

        #[test]
        fn a_bad_signature_is_refused_only_when_signatures_are_required() {
            let w = World::new();
            let c = w.contract();
            let mut r = w.honest(&c);
            r.signature[0] ^= 1;
            assert!(matches!(w.check(None).run(&r, &c), Err(Rejection::Signature)));
            let unsigned = ModelFreeCheck { signatures: false, ..w.check(None) };
            assert!(unsigned.run(&r, &c).is_ok());
        }

        #[test]
        fn a_completion_outside_the_tokenizer_is_undecodable() {
            let w = World::new();
            let c = w.contract();
            // Below the model's vocabulary (the structure check passes), above the tokenizer's.
            let id = w.tok.vocab_size() as u32 + 1;
            let r = w.edited(&w.honest(&c), |r| {
                let at = r.prompt_len as usize;
                r.tokens[at] = id;
            });
            assert!(matches!(w.check(None).run(&r, &c), Err(Rejection::Undecodable(_))));
        }

        #[test]
        fn the_contract_of_a_window_is_its_info() {
            let w = World::new();
            let c = w.contract();
            let r = w.honest(&c);
            let a = c.assignment(&r, r.prompt(), w.vocab(), &w.eos);
            assert_eq!((a.window, a.checkpoint, a.env, a.miner), (5, ContentId([3; 32]), EnvId::Arith, r.miner));
            assert_eq!((a.task_id, a.sampling, a.groups_per_miner, a.group_size), (r.task_id, r.sampling, 4, 2));
            assert_eq!((a.sampling_seed, a.challenge_secret), (Seed([7; 32]), Seed([8; 32])));
            // An offline contract for one miner holds every rollout to that miner.
            let one = Contract { miner: Some([9; 32]), ..c };
            assert_eq!(one.assignment(&r, r.prompt(), w.vocab(), &w.eos).miner, [9; 32]);
            assert_eq!(
                failed(ModelFreeCheck { signatures: false, ..w.check(None) }.run(&r, &one)),
                [(CheckKind::Structure, Failure::AssignmentMismatch { field: "miner" })]
            );
        }
    }

    #[test]
    fn severities() {
        assert_eq!(CheckKind::Sampling.severity(), Severity::Hard);
        assert_eq!(CheckKind::Distribution.severity(), Severity::Soft);
        assert_eq!(CheckKind::SamplingCoverage.severity(), Severity::Hard);
    }

    /// The ambiguity cap against simulated honest rollouts: given the
    /// tokens, each position is ambiguous with probability `min(1, 2ε/p)`
    /// independently ([`AmbiguityCap`]). Profiles from a peaked model (p ≈
    /// 0.9), SmolLM2-like mixes, and a flat one where most positions are
    /// ambiguous; none reaches the cap in 20,000 rollouts each, while the
    /// protocol 7 cap (8 + ⌊0.08·n⌋) rejects most flat ones.
    #[test]
    fn the_ambiguity_cap_is_out_of_an_honest_rollouts_reach() {
        use rand::{Rng, SeedableRng};
        let eps = sampling::DEFAULT_SAMPLE_EPS;
        let cap = AmbiguityCap::DEFAULT;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(28);
        let ev = |probs: &[f64]| -> Vec<PositionEvidence> {
            probs
                .iter()
                .map(|&p| PositionEvidence {
                    logprob_t1: 0.0,
                    prob_t1: 0.0,
                    prob_sampling: p as f32,
                    cdf_lo: 0.0,
                    cdf_hi: p,
                    drawn: None,
                })
                .collect()
        };
        let peaked = vec![0.9; 256];
        let mixed: Vec<f64> = (0..256).map(|i| [0.95, 0.6, 0.2, 0.02, 0.003][i % 5]).collect();
        let flat: Vec<f64> = (0..64).map(|i| [1e-3, 4e-4, 2e-3, 0.3][i % 4]).collect();
        let mut old_rejects_flat = 0;
        for (name, probs) in [("peaked", &peaked), ("mixed", &mixed), ("flat", &flat)] {
            let e = AmbiguityCap::expected(&ev(probs), eps);
            let q: Vec<f64> = probs.iter().map(|&p| (2.0 * eps / p).min(1.0)).collect();
            assert!((e - q.iter().sum::<f64>()).abs() < 1e-3, "{name}: {e}");
            let (mut most, mut rejected) = (0, 0);
            for _ in 0..20_000 {
                let a = q.iter().filter(|&&q| rng.r#gen::<f64>() < q).count();
                most = most.max(a);
                rejected += usize::from(!cap.allows(a, e));
                if name == "flat" {
                    old_rejects_flat += usize::from(a > 8 + (0.08 * probs.len() as f64) as usize);
                }
            }
            assert_eq!(rejected, 0, "{name}: E = {e}, most {most}, cap {}", cap.max(e));
        }
        assert!(old_rejects_flat > 10_000, "the fixed share rejects honest flat rollouts: {old_rejects_flat}");
        // What the cap allows: base at E = 0, and it grows like E + 6√E.
        assert_eq!(cap.max(0.0), 8);
        assert_eq!(cap.max(f64::NAN), 8);
        assert_eq!(cap.max(4.0), 8 + 16);
        assert_eq!(cap.max(100.0), 8 + 160);
    }
}
