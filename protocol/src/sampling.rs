//! Seeded sampling: the exact rule by which a miner turns one position's
//! logits into a token, so that the validator can check every position.
//!
//! **Draw.** The uniform `u ∈ [0, 1)` for a position is a PRF of the
//! coordinator's sampling seed and public context ([`draw_u`]); the miner
//! cannot choose it.
//!
//! **Distribution.** Over the vocabulary in token-id order, with
//! `m = max_i l_i`: `w_i = exp((l_i − m)/T)` in `f64`, `Z = Σ w_i` summed
//! sequentially in id order. The sampled token is the smallest `t` with
//! `Σ_{i≤t} w_i > u·Z` (inverse CDF). `T` that is not a finite positive number
//! (in particular `T = 0`) means greedy: the first index of the maximum.
//!
//! Non-finite logits are defined too: NaN has weight 0; if some logit is `+∞`
//! every `+∞` logit has weight 1 and the rest 0; if no logit is above `−∞`
//! (or all are NaN) every token has weight 1.
//!
//! **Check.** The validator computes the chosen token's CDF interval
//! `[lo, hi) = [Σ_{i<t} w_i/Z, Σ_{i≤t} w_i/Z)` from its own logits
//! ([`cdf_interval`] / [`token_stats`]) and classifies `u` with
//! [`check_draw`]: inside, outside, or within `ε` of the interval (ambiguous —
//! numeric drift between the two implementations could move the edges by up
//! to `ε`, so the position cannot decide between the tokens near the draw).
//! When the validator also knows the token its own logits draw at `u`
//! ([`token_stats_at`], [`TokenStats::drawn`]), a claimed token that is not
//! that one must lie within [`DEFAULT_MAX_DRAW_GAP`] of reference
//! probability mass of it ([`check_draw_bounded`]): the mass strictly
//! between the two tokens' intervals is what an honest drift crosses, and
//! the only figure that bounds it soundly (ids do not: a drift of 3e-5
//! crosses a hundred tail tokens of 3e-7).
//!
//! Every function here is a few passes over the logits and allocation-free.

use crate::prf::{Seed, labels, prf_unit_f64};

/// The protocol's default ambiguity margin `ε` around CDF interval edges.
///
/// Calibrated (`docs/calibration.md`): with the miner and the reference both
/// in plain f32, honest logits differ by at most ~1e-4, which moves a CDF
/// edge by at most `max|Δl|/T` ≈ 1.4e-4 at T = 0.7; no honest draw was ever
/// outside its reference interval (0 of 3 507 positions even at ε = 1e-5).
/// `ε = 3e-4` keeps a 2× margin over that bound and skips ~1 % of positions
/// as ambiguous (those whose sampled token had probability ≲ 2ε).
pub const DEFAULT_SAMPLE_EPS: f64 = 3e-4;

/// The protocol's default bound on the reference probability mass strictly
/// between an ambiguous position's claimed token and the token the
/// validator's own logits draw ([`TokenStats::draw_gap`]).
///
/// An honest miner's token differs from the reference's draw only by the
/// drift between the two CDFs at `u`, and every token between them lies
/// inside that drift: the mass between is below the drift (at most
/// `max|Δl|/T` ≈ 1.4e-4 at the calibrated `|Δl|` ≤ 1e-4 and T = 0.7, the
/// bound `ε` is sized from). In ids it is not bounded at all: a run of tail
/// tokens of ~3e-7 puts a hundred ids in a drift of 3e-5, which is how the
/// id cap of protocol 7 (32 ids) failed honest rollouts on the tiny model
/// (issue 28). Half of `ε`: a position admits tokens of joint reference
/// mass at most `2·gap` besides the two straddling ones, so at most
/// `2·gap/τ + 2` tokens of probability `τ` or more. Calibrated in
/// `docs/calibration.md` §6.
pub const DEFAULT_MAX_DRAW_GAP: f64 = 1.5e-4;

/// The uniform draw for one sampled token:
/// `PRF(SAMPLING, [sampling_seed, miner, group LE32, rollout LE32, position LE32])`
/// mapped to `[0, 1)` with 53 bits. `position` is the **absolute** index of
/// the sampled token in the rollout's token sequence (prompt included), i.e.
/// `prompt_len + i` for the `i`-th completion token.
pub fn draw_u(sampling_seed: &Seed, miner: &[u8; 32], group: u32, rollout: u32, position: u32) -> f64 {
    prf_unit_f64(
        labels::SAMPLING,
        &[&sampling_seed.0, miner, &group.to_le_bytes(), &rollout.to_le_bytes(), &position.to_le_bytes()],
    )
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// The maximum is finite.
    Finite(f64),
    /// Some logit is +∞.
    PosInf,
    /// No logit above −∞: uniform.
    Uniform,
}

/// Pass 1: the weight mode and the greedy argmax (first index of the max,
/// NaN ignored; 0 if all NaN).
fn scan(logits: &[f32]) -> (Mode, usize) {
    let mut m = f32::NEG_INFINITY;
    let mut arg = None;
    for (i, &l) in logits.iter().enumerate() {
        if l > m || (arg.is_none() && !l.is_nan()) {
            m = l;
            arg = Some(i);
        }
    }
    let mode = if m == f32::INFINITY {
        Mode::PosInf
    } else if m == f32::NEG_INFINITY {
        Mode::Uniform
    } else {
        Mode::Finite(f64::from(m))
    };
    (mode, arg.unwrap_or(0))
}

