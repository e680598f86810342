//! Packed rows: many sequences that continue one common prefix, run as one
//! row without padding ([`ReferenceModel::forward_hidden_packed`]).
//!
//! Sequences with the same prompt are a run: the row holds the run's
//! prompt after the common prefix once, then each sequence's completion.
//! A token attends to the prefix (its keys and values, computed once and
//! reusable: [`PrefixCache`]), to its run's prompt tokens and to the tokens
//! of its own completion before it; its RoPE position is the one it has in
//! its own sequence. GRPO groups of one prompt whose prompts share a long
//! system prompt and worked examples, and whose completions are short, run
//! a fraction of the positions the padded or per-group layouts do.

use tch::Tensor;

use crate::PolicyError;
use crate::model::ReferenceModel;
use tributary_protocol::checkpoint::ModelConfig;

/// The layout of one packed row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedLayout {
    /// Token ids of the row.
    pub ids: Vec<i64>,
    /// Each row token's position in its own sequence.
    pub positions: Vec<i64>,
    /// Row-major `[N, N]`: may row token `i` attend to row token `j`.
    pub mask: Vec<bool>,
    /// Length of the common prefix the row continues.
    prefix: usize,
    /// Per sequence: the row of each of its positions from `prefix` on
    /// (`None` for a last token left out).
    rows: Vec<Vec<Option<i64>>>,
}

impl PackedLayout {
    /// Lays out `seqs` (`(tokens, prompt_len)`) after a common prefix of
    /// `prefix` tokens: every sequence must start with the same `prefix`
    /// tokens (not checked here: the caller knows it) and have
    /// `prefix < prompt_len < tokens.len()`. Sequences with the same prompt
    /// share one copy of it only when adjacent. With `last` false, each
    /// sequence's last token is left out (its row predicts nothing).
    pub fn build(seqs: &[(&[u32], usize)], prefix: usize, last: bool) -> Result<Self, PolicyError> {
        if let Some((t, p)) = seqs.iter().find(|(t, p)| !(prefix < *p && *p < t.len())) {
            return Err(PolicyError::Request(format!(
                "a packed sequence needs prefix {prefix} < prompt_len {p} < length {}",
                t.len()
            )));
        }
        let mut out = PackedLayout { prefix, ..Self::default() };
        // (run, member): member 0 is the run's prompt, k > 0 sequence k - 1 of it.
        let mut owner: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        for (run, members) in prompt_runs(seqs).enumerate() {
            let (tokens, p) = members[0];
            let mut prompt_rows = Vec::with_capacity(p - prefix);
            for (k, &t) in tokens[..p].iter().enumerate().skip(prefix) {
                prompt_rows.push(Some(out.ids.len() as i64));
                out.ids.push(i64::from(t));
                out.positions.push(k as i64);
                owner.push((run, 0));
            }
            for &(tokens, _) in members {
                let mut rows = prompt_rows.clone();
                for (k, &t) in tokens.iter().enumerate().skip(p) {
                    if !last && k + 1 == tokens.len() {
                        rows.push(None);
                        continue;
                    }
                    rows.push(Some(out.ids.len() as i64));
                    out.ids.push(i64::from(t));
                    out.positions.push(k as i64);
                    owner.push((run, i + 1));
                }
                out.rows.push(rows);
                i += 1;
            }
        }
        let n = out.ids.len();
        out.mask = vec![false; n * n];
        for (r, &(rr, mr)) in owner.iter().enumerate() {
            for (c, &(rc, mc)) in owner.iter().enumerate().take(r + 1) {
                out.mask[r * n + c] = rc == rr && (mc == 0 || mc == mr);
            }
        }
        Ok(out)
    }

    /// Tokens in the row.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The row holding sequence `i`'s position `p` (`None` before the
    /// prefix's end, past its end, or a left-out last token).
    pub fn row(&self, i: usize, p: usize) -> Option<i64> {
        self.rows.get(i)?.get(p.checked_sub(self.prefix)?).copied().flatten()
    }
}

/// A prompt prefix's keys and values under one model ([`ReferenceModel::prefix_kv`]),
/// computed once and used by any number of evidence calls
/// ([`ReferenceModel::evidence_drawn_after`]). Holds no autograd history.
#[derive(Debug)]
pub struct PrefixCache {
    tokens: Vec<u32>,
    kv: Vec<(Tensor, Tensor)>,
}

impl PrefixCache {
    /// The prefix's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Its length in tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Per block, the keys and values.
    pub fn kv(&self) -> &[(Tensor, Tensor)] {
        &self.kv
    }

    /// The cache of its first `n` tokens (attention is causal: the same
    /// keys and values, cut).
    pub fn truncated(&self, n: usize) -> Result<Self, PolicyError> {
        if n > self.len() {
            return Err(PolicyError::Request(format!("cannot cut a {}-token prefix to {n}", self.len())));
        }
        let kv = self
            .kv
            .iter()
            .map(|(k, v)| Ok((k.f_narrow(2, 0, n as i64)?, v.f_narrow(2, 0, n as i64)?)))
            .collect::<Result<_, PolicyError>>()?;
        Ok(PrefixCache { tokens: self.tokens[..n].to_vec(), kv })
    }
}

