//! The training step: FP32 master weights in the reference model's VarStore,
//! the GRPO loss over micro-batches, global-norm gradient clipping, AdamW,
//! and export of the BF16 checkpoint.
//!
//! **Temperature.** Rollouts are sampled from `softmax(logits / T)` at the
//! window's temperature `T`, so the policy whose gradient is taken is that
//! tempered distribution: the current log-probs of the loss are
//! `log_softmax(logits / T)` of each sample's own `T`
//! ([`Sample::temperature`]), and the old-policy log-probs must be of the same
//! distribution ([`tempered_old_logprobs`], what the trainer's proof hands
//! over). The protocol's claimed log-probs stay the raw `T = 1` ones the
//! proof compares; only the trainer's own training figures are tempered.

use std::collections::BTreeMap;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use tributary_policy::{PackedLayout, PolicyError, ReferenceModel, common_prefix_len, pad_batch};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::gguf::{GgmlType, GgufError, GgufWriter};

use crate::grpo::{GrpoConfig, LossInputs, grpo_loss};
use crate::select::TrainGroup;

/// Errors of the training step.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The reference model failed.
    #[error("model: {0}")]
    Policy(#[from] PolicyError),
    /// libtorch failed.
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// Writing the checkpoint failed.
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    /// A sample or the template is unusable.
    #[error("{0}")]
    Invalid(String),
}

/// The peak learning rate everywhere a default is needed (the library, `trainer
/// run`, `docs/config/trainer.toml`, `scripts/train-bench.sh`): the rate of
/// the measured training run in docs/training.md.
pub const DEFAULT_LR: f64 = 3e-5;

/// Optimiser and batching hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up length in steps.
    pub warmup_steps: u64,
    /// AdamW β1.
    pub beta1: f64,
    /// AdamW β2.
    pub beta2: f64,
    /// AdamW ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 disables).
    pub grad_clip: f64,
    /// Most completion tokens per micro-batch (bounds the `[N, vocab]` logits
    /// and the activations kept for backward). Default 512: at 2048 a step on
    /// 96 SmolLM2 rollouts of 48 tokens peaked near 9 GiB and was OOM-killed
    /// on a 23 GiB machine (`scripts/train-bench.sh`); the loss is normalised
    /// over the whole batch, so the split does not change the step.
    pub micro_batch_tokens: usize,
    /// Run a prompt shared by several samples once per micro-batch (the
    /// samples of one group attend to its keys and values,
    /// [`ReferenceModel::forward_hidden_shared_prefix`]) instead of once per
    /// sample. The same loss and gradient up to rounding; on GRPO groups it
    /// removes most of the prompt positions from the forward and backward.
    #[serde(default = "default_share_prompts")]
    pub share_prompts: bool,
    /// With `share_prompts`, run the prefix common to every prompt of the
    /// step (a system prompt, worked examples) once a step, and pack each
    /// micro-batch into one row without padding: each distinct prompt's
    /// rest once, then its completions
    /// ([`ReferenceModel::forward_hidden_packed`]). The same loss and
    /// gradient up to rounding; on prompts with a long common prefix and
    /// short completions most positions of the shared-prompt layout go.
    #[serde(default = "default_share_prompts")]
    pub pack_prompts: bool,
    /// The objective.
    pub grpo: GrpoConfig,
}

fn default_share_prompts() -> bool {
    true
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            lr: DEFAULT_LR,
            warmup_steps: 1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            micro_batch_tokens: 512,
            share_prompts: true,
            pack_prompts: true,
            grpo: GrpoConfig::default(),
        }
    }
}

/// The temperature the gradient is taken at for a rollout sampled at `t`:
/// `t` itself when it is a finite positive number; otherwise (greedy) 1, the
/// raw distribution (a greedy rollout's tempered distribution is degenerate).
pub fn gradient_temperature(t: f32) -> f32 {
    if tributary_protocol::sampling::is_greedy(t) { 1.0 } else { t }
}

/// The old-policy log-probs of a rollout sampled at `temperature`, for the
/// loss: `ln softmax(logits / T)` of each completion token
/// ([`gradient_temperature`]), from the proof's figures of that token:
/// `logprob_t1` (the raw `T = 1` log-prob) for greedy rollouts, else
/// `ln prob_temp` (its probability under the sampling distribution; a
/// probability that underflowed to 0 reads as the smallest positive `f64`'s
/// log, about −708, rather than −∞).
pub fn tempered_old_logprobs(temperature: f32, logprob_t1: &[f64], prob_temp: &[f64]) -> Vec<f32> {
    if gradient_temperature(temperature) == 1.0 {
        return logprob_t1.iter().map(|&l| l as f32).collect();
    }
    prob_temp.iter().map(|&p| p.max(f64::MIN_POSITIVE).ln() as f32).collect()
}

/// One training sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Prompt then completion tokens.
    pub tokens: Vec<u32>,
    /// Prompt length (≥ 1).
    pub prompt_len: usize,
    /// The temperature the completion was sampled at (the window's). The
    /// loss's log-probs are of `softmax(logits / T)` with
    /// `T = gradient_temperature(temperature)`.
    pub temperature: f32,
    /// Old-policy log-prob of each completion token under the same tempered
    /// distribution ([`tempered_old_logprobs`]; the trainer's own, from its proof).
    pub old_logprobs: Vec<f32>,
    /// Advantage.
    pub advantage: f32,
    /// Reward (for metrics).
    pub reward: f32,
}

