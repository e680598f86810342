//! `coordinator run --dev` or `coordinator run --config FILE`; operator
//! commands: `ban` and `unban` (live on a running coordinator, through its
//! admin socket, or on a stopped one), `window-length` and `inspect` (on a
//! stopped coordinator); `keygen`, `pubkey`, `fingerprint`, `install-cert`
//! and `check-config`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use coordinator::node::{self, Config};

#[derive(Parser)]
#[command(name = "coordinator", version = tributary_net::cli::version(), about = "Tributary coordinator")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    log: tributary_net::logging::LogArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the coordinator.
    Run {
        /// A single-machine throwaway network: loopback, self-signed certificate, short windows.
        #[arg(long)]
        dev: bool,
        /// Configuration file (TOML); required without `--dev`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Genesis model (GGUF); with `--dev` the tiny model is used otherwise.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Data folder (with `--dev`: a temporary one unless given).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Validator key (hex) allowed to post verdicts; repeatable (adds to the config).
        #[arg(long = "validator")]
        validators: Vec<String>,
        /// Trainer key (hex) (overrides the config).
        #[arg(long)]
        trainer: Option<String>,
        /// Window length in milliseconds (overrides the config).
        #[arg(long)]
        window_ms: Option<u64>,
        /// Check the configuration (the file with the flags on top), print its main settings and exit without starting.
        #[arg(long)]
        check_config: bool,
    },
    #[command(flatten)]
    Admin(coordinator::admin::AdminCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: tributary_net::cli::Shell,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tributary_net::init_logging(tributary_net::logging::DEFAULT_FILTER, cli.log.log_format);
    tributary_net::cli::exit_code(coordinator_main(cli))
}

#[tokio::main]
async fn coordinator_main(cli: Cli) -> anyhow::Result<()> {
    let (dev, config, model, data, validators, trainer, window_ms, check_config) = match cli.cmd {
        Cmd::Run { dev, config, model, data, validators, trainer, window_ms, check_config } => {
            (dev, config, model, data, validators, trainer, window_ms, check_config)
        }
        Cmd::Admin(cmd) => return Ok(coordinator::admin::cli(&cmd, &mut std::io::stdout().lock())?),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            tributary_net::cli::print_completions(Cli::command(), shell);
            return Ok(());
        }
    };
    let mut _tmp = None;
    let mut cfg = match (dev, &config) {
        // Relative paths (data_dir, model, dataset) follow the file, as in every role.
        (_, Some(path)) => tributary_net::cli::load_config::<Config>(path)?,
        (true, None) => {
            let dir = match &data {
                Some(d) => d.clone(),
                None => {
                    let t = tempfile::tempdir()?;
                    let p = t.path().to_path_buf();
                    _tmp = Some(t);
                    p
                }
            };
            Config::dev(dir)
        }
        (false, None) => anyhow::bail!("give --config FILE, or --dev"),
    };
    if let Some(d) = data {
        cfg.data_dir = d;
    }
    if model.is_some() {
        cfg.model = model;
    }
    cfg.validators.extend(validators);
    if trainer.is_some() {
        cfg.trainer = trainer;
    }
    if let Some(w) = window_ms {
        cfg.window_ms = w;
    }
    // A public --dev key outside --dev is refused first, whatever else is wrong.
    if !dev {
        node::refuse_dev_keys(&cfg)?;
    }
    coordinator::config::check_values(&cfg, dev).with_context(|| match &config {
        Some(p) => format!("configuration {}", p.display()),
        None => "configuration".to_string(),
    })?;
    if check_config {
        let path = config.clone().unwrap_or_default();
        return Ok(coordinator::admin::check_config(&cfg, &path, dev, &mut std::io::stdout().lock())?);
    }
    // Installed before anything is served: a SIGTERM (systemd's stop) or
    // ctrl-c from here on drains the node in order (`Node::shutdown`) and exits 0.
    let stop = tributary_net::shutdown::on_stop_signal();
    let genesis = node::prepare_genesis(&cfg)?;
    let n = node::start(&cfg, genesis).await?;
    // Live `coordinator ban`/`unban` (docs/runbook.md); without it they need the coordinator stopped.
    #[cfg(unix)]
    let _admin = match coordinator::admin::serve_live(&cfg.data_dir, n.shared.clone()) {
        Ok(a) => {
            tracing::info!(socket = %a.path().display(), "admin socket");
            Some(a)
        }
        Err(e) => {
            tracing::warn!(
                "no admin socket in {} ({e}): ban/unban need the coordinator stopped",
                cfg.data_dir.display()
            );
            None
        }
    };
    tributary_net::announce(format_args!(
        "quic={}\nhttp=http://{}\nfingerprint={}\ncheckpoint={genesis}\ndata={}",
        n.quic,
        n.http,
        n.fingerprint,
        cfg.data_dir.display()
    ));
    tracing::info!(quic = %n.quic, http = %n.http, "coordinator running");
    tributary_net::shutdown::notify_ready();
    stop.cancelled().await;
    tributary_net::shutdown::notify_stopping();
    // No live ban/unban while draining.
    #[cfg(unix)]
    drop(_admin);
    n.shutdown().await;
    Ok(())
}
