//! The Tributary edge miner.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use edge_miner::backend::Backend;
use edge_miner::doctor::{MinerBackend, MinerConfig};
use edge_miner::llama::{LlamaConfig, LlamaCppBackend, default_threads};
use edge_miner::offline::{self, GenerateOptions, OfflineWindow};
use edge_miner::quantize::{FileType, quantize};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_net::cli::CoordinatorArgs;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{EnvId, EnvSpec, Environment};
use tributary_protocol::identity::Keypair;
use tributary_protocol::sketch::SketchParams;
use tributary_protocol::tokenizer::Tokenizer;

#[derive(Parser, Debug)]
#[command(name = "edge-miner", version = tributary_net::cli::version(), about = "Tributary edge miner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: tributary_net::logging::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create the miner key (`miner.key` in the data folder) and print it as `miner=HEX`.
    Init {
        /// Data folder.
        #[arg(long, default_value = "miner-data")]
        data: PathBuf,
    },
    /// Mine against a coordinator.
    Run(RunArgs),
    /// Check everything mining needs (backend, memory, coordinator, clock, key, disk); non-zero exit if mining would fail.
    Doctor(edge_miner::doctor::DoctorArgs),
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
        /// Target type, as llama.cpp spells it (any case).
        #[arg(long = "type", value_enum, ignore_case = true)]
        ftype: QuantType,
        /// Threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: tributary_net::cli::Shell,
    },
}

/// llama.cpp's names (`llama-quantize`); the old kebab-case spellings still parse.
#[derive(Copy, Clone, Debug, ValueEnum)]
enum QuantType {
    #[value(name = "F16")]
    F16,
    #[value(name = "BF16")]
    Bf16,
    #[value(name = "Q4_0", alias = "q4-0")]
    Q4_0,
    #[value(name = "Q4_1", alias = "q4-1")]
    Q4_1,
    #[value(name = "Q8_0", alias = "q8-0")]
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
    /// Environment: arith, sat or gsm8k (gsm8k needs --gsm8k).
    #[arg(long)]
    env: EnvId,
    /// GSM8K JSONL file (for --env gsm8k; as `run --gsm8k`). (The old flag name still works.)
    #[arg(long = "gsm8k", alias = "data")]
    data: Option<PathBuf>,
    /// Difficulty of the arith environment (default 102, the coordinator's).
    #[arg(long, default_value_t = 102)]
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
    /// Inference engine.
    #[arg(long, value_enum, default_value_t = BackendKind::Llama)]
    backend: BackendKind,
    /// wgpu adapter whose name contains this (default: the most capable).
    #[arg(long)]
    adapter: Option<String>,
}

/// The generation engines.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// llama.cpp (CPU, or CUDA/Metal/Vulkan builds).
    Llama,
    /// WGSL compute shaders on any wgpu adapter (builds with `--features wgpu`; BF16 checkpoints).
    Wgpu,
}

#[cfg(feature = "wgpu")]
fn wgpu_config(model: &std::path::Path, adapter: Option<&String>) -> edge_miner::wgpu::WgpuConfig {
    let mut cfg = edge_miner::wgpu::WgpuConfig::new(model);
    if let Some(a) = adapter {
        cfg.adapter = Some(a.clone());
    }
    cfg
}

#[cfg(not(feature = "wgpu"))]
fn no_wgpu() -> anyhow::Error {
    anyhow::anyhow!("--backend wgpu: this edge-miner was built without the `wgpu` feature")
}

/// `edge-miner run`: a config file (`--config`, as the installer writes it;
/// documented in `docs/config/miner.toml`) and flags, which override it.
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("dev", |a| a.help("Join a `coordinator run --dev` network: the tiny dev model, a key created if missing")),
    mut_arg("config", |a| a.help("Configuration file (TOML; every key in docs/config/miner.toml); flags override it")),
    mut_arg("check_config", |a| a.help("Print the resolved configuration (TOML) and exit without mining")),
    mut_arg("coordinator", |a| a.help("The coordinator's QUIC address, HOST:PORT (config `coordinator`)")),
    mut_arg("fingerprint", |a| a.help("The coordinator's certificate fingerprint, hex (config `fingerprint`)")),
    mut_arg("ca", |a| a.help("CA certificate (PEM) that signed the coordinator's certificate (config `ca`)")),
    mut_arg("data", |a| a.help("Data folder: key, models (config `data`; default miner-data)")),
)]
struct RunArgs {
    #[command(flatten)]
    common: CoordinatorArgs,
    /// A model file to start from (config `model`; default: the slots in the
    /// data folder, else the dev tiny model with --dev, else a download from
    /// the coordinator).
    #[arg(long)]
    model: Option<PathBuf>,
    /// GSM8K JSONL file (config `gsm8k`; when the coordinator's environment is
    /// gsm8k; the temperature, length limit and difficulty come from the coordinator).
    #[arg(long)]
    gsm8k: Option<PathBuf>,
    /// Switch on one attack (adversarial test builds only): forged-sketch,
    /// stale-checkpoint, quantized-q4, quantized-q8, other-model, prefix-edit,
    /// prefill-decode-split, reward-inflation, wrong-prompt, replay, copy, bad-signature.
    #[cfg(feature = "adversary")]
    #[arg(long)]
    attack: Option<String>,
    /// The model an attack really generates with (stale-checkpoint, other-model, prefill-decode-split).
    #[cfg(feature = "adversary")]
    #[arg(long)]
    attack_model: Option<PathBuf>,
    /// The victim's rollouts for `--attack copy` (one JSON rollout per line).
    #[cfg(feature = "adversary")]
    #[arg(long)]
    copy_from: Option<PathBuf>,
    /// CPU threads (config `threads`; default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Layers to offload to a GPU (config `gpu_layers`; default 0).
    #[arg(long)]
    gpu_layers: Option<u32>,
    /// Inference engine (config `backend`; default llama).
    #[arg(long, value_enum)]
    backend: Option<MinerBackend>,
    /// wgpu adapter whose name contains this (config `adapter`; default: the most capable).
    #[arg(long)]
    adapter: Option<String>,
    /// Serve Prometheus metrics (plain HTTP) on this address, e.g. 127.0.0.1:9092 (default: none).
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
}

