//! The GRPO objective (grail's decentralised-GRPO recipe, pure `tch`).
//!
//! For sequence `i` with completion length `L_i`, advantage `A_i`, current
//! log-probs `ℓ_{i,t}` and the miner-reported ("old") log-probs `ℓᵒ_{i,t}`:
//!
//! - GSPO sequence ratio: `ρ_i = min(exp(clamp(Σ_t (ℓ − ℓᵒ) / L_i, ±c)), ρ_max)`;
//! - asymmetric clip: `ρ̂_i = clip(ρ_i, 1 − ε_lo, 1 + ε_hi)`;
//! - INTELLECT-2's extra cap for negative advantages: `ρ'_i = min(ρ_i, δ)`
//!   when `A_i < 0`, else `ρ_i`;
//! - per-sequence loss `−min(ρ'_i·A_i, ρ̂_i·A_i)`, broadcast over the
//!   sequence's tokens;
//! - DAPO token-level normalisation: the sum over all completion tokens
//!   divided by the batch's total completion tokens `N` (so micro-batches
//!   add up to the full-batch loss when each is divided by the same `N`);
//! - entropy bonus `−c_H · mean_i mean_t H_{i,t}` (each micro-batch weighted
//!   by its share of the batch's sequences);
//!
//! No KL term: the trainer keeps no frozen reference model, so a KL
//! coefficient could only do nothing (the `kl_beta` key of `trainer.toml` is
//! gone, and a configuration that sets it is refused). Log-probs are of the
//! sampling distribution `softmax(logits / T)` (`crate::train`).
//!
//! Tensors are *flat over tokens*: element `k` of `logp` is a completion
//! token of sequence `seq[k]`; no padding is involved.

use tch::{Kind, Tensor};

/// Hyperparameters of the objective.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GrpoConfig {
    /// Lower clip `ε_lo` (ratio floor `1 − ε_lo`).
    pub clip_low: f64,
    /// Upper clip `ε_hi` (ratio ceiling `1 + ε_hi`).
    pub clip_high: f64,
    /// Cap `δ` on the ratio for negative advantages (INTELLECT-2).
    pub neg_ratio_cap: f64,
    /// Clamp `c` on the length-normalised log-ratio.
    pub logratio_clamp: f64,
    /// Cap `ρ_max` on the importance ratio.
    pub ratio_max: f64,
    /// Entropy bonus coefficient `c_H`.
    pub entropy_coef: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            neg_ratio_cap: 4.0,
            logratio_clamp: 5.0,
            ratio_max: 10.0,
            entropy_coef: 0.001,
        }
    }
}

/// One micro-batch's inputs, flat over completion tokens.
#[derive(Debug)]
pub struct LossInputs<'a> {
    /// Current-policy log-probs `[N_mb]` (differentiable).
    pub logp: &'a Tensor,
    /// Miner-reported log-probs `[N_mb]`.
    pub old_logp: &'a Tensor,
    /// Sequence index of each token `[N_mb]` (Int64, `0..B`).
    pub seq: &'a Tensor,
    /// Completion length of each sequence `[B]` (float).
    pub lens: &'a Tensor,
    /// Advantage of each sequence `[B]`.
    pub adv: &'a Tensor,
    /// Per-token entropy `[N_mb]`, when the bonus is on.
    pub entropy: Option<&'a Tensor>,
    /// Total completion tokens of the whole batch (all micro-batches).
    pub total_tokens: f64,
    /// Total sequences of the whole batch (all micro-batches).
    pub total_seqs: f64,
}

