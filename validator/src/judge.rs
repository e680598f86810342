//! The validator's judgement: pure but for the reference model it asks for
//! evidence, and the one pipeline behind both `validator check` (offline
//! records) and `validator run` (a coordinator's windows).
//!
//! A rollout goes through three stages:
//! 1. [`Judge::prepare`]: everything that needs no model, cheapest first,
//!    as every role runs it ([`verify::ModelFreeCheck`]) — the signature,
//!    the task and prompt re-derived from the window's seed, the structure
//!    and generation contract, the prompt, the completion length against
//!    `max_new_tokens`, the model's context, and the reward recomputed from
//!    the completion. A rollout failing any of these but the reward never
//!    reaches the model (the reward's outcome joins the model's checks).
//! 2. [`Judge::prove`]: the rest in length-sorted batches: the reference
//!    model's [`Evidence`] and [`verify::verify_rollout`].
//! 3. [`Judge::window`] (the service only): decode, sample miners and whole
//!    groups by the challenge secret, the two stages above, copies across
//!    miners, and one [`VerdictBody`] per miner.
//!
//! A rejected rollout is data ([`RolloutFailure`]); only the model and the
//! evidence's shape are errors ([`JudgeError`]). Every failure and every
//! penalising verdict is logged at `warn` with the rollout's digest, the
//! check, the position and the figures.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use tributary_policy::{EvidenceRequest, ModelConfig, PolicyError, PrefixCache, ReferenceModel, SequenceEvidence};
use tributary_protocol::assign;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::sketch::{self, SketchError, SketchKey};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::{
    self, Assignment, CheckKind, Evidence, Failure, ModelFreeCheck, Rejection, Severity, Status, Verdict, VerifyError,
    VerifyParams,
};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{FailedCheck, FailureEvidence, Figures, VerdictBody};

/// What a window fixed for the rollouts in it (the protocol's, shared with
/// the trainer and the coordinator).
pub use tributary_protocol::verify::Contract;

/// The reference model as the judge sees it: its shape and one batched
/// evidence pass. [`ReferenceModel`] is the real one; tests wrap it (to count
/// what reaches the model).
pub trait Reference {
    /// The model's hyperparameters (vocabulary, width, context).
    fn dims(&self) -> &ModelConfig;
    /// Evidence for a batch of rollouts ([`ReferenceModel::evidence`]).
    fn evidence(&self, reqs: &[EvidenceRequest<'_>]) -> Result<Vec<SequenceEvidence>, PolicyError>;
    /// Evidence with the token the model draws at each seeded `u`
    /// ([`ReferenceModel::evidence_drawn`]), which bounds the tokens an
    /// ambiguous position admits. A wrapper that does not forward it gives
    /// plain evidence (the bound then does not apply).
    fn evidence_drawn(
        &self,
        reqs: &[EvidenceRequest<'_>],
        _draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        self.evidence(reqs)
    }
    /// [`Reference::evidence_drawn`] after the prompt prefix kept in
    /// `cache` ([`ReferenceModel::prefix_for`]: the batches of a window
    /// share their system prompt, which then runs once). A wrapper that
    /// does not forward it gives [`Reference::evidence_drawn`]'s evidence.
    fn evidence_after_kept_prefix(
        &self,
        _cache: &mut Option<PrefixCache>,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        self.evidence_drawn(reqs, draws)
    }
}

impl Reference for ReferenceModel {
    fn dims(&self) -> &ModelConfig {
        ReferenceModel::dims(self)
    }

    fn evidence(&self, reqs: &[EvidenceRequest<'_>]) -> Result<Vec<SequenceEvidence>, PolicyError> {
        ReferenceModel::evidence(self, reqs)
    }

    fn evidence_drawn(
        &self,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        ReferenceModel::evidence_drawn(self, reqs, draws)
    }

    fn evidence_after_kept_prefix(
        &self,
        cache: &mut Option<PrefixCache>,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        ReferenceModel::evidence_after_kept_prefix(self, cache, reqs, draws)
    }
}

/// What a validator proves *beyond* its assignment
/// ([`tributary_protocol::assign`]: the miners it is the prover of, and
/// their assigned groups, which it always proves; the failures it confirms
/// as another member of a miner's committee are [`Judge::confirm`]'s).
/// Extra miners are picked in an order drawn from the challenge secret and
/// this validator's key ([`assign::rank_for_validator`]), so two
/// validators' extras differ; their groups in the miner's assigned order
/// ([`assign::group_order`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleConfig {
    /// Fraction of the window's miners checked besides the assigned ones.
    pub miner_fraction: f64,
    /// At least this many extra miners (when there are that many).
    pub min_miners: usize,
    /// At most this many extra miners.
    pub max_miners: usize,
    /// Rollouts checked per extra miner, and at least per assigned miner
    /// (whole groups); 0: all of an extra miner's, only the assigned groups of
    /// an assigned one.
    pub rollouts_per_miner: usize,
}

impl SampleConfig {
    /// Every rollout of every miner (tests, small networks).
    pub const ALL: SampleConfig =
        SampleConfig { miner_fraction: 1.0, min_miners: usize::MAX, max_miners: usize::MAX, rollouts_per_miner: 0 };

    /// The assignment and nothing more (the default).
    pub const ASSIGNED: SampleConfig =
        SampleConfig { miner_fraction: 0.0, min_miners: 0, max_miners: 0, rollouts_per_miner: 0 };

    /// grail's shape as extras: a quarter of the miners, at least 2, at most 35; 64 rollouts each.
    pub const GRAIL: SampleConfig =
        SampleConfig { miner_fraction: 0.25, min_miners: 2, max_miners: 35, rollouts_per_miner: 64 };

    /// How many of `n` miners are checked.
    pub fn miners_checked(&self, n: usize) -> usize {
        let by_fraction = (self.miner_fraction.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        by_fraction.max(self.min_miners).min(self.max_miners).min(n)
    }
}

/// How the judge works: constants, sampling, batching.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JudgeConfig {
    /// Verification constants.
    pub params: VerifyParams,
    /// Which rollouts of a window are checked ([`Judge::window`] only).
    pub sample: SampleConfig,
    /// Most rollouts per forward pass.
    pub batch: usize,
    /// Most padded tokens per forward pass.
    pub batch_tokens: usize,
    /// Whether rollouts must carry a valid signature (offline records are unsigned).
    pub check_signatures: bool,
}

impl Default for JudgeConfig {
    /// grail sampling, batches of 8 rollouts / 8192 tokens, signatures checked.
    fn default() -> Self {
        Self {
            params: VerifyParams::DEFAULT,
            sample: SampleConfig::GRAIL,
            batch: 8,
            batch_tokens: 8192,
            check_signatures: true,
        }
    }
}

/// Why a rollout is rejected.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutFailure {
    /// The rollout's signature does not verify.
    Signature,
    /// The task's prompt does not tokenize here (the reason).
    Environment(String),
    /// Not a rollout the model can judge.
    Structure(StructureFailure),
    /// The same prompt and completion as another miner's rollout that passes,
    /// while this one fails its own checks.
    CopiedFrom {
        /// The miner whose copy passes.
        owner: PublicKey,
        /// The checks this copy failed itself.
        own: Vec<CheckKind>,
    },
    /// The checks ran and a hard one failed.
    Checked(Verdict),
}

/// A rollout the model cannot judge.
#[derive(Debug, Clone, PartialEq)]
pub enum StructureFailure {
    /// The completion does not decode (the reason).
    Undecodable(String),
    /// More tokens than the model's context.
    ExceedsContext {
        /// Tokens in the rollout.
        tokens: usize,
        /// The model's context length.
        context: usize,
    },
}

impl fmt::Display for StructureFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StructureFailure::Undecodable(e) => write!(f, "completion does not decode: {e}"),
            StructureFailure::ExceedsContext { tokens, context } => {
                write!(f, "{tokens} tokens exceed the context of {context}")
            }
        }
    }
}

