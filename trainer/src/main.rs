//! `trainer`: the Tributary trainer's command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tributary_assets as assets;
use tributary_net::cli::{ConfigPaths, CoordinatorArgs, load_config};

mod init;

#[derive(Parser)]
#[command(
    name = "trainer",
    version = tributary_net::cli::version(),
    about = "Tributary trainer: checkpoints and GRPO training"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    log: tributary_net::logging::LogArgs,
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
        /// Model family: llama (default), llama3, qwen2 or qwen3.
        #[arg(long, default_value = "llama")]
        family: String,
    },
    /// Convert a Hugging Face transformers folder (llama, qwen2, qwen3) into a GGUF checkpoint.
    ImportHf {
        /// Folder with config.json and model.safetensors.
        dir: PathBuf,
        /// Output checkpoint (GGUF).
        #[arg(long)]
        out: PathBuf,
        /// GGUF whose tokenizer to carry (default: SmolLM2 Q4_1).
        #[arg(long)]
        tokenizer_src: Option<PathBuf>,
        /// Keep matrices F32 (default: BF16).
        #[arg(long)]
        f32: bool,
    },
    /// Re-express a trained llama checkpoint (SmolLM2) in the qwen2, qwen3 or llama3 layout.
    Transplant {
        /// Target layout: qwen2 (Q/K/V biases, NEOX RoPE), qwen3 (per-head q/k RMSNorm, heads
        /// widened to carry the RMS, norms measured on the source, NEOX RoPE) or llama3 (RoPE
        /// frequency scaling).
        #[arg(long)]
        family: String,
        /// Source checkpoint (default: the BF16 SmolLM2 base).
        #[arg(long)]
        src: Option<PathBuf>,
        /// Output checkpoint (GGUF).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the qwen2 Q/K/V biases.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Standard deviation of the qwen2 Q/K/V biases (0: the source's function exactly).
        #[arg(long, default_value_t = trainer::transplant::DEFAULT_BIAS_STD)]
        bias_std: f32,
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
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: tributary_net::cli::Shell,
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
    /// Peak learning rate (default 3e-5).
    #[arg(long)]
    lr: Option<f64>,
    /// Where training runs: cpu, cuda, cuda:N or auto (default auto: the
    /// first GPU libtorch sees, else the CPU).
    #[arg(long)]
    device: Option<tributary_policy::DeviceSpec>,
    /// Publications whose checkpoint and payload files stay on disk (0: all; default 16).
    #[arg(long)]
    keep_publications: Option<usize>,
    /// A full payload every this many publications (default 8).
    #[arg(long)]
    full_every: Option<u64>,
    /// Groups a training step needs at least; fewer are kept for a later
    /// step (default 1: no floor).
    #[arg(long)]
    min_train_groups: Option<usize>,
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
    /// Where training and the proof run: cpu, cuda, cuda:N or auto. Default auto.
    device: tributary_policy::DeviceSpec,
    /// Peak learning rate. Default [`trainer::train::DEFAULT_LR`].
    lr: f64,
    /// Linear warm-up, in steps. Default 1.
    warmup_steps: u64,
    /// AdamW β1. Default 0.9.
    adam_beta1: f64,
    /// AdamW β2. Default 0.95.
    adam_beta2: f64,
    /// AdamW ε. Default 1e-8.
    adam_eps: f64,
    /// Decoupled weight decay. Default 0.1.
    weight_decay: f64,
    /// Global gradient-norm clip (0 disables). Default 1.0.
    grad_clip: f64,
    /// Most completion tokens per micro-batch (bounds memory). Default 512.
    micro_batch_tokens: usize,
    /// Run a group's shared prompt once per micro-batch. Default true.
    share_prompts: bool,
    /// With share_prompts: the prefix common to the step's prompts once a
    /// step, micro-batches packed without padding. Default true.
    pack_prompts: bool,
    /// GRPO lower clip ε_lo. Default 0.2.
    clip_low: f64,
    /// GRPO upper clip ε_hi. Default 0.28.
    clip_high: f64,
    /// Ratio cap δ for negative advantages. Default 4.0.
    neg_ratio_cap: f64,
    /// Clamp on the length-normalised log-ratio. Default 5.0.
    logratio_clamp: f64,
    /// Cap on the importance ratio. Default 10.0.
    ratio_max: f64,
    /// Entropy bonus coefficient. Default 0.001.
    entropy_coef: f64,
    /// Checkpoints whose weights the proof keeps loaded (rollouts naming an
    /// older one are dropped as stale). Default 3.
    keep_checkpoints: usize,
    /// Off-draw rollouts the proof re-generates per window with the
    /// trainer's own draws so that their groups train (beyond it they are
    /// dropped). Default 2.
    max_repairs_per_window: usize,
    /// Of those, the most one miner's rollouts may use per window. Default 1.
    max_repairs_per_miner: usize,
    /// Publications whose checkpoint and payload files stay on disk (0: all). Default 16.
    keep_publications: usize,
    /// A full payload (instead of a sparse delta) every this many publications. Default 8.
    full_every: u64,
    /// Groups one training step takes at most, over the windows it trains
    /// on; what the trainer holds in memory for it. Default 128.
    max_train_groups: usize,
    /// Groups a training step needs at least; the proven groups of fewer
    /// are kept (on disk) until later windows bring the rest. Default 1.
    min_train_groups: usize,
    /// Prometheus metrics listener. Default: none.
    metrics: Option<std::net::SocketAddr>,
    /// GSM8K JSONL file, for the proof of rollouts when the network's
    /// environment is gsm8k. Default: none.
    gsm8k: Option<PathBuf>,
}

