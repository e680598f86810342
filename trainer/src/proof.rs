//! The trainer proves every rollout itself before it may reach a gradient.
//!
//! A validator samples miners and groups; a miner whose sample passes must
//! not get its unchecked groups trained on its word. So before a group
//! enters a GRPO batch the trainer runs the protocol's own checks
//! ([`verify::ModelFreeCheck`] and [`verify::verify_tokens`], the
//! implementation the validator runs) on each of its rollouts against the
//! window's contract ([`WindowInfo`]): the prompt re-derived from the task,
//! the reward recomputed from the completion, lengths (prompt + completion
//! within the model's context, completion within `max_new_tokens`),
//! end-of-generation only as the last token, and the exact seeded-sampling
//! check at every position, from a
//! no-grad forward of the checkpoint the rollout names (the trainer keeps
//! the last few checkpoints' weights; a rollout naming one it no longer
//! holds is stale). The cheap checks run before any model work.
//!
//! The old-policy log-probs of the loss are the trainer's own from that
//! forward, of the tempered distribution the rollout was sampled from
//! ([`crate::train::tempered_old_logprobs`]); the miner's raw (`T = 1`)
//! log-probs are only compared with the trainer's raw ones (the per-token bound).
//! The rewards the advantages are computed from are the trainer's own too
//! (recomputed from the completions); the miner's are only checked against
//! them. Only whole groups are proven: a group must hold the window's
//! `group_size` rollouts, indices `0..group_size` (a subset, chosen to rank
//! first, would decide which samples are reinforced).
//! A rollout that fails takes its group out of the batch, never the step,
//! and leaves a [`RejectRecord`] (digest, check, position, figures).
//!
//! A group is trained on only if every token of every rollout is the one
//! the trainer's own logits draw with the rollout's seeded `u`
//! ([`verify::Verdict::trainable`]). A token admitted through the
//! ambiguity band but off that draw ([`GroupProof::OffDraw`]) is what an
//! honest miner's arithmetic sometimes yields (~1 % of SmolLM2 rollouts)
//! and what a branching miner chooses (the rest regenerated honestly, a
//! different reward): the group is proven work, and the miner's completion
//! is not trained on. The trainer re-generates such a rollout from its
//! first off-draw position with its own seeded draws (the one trainable
//! completion of that rollout index) and trains the group with it, up to
//! [`ProofConfig::max_repairs_per_window`] re-generations a window and
//! [`ProofConfig::max_repairs_per_miner`] of them for one miner's rollouts;
//! beyond that the group is dropped ([`GroupProof::OffDraw`]).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use tributary_policy::{EvidenceRequest, PolicyError, PrefixCache, ReferenceModel};
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{EnvError, EnvId, EnvSpec, Environment};
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::sampling;
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};
use tributary_protocol::verify::{self, Contract, ModelFreeCheck, Rejection, Verdict, VerifyError, VerifyParams};
use tributary_protocol::wire::{FailureEvidence, Figures, WindowInfo};

/// Settings of the trainer's proof.
#[derive(Debug, Clone)]
pub struct ProofConfig {
    /// Checkpoints whose weights are kept loaded (the current one and the
    /// few before it that rollouts may still name).
    pub keep_checkpoints: usize,
    /// Verification constants (the validator's).
    pub params: VerifyParams,
    /// The GSM8K JSONL file, for networks whose environment is gsm8k.
    pub gsm8k: Option<PathBuf>,
    /// Where the reference forward runs: the trainer's own device
    /// (`trainer run --device`). The forward stays f32 (TF32 off) on a GPU.
    pub device: tch::Device,
    /// Off-draw rollouts the trainer re-generates per window from their
    /// first off-draw position with its own seeded draws
    /// ([`Prover::prove_group`]), so that their groups train; beyond it
    /// they are dropped ([`GroupProof::OffDraw`]). A re-generation costs a
    /// cached decode of its new tokens and one evidence forward, so a miner
    /// forcing them spends at most this many per window of the trainer's time.
    pub max_repairs_per_window: usize,
    /// Of those, the most one miner's rollouts may use per window, so that a
    /// miner sending off-draw rollouts on purpose cannot spend the budget the
    /// honest miners' (about 1 % of rollouts) need.
    pub max_repairs_per_miner: usize,
}