/// The shortest shared prompt prefix [`ReferenceModel::prefix_for`] keeps.
pub const MIN_SHARED_PREFIX: usize = 16;

impl ReferenceModel {
    /// The prefix to run `prompt`'s rollouts after: `cache` cut to what it
    /// shares with `prompt` when that is at least `min_shared` tokens
    /// (leaving `prompt` its last token), else computed afresh from all of
    /// `prompt` but its last token and kept in `cache`. Successive groups
    /// of a network share a system prompt and worked examples and differ in
    /// the question: the first group pays for its whole prompt, the second
    /// cuts the cache to the common part, the rest reuse it. `cache` must
    /// hold this model's keys and values (or be `None`).
    pub fn prefix_for<'c>(
        &self,
        cache: &'c mut Option<PrefixCache>,
        prompt: &[u32],
        min_shared: usize,
    ) -> Result<&'c PrefixCache, PolicyError> {
        let limit = prompt.len().saturating_sub(1);
        let shared =
            cache.as_ref().map_or(0, |c| c.tokens().iter().zip(prompt).take(limit).take_while(|(a, b)| a == b).count());
        match cache {
            Some(c) if shared >= min_shared.max(1) => {
                if shared < c.len() {
                    *c = c.truncated(shared)?;
                }
            }
            _ => *cache = Some(self.prefix_cache(&prompt[..limit])?),
        }
        cache.as_ref().ok_or_else(|| PolicyError::Request("no prefix".to_owned()))
    }

    /// The [`PrefixCache`] of `tokens` (no gradients).
    pub fn prefix_cache(&self, tokens: &[u32]) -> Result<PrefixCache, PolicyError> {
        if tokens.is_empty() {
            return Ok(PrefixCache { tokens: Vec::new(), kv: Vec::new() });
        }
        self.check_tokens(tokens)?;
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let kv = tch::no_grad(|| self.prefix_kv(&Tensor::f_from_slice(&ids)?.f_view([1, ids.len() as i64])?))?;
        Ok(PrefixCache { tokens: tokens.to_vec(), kv })
    }

    /// Post-norm hidden states `[N, d]` of a [`PackedLayout`] row after
    /// `past` (the keys and values of its prefix; empty for none).
    pub fn forward_layout(&self, past: &[(Tensor, Tensor)], layout: &PackedLayout) -> Result<Tensor, PolicyError> {
        let row = Tensor::f_from_slice(&layout.ids)?.f_view([1, layout.len() as i64])?;
        let h = self.forward_hidden_packed(past, &row, &layout.positions, &layout.mask)?;
        let d = h.size()[2];
        Ok(h.f_reshape([-1, d])?)
    }
}