/// The loss and its diagnostics for one micro-batch.
#[derive(Debug)]
pub struct LossOutput {
    /// Total loss (scalar, differentiable).
    pub loss: Tensor,
    /// Policy-gradient part (scalar).
    pub pg: f64,
    /// Entropy part's mean entropy over this micro-batch's sequences.
    pub entropy_sum: f64,
    /// Sum over sequences of the ratio `ρ_i`.
    pub ratio_sum: f64,
    /// Sequences whose objective was clipped at `1 − ε_lo` (A < 0).
    pub clipped_low: usize,
    /// Sequences whose objective was clipped at `1 + ε_hi` (A > 0).
    pub clipped_high: usize,
    /// Sequences whose ratio hit the `δ` cap (A < 0).
    pub capped: usize,
    /// Sequences in the micro-batch.
    pub seqs: usize,
}

/// Per-sequence sums of flat token values.
fn per_seq_sum(values: &Tensor, seq: &Tensor, b: i64) -> Result<Tensor, tch::TchError> {
    Tensor::f_zeros([b], (values.kind(), values.device()))?.f_index_add(0, seq, values)
}

/// Computes the GRPO loss of one micro-batch (see the module docs).
pub fn grpo_loss(cfg: &GrpoConfig, x: &LossInputs<'_>) -> Result<LossOutput, tch::TchError> {
    let b = x.lens.size().first().copied().unwrap_or(0);
    let kind = x.logp.kind();
    let lens = x.lens.f_to_kind(kind)?;
    let adv = x.adv.f_to_kind(kind)?;
    let logratio = x.logp.f_sub(&x.old_logp.f_to_kind(kind)?)?;
    let mean_lr = per_seq_sum(&logratio, x.seq, b)?.f_div(&lens.f_clamp_min(1.0)?)?;
    let mean_lr = mean_lr.f_clamp(-cfg.logratio_clamp, cfg.logratio_clamp)?;
    let ratio = mean_lr.f_exp()?.f_clamp_max(cfg.ratio_max)?;
    let clipped = ratio.f_clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)?;
    let neg = adv.f_lt(0.0)?;
    let capped_ratio = ratio.f_where_self(&neg.f_logical_not()?, &ratio.f_clamp_max(cfg.neg_ratio_cap)?)?;
    let obj = capped_ratio.f_mul(&adv)?.f_minimum(&clipped.f_mul(&adv)?)?;
    // Σ_{i,t} −obj_i / N = Σ_i −obj_i · L_i / N.
    let pg = obj.f_mul(&lens)?.f_sum(kind)?.f_neg()?.f_div_scalar(x.total_tokens.max(1.0))?;
    let mut loss = pg.shallow_clone();

    let mut entropy_sum = 0.0;
    if let Some(h) = x.entropy {
        let per_seq = per_seq_sum(&h.f_to_kind(kind)?, x.seq, b)?.f_div(&lens.f_clamp_min(1.0)?)?;
        let s = per_seq.f_sum(kind)?;
        entropy_sum = s.f_double_value(&[])?;
        if cfg.entropy_coef != 0.0 {
            loss = loss.f_sub(&s.f_mul_scalar(cfg.entropy_coef / x.total_seqs.max(1.0))?)?;
        }
    }

    let count = |t: Tensor| -> Result<usize, tch::TchError> { Ok(t.f_sum(Kind::Int64)?.f_int64_value(&[])? as usize) };
    let (ratio_d, adv_d) = (ratio.f_detach()?, adv.f_detach()?);
    let pos = adv_d.f_gt(0.0)?;
    Ok(LossOutput {
        pg: pg.f_double_value(&[])?,
        entropy_sum,
        ratio_sum: ratio_d.f_sum(Kind::Double)?.f_double_value(&[])?,
        clipped_low: count(ratio_d.f_lt(1.0 - cfg.clip_low)?.f_logical_and(&neg)?)?,
        clipped_high: count(ratio_d.f_gt(1.0 + cfg.clip_high)?.f_logical_and(&pos)?)?,
        capped: count(ratio_d.f_gt(cfg.neg_ratio_cap)?.f_logical_and(&neg)?)?,
        seqs: b as usize,
        loss,
    })
}

