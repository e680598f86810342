//! Speed and memory of the miner's generation against raw llama.cpp on the
//! checkpoint as published (issue #3.8: tok/s ratio ≥ 0.95; issue #20: peak
//! RSS ≤ 1.1×), same batch shape and thread count.
//!
//! Arms (`--arms`, each run in a fresh child process so that its peak RSS is
//! its own):
//! - `raw-bf16`: llama.cpp alone on the model file as published (for the
//!   SmolLM2 base: BF16 matrices), at its defaults — flash attention auto,
//!   F16 KV cache, embeddings off, llama.cpp's own `temp`+`dist` sampler, no
//!   log-probabilities, no sketches. The anchor of every ratio;
//! - `raw-q8_0`: the same on a Q8_0 conversion of the file (llama.cpp's own
//!   quantizer, `edge_miner::quantize`), what a hobbyist short of memory runs;
//! - `raw-unified`: `raw-bf16` (F16 cache) with the miner's KV layout: one
//!   unified cache in which the group's sequences share the prompt's cells
//!   ([`kv_cells`]), the strictest memory anchor;
//! - `raw-exact`: `raw-unified` with the settings the proof contract needs for
//!   plain-f32 numerics ([`with_exact_numerics`]: an F32 KV cache that the
//!   vendored llama.cpp keeps F32 in flash attention), so the miner's gap
//!   splits into numerics and proof work;
//! - `raw-greedy`: `raw-bf16` with llama.cpp's `greedy` sampler (an argmax,
//!   no softmax), the strictest speed anchor (not in the default set);
//! - `miner`: [`LlamaCppBackend::generate_group`] on the file as the miner
//!   loads it (BF16 matrices as published, multiplied in f32 by the vendored
//!   ggml) — embeddings on, the protocol's seeded sampler with raw
//!   log-probabilities, a sketch at every position;
//! - `miner-f32`: the same with the BF16 matrices widened to F32 at load
//!   ([`Bf16Weights::WidenedToF32`], the miner's load with GPU offload;
//!   on the CPU the same values at twice the weight memory).
//!
//! Every arm prefills the prompt once, copies its KV cache to every sequence,
//! and runs exactly `--max-new-tokens` tokens per sequence (no EOG stop).
//! A child first runs its arm untimed for a few tokens (page faults of the
//! mapped weights, first graph allocation: the miner's sync does the same
//! warm-up before it swaps a model in), then the timed run; its peak RSS
//! covers the whole process, load included. Repetitions alternate arms and
//! groups; each figure is the median of `--reps` runs.
//!
//! `cargo run -p edge-miner --bin gen-bench -- --groups 1,8,16 --reps 5`

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use edge_miner::backend::{Backend, DrawKey, GroupRequest};
use edge_miner::llama::{
    Bf16Weights, LlamaConfig, LlamaCppBackend, N_UBATCH, PREFILL_CHUNK, default_threads, kv_cells, llama_backend,
    with_exact_numerics,
};
use edge_miner::quantize::{FileType, quantize};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use tributary_assets as assets;
use tributary_protocol::chat::chatml_prompt;
use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

const DEFAULT_ARMS: &str = "raw-bf16,raw-q8_0,raw-unified,raw-exact,miner,miner-f32";
/// Tokens per sequence of a child's untimed warm-up run.
const WARMUP_TOKENS: usize = 4;

#[derive(Parser, Debug)]
struct Args {
    /// GGUF model (default: the SmolLM2 BF16 base).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Group sizes (sequences decoded together).
    #[arg(long, value_delimiter = ',', default_value = "1,8,16")]
    groups: Vec<usize>,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// CPU threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Layers offloaded to the GPU in every arm (0: all on the CPU). A build
    /// without a GPU backend (the default features) runs everything on the
    /// CPU whatever this says; `scripts/gpu-calibrate.sh` passes 99 to a
    /// `cuda` or `vulkan` build.
    #[arg(long, default_value_t = 0)]
    gpu_layers: u32,
    /// Runs of each arm and group (the median is reported; alternating).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Arms to run (module docs).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ARMS)]
    arms: Vec<Arm>,
    /// Where to write the Q8_0 conversion (default: a temporary folder).
    #[arg(long)]
    q8_0: Option<PathBuf>,
    /// Internal: run one arm in this process and print its result.
    #[arg(long, hide = true)]
    child: Option<Arm>,
    /// Internal: the prompt's token ids (child runs).
    #[arg(long, hide = true, value_delimiter = ',')]
    prompt_ids: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Arm {
    #[value(name = "raw-bf16")]
    RawBf16,
    #[value(name = "raw-q8_0")]
    RawQ8_0,
    #[value(name = "raw-unified")]
    RawUnified,
    #[value(name = "raw-exact")]
    RawExact,
    #[value(name = "raw-greedy")]
    RawGreedy,
    #[value(name = "miner")]
    Miner,
    #[value(name = "miner-f32")]
    MinerF32,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Self::RawBf16 => "raw-bf16",
            Self::RawQ8_0 => "raw-q8_0",
            Self::RawUnified => "raw-unified",
            Self::RawExact => "raw-exact",
            Self::RawGreedy => "raw-greedy",
            Self::Miner => "miner",
            Self::MinerF32 => "miner-f32",
        }
    }
}

