//! The Tributary edge miner.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use edge_miner::backend::Backend;
use edge_miner::llama::{LlamaConfig, LlamaCppBackend, default_threads};
use edge_miner::offline::{self, GenerateOptions, OfflineWindow};
use edge_miner::quantize::{FileType, quantize};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{ArithEnv, EnvId, Environment, Gsm8kEnv, SatEnv};
use tributary_protocol::sketch::SketchParams;
use tributary_protocol::tokenizer::Tokenizer;

#[derive(Parser, Debug)]
#[command(name = "edge-miner", version, about = "Tributary edge miner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate rollouts offline (no coordinator) and write them as JSONL.
    Generate(GenerateArgs),
    /// Re-quantize a GGUF model with llama.cpp's quantizer.
    Quantize {
        /// Input GGUF.
        #[arg(long)]
        input: PathBuf,
        /// Output GGUF.
        #[arg(long)]
        output: PathBuf,
        /// Target format.
        #[arg(long = "type", value_enum)]
        ftype: QuantType,
        /// Threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum QuantType {
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl From<QuantType> for FileType {
    fn from(q: QuantType) -> Self {
        match q {
            QuantType::F16 => FileType::F16,
            QuantType::Bf16 => FileType::Bf16,
            QuantType::Q4_0 => FileType::Q4_0,
            QuantType::Q4_1 => FileType::Q4_1,
            QuantType::Q8_0 => FileType::Q8_0,
        }
    }
}

#[derive(clap::Args, Debug)]
struct GenerateArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Environment: arith, sat or gsm8k (gsm8k needs --data).
    #[arg(long)]
    env: EnvId,
    /// GSM8K JSONL file (for --env gsm8k).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Difficulty of the arith environment.
    #[arg(long, default_value_t = 3)]
    difficulty: u32,
    /// Number of tasks (one group each).
    #[arg(long)]
    tasks: usize,
    /// Rollouts per task (G).
    #[arg(long)]
    group: usize,
    /// Most completion tokens per rollout.
    #[arg(long)]
    max_new_tokens: usize,
    /// Seed standing in for the coordinator's window randomness.
    #[arg(long)]
    seed: u64,
    /// Output JSONL file (one rollout per line).
    #[arg(long)]
    out: PathBuf,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// CPU threads (default: available cores; never more than the free cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Layers to offload to a GPU (builds with cuda/metal/vulkan).
    #[arg(long, default_value_t = 0)]
    gpu_layers: u32,
}

fn environment(args: &GenerateArgs) -> Result<Environment> {
    Ok(match args.env {
        EnvId::Arith => Environment::Arith(ArithEnv::new(args.difficulty)),
        EnvId::Sat => Environment::Sat(SatEnv),
        EnvId::Gsm8k => {
            let Some(data) = &args.data else { bail!("--env gsm8k needs --data FILE.jsonl") };
            Environment::Gsm8k(Gsm8kEnv::load(data).with_context(|| format!("loading {}", data.display()))?)
        }
    })
}

fn generate(args: GenerateArgs) -> Result<()> {
    let env = environment(&args)?;
    // The tokenizer comes from the GGUF metadata; the content id only from
    // files the checkpoint reader accepts (BF16 checkpoints, the tiny model).
    let tokenizer = Tokenizer::from_gguf_file(&args.model).context("building the tokenizer")?;
    let model_id = Checkpoint::open(&args.model).ok().map(|c| c.content_id());
    let mut backend = LlamaCppBackend::load(&LlamaConfig {
        model: args.model.clone(),
        threads: args.threads.unwrap_or_else(default_threads),
        gpu_layers: args.gpu_layers,
    })?;
    if tokenizer.vocab_size() != backend.vocab_size() {
        bail!("tokenizer has {} tokens, model {}", tokenizer.vocab_size(), backend.vocab_size());
    }
    let window = OfflineWindow::from_seed(args.seed);
    let opts = GenerateOptions {
        tasks: args.tasks,
        group: args.group,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        sketch_params: SketchParams::DEFAULT,
    };
    let out = File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let bar = ProgressBar::new(args.tasks as u64).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} groups, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = std::time::Instant::now();
    let job = offline::Job { tokenizer: &tokenizer, env: &env, model: model_id, window: &window, opts: &opts };
    let summary = offline::generate(
        &mut backend,
        &job,
        offline::jsonl_sink(BufWriter::new(out)),
        |done| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} rollouts, {} completion tokens in {secs:.1}s ({:.1} tok/s), mean reward {:.3} -> {}",
        summary.rollouts,
        summary.completion_tokens,
        summary.completion_tokens as f64 / secs.max(1e-9),
        summary.mean_reward,
        args.out.display()
    );
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    match Cli::parse().command {
        Command::Generate(args) => generate(args),
        Command::Quantize { input, output, ftype, threads } => {
            quantize(&input, &output, ftype.into(), threads.unwrap_or_else(default_threads))?;
            eprintln!("wrote {}", output.display());
            Ok(())
        }
    }
}
