//! Per-position evidence for verifying rollouts: one batched forward on the
//! device, reductions over the vocabulary on the device, and only small
//! per-position figures (plus the hidden rows) transferred back.
//!
//! Alignment: completion token `tokens[p]` (`p >= prompt_len`) is predicted
//! by the model at position `p - 1`, so its figures come from the logits of
//! row `p - 1` — the row llama.cpp returns together with the logits it
//! sampled `tokens[p]` from. Hidden states are returned for the absolute
//! positions the caller asks for (`h[p]` = the state after token `p`).
//!
//! The figures follow `tributary_protocol::sampling` (weights
//! `exp((l − max)/T)` in f64, token-id order; a temperature that is not a
//! finite positive number means greedy: the first argmax owns `[0, 1)`).

use tch::{Device, Kind, Tensor};
use tributary_protocol::sampling::{self, Draw};

use crate::PolicyError;
use crate::model::{ReferenceModel, pad_batch};
use crate::packed::{MIN_SHARED_PREFIX, PackedLayout, PrefixCache, packing_pays};

/// Rows of logits reduced at once (bounds the f64 `[rows, vocab]` buffers).
const LOGIT_CHUNK_ROWS: i64 = 128;

/// What to compute for one rollout.
#[derive(Debug, Clone, Copy)]
pub struct EvidenceRequest<'a> {
    /// Prompt followed by completion.
    pub tokens: &'a [u32],
    /// Number of prompt tokens (at least 1, less than `tokens.len()`).
    pub prompt_len: usize,
    /// Sampling temperature the rollout claims (greedy when not finite positive).
    pub temperature: f32,
    /// End-of-sequence token whose probability at the last position is reported.
    pub eos: u32,
    /// Absolute positions (`< tokens.len()`) whose hidden state to return.
    pub hidden_positions: &'a [usize],
}

/// Evidence for one rollout, one entry per completion token (index `j` is
/// token `tokens[prompt_len + j]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceEvidence {
    /// Width of each hidden row.
    pub d_model: usize,
    /// Post-norm hidden states at the requested `hidden_positions`, row-major
    /// `[hidden_positions.len(), d_model]`.
    pub hidden: Vec<f32>,
    /// Raw (T = 1) log-probability of the chosen token.
    pub logprob: Vec<f64>,
    /// Probability of the chosen token at T = 1.
    pub prob_t1: Vec<f64>,
    /// Probability of the chosen token under `softmax(logits / T)` (greedy:
    /// 1 for the argmax, else 0).
    pub prob_temp: Vec<f64>,
    /// Lower end of the chosen token's CDF interval under `softmax(logits / T)`
    /// with tokens in id order: the total probability of ids `< token`.
    pub cdf_lo: Vec<f64>,
    /// Upper end: the total probability of ids `<= token`.
    pub cdf_hi: Vec<f64>,
    /// Probability (T = 1) that the last position's token is `eos`, from the
    /// distribution that produced the last token.
    pub eos_prob_last: f64,
    /// The token the reference's own logits draw at each position's seeded
    /// `u`, with its interval ([`ReferenceModel::evidence_drawn`]; empty when
    /// no draws were given).
    pub drawn: Vec<Draw>,
}

impl SequenceEvidence {
    /// Number of completion tokens covered (not hidden rows).
    pub fn len(&self) -> usize {
        self.logprob.len()
    }

    /// The per-position figures the protocol's checks take.
    pub fn positions(&self) -> Vec<tributary_protocol::verify::PositionEvidence> {
        (0..self.len())
            .map(|j| tributary_protocol::verify::PositionEvidence {
                logprob_t1: self.logprob[j] as f32,
                prob_t1: self.prob_t1[j] as f32,
                prob_sampling: self.prob_temp[j] as f32,
                cdf_lo: self.cdf_lo[j],
                cdf_hi: self.cdf_hi[j],
                drawn: self.drawn.get(j).copied(),
            })
            .collect()
    }

    /// Whether there are no completion tokens.
    pub fn is_empty(&self) -> bool {
        self.logprob.is_empty()
    }