impl Sample {
    /// The samples of selected groups.
    pub fn from_groups(groups: &[TrainGroup]) -> Vec<Sample> {
        groups
            .iter()
            .flat_map(|g| {
                g.rollouts.iter().zip(&g.advantages).zip(&g.old_logprobs).map(|((r, &a), old)| Sample {
                    tokens: r.tokens.clone(),
                    prompt_len: r.prompt_len as usize,
                    temperature: r.sampling.temperature,
                    old_logprobs: old.clone(),
                    advantage: a,
                    reward: r.reward,
                })
            })
            .collect()
    }

    fn completion_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Figures of one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepStats {
    /// Optimiser step number (1-based) just taken.
    pub step: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Total loss.
    pub loss: f64,
    /// Policy-gradient part.
    pub pg_loss: f64,
    /// Mean per-sequence token entropy.
    pub entropy: f64,
    /// Mean importance ratio.
    pub ratio_mean: f64,
    /// Fraction of sequences clipped at `1 − ε_lo`.
    pub clip_low_frac: f64,
    /// Fraction of sequences clipped at `1 + ε_hi`.
    pub clip_high_frac: f64,
    /// Fraction of sequences hitting the δ cap.
    pub cap_frac: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Mean reward.
    pub reward_mean: f64,
    /// Reward standard deviation.
    pub reward_std: f64,
    /// Sequences.
    pub seqs: usize,
    /// Completion tokens.
    pub tokens: usize,
}

impl StepStats {
    /// Emits the figures as `metrics` gauges (`tributary_trainer_*`).
    pub fn record_metrics(&self) {
        for (name, v) in [
            ("tributary_trainer_step", self.step as f64),
            ("tributary_trainer_lr", self.lr),
            ("tributary_trainer_loss", self.loss),
            ("tributary_trainer_pg_loss", self.pg_loss),
            ("tributary_trainer_entropy", self.entropy),
            ("tributary_trainer_ratio_mean", self.ratio_mean),
            ("tributary_trainer_clip_low_fraction", self.clip_low_frac),
            ("tributary_trainer_clip_high_fraction", self.clip_high_frac),
            ("tributary_trainer_delta_cap_fraction", self.cap_frac),
            ("tributary_trainer_grad_norm", self.grad_norm),
            ("tributary_trainer_reward_mean", self.reward_mean),
            ("tributary_trainer_reward_std", self.reward_std),
            ("tributary_trainer_batch_sequences", self.seqs as f64),
            ("tributary_trainer_batch_tokens", self.tokens as f64),
        ] {
            metrics::gauge!(name).set(v);
        }
    }
}

/// Wall-clock split of the last [`Trainer::step`] (for benches).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimings {
    /// Micro-batches run.
    pub micro_batches: usize,
    /// Of those, micro-batches whose samples shared one prompt run once
    /// (shared-prompt or packed).
    pub shared_prompt_batches: usize,
    /// Prompt tokens common to the whole step, run once a step (packed
    /// layout; 0 otherwise).
    pub common_prefix: usize,
    /// Token positions the model ran (a shared prompt counted once per
    /// micro-batch; padding included).
    pub positions: usize,
    /// Forward: model, LM head on the completion positions, loss (s).
    pub forward_s: f64,
    /// Backward (s).
    pub backward_s: f64,
    /// Gradient norm, clipping and AdamW (s).
    pub optimizer_s: f64,
}

/// How a micro-batch's samples are laid out for the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Each sample in full, right-padded to the longest.
    Padded,
    /// One prompt run once, the completions right-padded after it
    /// ([`ReferenceModel::forward_hidden_shared_prefix`]).
    SharedPrompt,
    /// One row without padding after the step's common prefix: each
    /// distinct prompt's rest once, then its completions
    /// ([`ReferenceModel::forward_hidden_packed`]). Samples of one prompt
    /// are adjacent.
    Packed,
}

/// A micro-batch: its samples and their layout.
struct MicroBatch<'a> {
    samples: Vec<&'a Sample>,
    layout: Layout,
}

/// The samples of each distinct prompt, in order of first appearance.
fn by_prompt(samples: &[Sample]) -> Vec<Vec<&Sample>> {
    let mut groups: Vec<Vec<&Sample>> = Vec::new();
    let mut index: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
    for s in samples {
        let i = *index.entry(&s.tokens[..s.prompt_len]).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(s);
    }
    groups
}