#[inline(always)]
fn weight(mode: Mode, l: f32, t: f64) -> f64 {
    match mode {
        Mode::Finite(m) => {
            if l.is_nan() {
                0.0
            } else {
                ((f64::from(l) - m) / t).exp()
            }
        }
        Mode::PosInf => {
            if l == f32::INFINITY {
                1.0
            } else {
                0.0
            }
        }
        Mode::Uniform => 1.0,
    }
}

/// Whether `temperature` means greedy decoding.
#[inline]
pub fn is_greedy(temperature: f32) -> bool {
    !(temperature.is_finite() && temperature > 0.0)
}

fn clamp_u(u: f64) -> f64 {
    if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) }
}

/// Pass 3: smallest t with cumulative weight > target; if rounding leaves no
/// such t (u ≥ 1), the last token of positive weight.
fn search(logits: &[f32], mode: Mode, t: f64, target: f64) -> usize {
    let mut cum = 0.0f64;
    let mut last_pos = 0;
    for (i, &l) in logits.iter().enumerate() {
        let w = weight(mode, l, t);
        cum += w;
        if w > 0.0 {
            last_pos = i;
            if cum > target {
                return i;
            }
        }
    }
    last_pos
}

/// The token chosen by inverse-CDF sampling at `temperature` with draw `u`
/// (module docs). `u` outside `[0, 1)` is clamped; NaN counts as 0. An empty
/// slice gives 0.
pub fn sample_inverse_cdf(logits: &[f32], temperature: f32, u: f64) -> usize {
    let (mode, arg) = scan(logits);
    if is_greedy(temperature) {
        return arg;
    }
    let t = f64::from(temperature);
    let z: f64 = logits.iter().map(|&l| weight(mode, l, t)).sum();
    search(logits, mode, t, clamp_u(u) * z)
}

/// A sampled token with its raw-model (T = 1) log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// `log softmax(logits)[token]` at temperature 1.
    pub logprob_t1: f32,
}

/// The miner's hot-loop call: the token [`sample_inverse_cdf`] chooses and
/// its [`logprob_t1`], in two vectorised passes over the logits.
///
/// The weights are computed with an f32 exponential (relative error < 3e-7)
/// and summed per block of [`BLOCK`] in f32, the blocks in f64; the exact
/// rule uses f64 throughout. The two choose the same token except when `u`
/// lies within ~1e-6 of an interval edge, and the log-probabilities agree to
/// ~1e-6 — both far inside the validator's margins ([`DEFAULT_SAMPLE_EPS`],
/// the log-prob bound), which exist for the larger drift between two models'
/// logits. Greedy temperatures and logits with NaN or ±∞ take the exact
/// path.
pub fn sample_with_logprob(logits: &[f32], temperature: f32, u: f64) -> Sampled {
    let Some((m, inv_t)) = fast_path(logits, temperature) else {
        return sample_with_logprob_exact(logits, temperature, u);
    };
    let mut w_t = [0.0f32; BLOCK];
    let sums_t: Vec<f32> = logits.chunks(BLOCK).map(|block| block_weights(block, m, inv_t, &mut w_t)).collect();
    let z_t: f64 = sums_t.iter().map(|&st| f64::from(st)).sum();
    let z_1 = if inv_t == 1.0 { z_t } else { z_t1(logits, m) };
    let target = clamp_u(u) * z_t;
    let mut token = None;
    let mut cum = 0.0f64;
    for (b, &st) in sums_t.iter().enumerate() {
        if st > 0.0 && cum + f64::from(st) > target {
            let block = &logits[b * BLOCK..((b + 1) * BLOCK).min(logits.len())];
            block_weights(block, m, inv_t, &mut w_t);
            let mut last_pos = None;
            for (i, &w) in w_t[..block.len()].iter().enumerate() {
                cum += f64::from(w);
                if w > 0.0 {
                    last_pos = Some(b * BLOCK + i);
                    if cum > target {
                        break;
                    }
                }
            }
            token = last_pos;
            break;
        }
        cum += f64::from(st);
    }
    // u·Z at or past the total (u = 1 after rounding): the last positive weight.
    let token = token.unwrap_or_else(|| {
        let t = f64::from(inv_t).recip();
        logits.iter().rposition(|&l| weight(Mode::Finite(f64::from(m)), l, t) > 0.0).unwrap_or(0)
    });
    let logprob = (f64::from(logits[token]) - f64::from(m)) - z_1.ln();
    Sampled { token: token as u32, logprob_t1: logprob as f32 }
}

/// Logits per block of the fast sampler's sums.
pub const BLOCK: usize = 64;

/// The fast sampler's `(max, 1/T)`, or `None` when the exact path must run:
/// greedy, an empty slice, a NaN or infinite logit.
fn fast_path(logits: &[f32], temperature: f32) -> Option<(f32, f32)> {
    if is_greedy(temperature) || logits.is_empty() {
        return None;
    }
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut bad = false;
    let mut chunks = logits.chunks_exact(8);
    for c in &mut chunks {
        for (lane, &l) in lanes.iter_mut().zip(c) {
            *lane = lane.max(l);
            bad |= !l.is_finite();
        }
    }
    for &l in chunks.remainder() {
        lanes[0] = lanes[0].max(l);
        bad |= !l.is_finite();
    }
    let m = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let inv_t = temperature.recip();
    (!bad && inv_t.is_finite()).then_some((m, inv_t))
}

/// `Σ exp(l_i − m)` as the fast sampler sums it (per block in f32, the
/// blocks in f64, in order): shared so that replay and generation agree bit
/// for bit.
fn z_t1(logits: &[f32], m: f32) -> f64 {
    let mut w = [0.0f32; BLOCK];
    logits.chunks(BLOCK).map(|b| f64::from(block_weights(b, m, 1.0, &mut w))).sum()
}

