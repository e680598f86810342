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
    /// Verify every window of a coordinator's network and post signed verdicts.
    Run(RunArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Join a `coordinator run --dev` network with the well-known dev validator key.
    #[arg(long)]
    dev: bool,
    /// The coordinator's QUIC address.
    #[arg(long)]
    coordinator: std::net::SocketAddr,
    /// The coordinator's certificate fingerprint (hex).
    #[arg(long)]
    fingerprint: String,
    /// Data folder (key, downloaded checkpoints).
    #[arg(long, default_value = "validator-data")]
    data: PathBuf,
    /// Check every rollout of every miner (default: grail's sample).
    #[arg(long)]
    all: bool,
    /// Fraction of the window's miners checked.
    #[arg(long)]
    miner_fraction: Option<f64>,
    /// At least this many miners.
    #[arg(long)]
    min_miners: Option<usize>,
    /// At most this many miners.
    #[arg(long)]
    max_miners: Option<usize>,
    /// Rollouts checked per miner (whole groups); 0: all.
    #[arg(long)]
    rollouts_per_miner: Option<usize>,
    /// Most rollouts per reference forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Most padded tokens per reference forward pass.
    #[arg(long, default_value_t = 8192)]
    batch_tokens: usize,
    /// GSM8K JSONL file (when the network's environment is gsm8k).
    #[arg(long)]
    gsm8k: Option<PathBuf>,
    /// libtorch threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Prometheus metrics listener (plain HTTP), e.g. 127.0.0.1:9091.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
}

fn run(args: RunArgs) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tributary_protocol::identity::Keypair;
    use validator::service::{SampleConfig, Service, ServiceConfig};
    std::fs::create_dir_all(&args.data)?;
    let key = if args.dev {
        coordinator_dev_key()
    } else {
        let path = args.data.join("validator.key");
        if path.exists() {
            Keypair::load(&path)?
        } else {
            let k = Keypair::generate();
            k.save(&path)?;
            k
        }
    };
    println!("validator={}", key.public());
    tributary_policy::init_threads(args.threads);
    let mut cfg = ServiceConfig::new(args.coordinator, args.fingerprint, key, args.data.clone());
    let mut sample = if args.all { SampleConfig::ALL } else { SampleConfig::GRAIL };
    if let Some(f) = args.miner_fraction {
        sample.miner_fraction = f;
    }
    if let Some(n) = args.min_miners {
        sample.min_miners = n;
    }
    if let Some(n) = args.max_miners {
        sample.max_miners = n;
    }
    if let Some(n) = args.rollouts_per_miner {
        sample.rollouts_per_miner = n;
    }
    cfg.sample = sample;
    cfg.batch = args.batch;
    cfg.batch_tokens = args.batch_tokens;
    cfg.gsm8k = args.gsm8k;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        if let Some(addr) = args.metrics {
            let bound = tributary_net::serve_metrics(addr).await.with_context(|| format!("metrics listener on {addr}"))?;
            println!("metrics=http://{bound}/metrics");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            s2.store(true, Ordering::Relaxed);
        });
        let mut service = Service::open(cfg).await.context("connecting to the coordinator")?;
        service.run(stop).await.context("validator run")?;
        Ok(())
    })
}

/// The `--dev` validator key (a `--dev` coordinator authorises it).
fn coordinator_dev_key() -> tributary_protocol::identity::Keypair {
    tributary_protocol::wire::Role::Validator.dev_key()
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
        Command::Run(args) => run(args),
    }
}