impl RolloutFailure {
    /// The name of the failure in reports and metrics: `signature`,
    /// `environment`, `structure`, `copy`, or the first failed check's name.
    pub fn name(&self) -> &'static str {
        match self {
            RolloutFailure::Signature => "signature",
            RolloutFailure::Environment(_) => "environment",
            RolloutFailure::Structure(_) => "structure",
            RolloutFailure::CopiedFrom { .. } => "copy",
            RolloutFailure::Checked(v) => v.failures().next().map_or("checked", |(k, _)| k.as_str()),
        }
    }
}

impl fmt::Display for RolloutFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RolloutFailure::Signature => f.write_str("signature: the rollout's signature does not verify"),
            RolloutFailure::Environment(e) => write!(f, "environment: prompt does not tokenize: {e}"),
            RolloutFailure::Structure(s) => write!(f, "structure: {s}"),
            RolloutFailure::CopiedFrom { owner, own } => {
                write!(f, "copy: same prompt and completion as miner {} (whose rollout passes)", owner.short())?;
                if !own.is_empty() {
                    let names: Vec<&str> = own.iter().map(|k| k.as_str()).collect();
                    write!(f, "; own checks failed: {}", names.join(", "))?;
                }
                Ok(())
            }
            RolloutFailure::Checked(v) => {
                let failed: Vec<String> = v
                    .checks
                    .iter()
                    .filter_map(|c| match &c.status {
                        Status::Fail(x) => Some(format!("{} ({}): {x:?}", c.kind.as_str(), severity_name(c.severity))),
                        _ => None,
                    })
                    .collect();
                f.write_str(&failed.join("; "))
            }
        }
    }
}

/// A rollout's judgement: a verdict with no hard failure (soft failures
/// possible), or why it is rejected.
pub type Outcome = Result<Verdict, RolloutFailure>;