    /// The `i`-th requested hidden row.
    pub fn hidden_row(&self, i: usize) -> Option<&[f32]> {
        self.hidden.get(i * self.d_model..(i + 1) * self.d_model)
    }
}

impl ReferenceModel {
    /// Computes the evidence for a batch of rollouts in one right-padded
    /// forward pass (no gradients). Token ids are checked against the
    /// vocabulary and request fields validated before anything is indexed.
    pub fn evidence(&self, reqs: &[EvidenceRequest<'_>]) -> Result<Vec<SequenceEvidence>, PolicyError> {
        self.evidence_drawn(reqs, &[])
    }

    /// [`ReferenceModel::evidence`], plus the token the reference's logits
    /// draw ([`sampling::sample_inverse_cdf`]) at each completion position:
    /// `draws[i][j]` is the seeded `u` of request `i`'s completion token `j`
    /// (`draws` empty: none computed, [`SequenceEvidence::drawn`] empty).
    /// What bounds the tokens one ambiguous position admits
    /// ([`sampling::check_draw_bounded`]).
    pub fn evidence_drawn(
        &self,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        self.evidence_drawn_after(None, reqs, draws)
    }

    /// [`ReferenceModel::evidence_drawn_after`] the prefix kept in `cache`
    /// for the first request's prompt ([`ReferenceModel::prefix_for`] with
    /// [`MIN_SHARED_PREFIX`]): successive groups that share a system prompt
    /// run it once. `cache` must hold this model's keys and values or `None`.
    pub fn evidence_after_kept_prefix(
        &self,
        cache: &mut Option<PrefixCache>,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        let prefix = match reqs.first().and_then(|r| r.tokens.get(..r.prompt_len)) {
            Some(prompt) => Some(self.prefix_for(cache, prompt, MIN_SHARED_PREFIX)?),
            None => None,
        };
        self.evidence_drawn_after(prefix, reqs, draws)
    }

    /// [`ReferenceModel::evidence_drawn`] after a prompt prefix whose keys
    /// and values are already computed: when every request starts with
    /// `prefix`'s tokens, keeps at least one prompt token past it, asks for
    /// no hidden state inside it, and the packed row costs less
    /// ([`packing_pays`]: short completions), the requests run as one
    /// packed row after it ([`PackedLayout`]: no padding, each prompt's rest
    /// once); otherwise (or with `None`) as [`ReferenceModel::evidence_drawn`]
    /// does. The same figures up to rounding either way.
    pub fn evidence_drawn_after(
        &self,
        prefix: Option<&PrefixCache>,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        let vocab = self.dims().vocab_size;
        if !draws.is_empty() {
            if draws.len() != reqs.len() {
                return Err(PolicyError::Request(format!("{} draw lists for {} requests", draws.len(), reqs.len())));
            }
            if let Some((r, d)) = reqs.iter().zip(draws).find(|(r, d)| d.len() != r.tokens.len() - r.prompt_len) {
                return Err(PolicyError::Request(format!(
                    "{} draws for {} completion tokens",
                    d.len(),
                    r.tokens.len().saturating_sub(r.prompt_len)
                )));
            }
        }
        for r in reqs {
            if r.prompt_len == 0 || r.prompt_len >= r.tokens.len() {
                return Err(PolicyError::Request(format!(
                    "prompt_len {} must be in 1..{}",
                    r.prompt_len,
                    r.tokens.len()
                )));
            }
            if let Some(&p) = r.hidden_positions.iter().find(|&&p| p >= r.tokens.len()) {
                return Err(PolicyError::Request(format!("hidden position {p} beyond {} tokens", r.tokens.len())));
            }
            if r.eos as usize >= vocab {
                return Err(PolicyError::TokenOutOfRange { id: i64::from(r.eos), index: None, vocab });
            }
        }
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let prefix = prefix.filter(|c| {
            !c.is_empty()
                && reqs.iter().all(|r| {
                    r.tokens.starts_with(c.tokens())
                        && c.len() < r.prompt_len
                        && r.hidden_positions.iter().all(|&p| p >= c.len())
                })
                && packing_pays(
                    self.dims(),
                    &reqs.iter().map(|r| (r.tokens, r.prompt_len)).collect::<Vec<_>>(),
                    c.len(),
                )
        });
        tch::no_grad(|| self.evidence_inner(prefix, reqs, draws))
    }

    fn evidence_inner(
        &self,
        prefix: Option<&PrefixCache>,
        reqs: &[EvidenceRequest<'_>],
        draws: &[&[f64]],
    ) -> Result<Vec<SequenceEvidence>, PolicyError> {
        let device = self.device();
        let d = self.dims().d_model;
        let vocab = self.dims().vocab_size;
        // After a computed prefix, one packed row; rollouts of one prompt (a
        // group) run the prompt once; otherwise one right-padded batch.
        // `hidden` is flat `[rows, d]`; `at(i, p)` is the row of request i's
        // absolute position p.
        let prompt = &reqs[0].tokens[..reqs[0].prompt_len];
        let shared = reqs.len() > 1 && reqs.iter().all(|r| r.tokens.get(..r.prompt_len) == Some(prompt));
        let (hidden, at): (Tensor, Box<dyn Fn(usize, usize) -> i64>) = if let Some(c) = prefix {
            let seqs: Vec<(&[u32], usize)> = reqs.iter().map(|r| (r.tokens, r.prompt_len)).collect();
            let layout = PackedLayout::build(&seqs, c.len(), true)?;
            let hidden = self.forward_layout(c.kv(), &layout)?;
            // Every position from the prefix's end on has a row (checked above).
            (hidden, Box::new(move |i: usize, p: usize| layout.row(i, p).unwrap_or(0)))
        } else if shared {
            let plen = prompt.len();
            let conts: Vec<&[u32]> = reqs.iter().map(|r| &r.tokens[plen..]).collect();
            let (pre, _) = pad_batch(&[prompt], vocab, 0, device)?;
            let (cont, _) = pad_batch(&conts, vocab, 0, device)?;
            let s = cont.size()[1];
            let (hp, hs) = self.forward_hidden_shared_prefix(&pre, &cont)?;
            let hidden = Tensor::f_cat(&[hp.f_view([-1, d as i64])?, hs.f_view([-1, d as i64])?], 0)?;
            let at = move |i: usize, p: usize| {
                if p < plen { p as i64 } else { (plen + i * s as usize + (p - plen)) as i64 }
            };
            (hidden, Box::new(at))
        } else {
            let seqs: Vec<&[u32]> = reqs.iter().map(|r| r.tokens).collect();
            let (batch, _) = pad_batch(&seqs, vocab, 0, device)?;
            let l = batch.size()[1] as usize;
            (
                self.forward_hidden(&batch)?.f_view([-1, d as i64])?,
                Box::new(move |i: usize, p: usize| (i * l + p) as i64),
            )
        };

        // Flat row index of every predicting position, the chosen tokens,
        // per-row temperatures (0 = greedy) and EOS ids, in request order.
        let mut rows = Vec::new();
        let mut chosen = Vec::new();
        let mut temps = Vec::new();
        let mut row_eos = Vec::new();
        let mut hidden_rows = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let t = if sampling::is_greedy(r.temperature) { 0.0 } else { f64::from(r.temperature) };
            for p in r.prompt_len..r.tokens.len() {
                rows.push(at(i, p - 1));
                chosen.push(i64::from(r.tokens[p]));
                temps.push(t);
                row_eos.push(i64::from(r.eos));
            }
            hidden_rows.extend(r.hidden_positions.iter().map(|&p| at(i, p)));
        }
        let hidden_all: Vec<f32> = if hidden_rows.is_empty() {
            Vec::new()
        } else {
            let idx = Tensor::f_from_slice(&hidden_rows)?.f_to_device(device)?;
            Vec::try_from(&hidden.f_index_select(0, &idx)?.f_to_device(Device::Cpu)?.f_flatten(0, -1)?)?
        };
        let rows_t = Tensor::f_from_slice(&rows)?.f_to_device(device)?;
        let h_rows = hidden.f_index_select(0, &rows_t)?;

        let n = rows.len() as i64;
        let row_draws: Vec<f64> = draws.iter().flat_map(|d| d.iter().copied()).collect();
        let mut figures = RowFigures::with_capacity(rows.len());
        let mut start = 0;
        while start < n {
            let len = LOGIT_CHUNK_ROWS.min(n - start);
            let range = start as usize..(start + len) as usize;
            let logits = self.lm_head(&h_rows.f_narrow(0, start, len)?)?;
            let tok = Tensor::f_from_slice(&chosen[range.clone()])?.f_to_device(device)?.f_unsqueeze(1)?;
            let eos = Tensor::f_from_slice(&row_eos[range.clone()])?.f_to_device(device)?.f_unsqueeze(1)?;
            let u = if row_draws.is_empty() { None } else { Some(&row_draws[range.clone()]) };
            figures.push_chunk(&logits, &tok, &eos, &temps[range], u)?;
            start += len;
        }

        let mut out = Vec::with_capacity(reqs.len());
        let (mut at, mut at_h) = (0usize, 0usize);
        for r in reqs {
            let m = r.tokens.len() - r.prompt_len;
            let span = at..at + m;
            let nh = r.hidden_positions.len();
            out.push(SequenceEvidence {
                d_model: d,
                hidden: hidden_all[at_h * d..(at_h + nh) * d].to_vec(),
                logprob: figures.logprob[span.clone()].to_vec(),
                prob_t1: figures.prob_t1[span.clone()].to_vec(),
                prob_temp: figures.prob_temp[span.clone()].to_vec(),
                cdf_lo: figures.cdf_lo[span.clone()].to_vec(),
                cdf_hi: figures.cdf_hi[span.clone()].to_vec(),
                eos_prob_last: figures.eos_prob[span.end - 1],
                drawn: figures.drawn.get(span.clone()).map(<[Draw]>::to_vec).unwrap_or_default(),
            });
            at = span.end;
            at_h += nh;
        }
        Ok(out)
    }
}

/// Column-wise figures for all rows, filled chunk by chunk.
#[derive(Debug, Default)]
struct RowFigures {
    logprob: Vec<f64>,
    prob_t1: Vec<f64>,
    prob_temp: Vec<f64>,
    cdf_lo: Vec<f64>,
    cdf_hi: Vec<f64>,
    eos_prob: Vec<f64>,
    drawn: Vec<Draw>,
}

impl RowFigures {
    fn with_capacity(n: usize) -> Self {
        let v = || Vec::with_capacity(n);
        Self { logprob: v(), prob_t1: v(), prob_temp: v(), cdf_lo: v(), cdf_hi: v(), eos_prob: v(), drawn: Vec::new() }
    }