/// One timed run of a raw llama.cpp arm: returns generated tokens (all sequences).
fn raw(model: &LlamaModel, prompt: &[u32], g: usize, m: usize, t: f32, threads: i32, arm: Arm) -> Result<usize> {
    // llama.cpp's default: a cache per sequence, each holding its own copy
    // of the prompt; the miner's: one cache, the prompt's cells shared.
    let unified = matches!(arm, Arm::RawUnified | Arm::RawExact);
    let cells = if unified { kv_cells(g, prompt.len(), m).context("cells")? } else { g * (prompt.len() + m) };
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(cells as u32))
        .with_kv_unified(unified)
        .with_n_batch(PREFILL_CHUNK.max(g) as u32)
        .with_n_ubatch(N_UBATCH)
        .with_n_seq_max(g as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    if arm == Arm::RawExact {
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
            if arm == Arm::RawGreedy {
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

/// Peak resident set of this process so far, in KiB.
fn peak_rss_kib() -> Result<u64> {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        bail!("getrusage: {}", std::io::Error::last_os_error());
    }
    let max = u64::try_from(ru.ru_maxrss).unwrap_or(0);
    // Linux reports KiB, macOS bytes.
    Ok(if cfg!(target_os = "macos") { max / 1024 } else { max })
}

/// A child run: loads the arm's model, warms up, times one run; returns (tok/s, peak RSS KiB).
fn child(args: &Args, arm: Arm, model_path: &Path, g: usize, threads: usize) -> Result<(f64, u64)> {
    let prompt = &args.prompt_ids;
    let (m, t) = (args.max_new_tokens, args.temperature);
    let rate = match arm {
        Arm::Miner | Arm::MinerF32 => {
            let weights = if arm == Arm::Miner { Bf16Weights::AsPublished } else { Bf16Weights::WidenedToF32 };
            let cfg = LlamaConfig { threads, gpu_layers: args.gpu_layers, ..LlamaConfig::new(model_path) };
            let mut miner = LlamaCppBackend::load_with(&cfg, weights)?;
            let key = SketchKey::derive(&Seed([9; 32]), miner.hidden_size());
            let mut run = |tokens: usize| -> Result<f64> {
                let req = GroupRequest {
                    prompt,
                    group_size: g,
                    max_new_tokens: tokens,
                    temperature: t,
                    draw: DrawKey { sampling_seed: Seed([tokens as u8; 32]), miner: [7; 32], group: 0 },
                    sketch_key: &key,
                    sketch_params: SketchParams::DEFAULT,
                    eog: &[],
                };
                let t0 = Instant::now();
                let out = miner.generate_group(&req)?;
                let n: usize = out.iter().map(|s| s.completion.len()).sum();
                Ok(n as f64 / t0.elapsed().as_secs_f64())
            };
            run(WARMUP_TOKENS)?;
            run(m)?
        }
        _ => {
            let params = LlamaModelParams::default().with_n_gpu_layers(args.gpu_layers);
            let model = LlamaModel::load_from_file(llama_backend()?, model_path, &params)
                .with_context(|| format!("loading {}", model_path.display()))?;
            raw(&model, prompt, g, WARMUP_TOKENS, t, threads as i32, arm)?;
            let t0 = Instant::now();
            let n = raw(&model, prompt, g, m, t, threads as i32, arm)?;
            n as f64 / t0.elapsed().as_secs_f64()
        }
    };
    Ok((rate, peak_rss_kib()?))
}

/// A file removed when dropped (the default Q8_0 conversion).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The median (the mean of the middle two for an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().next().unwrap_or("?").to_owned())
        .unwrap_or_else(|_| "?".into())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let path = args.model.clone().unwrap_or_else(assets::smollm2_bf16);
    let threads = args.threads.unwrap_or_else(default_threads);
    let m = args.max_new_tokens;

    if let Some(arm) = args.child {
        let file = if arm == Arm::RawQ8_0 {
            args.q8_0.clone().ok_or_else(|| anyhow!("--q8-0 missing"))?
        } else {
            path.clone()
        };
        let g = *args.groups.first().ok_or_else(|| anyhow!("no group"))?;
        let (rate, rss) = child(&args, arm, &file, g, threads)?;
        println!("RESULT {rate} {rss}");
        return Ok(());
    }

    let tok = Tokenizer::from_gguf_file(&path).context("tokenizer")?;
    let prompt = tok.encode(&chatml_prompt(
        Some("You are a careful math assistant."),
        "Write a long story about a river that learns to count, with many numbers in it.",
    ))?;
    let tmp = args
        .q8_0
        .is_none()
        .then(|| RemoveOnDrop(std::env::temp_dir().join(format!("gen-bench-{}.q8_0.gguf", std::process::id()))));
    let q8 = args.q8_0.clone().or_else(|| tmp.as_ref().map(|t| t.0.clone())).context("Q8_0 path")?;
    if args.arms.contains(&Arm::RawQ8_0) && !q8.is_file() {
        let t0 = Instant::now();
        quantize(&path, &q8, FileType::Q8_0, threads)?;
        eprintln!("Q8_0 conversion {} in {:.1} s", q8.display(), t0.elapsed().as_secs_f64());
    }
    eprintln!(
        "model {}, {threads} threads, {} GPU layers, groups {:?}, prompt {} tokens, {m} new tokens per sequence, {} reps",
        path.display(),
        args.gpu_layers,
        args.groups,
        prompt.len(),
        args.reps
    );

    let exe = std::env::current_exe()?;
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    // results[group][arm] = (tok/s, RSS KiB) per rep
    let mut results = vec![vec![Vec::<(f64, u64)>::new(); args.arms.len()]; args.groups.len()];
    for rep in 0..args.reps.max(1) {
        for (gi, &g) in args.groups.iter().enumerate() {
            let mut line = format!("rep {rep} group {g} (load {}):", load_average());
            for (ai, &arm) in args.arms.iter().enumerate() {
                let out = Command::new(&exe)
                    .arg("--model")
                    .arg(&path)
                    .arg("--q8-0")
                    .arg(&q8)
                    .args(["--child", arm.name()])
                    .args(["--groups", &g.to_string()])
                    .args(["--max-new-tokens", &m.to_string()])
                    .args(["--temperature", &args.temperature.to_string()])
                    .args(["--threads", &threads.to_string()])
                    .args(["--gpu-layers", &args.gpu_layers.to_string()])
                    .args(["--prompt-ids", &ids.join(",")])
                    .output()?;
                let stdout = String::from_utf8_lossy(&out.stdout);
                if !out.status.success() {
                    bail!("{} (group {g}) failed: {}{}", arm.name(), stdout, String::from_utf8_lossy(&out.stderr));
                }
                let res = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("RESULT "))
                    .ok_or_else(|| anyhow!("{}: no result in {stdout}", arm.name()))?;
                let mut it = res.split_whitespace();
                let rate: f64 = it.next().context("rate")?.parse()?;
                let rss: u64 = it.next().context("rss")?.parse()?;
                line += &format!(" {} {rate:.1} tok/s {:.0} MiB;", arm.name(), rss as f64 / 1024.0);
                results[gi][ai].push((rate, rss));
            }
            eprintln!("{line}");
        }
    }

    let anchor = args.arms.iter().position(|&a| a == Arm::RawBf16);
    // Besides the ratio of medians, the median of each rep's own ratio (the
    // arm and the anchor run back to back): on a shared machine the load
    // drifts between reps, and a paired ratio cancels most of it.
    println!(
        "| group | arm | tok/s (median of {}) | min–max | peak RSS MiB | tok/s ÷ raw-bf16 | paired tok/s ÷ raw-bf16 | RSS ÷ raw-bf16 |",
        args.reps
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (gi, &g) in args.groups.iter().enumerate() {
        let stats: Vec<(f64, f64, f64, f64)> = results[gi]
            .iter()
            .map(|runs| {
                let rates: Vec<f64> = runs.iter().map(|r| r.0).collect();
                let rss: Vec<f64> = runs.iter().map(|r| r.1 as f64 / 1024.0).collect();
                let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (median(&rates), lo, hi, median(&rss))
            })
            .collect();
        for (ai, &arm) in args.arms.iter().enumerate() {
            let (rate, lo, hi, rss) = stats[ai];
            let (rr, rp, rm) = anchor.map_or((String::new(), String::new(), String::new()), |a| {
                let paired: Vec<f64> = results[gi][ai].iter().zip(&results[gi][a]).map(|(x, b)| x.0 / b.0).collect();
                (
                    format!("{:.3}", rate / stats[a].0),
                    format!("{:.3}", median(&paired)),
                    format!("{:.3}", rss / stats[a].3),
                )
            });
            println!("| {g} | {} | {rate:.1} | {lo:.1}–{hi:.1} | {rss:.0} | {rr} | {rp} | {rm} |", arm.name());
        }
    }
    Ok(())
}
