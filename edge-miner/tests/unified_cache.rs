//! The miner's unified KV cache (one buffer, the prompt's cells shared by the
//! group, other sequences' cells masked) computes exactly what llama.cpp's
//! default layout (one cache per sequence) computes: every logit of every
//! sequence at every step, bit for bit.
//!
//! Both layouts show each query row the same cells in the same order (the
//! prompt's, then the sequence's own), so with exact numerics they must
//! agree. The unified layout is the one that exercises the vendored change 4
//! of ggml's CPU flash attention (`vendor/README.md` §4): query rows taken
//! heads first and each mask row's unmasked cells gathered once. A gather
//! that dropped, added or reordered a cell — at a word edge, in the tail of
//! the mask row, in the sequence a row belongs to — changes these bits; the
//! per-sequence layout (one query row per stream, every mask row its own)
//! does not depend on that order. A group of 5 (cells of a step not a
//! multiple of the gather's 4-cell words), a 39-token prompt prefilled in
//! micro-batches (prefill rows share the cache too), and 80 steps decoded.

mod common;

use std::num::NonZeroU32;

use edge_miner::llama::{N_UBATCH, llama_backend, with_exact_numerics};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

const GROUP: usize = 5;
const PROMPT: usize = 39;
const STEPS: usize = 80;

/// Teacher-forced decode of `GROUP` sequences after a shared prompt; every
/// sequence's logits at every step, as bits.
fn decode_bits(model: &LlamaModel, unified: bool) -> Vec<Vec<u32>> {
    let cells = if unified { PROMPT + GROUP * STEPS } else { GROUP * (PROMPT + STEPS) };
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(cells as u32))
        .with_kv_unified(unified)
        .with_n_batch(64)
        .with_n_ubatch(N_UBATCH)
        .with_n_seq_max(GROUP as u32)
        .with_n_threads(2)
        .with_n_threads_batch(2);
    let mut ctx = model.new_context(llama_backend().unwrap(), with_exact_numerics(params, false)).unwrap();
    let mut batch = LlamaBatch::new(64, 1);
    for (i, t) in (0..PROMPT).map(|i| 100 + 37 * i as i32).enumerate() {
        batch.add(LlamaToken(t), i as i32, &[0], i + 1 == PROMPT).unwrap();
    }
    ctx.decode(&mut batch).unwrap();
    let mut bits = vec![ctx.get_logits_ith(PROMPT as i32 - 1).iter().map(|x| x.to_bits()).collect::<Vec<_>>()];
    for s in 1..GROUP {
        ctx.copy_kv_cache_seq(0, s as i32, None, None).unwrap();
    }
    for step in 0..STEPS {
        batch.clear();
        for s in 0..GROUP {
            let t = 200 + ((s * 7919 + step * 104_729) % 40_000) as i32;
            batch.add(LlamaToken(t), (PROMPT + step) as i32, &[s as i32], true).unwrap();
        }
        ctx.decode(&mut batch).unwrap();
        for s in 0..GROUP {
            bits.push(ctx.get_logits_ith(s as i32).iter().map(|x| x.to_bits()).collect());
        }
    }
    bits
}

#[test]
fn unified_cache_is_bit_identical_to_a_cache_per_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_tiny(dir.path(), 7);
    let model = LlamaModel::load_from_file(llama_backend().unwrap(), &path, &LlamaModelParams::default()).unwrap();

    let (unified, per_seq) = (decode_bits(&model, true), decode_bits(&model, false));
    assert_eq!(unified.len(), 1 + GROUP * STEPS);
    assert_eq!(unified[0], per_seq[0], "the prompt's last logits");
    for (i, (a, b)) in unified.iter().zip(&per_seq).enumerate().skip(1) {
        let (step, seq) = ((i - 1) / GROUP, (i - 1) % GROUP);
        let first = a.iter().zip(b).position(|(x, y)| x != y);
        assert!(first.is_none(), "step {step}, sequence {seq}: logits differ, first at index {first:?}");
    }
    // the sequences are different rollouts, so a mix-up of cells would show
    assert_ne!(unified[1], unified[2]);
}