/// The judge could not work (never a miner's fault).
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// The reference model failed (shapes, out of memory).
    #[error("reference model: {0}")]
    Policy(#[from] PolicyError),
    /// The evidence did not fit a rollout (a validator bug).
    #[error("evidence: {0}")]
    Verify(#[from] VerifyError),
    /// Sketching the reference hidden state failed.
    #[error("sketch: {0}")]
    Sketch(#[from] SketchError),
    /// The model returned fewer hidden rows than asked for.
    #[error("the reference model returned no hidden row {0}")]
    MissingHidden(usize),
}

/// One rollout under judgement.
#[derive(Debug, Clone)]
pub struct Case<'e> {
    /// The rollout.
    pub rollout: Rollout,
    /// What its window fixed.
    pub contract: Contract<'e>,
    /// The assigned task's prompt tokens (empty if they could not be derived).
    prompt: Vec<u32>,
    /// The reward recomputed from the completion.
    reward: f32,
    /// The reference model's log-prob at the token a log-prob failure names
    /// (the figure a second party compares).
    reference_logprob: Option<f32>,
    /// `None` until judged.
    pub outcome: Option<Outcome>,
}

impl Case<'_> {
    /// Whether the rollout is judged and passes every hard check.
    pub fn passed(&self) -> bool {
        matches!(self.outcome, Some(Ok(_)))
    }
}

/// What [`Judge::prove`] ran through the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProveStats {
    /// Rollouts proved.
    pub proved: usize,
    /// Their tokens.
    pub tokens: usize,
    /// Forward passes (batches).
    pub batches: usize,
}

/// The judge: a tokenizer and a reference model, both of the window's checkpoint.
pub struct Judge<'a, R: Reference + ?Sized = ReferenceModel> {
    /// How to judge.
    pub cfg: &'a JudgeConfig,
    /// The checkpoint's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The checkpoint's reference model.
    pub model: &'a R,
}

impl<R: Reference + ?Sized> fmt::Debug for Judge<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Judge").field("cfg", self.cfg).finish_non_exhaustive()
    }
}

fn severity_name(s: Severity) -> &'static str {
    if s == Severity::Hard { "hard" } else { "soft" }
}

impl<'a, R: Reference + ?Sized> Judge<'a, R> {
    /// A judge over `model` with its `tokenizer`.
    pub fn new(cfg: &'a JudgeConfig, tokenizer: &'a Tokenizer, model: &'a R) -> Self {
        Self { cfg, tokenizer, model }
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.tokenizer.eog_ids().collect()
    }

    fn vocab_size(&self) -> u32 {
        u32::try_from(self.model.dims().vocab_size).unwrap_or(u32::MAX)
    }

