//! The Tributary validator.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tributary_net::cli::{ConfigPaths, CoordinatorArgs, load_config};
use validator::check::{CheckOptions, run_check};

#[derive(Parser, Debug)]
#[command(name = "validator", version = tributary_net::cli::version(), about = "Tributary validator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: tributary_net::logging::LogArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every model check offline on a JSONL file from `edge-miner generate`.
    Check(CheckArgs),
    /// Verify every window of a coordinator's network and post signed verdicts.
    Run(RunArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: tributary_net::cli::Shell,
    },
}

/// `validator run`'s flags: each overrides the config file's key of the same
/// name (`docs/config/validator.toml` documents every key).
#[derive(clap::Args, Debug)]
#[command(
    mut_arg("dev", |a| a.help("Join a `coordinator run --dev` network with the well-known dev validator key")),
    mut_arg("config", |a| a.help("Configuration file (TOML; every key in docs/config/validator.toml); flags override it")),
    mut_arg("data", |a| a.help("Data folder (key, downloaded checkpoints; default validator-data)")),
)]
struct RunArgs {
    #[command(flatten)]
    common: CoordinatorArgs,
    /// Check every rollout of every miner (default: the window's assignment only).
    #[arg(long)]
    all: bool,
    /// Fraction of the window's other miners checked besides the assignment.
    #[arg(long)]
    miner_fraction: Option<f64>,
    /// At least this many extra miners.
    #[arg(long)]
    min_miners: Option<usize>,
    /// At most this many extra miners.
    #[arg(long)]
    max_miners: Option<usize>,
    /// Rollouts checked per extra miner, and at least per assigned one (whole groups); 0: all of an extra miner's.
    #[arg(long)]
    rollouts_per_miner: Option<usize>,
    /// Most rollouts per reference forward pass (default 8).
    #[arg(long)]
    batch: Option<usize>,
    /// Most padded tokens per reference forward pass (default 8192).
    #[arg(long)]
    batch_tokens: Option<usize>,
    /// GSM8K JSONL file (when the network's environment is gsm8k).
    #[arg(long)]
    gsm8k: Option<PathBuf>,
    /// libtorch threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the reference model runs: cpu, cuda, cuda:N or auto (default auto).
    #[arg(long)]
    device: Option<tributary_policy::DeviceSpec>,
    /// Prometheus metrics listener (plain HTTP), e.g. 127.0.0.1:9091.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
}

/// `validator run`'s configuration file (TOML). Every key has a default
/// except the coordinator's address and pin; relative paths are relative to
/// the file's folder; unknown keys are refused.
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
    /// refused. Default: pinned on first sight in the data folder.
    coordinator_key: Option<String>,
    /// Data folder (`validator.key`, checkpoints, progress). Default `validator-data`.
    data: PathBuf,
    /// Check every rollout of every miner. Default false (grail's sample).
    all: bool,
    /// Fraction of the window's other miners checked as extras. Default 0 (1.0 with `all`).
    miner_fraction: Option<f64>,
    /// At least this many extra miners. Default 0 (every miner with `all`).
    min_miners: Option<usize>,
    /// At most this many extra miners. Default 0 (every miner with `all`).
    max_miners: Option<usize>,
    /// Rollouts checked per extra miner, and at least per assigned one (whole groups). Default 0.
    rollouts_per_miner: Option<usize>,
    /// Most rollouts per reference forward pass. Default 8.
    batch: usize,
    /// Most padded tokens per reference forward pass. Default 8192.
    batch_tokens: usize,
    /// GSM8K JSONL file (when the network's environment is gsm8k).
    gsm8k: Option<PathBuf>,
    /// libtorch threads. Default: available cores.
    threads: Option<usize>,
    /// Where the reference model runs: cpu, cuda, cuda:N or auto. Default auto.
    device: tributary_policy::DeviceSpec,
    /// Prometheus metrics listener. Default: none.
    metrics: Option<std::net::SocketAddr>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            coordinator: None,
            fingerprint: None,
            ca: None,
            coordinator_key: None,
            data: "validator-data".into(),
            all: false,
            miner_fraction: None,
            min_miners: None,
            max_miners: None,
            rollouts_per_miner: None,
            batch: 8,
            batch_tokens: 8192,
            gsm8k: None,
            threads: None,
            device: tributary_policy::DeviceSpec::Auto,
            metrics: None,
        }
    }
}

