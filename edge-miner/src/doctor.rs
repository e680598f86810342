//! `edge-miner doctor`: checks everything a miner needs before it mines, says
//! what to fix, and fails if anything would stop mining.
//!
//! The checks, in order:
//! - **backend**: the llama.cpp build (CPU, or CUDA/Metal/Vulkan features) and
//!   the devices it sees; a GPU build, or `gpu_layers > 0`, without a GPU fails;
//! - **key**: the miner key exists in the data folder and loads;
//! - **coordinator**: a real QUIC handshake with the miner's key against the
//!   pinned certificate fingerprint (a wrong fingerprint, an unreachable
//!   address or a refused key fail);
//! - **clock**: skew between this machine and the coordinator, from the
//!   coordinator's clock in its greeting (half the round trip corrected);
//!   a skew that would push submissions out of the grace period fails;
//! - **window**: the window open now, its checkpoint and environment (a GSM8K
//!   network without a GSM8K file configured fails);
//! - **memory**: the checkpoint's size (asked of the coordinator, else the
//!   largest model file in the data folder) against available memory (the GPU's
//!   free memory when layers are offloaded);
//! - **disk**: room in the data folder for two model slots and a download.
//!
//! Each check is data ([`Check`]); only bad *inputs* (an unreadable config
//! file) are errors ([`DoctorError`]).

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_net::cli::{ConfigError, ConfigPaths};
use tributary_net::{NetError, Session, now_ms};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{ErrorCode, Frame, GetCheckpointPath, GetWindow, Role, WindowInfo};

/// The miner's configuration file (TOML), as `installers/install-miner.sh`
/// writes it and `edge-miner run --config` and `edge-miner doctor --config`
/// read it (documented in `docs/config/miner.toml`). Unknown keys are
/// refused so a typo is caught.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MinerConfig {
    /// The coordinator's QUIC address, `HOST:PORT`.
    pub coordinator: String,
    /// The coordinator's certificate fingerprint (64 hex digits); this or `ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// A CA certificate file (PEM) that signed the coordinator's certificate; this or `fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// The coordinator's key (hex): a coordinator with another key is
    /// refused. Default: pinned on first sight in the data folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_key: Option<String>,
    /// Data folder (key, models). Default `miner-data`.
    #[serde(default = "default_data")]
    pub data: PathBuf,
    /// Layers offloaded to a GPU (0: CPU only). Default 0.
    #[serde(default)]
    pub gpu_layers: u32,
    /// CPU threads (default: available cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// GSM8K JSONL file, needed when the network's environment is `gsm8k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gsm8k: Option<PathBuf>,
    /// A model file to start from (default: the slots in the data folder,
    /// else a download from the coordinator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Inference engine. Default `llama`.
    #[serde(default)]
    pub backend: MinerBackend,
    /// wgpu adapter whose name contains this (default: the most capable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

/// The generation engines a miner can run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MinerBackend {
    /// llama.cpp (CPU, or CUDA/Metal/Vulkan builds).
    #[default]
    Llama,
    /// WGSL compute shaders on any wgpu adapter (builds with `--features wgpu`; BF16 checkpoints).
    Wgpu,
}

fn default_data() -> PathBuf {
    "miner-data".into()
}

/// Failures to read the doctor's inputs.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// The config file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The config file is not valid.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: Box<toml::de::Error>,
    },
    /// Neither a config file nor `--coordinator` and `--fingerprint` (or `--ca`) were given.
    #[error("give --config FILE, or --coordinator HOST:PORT with --fingerprint HEX or --ca FILE")]
    NoCoordinator,
    /// Both a fingerprint and a CA file are configured.
    #[error("give the coordinator's `fingerprint` or a `ca` file, not both")]
    TwoPins,
    /// The CA file is unusable.
    #[error("{0}")]
    Ca(NetError),
    /// The async runtime could not start.
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}

impl ConfigPaths for MinerConfig {
    fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf)) {
        f(&mut self.data);
        for p in [&mut self.gsm8k, &mut self.model, &mut self.ca].into_iter().flatten() {
            f(p);
        }
    }
}

impl MinerConfig {
    /// A configuration with every default, for `coordinator` pinned by `fingerprint`.
    pub fn new(coordinator: impl Into<String>, fingerprint: impl Into<String>) -> Self {
        Self {
            coordinator: coordinator.into(),
            fingerprint: Some(fingerprint.into()),
            ca: None,
            coordinator_key: None,
            data: default_data(),
            gpu_layers: 0,
            threads: None,
            gsm8k: None,
            model: None,
            backend: MinerBackend::default(),
            adapter: None,
        }
    }

