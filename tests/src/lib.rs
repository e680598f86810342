//! The loopback mesh factory of the integration tests.
//!
//! [`Net`] starts a `--dev` coordinator in-process (real QUIC on loopback, a
//! real redb file in a temporary folder); [`Mesh`] adds miners (real
//! llama.cpp on the tiny model, any of them with a rollout hook or a smaller
//! capacity), a validator (the real `validator::service` proving every
//! rollout on the libtorch reference model and posting signed verdicts) and
//! a trainer (real libtorch GRPO), all with short windows, seeded keys and a
//! timeout on every wait ([`within`]). [`CoordinatorProcess`] runs the
//! coordinator as a child process instead, for tests that `kill -9` it.
//!
//! These are test helpers: they panic with a message when something the test
//! relies on fails.

pub mod garage;
pub mod http;

/// The median of bench figures: the middle value of an odd count, the mean
/// of the two middle values of an even one (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use coordinator::node::{self, Config, Node};
use edge_miner::run::{self, RunConfig, RunEvent, RunSummary, Tamper};
use edge_miner::sync::Loader;
use edge_miner::uplink::UplinkConfig;
use tempfile::TempDir;
use tokio::sync::mpsc;
use tributary_net::Session;
use tributary_net::shutdown::CancellationToken;
use tributary_protocol::checkpoint::{Checkpoint, ContentId, content_id_of};
use tributary_protocol::gguf::{self, GgmlType};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    Blob, CheckpointBody, CheckpointChunk, CheckpointKind, FetchRollouts, Frame, MAX_CHUNK_LEN, PublishCheckpoint,
    RejectReason, Role,
};

/// Every rollout of `miner` in closed window `w`, read straight from the
/// coordinator over `session`, page after page (what a store reader's
/// answer is compared with).
pub async fn coordinator_rollouts(session: &mut Session, w: WindowId, miner: PublicKey) -> Vec<Vec<u8>> {
    use tributary_net::Paged;
    let req = FetchRollouts { window: w, miner: Some(miner), after: None, limit: 256 };
    let (mut all, mut after) = (Vec::new(), None);
    loop {
        let answer = session.request(&req.ask(after)).await.expect("fetch rollouts");
        let page = req.page(answer).unwrap_or_else(|tag| panic!("unexpected answer to FetchRollouts: {tag:?}"));
        all.extend(page.items.into_iter().map(|b| b.0));
        match page.next {
            Some(n) => after = Some(n),
            None => return all,
        }
    }
}

/// Every await in these tests is bounded: panics after `secs` seconds.
pub async fn within<T>(secs: u64, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f).await.expect("timed out")
}

/// A key derived from the mesh seed and a name (every run of a test uses the same keys).
pub fn seeded_key(seed: u64, name: &str) -> Keypair {
    let mut h = blake3::Hasher::new_derive_key("tributary tests mesh key v1");
    h.update(&seed.to_le_bytes());
    h.update(name.as_bytes());
    Keypair::from_seed(*h.finalize().as_bytes())
}

/// Coordinator settings of a test network.
#[derive(Debug, Clone, Copy)]
pub struct NetConfig {
    /// Window length.
    pub window_ms: u64,
    /// Submission grace.
    pub grace_ms: u64,
    /// Groups per miner per window.
    pub groups_per_miner: u32,
    /// Rollouts per group.
    pub group_size: u32,
    /// Submissions per second per miner key.
    pub rollouts_per_sec: u32,
    /// Most completion tokens per rollout (the window's generation contract).
    pub max_new_tokens: u32,
    /// Seed of the coordinator's master secret (window seeds, challenges).
    pub seed: u64,
    /// Difficulty of the arith environment (the window's generation contract).
    pub difficulty: u32,
    /// Validators authorised besides the `--dev` one ([`extra_validator_key`]).
    pub extra_validators: u32,
    /// Validators per miner in the assignment (the coordinator's `committee`).
    pub committee: u32,
    /// Rollouts each validator is assigned per window (the coordinator's
    /// `validator_budget`); past one group per miner it buys more groups.
    pub validator_budget: u32,
    /// Keys storing per window (the coordinator's `max_window_miners`).
    pub max_window_miners: u32,
    /// Connection attempts per second per address (every role of a test
    /// network shares 127.0.0.1).
    pub connections_per_sec: u32,
    /// Whether closed windows are archived to an object store in the
    /// coordinator's folder (`objects/`; the coordinator's `archive`).
    pub archive: bool,
}