impl Default for ProofConfig {
    fn default() -> Self {
        Self {
            keep_checkpoints: 3,
            params: VerifyParams::DEFAULT,
            gsm8k: None,
            device: tch::Device::Cpu,
            max_repairs_per_window: 2,
            max_repairs_per_miner: 1,
        }
    }
}

/// The trainer could not run its proof (its own problem, not the miner's).
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// A checkpoint could not be opened.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The tokenizer could not be built or failed on a prompt.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The reference model failed.
    #[error("model: {0}")]
    Policy(#[from] PolicyError),
    /// The window's environment cannot be set up here.
    #[error("environment: {0}")]
    Env(#[from] EnvError),
    /// A checkpoint file holds another checkpoint.
    #[error("{} holds {found}, not {expected}", path.display())]
    WrongCheckpoint {
        /// The file.
        path: PathBuf,
        /// What it holds.
        found: ContentId,
        /// What was asked for.
        expected: ContentId,
    },
    /// The evidence did not fit (a bug).
    #[error("evidence: {0}")]
    Verify(#[from] VerifyError),
}

/// Why a rollout was kept out of training, with the figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RejectRecord {
    /// The window.
    pub window: u64,
    /// The miner (hex).
    pub miner: String,
    /// Group index.
    pub group: u32,
    /// Rollout index.
    pub rollout: u32,
    /// The rollout's digest (hex).
    pub digest: String,
    /// The check that failed (`verify::CheckKind::as_str`, or `context`).
    pub check: String,
    /// Absolute token position, when the failure points at one.
    pub position: Option<usize>,
    /// The failure with its figures.
    pub detail: String,
    /// What the trainer's verdict posts for it (digest, check, position, figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<FailureEvidence>,
}

impl RejectRecord {
    /// The record of `evidence` on `r`, described by `detail`.
    fn new(r: &Rollout, detail: String, evidence: FailureEvidence) -> Self {
        Self {
            window: r.window,
            miner: hex::encode(r.miner),
            group: r.group,
            rollout: r.rollout,
            digest: hex::encode(r.digest()),
            check: evidence.check.as_str().to_owned(),
            position: evidence.position.map(|p| p as usize),
            detail,
            evidence: Some(evidence),
        }
    }

    /// The record of `v`'s first hard failure on `r`, if a hard check failed.
    fn of_verdict(r: &Rollout, v: &Verdict) -> Option<Self> {
        let detail = format!("{:?}", v.first_hard_failure()?.failure()?);
        FailureEvidence::of_verdict(r, v).map(|e| Self::new(r, detail, e))
    }
}

/// A rollout that passed the proof with a token other than the
/// reference's draw.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OffDrawRecord {
    /// Rollout index in the group.
    pub rollout: u32,
    /// The rollout's digest (hex).
    pub digest: String,
    /// The first such absolute position.
    pub position: usize,
    /// Such positions in the rollout.
    pub count: usize,
}

/// The proof of one group.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupProof {
    /// Every rollout passed.
    Proven {
        /// The trainer's own old-policy log-probs, one list per rollout (in
        /// the group's order), one entry per completion token.
        old_logprobs: Vec<Vec<f32>>,
        /// The rewards the trainer recomputed from the completions, one per
        /// rollout: what the advantages are computed from.
        rewards: Vec<f32>,
        /// Rollouts that passed off the trainer's draw, re-generated by the
        /// trainer from their first off-draw position with its own seeded
        /// draws (index in the group, the rollout trained on instead): the
        /// one completion of that rollout index that is trainable.
        repaired: Vec<(usize, Rollout)>,
    },
    /// Every rollout passed, but some claimed token is not the one the
    /// trainer's own logits draw at its position (admitted through the
    /// ambiguity band, [`verify::Verdict::trainable`]), and the window's
    /// re-generations are spent: proven work, not the miner's failure, and
    /// not trained on, since a miner could have chosen that token and with
    /// it the rest of the completion (`docs/calibration.md` §6c).
    OffDraw(Vec<OffDrawRecord>),
    /// Some rollout failed a hard check (records of every failing one).
    Rejected(Vec<RejectRecord>),
    /// Not a whole group of the window (a record per rollout says why); no
    /// check ran, and nothing is posted against the miner (a group can
    /// arrive incomplete without cheating: an upload cut short).
    Incomplete(Vec<RejectRecord>),
    /// The rollouts name a checkpoint whose weights the trainer no longer holds.
    Stale,
}