    /// Reads a config file. Relative `data`, `gsm8k`, `model` and `ca` paths
    /// are taken relative to the file's folder.
    pub fn load(path: &Path) -> Result<Self, DoctorError> {
        tributary_net::cli::load_config(path).map_err(|e| match e {
            ConfigError::Read { path, source } => DoctorError::Read { path, source },
            ConfigError::Parse { path, source } => DoctorError::Parse { path, source },
        })
    }

    /// The pin spec clients connect with ([`tributary_net::Pin::parse`]):
    /// the fingerprint, or the CA file's PEM text.
    pub fn pin(&self) -> Result<String, DoctorError> {
        match (&self.fingerprint, &self.ca) {
            (Some(_), Some(_)) => Err(DoctorError::TwoPins),
            (Some(f), None) => Ok(f.trim().to_string()),
            (None, Some(ca)) => tributary_net::read_ca(ca).map_err(DoctorError::Ca),
            (None, None) => Err(DoctorError::NoCoordinator),
        }
    }
}

/// `edge-miner doctor`'s arguments.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DoctorArgs {
    /// The miner's config file (as the installer writes it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The coordinator's QUIC address (overrides the config).
    #[arg(long)]
    pub coordinator: Option<String>,
    /// The coordinator's certificate fingerprint, hex (overrides the config's pin).
    #[arg(long, conflicts_with = "ca")]
    pub fingerprint: Option<String>,
    /// CA certificate (PEM) that signed the coordinator's certificate (overrides the config's pin).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Data folder (overrides the config; default `miner-data`).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Layers to offload to a GPU (overrides the config).
    #[arg(long)]
    pub gpu_layers: Option<u32>,
    /// Seconds to wait for the coordinator.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

impl DoctorArgs {
    /// The configuration these arguments describe: the config file, if any,
    /// with the command-line values on top.
    pub fn resolve(&self) -> Result<MinerConfig, DoctorError> {
        let cfg = match &self.config {
            Some(p) => Some(MinerConfig::load(p)?),
            None => None,
        };
        let coordinator = self.coordinator.clone().or_else(|| cfg.as_ref().map(|c| c.coordinator.clone()));
        let Some(coordinator) = coordinator else { return Err(DoctorError::NoCoordinator) };
        let mut base = cfg.unwrap_or_else(|| MinerConfig { fingerprint: None, ..MinerConfig::new("", "") });
        base.coordinator = coordinator;
        // A pin on the command line replaces the config's.
        if self.fingerprint.is_some() || self.ca.is_some() {
            base.fingerprint = self.fingerprint.clone();
            base.ca = self.ca.clone();
        }
        if base.fingerprint.is_none() && base.ca.is_none() {
            return Err(DoctorError::NoCoordinator);
        }
        if let Some(d) = &self.data {
            base.data = d.clone();
        }
        if let Some(g) = self.gpu_layers {
            base.gpu_layers = g;
        }
        Ok(base)
    }
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Fine.
    Ok,
    /// Mining works, but something deserves attention.
    Warn,
    /// Mining would not work.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
        })
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Short name (`backend`, `key`, `coordinator`, `clock`, `window`, `memory`, `disk`).
    pub name: &'static str,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it (for warnings and failures).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self { name, status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// Every check's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// In the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether nothing would stop mining (warnings allowed).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The check named `name`.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            writeln!(f, "{:<4} {:<11} {}", c.status, c.name, c.detail)?;
            if let Some(fix) = &c.fix {
                writeln!(f, "     {:<11} fix: {fix}", "")?;
            }
        }
        let fails = self.checks.iter().filter(|c| c.status == Status::Fail).count();
        let warns = self.checks.iter().filter(|c| c.status == Status::Warn).count();
        if fails == 0 {
            write!(f, "doctor: ready to mine ({warns} warning(s))")
        } else {
            write!(f, "doctor: {fails} problem(s) would stop mining, {warns} warning(s)")
        }
    }
}