/// The key of the `i`-th validator a test network authorises besides the `--dev` one.
pub fn extra_validator_key(seed: u64, i: u32) -> Keypair {
    seeded_key(seed, &format!("validator-{i}"))
}

impl NetConfig {
    /// Short windows for the tiny model.
    pub fn new(window_ms: u64, grace_ms: u64, groups_per_miner: u32, group_size: u32) -> Self {
        let difficulty = Config::dev(PathBuf::new()).difficulty;
        Self {
            window_ms,
            grace_ms,
            groups_per_miner,
            group_size,
            rollouts_per_sec: 20_000,
            seed: 0,
            max_new_tokens: 24,
            difficulty,
            extra_validators: 0,
            committee: tributary_protocol::assign::DEFAULT_COMMITTEE,
            validator_budget: tributary_protocol::assign::DEFAULT_BUDGET,
            max_window_miners: Config::dev(PathBuf::new()).max_window_miners,
            connections_per_sec: Config::dev(PathBuf::new()).connections_per_sec,
            archive: false,
        }
    }

    fn coordinator(&self, data: PathBuf) -> Config {
        let mut cfg = Config::dev(data);
        cfg.window_ms = self.window_ms;
        cfg.grace_ms = self.grace_ms;
        cfg.groups_per_miner = self.groups_per_miner;
        cfg.group_size = self.group_size;
        cfg.rollouts_per_sec = self.rollouts_per_sec;
        cfg.max_new_tokens = self.max_new_tokens;
        cfg.difficulty = self.difficulty;
        cfg.committee = self.committee;
        cfg.validator_budget = self.validator_budget;
        cfg.max_window_miners = self.max_window_miners;
        cfg.connections_per_sec = self.connections_per_sec;
        if self.archive {
            cfg.archive = Some("objects".into());
        }
        cfg.validators
            .extend((0..self.extra_validators).map(|i| extra_validator_key(self.seed, i).public().to_string()));
        cfg
    }
}

/// Fixes the coordinator's master secret from `seed` before its first start,
/// so window seeds and challenges are the same on every run.
fn seed_master_secret(data: &Path, seed: u64) {
    std::fs::create_dir_all(data).expect("coordinator data folder");
    let store = coordinator::store::Store::open(&data.join("coordinator.redb")).expect("coordinator database");
    let secret = *blake3::Hasher::new_derive_key("tributary tests master secret v1")
        .update(&seed.to_le_bytes())
        .finalize()
        .as_bytes();
    store.meta_or_init("master_secret", || secret.to_vec()).expect("seeding the master secret");
}

/// A running dev coordinator in a temporary folder.
pub struct Net {
    /// The coordinator.
    pub node: Node,
    /// Its genesis (the dev tiny model).
    pub genesis: ContentId,
    /// The genesis file.
    pub genesis_bytes: Vec<u8>,
    /// Its settings.
    pub config: NetConfig,
    /// Temporary folder (coordinator data, miners' and the trainer's folders).
    pub dir: TempDir,
}

impl Net {
    /// Starts a dev coordinator with short windows.
    pub async fn start(window_ms: u64, grace_ms: u64, groups_per_miner: u32, group_size: u32) -> Net {
        Net::with(NetConfig::new(window_ms, grace_ms, groups_per_miner, group_size)).await
    }

    /// Starts a dev coordinator with `config`.
    pub async fn with(config: NetConfig) -> Net {
        Net::with_model(config, None).await
    }

    /// Starts a dev coordinator with `config` whose genesis is `model` (the
    /// dev tiny model if `None`), e.g. another family's tiny model.
    pub async fn with_model(config: NetConfig, model: Option<&Path>) -> Net {
        let dir = tempfile::tempdir().expect("temporary folder");
        let data = dir.path().join("coordinator");
        seed_master_secret(&data, config.seed);
        let mut cfg = config.coordinator(data);
        cfg.model = model.map(Path::to_path_buf);
        let genesis = node::prepare_genesis(&cfg).expect("genesis");
        let genesis_bytes = std::fs::read(coordinator::relay::full_path(&node::relay_dir(&cfg.data_dir), &genesis))
            .expect("genesis file");
        let node = within(30, node::start(&cfg, genesis)).await.expect("coordinator start");
        Net { node, genesis, genesis_bytes, config, dir }
    }

