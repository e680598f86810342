//! `trainer`: the Tributary trainer's command line.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tributary_protocol::assets;

mod init;

#[derive(Parser)]
#[command(name = "trainer", about = "Tributary trainer: checkpoints and GRPO training")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Convert the quantized SmolLM2 GGUF into the BF16 base checkpoint (idempotent).
    InitBase {
        /// Source GGUF (default: the SmolLM2 Q4_1 file in the cache).
        #[arg(long)]
        src: Option<PathBuf>,
        /// Output checkpoint (default: the BF16 base path in the cache).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write the tiny random test model for a seed.
    InitTiny {
        /// Seed of the weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output checkpoint (default: `tiny-<seed>.gguf` in the models folder).
        #[arg(long)]
        out: Option<PathBuf>,
        /// GGUF whose tokenizer and chat template to copy (default: SmolLM2 Q4_1).
        #[arg(long)]
        tokenizer_src: Option<PathBuf>,
    },
    /// Print a checkpoint's config, tensor types and content id.
    Info {
        /// The checkpoint.
        path: PathBuf,
    },
    /// Export a checkpoint for Hugging Face transformers (safetensors, config, tokenizer).
    Export {
        /// The checkpoint (GGUF).
        path: PathBuf,
        /// Output folder.
        #[arg(long)]
        hf: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::InitBase { src, out } => {
            let src = src.unwrap_or_else(assets::smollm2_q4_1);
            let out = out.unwrap_or_else(assets::smollm2_bf16);
            init::init_base(&src, &out)?;
        }
        Cmd::InitTiny { seed, out, tokenizer_src } => {
            let out = out.unwrap_or_else(|| assets::models_dir().join(format!("tiny-{seed}.gguf")));
            let src = tokenizer_src.unwrap_or_else(assets::smollm2_q4_1);
            init::init_tiny(seed, &src, &out)?;
        }
        Cmd::Info { path } => init::info(&path)?,
        Cmd::Export { path, hf } => {
            let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&path)?;
            trainer::hf::export(&ckpt, &hf)?;
            println!("exported {} ({}) to {}", path.display(), ckpt.content_id(), hf.display());
        }
    }
    Ok(())
}