    /// `logits` `[R, V]` f32; `tok`, `eos` `[R, 1]` i64; `temps` the rows'
    /// temperatures (0 = greedy). As in `sampling::token_stats`, with
    /// `w_i = exp((l_i − max)/T)`: `lo = Σ_{i<tok} w_i / Z`, `hi = lo + w_tok / Z`.
    /// The weights are f32 (as the logits); `Z` and the sums below `tok`
    /// accumulate in f64 like the protocol's sequential sums (an f32
    /// accumulator over 49 152 ids drifts by ~1e-6 relative, which
    /// the sampling check's ε would have to absorb). With `draws` (one `u`
    /// per row) also the drawn token: the smallest id whose cumulative
    /// weight (f64, id order) exceeds `u·Z` (greedy rows: the argmax), and
    /// its interval from the same cumulative sum.
    fn push_chunk(
        &mut self,
        logits: &Tensor,
        tok: &Tensor,
        eos: &Tensor,
        temps: &[f64],
        draws: Option<&[f64]>,
    ) -> Result<(), PolicyError> {
        let col = |t: &Tensor| -> Result<Vec<f64>, PolicyError> {
            Ok(Vec::try_from(&t.f_flatten(0, -1)?.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?)
        };
        let (max, argmax) = logits.f_max_dim(1, true)?;
        let shifted = logits.f_sub(&max)?;
        let e1 = shifted.f_exp()?;
        // T = 1: log p = (l − max) − ln Σ exp(l − max).
        let z1 = col(&e1.f_sum_dim_intlist(1, false, Kind::Double)?)?;
        let at_tok = col(&shifted.f_gather(1, tok, false)?)?;
        let at_eos = col(&shifted.f_gather(1, eos, false)?)?;
        // Sampling weights; greedy rows use T = 1 here and are replaced below.
        let w = if temps.iter().all(|&t| t == 1.0 || t <= 0.0) {
            e1
        } else {
            drop(e1);
            let t: Vec<f32> = temps.iter().map(|&t| if t > 0.0 { t as f32 } else { 1.0 }).collect();
            let t = Tensor::f_from_slice(&t)?.f_to_device(logits.device())?.f_unsqueeze(1)?;
            let mut w = shifted.f_div(&t)?;
            let _ = w.f_exp_()?;
            w
        };
        drop(shifted);
        let z = col(&w.f_sum_dim_intlist(1, false, Kind::Double)?)?;
        let w_tok = col(&w.f_gather(1, tok, false)?)?;
        let ids = Tensor::f_arange(w.size()[1], (Kind::Int64, w.device()))?.f_unsqueeze(0)?;
        let below = w.f_mul(&ids.f_lt_tensor(tok)?)?.f_sum_dim_intlist(1, false, Kind::Double)?;
        let below = col(&below)?;
        let lp: Vec<f64> = at_tok.iter().zip(&z1).map(|(a, z)| a - z.ln()).collect();
        let lp_eos: Vec<f64> = at_eos.iter().zip(&z1).map(|(a, z)| a - z.ln()).collect();
        let lo: Vec<f64> = below.iter().zip(&z).map(|(b, z)| b / z).collect();
        let hi: Vec<f64> = below.iter().zip(&w_tok).zip(&z).map(|((b, w), z)| (b + w) / z).collect();
        let pt: Vec<f64> = w_tok.iter().zip(&z).map(|(w, z)| w / z).collect();
        let argmax = col(&argmax)?;
        let tok_v = col(tok)?;
        if let Some(u) = draws {
            let vocab = w.size()[1];
            let target: Vec<f64> = u.iter().zip(&z).map(|(u, z)| u.clamp(0.0, 1.0) * z).collect();
            let target = Tensor::f_from_slice(&target)?.f_to_device(w.device())?.f_unsqueeze(1)?;
            let cum = w.f_cumsum(1, Kind::Double)?;
            let below = col(&cum.f_le_tensor(&target)?.f_sum_dim_intlist(1, false, Kind::Int64)?)?;
            let d: Vec<i64> = temps
                .iter()
                .enumerate()
                .map(|(i, &temp)| if temp > 0.0 { below[i].min((vocab - 1) as f64) as i64 } else { argmax[i] as i64 })
                .collect();
            let d_t = Tensor::f_from_slice(&d)?.f_to_device(w.device())?.f_unsqueeze(1)?;
            let hi_d = col(&cum.f_gather(1, &d_t, false)?)?;
            let w_d = col(&w.f_gather(1, &d_t, false)?)?;
            for (i, &temp) in temps.iter().enumerate() {
                // Greedy: the argmax owns [0, 1).
                let (lo, hi) = if temp > 0.0 { ((hi_d[i] - w_d[i]) / z[i], hi_d[i] / z[i]) } else { (0.0, 1.0) };
                self.drawn.push(Draw { token: d[i] as u32, lo, hi });
            }
        }

        for (i, &temp) in temps.iter().enumerate() {
            let token = tok_v[i];
            let (lo, hi, pt) = if temp > 0.0 {
                (lo[i], hi[i], pt[i])
            } else {
                // Greedy: the first argmax owns [0, 1).
                let (lo, hi, pt) = match token.partial_cmp(&argmax[i]) {
                    Some(std::cmp::Ordering::Equal) => (0.0, 1.0, 1.0),
                    Some(std::cmp::Ordering::Less) => (0.0, 0.0, 0.0),
                    _ => (1.0, 1.0, 0.0),
                };
                (lo, hi, pt)
            };
            self.cdf_lo.push(lo);
            self.cdf_hi.push(hi);
            self.prob_temp.push(pt);
        }
        self.prob_t1.extend(lp.iter().map(|x| x.exp()));
        self.logprob.extend(lp);
        self.eos_prob.extend(lp_eos.into_iter().map(f64::exp));
        Ok(())
    }
}