    /// The current window by the coordinator's clock.
    pub fn window(&self) -> WindowId {
        self.node.shared.core().current_window(coordinator::server::now_ms()).unwrap_or(0)
    }

    /// Where the coordinator is, for miners.
    pub fn uplink(&self) -> UplinkConfig {
        UplinkConfig::new(self.node.quic, self.node.fingerprint.clone())
    }

    /// A miner configuration with a fresh random key: dev tiny model (unless
    /// `with_model` is false), one thread, a few tokens, fast polls.
    pub fn miner(&self, name: &str, with_model: bool) -> RunConfig {
        self.miner_with_key(name, Keypair::generate(), with_model)
    }

    /// A miner configuration for `key` in the folder `name`.
    pub fn miner_with_key(&self, name: &str, key: Keypair, with_model: bool) -> RunConfig {
        miner_config(self.dir.path(), self.uplink(), name, key, with_model.then_some(&self.genesis_bytes[..]))
    }

    /// Relay folder of the coordinator.
    pub fn relay_dir(&self) -> PathBuf {
        node::relay_dir(&self.dir.path().join("coordinator"))
    }

    /// Polls `f` against the coordinator every 100 ms until it holds (bounded by `secs`).
    pub async fn until(&self, secs: u64, mut f: impl FnMut(&Net) -> bool) {
        within(secs, async {
            while !f(self) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
    }

    /// Sleeps until window `w` is open.
    pub async fn wait_window(&self, secs: u64, w: WindowId) {
        self.until(secs, |n| n.window() >= w).await
    }
}

/// A miner configuration in `root/name` (tiny model written there if given).
pub fn miner_config(root: &Path, uplink: UplinkConfig, name: &str, key: Keypair, model: Option<&[u8]>) -> RunConfig {
    let folder = root.join(name);
    std::fs::create_dir_all(&folder).expect("miner folder");
    let mut cfg = RunConfig::new(uplink, key, folder.join("models"), 1);
    if let Some(bytes) = model {
        let p = folder.join("dev-tiny.gguf");
        std::fs::write(&p, bytes).expect("miner model");
        cfg.model = Some(p);
    }
    cfg.poll = Duration::from_millis(100);
    cfg.sync_poll = Duration::from_millis(200);
    cfg
}

/// A miner running in-process.
pub struct Miner {
    /// Its key.
    pub key: Keypair,
    /// Its events.
    pub events: mpsc::UnboundedReceiver<RunEvent>,
    /// Rollouts acknowledged in the `Submitted` events read so far.
    pub acked: u64,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<RunSummary, run::RunError>>,
}

impl Miner {
    /// Starts mining.
    pub fn spawn(cfg: RunConfig) -> Miner {
        let key = cfg.key.clone();
        let stop = CancellationToken::new();
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(run::run(cfg, stop.clone(), Some(tx)));
        Miner { key, events, acked: 0, stop, task }
    }

    /// Waits for an event matching `f`, returning it.
    pub async fn wait_for(&mut self, secs: u64, mut f: impl FnMut(&RunEvent) -> bool) -> RunEvent {
        within(secs, async {
            loop {
                let e = self.events.recv().await.expect("miner ended");
                self.count(&e);
                if f(&e) {
                    return e;
                }
            }
        })
        .await
    }

    /// Every event received so far, without waiting.
    pub fn drain(&mut self) -> Vec<RunEvent> {
        let mut v = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            self.count(&e);
            v.push(e);
        }
        v
    }

    fn count(&mut self, e: &RunEvent) {
        if let RunEvent::Submitted { stored, .. } = e {
            self.acked += *stored as u64;
        }
    }

    /// Stops and returns the summary.
    pub async fn stop(self) -> RunSummary {
        self.stop_within(60).await
    }

    /// [`Miner::stop`] bounded by `secs` (a large model's group takes longer).
    pub async fn stop_within(self, secs: u64) -> RunSummary {
        self.stop.cancel();
        within(secs, self.task).await.expect("miner task panicked").expect("miner failed")
    }

    /// Drops the miner on the floor: its task (uplink, connections) is
    /// aborted wherever it is, mid-upload included. Returns the events it
    /// had sent.
    pub async fn abort(mut self) -> Vec<RunEvent> {
        self.task.abort();
        let _ = within(30, &mut self.task).await;
        self.drain()
    }
}

/// One miner of a [`Mesh`].
pub struct MinerSpec {
    /// Folder name and key derivation label.
    pub name: String,
    /// Rollout hook (adversaries).
    pub tamper: Option<Box<dyn Tamper>>,
    /// Model loader (some adversaries load another model); `None`: llama.cpp.
    pub loader: Option<Loader>,
    /// Groups mined per window at most ([`RunConfig::max_groups`]).
    pub max_groups: Option<u32>,
}

impl MinerSpec {
    /// An honest miner.
    pub fn honest(name: &str) -> Self {
        Self { name: name.into(), tamper: None, loader: None, max_groups: None }
    }

