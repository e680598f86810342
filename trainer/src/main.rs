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
    /// Train on the network's verified rollouts and publish a checkpoint each window.
    Run {
        /// Join a `coordinator run --dev` network: dev trainer key, dev tiny model,
        /// rollouts of not-yet-judged miners trusted.
        #[arg(long)]
        dev: bool,
        /// The coordinator's QUIC address.
        #[arg(long)]
        coordinator: std::net::SocketAddr,
        /// The coordinator's certificate fingerprint (hex).
        #[arg(long)]
        fingerprint: String,
        /// State folder.
        #[arg(long, default_value = "trainer-data")]
        data: PathBuf,
        /// Genesis checkpoint (default with --dev: the dev tiny model).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Trainer key file (default with --dev: the dev trainer key).
        #[arg(long)]
        key: Option<PathBuf>,
        /// Peak learning rate.
        #[arg(long, default_value_t = 1e-4)]
        lr: f64,
        /// A full payload every this many publications.
        #[arg(long, default_value_t = 8)]
        full_every: u64,
        /// Serve Prometheus metrics on this address.
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
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
        Cmd::Run { dev, coordinator, fingerprint, data, model, key, lr, full_every, metrics } => {
            use trainer::service::{Service, ServiceConfig, dev_genesis, serve_metrics};
            let key = match (key, dev) {
                (Some(p), _) => tributary_protocol::identity::Keypair::load(&p)?,
                (None, true) => coordinator::node::dev_key(tributary_protocol::wire::Role::Trainer),
                (None, false) => anyhow::bail!("give --key FILE (or --dev)"),
            };
            let genesis = match (model, dev) {
                (Some(p), _) => p,
                (None, true) => dev_genesis(&data)?,
                (None, false) => anyhow::bail!("give --model GENESIS.gguf (or --dev)"),
            };
            let vocab = tributary_protocol::checkpoint::Checkpoint::open(&genesis)?.config().vocab_size;
            let cfg = ServiceConfig {
                coordinator,
                fingerprint,
                key,
                dir: data,
                genesis,
                train: trainer::train::TrainConfig { lr, warmup_steps: 1, ..Default::default() },
                select: trainer::select::SelectConfig::new(vocab),
                full_every,
                trust_unjudged: dev,
                poll: std::time::Duration::from_millis(500),
            };
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                if let Some(addr) = metrics {
                    let bound = serve_metrics(addr).await?;
                    println!("metrics=http://{bound}/metrics");
                }
                println!("trainer={}", cfg.key.public());
                let mut s = Service::open(cfg).await?;
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let st = stop.clone();
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    st.store(true, std::sync::atomic::Ordering::Relaxed);
                });
                s.run(stop).await?;
                anyhow::Ok(())
            })?;
        }
        Cmd::Export { path, hf } => {
            let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&path)?;
            trainer::hf::export(&ckpt, &hf)?;
            println!("exported {} ({}) to {}", path.display(), ckpt.content_id(), hf.display());
        }
    }
    Ok(())
}