/// Splits `samples` into micro-batches of at most `budget` completion tokens
/// (a longer sample goes alone). With `pack`, every micro-batch is
/// [`Layout::Packed`]: a prompt's samples (sorted by length) are cut into
/// runs of at most `budget` completion tokens and the runs are filled into
/// micro-batches in turn. Otherwise, with `share`, samples with the same
/// prompt go together and run their prompt once; the others (and a group's
/// lone leftover) are packed by length as without.
fn plan_micro_batches(samples: &[Sample], budget: usize, share: bool, pack: bool) -> Vec<MicroBatch<'_>> {
    let mut out = Vec::new();
    if share && pack {
        let mut cur: Vec<&Sample> = Vec::new();
        let mut used = 0;
        for group in by_prompt(samples) {
            for run in pack_by_length(group, budget) {
                let n: usize = run.iter().map(|s| s.completion_len()).sum();
                if !cur.is_empty() && used + n > budget {
                    out.push(MicroBatch { samples: std::mem::take(&mut cur), layout: Layout::Packed });
                    used = 0;
                }
                cur.extend(run);
                used += n;
            }
        }
        if !cur.is_empty() {
            out.push(MicroBatch { samples: cur, layout: Layout::Packed });
        }
        return out;
    }
    let mut rest = Vec::new();
    if share {
        for group in by_prompt(samples) {
            for mb in pack_by_length(group, budget) {
                if mb.len() >= 2 {
                    out.push(MicroBatch { samples: mb, layout: Layout::SharedPrompt });
                } else {
                    rest.extend(mb);
                }
            }
        }
    } else {
        rest.extend(samples);
    }
    if !rest.is_empty() {
        out.extend(
            pack_by_length(rest, budget).into_iter().map(|samples| MicroBatch { samples, layout: Layout::Padded }),
        );
    }
    out
}

/// Sorts by length (similar lengths together: less padding) and fills
/// micro-batches of at most `budget` completion tokens.
fn pack_by_length(mut order: Vec<&Sample>, budget: usize) -> Vec<Vec<&Sample>> {
    order.sort_by_key(|s| s.tokens.len());
    let mut out: Vec<Vec<&Sample>> = Vec::new();
    let mut used = 0;
    for s in order {
        let n = s.completion_len();
        match out.last_mut() {
            Some(m) if used + n <= budget => m.push(s),
            _ => {
                out.push(vec![s]);
                used = 0;
            }
        }
        used += n;
    }
    out
}

/// AdamW moments per parameter, plus the step count.
#[derive(Debug, Default)]
pub struct AdamState {
    /// Steps taken.
    pub t: u64,
    /// First moments by parameter name.
    pub m: BTreeMap<String, Tensor>,
    /// Second moments by parameter name.
    pub v: BTreeMap<String, Tensor>,
}

/// The learner: model with FP32 master weights and optimiser state.
#[derive(Debug)]
pub struct Trainer {
    model: ReferenceModel,
    adam: AdamState,
    cfg: TrainConfig,
    timings: StepTimings,
}

impl Trainer {
    /// Starts from a checkpoint (its BF16 values become the FP32 masters).
    pub fn from_checkpoint(ckpt: &Checkpoint, device: Device, cfg: TrainConfig) -> Result<Self, TrainError> {
        Ok(Self::new(ReferenceModel::load(ckpt, device)?, AdamState::default(), cfg))
    }

    /// Wraps a model and optimiser state (e.g. restored from disk).
    pub fn new(model: ReferenceModel, adam: AdamState, cfg: TrainConfig) -> Self {
        Trainer { model, adam, cfg, timings: StepTimings::default() }
    }

    /// The model.
    pub fn model(&self) -> &ReferenceModel {
        &self.model
    }