    /// A miner with a rollout hook.
    pub fn with(name: &str, tamper: impl Tamper + 'static) -> Self {
        Self::boxed(name, Box::new(tamper), None)
    }

    /// A miner with a boxed rollout hook and optionally its own model loader
    /// (what `edge_miner::adversary::setup` returns).
    pub fn boxed(name: &str, tamper: Box<dyn Tamper>, loader: Option<Loader>) -> Self {
        Self { name: name.into(), tamper: Some(tamper), loader, max_groups: None }
    }

    /// This miner mines at most `n` groups per window.
    pub fn max_groups(mut self, n: u32) -> Self {
        self.max_groups = Some(n);
        self
    }
}

/// What a [`Mesh`] starts.
pub struct MeshConfig {
    /// The coordinator.
    pub net: NetConfig,
    /// The miners.
    pub miners: Vec<MinerSpec>,
    /// Whether a trainer runs (it trusts unjudged rollouts only without a validator).
    pub trainer: bool,
    /// Whether a validator runs (every rollout of every window, from the window the mesh starts in).
    pub validator: bool,
}

impl MeshConfig {
    /// Honest miners `names`, 8-token completions, 4 s windows of two
    /// groups of two, committees of one and one validator key besides the
    /// dev one, no validator started: the network in which two validators
    /// split the miners ([`Mesh::assigned_validators`]).
    pub fn committees_of_one(names: &[&str], trainer: bool) -> MeshConfig {
        MeshConfig {
            net: NetConfig { max_new_tokens: 8, extra_validators: 1, committee: 1, ..NetConfig::new(4_000, 600, 2, 2) },
            miners: names.iter().map(|n| MinerSpec::honest(n)).collect(),
            trainer,
            validator: false,
        }
    }
}

/// What the mesh's validator reports.
#[derive(Debug)]
pub enum ValidatorEvent {
    /// A window was verified and its verdicts posted.
    Verified(Box<validator::service::WindowReport>),
    /// A step failed; the validator reopens its service (progress on disk) and goes on.
    Failed(String),
}

/// The in-process validator service (`validator run`), in a task.
pub struct ValidatorHandle {
    /// Its events.
    pub events: mpsc::UnboundedReceiver<ValidatorEvent>,
    /// Its configuration (its folder, with `progress.json`, survives restarts).
    pub config: validator::service::ServiceConfig,
    task: tokio::task::JoinHandle<()>,
}

impl ValidatorHandle {
    /// Starts the validator service in-process with `cfg`.
    pub fn spawn(cfg: validator::service::ServiceConfig) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let c = cfg.clone();
        let task = tokio::spawn(async move {
            loop {
                let mut s = match validator::service::Service::open(c.clone()).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(ValidatorEvent::Failed(e.to_string()));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                loop {
                    match s.step().await {
                        Ok(Some(r)) => {
                            let _ = tx.send(ValidatorEvent::Verified(Box::new(r)));
                        }
                        Ok(None) => tokio::time::sleep(c.poll).await,
                        Err(e) => {
                            let _ = tx.send(ValidatorEvent::Failed(e.to_string()));
                            break;
                        }
                    }
                }
            }
        });
        Self { events, config: cfg, task }
    }

    /// Waits for the next verified window.
    pub async fn next_report(&mut self, secs: u64) -> validator::service::WindowReport {
        self.until(secs, |_| true).await
    }

