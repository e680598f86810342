//! The training step: FP32 master weights in the reference model's VarStore,
//! the GRPO loss over micro-batches, global-norm gradient clipping, AdamW,
//! and export of the BF16 checkpoint.

use std::collections::BTreeMap;

use tch::{Device, Kind, Tensor};
use tributary_policy::{PolicyError, ReferenceModel, pad_batch};
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
    /// The objective.
    pub grpo: GrpoConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            lr: 1e-6,
            warmup_steps: 10,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            micro_batch_tokens: 512,
            grpo: GrpoConfig::default(),
        }
    }
}

/// One training sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Prompt then completion tokens.
    pub tokens: Vec<u32>,
    /// Prompt length (≥ 1).
    pub prompt_len: usize,
    /// Miner-reported log-prob of each completion token.
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
                g.rollouts.iter().zip(&g.advantages).map(|(r, &a)| Sample {
                    tokens: r.tokens.clone(),
                    prompt_len: r.prompt_len as usize,
                    old_logprobs: r.logprobs.clone(),
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
    /// KL part.
    pub kl: f64,
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
    /// Emits the figures as `metrics` gauges (`trainer_*`).
    pub fn record_metrics(&self) {
        for (name, v) in [
            ("trainer_step", self.step as f64),
            ("trainer_lr", self.lr),
            ("trainer_loss", self.loss),
            ("trainer_pg_loss", self.pg_loss),
            ("trainer_kl", self.kl),
            ("trainer_entropy", self.entropy),
            ("trainer_ratio_mean", self.ratio_mean),
            ("trainer_clip_low_fraction", self.clip_low_frac),
            ("trainer_clip_high_fraction", self.clip_high_frac),
            ("trainer_delta_cap_fraction", self.cap_frac),
            ("trainer_grad_norm", self.grad_norm),
            ("trainer_reward_mean", self.reward_mean),
            ("trainer_reward_std", self.reward_std),
            ("trainer_batch_sequences", self.seqs as f64),
            ("trainer_batch_tokens", self.tokens as f64),
        ] {
            metrics::gauge!(name).set(v);
        }
    }
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
}

impl Trainer {
    /// Starts from a checkpoint (its BF16 values become the FP32 masters).
    pub fn from_checkpoint(ckpt: &Checkpoint, device: Device, cfg: TrainConfig) -> Result<Self, TrainError> {
        Ok(Self::new(ReferenceModel::load(ckpt, device)?, AdamState::default(), cfg))
    }

    /// Wraps a model and optimiser state (e.g. restored from disk).
    pub fn new(model: ReferenceModel, adam: AdamState, cfg: TrainConfig) -> Self {
        Trainer { model, adam, cfg }
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

    /// Optimiser steps taken.
    pub fn steps(&self) -> u64 {
        self.adam.t
    }

    /// Learning rate of step `t` (1-based): linear warm-up, then constant.
    pub fn lr_at(&self, t: u64) -> f64 {
        let w = self.cfg.warmup_steps.max(1);
        self.cfg.lr * (t.min(w) as f64 / w as f64)
    }

    /// Completion-token log-probs and entropies under the current weights,
    /// flat over tokens, for a micro-batch (differentiable).
    fn token_logprobs(&self, batch: &[&Sample]) -> Result<(Tensor, Tensor, Tensor), TrainError> {
        let device = self.model.device();
        let vocab = self.model.dims().vocab_size;
        let seqs: Vec<&[u32]> = batch.iter().map(|s| s.tokens.as_slice()).collect();
        let (tokens, _) = pad_batch(&seqs, vocab, 0, device)?;
        let l = tokens.size()[1];
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        let mut seq_of = Vec::new();
        for (i, s) in batch.iter().enumerate() {
            for p in s.prompt_len..s.tokens.len() {
                rows.push(i as i64 * l + p as i64 - 1);
                targets.push(i64::from(s.tokens[p]));
                seq_of.push(i as i64);
            }
        }
        let hidden = self.model.forward_hidden(&tokens)?;
        let d = hidden.size()[2];
        let rows = Tensor::f_from_slice(&rows)?.f_to_device(device)?;
        let h = hidden.f_reshape([-1, d])?.f_index_select(0, &rows)?;
        let logits = self.model.lm_head(&h)?;
        let logp_all = logits.f_log_softmax(-1, Kind::Float)?;
        let targets = Tensor::f_from_slice(&targets)?.f_to_device(device)?;
        let logp = logp_all.f_gather(1, &targets.f_unsqueeze(1)?, false)?.f_squeeze_dim(1)?;
        let entropy = logp_all.f_exp()?.f_mul(&logp_all)?.f_sum_dim_intlist(-1, false, Kind::Float)?.f_neg()?;
        let seq = Tensor::f_from_slice(&seq_of)?.f_to_device(device)?;
        Ok((logp, entropy, seq))
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
        if samples.is_empty() {
            return Err(TrainError::Invalid("empty batch".into()));
        }
        self.check(samples)?;
        let device = self.model.device();
        let total_tokens: usize = samples.iter().map(Sample::completion_len).sum();
        let total_seqs = samples.len();
        // Similar lengths together: less padding.
        let mut order: Vec<&Sample> = samples.iter().collect();
        order.sort_by_key(|s| s.tokens.len());
        let mut micro: Vec<Vec<&Sample>> = vec![Vec::new()];
        let mut used = 0;
        for s in order {
            let n = s.completion_len();
            if used + n > self.cfg.micro_batch_tokens && !micro.last().is_some_and(Vec::is_empty) {
                micro.push(Vec::new());
                used = 0;
            }
            used += n;
            if let Some(m) = micro.last_mut() {
                m.push(s);
            }
        }

        let mut st = StepStats { seqs: total_seqs, tokens: total_tokens, ..StepStats::default() };
        let (mut clip_lo, mut clip_hi, mut capped) = (0usize, 0usize, 0usize);
        for mb in &micro {
            let (logp, entropy, seq) = self.token_logprobs(mb)?;
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
                    ref_logp: None,
                    total_tokens: total_tokens as f64,
                    total_seqs: total_seqs as f64,
                },
            )?;
            out.loss.f_backward()?;
            st.loss += out.loss.f_double_value(&[])?;
            st.pg_loss += out.pg;
            st.kl += out.kl;
            st.entropy += out.entropy_sum;
            st.ratio_mean += out.ratio_sum;
            clip_lo += out.clipped_low;
            clip_hi += out.clipped_high;
            capped += out.capped;
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

        let t = self.adam.t + 1;
        st.lr = self.lr_at(t);
        st.grad_norm = self.apply_adamw(t, st.lr)?;
        st.step = t;
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
                    sq += g.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
                }
            }
            let norm = sq.sqrt();
            let scale = if c.grad_clip > 0.0 && norm > c.grad_clip { c.grad_clip / (norm + 1e-6) } else { 1.0 };
            let (bc1, bc2) = (1.0 - c.beta1.powi(t as i32), 1.0 - c.beta2.powi(t as i32));
            for (name, p) in &mut vars {
                let mut g = p.grad();
                if !g.defined() {
                    continue;
                }
                if scale != 1.0 {
                    let _ = g.f_mul_scalar_(scale)?;
                }
                let m = self.adam.m.entry(name.clone()).or_insert_with(|| g.zeros_like());
                let _ = m.f_mul_scalar_(c.beta1)?.f_add_(&g.f_mul_scalar(1.0 - c.beta1)?)?;
                let v = self.adam.v.entry(name.clone()).or_insert_with(|| g.zeros_like());
                let _ = v.f_mul_scalar_(c.beta2)?.f_add_(&g.f_square()?.f_mul_scalar(1.0 - c.beta2)?)?;
                let denom = v.f_div_scalar(bc2)?.f_sqrt()?.f_add_scalar(c.eps)?;
                let update = m.f_div(&denom)?.f_mul_scalar(lr / bc1)?;
                let _ = p.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
                let _ = p.f_sub_(&update)?;
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