impl Default for RunConfig {
    fn default() -> Self {
        let t = trainer::train::TrainConfig::default();
        Self {
            device: tributary_policy::DeviceSpec::Auto,
            warmup_steps: t.warmup_steps,
            adam_beta1: t.beta1,
            adam_beta2: t.beta2,
            adam_eps: t.eps,
            weight_decay: t.weight_decay,
            grad_clip: t.grad_clip,
            micro_batch_tokens: t.micro_batch_tokens,
            share_prompts: t.share_prompts,
            pack_prompts: t.pack_prompts,
            clip_low: t.grpo.clip_low,
            clip_high: t.grpo.clip_high,
            neg_ratio_cap: t.grpo.neg_ratio_cap,
            logratio_clamp: t.grpo.logratio_clamp,
            ratio_max: t.grpo.ratio_max,
            entropy_coef: t.grpo.entropy_coef,
            keep_checkpoints: trainer::proof::ProofConfig::default().keep_checkpoints,
            max_repairs_per_window: trainer::proof::ProofConfig::default().max_repairs_per_window,
            max_repairs_per_miner: trainer::proof::ProofConfig::default().max_repairs_per_miner,
            keep_publications: 16,
            coordinator: None,
            fingerprint: None,
            ca: None,
            coordinator_key: None,
            data: "trainer-data".into(),
            model: None,
            key: None,
            lr: t.lr,
            full_every: 8,
            max_train_groups: trainer::select::DEFAULT_MAX_TRAIN_GROUPS,
            min_train_groups: trainer::select::DEFAULT_MIN_TRAIN_GROUPS,
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
        c.device = self.device.unwrap_or(c.device);
        c.keep_publications = self.keep_publications.unwrap_or(c.keep_publications);
        c.full_every = self.full_every.unwrap_or(c.full_every);
        c.min_train_groups = self.min_train_groups.unwrap_or(c.min_train_groups);
        Ok(c)
    }
}

impl RunConfig {
    /// The optimiser and objective settings.
    fn train(&self) -> trainer::train::TrainConfig {
        trainer::train::TrainConfig {
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            beta1: self.adam_beta1,
            beta2: self.adam_beta2,
            eps: self.adam_eps,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            micro_batch_tokens: self.micro_batch_tokens,
            share_prompts: self.share_prompts,
            pack_prompts: self.pack_prompts,
            grpo: trainer::grpo::GrpoConfig {
                clip_low: self.clip_low,
                clip_high: self.clip_high,
                neg_ratio_cap: self.neg_ratio_cap,
                logratio_clamp: self.logratio_clamp,
                ratio_max: self.ratio_max,
                entropy_coef: self.entropy_coef,
            },
        }
    }

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
    let device = conf.device.resolve()?;
    let train = conf.train();
    tracing::info!(device = ?device, "training device");
    let proof = trainer::proof::ProofConfig {
        gsm8k: conf.gsm8k.clone(),
        keep_checkpoints: conf.keep_checkpoints,
        max_repairs_per_window: conf.max_repairs_per_window,
        max_repairs_per_miner: conf.max_repairs_per_miner,
        device,
        ..Default::default()
    };
    let cfg = ServiceConfig {
        coordinator,
        fingerprint,
        coordinator_key,
        key,
        dir: conf.data,
        genesis,
        train,
        select: trainer::select::SelectConfig {
            max_train_groups: conf.max_train_groups.max(1),
            min_train_groups: conf.min_train_groups.max(1),
            ..trainer::select::SelectConfig::new(vocab)
        },
        full_every: conf.full_every,
        trust_unjudged: dev,
        poll: std::time::Duration::from_millis(500),
        device,
        keep_publications: conf.keep_publications,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        if let Some(addr) = metrics {
            let bound = serve_metrics(addr, "trainer").await?;
            tributary_net::announce(format_args!("metrics=http://{bound}/metrics"));
        }
        tributary_net::announce(format_args!("trainer={}", cfg.key.public()));
        let mut s = Service::open_with(cfg, proof).await?;
        let stop = tributary_net::shutdown::on_stop_signal();
        tributary_net::shutdown::notify_ready();
        s.run(stop).await?;
        anyhow::Ok(())
    })
}