    /// Waits for a verified window that `f` accepts (others are skipped).
    pub async fn until(
        &mut self,
        secs: u64,
        mut f: impl FnMut(&validator::service::WindowReport) -> bool,
    ) -> validator::service::WindowReport {
        within(secs, async {
            loop {
                match self.events.recv().await.expect("validator task ended") {
                    ValidatorEvent::Verified(r) => {
                        for (m, rep) in &r.miners {
                            eprintln!(
                                "validator: window {} miner {}: {}/{} valid {:?}",
                                r.window,
                                m.short(),
                                rep.body.valid,
                                rep.body.checked,
                                rep.failed
                            );
                            if !rep.body.reasons.is_empty() {
                                eprintln!("  reasons: {:?}", rep.body.reasons);
                            }
                        }
                        if f(&r) {
                            return *r;
                        }
                    }
                    ValidatorEvent::Failed(e) => eprintln!("validator step failed (retrying): {e}"),
                }
            }
        })
        .await
    }

    /// Kills the validator task wherever it is (its folder stays); its
    /// configuration and the windows it verified that were not read yet.
    pub async fn kill(self) -> (validator::service::ServiceConfig, Vec<validator::service::WindowReport>) {
        self.kill_within(60).await
    }

    /// [`ValidatorHandle::kill`] bounded by `secs` (a proof in progress ends first).
    pub async fn kill_within(
        mut self,
        secs: u64,
    ) -> (validator::service::ServiceConfig, Vec<validator::service::WindowReport>) {
        self.task.abort();
        let _ = within(secs, &mut self.task).await;
        let mut unread = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            if let ValidatorEvent::Verified(r) = e {
                unread.push(*r);
            }
        }
        (self.config, unread)
    }
}

/// The dev validator's configuration for the coordinator of `net` (folder
/// `validator` in the mesh folder): every rollout of every miner, from window `start`.
pub fn validator_config(net: &Net, start: WindowId) -> validator::service::ServiceConfig {
    let key = tributary_protocol::dev::key(Role::Validator);
    let mut cfg = validator::service::ServiceConfig::new(
        net.node.quic,
        net.node.fingerprint.clone(),
        key,
        net.dir.path().join("validator"),
    );
    cfg.sample = validator::service::SampleConfig::ALL;
    cfg.poll = Duration::from_millis(100);
    cfg.start_window = Some(start);
    cfg
}

/// The configuration of the `i`-th extra validator of `net`
/// ([`extra_validator_key`], folder `validator-{i}`): only its assignment
/// ([`validator::service::SampleConfig::ASSIGNED`]), from window `start`.
pub fn extra_validator_config(net: &Net, start: WindowId, i: u32) -> validator::service::ServiceConfig {
    let mut cfg = validator_config(net, start);
    cfg.key = extra_validator_key(net.config.seed, i);
    cfg.dir = net.dir.path().join(format!("validator-{i}"));
    cfg.sample = validator::service::SampleConfig::ASSIGNED;
    cfg
}

/// What the mesh's trainer reports.
#[derive(Debug, Clone)]
pub enum TrainerEvent {
    /// A round took in closed windows without publishing (their rollouts
    /// were held for verdicts, or had no reward variance).
    Consumed(Vec<WindowId>),
    /// A round took a step and published.
    Published {
        /// The windows trained on.
        trained: Vec<WindowId>,
        /// The window published for.
        window: WindowId,
        /// The checkpoint.
        id: ContentId,
    },
    /// A round failed; the trainer reopens its service (state on disk) and goes on.
    Failed(String),
}

/// The in-process trainer service, in a task.
pub struct TrainerHandle {
    /// Its events.
    pub events: mpsc::UnboundedReceiver<TrainerEvent>,
    /// Its configuration (its state folder survives restarts).
    pub config: trainer::service::ServiceConfig,
    tx: mpsc::UnboundedSender<TrainerEvent>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl TrainerHandle {
    /// Starts `trainer run` in-process with `cfg`.
    pub fn spawn(cfg: trainer::service::ServiceConfig) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let task = Self::start(cfg.clone(), tx.clone(), stop.clone());
        Self { events, config: cfg, tx, stop, task }
    }

    /// Kills the trainer task wherever it is (not a polite stop) and starts
    /// it again on its folder; events already sent are kept.
    pub async fn restart(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
        let _ = within(60, &mut self.task).await;
        self.stop = Arc::new(AtomicBool::new(false));
        self.task = Self::start(self.config.clone(), self.tx.clone(), self.stop.clone());
    }

