//! The reference model on real checkpoints: the SmolLM2 file (BF16 base if
//! `trainer init-base` made it, else the original Q4_1 dequantized) and the
//! protocol's tiny random model.

use std::sync::{Mutex, MutexGuard, OnceLock};

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};
use tributary_assets as assets;
use tributary_policy::{EvidenceRequest, MIN_SHARED_PREFIX, PolicyError, ReferenceModel, packing_pays, pad_batch};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::gguf::GgmlType;
use tributary_protocol::{sampling, tiny, tokenizer::Tokenizer};

struct Smol {
    model: ReferenceModel,
    tok: Tokenizer,
}

/// One SmolLM2 model per test binary (tests run one at a time through the lock).
fn smol() -> MutexGuard<'static, Smol> {
    static M: OnceLock<Mutex<Smol>> = OnceLock::new();
    M.get_or_init(|| {
        tributary_policy::init_threads(None);
        let bf16 = assets::smollm2_bf16();
        let path = if bf16.exists() { bf16 } else { assets::smollm2_q4_1() };
        let model = ReferenceModel::open(&path, tributary_policy::default_device()).expect("load SmolLM2");
        let tok = Tokenizer::from_gguf_file(&assets::smollm2_q4_1()).expect("tokenizer");
        Mutex::new(Smol { model, tok })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

fn chatml(tok: &Tokenizer, user: &str) -> Result<Vec<u32>> {
    Ok(tok.encode(&format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"))?)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn greedy_chatml_answer_is_sensible() -> Result<()> {
    let s = smol();
    let mut ids = chatml(&s.tok, "What is the capital of France?")?;
    let prompt_len = ids.len();
    for _ in 0..8 {
        let (batch, _) = pad_batch(&[&ids], s.model.dims().vocab_size, 0, s.model.device())?;
        let logits = tch::no_grad(|| s.model.forward(&batch))?.logits;
        let next = logits.get(0).get(ids.len() as i64 - 1).argmax(0, false).int64_value(&[]);
        ids.push(u32::try_from(next)?);
    }
    let text = s.tok.decode(&ids[prompt_len..])?;
    println!("greedy continuation: {text:?}");
    assert!(text.contains("Paris"), "greedy answer {text:?} does not name Paris");
    Ok(())
}

#[test]
fn right_padding_changes_real_positions_only_by_rounding() -> Result<()> {
    let s = smol();
    let a = chatml(&s.tok, "Name three colours.")?;
    let b = chatml(&s.tok, "Write a short sentence about the sea and the wind that blows over it at night.")?;
    assert!(b.len() > a.len() + 5);
    let vocab = s.model.dims().vocab_size;
    let dev = s.model.device();
    let (alone, _) = pad_batch(&[&a], vocab, 0, dev)?;
    // Padding with EOS rather than 0: any valid id must be harmless.
    let (batch, lens) = pad_batch(&[&b, &a], vocab, 2, dev)?;
    assert_eq!(lens, [b.len(), a.len()]);
    let (one, many) =
        tch::no_grad(|| -> Result<_, PolicyError> { Ok((s.model.forward(&alone)?, s.model.forward(&batch)?)) })?;
    let n = a.len() as i64;
    let dh = max_abs_diff(&one.hidden.get(0), &many.hidden.get(1).narrow(0, 0, n));
    let lsm = |t: &Tensor| t.log_softmax(-1, Kind::Float);
    let dl = max_abs_diff(&lsm(&one.logits.get(0)), &lsm(&many.logits.get(1).narrow(0, 0, n)));
    let scale = one.hidden.abs().max().double_value(&[]);
    println!("padding: max |Δh| = {dh:e} (max |h| = {scale:.1}), max |Δ log p| = {dl:e}");
    // Not bitwise: libtorch's f32 GEMMs block differently for a different
    // row count (B·L), which moves the last bits (measured ~6e-7 relative).
    // Attending to padding would move values by orders of magnitude more.
    assert!(dh <= 1e-5 * scale, "hidden states differ by {dh} (relative {:e})", dh / scale);
    assert!(dl <= 5e-4, "log-probabilities differ by {dl}");
    Ok(())
}

#[test]
fn shared_prefix_forward_matches_separate_forwards() -> Result<()> {
    let s = smol();
    let vocab = s.model.dims().vocab_size;
    let dev = s.model.device();
    let prompt = chatml(&s.tok, "What is 12 times 7?")?;
    let conts = [s.tok.encode("12 times 7 is 84.")?, s.tok.encode("Let me think step by step. 12 × 7 = 84")?, vec![2]];
    let (pre, _) = pad_batch(&[&prompt], vocab, 0, dev)?;
    let refs: Vec<&[u32]> = conts.iter().map(Vec::as_slice).collect();
    let (cont, _) = pad_batch(&refs, vocab, 2, dev)?;
    let (hp, hs) = tch::no_grad(|| s.model.forward_hidden_shared_prefix(&pre, &cont))?;
    let p = prompt.len() as i64;
    for (i, c) in conts.iter().enumerate() {
        let full: Vec<u32> = prompt.iter().chain(c).copied().collect();
        let (one, _) = pad_batch(&[&full], vocab, 0, dev)?;
        let h = tch::no_grad(|| s.model.forward_hidden(&one))?.get(0);
        let scale = h.abs().max().double_value(&[]);
        let dp = max_abs_diff(&h.narrow(0, 0, p), &hp.get(0));
        let ds = max_abs_diff(&h.narrow(0, p, c.len() as i64), &hs.get(i as i64).narrow(0, 0, c.len() as i64));
        println!("continuation {i}: prefix max |Δh| {dp:e}, continuation {ds:e} (max |h| {scale:.1})");
        assert!(dp <= 1e-5 * scale && ds <= 1e-5 * scale, "shared-prefix forward differs: {dp} / {ds}");
    }
    assert!(
        matches!(s.model.forward_hidden_shared_prefix(&cont, &pre), Err(PolicyError::Request(_))),
        "a prefix must be one sequence"
    );
    Ok(())
}

/// A packed row (two questions after a common prefix, each with two
/// continuations, no padding; one block mask and per-token positions) gives
/// each sequence's full forward at every position it holds, up to rounding;
/// so does the same row with no prefix at all. Malformed layouts are refused.
#[test]
fn packed_forward_matches_separate_forwards() -> Result<()> {
    let s = smol();
    let vocab = s.model.dims().vocab_size;
    let dev = s.model.device();
    let system = "<|im_start|>system\nSolve the problem. End with a line `Answer: <number>`.<|im_end|>\n";
    let q1 = [s.tok.encode(system)?, chatml(&s.tok, "What is 12 times 7?")?].concat();
    let q2 = [s.tok.encode(system)?, chatml(&s.tok, "What is 31 plus 4?")?].concat();
    let common = q1.iter().zip(&q2).take_while(|(a, b)| a == b).count() - 1;
    assert!(common >= 20, "the prompts share their system turn: {common}");
    let conts = [
        vec![s.tok.encode("12 times 7 is 84.")?, s.tok.encode("Let me think. 12 × 7 = 84")?],
        vec![s.tok.encode("35")?, s.tok.encode("31 + 4 = 35, so the answer is 35.")?],
    ];
    for p0 in [common, 0] {
        // Row layout: [q1 tail | c11 | c12 | q2 tail | c21 | c22]; segment id and
        // part (0 = question, k = continuation k) of every row token.
        let (mut ids, mut pos, mut who) = (Vec::new(), Vec::new(), Vec::new());
        for (g, (q, cs)) in [(&q1, &conts[0]), (&q2, &conts[1])].into_iter().enumerate() {
            for (i, &t) in q[p0..].iter().enumerate() {
                ids.push(i64::from(t));
                pos.push((p0 + i) as i64);
                who.push((g, 0));
            }
            for (k, c) in cs.iter().enumerate() {
                for (i, &t) in c.iter().enumerate() {
                    ids.push(i64::from(t));
                    pos.push((q.len() + i) as i64);
                    who.push((g, k + 1));
                }
            }
        }
        let n = ids.len();
        let mut mask = vec![false; n * n];
        for i in 0..n {
            for j in 0..=i {
                mask[i * n + j] = who[j].0 == who[i].0 && (who[j].1 == 0 || who[j].1 == who[i].1);
            }
        }
        let past = if p0 == 0 {
            Vec::new()
        } else {
            let (pre, _) = pad_batch(&[&q1[..p0]], vocab, 0, dev)?;
            tch::no_grad(|| s.model.prefix_kv(&pre))?
        };
        let row = Tensor::from_slice(&ids).view([1, -1]);
        let h = tch::no_grad(|| s.model.forward_hidden_packed(&past, &row, &pos, &mask))?.get(0);
        let mut at = 0i64;
        for (q, cs) in [(&q1, &conts[0]), (&q2, &conts[1])] {
            let qn = (q.len() - p0) as i64;
            let mut seen_question = false;
            for c in cs {
                let full: Vec<u32> = q.iter().chain(c).copied().collect();
                let (one, _) = pad_batch(&[&full], vocab, 0, dev)?;
                let want = tch::no_grad(|| s.model.forward_hidden(&one))?.get(0);
                let scale = want.abs().max().double_value(&[]);
                if !seen_question {
                    let d = max_abs_diff(&h.narrow(0, at, qn), &want.narrow(0, p0 as i64, qn));
                    assert!(d <= 1e-5 * scale, "prefix {p0}: question rows differ by {d}");
                    at += qn;
                    seen_question = true;
                }
                let cn = c.len() as i64;
                let d = max_abs_diff(&h.narrow(0, at, cn), &want.narrow(0, q.len() as i64, cn));
                println!("prefix {p0}, continuation of {cn} tokens: max |Δh| {d:e} (max |h| {scale:.1})");
                assert!(d <= 1e-5 * scale, "prefix {p0}: packed forward differs by {d}");
                at += cn;
            }
        }
        assert_eq!(at as usize, n);
        assert!(
            matches!(s.model.forward_hidden_packed(&past, &row, &pos[1..], &mask), Err(PolicyError::Request(_))),
            "a position per token"
        );
        assert!(
            matches!(s.model.forward_hidden_packed(&past, &row, &pos, &mask[1..]), Err(PolicyError::Request(_))),
            "a mask entry per pair"
        );
        let mut far = pos.clone();
        far[0] = s.model.dims().context_length as i64;
        assert!(matches!(s.model.forward_hidden_packed(&past, &row, &far, &mask), Err(PolicyError::TooLong { .. })));
    }
    Ok(())
}

/// Evidence after a cached prefix (two groups in one packed row, hidden
/// rows asked for past the prefix) gives the figures of the plain evidence
/// call, up to rounding; a prefix the requests do not start with, or one
/// that covers a hidden position, falls back to the plain layout.
#[test]
fn evidence_after_a_cached_prefix_matches_plain_evidence() -> Result<()> {
    let s = smol();
    let eos = s.tok.eos_id();
    let system = "<|im_start|>system\nSolve the problem. End with a line `Answer: <number>`.<|im_end|>\n";
    let q1 = [s.tok.encode(system)?, chatml(&s.tok, "What is 12 times 7?")?].concat();
    let q2 = [s.tok.encode(system)?, chatml(&s.tok, "What is 31 plus 4?")?].concat();
    let seqs: Vec<(Vec<u32>, usize)> = [
        (&q1, "12 times 7 is 84.<|im_end|>"),
        (&q1, "Let me think. 12 × 7 = 84"),
        (&q2, "35"),
        (&q2, "31 + 4 = 35, so Answer: 35<|im_end|>"),
    ]
    .iter()
    .map(|(q, c)| Ok(([q.as_slice(), &s.tok.encode(c)?].concat(), q.len())))
    .collect::<Result<_>>()?;
    let common = q1.iter().zip(&q2).take_while(|(a, b)| a == b).count();
    let cache = s.model.prefix_cache(&q1[..common])?;
    let hidden: Vec<Vec<usize>> = seqs.iter().map(|(t, p)| vec![*p - 1, t.len() - 1]).collect();
    let reqs: Vec<EvidenceRequest<'_>> = seqs
        .iter()
        .zip(&hidden)
        .map(|((t, p), h)| EvidenceRequest { tokens: t, prompt_len: *p, temperature: 0.7, eos, hidden_positions: h })
        .collect();
    let draws: Vec<Vec<f64>> =
        seqs.iter().map(|(t, p)| (0..t.len() - p).map(|j| (j as f64 * 0.618_034).fract()).collect()).collect();
    let draw_refs: Vec<&[f64]> = draws.iter().map(Vec::as_slice).collect();
    let layout: Vec<(&[u32], usize)> = seqs.iter().map(|(t, p)| (t.as_slice(), *p)).collect();
    assert!(packing_pays(s.model.dims(), &layout, common), "short completions after a shared prompt pack");
    let want: Vec<_> =
        reqs.iter().zip(&draw_refs).map(|(r, d)| s.model.evidence_drawn(&[*r], &[d])).collect::<Result<Vec<_>, _>>()?;
    let other = s.model.prefix_cache(&s.tok.encode("<|im_start|>system\nBe brief.")?)?;
    let mut cut = s.model.prefix_cache(&q1[..q1.len() - 1])?.truncated(common)?;
    assert!(s.model.prefix_cache(&q1[..4])?.truncated(5).is_err());
    for (name, c) in [("cached", &cache), ("cut from a longer prefix", &mut cut), ("not a prefix", &other)] {
        let got = s.model.evidence_drawn_after(Some(c), &reqs, &draw_refs)?;
        for (g, w) in got.iter().zip(&want) {
            let w = &w[0];
            let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
            assert_eq!(g.len(), w.len());
            assert!(diff(&g.logprob, &w.logprob) < 5e-4, "{name}: logprob {:?} vs {:?}", g.logprob, w.logprob);
            assert!(diff(&g.cdf_lo, &w.cdf_lo) < 5e-4 && diff(&g.prob_temp, &w.prob_temp) < 5e-4, "{name}");
            let dh = g.hidden.iter().zip(&w.hidden).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert_eq!(g.hidden.len(), w.hidden.len());
            assert!(dh < 1e-3, "{name}: hidden rows differ by {dh}");
            assert_eq!(
                g.drawn.iter().map(|d| d.token).collect::<Vec<_>>(),
                w.drawn.iter().map(|d| d.token).collect::<Vec<_>>()
            );
        }
    }
    // A hidden position inside the prefix: the plain layout, same figures.
    let inside = [1usize];
    let r = EvidenceRequest { hidden_positions: &inside, ..reqs[0] };
    let a = s.model.evidence_drawn_after(Some(&cache), &[r], &[draw_refs[0]])?;
    let b = s.model.evidence_drawn(&[r], &[draw_refs[0]])?;
    assert_eq!(a[0].hidden, b[0].hidden);
    Ok(())
}

/// The prefix kept between groups: the first prompt but its last token,
/// then cut to what the next prompt shares (the same keys and values as
/// computed afresh); computed afresh for a prompt that shares too little.
#[test]
fn the_prefix_kept_between_groups_is_what_their_prompts_share() -> Result<()> {
    let s = smol();
    let system =
        s.tok.encode("<|im_start|>system\nSolve the problem. End with a line `Answer: <number>`.<|im_end|>\n")?;
    let prompt = |q: &str| -> Result<Vec<u32>> { Ok([system.as_slice(), &chatml(&s.tok, q)?].concat()) };
    let (p1, p2) = (prompt("What is 12 times 7?")?, prompt("What is 31 plus 4?")?);
    let common = p1.iter().zip(&p2).take_while(|(a, b)| a == b).count();
    let mut cache = None;
    assert_eq!(s.model.prefix_for(&mut cache, &p1, MIN_SHARED_PREFIX)?.tokens(), &p1[..p1.len() - 1]);
    assert_eq!(s.model.prefix_for(&mut cache, &p2, MIN_SHARED_PREFIX)?.tokens(), &p2[..common]);
    assert_eq!(s.model.prefix_for(&mut cache, &p1, MIN_SHARED_PREFIX)?.len(), common, "kept, not grown");
    let fresh = s.model.prefix_cache(&p1[..common])?;
    for ((k, v), (fk, fv)) in cache.as_ref().context("kept")?.kv().iter().zip(fresh.kv()) {
        assert!(k.allclose(fk, 1e-5, 1e-5, false) && v.allclose(fv, 1e-5, 1e-5, false));
    }
    let other = chatml(&s.tok, "Hello there, how are you today?")?;
    assert_eq!(s.model.prefix_for(&mut cache, &other, MIN_SHARED_PREFIX)?.tokens(), &other[..other.len() - 1]);
    Ok(())
}

/// Decoding with the key/value cache (the prompt in one call, a chunk of
/// three, then a token at a time, 48 positions past the prompt) gives the
/// full forward's log-probabilities at every position, up to rounding; a
/// step past the context is refused and leaves the cache as it was.
#[test]
fn cached_decoding_matches_the_full_forward() -> Result<()> {
    let s = smol();
    let vocab = s.model.dims().vocab_size;
    let mut ids = chatml(&s.tok, "List the first ten prime numbers, then explain why 1 is not prime.")?;
    let p = ids.len();
    let mut cache = s.model.kv_cache();
    let mut rows = vec![tch::no_grad(|| s.model.decode(&mut cache, &ids))?];
    let chunk = s.tok.encode("The first")?;
    assert!(chunk.len() >= 2);
    ids.extend(&chunk);
    rows.push(tch::no_grad(|| s.model.decode(&mut cache, &chunk))?);
    while ids.len() < p + 48 {
        let next = u32::try_from(rows.last().context("a row")?.argmax(0, false).int64_value(&[]))?;
        ids.push(next);
        rows.push(tch::no_grad(|| s.model.decode(&mut cache, &[next]))?);
    }
    assert_eq!(cache.len(), ids.len());
    let (batch, _) = pad_batch(&[&ids], vocab, 0, s.model.device())?;
    let full = tch::no_grad(|| s.model.forward(&batch))?.logits.get(0).log_softmax(-1, Kind::Float);
    // The positions whose logits each decode call returned.
    let mut at = vec![p - 1, p + chunk.len() - 1];
    at.extend(p + chunk.len()..ids.len());
    assert_eq!(at.len(), rows.len());
    let mut worst = 0f64;
    for (row, &i) in rows.iter().zip(&at) {
        worst = worst.max(max_abs_diff(&row.log_softmax(-1, Kind::Float), &full.get(i as i64)));
    }
    println!("cached decoding over {} positions: max |Δ log p| = {worst:e}", rows.len());
    assert!(worst <= 5e-4, "cached decoding differs from the full forward by {worst}");

    let room = s.model.dims().context_length - cache.len();
    let long = vec![1u32; room + 1];
    assert!(matches!(s.model.decode(&mut cache, &long), Err(PolicyError::TooLong { .. })));
    assert!(matches!(s.model.decode(&mut cache, &[vocab as u32]), Err(PolicyError::TokenOutOfRange { .. })));
    assert!(matches!(s.model.decode(&mut cache, &[]), Err(PolicyError::Request(_))));
    assert_eq!(cache.len(), ids.len(), "a refused step changed the cache");
    Ok(())
}

#[test]
fn log_softmax_rows_sum_to_one_and_hidden_is_normalised() -> Result<()> {
    let s = smol();
    let ids = chatml(&s.tok, "Count from one to five.")?;
    let (batch, _) = pad_batch(&[&ids], s.model.dims().vocab_size, 0, s.model.device())?;
    let out = tch::no_grad(|| s.model.forward(&batch))?;
    assert_eq!(out.logits.size(), [1, ids.len() as i64, s.model.dims().vocab_size as i64]);
    let sums = out.logits.log_softmax(-1, Kind::Double).exp().sum_dim_intlist(-1, false, Kind::Double);
    let worst = (sums - 1.0).abs().max().double_value(&[]);
    assert!(worst < 1e-9, "a row of exp(log_softmax) sums to 1 ± {worst}");
    // h = rmsnorm(x)·w, so h / w has unit RMS (what llama.cpp's embeddings satisfy).
    let w = s.model.var_store().variables()["output_norm.weight"].shallow_clone();
    let rms = (out.hidden.get(0) / w).square().mean_dim(-1, false, Kind::Double).sqrt();
    let (lo, hi) = (rms.min().double_value(&[]), rms.max().double_value(&[]));
    assert!((lo - 1.0).abs() < 1e-3 && (hi - 1.0).abs() < 1e-3, "RMS of h/w in [{lo}, {hi}]");
    Ok(())
}

#[test]
fn evidence_agrees_with_protocol_sampling_rule() -> Result<()> {
    let s = smol();
    let prompt = chatml(&s.tok, "Say hello.")?;
    let mut ids = prompt.clone();
    ids.extend(s.tok.encode("Hello! How can I help you today?<|im_end|>")?);
    let eos = s.tok.eos_id();
    assert_eq!(*ids.last().unwrap(), eos);
    let hidden_positions: Vec<usize> = (0..ids.len()).collect();
    let (batch, _) = pad_batch(&[&ids], s.model.dims().vocab_size, 0, s.model.device())?;
    let full = tch::no_grad(|| s.model.forward(&batch))?;
    for temperature in [0.7f32, 1.0, 0.0] {
        let req = EvidenceRequest {
            tokens: &ids,
            prompt_len: prompt.len(),
            temperature,
            eos,
            hidden_positions: &hidden_positions,
        };
        // Alone and next to a longer rollout: the figures must not move.
        let long: Vec<u32> = ids.iter().chain(ids.iter()).copied().collect();
        let other = EvidenceRequest { tokens: &long, hidden_positions: &[], ..req };
        let ev = s.model.evidence(&[req])?.remove(0);
        let ev2 = s.model.evidence(&[other, req])?.remove(1);
        assert!(ev.drawn.is_empty(), "no draws, no drawn tokens");
        // With a draw per position: the token the protocol's rule draws from
        // the same logits (issue 28 item 5). Draws spread over [0, 1).
        let draws: Vec<f64> = (0..ev.len()).map(|j| (j as f64 * 0.618_034).fract()).collect();
        let drawn = s.model.evidence_drawn(&[req], &[&draws])?.remove(0);
        assert_eq!(drawn.drawn.len(), ev.len());
        assert!(s.model.evidence_drawn(&[req], &[&draws[1..]]).is_err(), "one draw per completion token");
        assert_eq!(ev.len(), ids.len() - prompt.len());
        let hidden_full: Vec<f32> = Vec::try_from(full.hidden.get(0).flatten(0, -1))?;
        let dh = hidden_full.iter().zip(&ev.hidden).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(dh <= 1e-5, "evidence hidden rows differ from forward by {dh}");
        #[allow(clippy::needless_range_loop)] // j indexes the evidence, the draws and the positions together
        for j in 0..ev.len() {
            let p = prompt.len() + j;
            let row: Vec<f32> = Vec::try_from(full.logits.get(0).get(p as i64 - 1))?;
            let st = sampling::token_stats(&row, temperature, ids[p] as usize).context("token in range")?;
            let close_to = |a: f64, b: f64, tol: f64, what: &str| {
                assert!((a - b).abs() <= tol, "T={temperature} pos {p} {what}: evidence {a} vs protocol {b}");
            };
            let close = |a: f64, b: f64, what: &str| close_to(a, b, 1e-5, what);
            close(ev.logprob[j], f64::from(st.logprob_t1), "logprob");
            close(ev.prob_t1[j], f64::from(st.prob_t1), "prob_t1");
            close(ev.prob_temp[j], f64::from(st.prob_sampling), "prob_temp");
            close(ev.cdf_lo[j], st.cdf_lo, "cdf_lo");
            close(ev.cdf_hi[j], st.cdf_hi, "cdf_hi");
            let want = sampling::sample_inverse_cdf(&row, temperature, draws[j]) as u32;
            // The same token, unless the draw lies within rounding of its edge.
            let w = sampling::token_stats(&row, temperature, want as usize).context("drawn token")?;
            let at_edge = [w.cdf_lo, w.cdf_hi].iter().any(|e| (e - draws[j]).abs() < 1e-6);
            let d = drawn.drawn[j];
            assert!(d.token == want || at_edge, "T={temperature} pos {p}: drawn {} vs {want}", d.token);
            // Its interval, which the draw-gap bound measures from.
            let di = sampling::token_stats(&row, temperature, d.token as usize).context("drawn token")?;
            close(d.lo, di.cdf_lo, "drawn lo");
            close(d.hi, di.cdf_hi, "drawn hi");
            // Next to a longer rollout the padded length differs: rounding
            // only (see the padding test).
            close_to(ev2.cdf_lo[j], ev.cdf_lo[j], 5e-4, "batched cdf_lo");
            close_to(ev2.logprob[j], ev.logprob[j], 5e-4, "batched logprob");
        }
        let last: Vec<f32> = Vec::try_from(full.logits.get(0).get(ids.len() as i64 - 2))?;
        let eos_p = sampling::token_stats(&last, 1.0, eos as usize).context("eos")?.prob_t1;
        assert!((ev.eos_prob_last - f64::from(eos_p)).abs() <= 1e-5);
        println!(
            "T={temperature}: eos prob at the end {:.4}, mean logprob {:.3}",
            ev.eos_prob_last,
            ev.logprob.iter().sum::<f64>() / ev.len() as f64
        );
    }
    Ok(())
}

#[test]
fn untrusted_input_is_rejected_not_indexed() -> Result<()> {
    let s = smol();
    let vocab = s.model.dims().vocab_size;
    let dev = s.model.device();
    let bad = [1u32, 2, vocab as u32];
    assert!(matches!(pad_batch(&[&bad], vocab, 0, dev), Err(PolicyError::TokenOutOfRange { index: Some(2), .. })));
    let t = Tensor::from_slice(&[1i64, -3, 5]).view([1, 3]);
    assert!(matches!(s.model.forward(&t), Err(PolicyError::TokenOutOfRange { .. })));
    let t = Tensor::from_slice(&[1i64, 70_000]).view([1, 2]);
    assert!(matches!(s.model.forward(&t), Err(PolicyError::TokenOutOfRange { .. })));
    assert!(matches!(s.model.forward(&Tensor::from_slice(&[1i64, 2])), Err(PolicyError::Request(_))));
    let ok = [1u32, 2, 3];
    let req = EvidenceRequest { tokens: &ok, prompt_len: 3, temperature: 1.0, eos: 2, hidden_positions: &[] };
    assert!(matches!(s.model.evidence(&[req]), Err(PolicyError::Request(_))), "prompt_len must leave a completion");
    let req = EvidenceRequest { prompt_len: 1, hidden_positions: &[3], ..req };
    assert!(matches!(s.model.evidence(&[req]), Err(PolicyError::Request(_))));
    let req = EvidenceRequest { hidden_positions: &[], eos: vocab as u32, ..req };
    assert!(matches!(s.model.evidence(&[req]), Err(PolicyError::TokenOutOfRange { .. })));
    let too_long = vec![1u32; s.model.dims().context_length + 1];
    let (t, _) = pad_batch(&[&too_long], vocab, 0, dev)?;
    assert!(matches!(s.model.forward(&t), Err(PolicyError::TooLong { .. })));
    Ok(())
}

fn tiny_checkpoint() -> Result<Checkpoint> {
    let src = Checkpoint::open(&assets::smollm2_q4_1())?;
    Ok(Checkpoint::from_bytes(tiny::tiny_checkpoint_bytes(7, &src)?)?)
}

#[test]
fn tiny_model_is_differentiable_and_exports_its_bf16_bits() -> Result<()> {
    let ckpt = tiny_checkpoint()?;
    let model = ReferenceModel::load(&ckpt, Device::Cpu)?;
    assert!(model.is_tied());
    assert_eq!(model.dims().n_head_kv * 2, model.dims().n_head);

    // Export: BF16 tensors come back bit-exact, F32 ones rounded.
    let exported = model.export_bf16_tensors()?;
    assert_eq!(exported.len(), ckpt.header().tensors.len());
    for (name, bits) in &exported {
        let info = ckpt.tensor_info(name).context("exported a tensor the file lacks")?;
        let raw = ckpt.tensor_bytes(name).context("bytes")?;
        match info.ty {
            GgmlType::BF16 => {
                let file: Vec<u16> = raw.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                assert!(file == *bits, "{name}: exported BF16 differs from the file");
            }
            _ => {
                let f = ckpt.tensor_f32(name)?;
                let back: Vec<f32> = bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
                let worst = f.iter().zip(&back).map(|(a, b)| ((a - b) / a).abs()).fold(0f32, f32::max);
                assert!(worst <= 1.0 / 256.0, "{name}: BF16 rounding off by {worst}");
            }
        }
    }

    // Gradient of a next-token loss reaches the first block's query weights.
    let ids: Vec<u32> = vec![1, 4093, 198, 19556, 17, 2, 198, 1, 520, 9531, 198, 19556];
    let (batch, _) = pad_batch(&[&ids], model.dims().vocab_size, 0, Device::Cpu)?;
    let logits = model.forward(&batch)?.logits;
    let n = ids.len() as i64;
    let targets = batch.narrow(1, 1, n - 1).reshape([-1]);
    let loss = logits.narrow(1, 0, n - 1).reshape([n - 1, -1]).cross_entropy_for_logits(&targets);
    loss.backward();
    let q = &model.var_store().variables()["blk.0.attn_q.weight"];
    let g = q.grad().abs().sum(Kind::Double).double_value(&[]);
    assert!(g.is_finite() && g > 0.0, "no gradient reached blk.0.attn_q.weight ({g})");
    Ok(())
}

/// `load_for_inference` holds a checkpoint as BF16 only when that keeps its
/// bits (every matrix BF16): the tiny model's 2 bytes a matrix element and the
/// same logits as the f32-held model; the quantised SmolLM2 file in f32.
#[test]
fn load_for_inference_holds_bf16_only_when_the_bits_are_kept() -> Result<()> {
    let ckpt = tiny_checkpoint()?;
    let (mut matrices, mut vectors) = (0usize, 0usize);
    for t in &ckpt.header().tensors {
        if t.dims.len() >= 2 { matrices += t.n_elements() as usize } else { vectors += t.n_elements() as usize }
    }
    let held = ReferenceModel::load_for_inference(&ckpt, Device::Cpu)?;
    assert_eq!(held.parameter_bytes(), 2 * matrices + 4 * vectors);
    let f32_held = ReferenceModel::load(&ckpt, Device::Cpu)?;
    assert_eq!(f32_held.parameter_bytes(), 4 * (matrices + vectors));
    let tokens = Tensor::randint_low(0, 49152, [2, 29], (Kind::Int64, Device::Cpu));
    tch::no_grad(|| -> Result<()> {
        let (a, b) = (held.forward(&tokens)?, f32_held.forward(&tokens)?);
        assert!(a.logits.equal(&b.logits) && a.hidden.equal(&b.hidden), "BF16-held forward differs");
        let wide = held.widened_copy()?.context("a BF16-held model widens")?;
        assert_eq!(wide.parameter_bytes(), 4 * (matrices + vectors));
        let c = wide.forward(&tokens)?;
        assert!(c.logits.equal(&a.logits) && c.hidden.equal(&a.hidden), "the widened copy's forward differs");
        assert!(f32_held.widened_copy()?.is_none(), "an f32-held model has nothing to widen");
        Ok(())
    })?;

    let q4 = Checkpoint::open(&assets::smollm2_q4_1())?;
    assert!(!ReferenceModel::can_hold_bf16(&q4));
    let elements: u64 = q4.header().tensors.iter().map(|t| t.n_elements()).sum();
    let model = ReferenceModel::load_for_inference(&q4, Device::Cpu)?;
    assert_eq!(model.parameter_bytes(), 4 * elements as usize, "a quantised file is held in f32");
    Ok(())
}

/// Cached decoding reproduces the full forward in every supported family's
/// layout (the tiny `llama`, `llama3` RoPE scaling, `qwen2` Q/K/V biases and
/// NEOX RoPE, `qwen3` per-head q/k norms), held as BF16 and from its
/// widened f32 copy alike (the re-generation's two ways to decode).
#[test]
fn cached_decoding_matches_the_full_forward_in_every_family() -> Result<()> {
    let src = Checkpoint::open(&assets::smollm2_q4_1())?;
    let dir = std::env::temp_dir().join(format!("tributary-policy-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for family in tiny::TinyFamily::ALL {
        let path = dir.join(format!("{}.gguf", family.name()));
        tiny::write_tiny_family(family, 11, &src, &path)?;
        let held = ReferenceModel::load_for_inference(&Checkpoint::open(&path)?, Device::Cpu)?;
        let wide = held.widened_copy()?.context("a BF16 tiny model widens")?;
        let ids: Vec<u32> = (0..40u32).map(|i| 17 + 997 * i % 49000).collect();
        let (batch, _) = pad_batch(&[&ids], held.dims().vocab_size, 0, Device::Cpu)?;
        let full = tch::no_grad(|| held.forward(&batch))?.logits.get(0).log_softmax(-1, Kind::Float);
        for model in [&held, &wide] {
            let mut cache = model.kv_cache();
            let mut worst = 0f64;
            let first = tch::no_grad(|| model.decode(&mut cache, &ids[..20]))?;
            worst = worst.max(max_abs_diff(&first.log_softmax(-1, Kind::Float), &full.get(19)));
            for (i, &t) in ids.iter().enumerate().skip(20) {
                let row = tch::no_grad(|| model.decode(&mut cache, &[t]))?;
                worst = worst.max(max_abs_diff(&row.log_softmax(-1, Kind::Float), &full.get(i as i64)));
            }
            println!("{}: cached decoding max |Δ log p| = {worst:e}", family.name());
            // Rounding only (~7e-5 here); RoPE at the wrong offset gives ~55.
            assert!(worst <= 5e-4, "{}: cached decoding differs by {worst}", family.name());
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