impl RunArgs {
    /// The configuration file, if any, with the flags on top.
    fn resolve(&self) -> Result<MinerConfig> {
        let common = &self.common;
        let mut cfg = match &common.config {
            Some(p) => MinerConfig::load(p)?,
            None => {
                let Some(c) = &common.coordinator else {
                    bail!("give --config FILE, or --coordinator HOST:PORT with --fingerprint HEX or --ca FILE")
                };
                MinerConfig { fingerprint: None, ..MinerConfig::new(c.clone(), "") }
            }
        };
        if let Some(c) = &common.coordinator {
            cfg.coordinator = c.clone();
        }
        common.override_pin(&mut cfg.fingerprint, &mut cfg.ca);
        if common.coordinator_key.is_some() {
            cfg.coordinator_key.clone_from(&common.coordinator_key);
        }
        if let Some(d) = &common.data {
            cfg.data = d.clone();
        }
        if self.model.is_some() {
            cfg.model = self.model.clone();
        }
        if self.gsm8k.is_some() {
            cfg.gsm8k = self.gsm8k.clone();
        }
        if self.threads.is_some() {
            cfg.threads = self.threads;
        }
        if let Some(g) = self.gpu_layers {
            cfg.gpu_layers = g;
        }
        if let Some(b) = self.backend {
            cfg.backend = b;
        }
        if self.adapter.is_some() {
            cfg.adapter = self.adapter.clone();
        }
        Ok(cfg)
    }
}

fn key_path(data: &std::path::Path) -> PathBuf {
    data.join("miner.key")
}

fn init(data: &std::path::Path) -> Result<Keypair> {
    Ok(Keypair::load_or_generate(&key_path(data))?)
}

fn run(args: RunArgs) -> Result<()> {
    use edge_miner::run::{self as mine, RunConfig};
    use edge_miner::uplink::UplinkConfig;
    let conf = args.resolve()?;
    conf.pin()?;
    // The address (HOST:PORT, resolved) and the fingerprint's form are checked before --check-config says ok.
    let (addr, pin) =
        tributary_net::coordinator_target(Some(&conf.coordinator), conf.fingerprint.as_deref(), conf.ca.as_deref())?;
    if args.common.check_config {
        print!("{}", toml::to_string(&conf)?);
        return Ok(());
    }
    let data = conf.data.clone();
    let path = key_path(&data);
    let key = if args.common.dev {
        init(&data)?
    } else {
        Keypair::load(&path).with_context(|| format!("{} (run `edge-miner init`)", path.display()))?
    };
    tributary_net::announce(format_args!("miner={}", key.public()));
    let threads = conf.threads.unwrap_or_else(default_threads);
    let mut uplink = UplinkConfig::new(addr, pin);
    uplink.coordinator_key =
        tributary_net::KeyPin::resolve(conf.coordinator_key.as_deref(), Some(data.as_path()), args.common.dev)?;
    let mut cfg = RunConfig::new(uplink, key, data.join("models"), threads);
    cfg.loader = match conf.backend {
        MinerBackend::Llama => mine::llama_loader(threads, conf.gpu_layers),
        #[cfg(feature = "wgpu")]
        MinerBackend::Wgpu => {
            let adapter = conf.adapter.clone();
            std::sync::Arc::new(move |path: &std::path::Path| {
                let b = edge_miner::wgpu::WgpuBackend::load(&wgpu_config(path, adapter.as_ref()))?;
                Ok(Box::new(b) as edge_miner::sync::LoadedBackend)
            })
        }
        #[cfg(not(feature = "wgpu"))]
        MinerBackend::Wgpu => return Err(no_wgpu()),
    };
    cfg.gsm8k = conf.gsm8k.clone();
    #[cfg(feature = "adversary")]
    if let Some(name) = &args.attack {
        use edge_miner::adversary::{self, Attack, AttackOptions};
        let attack: Attack = name.parse()?;
        let pool = args.copy_from.as_deref().map(adversary::read_pool).transpose()?;
        let opts =
            AttackOptions { model: args.attack_model.clone(), work_dir: Some(data.join("attack")), threads, pool };
        let setup = adversary::setup(attack, &opts)?;
        cfg.tamper = Some(setup.tamper);
        if let Some(l) = setup.loader {
            cfg.loader = l;
        }
        tracing::warn!("attack {attack} switched on");
    }
    cfg.progress = true;
    cfg.model = match conf.model {
        Some(m) => Some(m),
        None if args.common.dev => {
            Some(tributary_protocol::dev::ensure_genesis(&data, &tributary_assets::smollm2_q4_1())?)
        }
        None => None,
    };
    let metrics = args.metrics;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        // SIGINT or SIGTERM: the group in progress is finished and submitted, then the miner exits 0.
        if let Some(addr) = metrics {
            let bound = tributary_net::serve_metrics(addr, "miner")
                .await
                .with_context(|| format!("metrics listener on {addr}"))?;
            tributary_net::announce(format_args!("metrics=http://{bound}/metrics"));
        }
        let stop = tributary_net::shutdown::on_stop_signal();
        tributary_net::shutdown::notify_ready();
        let s = mine::run(cfg, stop, None).await?;
        tributary_net::shutdown::notify_stopping();
        // Through tracing, not eprintln!: a closed stderr must not turn an orderly stop into a panic.
        tracing::info!(windows = s.windows, stored = s.stored, refused = s.refused, "miner stopped");
        Ok(())
    })
}