    fn assignment<'b>(&self, case: &'b Case<'_>, eos: &'b [u32]) -> Assignment<'b> {
        case.contract.assignment(&case.rollout, &case.prompt, self.vocab_size(), eos)
    }

    /// Every check that needs no model (module docs): the returned case is
    /// either judged (rejected) or waits for [`Judge::prove`].
    pub fn prepare<'e>(&self, rollout: Rollout, contract: Contract<'e>) -> Case<'e> {
        let mut case =
            Case { rollout, contract, prompt: Vec::new(), reward: f32::NAN, reference_logprob: None, outcome: None };
        case.outcome = self.cheap(&mut case).err().map(Err);
        case
    }

    /// The model-free checks; a failed reward is left to [`Judge::prove`]'s
    /// verdict, with the model's checks.
    fn cheap(&self, case: &mut Case<'_>) -> Result<(), RolloutFailure> {
        let eos = self.eos_tokens();
        let check = ModelFreeCheck {
            tokenizer: self.tokenizer,
            eos_tokens: &eos,
            vocab_size: self.vocab_size(),
            context: Some(self.model.dims().context_length),
            signatures: self.cfg.check_signatures,
            params: &self.cfg.params,
        };
        let prepared = check.run(&case.rollout, &case.contract).map_err(|e| match e {
            Rejection::Signature => RolloutFailure::Signature,
            Rejection::Environment(e) => RolloutFailure::Environment(e.to_string()),
            Rejection::Failed(v) => RolloutFailure::Checked(v),
            Rejection::ExceedsContext { tokens, context } => {
                RolloutFailure::Structure(StructureFailure::ExceedsContext { tokens, context })
            }
            Rejection::Undecodable(e) => RolloutFailure::Structure(StructureFailure::Undecodable(e.to_string())),
        })?;
        case.prompt = prepared.prompt;
        case.reward = prepared.reward;
        Ok(())
    }

    /// Runs the model checks on every case [`Judge::prepare`] left unjudged,
    /// in batches of one prompt ([`plan_batches`]).
    pub fn prove(&self, cases: &mut [Case<'_>]) -> Result<ProveStats, JudgeError> {
        let params = &self.cfg.params;
        let eos = self.eos_tokens();
        let d_model = self.model.dims().d_model;
        let pending: Vec<usize> = (0..cases.len()).filter(|&k| cases[k].outcome.is_none()).collect();
        let refs: Vec<&Rollout> = pending.iter().map(|&k| &cases[k].rollout).collect();
        let plan = plan_batches(&refs, self.cfg.batch.max(1), self.cfg.batch_tokens.max(1));
        let mut keys: Vec<(Seed, SketchKey)> = Vec::new();
        let mut stats = ProveStats::default();
        let mut results: Vec<(usize, Outcome, Option<f32>)> = Vec::with_capacity(pending.len());
        let mut prefix = None;
        for batch in plan {
            let items: Vec<Item<'_>> = batch
                .iter()
                .map(|&j| {
                    let c = &cases[pending[j]];
                    let seed = c.contract.seed;
                    let key = match keys.iter().position(|(s, _)| *s == seed) {
                        Some(i) => i,
                        None => {
                            keys.push((seed, SketchKey::derive(&seed, d_model)));
                            keys.len() - 1
                        }
                    };
                    (refs[j], verify::challenged(refs[j], &c.contract.challenge, params), key)
                })
                .collect();
            let evidence = rollout_evidence(self.model, &mut prefix, &keys, self.tokenizer.eos_id(), &items, params)?;
            stats.batches += 1;
            for (&j, ev) in batch.iter().zip(evidence) {
                let case = &cases[pending[j]];
                let a = self.assignment(case, &eos);
                let v = verify::verify_rollout(&case.rollout, &a, case.reward, &ev, params)?;
                stats.proved += 1;
                stats.tokens += case.rollout.tokens.len();
                let reference = v.failures().find_map(|(_, f)| match *f {
                    Failure::LogprobDeviation { worst_index: i, .. } | Failure::BadLogprob { index: i, .. } => {
                        ev.positions.get(i).map(|p| p.logprob_t1)
                    }
                    _ => None,
                });
                let outcome = if v.accepted() { Ok(v) } else { Err(RolloutFailure::Checked(v)) };
                results.push((pending[j], outcome, reference));
            }
        }
        for (k, outcome, reference) in results {
            cases[k].outcome = Some(outcome);
            cases[k].reference_logprob = reference;
        }
        Ok(stats)
    }

    /// The groups to prove per miner (and whether the miner is assigned):
    /// `spec`'s assignment for `validator` over the window's `work` (each
    /// miner's stored groups), its assigned groups topped up to
    /// `rollouts_per_miner`; then the extra miners of [`JudgeConfig::sample`].
    fn choose(
        &self,
        contract: &Contract<'_>,
        validator: PublicKey,
        spec: &assign::Spec,
        work: &BTreeMap<PublicKey, BTreeSet<u32>>,
        by_miner: &BTreeMap<PublicKey, Vec<Rollout>>,
    ) -> BTreeMap<PublicKey, (bool, BTreeSet<u32>)> {
        let (w, challenge) = (contract.window, &contract.challenge);
        let a = assign::Assignment::compute(spec, w, challenge, contract.group_size, work);
        let sample = &self.cfg.sample;
        // Whole groups in the miner's order until `want` rollouts (0: all).
        let top_up = |m: &PublicKey, groups: &mut BTreeSet<u32>, want: usize| {
            let sizes = |g: u32| by_miner.get(m).map_or(0, |rs| rs.iter().filter(|r| r.group == g).count());
            let mut have: usize = groups.iter().map(|&g| sizes(g)).sum();
            let stored = work.get(m).cloned().unwrap_or_default();
            for g in assign::group_order(challenge, w, m, &stored) {
                if want != 0 && have >= want {
                    break;
                }
                if groups.insert(g) {
                    have += sizes(g);
                }
            }
        };
        let mut chosen: BTreeMap<PublicKey, (bool, BTreeSet<u32>)> = BTreeMap::new();
        for (m, assigned) in judged_miners(sample, contract, &validator, &a, work) {
            let mut groups: BTreeSet<u32> = BTreeSet::new();
            if assigned {
                groups.extend(a.miners.get(&m).into_iter().flat_map(|d| d.groups.iter().copied()));
            }
            if !assigned || sample.rollouts_per_miner > 0 {
                top_up(&m, &mut groups, sample.rollouts_per_miner);
            }
            chosen.insert(m, (assigned, groups));
        }
        chosen
    }

    /// One window's judgement over its fetched bytes with no assignment (no
    /// validator set): only what [`JudgeConfig::sample`] picks.
    pub fn window(
        &self,
        contract: &Contract<'_>,
        validator: PublicKey,
        blobs: Vec<Vec<u8>>,
    ) -> Result<WindowReport, JudgeError> {
        let none = assign::Spec { validators: vec![], committee: 0, budget: 0 };
        self.window_assigned(contract, validator, &none, blobs)
    }

    /// One window's judgement over its fetched bytes, signed by nobody yet:
    /// one [`MinerReport`] per miner judged — those `spec`'s assignment gives
    /// `validator` (their assigned groups), and the extras of
    /// [`JudgeConfig::sample`].
    pub fn window_assigned(
        &self,
        contract: &Contract<'_>,
        validator: PublicKey,
        spec: &assign::Spec,
        blobs: Vec<Vec<u8>>,
    ) -> Result<WindowReport, JudgeError> {
        self.window_indexed(contract, validator, spec, None, blobs)
    }

    /// [`Judge::window_assigned`] over the rollouts of only some miners:
    /// the assignment is computed from `work`, the window's index (every
    /// miner's stored groups), when given, not from `blobs`; `blobs` must
    /// hold every rollout of each miner [`judged_miners`] names.
    pub fn window_indexed(
        &self,
        contract: &Contract<'_>,
        validator: PublicKey,
        spec: &assign::Spec,
        work: Option<&BTreeMap<PublicKey, BTreeSet<u32>>>,
        blobs: Vec<Vec<u8>>,
    ) -> Result<WindowReport, JudgeError> {
        let window = contract.window;
        let mut report = WindowReport { window, fetched: blobs.len(), ..Default::default() };
        let limits = RolloutLimits::DEFAULT;
        let mut by_miner: BTreeMap<PublicKey, Vec<Rollout>> = BTreeMap::new();
        for b in &blobs {
            match Rollout::decode(b, &limits) {
                Ok(r) => by_miner.entry(PublicKey(r.miner)).or_default().push(r),
                Err(e) => {
                    report.undecodable += 1;
                    tracing::warn!(window, error = %e, "fetched bytes are not a rollout");
                }
            }
        }
        drop(blobs);
        // The groups to prove, per miner: the assignment's, then the extras;
        // all drawn from the challenge secret, unknown to miners at submission.
        let fetched: BTreeMap<PublicKey, BTreeSet<u32>>;
        let work = match work {
            Some(w) => w,
            None => {
                fetched = by_miner.iter().map(|(m, rs)| (*m, rs.iter().map(|r| r.group).collect())).collect();
                &fetched
            }
        };
        let chosen = self.choose(contract, validator, spec, work, &by_miner);
        report.assigned = chosen.values().filter(|(assigned, _)| *assigned).count();
        // Each case with its miner and that miner's rollout count in the window.
        let mut cases: Vec<Case<'_>> = Vec::new();
        let mut owners: Vec<(PublicKey, usize)> = Vec::new();
        for (m, (_, groups)) in &chosen {
            let all = by_miner.remove(m).unwrap_or_default();
            let total = all.len();
            let mut sampled: Vec<Rollout> = all.into_iter().filter(|r| groups.contains(&r.group)).collect();
            sampled.sort_by_key(|r| (r.group, r.rollout));
            let body = VerdictBody {
                checked: u32::try_from(sampled.len()).unwrap_or(u32::MAX),
                ..VerdictBody::empty(window, *m, validator)
            };
            report.miners.insert(*m, MinerReport { body, failed: BTreeMap::new() });
            for r in sampled {
                cases.push(self.prepare(r, *contract));
                owners.push((*m, total));
            }
        }
        report.proved = self.prove(&mut cases)?.proved;
        copies(&owners, &mut cases);
        for ((m, total), case) in owners.iter().zip(&cases) {
            let Some(mr) = report.miners.get_mut(m) else { continue };
            log_outcome(case);
            mr.record(case, *total);
        }
        for mr in report.miners.values_mut() {
            if mr.body.hard_failure {
                mr.body.estimated_valid = 0;
            }
            if mr.body.hard_failure {
                tracing::warn!(
                    window,
                    miner = %mr.body.miner,
                    checked = mr.body.checked,
                    valid = mr.body.valid,
                    hard_failure = mr.body.hard_failure,
                    soft_failures = mr.body.soft_failures,
                    failed = ?mr.failed,
                    reasons = ?mr.body.reasons,
                    "verdict fails the miner (a hard failure)"
                );
            } else if mr.body.soft_failures > 0 {
                // What the coordinator does with soft failures is its setting
                // (`soft_failure_threshold`; by default nothing).
                tracing::info!(
                    window,
                    miner = %mr.body.miner,
                    checked = mr.body.checked,
                    soft_failures = mr.body.soft_failures,
                    reasons = ?mr.body.reasons,
                    "verdict with soft failures only"
                );
            }
        }
        Ok(report)
    }
}

