//! Speed of the miner's generation against raw llama.cpp (issue #3.8: goal
//! ratio ≥ 0.95), same model, batch shape and thread count.
//!
//! - raw: llama.cpp alone at its defaults (flash attention on, f16 KV cache)
//!   — embeddings off, llama.cpp's own `temp`+`dist` sampler, no
//!   log-probabilities, no sketches;
//! - raw, miner numerics: the same with the settings the proof contract needs
//!   for plain-f32 numerics ([`with_exact_numerics`]: an F32 KV cache that the
//!   vendored llama.cpp keeps F32 in flash attention; docs/calibration.md §1),
//!   so the gap splits into numerics and proof work;
//! - raw greedy: llama.cpp's defaults with its `greedy` sampler (an argmax,
//!   no softmax) — the strictest anchor, as no sampler costs less;
//! - miner: [`LlamaCppBackend::generate_group`] — embeddings on, the protocol's
//!   seeded sampler with raw log-probabilities, a sketch at every position
//!   (plus the extra decode that gives the last token's state). Its sampler
//!   (vectorised, `cargo bench -p tributary-protocol --bench sampling`) is
//!   cheaper than llama.cpp's `temp`+`dist` chain, which is why "proof work"
//!   can come out above 1.
//!
//! Both prefill the prompt once and copy its KV cache to every sequence, and
//! run exactly `--max-new-tokens` tokens per sequence (no EOG stop).
//!
//! `cargo run -p edge-miner --bin gen-bench -- --group 8 --max-new-tokens 128`

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use edge_miner::backend::{Backend, DrawKey, GroupRequest};
use edge_miner::llama::{
    LlamaConfig, LlamaCppBackend, N_UBATCH, PREFILL_CHUNK, default_threads, llama_backend, with_exact_numerics,
};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use tributary_assets as assets;
use tributary_protocol::chat::chatml_prompt;
use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

#[derive(Parser, Debug)]
struct Args {
    /// GGUF model (default: the SmolLM2 Q4_1 file).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 8)]
    group: usize,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// CPU threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Alternating repetitions of each variant (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// The raw llama.cpp arms (module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RawArm {
    /// llama.cpp's defaults and its `temp`+`dist` sampler.
    Defaults,
    /// The same with the miner's numerics ([`with_exact_numerics`]).
    MinerNumerics,
    /// The defaults with llama.cpp's `greedy` sampler.
    Greedy,
}