fn environment(args: &GenerateArgs) -> Result<Environment> {
    let spec = EnvSpec { env: args.env, difficulty: args.difficulty, dataset: None, reward: Default::default() };
    Ok(Environment::build(&spec, args.data.as_deref())?)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let env = environment(&args)?;
    // The tokenizer comes from the GGUF metadata; the content id only from
    // files the checkpoint reader accepts (BF16 checkpoints, the tiny model).
    let tokenizer = Tokenizer::from_gguf_file(&args.model).context("building the tokenizer")?;
    let model_id = Checkpoint::open(&args.model).ok().map(|c| c.content_id());
    let mut backend: Box<dyn Backend> = match args.backend {
        BackendKind::Llama => Box::new(LlamaCppBackend::load(&LlamaConfig {
            model: args.model.clone(),
            threads: args.threads.unwrap_or_else(default_threads),
            gpu_layers: args.gpu_layers,
        })?),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            Box::new(edge_miner::wgpu::WgpuBackend::load(&wgpu_config(&args.model, args.adapter.as_ref()))?)
        }
        #[cfg(not(feature = "wgpu"))]
        BackendKind::Wgpu => return Err(no_wgpu()),
    };
    if tokenizer.vocab_size() != backend.vocab_size() {
        bail!("tokenizer has {} tokens, model {}", tokenizer.vocab_size(), backend.vocab_size());
    }
    let window = OfflineWindow::from_seed(args.seed);
    let opts = GenerateOptions {
        first_task: 0,
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
    let job = offline::Job {
        tokenizer: &tokenizer,
        env: &env,
        model: model_id,
        data: args.data.as_deref(),
        window: &window,
        opts: &opts,
    };
    let summary = offline::generate(&mut *backend, &job, offline::jsonl_sink(BufWriter::new(out)), |done| {
        bar.set_position(done as u64)
    })?;
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

fn main() -> std::process::ExitCode {
    // SAFETY: first thing in main, before any thread exists.
    let pinned = unsafe { edge_miner::llama::pin_exact_gpu_kernels() };
    let cli = Cli::parse();
    tributary_net::init_logging(tributary_net::logging::DEFAULT_FILTER, cli.log.log_format);
    if !pinned.is_empty() {
        tracing::info!(?pinned, "Vulkan build: f32 matmul inputs pinned for offloaded layers");
    }
    tributary_net::cli::exit_code(miner_main(cli))
}

fn miner_main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Init { data } => {
            let k = init(&data)?;
            println!("miner={}", k.public());
            eprintln!("key in {}", key_path(&data).display());
            Ok(())
        }
        Command::Run(args) => run(args),
        Command::Doctor(args) => {
            if !edge_miner::doctor::cli(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Generate(args) => generate(args),
        Command::Quantize { input, output, ftype, threads } => {
            quantize(&input, &output, ftype.into(), threads.unwrap_or_else(default_threads))?;
            eprintln!("wrote {}", output.display());
            Ok(())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            tributary_net::cli::print_completions(Cli::command(), shell);
            Ok(())
        }
    }
}