/// The miners `validator` judges in a window whose miners stored `work`
/// (their groups): those assignment `a` gives it (`true`), then the extra
/// miners of `sample` in its own drawn order (`false`).
pub fn judged_miners(
    sample: &SampleConfig,
    contract: &Contract<'_>,
    validator: &PublicKey,
    a: &assign::Assignment,
    work: &BTreeMap<PublicKey, BTreeSet<u32>>,
) -> BTreeMap<PublicKey, bool> {
    let (w, challenge) = (contract.window, &contract.challenge);
    let mut out: BTreeMap<PublicKey, bool> = a.of_validator(validator).map(|(m, _)| (*m, true)).collect();
    let mut others: Vec<PublicKey> = work.keys().filter(|m| !out.contains_key(m)).copied().collect();
    others.sort_by_cached_key(|m| assign::rank_for_validator(challenge, w, validator, m));
    others.truncate(sample.miners_checked(work.len()));
    out.extend(others.into_iter().map(|m| (m, false)));
    out
}

impl<'a, R: Reference + ?Sized> Judge<'a, R> {
    /// A confirmation (issue 16): proves only the rollouts of `miner` that a
    /// committee member's failing verdict cites (`digests`), or whole
    /// `groups` when the claim rests on a count of soft failures, out of the
    /// miner's fetched bytes of the window; one [`MinerReport`] (unsigned).
    /// A failure found confirms the claim; a pass refutes it. Cited digests
    /// absent from `blobs` are logged and left out of the count.
    pub fn confirm(
        &self,
        contract: &Contract<'_>,
        validator: PublicKey,
        miner: PublicKey,
        digests: &[[u8; 32]],
        groups: &[u32],
        blobs: Vec<Vec<u8>>,
    ) -> Result<WindowReport, JudgeError> {
        let window = contract.window;
        let mut report = WindowReport { window, fetched: blobs.len(), ..Default::default() };
        let limits = RolloutLimits::DEFAULT;
        let mut total = 0usize;
        let mut cited: Vec<Rollout> = Vec::new();
        for b in &blobs {
            match Rollout::decode(b, &limits) {
                Ok(r) if PublicKey(r.miner) == miner => {
                    total += 1;
                    if digests.contains(&r.digest()) || groups.contains(&r.group) {
                        cited.push(r);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    report.undecodable += 1;
                    tracing::warn!(window, error = %e, "fetched bytes are not a rollout");
                }
            }
        }
        drop(blobs);
        for d in digests {
            if !cited.iter().any(|r| r.digest() == *d) {
                tracing::warn!(window, miner = %miner, digest = %hex::encode(d), "a confirmation cites a rollout the coordinator does not hold for this miner");
            }
        }
        cited.sort_by_key(|r| (r.group, r.rollout));
        let body = VerdictBody {
            checked: u32::try_from(cited.len()).unwrap_or(u32::MAX),
            ..VerdictBody::empty(window, miner, validator)
        };
        let mut mr = MinerReport { body, failed: BTreeMap::new() };
        let mut cases: Vec<Case<'_>> = cited.into_iter().map(|r| self.prepare(r, *contract)).collect();
        report.proved = self.prove(&mut cases)?.proved;
        for case in &cases {
            log_outcome(case);
            mr.record(case, total);
        }
        if mr.body.hard_failure {
            mr.body.estimated_valid = 0;
            tracing::warn!(
                window,
                miner = %miner,
                checked = mr.body.checked,
                failed = ?mr.failed,
                reasons = ?mr.body.reasons,
                "confirmation: the cited rollouts fail (the claim is confirmed)"
            );
        } else {
            tracing::info!(window, miner = %miner, checked = mr.body.checked, "confirmation: the cited rollouts pass (the claim is refuted)");
        }
        report.miners.insert(miner, mr);
        Ok(report)
    }
}

/// One miner's findings in one window (what is signed, plus details).
#[derive(Debug, Clone, PartialEq)]
pub struct MinerReport {
    /// The verdict body that is signed and posted.
    pub body: VerdictBody,
    /// Failed checks seen, by name ([`CheckKind::as_str`], or a
    /// [`RolloutFailure::name`]: `copy`, `signature`, `structure`, `environment`).
    pub failed: BTreeMap<String, u32>,
}

impl MinerReport {
    /// Whether the check named `name` failed at least once.
    pub fn failed(&self, name: &str) -> bool {
        self.failed.contains_key(name)
    }

