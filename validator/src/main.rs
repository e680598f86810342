//! The Tributary validator.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use validator::check::{CheckOptions, run_check};

#[derive(Parser, Debug)]
#[command(name = "validator", version, about = "Tributary validator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every model check offline on a JSONL file from `edge-miner generate`.
    Check(CheckArgs),
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// Checkpoint (GGUF) the reference model runs.
    #[arg(long)]
    model: PathBuf,
    /// JSONL file of rollouts (`edge-miner generate --out`).
    #[arg(long)]
    rollouts: PathBuf,
    /// The seed the miner ran with (stands in for the coordinator's randomness).
    #[arg(long)]
    seed: u64,
    /// Most rollouts per reference forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Most padded tokens per reference forward pass.
    #[arg(long, default_value_t = 8192)]
    batch_tokens: usize,
    /// GSM8K JSONL file (for gsm8k rollouts; the one the miner used).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Difficulty of the arith environment (as given to the miner).
    #[arg(long, default_value_t = 3)]
    difficulty: u32,
    /// Assigned max_new_tokens (default: the longest completion in the file).
    #[arg(long)]
    max_new_tokens: Option<u32>,
    /// Assigned temperature (default: each rollout's own).
    #[arg(long)]
    temperature: Option<f32>,
    /// libtorch threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
}

fn check(args: CheckArgs) -> Result<()> {
    let mut opts = CheckOptions::new(args.model, args.rollouts, args.seed);
    opts.batch = args.batch;
    opts.batch_tokens = args.batch_tokens;
    opts.data = args.data;
    opts.difficulty = args.difficulty;
    opts.max_new_tokens = args.max_new_tokens;
    opts.temperature = args.temperature;
    opts.threads = args.threads;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let summary = run_check(&opts, &mut out).context("validator check")?;
    out.flush()?;
    eprintln!(
        "reference model: {} tokens in {:.2}s ({:.1} tok/s)",
        summary.tokens,
        summary.model_seconds,
        summary.tokens as f64 / summary.model_seconds.max(1e-9)
    );
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Check(args) => check(args),
    }
}
