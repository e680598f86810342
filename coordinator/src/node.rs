//! Starting a coordinator from a configuration: data folder, keys,
//! certificate, database, core, QUIC server and HTTP listener.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tributary_net::shutdown::CancellationToken;
use tributary_protocol::checkpoint::{Checkpoint, ContentId};
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::rollout::SamplingParams;

use tributary_protocol::wire::{self, Role};

use crate::core::{Access, Core, CoreConfig};
use crate::relay::Relay;
use crate::server::{self, Limits, Server, Shared};
use crate::store::Store;

pub use crate::config::{Config, ConfigError, check_store_url, refuse_dev_keys};

/// The `--dev` tiny model's bytes (deterministic: every `--dev` role builds the
/// same file, [`tributary_protocol::dev`]), from the SmolLM2 file in the cache.
pub fn dev_tiny_bytes() -> anyhow::Result<Vec<u8>> {
    let src = Checkpoint::open(&tributary_assets::smollm2_q4_1())?;
    Ok(tributary_protocol::dev::genesis_bytes(&src)?)
}

/// A running coordinator.
pub struct Node {
    /// QUIC address.
    pub quic: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    /// Certificate fingerprint (hex).
    pub fingerprint: String,
    /// The QUIC server.
    pub server: Server,
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Cancelled by [`Node::shutdown`]: the HTTP listener stops.
    stop: CancellationToken,
    /// The HTTP listener's task.
    http_task: JoinHandle<()>,
    /// The background tasks (weights signer, retention, object store).
    tasks: Vec<JoinHandle<()>>,
}

/// The most [`Node::shutdown`] waits at each of its four steps: the
/// submissions already received committed, the QUIC endpoint idle, the HTTP
/// requests in flight answered, the database closed (20 s in all at worst, inside the 30 s
/// `TimeoutStopSec` of installers/systemd/tributary-coordinator.service).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl Node {
    /// Stops in order (`coordinator run` on SIGINT or SIGTERM): new
    /// connections are refused; every submission already handed to the
    /// group-commit writer is committed and its answer queued on its
    /// still-open connection; then every connection is closed (reason
    /// `shutdown`: a client reconnects to the next coordinator and re-sends
    /// what it had no answer for) and the endpoint waited on until idle, so
    /// the peers learn of the close; then the HTTP listener stops (requests in
    /// flight answered) and the background tasks (weights signer, retention,
    /// object store) are aborted at their next await: a pass cut short is
    /// retried from where its records stand at the next start, and one on a
    /// blocking thread finishes before the runtime exits. Each wait is bounded
    /// by [`DRAIN_TIMEOUT`] and logged at warn when it runs out. An
    /// acknowledged rollout was durable before its acknowledgement, so none is
    /// lost whichever wait runs out. Last, the database is closed once the
    /// writer thread lets it go (bounded too), so the next start needs no
    /// redb repair.
    pub async fn shutdown(self) {
        let Node { server, shared, stop, http_task, tasks, .. } = self;
        server.endpoint.set_server_config(None);
        if tokio::time::timeout(DRAIN_TIMEOUT, shared.flush_commits()).await.is_err() {
            tracing::warn!(
                timeout_s = DRAIN_TIMEOUT.as_secs(),
                "shutdown: the commit in progress did not finish in time"
            );
        }
        server.endpoint.close(0u32.into(), b"shutdown");
        if tokio::time::timeout(DRAIN_TIMEOUT, server.endpoint.wait_idle()).await.is_err() {
            tracing::warn!(timeout_s = DRAIN_TIMEOUT.as_secs(), "shutdown: connections still closing; exiting anyway");
        }
        stop.cancel();
        if tokio::time::timeout(DRAIN_TIMEOUT, http_task).await.is_err() {
            tracing::warn!(
                timeout_s = DRAIN_TIMEOUT.as_secs(),
                "shutdown: HTTP requests still in flight; exiting anyway"
            );
        }
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        // The database closed, not left for redb to repair at the next open:
        // once the last holder of the shared state is gone, the group-commit
        // writer ends and drops its store, and ours is the last.
        let store = shared.store.clone();
        drop(shared);
        drop(server);
        let last = async {
            while Arc::strong_count(&store) > 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, last).await.is_err() {
            tracing::warn!("shutdown: the database is still in use; redb repairs it at the next start");
        }
        drop(store);
        tracing::info!("coordinator stopped");
    }
}

fn keys(list: &[String]) -> anyhow::Result<HashSet<PublicKey>> {
    list.iter().map(|s| Ok(s.parse::<PublicKey>()?)).collect()
}