    /// Counts one judged rollout of a miner with `total` rollouts in the
    /// window: its reasons, its evidence (digest, check, position, figures)
    /// for each failed check, or its digest among those proved passing.
    fn record(&mut self, case: &Case<'_>, total: usize) {
        let r = &case.rollout;
        let checks = |v: &Verdict, body: &mut VerdictBody, failed: &mut BTreeMap<String, u32>| {
            for c in &v.checks {
                if let Status::Fail(f) = &c.status {
                    let name = c.kind.as_str();
                    *failed.entry(name.to_owned()).or_default() += 1;
                    let sev = severity_name(c.severity);
                    body.add_reason(&format!("{name} ({sev}) group {} rollout {}: {f:?}", r.group, r.rollout));
                    let mut e = FailureEvidence::of_check(r, c.kind, c.severity, f);
                    if let Figures::Logprob { reference, .. } = &mut e.figures {
                        *reference = case.reference_logprob;
                    }
                    body.add_evidence(e);
                }
            }
        };
        match &case.outcome {
            Some(Ok(v)) => {
                self.body.add_passed(r.digest());
                if v.soft_failed() {
                    self.body.soft_failures += 1;
                } else {
                    self.body.valid += 1;
                }
                checks(v, &mut self.body, &mut self.failed);
            }
            Some(Err(RolloutFailure::Checked(v))) => {
                self.body.hard_failure = true;
                if v.soft_failed() {
                    self.body.soft_failures += 1;
                }
                checks(v, &mut self.body, &mut self.failed);
            }
            Some(Err(f)) => {
                self.body.hard_failure = true;
                *self.failed.entry(f.name().to_owned()).or_default() += 1;
                self.body.add_reason(&format!("group {} rollout {}: {f}", r.group, r.rollout));
                for e in failure_evidence(r, f) {
                    self.body.add_evidence(e);
                }
            }
            None => {}
        }
        let checked = f64::from(self.body.checked.max(1));
        self.body.estimated_valid =
            ((f64::from(self.body.valid) * total as f64 / checked).round() as u64).min(u64::from(u32::MAX)) as u32;
    }
}

/// The evidence of a rejection that is not a failed check's: the
/// signature, the environment, the context, a copy (with the copy's own
/// failed checks, whose figures the copy's judgement did not keep).
fn failure_evidence(r: &Rollout, f: &RolloutFailure) -> Vec<FailureEvidence> {
    let one = |check, position, figures| vec![FailureEvidence::of_rollout(r, check, position, figures)];
    match f {
        RolloutFailure::Signature => one(FailedCheck::Signature, None, Figures::None),
        RolloutFailure::Environment(_) => one(FailedCheck::Environment, None, Figures::None),
        RolloutFailure::Structure(StructureFailure::ExceedsContext { context, .. }) => {
            one(FailedCheck::Context, Some(*context), Figures::None)
        }
        RolloutFailure::Structure(StructureFailure::Undecodable(_)) => one(FailedCheck::Structure, None, Figures::None),
        RolloutFailure::CopiedFrom { owner, own } => {
            let mut out = one(FailedCheck::Copy, None, Figures::Copy { owner: *owner });
            for k in own {
                let mut e = FailureEvidence::of_rollout(r, FailedCheck::of(*k), None, Figures::None);
                e.hard = k.severity() == Severity::Hard;
                out.push(e);
            }
            out
        }
        RolloutFailure::Checked(v) => v
            .checks
            .iter()
            .filter_map(|c| match &c.status {
                Status::Fail(x) => Some(FailureEvidence::of_check(r, c.kind, c.severity, x)),
                _ => None,
            })
            .collect(),
    }
}

/// What one window's verification found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowReport {
    /// The window.
    pub window: WindowId,
    /// Rollouts fetched.
    pub fetched: usize,
    /// Bytes that did not decode as a rollout (not attributable to a miner).
    pub undecodable: usize,
    /// Rollouts run through the reference model.
    pub proved: usize,
    /// Per miner.
    pub miners: BTreeMap<PublicKey, MinerReport>,
    /// Seconds spent verifying.
    pub seconds: f64,
    /// Miners judged because the assignment names this validator.
    pub assigned: usize,
}