impl GroupProof {
    /// For the proof budget ([`crate::select::ProofBudget`]): `Some(true)`
    /// when the miner's rollouts failed, `Some(false)` when they passed,
    /// `None` when nothing was proven (stale, incomplete).
    pub fn miner_failed(&self) -> Option<bool> {
        match self {
            GroupProof::Proven { .. } | GroupProof::OffDraw(_) => Some(false),
            GroupProof::Rejected(_) => Some(true),
            GroupProof::Incomplete(_) | GroupProof::Stale => None,
        }
    }
}

/// The records of a group that is not the window's whole group: one per
/// rollout, check `group_size`, no evidence (nothing is posted).
fn incomplete(info: &WindowInfo, rollouts: &[Rollout]) -> Option<Vec<RejectRecord>> {
    let n = info.group_size as usize;
    let mut idx: Vec<u32> = rollouts.iter().map(|r| r.rollout).collect();
    idx.sort_unstable();
    if idx.len() == n && idx.iter().enumerate().all(|(i, &r)| r as usize == i) {
        return None;
    }
    let detail = format!("a group of {} rollouts (indices {idx:?}); the window's groups have {n}", idx.len());
    Some(
        rollouts
            .iter()
            .map(|r| RejectRecord {
                window: r.window,
                miner: hex::encode(r.miner),
                group: r.group,
                rollout: r.rollout,
                digest: hex::encode(r.digest()),
                check: "group_size".to_owned(),
                position: None,
                detail: detail.clone(),
                evidence: None,
            })
            .collect(),
    )
}

/// A rollout re-generated by the trainer.
struct Repaired {
    rollout: Rollout,
    old_logprobs: Vec<f32>,
    reward: f32,
    /// Rounds of decoding it took (1 unless the forwards disagreed at an edge).
    rounds: usize,
}

/// `r` from its first off-draw position `from` on re-generated with the
/// trainer's own seeded draws, until an end-of-generation token or
/// `max_new_tokens`. The tokens are made by cached decoding (one position a
/// step, [`ReferenceModel::decode`]) and settled by the proof's own evidence
/// forward, whose draws define the one trainable completion: where it draws
/// another token than the decoding did (the two forwards round differently,
/// so this happens only within rounding of a draw's edge), the completion is
/// cut there, the evidence's draw is taken and decoding goes on. `None` if
/// that has not settled after [`MAX_SETTLE_ROUNDS`] rounds. The result
/// carries the trainer's log-probs as its claimed ones and no sketches: it
/// is trained on, never stored or judged.
fn repair(
    model: &ReferenceModel,
    tokenizer: &Tokenizer,
    eos: &[u32],
    env: &Environment,
    r: &Rollout,
    seed: &Seed,
    from: usize,
) -> Result<Option<Repaired>, ProofError> {
    let pl = r.prompt_len as usize;
    let t = r.sampling.temperature;
    let end = pl + r.sampling.max_new_tokens as usize;
    let draw = |p: usize| sampling::draw_u(seed, &r.miner, r.group, r.rollout, p as u32);
    // Decoding steps one row at a time: a BF16-held model decodes from an
    // f32 copy (the same values, so the same results) instead of widening
    // every matrix each step.
    let wide = model.widened_copy()?;
    let model = wide.as_ref().unwrap_or(model);
    // `from` is a completion position of a rollout within `end`: at least one draw.
    let mut tokens = r.tokens[..from.min(r.tokens.len())].to_vec();
    for round in 1..=MAX_SETTLE_ROUNDS {
        decode_drawn(model, eos, &mut tokens, pl, end, t, &draw)?;
        let draws: Vec<f64> = (pl..tokens.len()).map(&draw).collect();
        let req = EvidenceRequest {
            tokens: &tokens,
            prompt_len: pl,
            temperature: t,
            eos: tokenizer.eos_id(),
            hidden_positions: &[],
        };
        let ev = model.evidence_drawn(&[req], &[&draws])?.remove(0);
        if ev.drawn.len() != tokens.len() - pl {
            return Ok(None);
        }
        if let Some(j) = ev.drawn.iter().zip(&tokens[pl..]).position(|(d, &tok)| d.token != tok) {
            tracing::debug!(round, position = pl + j, "re-generation: the evidence forward drew another token there");
            tokens.truncate(pl + j);
            tokens.push(ev.drawn[j].token);
            continue;
        }
        let reward = tributary_protocol::env::completion_reward(tokenizer, env, &env.task(r.task_id), &tokens[pl..])?;
        let old_logprobs = crate::train::tempered_old_logprobs(t, &ev.logprob, &ev.prob_temp);
        let mut rollout = r.clone();
        rollout.logprobs = ev.logprob.iter().map(|&l| l as f32).collect();
        rollout.sketches = vec![0; tokens.len()];
        rollout.tokens = tokens;
        rollout.reward = reward;
        return Ok(Some(Repaired { rollout, old_logprobs, reward, rounds: round }));
    }
    Ok(None)
}