/// Makes the data folder private to the coordinator's user (0700) and its
/// secret files 0600: the certificate key (stateless resets and TLS derive
/// from it) and the database (it holds the master secret every window's
/// challenge derives from).
fn restrict(data_dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
        for f in ["cert.key.der", "coordinator.redb", "coordinator.key"] {
            let p = data_dir.join(f);
            if p.exists() {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    Ok(())
}

fn read_or_create(path: &Path, make: impl FnOnce() -> anyhow::Result<Vec<u8>>) -> anyhow::Result<Vec<u8>> {
    if path.exists() {
        return Ok(std::fs::read(path)?);
    }
    let v = make()?;
    std::fs::write(path, &v)?;
    Ok(v)
}

/// The archive `url` names; a plain relative path is relative to `data_dir`.
fn open_archive(data_dir: &Path, url: &str) -> anyhow::Result<crate::archive::Archive> {
    let relative = !url.contains("://") && Path::new(url).is_relative();
    let url = if relative { data_dir.join(url).to_string_lossy().into_owned() } else { url.to_owned() };
    let archive = crate::archive::Archive::open(&url)?;
    tracing::info!(store = archive.url(), "closed windows are archived to the object store");
    Ok(archive)
}

/// Archives closed windows ([`crate::upkeep::archive_closed_windows`]) now
/// and then as each window's submissions close (a pass at every close, so
/// validators and the trainer, who read a window after its reveal, find it
/// in the store), retrying every 5 seconds after a failure; from now on
/// retention waits for the archive.
fn spawn_archiver(shared: &Arc<Shared>, archive: crate::archive::Archive) -> JoinHandle<()> {
    shared.set_archiving();
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        loop {
            let Some(sh) = weak.upgrade() else { break };
            let now = server::now_ms();
            let ok = match crate::upkeep::archive_closed_windows(&sh, &archive, now).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::error!(error = %e, store = archive.url(), "archiving a closed window failed (retried)");
                    false
                }
            };
            let now = server::now_ms();
            let next_close = {
                let core = sh.core();
                let current = core.current_window(now).unwrap_or(0);
                [current.saturating_sub(1), current]
                    .into_iter()
                    .map(|w| core.schedule().closes_at(w))
                    .filter(|&c| c > now)
                    .min()
            };
            drop(sh);
            // Just past the next close (the pass waits for a commit in
            // progress itself), and at least every 5 s.
            let wait = match next_close {
                Some(c) if ok => (c - now + 20).min(5_000),
                _ => 5_000,
            };
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
    })
}

/// Writes checkpoints, deltas and weights documents to the object store
/// ([`crate::upkeep::store_checkpoints`]) at once, on every new checkpoint
/// and every 5 seconds while the coordinator runs; from now on relay
/// retention deletes only what the store holds, and paths the store holds
/// carry `url`.
fn spawn_checkpoint_store(
    shared: &Arc<Shared>,
    archive: crate::archive::Archive,
    url: Option<String>,
) -> JoinHandle<()> {
    shared.relay.use_store(url);
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        loop {
            let Some(sh) = weak.upgrade() else { break };
            if let Err(e) = crate::upkeep::store_checkpoints(&sh, &archive).await {
                tracing::error!(error = %e, store = archive.url(), "storing checkpoints failed (retried)");
            }
            let relay = sh.relay.clone();
            drop(sh);
            tokio::select! {
                _ = relay.new_checkpoint() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            }
        }
    })
}

