//! Tokens per second of the wgpu backend against llama.cpp, same machine,
//! same checkpoint, same group request, in one run.
//!
//! ```text
//! cargo run -p edge-miner --features wgpu --bin wgpu-bench -- --model .cache/models/tiny-0.gguf
//! cargo run -p edge-miner --features wgpu --bin wgpu-bench -- \
//!     --model .cache/models/SmolLM2-135M-Instruct.bf16.gguf --new-tokens 8 --group 2
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use edge_miner::backend::{Backend, DrawKey, GroupRequest};
use edge_miner::llama::{LlamaConfig, LlamaCppBackend, default_threads};
use edge_miner::wgpu::{WgpuBackend, WgpuConfig, list_adapters};
use tributary_protocol::offline::OfflineWindow;
use tributary_protocol::sketch::{SketchKey, SketchParams};

#[derive(Parser, Debug)]
#[command(about = "wgpu vs llama.cpp generation throughput")]
struct Args {
    /// BF16 GGUF checkpoint (run by both backends).
    #[arg(long)]
    model: PathBuf,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    /// Rollouts per group.
    #[arg(long, default_value_t = 4)]
    group: usize,
    /// Completion tokens per rollout (no early stop: EOG is not set).
    #[arg(long, default_value_t = 16)]
    new_tokens: usize,
    /// Groups timed per backend (after one warm-up group).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// llama.cpp CPU threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Adapter name filter for wgpu.
    #[arg(long)]
    adapter: Option<String>,
    /// Skip llama.cpp.
    #[arg(long)]
    no_llama: bool,
}

fn time_group(b: &mut dyn Backend, req: &GroupRequest<'_>, repeats: usize) -> Result<(f64, usize)> {
    b.generate_group(req).context("warm-up group")?;
    let start = Instant::now();
    let mut tokens = 0;
    for _ in 0..repeats.max(1) {
        tokens += b.generate_group(req)?.iter().map(|s| s.completion.len()).sum::<usize>();
    }
    Ok((start.elapsed().as_secs_f64(), tokens))
}

fn main() -> Result<()> {
    let args = Args::parse();
    for a in list_adapters() {
        println!("adapter: {a}");
    }
    let window = OfflineWindow::from_seed(1);
    let mut wgpu = WgpuBackend::load(&WgpuConfig { adapter: args.adapter.clone(), ..WgpuConfig::new(&args.model) })?;
    println!("wgpu runs on: {}", wgpu.adapter());
    let key = SketchKey::derive(&window.secrets.seed, wgpu.hidden_size());
    let vocab = wgpu.vocab_size() as u32;
    let prompt: Vec<u32> = (0..args.prompt as u32).map(|i| (i * 7919 + 100) % vocab).collect();
    let req = GroupRequest {
        prompt: &prompt,
        group_size: args.group,
        max_new_tokens: args.new_tokens,
        temperature: 0.8,
        draw: DrawKey { sampling_seed: window.secrets.seed, miner: [1; 32], group: 0 },
        sketch_key: &key,
        sketch_params: SketchParams::DEFAULT,
        eog: &[],
    };
    println!(
        "model {} | prompt {} | group {} | {} new tokens | {} timed group(s)",
        args.model.display(),
        args.prompt,
        args.group,
        args.new_tokens,
        args.repeats
    );
    println!("{:<10} {:>10} {:>12} {:>10}", "backend", "seconds", "tokens", "tok/s");
    let (s, n) = time_group(&mut wgpu, &req, args.repeats)?;
    println!("{:<10} {:>10.2} {:>12} {:>10.2}", "wgpu", s, n, n as f64 / s);
    if !args.no_llama {
        let threads = args.threads.unwrap_or_else(default_threads);
        let mut llama = LlamaCppBackend::load(&LlamaConfig { threads, ..LlamaConfig::new(&args.model) })?;
        let (s, n) = time_group(&mut llama, &req, args.repeats)?;
        println!("{:<10} {:>10.2} {:>12} {:>10.2}", format!("llama.cpp/{threads}t"), s, n, n as f64 / s);
    }
    Ok(())
}