/// Rounds of decoding and settling a re-generation may take
/// ([`repair`]): one unless the two forwards round across a draw's edge.
const MAX_SETTLE_ROUNDS: usize = 4;

/// Extends `tokens` (prompt length `pl`) with the seeded draws of cached
/// decoding at temperature `t` until an end-of-generation token or `end`
/// tokens; nothing if the completion has already ended.
fn decode_drawn(
    model: &ReferenceModel,
    eos: &[u32],
    tokens: &mut Vec<u32>,
    pl: usize,
    end: usize,
    t: f32,
    draw: &dyn Fn(usize) -> f64,
) -> Result<(), ProofError> {
    let ended =
        |tokens: &[u32]| tokens.len() >= end || (tokens.len() > pl && tokens.last().is_some_and(|x| eos.contains(x)));
    if ended(tokens) {
        return Ok(());
    }
    let mut cache = model.kv_cache();
    let mut logits = tch::no_grad(|| model.decode(&mut cache, tokens))?;
    loop {
        let row = logits.to_kind(tch::Kind::Float).to_device(tch::Device::Cpu);
        let row: Vec<f32> =
            Vec::try_from(row).map_err(|e: tch::TchError| ProofError::Policy(PolicyError::Request(e.to_string())))?;
        let next = sampling::sample_inverse_cdf(&row, t, draw(tokens.len())) as u32;
        tokens.push(next);
        if ended(tokens) {
            return Ok(());
        }
        logits = tch::no_grad(|| model.decode(&mut cache, &[next]))?;
    }
}

/// The re-generation the proof spends a window's `max_repairs_per_window`
/// on, alone: `r` re-generated from completion position `from` with the
/// trainer's own draws of `seed` and settled by the evidence forward, with
/// the rounds of decoding that took (`None` if it did not settle). For
/// `repair-bench`.
pub fn regenerate(
    model: &ReferenceModel,
    tokenizer: &Tokenizer,
    env: &Environment,
    r: &Rollout,
    seed: &Seed,
    from: usize,
) -> Result<Option<(Rollout, usize)>, ProofError> {
    let eos: Vec<u32> = tokenizer.eog_ids().collect();
    Ok(repair(model, tokenizer, &eos, env, r, seed, from)?.map(|x| (x.rollout, x.rounds)))
}

/// Re-generations one window has spent, per miner.
#[derive(Debug, Default)]
struct RepairsSpent {
    by_miner: BTreeMap<[u8; 32], usize>,
}

/// Loaded checkpoints (most recent last) and the environments seen.
pub struct Prover {
    cfg: ProofConfig,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    models: VecDeque<(ContentId, ReferenceModel)>,
    envs: BTreeMap<(EnvId, u32, Option<[u8; 32]>), Environment>,
    /// Re-generations spent per window (the last few windows).
    repairs: std::cell::RefCell<BTreeMap<u64, RepairsSpent>>,
    /// The keys and values of the prompt prefix the last groups shared,
    /// and the checkpoint they are of ([`ReferenceModel::prefix_for`]).
    prefix: std::cell::RefCell<(Option<ContentId>, Option<PrefixCache>)>,
}

impl std::fmt::Debug for Prover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held: Vec<String> = self.models.iter().map(|(id, _)| id.to_string()).collect();
        f.debug_struct("Prover").field("held", &held).finish_non_exhaustive()
    }
}

fn env_key(s: &EnvSpec) -> (EnvId, u32, Option<[u8; 32]>) {
    (s.env, s.difficulty, s.dataset)
}