fn main() -> std::process::ExitCode {
    // Logs (warnings about rollouts refused by the proof, steps, uploads) on
    // stderr; RUST_LOG picks the level (default: info, llama.cpp from warn).
    let cli = Cli::parse();
    tributary_net::init_logging(tributary_net::logging::DEFAULT_FILTER, cli.log.log_format);
    tributary_net::cli::exit_code(trainer_main(cli))
}

fn trainer_main(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::InitBase { src, out } => {
            let src = src.unwrap_or_else(assets::smollm2_q4_1);
            let out = out.unwrap_or_else(assets::smollm2_bf16);
            init::init_base(&src, &out)?;
        }
        Cmd::InitTiny { seed, out, tokenizer_src, family } => {
            let family = tributary_protocol::tiny::TinyFamily::from_name(&family)
                .with_context(|| format!("family {family:?}: expected llama, llama3, qwen2 or qwen3"))?;
            let default_name = match family {
                tributary_protocol::tiny::TinyFamily::Llama => format!("tiny-{seed}.gguf"),
                other => format!("tiny-{}-{seed}.gguf", other.name()),
            };
            let out = out.unwrap_or_else(|| assets::models_dir().join(default_name));
            let src = tokenizer_src.unwrap_or_else(assets::smollm2_q4_1);
            init::init_tiny(seed, family, &src, &out)?;
        }
        Cmd::ImportHf { dir, out, tokenizer_src, f32 } => {
            let src = tokenizer_src.unwrap_or_else(assets::smollm2_q4_1);
            let tok = tributary_protocol::checkpoint::Checkpoint::open(&src)
                .with_context(|| format!("opening {}", src.display()))?;
            let id = trainer::hf::import(&dir, &tok, &out, trainer::hf::ImportOptions { f32 })
                .with_context(|| format!("importing {}", dir.display()))?;
            println!("content_id={id}");
            println!("path={}", out.display());
        }
        Cmd::Transplant { family, src, out, seed, bias_std } => {
            let layout = trainer::transplant::Layout::from_name(&family)
                .with_context(|| format!("family {family:?}: expected qwen2, qwen3 or llama3"))?;
            let src = src.unwrap_or_else(assets::smollm2_bf16);
            let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&src)
                .with_context(|| format!("opening {}", src.display()))?;
            let opts = trainer::transplant::TransplantOptions { layout, seed, bias_std };
            let id = trainer::transplant::transplant(&ckpt, &opts, &out)
                .with_context(|| format!("transplanting {} to {}", src.display(), out.display()))?;
            println!("content_id={id}");
            println!("path={}", out.display());
        }
        Cmd::Info { path } => init::info(&path)?,
        Cmd::Run(args) => run(*args)?,
        Cmd::Export { path, hf } => {
            let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&path)?;
            trainer::hf::export(&ckpt, &hf)?;
            println!("exported {} ({}) to {}", path.display(), ckpt.content_id(), hf.display());
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            tributary_net::cli::print_completions(Cli::command(), shell);
        }
    }
    Ok(())
}
