//! `trainer`: the Tributary trainer's command line.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tributary_assets as assets;
use tributary_net::cli::{ConfigPaths, CoordinatorArgs, load_config};

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
    Run(Box<RunArgs>),
    /// Export a checkpoint for Hugging Face transformers (safetensors, config, tokenizer).
    Export {
        /// The checkpoint (GGUF).
        path: PathBuf,
        /// Output folder.
        #[arg(long)]
        hf: PathBuf,
    },
}

/// `trainer run`'s flags: each overrides the config file's key of the same
/// name (`docs/config/trainer.toml` documents every key).
#[derive(clap::Args)]
#[command(
    mut_arg("dev", |a| a.help(
        "Join a `coordinator run --dev` network: dev trainer key, dev tiny model, rollouts of not-yet-judged miners trusted"
    )),
    mut_arg("config", |a| a.help("Configuration file (TOML; every key in docs/config/trainer.toml); flags override it")),
    mut_arg("data", |a| a.help("State folder (default trainer-data)")),
)]
struct RunArgs {
    #[command(flatten)]
    common: CoordinatorArgs,
    /// Genesis checkpoint (default with --dev: the dev tiny model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Trainer key file (default with --dev: the dev trainer key).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Peak learning rate (default 1e-4).
    #[arg(long)]
    lr: Option<f64>,
    /// A full payload every this many publications (default 8).
    #[arg(long)]
    full_every: Option<u64>,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// GSM8K JSONL file (needed when the network's environment is gsm8k).
    #[arg(long)]
    gsm8k: Option<PathBuf>,
}

/// `trainer run`'s configuration file (TOML). Every key has a default except
/// the coordinator's address and pin, the key and the genesis model (which
/// `--dev` supplies); relative paths are relative to the file's folder;
/// unknown keys are refused.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
struct RunConfig {
    /// The coordinator's QUIC address, HOST:PORT. Required.
    coordinator: Option<String>,
    /// The coordinator's certificate fingerprint (hex); this or `ca`.
    fingerprint: Option<String>,
    /// CA certificate file (PEM); this or `fingerprint`.
    ca: Option<PathBuf>,
    /// The coordinator's key (hex): a coordinator with another key is
    /// refused. Default: pinned on first sight in the state folder.
    coordinator_key: Option<String>,
    /// State folder (weights, optimiser moments, publications). Default `trainer-data`.
    data: PathBuf,
    /// The genesis checkpoint (the coordinator's `model`). Required without `--dev`.
    model: Option<PathBuf>,
    /// The trainer key file. Required without `--dev`.
    key: Option<PathBuf>,
    /// Peak learning rate. Default 1e-4.
    lr: f64,
    /// A full payload (instead of a sparse delta) every this many publications. Default 8.
    full_every: u64,
    /// Prometheus metrics listener. Default: none.
    metrics: Option<std::net::SocketAddr>,
    /// GSM8K JSONL file, for the proof of rollouts when the network's
    /// environment is gsm8k. Default: none.
    gsm8k: Option<PathBuf>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            coordinator: None,
            fingerprint: None,
            ca: None,
            coordinator_key: None,
            data: "trainer-data".into(),
            model: None,
            key: None,
            lr: 1e-4,
            full_every: 8,
            metrics: None,
            gsm8k: None,
        }
    }
}

impl ConfigPaths for RunConfig {
    fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf)) {
        f(&mut self.data);
        for p in [&mut self.ca, &mut self.model, &mut self.key, &mut self.gsm8k].into_iter().flatten() {
            f(p);
        }
    }
}

impl RunArgs {
    /// The configuration file (if any) with the flags on top.
    fn resolve(&self) -> Result<RunConfig> {
        let common = &self.common;
        let mut c = match &common.config {
            Some(path) => load_config::<RunConfig>(path)?,
            None => RunConfig::default(),
        };
        macro_rules! over {
            ($($f:ident),*) => {$( if self.$f.is_some() { c.$f = self.$f.clone(); } )*};
        }
        over!(model, key, metrics, gsm8k);
        if common.coordinator.is_some() {
            c.coordinator.clone_from(&common.coordinator);
        }
        common.override_pin(&mut c.fingerprint, &mut c.ca);
        if common.coordinator_key.is_some() {
            c.coordinator_key.clone_from(&common.coordinator_key);
        }
        if let Some(d) = &common.data {
            c.data = d.clone();
        }
        c.lr = self.lr.unwrap_or(c.lr);
        c.full_every = self.full_every.unwrap_or(c.full_every);
        Ok(c)
    }
}

impl RunConfig {
    /// The coordinator's address and pin spec.
    fn coordinator(&self) -> Result<(std::net::SocketAddr, String)> {
        Ok(tributary_net::coordinator_target(
            self.coordinator.as_deref(),
            self.fingerprint.as_deref(),
            self.ca.as_deref(),
        )?)
    }
}

fn run(args: RunArgs) -> Result<()> {
    use trainer::service::{Service, ServiceConfig, dev_genesis, serve_metrics};
    let dev = args.common.dev;
    let conf = args.resolve()?;
    let (coordinator, fingerprint) = conf.coordinator()?;
    if args.common.check_config {
        print!("{}", toml::to_string(&conf)?);
        return Ok(());
    }
    let key = match (&conf.key, dev) {
        (Some(p), _) => tributary_protocol::identity::Keypair::load(p)?,
        (None, true) => tributary_protocol::dev::key(tributary_protocol::wire::Role::Trainer),
        (None, false) => anyhow::bail!("give the trainer key (`key` or --key FILE), or --dev"),
    };
    tributary_net::cli::refuse_dev_keys(dev, tributary_protocol::wire::Role::Trainer, &key.public(), coordinator)?;
    let coordinator_key =
        tributary_net::KeyPin::resolve(conf.coordinator_key.as_deref(), Some(conf.data.as_path()), dev)?;
    let genesis = match (&conf.model, dev) {
        (Some(p), _) => p.clone(),
        (None, true) => dev_genesis(&conf.data)?,
        (None, false) => anyhow::bail!("give the genesis checkpoint (`model` or --model GENESIS.gguf), or --dev"),
    };
    let vocab = tributary_protocol::checkpoint::Checkpoint::open(&genesis)?.config().vocab_size;
    let metrics = conf.metrics;
    let proof = trainer::proof::ProofConfig { gsm8k: conf.gsm8k.clone(), ..Default::default() };
    let cfg = ServiceConfig {
        coordinator,
        fingerprint,
        coordinator_key,
        key,
        dir: conf.data,
        genesis,
        train: trainer::train::TrainConfig { lr: conf.lr, warmup_steps: 1, ..Default::default() },
        select: trainer::select::SelectConfig::new(vocab),
        full_every: conf.full_every,
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
        let mut s = Service::open_with(cfg, proof).await?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            st.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        s.run(stop).await?;
        anyhow::Ok(())
    })
}

fn main() -> Result<()> {
    // Logs (warnings about rollouts refused by the proof, steps, uploads) on
    // stderr; RUST_LOG picks the level (default: warn and above).
    tributary_net::init_tracing(tributary_net::logging::DEFAULT_FILTER);
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
        Cmd::Run(args) => run(*args)?,
        Cmd::Export { path, hf } => {
            let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&path)?;
            trainer::hf::export(&ckpt, &hf)?;
            println!("exported {} ({}) to {}", path.display(), ckpt.content_id(), hf.display());
        }
    }
    Ok(())
}