impl Prover {
    /// A prover with the tokenizer of `genesis` (every checkpoint of a
    /// network shares its tokenizer) and no weights loaded yet.
    pub fn new(genesis: &Path, cfg: ProofConfig) -> Result<Self, ProofError> {
        let tokenizer = Tokenizer::from_gguf_file(genesis)?;
        let eos = tokenizer.eog_ids().collect();
        Ok(Self {
            cfg,
            tokenizer,
            eos,
            models: VecDeque::new(),
            envs: BTreeMap::new(),
            repairs: Default::default(),
            prefix: Default::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ProofConfig {
        &self.cfg
    }

    /// Whether `id`'s weights are loaded.
    pub fn holds(&self, id: &ContentId) -> bool {
        self.models.iter().any(|(m, _)| m == id)
    }

    /// Loads `id` from `path` unless it is loaded; keeps at most
    /// `keep_checkpoints` (the least recently loaded goes first).
    pub fn load(&mut self, id: ContentId, path: &Path) -> Result<(), ProofError> {
        if self.holds(&id) {
            return Ok(());
        }
        let ckpt = Checkpoint::open(path)?;
        if ckpt.content_id() != id {
            return Err(ProofError::WrongCheckpoint { path: path.to_owned(), found: ckpt.content_id(), expected: id });
        }
        // Held as BF16 (f32 arithmetic, the same bits) when its matrices are
        // BF16, as every publication's are: 2 bytes a parameter, not 4.
        let model = ReferenceModel::load_for_inference(&ckpt, self.cfg.device)?;
        self.models.push_back((id, model));
        while self.models.len() > self.cfg.keep_checkpoints.max(1) {
            self.models.pop_front();
        }
        Ok(())
    }

    /// Bytes the held checkpoints' parameters take.
    pub fn held_bytes(&self) -> usize {
        self.models.iter().map(|(_, m)| m.parameter_bytes()).sum()
    }

    /// Spends `n` of `window`'s re-generations for `miner`'s group, if that
    /// many are left to the window and to the miner.
    fn take_repairs(&self, window: u64, miner: [u8; 32], n: usize) -> bool {
        let mut spent = self.repairs.borrow_mut();
        let w = spent.entry(window).or_default();
        let all: usize = w.by_miner.values().sum();
        let mine = w.by_miner.entry(miner).or_default();
        if all + n > self.cfg.max_repairs_per_window || *mine + n > self.cfg.max_repairs_per_miner {
            return false;
        }
        *mine += n;
        while spent.len() > 16 {
            spent.pop_first();
        }
        true
    }

    fn model(&self, id: &ContentId) -> Option<&ReferenceModel> {
        self.models.iter().find(|(m, _)| m == id).map(|(_, m)| m)
    }

    fn env(&mut self, info: &WindowInfo) -> Result<&Environment, ProofError> {
        let spec = info.env_spec();
        let e = match self.envs.entry(env_key(&spec)) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Environment::build(&spec, self.cfg.gsm8k.as_deref())?)
            }
        };
        Ok(e)
    }