/// `edge-miner doctor`: runs every check, prints the report, and returns
/// whether mining can start (the caller exits non-zero otherwise).
pub fn cli(args: &DoctorArgs) -> Result<bool, DoctorError> {
    let cfg = args.resolve()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(DoctorError::Runtime)?;
    let report = rt.block_on(diagnose(&cfg, Duration::from_secs(args.timeout.max(1))));
    println!("{report}");
    Ok(report.passed())
}

/// Runs every check against `cfg`, waiting at most `timeout` for each
/// exchange with the coordinator.
pub async fn diagnose(cfg: &MinerConfig, timeout: Duration) -> Report {
    let mut checks = Vec::new();
    let devices = backend_check(cfg, &mut checks);
    let key = key_check(&cfg.data, &mut checks);
    let remote = coordinator_checks(cfg, key.as_ref(), timeout, &mut checks).await;
    let model_len = remote.as_ref().and_then(|r| r.model_len).or_else(|| local_model_len(&cfg.data));
    memory_check(cfg, &devices, model_len, &mut checks);
    disk_check(&cfg.data, model_len, &mut checks);
    Report { checks }
}

/// What the coordinator told us.
struct Remote {
    model_len: Option<u64>,
}

/// A GPU (or other accelerator) llama.cpp sees.
#[derive(Debug, Clone)]
struct Device {
    name: String,
    free: u64,
}

fn compiled_accelerators() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    if cfg!(feature = "metal") {
        v.push("metal");
    }
    if cfg!(feature = "vulkan") {
        v.push("vulkan");
    }
    v
}

fn backend_check(cfg: &MinerConfig, checks: &mut Vec<Check>) -> Vec<Device> {
    use llama_cpp_2::LlamaBackendDeviceType as T;
    const NAME: &str = "backend";
    if let Err(e) = crate::llama::llama_backend() {
        checks.push(Check::fail(
            NAME,
            format!("llama.cpp did not start: {e}"),
            "reinstall edge-miner (installers/install-miner.sh)",
        ));
        return vec![];
    }
    let all = llama_cpp_2::list_llama_ggml_backend_devices();
    let gpus: Vec<Device> = all
        .iter()
        .filter(|d| matches!(d.device_type, T::Gpu | T::IntegratedGpu | T::Accelerator))
        .map(|d| Device { name: format!("{} ({})", d.description, d.backend), free: d.memory_free as u64 })
        .collect();
    let accel = compiled_accelerators();
    let threads = cfg.threads.unwrap_or_else(crate::llama::default_threads);
    let build = if accel.is_empty() { "CPU".to_string() } else { accel.join("+") };
    let mut detail = format!("llama.cpp {build} build, {threads} CPU thread(s)");
    for g in &gpus {
        detail.push_str(&format!("; {} with {} free", g.name, human(g.free)));
    }
    #[cfg(feature = "wgpu")]
    {
        let adapters = crate::wgpu::list_adapters();
        if adapters.is_empty() {
            detail.push_str("; wgpu: no adapter (install a Vulkan/Metal/DX12 driver)");
        }
        for a in &adapters {
            detail.push_str(&format!("; wgpu adapter {a}"));
        }
    }
    if !accel.is_empty() && gpus.is_empty() {
        checks.push(Check::fail(
            NAME,
            detail,
            format!("this edge-miner was built for {build} but sees no GPU: install the driver, or reinstall with --accel cpu"),
        ));
    } else if cfg.gpu_layers > 0 && gpus.is_empty() {
        checks.push(Check::fail(
            NAME,
            detail,
            "gpu_layers is set but no GPU is usable: set gpu_layers = 0, or reinstall with a GPU build",
        ));
    } else if !gpus.is_empty() && cfg.gpu_layers == 0 {
        checks.push(Check::warn(
            NAME,
            detail,
            "a GPU is available but gpu_layers = 0: set gpu_layers = 99 to offload the model",
        ));
    } else {
        checks.push(Check::ok(NAME, detail));
    }
    gpus
}