/// The absolute position a failure points at ([`Failure::position`]); a
/// length or ending failure points at the last token.
pub fn failure_position(r: &Rollout, f: &Failure) -> Option<usize> {
    f.position(r.prompt_len as usize).or_else(|| {
        matches!(f, Failure::TooLong { .. } | Failure::NoEos { .. } | Failure::LowEosProb { .. })
            .then(|| r.tokens.len().saturating_sub(1))
    })
}

/// Logs a judged case's failures at `warn`: window, miner, rollout digest,
/// group and rollout, check, severity, position and figures.
pub fn log_outcome(case: &Case<'_>) {
    let r = &case.rollout;
    let window = case.contract.window;
    let miner = PublicKey(r.miner);
    match &case.outcome {
        Some(Ok(v)) | Some(Err(RolloutFailure::Checked(v))) => {
            for c in &v.checks {
                if let Status::Fail(f) = &c.status {
                    tracing::warn!(
                        window,
                        miner = %miner,
                        digest = %hex::encode(r.digest()),
                        group = r.group,
                        rollout = r.rollout,
                        check = c.kind.as_str(),
                        severity = severity_name(c.severity),
                        position = ?failure_position(r, f),
                        figures = ?f,
                        "rollout failed a check"
                    );
                }
            }
        }
        Some(Err(f)) => {
            tracing::warn!(
                window,
                miner = %miner,
                digest = %hex::encode(r.digest()),
                group = r.group,
                rollout = r.rollout,
                check = f.name(),
                severity = "hard",
                reason = %f,
                "rollout rejected"
            );
        }
        None => {}
    }
}