    fn start(
        c: trainer::service::ServiceConfig,
        tx: mpsc::UnboundedSender<TrainerEvent>,
        st: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while !st.load(Ordering::Relaxed) {
                let mut s = match trainer::service::Service::open(c.clone()).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(TrainerEvent::Failed(e.to_string()));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                };
                while !st.load(Ordering::Relaxed) {
                    match s.round().await {
                        Ok(r) => match r.published {
                            Some((window, id)) => {
                                let _ = tx.send(TrainerEvent::Published { trained: r.windows, window, id });
                            }
                            None if !r.windows.is_empty() => {
                                let _ = tx.send(TrainerEvent::Consumed(r.windows));
                            }
                            None => {}
                        },
                        Err(e) => {
                            let _ = tx.send(TrainerEvent::Failed(e.to_string()));
                            break;
                        }
                    }
                    tokio::time::sleep(c.poll).await;
                }
            }
        })
    }

    /// Waits for the next publication: the windows taken in since the last
    /// one (in rounds that published or not), the window published for, the checkpoint.
    pub async fn next_published(&mut self, secs: u64) -> (Vec<WindowId>, WindowId, ContentId) {
        within(secs, async {
            let mut consumed = Vec::new();
            loop {
                match self.events.recv().await.expect("trainer task ended") {
                    TrainerEvent::Consumed(w) => consumed.extend(w),
                    TrainerEvent::Published { trained, window, id } => {
                        consumed.extend(trained);
                        return (consumed, window, id);
                    }
                    TrainerEvent::Failed(e) => eprintln!("trainer round failed (retrying): {e}"),
                }
            }
        })
        .await
    }

    /// Kills the trainer task wherever it is (its state on disk stays).
    pub async fn kill(self) -> trainer::service::ServiceConfig {
        self.kill_within(60).await
    }

    /// [`TrainerHandle::kill`] bounded by `secs` (a GRPO step in progress ends first).
    pub async fn kill_within(mut self, secs: u64) -> trainer::service::ServiceConfig {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
        let _ = within(secs, &mut self.task).await;
        self.config
    }
}

/// The dev trainer's service configuration for a coordinator (state in `dir`).
pub fn trainer_config(
    quic: SocketAddr,
    fingerprint: &str,
    dir: &Path,
    genesis_bytes: &[u8],
) -> trainer::service::ServiceConfig {
    std::fs::create_dir_all(dir).expect("trainer folder");
    let genesis = dir.join("genesis.gguf");
    if !genesis.exists() {
        std::fs::write(&genesis, genesis_bytes).expect("trainer genesis");
    }
    trainer::service::ServiceConfig {
        coordinator: quic,
        fingerprint: fingerprint.to_string(),
        coordinator_key: tributary_net::KeyPin::Any,
        key: tributary_protocol::dev::key(Role::Trainer),
        dir: dir.join("state"),
        genesis,
        train: trainer::train::TrainConfig { lr: 1e-3, warmup_steps: 1, ..Default::default() },
        select: trainer::select::SelectConfig::new(49152),
        full_every: 8,
        trust_unjudged: true,
        poll: Duration::from_millis(200),
        device: tch::Device::Cpu,
        keep_publications: 8,
    }
}

/// A whole network in one process: coordinator, miners and trainer.
pub struct Mesh {
    /// The coordinator and the folder.
    pub net: Net,
    /// The miners, in the order of [`MeshConfig::miners`].
    pub miners: Vec<Miner>,
    /// The miners' names.
    pub names: Vec<String>,
    /// The trainer, if any.
    pub trainer: Option<TrainerHandle>,
    /// The validator, if any.
    pub validator: Option<ValidatorHandle>,
}

impl Mesh {
    /// Starts everything.
    pub async fn start(cfg: MeshConfig) -> Mesh {
        Mesh::start_with_model(cfg, None).await
    }

    /// Starts everything on genesis `model` (see [`Net::with_model`]).
    pub async fn start_with_model(cfg: MeshConfig, model: Option<&Path>) -> Mesh {
        let net = Net::with_model(cfg.net, model).await;
        let mut miners = Vec::new();
        let mut names = Vec::new();
        for spec in cfg.miners {
            let key = seeded_key(cfg.net.seed, &spec.name);
            let mut rc = net.miner_with_key(&spec.name, key, true);
            rc.tamper = spec.tamper;
            rc.max_groups = spec.max_groups;
            if let Some(l) = spec.loader {
                rc.loader = l;
            }
            miners.push(Miner::spawn(rc));
            names.push(spec.name);
        }
        let validator = cfg.validator.then(|| ValidatorHandle::spawn(validator_config(&net, net.window())));
        let trainer = cfg.trainer.then(|| {
            let mut t = trainer_config(
                net.node.quic,
                &net.node.fingerprint,
                &net.dir.path().join("trainer"),
                &net.genesis_bytes,
            );
            t.trust_unjudged = !cfg.validator;
            TrainerHandle::spawn(t)
        });
        Mesh { net, miners, names, trainer, validator }
    }