/// Applies the checkpoint retention ([`crate::upkeep::apply_retention`])
/// now and every 30 seconds while the coordinator runs.
fn spawn_checkpoint_retention(shared: &Arc<Shared>, keep: u64) -> Option<JoinHandle<()>> {
    if keep == 0 {
        return None;
    }
    let weak = Arc::downgrade(shared);
    Some(tokio::spawn(async move {
        loop {
            let Some(sh) = weak.upgrade() else { break };
            let pass = tokio::task::spawn_blocking(move || crate::upkeep::apply_retention(&sh, keep, server::now_ms()));
            if let Ok(Err(e)) = pass.await {
                tracing::error!(error = %e, "checkpoint retention failed");
            }
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
    }))
}

pub use crate::store::GENESIS_ANNOUNCEMENT;

/// The genesis checkpoint's signed announcement, so miners check the first
/// model as they check every later one: the configured trainer's, once it
/// announced the genesis file (stored; checked again against the configured
/// key and the file); in a `--dev` network, whose trainer key is the public
/// dev key, signed here with that key.
fn genesis_announcement(
    cfg: &Config,
    store: &Store,
    relay: &Relay,
    key: &Keypair,
    genesis: ContentId,
) -> anyhow::Result<Option<wire::PublishCheckpoint>> {
    let (Some(entry), Some(trainer)) = (relay.entry(&genesis), cfg.trainer.as_deref()) else { return Ok(None) };
    let trainer: PublicKey = trainer.trim().parse()?;
    let network = wire::NetworkId::of(&key.public());
    if let Some(bytes) = store.meta(GENESIS_ANNOUNCEMENT)? {
        match postcard::from_bytes::<wire::PublishCheckpoint>(&bytes) {
            Ok(a) if Relay::announces_full(&a, &entry, &trainer, &network) => return Ok(Some(a)),
            _ => tracing::warn!("the stored genesis announcement is not the configured trainer's; ignored"),
        }
    }
    let dev = tributary_protocol::dev::key(Role::Trainer);
    if dev.public() != trainer {
        return Ok(None);
    }
    let body = wire::CheckpointBody {
        id: genesis,
        kind: wire::CheckpointKind::Full,
        len: entry.full_len,
        payload_hash: entry.full_hash,
        window: 0,
        trainer,
    };
    Ok(Some(wire::PublishCheckpoint::sign(body, &dev, &network)))
}

/// The content id of the genesis model: `model`, or the `--dev` tiny model.
pub fn genesis_checkpoint(model: Option<&Path>) -> anyhow::Result<ContentId> {
    Ok(match model {
        Some(p) => Checkpoint::open(p)?.content_id(),
        None => Checkpoint::from_bytes(dev_tiny_bytes()?)?.content_id(),
    })
}

/// The vocabulary size of the genesis model when its file is in the relay
/// (the door refuses token ids at or past it); `None` if it is not there.
fn genesis_vocab(relay: &Path, genesis: &ContentId) -> Option<u32> {
    let path = crate::relay::full_path(relay, genesis);
    if !path.is_file() {
        return None;
    }
    match Checkpoint::open(&path) {
        Ok(c) => u32::try_from(c.config().vocab_size).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "genesis model unreadable; token ids are not checked at the door");
            None
        }
    }
}

/// The relay folder of a data folder.
pub fn relay_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("relay")
}

/// Computes the genesis content id (`cfg.model`, or the `--dev` tiny model)
/// and installs its full file in the relay, so miners without a model can
/// download it. Idempotent.
pub fn prepare_genesis(cfg: &Config) -> anyhow::Result<ContentId> {
    let bytes = match &cfg.model {
        Some(p) => {
            Checkpoint::open(p)?;
            std::fs::read(p)?
        }
        None => dev_tiny_bytes()?,
    };
    Ok(crate::relay::install_full(&relay_dir(&cfg.data_dir), &bytes)?)
}