impl ConfigPaths for RunConfig {
    fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf)) {
        f(&mut self.data);
        for p in [&mut self.ca, &mut self.gsm8k].into_iter().flatten() {
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
        over!(miner_fraction, min_miners, max_miners, rollouts_per_miner, gsm8k, threads, metrics);
        c.device = self.device.unwrap_or(c.device);
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
        c.all |= self.all;
        c.batch = self.batch.unwrap_or(c.batch);
        c.batch_tokens = self.batch_tokens.unwrap_or(c.batch_tokens);
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
    use tributary_protocol::identity::Keypair;
    use validator::service::{SampleConfig, Service, ServiceConfig};
    let conf = args.resolve()?;
    let (coordinator, pin) = conf.coordinator()?;
    if args.common.check_config {
        print!("{}", toml::to_string(&conf)?);
        return Ok(());
    }
    std::fs::create_dir_all(&conf.data)?;
    let key = if args.common.dev {
        tributary_protocol::dev::key(tributary_protocol::wire::Role::Validator)
    } else {
        Keypair::load_or_generate(&conf.data.join("validator.key"))?
    };
    let role = tributary_protocol::wire::Role::Validator;
    tributary_net::cli::refuse_dev_keys(args.common.dev, role, &key.public(), coordinator)?;
    let coordinator_key =
        tributary_net::KeyPin::resolve(conf.coordinator_key.as_deref(), Some(conf.data.as_path()), args.common.dev)?;
    tributary_net::announce(format_args!("validator={}", key.public()));
    tributary_policy::init_threads(conf.threads);
    let mut cfg = ServiceConfig::new(coordinator, pin, key, conf.data.clone());
    cfg.coordinator_key = coordinator_key;
    cfg.device = conf.device.resolve()?;
    let mut sample = if conf.all { SampleConfig::ALL } else { SampleConfig::ASSIGNED };
    if let Some(f) = conf.miner_fraction {
        sample.miner_fraction = f;
    }
    if let Some(n) = conf.min_miners {
        sample.min_miners = n;
    }
    if let Some(n) = conf.max_miners {
        sample.max_miners = n;
    }
    if let Some(n) = conf.rollouts_per_miner {
        sample.rollouts_per_miner = n;
    }
    cfg.sample = sample;
    cfg.batch = conf.batch;
    cfg.batch_tokens = conf.batch_tokens;
    cfg.gsm8k = conf.gsm8k.clone();
    let metrics = conf.metrics;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        if let Some(addr) = metrics {
            let bound = tributary_net::serve_metrics(addr, "validator")
                .await
                .with_context(|| format!("metrics listener on {addr}"))?;
            tributary_net::announce(format_args!("metrics=http://{bound}/metrics"));
        }
        let stop = tributary_net::shutdown::on_stop_signal();
        let mut service = Service::open(cfg).await.context("connecting to the coordinator")?;
        tributary_net::shutdown::notify_ready();
        // One line per verified window on stdout, for scripts.
        let line = |r: &validator::service::WindowReport| {
            let failed = r.miners.values().filter(|m| m.body.hard_failure).count();
            tributary_net::announce(format_args!(
                "window={} miners={} failed={} rollouts={} proved={} seconds={:.2}",
                r.window,
                r.miners.len(),
                failed,
                r.fetched,
                r.proved,
                r.seconds
            ));
        };
        service.run(stop, line).await.context("validator run")?;
        Ok(())
    })
}

/// The `--dev` validator key (a `--dev` coordinator authorises it).
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
    /// GSM8K JSONL file (default: the one each record names). (The old flag name still works.)
    #[arg(long = "gsm8k", alias = "data")]
    data: Option<PathBuf>,
    /// Difficulty of the arith environment (default: the one each record
    /// names, else 3).
    #[arg(long)]
    difficulty: Option<u32>,
    /// Assigned max_new_tokens (default: the one each record names, else the
    /// longest completion in the file).
    #[arg(long)]
    max_new_tokens: Option<u32>,
    /// Assigned temperature (default: each rollout's own).
    #[arg(long)]
    temperature: Option<f32>,
    /// libtorch threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the reference model runs: cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    device: tributary_policy::DeviceSpec,
}

fn check(args: CheckArgs) -> Result<()> {
    let mut opts = CheckOptions::new(args.model, args.rollouts, args.seed);
    opts.device = args.device.resolve()?;
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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tributary_net::init_logging(tributary_net::logging::DEFAULT_FILTER, cli.log.log_format);
    tributary_net::cli::exit_code(validator_main(cli))
}

fn validator_main(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Check(args) => check(args),
        Command::Run(args) => run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            tributary_net::cli::print_completions(Cli::command(), shell);
            Ok(())
        }
    }
}