    /// Two validators from the current window, each proving only what the
    /// window's assignment gives it ([`validator::service::SampleConfig::ASSIGNED`]):
    /// the dev validator and the first extra one
    /// ([`MeshConfig::committees_of_one`]).
    pub fn assigned_validators(&self) -> [ValidatorHandle; 2] {
        let start = self.net.window();
        let mut dev = validator_config(&self.net, start);
        dev.sample = validator::service::SampleConfig::ASSIGNED;
        [ValidatorHandle::spawn(dev), ValidatorHandle::spawn(extra_validator_config(&self.net, start, 0))]
    }

    /// The validator (panics if the mesh has none).
    pub fn validator(&mut self) -> &mut ValidatorHandle {
        self.validator.as_mut().expect("the mesh has no validator")
    }

    /// Door acceptance of a miner: accepted / (accepted + refused), not
    /// counting identical completions refused as replays (the random tiny
    /// model repeats itself now and then; that refusal is by design).
    pub fn acceptance(&self, key: &PublicKey) -> f64 {
        let st = self.stats(key);
        let replays = st.rejected.get("replayed_content").copied().unwrap_or(0);
        let refused: u64 = st.rejected.values().sum::<u64>() - replays;
        st.accepted as f64 / (st.accepted + refused).max(1) as f64
    }

    /// The miner called `name`.
    pub fn miner(&mut self, name: &str) -> &mut Miner {
        let i = self.names.iter().position(|n| n == name).expect("no such miner");
        &mut self.miners[i]
    }

    /// The coordinator's counts for a miner.
    pub fn stats(&self, key: &PublicKey) -> coordinator::core::MinerStats {
        self.net.node.shared.core().miners().get(key).cloned().unwrap_or_default()
    }

    /// Stops every miner and the trainer; the miners' summaries.
    pub async fn stop(self) -> Vec<RunSummary> {
        self.stop_within(60).await
    }

    /// [`Mesh::stop`] with each service's stop bounded by `secs` (work in
    /// progress on a large model ends first).
    pub async fn stop_within(self, secs: u64) -> Vec<RunSummary> {
        if let Some(t) = self.trainer {
            t.kill_within(secs).await;
        }
        if let Some(v) = self.validator {
            v.kill_within(secs).await;
        }
        let mut out = Vec::new();
        for m in self.miners {
            out.push(m.stop_within(secs).await);
        }
        out
    }
}