/// Starts a coordinator. The data folder keeps the database, the coordinator
/// key and the certificate, so a restart on it resumes the same network.
pub async fn start(cfg: &Config, genesis: ContentId) -> anyhow::Result<Node> {
    check_store_url(cfg)?;
    std::fs::create_dir_all(&cfg.data_dir)?;
    let store = Arc::new(Store::open(&cfg.data_dir.join("coordinator.redb"))?);
    let key_path = cfg.data_dir.join("coordinator.key");
    let key = Keypair::load_or_generate(&key_path)?;
    let master: [u8; 32] = store
        .meta_or_init("master_secret", || rand::random::<[u8; 32]>().to_vec())?
        .try_into()
        .map_err(|_| anyhow::anyhow!("corrupt master secret"))?;
    let genesis_ms = u64::from_le_bytes(
        store
            .meta_or_init("genesis_ms", || server::now_ms().to_le_bytes().to_vec())?
            .try_into()
            .map_err(|_| anyhow::anyhow!("corrupt genesis"))?,
    );
    let cert = read_or_create(&cfg.data_dir.join("cert.der"), || {
        let (c, k) = crate::net::self_signed()?;
        crate::admin::write_private(&cfg.data_dir.join("cert.key.der"), &k)?;
        Ok(c)
    })?;
    let cert_key = std::fs::read(cfg.data_dir.join("cert.key.der"))?;
    restrict(&cfg.data_dir)?;
    let access = Access {
        miner_allow: cfg.miner_allow.as_deref().map(keys).transpose()?,
        miner_deny: keys(&cfg.miner_deny)?,
        validators: keys(&cfg.validators)?,
        trainer: cfg.trainer.as_deref().map(str::parse).transpose()?,
    };
    let dataset = match &cfg.dataset {
        Some(p) => {
            Some(*blake3::hash(&std::fs::read(p).with_context(|| format!("dataset {}", p.display()))?).as_bytes())
        }
        None => None,
    };
    if cfg.env == EnvId::Gsm8k && dataset.is_none() {
        anyhow::bail!("the gsm8k environment needs `dataset` (the GSM8K JSONL file)");
    }
    let core = Core::new(CoreConfig {
        schedule: crate::admin::schedule(&cfg.data_dir, genesis_ms, cfg.window_ms, cfg.grace_ms)?,
        master,
        env: cfg.env,
        groups_per_miner: cfg.groups_per_miner,
        group_size: cfg.group_size,
        sampling: SamplingParams { temperature: cfg.temperature, max_new_tokens: cfg.max_new_tokens },
        max_prompt_tokens: cfg.max_prompt_tokens,
        vocab_size: genesis_vocab(&relay_dir(&cfg.data_dir), &genesis),
        max_window_bytes: cfg.max_window_mib.saturating_mul(1 << 20),
        max_window_miners: cfg.max_window_miners,
        difficulty: cfg.difficulty,
        dataset,
        reward: cfg.reward,
        genesis_checkpoint: genesis,
        access,
        ban_windows: cfg.ban_windows,
        soft_failure_threshold: cfg.soft_failure_threshold,
        weight_windows: cfg.weight_windows,
        unique_cap_per_window: cfg.unique_cap_per_window,
        weight_exponent: cfg.weight_exponent,
        committee: cfg.committee,
        validator_budget: cfg.validator_budget,
        reveal_ms: cfg.grace_ms.max(crate::core::MIN_REVEAL_MS),
    });
    let limits = Limits {
        connections_per_sec: cfg.connections_per_sec,
        kib_per_sec: cfg.kib_per_sec,
        rollouts_per_sec: cfg.rollouts_per_sec,
        requests_per_sec: cfg.requests_per_sec,
        max_connections: cfg.max_connections,
        max_connections_per_address: cfg.max_connections_per_address,
        max_connections_per_key: cfg.max_connections_per_key,
        reserved_role_connections: cfg.reserved_role_connections,
        max_unauthenticated: cfg.max_unauthenticated,
        idle_timeout_ms: cfg.idle_timeout_ms,
        handshake_timeout_ms: cfg.handshake_timeout_ms,
        penalties_per_sec: cfg.penalties_per_sec,
        relay_inflight_mib: cfg.relay_inflight_mib,
        relay_kib_per_sec: cfg.relay_kib_per_sec,
        ingest_inflight_mib: cfg.ingest_inflight_mib,
        keep_windows: cfg.keep_windows,
        min_free_mib: cfg.min_free_mib,
    };
    let _ = crate::http::prometheus();
    let mut entries = store.relay_entries()?;
    let relay = Relay::open(&relay_dir(&cfg.data_dir), vec![])?;
    if !entries.iter().any(|e| e.id == genesis)
        && let Some(e) = relay.genesis_entry(genesis)?
    {
        store.put_relay_entry(&e)?;
        entries.push(e);
    }
    let relay = Arc::new(Relay::open(&relay_dir(&cfg.data_dir), entries)?);
    let orphans = relay.remove_orphans()?;
    if orphans > 0 {
        tracing::warn!(files = orphans, "relay files no checkpoint record names were deleted");
    }
    // Only the checkpoints still relayed: a deleted one's announcement is never sent.
    for (_, ann) in store.checkpoints()? {
        if relay.entry(&ann.body.id).is_some() {
            relay.set_announcement(ann);
        }
    }
    if let Some(ann) = genesis_announcement(cfg, &store, &relay, &key, genesis)? {
        relay.set_announcement(ann);
    }
    let shared = server::shared(core, store, key, limits, relay)?;
    crate::admin::apply_overrides(&cfg.data_dir, &mut shared.core())?;
    let archive = cfg.archive.as_deref().map(|url| open_archive(&cfg.data_dir, url)).transpose()?;
    let mut tasks = Vec::new();
    if let Some(archive) = &archive {
        // Before retention's first pass: nothing leaves the relay before it is stored.
        tasks.push(spawn_checkpoint_store(&shared, archive.clone(), cfg.store_url.clone()));
        shared.set_readers(crate::archive::Readers::new(archive.clone(), shared.store.clone(), cfg.store_url.clone()));
    }
    let fingerprint = crate::net::fingerprint(&cert);
    let server = Server::start(cfg.listen, cert, cert_key, shared.clone())?;
    let stop = CancellationToken::new();
    let (http, http_task) = crate::http::start(cfg.http, shared.clone(), stop.clone()).await?;
    tasks.push(crate::weights::spawn_signer(&shared));
    tasks.extend(spawn_checkpoint_retention(&shared, cfg.keep_checkpoints));
    if let Some(archive) = archive {
        tasks.push(spawn_archiver(&shared, archive));
    }
    Ok(Node { quic: server.addr, http, fingerprint, server, shared, stop, http_task, tasks })
}