    /// The optimiser state.
    pub fn adam(&self) -> &AdamState {
        &self.adam
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Where the last [`Trainer::step`] spent its time.
    pub fn last_timings(&self) -> &StepTimings {
        &self.timings
    }

    /// Optimiser steps taken.
    pub fn steps(&self) -> u64 {
        self.adam.t
    }

    /// Learning rate of step `t` (1-based): linear warm-up, then constant.
    pub fn lr_at(&self, t: u64) -> f64 {
        let w = self.cfg.warmup_steps.max(1);
        self.cfg.lr * (t.min(w) as f64 / w as f64)
    }

    /// Completion-token log-probs and entropies of the tempered distribution
    /// `softmax(logits / T)` (each sample's [`gradient_temperature`]) under
    /// the current weights, flat over tokens, for a micro-batch
    /// (differentiable), and the number of token positions the model ran.
    /// For a [`Layout::Packed`] micro-batch, `past` holds the keys and values
    /// of the step's common prefix of `p0` tokens.
    fn token_logprobs(
        &self,
        mb: &MicroBatch<'_>,
        past: &[(Tensor, Tensor)],
        p0: usize,
    ) -> Result<(Tensor, Tensor, Tensor, usize), TrainError> {
        let device = self.model.device();
        let vocab = self.model.dims().vocab_size;
        let batch = &mb.samples;
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        let mut seq_of = Vec::new();
        // 1/T of each completion token's sample.
        let inv_temp: Vec<f32> = batch
            .iter()
            .flat_map(|s| std::iter::repeat_n(1.0 / gradient_temperature(s.temperature), s.completion_len()))
            .collect();
        let (hidden, positions) = if mb.layout == Layout::Packed {
            // One row: each prompt's rest after the common prefix once, then
            // its completions (but their last tokens, whose rows predict
            // nothing); completion token k is predicted by position k − 1.
            let seqs: Vec<(&[u32], usize)> = batch.iter().map(|s| (s.tokens.as_slice(), s.prompt_len)).collect();
            let layout = PackedLayout::build(&seqs, p0, false)?;
            for (i, s) in batch.iter().enumerate() {
                for p in s.prompt_len..s.tokens.len() {
                    let row = layout.row(i, p - 1).ok_or_else(|| TrainError::Invalid(format!("no row for {p}")))?;
                    rows.push(row);
                    targets.push(i64::from(s.tokens[p]));
                    seq_of.push(i as i64);
                }
            }
            (self.model.forward_layout(past, &layout)?, layout.len())
        } else if mb.layout == Layout::SharedPrompt {
            // The prompt `[1, P]` once; the completions `[B, S]` attend to it.
            // Over the rows `[prompt P | completions B·S]`, completion token k
            // of sample i is predicted by the prompt's last row for k = 0,
            // else by completion row (i, k − 1).
            let p = batch[0].prompt_len;
            let prompt: Vec<i64> = batch[0].tokens[..p].iter().map(|&t| i64::from(t)).collect();
            let prefix = Tensor::f_from_slice(&prompt)?.f_view([1, p as i64])?.f_to_device(device)?;
            let suffixes: Vec<&[u32]> = batch.iter().map(|s| &s.tokens[p..]).collect();
            let (suffix, _) = pad_batch(&suffixes, vocab, 0, device)?;
            let sl = suffix.size()[1];
            for (i, s) in batch.iter().enumerate() {
                for k in 0..s.completion_len() {
                    rows.push(if k == 0 { p as i64 - 1 } else { p as i64 + i as i64 * sl + k as i64 - 1 });
                    targets.push(i64::from(s.tokens[p + k]));
                    seq_of.push(i as i64);
                }
            }
            let (hp, hs) = self.model.forward_hidden_shared_prefix(&prefix, &suffix)?;
            let d = hs.size()[2];
            let h = Tensor::f_cat(&[hp.f_reshape([-1, d])?, hs.f_reshape([-1, d])?], 0)?;
            (h, p + batch.len() * sl as usize)
        } else {
            let seqs: Vec<&[u32]> = batch.iter().map(|s| s.tokens.as_slice()).collect();
            let (tokens, _) = pad_batch(&seqs, vocab, 0, device)?;
            let l = tokens.size()[1];
            for (i, s) in batch.iter().enumerate() {
                for p in s.prompt_len..s.tokens.len() {
                    rows.push(i as i64 * l + p as i64 - 1);
                    targets.push(i64::from(s.tokens[p]));
                    seq_of.push(i as i64);
                }
            }
            let hidden = self.model.forward_hidden(&tokens)?;
            let d = hidden.size()[2];
            (hidden.f_reshape([-1, d])?, batch.len() * l as usize)
        };
        let rows = Tensor::f_from_slice(&rows)?.f_to_device(device)?;
        let h = hidden.f_index_select(0, &rows)?;
        let inv_temp = Tensor::f_from_slice(&inv_temp)?.f_to_device(device)?.f_unsqueeze(1)?;
        let logits = self.model.lm_head(&h)?.f_mul(&inv_temp)?;
        let logp_all = logits.f_log_softmax(-1, Kind::Float)?;
        let targets = Tensor::f_from_slice(&targets)?.f_to_device(device)?;
        let logp = logp_all.f_gather(1, &targets.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
        let entropy = logp_all.f_exp()?.f_mul(&logp_all)?.f_sum_dim_intlist(-1, false, Kind::Float)?.f_neg()?;
        let seq = Tensor::f_from_slice(&seq_of)?.f_to_device(device)?;
        Ok((logp, entropy, seq, positions))
    }

    /// Validates samples (lengths, vocabulary, finite values).
    fn check(&self, samples: &[Sample]) -> Result<(), TrainError> {
        let vocab = self.model.dims().vocab_size;
        let ctx = self.model.dims().context_length;
        for (k, s) in samples.iter().enumerate() {
            let ok = s.prompt_len >= 1
                && s.prompt_len < s.tokens.len()
                && s.tokens.len() <= ctx
                && s.old_logprobs.len() == s.completion_len()
                && s.old_logprobs.iter().all(|l| l.is_finite())
                && s.temperature.is_finite()
                && s.temperature >= 0.0
                && s.advantage.is_finite()
                && s.tokens.iter().all(|&t| (t as usize) < vocab);
            if !ok {
                return Err(TrainError::Invalid(format!("sample {k} is malformed")));
            }
        }
        Ok(())
    }

    /// One optimiser step on `samples` (the whole batch; split into
    /// micro-batches of at most `micro_batch_tokens` completion tokens).
    pub fn step(&mut self, samples: &[Sample]) -> Result<StepStats, TrainError> {
        let mut st = self.accumulate_gradients(samples)?;
        let t = self.adam.t + 1;
        st.lr = self.lr_at(t);
        let t0 = Instant::now();
        st.grad_norm = self.apply_adamw(t, st.lr)?;
        self.timings.optimizer_s = t0.elapsed().as_secs_f64();
        st.step = t;
        Ok(st)
    }

    /// Forward and backward of every micro-batch: the batch loss's gradient
    /// accumulated into the parameters' `.grad`, and the step's figures
    /// (all but learning rate, gradient norm and step number).
    fn accumulate_gradients(&mut self, samples: &[Sample]) -> Result<StepStats, TrainError> {
        if samples.is_empty() {
            return Err(TrainError::Invalid("empty batch".into()));
        }
        self.check(samples)?;
        let device = self.model.device();
        let total_tokens: usize = samples.iter().map(Sample::completion_len).sum();
        let total_seqs = samples.len();
        let pack = self.cfg.share_prompts && self.cfg.pack_prompts;
        let micro = plan_micro_batches(samples, self.cfg.micro_batch_tokens, self.cfg.share_prompts, pack);
        let mut tm = StepTimings { micro_batches: micro.len(), ..StepTimings::default() };

        // The step's common prompt prefix runs once. Its keys and values
        // enter the micro-batches as leaves that collect their gradient; one
        // backward through the prefix at the end passes it on to the weights.
        let t0 = Instant::now();
        let p0 = if pack { common_prefix_len(samples.iter().map(|s| &s.tokens[..s.prompt_len])) } else { 0 };
        let prefix_kv = if p0 > 0 {
            let ids: Vec<i64> = samples[0].tokens[..p0].iter().map(|&t| i64::from(t)).collect();
            let prefix = Tensor::f_from_slice(&ids)?.f_view([1, p0 as i64])?;
            self.model.prefix_kv(&prefix)?
        } else {
            Vec::new()
        };
        let leaves = prefix_kv
            .iter()
            .map(|(k, v)| Ok((k.f_detach()?.set_requires_grad(true), v.f_detach()?.set_requires_grad(true))))
            .collect::<Result<Vec<_>, TrainError>>()?;
        tm.positions += p0;
        tm.common_prefix = p0;
        tm.forward_s += t0.elapsed().as_secs_f64();

        let mut st = StepStats { seqs: total_seqs, tokens: total_tokens, ..StepStats::default() };
        let (mut clip_lo, mut clip_hi, mut capped) = (0usize, 0usize, 0usize);
        for mb in &micro {
            let t0 = Instant::now();
            tm.shared_prompt_batches += usize::from(mb.layout != Layout::Padded);
            let (logp, entropy, seq, positions) = self.token_logprobs(mb, &leaves, p0)?;
            tm.positions += positions;
            let mb = &mb.samples;
            let old: Vec<f32> = mb.iter().flat_map(|s| s.old_logprobs.iter().copied()).collect();
            let lens: Vec<f32> = mb.iter().map(|s| s.completion_len() as f32).collect();
            let adv: Vec<f32> = mb.iter().map(|s| s.advantage).collect();
            let to = |v: &[f32]| -> Result<Tensor, tch::TchError> { Tensor::f_from_slice(v)?.f_to_device(device) };
            let (old, lens, adv) = (to(&old)?, to(&lens)?, to(&adv)?);
            let out = grpo_loss(
                &self.cfg.grpo,
                &LossInputs {
                    logp: &logp,
                    old_logp: &old,
                    seq: &seq,
                    lens: &lens,
                    adv: &adv,
                    entropy: Some(&entropy),
                    total_tokens: total_tokens as f64,
                    total_seqs: total_seqs as f64,
                },
            )?;
            let t1 = Instant::now();
            out.loss.f_backward()?;
            tm.forward_s += (t1 - t0).as_secs_f64();
            tm.backward_s += t1.elapsed().as_secs_f64();
            st.loss += out.loss.f_double_value(&[])?;
            st.pg_loss += out.pg;
            st.entropy += out.entropy_sum;
            st.ratio_mean += out.ratio_sum;
            clip_lo += out.clipped_low;
            clip_hi += out.clipped_high;
            capped += out.capped;
        }
        if !leaves.is_empty() {
            let t0 = Instant::now();
            let mut surrogate: Option<Tensor> = None;
            for ((k, v), (lk, lv)) in prefix_kv.iter().zip(&leaves) {
                for (t, leaf) in [(k, lk), (v, lv)] {
                    let g = leaf.grad();
                    if g.defined() {
                        let term = t.f_mul(&g)?.f_sum(Kind::Float)?;
                        surrogate = Some(match surrogate {
                            Some(acc) => acc.f_add(&term)?,
                            None => term,
                        });
                    }
                }
            }
            if let Some(s) = surrogate {
                s.f_backward()?;
            }
            tm.backward_s += t0.elapsed().as_secs_f64();
        }
        let n = total_seqs as f64;
        st.entropy /= n;
        st.ratio_mean /= n;
        st.clip_low_frac = clip_lo as f64 / n;
        st.clip_high_frac = clip_hi as f64 / n;
        st.cap_frac = capped as f64 / n;
        st.reward_mean = samples.iter().map(|s| f64::from(s.reward)).sum::<f64>() / n;
        st.reward_std =
            (samples.iter().map(|s| (f64::from(s.reward) - st.reward_mean).powi(2)).sum::<f64>() / n).sqrt();
        self.timings = tm;
        Ok(st)
    }

    /// Clips gradients to the global norm, applies AdamW with `lr`, zeroes
    /// the gradients. Returns the norm before clipping.
    fn apply_adamw(&mut self, t: u64, lr: f64) -> Result<f64, TrainError> {
        let c = self.cfg;
        let mut vars: Vec<(String, Tensor)> = self.model.var_store().variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| -> Result<f64, TrainError> {
            let mut sq = 0f64;
            for (_, p) in &vars {
                let g = p.grad();
                if g.defined() {
                    let n = g.f_norm()?.f_double_value(&[])?;
                    sq += n * n;
                }
            }
            let norm = sq.sqrt();
            let scale = if c.grad_clip > 0.0 && norm > c.grad_clip { c.grad_clip / (norm + 1e-6) } else { 1.0 };
            let (bc1, bc2) = (1.0 - c.beta1.powi(t as i32), 1.0 - c.beta2.powi(t as i32));
            // In place, as torch.optim.AdamW: m ← lerp(m, g, 1−β1),
            // v ← lerp(v, g², 1−β2), p ← p·(1 − lr·wd) − (lr/bc1)·m / (√v/√bc2 + ε).
            // tch's addcdiv_ has no factor, so it rides on the denominator:
            // p + m / ((√v/√bc2 + ε) · (−bc1/lr)).
            let denom_scale = -bc1 / lr;
            for (name, p) in &mut vars {
                let mut g = p.grad();
                if !g.defined() {
                    continue;
                }
                if scale != 1.0 {
                    let _ = g.f_mul_scalar_(scale)?;
                }
                let m = self.adam.m.entry(name.clone()).or_insert_with(|| g.zeros_like());
                let _ = m.f_lerp_(&g, 1.0 - c.beta1)?;
                let v = self.adam.v.entry(name.clone()).or_insert_with(|| g.zeros_like());
                let _ = v.f_lerp_(&g.f_square()?, 1.0 - c.beta2)?;
                let mut denom = v.f_sqrt()?;
                let _ = denom.f_div_scalar_(bc2.sqrt())?.f_add_scalar_(c.eps)?.f_mul_scalar_(denom_scale)?;
                let _ = p.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
                let _ = p.f_addcdiv_(m, &denom)?;
                let _ = g.f_zero_()?;
            }
            self.adam.t = t;
            Ok(norm)
        })
    }

    /// The current weights as a BF16 checkpoint with `template`'s layout
    /// (same metadata, tensor order, names and types: BF16 tensors rounded
    /// to nearest-even, F32 tensors exact), as GGUF bytes.
    pub fn export_checkpoint(&self, template: &Checkpoint) -> Result<Vec<u8>, TrainError> {
        export_checkpoint(&self.model, template)
    }
}

/// The model's weights in `template`'s GGUF layout (see
/// [`Trainer::export_checkpoint`]).
pub fn export_checkpoint(model: &ReferenceModel, template: &Checkpoint) -> Result<Vec<u8>, TrainError> {
    let vars = model.var_store().variables();
    let header = template.header();
    let mut w = GgufWriter::new();
    for (k, v) in &header.metadata {
        w.set_meta(k, v.clone());
    }
    tch::no_grad(|| -> Result<(), TrainError> {
        for info in &header.tensors {
            let p = vars.get(&info.name).ok_or_else(|| TrainError::Invalid(format!("model has no {}", info.name)))?;
            let (kind, size) = match info.ty {
                GgmlType::BF16 => (Kind::BFloat16, 2),
                GgmlType::F32 => (Kind::Float, 4),
                other => return Err(TrainError::Invalid(format!("{}: cannot export type {other:?}", info.name))),
            };
            let numel = p.numel();
            if numel as u64 != info.n_elements() {
                return Err(TrainError::Invalid(format!("{}: {numel} elements in the model", info.name)));
            }
            let t = p.f_to_kind(kind)?.f_to_device(Device::Cpu)?.f_contiguous()?;
            let mut buf = vec![0u8; numel * size];
            t.f_copy_data_u8(&mut buf, numel)?;
            w.add_tensor(&info.name, info.ty, &info.dims, buf)?;
        }
        Ok(())
    })?;
    Ok(w.to_bytes()?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tributary_protocol::checkpoint::ModelConfig;

    /// A small random model (GQA: 4 query heads over 2 key/value heads).
    pub(crate) fn model(seed: u64) -> ReferenceModel {
        let dims = ModelConfig {
            n_layer: 2,
            d_model: 32,
            n_head: 4,
            n_head_kv: 2,
            d_ff: 48,
            vocab_size: 64,
            rms_eps: 1e-5,
            rope_theta: 10000.0,
            context_length: 64,
            arch: Default::default(),
            key_length: None,
            qkv_bias: false,
            rope_freqs: false,
        };
        let shapes = tributary_policy::tensor_shapes(&dims, false);
        let mut x = seed | 1;
        ReferenceModel::from_fn(dims, Device::Cpu, |name| {
            let Some((_, shape)) = shapes.iter().find(|(n, _)| n == name) else { return Ok(None) };
            let n = shape.iter().product::<i64>() as usize;
            let norm = name.contains("norm");
            let mut uniform = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            };
            Ok(Some((0..n).map(|_| if norm { 1.0 + 0.2 * uniform() } else { 0.4 * uniform() }).collect()))
        })
        .unwrap()
    }

    /// Two groups sharing their prompts (completion lengths vary), one lone
    /// sample; sampled at T = 0.7 except the lone one (T = 1). Every prompt
    /// starts with the same three tokens (a system prompt's part).
    fn samples() -> Vec<Sample> {
        let mut out = Vec::new();
        let mut x = 99u64;
        let mut next = |m: u64| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for (g, group) in [(0, 4), (1, 3), (2, 1)] {
            let mut prompt: Vec<u32> = vec![5, 9, 2];
            prompt.extend((0..2 + g).map(|_| next(64) as u32));
            for i in 0..group {
                let n = 2 + next(6) as usize;
                let mut tokens = prompt.clone();
                tokens.extend((0..n).map(|_| next(64) as u32));
                let old_logprobs = (0..n).map(|_| -(next(1000) as f32) / 300.0 - 1.0).collect();
                let advantage = [1.0, -0.5, 0.25, -1.2][i % 4];
                out.push(Sample {
                    tokens,
                    prompt_len: prompt.len(),
                    temperature: if g == 2 { 1.0 } else { 0.7 },
                    old_logprobs,
                    advantage,
                    reward: advantage,
                });
            }
        }
        out
    }

    fn grads(tr: &Trainer) -> BTreeMap<String, Tensor> {
        tr.model.var_store().variables().into_iter().map(|(k, v)| (k, v.grad().copy())).collect()
    }

    /// The three layouts (padded, one prompt a micro-batch, packed after the
    /// step's common prefix) give one loss and one gradient, on a batch of
    /// several prompts and on one group alone (its whole prompt but the last
    /// token common); the shared layouts run fewer positions.
    #[test]
    fn every_micro_batch_layout_gives_the_same_loss_and_gradient() {
        let all = samples();
        let one_group: Vec<Sample> = all[..4].to_vec();
        for (batch, prefix) in [(&all, 3), (&one_group, 4)] {
            let cfg = TrainConfig { micro_batch_tokens: 12, ..TrainConfig::default() };
            let run = |share_prompts, pack_prompts| {
                let mut t =
                    Trainer::new(model(7), AdamState::default(), TrainConfig { share_prompts, pack_prompts, ..cfg });
                let st = t.accumulate_gradients(batch).unwrap();
                (st, *t.last_timings(), grads(&t))
            };
            let (b, tb, gb) = run(false, false);
            assert_eq!(tb.shared_prompt_batches, 0);
            assert!(b.loss.abs() > 1e-3, "a non-trivial loss: {}", b.loss);
            for (share, pack) in [(true, false), (true, true)] {
                let (a, ta, ga) = run(share, pack);
                assert!(ta.shared_prompt_batches >= 1, "{ta:?}");
                assert!(ta.positions < tb.positions, "{ta:?} vs {tb:?}");
                assert_eq!(ta.common_prefix, if pack { prefix } else { 0 });
                assert!((a.loss - b.loss).abs() < 1e-6 * (1.0 + b.loss.abs()), "loss {} vs {}", a.loss, b.loss);
                assert!((a.entropy - b.entropy).abs() < 1e-5 * b.entropy, "entropy {} vs {}", a.entropy, b.entropy);
                assert_eq!(ga.len(), gb.len());
                for (name, g) in &gb {
                    let scale = g.abs().max().double_value(&[]);
                    let diff = (&ga[name] - g).abs().max().double_value(&[]);
                    assert!(scale > 0.0, "{name} has no gradient");
                    assert!(
                        diff <= 1e-4 * scale,
                        "share {share} pack {pack}: {name}: gradients differ by {diff} (max {scale})"
                    );
                }
            }
        }
    }

    /// `log_softmax(logits / T)` of each completion token, per sample, by
    /// plain tch ops on one unbatched forward per sample (independent of the
    /// trainer's batching, shared prompts and row gathering).
    fn tempered_logprobs_by_hand(m: &ReferenceModel, s: &Sample, t: f64) -> Tensor {
        let ids: Vec<i64> = s.tokens.iter().map(|&x| i64::from(x)).collect();
        let logits = m.forward(&Tensor::from_slice(&ids).view([1, -1])).unwrap().logits.squeeze_dim(0);
        let rows = logits.narrow(0, s.prompt_len as i64 - 1, s.completion_len() as i64);
        let targets = Tensor::from_slice(&ids[s.prompt_len..]).unsqueeze(1);
        (rows / t).log_softmax(-1, Kind::Float).gather(1, &targets, false).squeeze_dim(1)
    }

    /// The GRPO gradient of rollouts sampled at T = 0.7 is the policy
    /// gradient of softmax(logits / 0.7): with the old log-probs those of
    /// the same weights (on-policy, every ratio 1, nothing clipped), the
    /// loss's gradient is REINFORCE's, `−(1/N) Σ_i A_i Σ_t ∇ log softmax(z_t / T_i)[y_t]`,
    /// computed here by hand and compared parameter by parameter. (Before
    /// the fix the trainer took log-probs at T = 1: ratios far from 1 and
    /// another gradient.)
    #[test]
    fn the_gradient_is_the_policy_gradient_at_the_sampling_temperature() {
        let grpo = crate::grpo::GrpoConfig { entropy_coef: 0.0, ..crate::grpo::GrpoConfig::default() };
        let cfg = TrainConfig { micro_batch_tokens: 12, grpo, ..TrainConfig::default() };
        let reference = model(7);
        let mut batch = samples();
        for s in &mut batch {
            let lp = tch::no_grad(|| tempered_logprobs_by_hand(&reference, s, f64::from(s.temperature)));
            s.old_logprobs = Vec::<f32>::try_from(&lp).unwrap();
        }
        let mut tr = Trainer::new(model(7), AdamState::default(), cfg);
        let st = tr.accumulate_gradients(&batch).unwrap();
        assert!((st.ratio_mean - 1.0).abs() < 1e-5, "on-policy ratios are 1: {}", st.ratio_mean);

        let n: usize = batch.iter().map(Sample::completion_len).sum();
        let mut loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for s in &batch {
            let lp = tempered_logprobs_by_hand(&reference, s, f64::from(s.temperature));
            loss -= lp.sum(Kind::Float) * f64::from(s.advantage) / n as f64;
        }
        loss.backward();
        let got = grads(&tr);
        let mut compared = 0;
        for (name, want) in grads_of(&reference) {
            let scale = want.abs().max().double_value(&[]);
            let diff = (&got[&name] - &want).abs().max().double_value(&[]);
            assert!(scale > 0.0, "{name} has no gradient");
            assert!(
                diff <= 1e-4 * scale,
                "{name}: the trainer's gradient differs from PyTorch's at T by {diff} (max {scale})"
            );
            compared += 1;
        }
        assert!(compared >= 10, "{compared} parameters");

        // The test can fail: the gradient at T = 1 is another one.
        let at_one: Vec<Sample> = batch.iter().map(|s| Sample { temperature: 1.0, ..s.clone() }).collect();
        let mut tr1 = Trainer::new(model(7), AdamState::default(), cfg);
        tr1.accumulate_gradients(&at_one).unwrap();
        let g1 = grads(&tr1);
        let far = got.iter().any(|(name, g)| {
            let scale = g.abs().max().double_value(&[]);
            (&g1[name] - g).abs().max().double_value(&[]) > 1e-2 * scale
        });
        assert!(far, "the gradient at T = 1 should differ");
    }

    fn grads_of(m: &ReferenceModel) -> BTreeMap<String, Tensor> {
        m.var_store().variables().into_iter().map(|(k, v)| (k, v.grad().copy())).collect()
    }

    /// The proof's old log-probs ([`tempered_old_logprobs`] of the evidence)
    /// are `log_softmax(logits / T)` of the sampled tokens.
    #[test]
    fn the_proofs_old_logprobs_are_of_the_sampling_distribution() {
        let m = model(3);
        for s in samples() {
            let req = tributary_policy::EvidenceRequest {
                tokens: &s.tokens,
                prompt_len: s.prompt_len,
                temperature: s.temperature,
                eos: 0,
                hidden_positions: &[],
            };
            let ev = m.evidence(&[req]).unwrap().remove(0);
            let got = tempered_old_logprobs(s.temperature, &ev.logprob, &ev.prob_temp);
            let want = tch::no_grad(|| tempered_logprobs_by_hand(&m, &s, f64::from(s.temperature)));
            let want = Vec::<f32>::try_from(&want).unwrap();
            assert_eq!(got.len(), want.len());
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "T={}: {a} vs {b}", s.temperature);
            }
        }
        // Greedy rollouts keep the raw log-probs.
        assert_eq!(tempered_old_logprobs(0.0, &[-0.5, -1.5], &[1.0, 0.0]), vec![-0.5, -1.5]);
        assert_eq!(gradient_temperature(0.0), 1.0);
        assert_eq!(gradient_temperature(0.7), 0.7);
    }

    #[test]
    fn micro_batches_respect_the_token_budget_and_keep_every_sample() {
        let batch = samples();
        for (share, pack) in [(true, true), (true, false), (false, false)] {
            let plan = plan_micro_batches(&batch, 12, share, pack);
            let n: usize = plan.iter().map(|m| m.samples.len()).sum();
            assert_eq!(n, batch.len());
            for m in &plan {
                let tokens: usize = m.samples.iter().map(|s| s.completion_len()).sum();
                assert!(tokens <= 12 || m.samples.len() == 1, "{tokens} tokens in {} samples", m.samples.len());
                match m.layout {
                    Layout::SharedPrompt => {
                        assert!(m.samples.len() >= 2);
                        let p = &m.samples[0].tokens[..m.samples[0].prompt_len];
                        assert!(m.samples.iter().all(|s| &s.tokens[..s.prompt_len] == p));
                    }
                    Layout::Packed => {
                        // A prompt's samples in one micro-batch are adjacent.
                        let prompts: Vec<&[u32]> = m.samples.iter().map(|s| &s.tokens[..s.prompt_len]).collect();
                        for (i, p) in prompts.iter().enumerate() {
                            if let Some(j) = prompts[..i].iter().rposition(|q| q == p) {
                                assert!(prompts[j..i].iter().all(|q| q == p), "split runs of one prompt");
                            }
                        }
                    }
                    Layout::Padded => {}
                }
            }
            assert_eq!(plan.iter().all(|m| m.layout == Layout::Packed), pack);
            assert_eq!(plan.iter().any(|m| m.layout == Layout::SharedPrompt), share && !pack);
        }
    }
}