/// Group-relative advantages: `(r − mean) / max(std, eps)` with the
/// population standard deviation.
pub fn group_advantages(rewards: &[f32], eps: f64) -> Vec<f32> {
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / n;
    let var = rewards.iter().map(|&r| (f64::from(r) - mean).powi(2)).sum::<f64>() / n;
    let std = var.sqrt().max(eps);
    rewards.iter().map(|&r| ((f64::from(r) - mean) / std) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_slice(v)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * (1.0 + b.abs())
    }

    /// Five sequences exercising every branch, with the numbers worked out by
    /// hand (values of e^x to 1e-12):
    ///
    /// | i | A    | L | ℓ − ℓᵒ          | mean  | ρ = e^mean     | branch            | −obj      |
    /// |---|------|---|-----------------|-------|----------------|-------------------|-----------|
    /// | 0 | +1   | 2 | 0.1, 0.3        | 0.2   | 1.221402758160 | unclipped         | −1.221402758160 |
    /// | 1 | +1   | 1 | 0.5             | 0.5   | 1.648721270700 | clipped at 1.28   | −1.28     |
    /// | 2 | −1   | 2 | −0.5, −0.3      | −0.4  | 0.670320046036 | clipped at 0.8    | +0.8      |
    /// | 3 | −1   | 1 | 2.0             | 2.0   | 7.389056098931 | δ cap at 4        | +4        |
    /// | 4 | −0.5 | 3 | 0, 0.3, 0       | 0.1   | 1.105170918076 | unclipped         | +0.552585459038 |
    ///
    /// N = 9 tokens; pg = Σ L_i·(−obj_i) / N
    ///   = (−2.442805516320 − 1.28 + 1.6 + 4 + 1.657756377114) / 9 = 0.392772317866.
    /// Gradient w.r.t. ℓ_{i,t}: −A_i·ρ_i / N on unclipped, uncapped sequences,
    /// 0 elsewhere: seq 0 → −0.135711417573, seq 4 → +0.061398384338.
    #[test]
    fn loss_matches_hand_computation() {
        let old = [0.0; 9];
        let diffs = [0.1, 0.3, 0.5, -0.5, -0.3, 2.0, 0.0, 0.3, 0.0];
        let seq = Tensor::from_slice(&[0i64, 0, 1, 2, 2, 3, 4, 4, 4]);
        let logp = t(&diffs).set_requires_grad(true);
        let x = LossInputs {
            logp: &logp,
            old_logp: &t(&old),
            seq: &seq,
            lens: &t(&[2.0, 1.0, 2.0, 1.0, 3.0]),
            adv: &t(&[1.0, 1.0, -1.0, -1.0, -0.5]),
            entropy: None,
            total_tokens: 9.0,
            total_seqs: 5.0,
        };
        let out = grpo_loss(&GrpoConfig::default(), &x).unwrap();
        let loss = out.loss.double_value(&[]);
        assert!(close(loss, 0.392772317866), "loss {loss}");
        assert!(close(out.pg, 0.392772317866));
        assert_eq!((out.clipped_low, out.clipped_high, out.capped, out.seqs), (1, 1, 1, 5));
        let ratio_sum = 1.221402758160 + 1.648721270700 + 0.670320046036 + 7.389056098931 + 1.105170918076;
        assert!((out.ratio_sum - ratio_sum).abs() < 1e-9);
        out.loss.backward();
        let g: Vec<f64> = Vec::try_from(&logp.grad()).unwrap();
        let (g0, g4) = (-0.135711417573, 0.061398384338);
        let want = [g0, g0, 0.0, 0.0, 0.0, 0.0, g4, g4, g4];
        for (k, (a, b)) in g.iter().zip(want).enumerate() {
            assert!((a - b).abs() < 1e-9, "grad[{k}] = {a}, want {b}");
        }
    }

    #[test]
    fn without_delta_cap_the_negative_ratio_is_unbounded() {
        // Sequence 3 alone, δ effectively off: loss = e^2 · 1 / 1.
        let logp = t(&[2.0]).set_requires_grad(true);
        let x = LossInputs {
            logp: &logp,
            old_logp: &t(&[0.0]),
            seq: &Tensor::from_slice(&[0i64]),
            lens: &t(&[1.0]),
            adv: &t(&[-1.0]),
            entropy: None,
            total_tokens: 1.0,
            total_seqs: 1.0,
        };
        let cfg = GrpoConfig { neg_ratio_cap: f64::INFINITY, ..GrpoConfig::default() };
        let out = grpo_loss(&cfg, &x).unwrap();
        assert!(close(out.loss.double_value(&[]), 7.389056098931));
        assert_eq!(out.capped, 0);
        // The log-ratio clamp (±5) and the ratio cap (10) still bound it.
        let big = t(&[8.0]);
        let x2 = LossInputs { logp: &big, ..x };
        assert!(close(grpo_loss(&cfg, &x2).unwrap().loss.double_value(&[]), 10.0));
    }

    #[test]
    fn token_normalisation_is_over_the_whole_batch_and_micro_batches_add_up() {
        // Two sequences in one batch vs. split in two micro-batches with the
        // same N: losses add up.
        let cfg = GrpoConfig { entropy_coef: 0.01, ..GrpoConfig::default() };
        let ent = t(&[1.0, 2.0, 3.0]);
        let full = LossInputs {
            logp: &t(&[0.05, -0.02, 0.1]),
            old_logp: &t(&[0.0, 0.0, 0.0]),
            seq: &Tensor::from_slice(&[0i64, 0, 1]),
            lens: &t(&[2.0, 1.0]),
            adv: &t(&[0.7, -0.3]),
            entropy: Some(&ent),
            total_tokens: 3.0,
            total_seqs: 2.0,
        };
        let whole = grpo_loss(&cfg, &full).unwrap().loss.double_value(&[]);
        let (e1, e2) = (t(&[1.0, 2.0]), t(&[3.0]));
        let a = LossInputs {
            logp: &t(&[0.05, -0.02]),
            old_logp: &t(&[0.0, 0.0]),
            seq: &Tensor::from_slice(&[0i64, 0]),
            lens: &t(&[2.0]),
            adv: &t(&[0.7]),
            entropy: Some(&e1),
            ..full
        };
        let b = LossInputs {
            logp: &t(&[0.1]),
            old_logp: &t(&[0.0]),
            seq: &Tensor::from_slice(&[0i64]),
            lens: &t(&[1.0]),
            adv: &t(&[-0.3]),
            entropy: Some(&e2),
            ..full
        };
        let parts =
            grpo_loss(&cfg, &a).unwrap().loss.double_value(&[]) + grpo_loss(&cfg, &b).unwrap().loss.double_value(&[]);
        assert!(close(whole, parts), "{whole} vs {parts}");
        // By hand: ρ0 = e^0.015 (unclipped), ρ1 = e^0.1 (A<0, unclipped):
        // pg = (−0.7·e^0.015·2 + 0.3·e^0.1·1)/3; entropy mean = (1.5 + 3)/2.
        let pg = (-0.7 * 0.015f64.exp() * 2.0 + 0.3 * 0.1f64.exp()) / 3.0;
        assert!(close(whole, pg - 0.01 * 2.25), "{whole}");
        let _ = Device::Cpu;
    }

    #[test]
    fn advantages_are_z_scores() {
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], 1e-8);
        assert_eq!(a, vec![1.0, -1.0, -1.0, 1.0]);
        let a = group_advantages(&[3.0, 0.0, 0.0], 1e-8);
        // mean 1, population std sqrt(2).
        let s = 2f64.sqrt();
        assert!((f64::from(a[0]) - 2.0 / s).abs() < 1e-6 && (f64::from(a[1]) + 1.0 / s).abs() < 1e-6);
        assert_eq!(group_advantages(&[0.5, 0.5], 1e-8), vec![0.0, 0.0]);
    }
}