/// Copies across miners: the same prompt and completion under two keys. A
/// copy that fails its checks is flagged as copied from a miner whose copy
/// passes (the task and the seeded draws are bound to the miner's key, so the
/// owner's passes and the copier's cannot); when every copy passes (an honest
/// coincidence) nobody is flagged.
fn copies(owners: &[(PublicKey, usize)], cases: &mut [Case<'_>]) {
    let mut by_content: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
    for (k, c) in cases.iter().enumerate() {
        by_content.entry(c.rollout.content_hash()).or_default().push(k);
    }
    for ks in by_content.values() {
        let Some(owner) = ks.iter().find(|&&k| cases[k].passed()).map(|&k| owners[k].0) else { continue };
        for &k in ks {
            let c = &mut cases[k];
            if owners[k].0 != owner && !c.passed() {
                let own = match &c.outcome {
                    Some(Ok(v)) | Some(Err(RolloutFailure::Checked(v))) => v.failures().map(|(k, _)| k).collect(),
                    _ => Vec::new(),
                };
                c.outcome = Some(Err(RolloutFailure::CopiedFrom { owner, own }));
            }
        }
    }
}

/// Groups rollouts into forward passes: one prompt per batch (the reference
/// runs a group's prompt once), length-sorted, at most `max_rows` rollouts and
/// `max_tokens` padded tokens each (a longer rollout runs alone). Returns
/// indices into `rollouts`; every index appears exactly once.
pub fn plan_batches(rollouts: &[&Rollout], max_rows: usize, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rollouts.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (rollouts[a], rollouts[b]);
        ra.prompt().cmp(rb.prompt()).then(ra.tokens.len().cmp(&rb.tokens.len()))
    });
    let mut out = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let mut end = at + 1;
        while end < order.len()
            && end - at < max_rows
            && (end - at + 1) * rollouts[order[end]].tokens.len() <= max_tokens
            && rollouts[order[end]].prompt() == rollouts[order[at]].prompt()
        {
            end += 1;
        }
        out.push(order[at..end].to_vec());
        at = end;
    }
    out
}

/// A rollout in a batch: its challenged positions and the index of its sketch key.
type Item<'r> = (&'r Rollout, Vec<usize>, usize);

/// The reference model's [`Evidence`] for a batch of structurally valid
/// rollouts, each with its challenged positions: the validator's sketch at
/// those positions (zero elsewhere) and every completion token's figures.
fn rollout_evidence<R: Reference + ?Sized>(
    model: &R,
    prefix: &mut Option<PrefixCache>,
    keys: &[(Seed, SketchKey)],
    eos: u32,
    items: &[Item<'_>],
    params: &VerifyParams,
) -> Result<Vec<Evidence>, JudgeError> {
    let reqs: Vec<EvidenceRequest<'_>> = items
        .iter()
        .map(|(r, ch, _)| EvidenceRequest {
            tokens: &r.tokens,
            prompt_len: r.prompt_len as usize,
            temperature: r.sampling.temperature,
            eos,
            hidden_positions: ch,
        })
        .collect();
    // The seeded draw of every completion position (the sampling seed is
    // the contract's seed, the sketch key's too).
    let draws: Vec<Vec<f64>> = items
        .iter()
        .map(|(r, _, key)| {
            let seed = &keys[*key].0;
            (r.prompt_len as usize..r.tokens.len())
                .map(|p| tributary_protocol::sampling::draw_u(seed, &r.miner, r.group, r.rollout, p as u32))
                .collect()
        })
        .collect();
    let draw_refs: Vec<&[f64]> = draws.iter().map(Vec::as_slice).collect();
    let evidence = model.evidence_after_kept_prefix(prefix, &reqs, &draw_refs)?;
    let mut out = Vec::with_capacity(items.len());
    for ((r, ch, key), ev) in items.iter().zip(evidence) {
        let key = &keys[*key].1;
        let mut sketches = vec![0u32; r.tokens.len()];
        for (k, &pos) in ch.iter().enumerate() {
            let h = ev.hidden_row(k).ok_or(JudgeError::MissingHidden(k))?;
            if let Some(s) = sketches.get_mut(pos) {
                *s = sketch::sketch(h, key, &params.sketch)?;
            }
        }
        out.push(Evidence { sketches, positions: ev.positions() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::verify::CheckOutcome;

    #[test]
    fn sample_sizes() {
        assert_eq!(SampleConfig::ALL.miners_checked(7), 7);
        assert_eq!(SampleConfig::GRAIL.miners_checked(1), 1);
        assert_eq!(SampleConfig::GRAIL.miners_checked(3), 2);
        assert_eq!(SampleConfig::GRAIL.miners_checked(40), 10);
        assert_eq!(SampleConfig::GRAIL.miners_checked(1000), 35);
    }

    #[test]
    fn failure_names_are_the_report_keys() {
        let owner = PublicKey([7; 32]);
        assert_eq!(RolloutFailure::Signature.name(), "signature");
        assert_eq!(RolloutFailure::Environment("x".into()).name(), "environment");
        let s = RolloutFailure::Structure(StructureFailure::ExceedsContext { tokens: 9, context: 8 });
        assert_eq!((s.name(), s.to_string().as_str()), ("structure", "structure: 9 tokens exceed the context of 8"));
        let c = RolloutFailure::CopiedFrom { owner, own: vec![CheckKind::Prompt, CheckKind::Sampling] };
        assert_eq!(c.name(), "copy");
        assert_eq!(
            c.to_string(),
            "copy: same prompt and completion as miner 07070707 (whose rollout passes); own checks failed: prompt, sampling"
        );
        let v = Verdict {
            checks: vec![CheckOutcome {
                kind: CheckKind::Prompt,
                severity: Severity::Hard,
                status: Status::Fail(Failure::PromptMismatch { expected_len: 3, got_len: 4, first_diff: 1 }),
            }],
            sampling_counts: Default::default(),
        };
        assert_eq!(RolloutFailure::Checked(v).name(), "prompt");
    }
}