fn key_check(data: &Path, checks: &mut Vec<Check>) -> Option<Keypair> {
    const NAME: &str = "key";
    let path = data.join("miner.key");
    let fix = format!("edge-miner init --data {}", data.display());
    if !path.exists() {
        checks.push(Check::fail(NAME, format!("no key at {}", path.display()), fix));
        return None;
    }
    match Keypair::load(&path) {
        Ok(k) => {
            checks.push(Check::ok(NAME, format!("miner {} ({})", k.public(), path.display())));
            Some(k)
        }
        Err(e) => {
            checks.push(Check::fail(
                NAME,
                format!("{} does not load: {e}", path.display()),
                format!("restore the key from your backup, or move it aside and run `{fix}` (a new identity)"),
            ));
            None
        }
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or_else(|| "no address".to_string())
}

async fn coordinator_checks(
    cfg: &MinerConfig,
    key: Option<&Keypair>,
    timeout: Duration,
    checks: &mut Vec<Check>,
) -> Option<Remote> {
    const NAME: &str = "coordinator";
    let pin = match cfg.pin() {
        Ok(p) => p,
        Err(e) => {
            checks.push(Check::fail(
                NAME,
                e.to_string(),
                "give the coordinator's `fingerprint` or its CA file (`ca`) as its operator sends them",
            ));
            return None;
        }
    };
    if cfg.ca.is_none() && (pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit())) {
        checks.push(Check::fail(
            NAME,
            format!("fingerprint {pin:?} is not 64 hex digits"),
            "copy the `fingerprint=` line the coordinator prints at start",
        ));
        return None;
    }
    let addr = match resolve(&cfg.coordinator) {
        Ok(a) => a,
        Err(e) => {
            checks.push(Check::fail(
                NAME,
                format!("{} does not resolve: {e}", cfg.coordinator),
                "give the coordinator as HOST:PORT",
            ));
            return None;
        }
    };
    // Without a key, a throwaway one still proves reachability and the pin.
    let probe;
    let key = match key {
        Some(k) => k,
        None => {
            probe = Keypair::generate();
            &probe
        }
    };
    let started = std::time::Instant::now();
    let connected = tokio::time::timeout(timeout, Session::connect(addr, &pin, key, Role::Miner)).await;
    let mut session = match connected {
        Err(_) => {
            checks.push(Check::fail(
                NAME,
                format!("no answer from {addr} within {}s", timeout.as_secs()),
                "check the address and port, that the coordinator runs, and that UDP to that port is open",
            ));
            return None;
        }
        Ok(Err(e)) => {
            checks.push(connect_failure(addr, &e, cfg.ca.is_some()));
            return None;
        }
        Ok(Ok(s)) => s,
    };
    let received = now_ms();
    let rtt = session.conn.rtt().min(started.elapsed());
    checks.push(Check::ok(
        NAME,
        format!("{addr}: handshake ok, certificate pinned, coordinator key {}", session.coordinator),
    ));

    // The coordinator stamped its clock when it sent the greeting, about half a round trip ago.
    let half = (rtt.as_millis() / 2) as i64;
    let skew = session.welcome.now_ms as i64 + half - received as i64;
    let grace = session.welcome.schedule.grace_ms() as i64;
    let limit = (grace / 2).max(1_000);
    let detail = format!("{skew:+} ms against the coordinator (round trip {} ms, grace {grace} ms)", rtt.as_millis());
    let fix = "synchronise the clock (e.g. `timedatectl set-ntp true`, or enable network time)";
    checks.push(if skew.abs() >= limit {
        Check::fail("clock", detail, fix)
    } else if skew.abs() >= 250 {
        Check::warn("clock", detail, fix)
    } else {
        Check::ok("clock", detail)
    });

    let info = match tokio::time::timeout(timeout, session.request(&Frame::GetWindow(GetWindow { window: None }))).await
    {
        Ok(Ok(Frame::WindowInfo(w))) => w,
        Ok(Err(NetError::Refused(ErrorCode::NotYet, _))) => {
            checks.push(Check::warn("window", "no window open yet (before genesis)", "wait for the network to start"));
            return Some(Remote { model_len: None });
        }
        other => {
            let what = match other {
                Err(_) => "timed out".to_string(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(f)) => format!("unexpected {:?}", f.tag()),
            };
            checks.push(Check::fail(
                "window",
                format!("asking the window: {what}"),
                "retry; if it persists, tell the coordinator's operator",
            ));
            return Some(Remote { model_len: None });
        }
    };
    checks.push(window_check(cfg, &info));
    let model_len = checkpoint_len(&mut session, info.checkpoint, timeout).await;
    session.conn.close(0u32.into(), b"doctor done");
    Some(Remote { model_len })
}

