//! The one generation schedule every backend follows, written once.
//!
//! A group of G rollouts of one prompt of P tokens:
//! 1. the prompt is prefilled as sequence 0 in chunks (a backend's chunk
//!    size); every prompt row's hidden state is sketched, and the last row's
//!    logits give every rollout's first token. Sequence 0's cache is then
//!    copied to sequences 1..G;
//! 2. every step feeds, in one batch, the pending token of every sequence
//!    that has one. The row returns that token's own state (its sketch) and
//!    the logits of the next token, drawn with the protocol's seeded sampler
//!    unless the sequence has finished (EOG sampled or `max_new_tokens`
//!    reached). A finished sequence's last token is still fed once, so its
//!    state is known: `sketches.len() == tokens.len()`.
//!
//! A teacher-forced replay ([`forward_each`]) prefills one sequence in the
//! same chunks, so with fixed-order kernels it reproduces generation's states
//! and logits bit for bit. A backend provides one batched forward step
//! ([`Stepper`]); the schedule, the sketches and the sampling live here.

use std::ops::Range;

use tributary_protocol::sampling;
use tributary_protocol::sketch::{self, SketchKey, SketchParams};

use crate::backend::{BackendError, GeneratedSeq, GroupRequest, SeqState};

/// One row of a forward step: `token` at absolute position `pos` of sequence `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Token id fed at this row.
    pub token: u32,
    /// Its absolute position in its sequence.
    pub pos: u32,
    /// Its sequence (KV-cache slot).
    pub seq: u32,
}

/// One batched forward step of a backend's model, over a context sized for
/// the group.
pub(crate) trait Stepper {
    /// Runs `rows` as one batch. Rows in `lm` need their logits; a backend may
    /// compute more.
    fn step(&mut self, rows: &[Row], lm: Range<usize>) -> Result<(), BackendError>;
    /// The post-final-norm hidden state of row `row` of the last step.
    fn hidden(&self, row: usize) -> Result<&[f32], BackendError>;
    /// The logits of row `row` of the last step (a row in its `lm` range).
    fn logits(&self, row: usize) -> Result<&[f32], BackendError>;
    /// Copies sequence 0's first `len` positions into each sequence of `seqs`.
    fn copy_prompt(&mut self, seqs: Range<usize>, len: usize) -> Result<(), BackendError>;
}

/// Rows of one prefill chunk: `tokens` of sequence 0 starting at position `start`.
fn prefill_rows(rows: &mut Vec<Row>, tokens: &[u32], start: usize) {
    rows.clear();
    rows.extend(tokens.iter().enumerate().map(|(j, &token)| Row { token, pos: (start + j) as u32, seq: 0 }));
}

/// Generates `req`'s group with `chunk`-row prefill steps (module docs).
/// The caller has validated `req` against its model.
pub(crate) fn generate(
    st: &mut impl Stepper,
    req: &GroupRequest<'_>,
    chunk: usize,
) -> Result<Vec<GeneratedSeq>, BackendError> {
    let (g, p) = (req.group_size, req.prompt.len());
    let mut rows = Vec::with_capacity(chunk.max(g));

    // 1. prefill (sequence 0), one sketch per prompt position
    let mut prompt_sketches = Vec::with_capacity(p);
    let mut first = Vec::with_capacity(g);
    for (c, tokens) in req.prompt.chunks(chunk).enumerate() {
        prefill_rows(&mut rows, tokens, c * chunk);
        let last = (c + 1) * chunk >= p;
        let lm = if last { rows.len() - 1..rows.len() } else { 0..0 };
        st.step(&rows, lm)?;
        for j in 0..rows.len() {
            prompt_sketches.push(req.sketch(st.hidden(j)?)?);
        }
        if last {
            let logits = st.logits(rows.len() - 1)?;
            first.extend((0..g).map(|s| req.choose(logits, s, p)));
        }
    }
    st.copy_prompt(1..g, p)?;
    let mut seqs: Vec<SeqState> = first.into_iter().map(|choice| SeqState::start(choice, req)).collect();

    // 2. decode steps: feed every pending token, read its state and the next logits
    let mut owners: Vec<usize> = Vec::with_capacity(g);
    loop {
        rows.clear();
        owners.clear();
        for (s, seq) in seqs.iter_mut().enumerate() {
            if let Some(token) = seq.pending.take() {
                let pos = (p + seq.completion.len() - 1) as u32;
                rows.push(Row { token, pos, seq: s as u32 });
                owners.push(s);
            }
        }
        if rows.is_empty() {
            break;
        }
        // a finished row only needs its state; its logits are ignored
        st.step(&rows, 0..rows.len())?;
        for (row, &s) in owners.iter().enumerate() {
            let seq = &mut seqs[s];
            seq.sketches.push(req.sketch(st.hidden(row)?)?);
            if seq.finished {
                continue;
            }
            let pos = p + seq.completion.len();
            seq.push(req.choose(st.logits(row)?, s, pos), req);
        }
    }
    Ok(seqs.into_iter().map(|seq| seq.finish(&prompt_sketches)).collect())
}

/// Teacher-forced forward over `tokens` (sequence 0, prefilled in `chunk`-row
/// steps like [`generate`]), calling `visit(position, hidden, logits)` for
/// every position in order: the state computed from `tokens[0..=position]`
/// and the logits it gives for `tokens[position + 1]`.
pub(crate) fn forward_each(
    st: &mut impl Stepper,
    tokens: &[u32],
    chunk: usize,
    mut visit: impl FnMut(usize, &[f32], &[f32]) -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    let mut rows = Vec::with_capacity(chunk);
    for (c, part) in tokens.chunks(chunk).enumerate() {
        prefill_rows(&mut rows, part, c * chunk);
        st.step(&rows, 0..rows.len())?;
        for j in 0..rows.len() {
            visit(c * chunk + j, st.hidden(j)?, st.logits(j)?)?;
        }
    }
    Ok(())
}

/// [`forward_each`] reduced to what a rollout records: the sketch at every
/// position and the raw log-probability of every token at positions
/// `1..tokens.len()` (`logprobs[i-1]` is that of `tokens[i]`), computed as
/// generation computes them.
pub(crate) fn teacher_forced(
    st: &mut impl Stepper,
    tokens: &[u32],
    chunk: usize,
    key: &SketchKey,
    params: &SketchParams,
) -> Result<(Vec<u32>, Vec<f32>), BackendError> {
    let mut sketches = Vec::with_capacity(tokens.len());
    let mut logprobs = Vec::with_capacity(tokens.len().saturating_sub(1));
    forward_each(st, tokens, chunk, |pos, h, logits| {
        sketches.push(sketch::sketch(h, key, params).map_err(|e| BackendError::Decode(e.to_string()))?);
        if let Some(&t) = tokens.get(pos + 1) {
            let lp = sampling::logprob_t1(logits, t as usize)
                .ok_or_else(|| BackendError::Decode(format!("token {t} outside the logits")))?;
            logprobs.push(lp);
        }
        Ok(())
    })?;
    Ok((sketches, logprobs))
}