/// `w_i = exp((l_i − m)·inv_t)` into `out[..block.len()]`; returns their sum
/// (f32, eight lanes). Written as a plain map and a lane sum so that both
/// loops vectorise.
#[inline(always)]
fn block_weights(block: &[f32], m: f32, inv_t: f32, out: &mut [f32; BLOCK]) -> f32 {
    let out = &mut out[..block.len()];
    for (o, &l) in out.iter_mut().zip(block) {
        *o = exp_nonpositive((l - m) * inv_t);
    }
    let mut lanes = [0.0f32; 8];
    let mut chunks = out.chunks_exact(8);
    for c in &mut chunks {
        for (lane, &w) in lanes.iter_mut().zip(c) {
            *lane += w;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// `exp(x)` for `x ≤ 0` in f32 without a libm call or a branch, so loops over
/// it vectorise: Cody–Waite reduction `x = n·ln 2 + r`, Cephes' degree-6
/// polynomial for `exp(r)` (relative error < 3e-7), `2^n` from the exponent
/// bits. Below −87 (where `exp` leaves f32's normal range) it is 0.
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' coefficients as published
fn exp_nonpositive(x: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let in_range = x >= -87.0;
    let xc = if in_range { x } else { -87.0 };
    // plain multiply-adds (`mul_add` is a libm call without FMA in the
    // target); n·LN2_HI is exact, LN2_HI having 9 significant bits
    let shifted = xc * std::f32::consts::LOG2_E + SHIFTER;
    let n = shifted - SHIFTER;
    let r = (xc - n * 0.693_359_4) + n * 2.121_944_4e-4;
    let p = ((((1.987_569_1e-4f32 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 5.000_000_1e-1;
    let e = p * (r * r) + r + 1.0;
    // the low bits of `shifted` hold n (−126 ≤ n ≤ 0) offset by 0x40_0000
    let n_bits = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let scale = f32::from_bits((n_bits.wrapping_add(127) as u32) << 23);
    // zero below the range by masking the bits (a select the vectoriser takes)
    f32::from_bits((e * scale).to_bits() & u32::from(in_range).wrapping_neg())
}

/// [`sample_with_logprob`] by the exact rule, in f64 (2–3 passes).
pub fn sample_with_logprob_exact(logits: &[f32], temperature: f32, u: f64) -> Sampled {
    let (mode, arg) = scan(logits);
    let greedy = is_greedy(temperature);
    let t = f64::from(temperature);
    let (mut z_t, mut z_1) = (0.0f64, 0.0f64);
    if greedy || t == 1.0 {
        z_1 = logits.iter().map(|&l| weight(mode, l, 1.0)).sum();
        z_t = z_1;
    } else {
        for &l in logits {
            z_t += weight(mode, l, t);
            z_1 += weight(mode, l, 1.0);
        }
    }
    let token = if greedy { arg } else { search(logits, mode, t, clamp_u(u) * z_t) };
    Sampled { token: token as u32, logprob_t1: log_prob(logits, mode, token, z_1) as f32 }
}

fn log_prob(logits: &[f32], mode: Mode, token: usize, z_1: f64) -> f64 {
    let Some(&l) = logits.get(token) else { return f64::NEG_INFINITY };
    match mode {
        Mode::Finite(m) if !l.is_nan() => (f64::from(l) - m) - z_1.ln(),
        _ => (weight(mode, l, 1.0) / z_1).ln(),
    }
}

/// `log softmax(logits)[token]` at temperature 1 as the miner's
/// [`sample_with_logprob`] computes it (bit for bit, so a teacher-forced
/// replay reproduces generation's log-probabilities); within ~1e-6 of the
/// exact f64 value ([`token_stats`]). `None` when `token` is out of range.
pub fn logprob_t1(logits: &[f32], token: usize) -> Option<f32> {
    if token >= logits.len() {
        return None;
    }
    let Some((m, _)) = fast_path(logits, 1.0) else {
        let (mode, _) = scan(logits);
        let z_1: f64 = logits.iter().map(|&l| weight(mode, l, 1.0)).sum();
        return Some(log_prob(logits, mode, token, z_1) as f32);
    };
    Some(((f64::from(logits[token]) - f64::from(m)) - z_t1(logits, m).ln()) as f32)
}

/// Greedy "interval": the argmax owns all of `[0, 1)`; any other token gets
/// the empty interval at 0 (before the argmax) or 1 (after it).
fn greedy_interval(arg: usize, token: usize) -> (f64, f64) {
    match token.cmp(&arg) {
        std::cmp::Ordering::Less => (0.0, 0.0),
        std::cmp::Ordering::Equal => (0.0, 1.0),
        std::cmp::Ordering::Greater => (1.0, 1.0),
    }
}

/// The chosen token's CDF interval `[lo, hi)` at `temperature` (module docs).
/// `None` when `token` is out of range.
pub fn cdf_interval(logits: &[f32], temperature: f32, token: usize) -> Option<(f64, f64)> {
    token_stats(logits, temperature, token).map(|s| (s.cdf_lo, s.cdf_hi))
}

/// Everything the validator needs about one position's chosen token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenStats {
    /// `log p₁(token)`: raw-model log-probability at temperature 1.
    pub logprob_t1: f32,
    /// `p₁(token)` (for the termination check when `token` is EOS).
    pub prob_t1: f32,
    /// `p_T(token)`: probability under the sampling distribution (for the
    /// distribution check). For greedy: 1 for the argmax, else 0.
    pub prob_sampling: f32,
    /// CDF interval start at the sampling temperature.
    pub cdf_lo: f64,
    /// CDF interval end at the sampling temperature.
    pub cdf_hi: f64,
    /// The token the validator's own logits draw at this position's `u`,
    /// with its interval ([`token_stats_at`]); `None` when it was not
    /// computed, and then [`check_draw_bounded`] cannot bound the admitted set.
    pub drawn: Option<Draw>,
}

/// The token a distribution draws at a position's `u`, and its CDF interval
/// `[lo, hi)` at the sampling temperature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// The drawn token.
    pub token: u32,
    /// Its interval start.
    pub lo: f64,
    /// Its interval end.
    pub hi: f64,
}

impl TokenStats {
    /// The reference probability mass strictly between the claimed token's
    /// interval and the drawn token's ([`TokenStats::drawn`]): 0 when the
    /// claimed token is the draw or its neighbour. `None` without a draw.
    pub fn draw_gap(&self) -> Option<f64> {
        let d = self.drawn?;
        Some(if d.lo >= self.cdf_hi {
            d.lo - self.cdf_hi
        } else if self.cdf_lo >= d.hi {
            self.cdf_lo - d.hi
        } else {
            0.0
        })
    }
}

/// [`TokenStats`] of `token` under `logits` at `temperature` in two passes.
/// `None` when `token` is out of range.
pub fn token_stats(logits: &[f32], temperature: f32, token: usize) -> Option<TokenStats> {
    if token >= logits.len() {
        return None;
    }
    let (mode, arg) = scan(logits);
    let greedy = is_greedy(temperature);
    let t = if greedy { 1.0 } else { f64::from(temperature) };
    let same = t == 1.0;
    let (mut before, mut z_t, mut z_1) = (0.0f64, 0.0f64, 0.0f64);
    for (i, &l) in logits.iter().enumerate() {
        if i == token {
            before = z_t;
        }
        let w = weight(mode, l, t);
        z_t += w;
        z_1 += if same { w } else { weight(mode, l, 1.0) };
    }
    let w_tok = weight(mode, logits[token], t);
    let lp = log_prob(logits, mode, token, z_1);
    let (lo, hi, p_t) = if greedy {
        let (lo, hi) = greedy_interval(arg, token);
        (lo, hi, if token == arg { 1.0 } else { 0.0 })
    } else {
        (before / z_t, (before + w_tok) / z_t, w_tok / z_t)
    };
    Some(TokenStats {
        logprob_t1: lp as f32,
        prob_t1: lp.exp() as f32,
        prob_sampling: p_t as f32,
        cdf_lo: lo,
        cdf_hi: hi,
        drawn: None,
    })
}

/// [`token_stats`] with [`TokenStats::drawn`]: the token
/// [`sample_inverse_cdf`] draws from `logits` at `u`, and its interval.
pub fn token_stats_at(logits: &[f32], temperature: f32, token: usize, u: f64) -> Option<TokenStats> {
    let drawn = sample_inverse_cdf(logits, temperature, u);
    let d = token_stats(logits, temperature, drawn)?;
    let drawn = Draw { token: drawn as u32, lo: d.cdf_lo, hi: d.cdf_hi };
    token_stats(logits, temperature, token).map(|s| TokenStats { drawn: Some(drawn), ..s })
}

/// Outcome of checking one position's draw against the chosen token's interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SampleCheck {
    /// `lo < u < hi` and `u` is more than `ε` from both edges.
    Inside,
    /// `u` is within `ε` of an edge: drift could flip it; skipped.
    Ambiguous,
    /// `u` is clearly outside the interval: the token was not sampled by the rule.
    Outside {
        /// The draw.
        u: f64,
        /// Interval start.
        lo: f64,
        /// Interval end.
        hi: f64,
    },
    /// Within the ε band, but more reference probability mass lies between
    /// the claimed token and the validator's own draw than a position may
    /// admit ([`check_draw_bounded`]).
    FarFromDraw {
        /// The claimed token.
        token: u32,
        /// The token the validator's logits draw.
        drawn: u32,
        /// The mass strictly between them ([`TokenStats::draw_gap`]).
        gap: f64,
    },
}

/// Classifies the draw `u` at a position whose claimed token has `stats`
/// (the validator's [`TokenStats`]) with margin `eps`, the bound on how far
/// two honest implementations' CDFs may differ at any point:
///
/// - a token of zero reference weight (greedy's non-argmax tokens, masked
///   ids) is never drawn: outside;
/// - `lo + eps < u < hi − eps`: inside;
/// - `lo − eps ≤ u < hi + eps`: ambiguous — the claimed token's interval
///   comes within `eps` of the draw, so a drift of at most `eps` could make
///   it the token the miner's own logits draw;
/// - anything else: outside.
///
/// The admitted set is every token whose interval meets `[u − ε, u + ε]`,
/// and no smaller *band* is sound: drift moves every edge past a point by
/// the same amount, so where the tokens there are narrower than the drift (a
/// run of tail tokens of probability ~1e-7 against a drift of ~1e-6) the
/// honest token lies several ids from the one the reference draws, not
/// next to it. What a cheater gains at such a position is a choice among
/// tokens of joint reference probability at most `2ε` plus the two
/// straddling the band, at the ~1 % of positions that are ambiguous. The
/// hard caps bound that choice: [`check_draw_bounded`] admits only tokens
/// within a little reference mass of the reference's own draw, and
/// [`crate::verify::VerifyParams::max_ambiguous`] and
/// [`crate::verify::VerifyParams::max_off_draw`] bound how many positions
/// of a rollout may be ambiguous, or admitted off the reference's draw.
pub fn check_draw(u: f64, stats: &TokenStats, eps: f64) -> SampleCheck {
    let (lo, hi) = (stats.cdf_lo, stats.cdf_hi);
    // `hi > lo` is false for a zero-width interval and for NaN.
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        SampleCheck::Outside { u, lo, hi }
    } else if lo + eps < u && u < hi - eps {
        SampleCheck::Inside
    } else if lo - eps <= u && u < hi + eps {
        SampleCheck::Ambiguous
    } else {
        SampleCheck::Outside { u, lo, hi }
    }
}

/// [`check_draw`] for the claimed `token`, with the admitted set bounded:
/// at an ambiguous position, when `stats.drawn` is known and more than
/// `max_gap` of reference probability mass lies strictly between the claimed
/// token and the drawn one ([`TokenStats::draw_gap`]), the position admits
/// no such token ([`SampleCheck::FarFromDraw`]), whatever the ε band says.
/// Without `stats.drawn` this is [`check_draw`].
pub fn check_draw_bounded(u: f64, stats: &TokenStats, token: u32, eps: f64, max_gap: f64) -> SampleCheck {
    match (check_draw(u, stats, eps), stats.drawn, stats.draw_gap()) {
        // A NaN gap is refused too.
        (SampleCheck::Ambiguous, Some(d), Some(gap)) if gap.is_nan() || gap > max_gap => {
            SampleCheck::FarFromDraw { token, drawn: d.token, gap }
        }
        (c, ..) => c,
    }
}

/// Classifies draw `u` against `[lo, hi)` with margin `eps`:
/// ambiguous if `|u − lo| ≤ ε` or `|u − hi| ≤ ε`; else inside if
/// `lo < u < hi`; else outside (NaN anywhere is outside).
pub fn check_sample(u: f64, lo: f64, hi: f64, eps: f64) -> SampleCheck {
    if (u - lo).abs() <= eps || (u - hi).abs() <= eps {
        SampleCheck::Ambiguous
    } else if lo < u && u < hi {
        SampleCheck::Inside
    } else {
        SampleCheck::Outside { u, lo, hi }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_probs(logits: &[f32], t: f64) -> Vec<f64> {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let w: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    }

    #[test]
    fn inverse_cdf_fixed_vector() {
        // Probabilities at T=1 of ln([1,2,3,4]) are 0.1, 0.2, 0.3, 0.4.
        let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        let cases = [
            (0.0, 0),
            (0.05, 0),
            (0.0999, 0),
            (0.1001, 1),
            (0.2999, 1),
            (0.3001, 2),
            (0.5999, 2),
            (0.6001, 3),
            (0.9999, 3),
        ];
        for (u, want) in cases {
            assert_eq!(sample_inverse_cdf(&logits, 1.0, u), want, "u={u}");
        }
        assert_eq!(sample_inverse_cdf(&logits, 1.0, 1.0), 3, "u = 1 clamps to last token");
        assert_eq!(sample_inverse_cdf(&logits, 1.0, f64::NAN), 0);
        let (lo, hi) = cdf_interval(&logits, 1.0, 2).unwrap();
        assert!((lo - 0.3).abs() < 1e-6 && (hi - 0.6).abs() < 1e-6);
        assert_eq!(cdf_interval(&logits, 1.0, 4), None);
        // Temperature 0.5 squares the weights: 1,4,9,16 / 30.
        let (lo, hi) = cdf_interval(&logits, 0.5, 3).unwrap();
        assert!((lo - 14.0 / 30.0).abs() < 1e-6 && (hi - 1.0).abs() < 1e-6);
        assert_eq!(sample_inverse_cdf(&logits, 0.5, 14.0 / 30.0 - 1e-6), 2);
        assert_eq!(sample_inverse_cdf(&logits, 0.5, 14.0 / 30.0 + 1e-6), 3);
    }

    #[test]
    fn greedy_and_ties() {
        let logits = [1.0, 5.0, 5.0, 2.0];
        for t in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert_eq!(sample_inverse_cdf(&logits, t, 0.99), 1, "T={t}: first max wins");
        }
        assert_eq!(cdf_interval(&logits, 0.0, 1), Some((0.0, 1.0)));
        assert_eq!(cdf_interval(&logits, 0.0, 0), Some((0.0, 0.0)));
        assert_eq!(cdf_interval(&logits, 0.0, 2), Some((1.0, 1.0)));
        let s = token_stats(&logits, 0.0, 1).unwrap();
        assert_eq!(s.prob_sampling, 1.0);
        // Tied maxima share the mass equally when sampling.
        assert_eq!(sample_inverse_cdf(&logits, 1e-6, 0.49), 1);
        assert_eq!(sample_inverse_cdf(&logits, 1e-6, 0.51), 2);
        assert_eq!(sample_inverse_cdf(&[], 1.0, 0.5), 0);
    }

    #[test]
    fn non_finite_logits() {
        let nan = [f32::NAN, 0.0, f32::NAN, 0.0];
        assert_eq!(sample_inverse_cdf(&nan, 1.0, 0.25), 1);
        assert_eq!(sample_inverse_cdf(&nan, 1.0, 0.75), 3);
        assert_eq!(cdf_interval(&nan, 1.0, 0), Some((0.0, 0.0)));
        assert_eq!(logprob_t1(&nan, 0), Some(f32::NEG_INFINITY));
        assert!((logprob_t1(&nan, 1).unwrap() - 0.5f32.ln()).abs() < 1e-6);
        let inf = [0.0, f32::INFINITY, 3.0, f32::INFINITY];
        assert_eq!(sample_inverse_cdf(&inf, 1.0, 0.2), 1);
        assert_eq!(sample_inverse_cdf(&inf, 1.0, 0.7), 3);
        assert_eq!(logprob_t1(&inf, 2), Some(f32::NEG_INFINITY));
        let all_neg = [f32::NEG_INFINITY; 4];
        assert_eq!(sample_inverse_cdf(&all_neg, 1.0, 0.6), 2, "degenerate: uniform");
        let all_nan = [f32::NAN; 3];
        assert_eq!(sample_inverse_cdf(&all_nan, 1.0, 0.9), 2);
        assert_eq!(sample_inverse_cdf(&all_nan, 0.0, 0.9), 0);
        let s = token_stats(&[f32::NEG_INFINITY, 1.0], 0.7, 0).unwrap();
        assert_eq!(s.prob_sampling, 0.0);
        assert_eq!((s.cdf_lo, s.cdf_hi), (0.0, 0.0));
    }

    #[test]
    fn stats_agree_with_naive_and_with_sampler() {
        let mut st = crate::prf::PrfStream::new("test", &[b"logits"]);
        let logits: Vec<f32> = (0..5000).map(|_| (st.unit_f64() * 20.0 - 10.0) as f32).collect();
        for &t in &[1.0f32, 0.7, 1.3] {
            let p = naive_probs(&logits, t as f64);
            let p1 = naive_probs(&logits, 1.0);
            for _ in 0..200 {
                let u = st.unit_f64();
                let s = sample_with_logprob(&logits, t, u);
                let tok = s.token as usize;
                assert_eq!(tok, sample_inverse_cdf(&logits, t, u));
                let stats = token_stats(&logits, t, tok).unwrap();
                assert!(stats.cdf_lo <= u && u < stats.cdf_hi + 1e-15, "u={u} {stats:?}");
                assert_ne!(
                    check_sample(u, stats.cdf_lo, stats.cdf_hi, 1e-9),
                    SampleCheck::Outside { u, lo: stats.cdf_lo, hi: stats.cdf_hi }
                );
                assert!((stats.prob_sampling as f64 - p[tok]).abs() < 1e-6);
                assert!((stats.logprob_t1 as f64 - p1[tok].ln()).abs() < 1e-4);
                assert!((stats.logprob_t1 - s.logprob_t1).abs() < 1e-5);
                assert_eq!(logprob_t1(&logits, tok), Some(s.logprob_t1), "replay = generation, bit for bit");
                let lo_naive: f64 = p[..tok].iter().sum();
                assert!((stats.cdf_lo - lo_naive).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 * f64::from(i) / 200_000.0;
            let got = f64::from(exp_nonpositive(x as f32));
            let want = f64::from(x as f32).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-87.5), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn fast_sampler_follows_the_exact_rule() {
        let mut st = crate::prf::PrfStream::new("test", &[b"fast"]);
        let mut near_edge = 0;
        for (v, spread) in [(49_152usize, 30.0), (1000, 5.0), (130, 200.0), (7, 3.0)] {
            let logits: Vec<f32> = (0..v).map(|_| ((st.unit_f64() - 0.8) * spread) as f32).collect();
            for &t in &[1.0f32, 0.7, 1.3, 0.05] {
                for _ in 0..300 {
                    let u = st.unit_f64();
                    let fast = sample_with_logprob(&logits, t, u);
                    let exact = sample_with_logprob_exact(&logits, t, u);
                    assert!((fast.logprob_t1 - exact.logprob_t1).abs() < 1e-5, "{fast:?} {exact:?}");
                    if fast.token != exact.token {
                        // only where u is within 1e-6 of the exact rule's edge
                        let (lo, hi) = cdf_interval(&logits, t, exact.token as usize).unwrap();
                        assert!((u - lo).abs().min((u - hi).abs()) < 1e-6, "u={u} [{lo}, {hi}) {fast:?} {exact:?}");
                        near_edge += 1;
                    }
                }
            }
        }
        assert!(near_edge <= 2, "{near_edge} draws differ");
        // u at the ends: u = 1 gives the last token of positive f64 weight;
        // u = 0 the first whose weight is not below f32's range (a token of
        // probability < 1e-38 is as good as an interval edge)
        let logits = [-200.0f32, 1.0, 2.0, -300.0];
        for u in [0.5, 0.999_999_999, 1.0] {
            assert_eq!(
                sample_with_logprob(&logits, 1.0, u).token,
                sample_with_logprob_exact(&logits, 1.0, u).token,
                "u={u}"
            );
        }
        assert_eq!(sample_with_logprob(&logits, 1.0, 0.0).token, 1);
        assert_eq!(sample_with_logprob(&logits, 1.0, 1.0).token, 3);
    }

    #[test]
    fn check_draw_admits_the_tokens_within_eps_of_the_draw() {
        // Probabilities at T=1 of ln([1,2,3,4]) are 0.1, 0.2, 0.3, 0.4.
        let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        let s = token_stats(&logits, 1.0, 2).unwrap();
        let eps = 0.01;
        assert_eq!(check_draw(0.45, &s, eps), SampleCheck::Inside);
        assert_eq!(check_draw(0.305, &s, eps), SampleCheck::Ambiguous, "own interval, near its edge");
        assert_eq!(check_draw(0.295, &s, eps), SampleCheck::Ambiguous, "across the lower edge, within ε");
        assert_eq!(check_draw(0.605, &s, eps), SampleCheck::Ambiguous, "across the upper edge, within ε");
        assert!(matches!(check_draw(0.28, &s, eps), SampleCheck::Outside { .. }));
        assert!(matches!(check_draw(0.62, &s, eps), SampleCheck::Outside { .. }));
        // The same classes as the edge-distance rule on a positive interval.
        for u in [0.0, 0.28, 0.295, 0.3, 0.305, 0.45, 0.595, 0.6, 0.605, 0.62, 0.999] {
            assert_eq!(check_draw(u, &s, eps), check_sample(u, s.cdf_lo, s.cdf_hi, eps), "u={u}");
        }

        // A token of zero weight is never drawn, however close the draw.
        let logits = [1.0f32, f32::NEG_INFINITY, 1.0];
        let masked = token_stats(&logits, 1.0, 1).unwrap();
        assert!(matches!(check_draw(0.5, &masked, 0.01), SampleCheck::Outside { .. }));
        let s = token_stats(&logits, 1.0, 0).unwrap();
        assert_eq!(check_draw(0.505, &s, 0.01), SampleCheck::Ambiguous);
        // NaN is outside; greedy admits only the argmax.
        assert!(matches!(check_draw(f64::NAN, &s, 0.01), SampleCheck::Outside { .. }));
        let g = token_stats(&[1.0, 5.0, 2.0], 0.0, 0).unwrap();
        assert!(matches!(check_draw(0.001, &g, 0.01), SampleCheck::Outside { .. }));
        let g = token_stats(&[1.0, 5.0, 2.0], 0.0, 2).unwrap();
        assert!(matches!(check_draw(0.999, &g, 0.01), SampleCheck::Outside { .. }));
        assert_eq!(check_draw(0.5, &token_stats(&[1.0, 5.0, 2.0], 0.0, 1).unwrap(), 0.01), SampleCheck::Inside);
    }

    #[test]
    fn drift_below_eps_across_a_run_of_narrow_tokens_is_ambiguous_not_outside() {
        // Reproduces CI at 45dc3f0 (attacks.rs, an honest miner): u = 0.982264953,
        // the claimed token's reference interval [0.982264204, 0.982264269) —
        // 7e-7 past its upper edge, beyond its immediate neighbour. Drift
        // between two implementations shifts every edge after a token by the
        // same amount; where the tokens there are narrower than that shift,
        // the honest token lies several ids from the one the reference draws.
        let mut reference = vec![-16.0f32; 202];
        reference[0] = 0.0; // p ≈ 0.98
        reference[100] = -6.0; // p ≈ 2.4e-3 > ε, closing the run
        reference[201] = -3.9;
        let mut miner = reference.clone();
        miner[0] -= 5e-5; // |Δ logprob| 5e-5: within the calibrated drift
        let run_start = token_stats(&reference, 1.0, 1).unwrap().cdf_lo;
        let u = run_start + 2e-7; // just past the likely token's edge
        let honest = sample_inverse_cdf(&miner, 1.0, u);
        let reference_token = sample_inverse_cdf(&reference, 1.0, u);
        let st = token_stats(&reference, 1.0, honest).unwrap();
        assert!(honest > reference_token + 1, "the honest token is not a neighbour: {honest} vs {reference_token}");
        assert!(u < st.cdf_lo && st.cdf_lo - u < DEFAULT_SAMPLE_EPS, "{u} {st:?}");
        assert_eq!(check_draw(u, &st, DEFAULT_SAMPLE_EPS), SampleCheck::Ambiguous, "an honest draw");
        // A narrow token whose interval is farther than ε from the draw is
        // still outside.
        let far = token_stats(&reference, 1.0, 150).unwrap();
        assert!(far.cdf_lo - u > DEFAULT_SAMPLE_EPS, "{far:?}");
        assert!(matches!(check_draw(u, &far, DEFAULT_SAMPLE_EPS), SampleCheck::Outside { .. }));
    }

    #[test]
    fn honest_drift_across_a_run_of_tail_tokens_passes_the_bounded_check() {
        // Issue 28: on the tiny model the validator failed honest rollouts
        // with FarFromDraw (token 38130 vs the reference's draw 38788): in a
        // run of tail tokens of ~3e-7 each, a drift of ~3e-5 in CDF mass is
        // hundreds of ids. Two likely tokens around a run of 4000 tail
        // tokens; the miner's logit for the first one differs by 1e-4 (the
        // calibrated honest |Δl|).
        let mut reference = vec![-10.0f32; 4002];
        reference[0] = 0.0;
        reference[4001] = 0.0;
        let mut miner = reference.clone();
        miner[0] += 1e-4;
        let t = 0.7;
        let run_start = token_stats(&reference, t, 1).unwrap().cdf_lo;
        let run_end = token_stats(&reference, t, 4001).unwrap().cdf_lo;
        let mut crossed = 0u32;
        for k in 1..50 {
            let u = run_start + (run_end - run_start) * f64::from(k) / 50.0;
            let honest = sample_inverse_cdf(&miner, t, u);
            let st = token_stats_at(&reference, t, honest, u).unwrap();
            let drawn = st.drawn.unwrap();
            crossed = crossed.max(drawn.token.abs_diff(honest as u32));
            let c = check_draw_bounded(u, &st, honest as u32, DEFAULT_SAMPLE_EPS, DEFAULT_MAX_DRAW_GAP);
            assert!(matches!(c, SampleCheck::Inside | SampleCheck::Ambiguous), "u={u}: {c:?}, {honest} vs {drawn:?}");
        }
        assert!(crossed > 64, "the honest token lies far from the reference's draw in ids: {crossed}");
    }

    #[test]
    fn an_ambiguous_position_admits_only_tokens_near_the_references_draw_in_mass() {
        // A likely token, then a run of 4000 tail tokens of ~4.5e-6 each:
        // an ε band of 2·3e-4 covers ~130 of them, and the unbounded rule
        // admits every one (review finding E). The bound admits only those
        // within DEFAULT_MAX_DRAW_GAP of mass of the reference's draw.
        let mut logits = vec![-12.0f32; 4002];
        logits[0] = 0.0;
        logits[4001] = -1.0;
        let eps = DEFAULT_SAMPLE_EPS;
        let max = DEFAULT_MAX_DRAW_GAP;
        let lo_run = token_stats(&logits, 1.0, 1).unwrap().cdf_lo;
        let u = lo_run + 0.01;
        let drawn = sample_inverse_cdf(&logits, 1.0, u) as u32;
        let (mut admitted_unbounded, mut far) = (0usize, 0usize);
        let mut admitted = Vec::new();
        for t in 0..logits.len() {
            let st = token_stats_at(&logits, 1.0, t, u).unwrap();
            let d = st.drawn.unwrap();
            assert_eq!(d.token, drawn);
            let plain = check_draw(u, &st, eps);
            let bounded = check_draw_bounded(u, &st, t as u32, eps, max);
            admitted_unbounded += usize::from(!matches!(plain, SampleCheck::Outside { .. }));
            let gap = st.draw_gap().unwrap();
            match bounded {
                SampleCheck::Inside | SampleCheck::Ambiguous => {
                    assert!(gap <= max, "token {t}: gap {gap}");
                    admitted.push((t, st.prob_sampling as f64));
                }
                SampleCheck::FarFromDraw { token, drawn: dt, gap: g } => {
                    assert_eq!((token, dt, g), (t as u32, drawn, gap));
                    assert!(gap > max && plain == SampleCheck::Ambiguous);
                    far += 1;
                }
                SampleCheck::Outside { .. } => assert!(matches!(plain, SampleCheck::Outside { .. })),
            }
        }
        assert!(admitted_unbounded > 100, "{admitted_unbounded}");
        assert!(far > 30, "tokens in the band but beyond the gap are refused: {far}");
        // The admitted tokens are a run of ids around the draw whose joint
        // mass, the draw and the two outermost aside, is at most 2·gap.
        let inner: f64 = admitted.iter().filter(|(t, _)| *t as u32 != drawn).map(|x| x.1).sum::<f64>()
            - admitted.first().unwrap().1
            - admitted.last().unwrap().1;
        assert!(inner <= 2.0 * max, "{inner}");
        assert!(admitted.len() > 10 && admitted.len() < admitted_unbounded, "{}", admitted.len());
        // The claimed token's own interval and the draw's are never counted.
        let st = token_stats_at(&logits, 1.0, drawn as usize + 1, u).unwrap();
        assert_eq!(st.draw_gap(), Some(0.0));
        // Without the reference's draw the bound cannot apply.
        let st = token_stats(&logits, 1.0, 3000).unwrap();
        assert_eq!(st.draw_gap(), None);
        assert_eq!(check_draw_bounded(u, &st, 3000, eps, max), check_draw(u, &st, eps));
    }

    #[test]
    fn check_sample_classes() {
        assert_eq!(check_sample(0.5, 0.2, 0.8, 0.01), SampleCheck::Inside);
        assert_eq!(check_sample(0.205, 0.2, 0.8, 0.01), SampleCheck::Ambiguous);
        assert_eq!(check_sample(0.195, 0.2, 0.8, 0.01), SampleCheck::Ambiguous);
        assert_eq!(check_sample(0.795, 0.2, 0.8, 0.01), SampleCheck::Ambiguous);
        assert_eq!(check_sample(0.805, 0.2, 0.8, 0.01), SampleCheck::Ambiguous);
        assert_eq!(check_sample(0.1, 0.2, 0.8, 0.01), SampleCheck::Outside { u: 0.1, lo: 0.2, hi: 0.8 });
        assert_eq!(check_sample(0.9, 0.2, 0.8, 0.01), SampleCheck::Outside { u: 0.9, lo: 0.2, hi: 0.8 });
        assert!(matches!(check_sample(0.5, f64::NAN, 0.8, 0.01), SampleCheck::Outside { .. }));
        assert_eq!(check_sample(0.5, 0.5, 0.5, 0.0), SampleCheck::Ambiguous);
    }

    #[test]
    fn draws_are_reproducible_and_bound_to_context() {
        let s = Seed([1; 32]);
        let m = [2u8; 32];
        let u = draw_u(&s, &m, 3, 4, 5);
        assert_eq!(u, draw_u(&s, &m, 3, 4, 5));
        assert!((0.0..1.0).contains(&u));
        let others = [
            draw_u(&Seed([0; 32]), &m, 3, 4, 5),
            draw_u(&s, &[0; 32], 3, 4, 5),
            draw_u(&s, &m, 0, 4, 5),
            draw_u(&s, &m, 3, 0, 5),
            draw_u(&s, &m, 3, 4, 0),
        ];
        assert!(others.iter().all(|&o| o != u));
        assert_eq!(format!("{u:.17}"), PINNED_U);
    }

    const PINNED_U: &str = "0.81965523296673171";
}