/// Raw llama.cpp: returns generated tokens (all sequences).
fn raw(
    backend: &LlamaCppBackend,
    prompt: &[u32],
    g: usize,
    m: usize,
    t: f32,
    threads: i32,
    arm: RawArm,
) -> Result<usize> {
    let model = backend.model();
    let per_seq = prompt.len() + m;
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new((g * per_seq) as u32))
        .with_n_batch(PREFILL_CHUNK.max(g) as u32)
        .with_n_ubatch(N_UBATCH)
        .with_n_seq_max(g as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    if arm == RawArm::MinerNumerics {
        params = with_exact_numerics(params, false);
    }
    let mut ctx = model.new_context(llama_backend()?, params)?;
    let mut batch = LlamaBatch::new(PREFILL_CHUNK.max(g), 1);
    let mut last = 0;
    for (c, chunk) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        batch.clear();
        for (j, &tok) in chunk.iter().enumerate() {
            batch.add(LlamaToken(tok as i32), (c * PREFILL_CHUNK + j) as i32, &[0], j + 1 == chunk.len())?;
        }
        ctx.decode(&mut batch)?;
        last = chunk.len() as i32 - 1;
    }
    for s in 1..g {
        ctx.copy_kv_cache_seq(0, s as i32, None, None)?;
    }
    let mut samplers: Vec<LlamaSampler> = (0..g)
        .map(|s| {
            if arm == RawArm::Greedy {
                LlamaSampler::greedy()
            } else {
                LlamaSampler::chain_simple([LlamaSampler::temp(t), LlamaSampler::dist(s as u32)])
            }
        })
        .collect();
    let mut rows = vec![last; g];
    let mut generated = 0;
    for step in 0..m {
        batch.clear();
        for (s, sampler) in samplers.iter_mut().enumerate() {
            let tok = sampler.sample(&ctx, rows[s]);
            generated += 1;
            rows[s] = batch.n_tokens();
            batch.add(tok, (prompt.len() + step) as i32, &[s as i32], true)?;
        }
        if step + 1 < m {
            ctx.decode(&mut batch)?;
        }
    }
    Ok(generated)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse();
    let path = args.model.unwrap_or_else(assets::smollm2_q4_1);
    let threads = args.threads.unwrap_or_else(default_threads);
    let tok = Tokenizer::from_gguf_file(&path).context("tokenizer")?;
    let backend_cfg = LlamaConfig { threads, ..LlamaConfig::new(&path) };
    let mut miner = LlamaCppBackend::load(&backend_cfg)?;
    let prompt = tok.encode(&chatml_prompt(
        Some("You are a careful math assistant."),
        "Write a long story about a river that learns to count, with many numbers in it.",
    ))?;
    let key = SketchKey::derive(&Seed([9; 32]), miner.hidden_size());
    let (g, m) = (args.group, args.max_new_tokens);
    eprintln!(
        "model {}, {} threads, group {g}, prompt {} tokens, {m} new tokens per sequence",
        path.display(),
        threads,
        prompt.len()
    );

    let (mut raw_rates, mut same_rates, mut greedy_rates, mut miner_rates) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..args.reps.max(1) {
        let t0 = Instant::now();
        let n = raw(&miner, &prompt, g, m, args.temperature, threads as i32, RawArm::Defaults)?;
        let raw_rate = n as f64 / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let n = raw(&miner, &prompt, g, m, args.temperature, threads as i32, RawArm::MinerNumerics)?;
        let same_rate = n as f64 / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let n = raw(&miner, &prompt, g, m, args.temperature, threads as i32, RawArm::Greedy)?;
        let greedy_rate = n as f64 / t0.elapsed().as_secs_f64();

        let req = GroupRequest {
            prompt: &prompt,
            group_size: g,
            max_new_tokens: m,
            temperature: args.temperature,
            draw: DrawKey { sampling_seed: Seed([rep as u8; 32]), miner: [7; 32], group: 0 },
            sketch_key: &key,
            sketch_params: SketchParams::DEFAULT,
            eog: &[],
        };
        let t0 = Instant::now();
        let out = miner.generate_group(&req)?;
        let n: usize = out.iter().map(|s| s.completion.len()).sum();
        let miner_rate = n as f64 / t0.elapsed().as_secs_f64();
        eprintln!(
            "rep {rep}: raw {raw_rate:.1} tok/s, raw with the miner's numerics {same_rate:.1} tok/s, \
             raw greedy {greedy_rate:.1} tok/s, miner {miner_rate:.1} tok/s"
        );
        raw_rates.push(raw_rate);
        greedy_rates.push(greedy_rate);
        same_rates.push(same_rate);
        miner_rates.push(miner_rate);
    }
    let (r, sa, gr, mi) = (median(raw_rates), median(same_rates), median(greedy_rates), median(miner_rates));
    println!(
        "raw llama.cpp {r:.1} tok/s, raw with the miner's numerics {sa:.1} tok/s, miner {mi:.1} tok/s; \
         ratio miner/raw {:.3} (goal ≥ 0.95) = numerics {:.3} × proof work {:.3}",
        mi / r,
        sa / r,
        mi / sa
    );
    println!(
        "raw llama.cpp with greedy sampling (no softmax: the cheapest sampler) {gr:.1} tok/s; ratio miner/raw-greedy {:.3}",
        mi / gr
    );
    Ok(())
}