/// A coordinator as a child process (`mesh-coordinator`, this crate's
/// binary), for tests that kill it. Killed on drop.
pub struct CoordinatorProcess {
    /// The child.
    pub child: Child,
    /// QUIC address.
    pub quic: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    /// Certificate fingerprint.
    pub fingerprint: String,
    /// Genesis checkpoint.
    pub genesis: ContentId,
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CoordinatorProcess {
    /// Starts `exe` (the `mesh-coordinator` binary) on `data`; `quic` port 0 picks one.
    /// The master secret is seeded on the first start.
    pub fn spawn(exe: &Path, data: &Path, cfg: &NetConfig, quic_port: u16) -> Self {
        Self::spawn_with_env(exe, data, cfg, quic_port, &[])
    }

    /// [`CoordinatorProcess::spawn`] with environment variables set for the
    /// child (`MESH_ARCHIVE`, `MESH_STORE_URL`: see `mesh-coordinator`).
    pub fn spawn_with_env(exe: &Path, data: &Path, cfg: &NetConfig, quic_port: u16, env: &[(&str, &str)]) -> Self {
        if !data.join("coordinator.redb").exists() {
            seed_master_secret(data, cfg.seed);
        }
        let mut child = Command::new(exe)
            .arg(data)
            .args([
                cfg.window_ms.to_string(),
                cfg.grace_ms.to_string(),
                cfg.groups_per_miner.to_string(),
                cfg.group_size.to_string(),
                cfg.rollouts_per_sec.to_string(),
                cfg.max_new_tokens.to_string(),
                cfg.difficulty.to_string(),
                quic_port.to_string(),
            ])
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting mesh-coordinator");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut get = |prefix: &str| {
            // Bounded: the child prints these lines first or exits (closing stdout).
            let line = lines.next().expect("coordinator exited").expect("coordinator stdout");
            line.strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix}, got {line}")).to_string()
        };
        let quic = get("quic=").parse().expect("quic address");
        let http = get("http=").parse().expect("http address");
        let fingerprint = get("fingerprint=");
        let genesis = get("checkpoint=").parse().expect("checkpoint id");
        Self { child, quic, http, fingerprint, genesis }
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `kill -TERM` (what systemd sends to stop a service), then waits up to
    /// `secs` seconds for the process to exit: its exit status. Panics if it
    /// is still running by then.
    pub async fn terminate(mut self, secs: u64) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        within(secs, async {
            loop {
                if let Some(status) = self.child.try_wait().expect("waiting for the coordinator") {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }
}

/// A checkpoint derived from `base` by changing `n` BF16 elements of the
/// first matrix (deterministic in `salt`): a valid model with a new content id.
pub fn perturbed(base: &[u8], salt: u32, n: usize) -> Vec<u8> {
    let mut out = base.to_vec();
    let h = gguf::parse_header(base).expect("GGUF header");
    let t = h.tensors.iter().find(|t| t.ty == GgmlType::BF16 && t.name.starts_with("blk.")).expect("a BF16 matrix");
    let r = h.tensor_range(t);
    let elems = (r.end - r.start) / 2;
    for k in 0..n {
        let i = (k * 7919 + salt as usize * 104_729) % elems;
        let at = r.start + 2 * i;
        out[at] ^= 1 + (salt as u8 & 0x3);
    }
    assert_ne!(content_id_of(&h, &out), content_id_of(&h, base));
    Checkpoint::from_bytes(out.clone()).expect("perturbed checkpoint parses");
    out
}

/// The dev trainer's connection.
pub async fn trainer_session(net: &Net) -> Session {
    let key = tributary_protocol::dev::key(Role::Trainer);
    within(30, Session::connect(net.node.quic, &net.node.fingerprint, &key, Role::Trainer))
        .await
        .expect("trainer connects")
}

/// Publishes `payload` (full or delta) as the dev trainer for `window`;
/// the coordinator's answer (a refusal is `Err(NetError::Refused)`).
pub async fn publish(
    s: &mut Session,
    window: WindowId,
    id: ContentId,
    base: Option<ContentId>,
    payload: &[u8],
) -> Result<Frame, tributary_net::NetError> {
    let key = tributary_protocol::dev::key(Role::Trainer);
    let body = CheckpointBody {
        id,
        kind: base.map_or(CheckpointKind::Full, |base| CheckpointKind::Delta { base }),
        len: payload.len() as u64,
        payload_hash: *blake3::hash(payload).as_bytes(),
        window,
        trainer: key.public(),
    };
    within(30, s.send(&Frame::PublishCheckpoint(PublishCheckpoint::sign(body, &key, &s.network())))).await?;
    for (i, c) in payload.chunks(MAX_CHUNK_LEN as usize).enumerate() {
        let f = Frame::CheckpointChunk(CheckpointChunk {
            id,
            offset: (i * MAX_CHUNK_LEN as usize) as u64,
            data: Blob(c.to_vec()),
        });
        within(30, s.send(&f)).await?;
    }
    within(60, s.recv()).await
}

/// Refusals an honest miner can meet: two rollouts of the tiny model with the
/// same completion (the coordinator's replay check is per completion).
pub fn honest_refusals(r: &[RejectReason]) -> bool {
    r.iter().all(|r| *r == RejectReason::ReplayedContent)
}

/// Content id of bytes.
pub fn id_of(bytes: &[u8]) -> ContentId {
    content_id_of(&gguf::parse_header(bytes).expect("GGUF header"), bytes)
}

/// A file's bytes.
pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).expect("reading a file")
}

/// A minimal HTTP/1.0 GET; the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("http connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.expect("http write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("http read");
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// `GET path` parsed as JSON.
pub async fn http_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let body = within(10, http_get(addr, path)).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Logs of the processes a test runs in-process, to the test's captured
/// output, filtered by `RUST_LOG` (once per test binary; later calls do
/// nothing).
pub fn test_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