/// The runs of consecutive sequences (`(tokens, prompt_len)`) with the
/// same prompt: a packed row holds each run's prompt once.
fn prompt_runs<'a>(seqs: &'a [(&'a [u32], usize)]) -> impl Iterator<Item = &'a [(&'a [u32], usize)]> {
    seqs.chunk_by(|(a, pa), (b, pb)| a[..*pa] == b[..*pb])
}

/// Whether running `seqs` (`(tokens, prompt_len)`) as one packed row after
/// a kept prefix of `prefix` tokens costs less than the layout without it:
/// one right-padded batch after their prompt when they share one, else one
/// padded batch of whole sequences. The cost of a layout is its token
/// positions (each runs a block's matrix products) plus its attention
/// pairs weighed against them: a packed row attends densely under its
/// mask, so long completions (GSM8K answers) make it dearer than the
/// prompts it saves, while short ones after a long shared prompt (arith's
/// worked examples) make it far cheaper.
pub fn packing_pays(dims: &ModelConfig, seqs: &[(&[u32], usize)], prefix: usize) -> bool {
    let Some(&(first, p)) = seqs.first() else { return false };
    let (d, kv, ff) = (dims.d_model as f64, dims.kv_dim() as f64, dims.d_ff as f64);
    // Multiply-adds a position spends in a block's products, against those
    // of one query-key pair (scores and the weighted sum, every head).
    let per_pair = 2.0 * (dims.n_head * dims.head_dim()) as f64 / (2.0 * d * d + 2.0 * d * kv + 3.0 * d * ff);
    let cost = |positions: f64, pairs: f64| positions + pairs * per_pair;
    let n: usize = prompt_runs(seqs)
        .map(|members| members[0].1 - prefix + members.iter().map(|(t, pl)| t.len() - pl).sum::<usize>())
        .sum();
    let packed = cost(n as f64, n as f64 * (prefix + n) as f64);
    let b = seqs.len() as f64;
    let plain = if seqs.iter().all(|(t, pl)| t[..*pl] == first[..p]) {
        let s = seqs.iter().map(|(t, pl)| t.len() - pl).max().unwrap_or(0) as f64;
        let p = p as f64;
        cost(p + b * s, p * p / 2.0 + b * s * (p + s / 2.0))
    } else {
        let l = seqs.iter().map(|(t, _)| t.len()).max().unwrap_or(0) as f64;
        cost(b * l, b * l * l / 2.0)
    };
    packed < plain
}

/// The length of the prefix all `prompts` share, leaving at least one
/// token of each out (that token's row predicts the first completion
/// token, so it runs in the packed row).
pub fn common_prefix_len<'a>(prompts: impl IntoIterator<Item = &'a [u32]>) -> usize {
    let mut it = prompts.into_iter();
    let Some(first) = it.next() else { return 0 };
    it.fold(first.len().saturating_sub(1), |n, p| {
        let same = first.iter().zip(p).take(n).take_while(|(a, b)| a == b).count();
        same.min(p.len().saturating_sub(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_shares_each_runs_prompt_and_masks_other_sequences() {
        // Two sequences of prompt [1 2 3], one of [1 2 4]; prefix [1 2].
        let a = [1u32, 2, 3, 10, 11];
        let b = [1u32, 2, 3, 20];
        let c = [1u32, 2, 4, 30, 31];
        let seqs = [(&a[..], 3), (&b[..], 3), (&c[..], 3)];
        let l = PackedLayout::build(&seqs, 2, true).unwrap();
        assert_eq!(l.ids, vec![3, 10, 11, 20, 4, 30, 31]);
        assert_eq!(l.positions, vec![2, 3, 4, 3, 2, 3, 4]);
        let n = l.len();
        let sees = |i: usize, j: usize| l.mask[i * n + j];
        assert!(sees(1, 0) && sees(2, 1) && sees(3, 0) && !sees(3, 1) && !sees(3, 2));
        assert!(sees(6, 4) && sees(6, 5) && !sees(4, 0) && !sees(5, 3) && !sees(0, 1));
        assert_eq!(
            (l.row(0, 2), l.row(0, 4), l.row(1, 2), l.row(1, 3), l.row(2, 3)),
            (Some(0), Some(2), Some(0), Some(3), Some(5))
        );
        assert_eq!((l.row(0, 1), l.row(0, 5)), (None, None));
        // Without last tokens: 11, 20 and 31 go.
        let l = PackedLayout::build(&seqs, 2, false).unwrap();
        assert_eq!(l.ids, vec![3, 10, 4, 30]);
        assert_eq!((l.row(0, 3), l.row(0, 4), l.row(1, 3), l.row(2, 3)), (Some(1), None, None, Some(3)));
        // The prefix must leave each prompt a token.
        assert!(PackedLayout::build(&seqs, 3, true).is_err());
        assert!(PackedLayout::build(&[(&a[..3], 3)], 2, true).is_err());
    }

    /// SmolLM2-135M's shape: a group of 8 short arith completions after a
    /// 148-token shared prefix packs; 8 long GSM8K answers after a short
    /// system prompt do not.
    #[test]
    fn packing_pays_for_short_completions_after_a_long_shared_prompt() {
        let dims = ModelConfig {
            n_layer: 30,
            d_model: 576,
            n_head: 9,
            n_head_kv: 3,
            d_ff: 1536,
            vocab_size: 49152,
            rms_eps: 1e-5,
            rope_theta: 100000.0,
            context_length: 8192,
            arch: Default::default(),
            key_length: None,
            qkv_bias: false,
            rope_freqs: false,
        };
        let group = |prompt: usize, completions: &[usize]| -> Vec<Vec<u32>> {
            completions.iter().map(|&c| (0..(prompt + c) as u32).collect()).collect()
        };
        let arith = group(160, &[16, 16, 18, 15, 19, 17, 17, 20]);
        let seqs: Vec<(&[u32], usize)> = arith.iter().map(|t| (t.as_slice(), 160)).collect();
        assert!(packing_pays(&dims, &seqs, 148));
        let gsm = group(70, &[150, 160, 170, 180, 190, 200, 210, 220]);
        let seqs: Vec<(&[u32], usize)> = gsm.iter().map(|t| (t.as_slice(), 70)).collect();
        assert!(!packing_pays(&dims, &seqs, 35));
        assert!(!packing_pays(&dims, &[], 0));
    }

    #[test]
    fn the_common_prefix_leaves_every_prompt_a_token() {
        let len = |ps: &[&[u32]]| common_prefix_len(ps.iter().copied());
        assert_eq!(len(&[]), 0);
        assert_eq!(len(&[&[1, 2, 3]]), 2);
        assert_eq!(len(&[&[1, 2, 3], &[1, 2, 7]]), 2);
        assert_eq!(len(&[&[1, 2, 3], &[1, 5, 3]]), 1);
        assert_eq!(len(&[&[1, 2, 3], &[1, 2]]), 1);
        assert_eq!(len(&[&[1, 2, 3], &[9, 2, 3]]), 0);
    }
}