fn connect_failure(addr: SocketAddr, e: &NetError, ca: bool) -> Check {
    const NAME: &str = "coordinator";
    let text = e.to_string();
    match e {
        NetError::Refused(ErrorCode::Unauthorized, d) => Check::fail(
            NAME,
            format!("{addr} refused this key: {d}"),
            "the coordinator's operator allow-lists or denies miners; send them your `miner=` key",
        ),
        NetError::Refused(ErrorCode::Version, _) => {
            Check::fail(NAME, format!("{addr}: {text}"), "upgrade edge-miner (re-run installers/install-miner.sh)")
        }
        _ if ca && (text.contains("certificate") || text.contains("tls") || text.contains("crypto")) => Check::fail(
            NAME,
            format!("{addr}: the certificate is not signed by the pinned CA ({text})"),
            "re-check the CA file with the coordinator's operator; never mine against an unpinned certificate",
        ),
        _ if text.contains("certificate")
            || text.contains("fingerprint")
            || text.contains("tls")
            || text.contains("crypto") =>
        {
            Check::fail(
                NAME,
                format!("{addr}: the certificate does not match the pinned fingerprint ({text})"),
                "re-check the fingerprint with the coordinator's operator; never mine against an unpinned certificate",
            )
        }
        _ => Check::fail(NAME, format!("{addr}: {text}"), "check the address and that the coordinator runs"),
    }
}

fn window_check(cfg: &MinerConfig, info: &WindowInfo) -> Check {
    let detail = format!(
        "window {} open, checkpoint {}, env {}, {} group(s) of {}",
        info.window,
        short(&info.checkpoint),
        info.env.as_str(),
        info.groups_per_miner,
        info.group_size
    );
    if info.env == EnvId::Gsm8k && cfg.gsm8k.as_ref().is_none_or(|p| !p.is_file()) {
        return Check::fail(
            "window",
            detail,
            "this network runs GSM8K: set `gsm8k = \"/path/to/train.jsonl\"` in the config",
        );
    }
    Check::ok("window", detail)
}

fn short(id: &ContentId) -> String {
    let s = id.to_string();
    s.get(..16).map_or(s.clone(), str::to_string)
}

/// The full size of `id` on the relay (a full download's length).
async fn checkpoint_len(session: &mut Session, id: ContentId, timeout: Duration) -> Option<u64> {
    let ask = Frame::GetCheckpointPath(GetCheckpointPath { have: None, want: Some(id) });
    match tokio::time::timeout(timeout, session.request(&ask)).await {
        Ok(Ok(Frame::CheckpointPath(p))) => p.steps.iter().filter(|s| s.base.is_none()).map(|s| s.len).max(),
        _ => None,
    }
}

/// The largest `.gguf` file in the data folder's `models`.
fn local_model_len(data: &Path) -> Option<u64> {
    std::fs::read_dir(data.join("models"))
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .max()
}

/// Memory a model of `len` bytes needs: the weights, plus a quarter for the
/// KV cache, logits and compute buffers, plus a fixed 256 MiB.
pub fn memory_needed(len: u64) -> u64 {
    len.saturating_add(len / 4).saturating_add(256 << 20)
}

/// Disk a model of `len` bytes needs: two slots and a download, plus 256 MiB.
pub fn disk_needed(len: u64) -> u64 {
    len.saturating_mul(3).saturating_add(256 << 20)
}

fn memory_check(cfg: &MinerConfig, gpus: &[Device], model_len: Option<u64>, checks: &mut Vec<Check>) {
    const NAME: &str = "memory";
    let Some(len) = model_len else {
        checks.push(Check::warn(
            NAME,
            "model size unknown (coordinator not reached, no local model)",
            "fix the coordinator check first",
        ));
        return;
    };
    let need = memory_needed(len);
    let (free, place) = if cfg.gpu_layers > 0 && !gpus.is_empty() {
        (gpus.iter().map(|g| g.free).max().unwrap_or(0), "GPU memory free")
    } else {
        match available_memory() {
            Some(m) => (m, "RAM available"),
            None => {
                checks.push(Check::warn(
                    NAME,
                    format!("model {} ; available memory unknown on this OS", human(len)),
                    "make sure it fits",
                ));
                return;
            }
        }
    };
    let detail = format!("model {} needs about {}; {} {place}", human(len), human(need), human(free));
    checks.push(if free < need {
        Check::fail(NAME, detail, "close other programs, or mine on a machine with more memory (or lower gpu_layers)")
    } else if free < need.saturating_mul(2) {
        Check::warn(NAME, detail, "little headroom: other programs may push the miner into swap")
    } else {
        Check::ok(NAME, detail)
    });
}