    /// Proves one group (rollouts of one miner, window and group index)
    /// against its window's contract `info`: a whole group only (the
    /// window's `group_size` rollouts, indices `0..group_size`).
    pub fn prove_group(&mut self, info: &WindowInfo, rollouts: &[Rollout]) -> Result<GroupProof, ProofError> {
        if let Some(records) = incomplete(info, rollouts) {
            return Ok(GroupProof::Incomplete(records));
        }
        let env = self.env(info)?.clone();
        let Some(model) = self.model(&info.checkpoint) else { return Ok(GroupProof::Stale) };
        let dims = model.dims();
        let vocab = u32::try_from(dims.vocab_size).unwrap_or(u32::MAX);
        let params = self.cfg.params;
        // The sketch check is not run: no challenge is needed.
        let contract = Contract::of_window(info, &env, Seed([0; 32]));
        // Cheap checks first: structure (contract, lengths, EOS), prompt,
        // context and reward need no model. The door checked the signatures.
        let check = ModelFreeCheck {
            tokenizer: &self.tokenizer,
            eos_tokens: &self.eos,
            vocab_size: vocab,
            context: Some(dims.context_length),
            signatures: false,
            params: &params,
        };
        let mut rejected = Vec::new();
        let mut prepared = Vec::with_capacity(rollouts.len());
        for r in rollouts {
            match check.run(r, &contract) {
                Ok(p) => match RejectRecord::of_verdict(r, &p.verdict) {
                    Some(rec) => rejected.push(rec),
                    None => prepared.push(p),
                },
                Err(Rejection::Environment(e)) => return Err(ProofError::Tokenizer(e)),
                Err(Rejection::Failed(v)) => rejected.extend(RejectRecord::of_verdict(r, &v)),
                Err(e) => rejected.push(RejectRecord::new(r, e.to_string(), FailureEvidence::of_rejection(r, &e))),
            }
        }
        if !rejected.is_empty() {
            return Ok(GroupProof::Rejected(rejected));
        }
        let eos = self.tokenizer.eos_id();
        let reqs: Vec<EvidenceRequest<'_>> = rollouts
            .iter()
            .map(|r| EvidenceRequest {
                tokens: &r.tokens,
                prompt_len: r.prompt_len as usize,
                temperature: r.sampling.temperature,
                eos,
                hidden_positions: &[],
            })
            .collect();
        let assignments: Vec<_> = rollouts
            .iter()
            .zip(&prepared)
            .map(|(r, prep)| contract.assignment(r, &prep.prompt, vocab, &self.eos))
            .collect();
        // The seeded draw of every completion position: the evidence carries
        // the token the trainer's own logits draw there, which bounds what
        // an ambiguous position admits.
        let draws: Vec<Vec<f64>> = rollouts
            .iter()
            .zip(&assignments)
            .map(|(r, a)| {
                (r.prompt_len as usize..r.tokens.len())
                    .map(|p| sampling::draw_u(&a.sampling_seed, &r.miner, r.group, r.rollout, p as u32))
                    .collect()
            })
            .collect();
        let draw_refs: Vec<&[f64]> = draws.iter().map(Vec::as_slice).collect();
        // The prompt prefix this group shares with the last ones runs once
        // for them all (the figures are the same up to rounding).
        let mut guard = self.prefix.borrow_mut();
        let (of, cache) = &mut *guard;
        if *of != Some(info.checkpoint) {
            (*of, *cache) = (Some(info.checkpoint), None);
        }
        let evidence = model.evidence_after_kept_prefix(cache, &reqs, &draw_refs)?;
        drop(guard);
        let mut old = Vec::with_capacity(rollouts.len());
        let mut rewards = Vec::with_capacity(rollouts.len());
        let mut off_draw = Vec::new();
        for (((r, ev), prep), a) in rollouts.iter().zip(&evidence).zip(&prepared).zip(&assignments) {
            let v = verify::verify_tokens(r, a, prep.reward, &ev.positions(), &params)?;
            match RejectRecord::of_verdict(r, &v) {
                Some(mut rec) => {
                    // The reference figure of a log-prob failure: the trainer's own log-prob there.
                    if let Some(FailureEvidence {
                        figures: Figures::Logprob { reference, .. },
                        position: Some(p),
                        ..
                    }) = &mut rec.evidence
                    {
                        let i = (*p as usize).checked_sub(r.prompt_len as usize);
                        *reference = i.and_then(|i| ev.logprob.get(i)).map(|&l| l as f32);
                    }
                    rejected.push(rec)
                }
                None => {
                    let c = v.sampling_counts;
                    if let Some(position) = c.first_off_draw {
                        off_draw.push(OffDrawRecord {
                            rollout: r.rollout,
                            digest: hex::encode(r.digest()),
                            position,
                            count: c.off_draw,
                        });
                    }
                    // Of the sampling distribution softmax(logits / T), as the loss's.
                    old.push(crate::train::tempered_old_logprobs(r.sampling.temperature, &ev.logprob, &ev.prob_temp));
                    rewards.push(prep.reward);
                }
            }
        }
        if !rejected.is_empty() {
            return Ok(GroupProof::Rejected(rejected));
        }
        let mut repaired = Vec::new();
        if !off_draw.is_empty() {
            if !self.take_repairs(info.window, rollouts[0].miner, off_draw.len()) {
                return Ok(GroupProof::OffDraw(off_draw));
            }
            for rec in &off_draw {
                let Some(i) = rollouts.iter().position(|r| r.rollout == rec.rollout) else {
                    return Ok(GroupProof::OffDraw(off_draw));
                };
                let r = &rollouts[i];
                match repair(model, &self.tokenizer, &self.eos, &env, r, &assignments[i].sampling_seed, rec.position)? {
                    Some(fixed) => {
                        old[i] = fixed.old_logprobs;
                        rewards[i] = fixed.reward;
                        repaired.push((i, fixed.rollout));
                    }
                    // The re-generation's own forward disagreed with it at an edge.
                    None => return Ok(GroupProof::OffDraw(off_draw)),
                }
            }
        }
        Ok(GroupProof::Proven { old_logprobs: old, rewards, repaired })
    }
}