fn disk_check(data: &Path, model_len: Option<u64>, checks: &mut Vec<Check>) {
    const NAME: &str = "disk";
    // The data folder may not exist yet: measure the nearest existing ancestor.
    let mut dir = data.to_path_buf();
    while !dir.exists() {
        if !dir.pop() {
            dir = PathBuf::from(".");
            break;
        }
    }
    if dir.as_os_str().is_empty() {
        dir = PathBuf::from(".");
    }
    let Some(free) = free_disk(&dir) else {
        checks.push(Check::warn(
            NAME,
            format!("free space of {} unknown", dir.display()),
            "make sure it has room for three model files",
        ));
        return;
    };
    let need = disk_needed(model_len.unwrap_or(0));
    let detail = format!("{} free in {}; checkpoints need about {}", human(free), dir.display(), human(need));
    checks.push(if free < need {
        Check::fail(NAME, detail, "free some space, or point `data` at a bigger disk")
    } else {
        Check::ok(NAME, detail)
    });
}

/// Memory available to a new process (Linux: `MemAvailable`; elsewhere what
/// llama.cpp's CPU device reports).
fn available_memory() -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let kib = text
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())?;
        return Some(kib.saturating_mul(1024));
    }
    llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .find(|d| matches!(d.device_type, llama_cpp_2::LlamaBackendDeviceType::Cpu))
        .map(|d| d.memory_free as u64)
}

#[cfg(unix)]
fn free_disk(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a zeroed out-parameter
    // that statvfs fills in; nothing is retained after the call.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(not(unix))]
fn free_disk(_dir: &Path) -> Option<u64> {
    None
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_resolves_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("miner.toml");
        std::fs::write(&p, "coordinator = \"127.0.0.1:4433\"\nfingerprint = \"ab\"\ndata = \"d\"\ngpu_layers = 3\n")
            .unwrap();
        let c = MinerConfig::load(&p).unwrap();
        assert_eq!(c.data, dir.path().join("d"));
        assert_eq!(c.gpu_layers, 3);
        std::fs::write(&p, "coordinator = \"x\"\nfingerprint = \"ab\"\ndta = \"typo\"\n").unwrap();
        assert!(matches!(MinerConfig::load(&p), Err(DoctorError::Parse { .. })));
        let args = DoctorArgs { config: Some(p.clone()), ..DoctorArgs::default() };
        assert!(args.resolve().is_err());
        assert!(matches!(DoctorArgs::default().resolve(), Err(DoctorError::NoCoordinator)));
        let args =
            DoctorArgs { coordinator: Some("h:1".into()), fingerprint: Some("f".into()), ..DoctorArgs::default() };
        assert_eq!(args.resolve().unwrap().data, PathBuf::from("miner-data"));
        assert!(matches!(
            DoctorArgs { coordinator: Some("h:1".into()), ..DoctorArgs::default() }.resolve(),
            Err(DoctorError::NoCoordinator)
        ));
        // A CA pin: relative to the file; both pins at once are refused.
        std::fs::write(&p, "coordinator = \"x:1\"\nca = \"ca.pem\"\nbackend = \"wgpu\"\n").unwrap();
        let c = MinerConfig::load(&p).unwrap();
        assert_eq!(c.ca, Some(dir.path().join("ca.pem")));
        assert_eq!(c.backend, MinerBackend::Wgpu);
        assert!(matches!(c.pin(), Err(DoctorError::Ca(_))), "a missing CA file is an error");
        let both = MinerConfig { ca: Some("ca.pem".into()), ..MinerConfig::new("x:1", "ab") };
        assert!(matches!(both.pin(), Err(DoctorError::TwoPins)));
        // The command line's pin replaces the config's.
        let args = DoctorArgs { config: Some(p.clone()), fingerprint: Some("cd".into()), ..DoctorArgs::default() };
        let r = args.resolve().unwrap();
        assert_eq!((r.fingerprint.as_deref(), r.ca.as_ref()), (Some("cd"), None));
    }

    #[test]
    fn sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 30), "3.0 GiB");
        assert_eq!(disk_needed(u64::MAX), u64::MAX);
        assert!(memory_needed(1 << 30) > 1 << 30);
        assert!(free_disk(Path::new(".")).is_some_and(|f| f > 0));
    }
}
