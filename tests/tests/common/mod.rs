//! A loopback network for the integration tests: an in-process `--dev`
//! coordinator, in-process miners on the tiny model, and a dev trainer that
//! publishes checkpoints over QUIC.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use coordinator::node::{self, Config, Node};
use edge_miner::run::{self, RunConfig, RunEvent, RunSummary};
use edge_miner::uplink::UplinkConfig;
use tempfile::TempDir;
use tokio::sync::{mpsc, watch};
use tributary_net::Session;
use tributary_protocol::checkpoint::{Checkpoint, ContentId, content_id_of};
use tributary_protocol::gguf::{self, GgmlType};
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{
    Blob, CheckpointBody, CheckpointChunk, CheckpointKind, Frame, MAX_CHUNK_LEN, PublishCheckpoint, RejectReason, Role,
};
use tributary_protocol::window::WindowId;

/// Every await in these tests is bounded.
pub async fn within<T>(secs: u64, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f).await.expect("timed out")
}

/// A running dev coordinator in a temporary folder.
pub struct Net {
    /// The coordinator.
    pub node: Node,
    /// Its genesis (the dev tiny model).
    pub genesis: ContentId,
    /// The genesis file.
    pub genesis_bytes: Vec<u8>,
    /// Temporary folder (coordinator data, miners' folders).
    pub dir: TempDir,
}

impl Net {
    /// Starts a dev coordinator with short windows.
    pub async fn start(window_ms: u64, grace_ms: u64, groups_per_miner: u32, group_size: u32) -> Net {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::dev(dir.path().join("coordinator"));
        cfg.window_ms = window_ms;
        cfg.grace_ms = grace_ms;
        cfg.groups_per_miner = groups_per_miner;
        cfg.group_size = group_size;
        let genesis = node::prepare_genesis(&cfg).unwrap();
        let genesis_bytes = std::fs::read(coordinator::relay::full_path(&node::relay_dir(&cfg.data_dir), &genesis)).unwrap();
        let node = within(30, node::start(&cfg, genesis)).await.unwrap();
        Net { node, genesis, genesis_bytes, dir }
    }

    /// The current window by the coordinator's clock.
    pub fn window(&self) -> WindowId {
        self.node.shared.core().current_window(coordinator::server::now_ms()).unwrap_or(0)
    }

    /// A miner configuration: dev tiny model (unless `with_model` is false),
    /// one thread, a few tokens, fast polls.
    pub fn miner(&self, name: &str, with_model: bool) -> RunConfig {
        let key = Keypair::generate();
        let folder = self.dir.path().join(name);
        std::fs::create_dir_all(&folder).unwrap();
        let mut cfg = RunConfig::new(UplinkConfig::new(self.node.quic, self.node.fingerprint.clone()), key, folder.join("models"), 1);
        if with_model {
            let p = folder.join("dev-tiny.gguf");
            std::fs::write(&p, &self.genesis_bytes).unwrap();
            cfg.model = Some(p);
        }
        cfg.max_new_tokens = 24;
        cfg.poll = Duration::from_millis(100);
        cfg.sync_poll = Duration::from_millis(200);
        cfg
    }

    /// Relay folder of the coordinator.
    pub fn relay_dir(&self) -> PathBuf {
        node::relay_dir(&self.dir.path().join("coordinator"))
    }
}

/// A miner running in-process.
pub struct Miner {
    /// Its key.
    pub key: Keypair,
    /// Its events.
    pub events: mpsc::UnboundedReceiver<RunEvent>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<RunSummary, run::RunError>>,
}

impl Miner {
    /// Starts mining.
    pub fn spawn(cfg: RunConfig) -> Miner {
        let key = cfg.key.clone();
        let (stop, rx) = watch::channel(false);
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(run::run(cfg, rx, Some(tx)));
        Miner { key, events, stop, task }
    }

    /// Waits for an event matching `f`, returning it.
    pub async fn wait_for(&mut self, secs: u64, mut f: impl FnMut(&RunEvent) -> bool) -> RunEvent {
        within(secs, async {
            loop {
                let e = self.events.recv().await.expect("miner ended");
                if f(&e) {
                    return e;
                }
            }
        })
        .await
    }

    /// Stops and returns the summary.
    pub async fn stop(self) -> RunSummary {
        let _ = self.stop.send(true);
        within(60, self.task).await.unwrap().unwrap()
    }
}

/// A checkpoint derived from `base` by changing `n` BF16 elements of the
/// first matrix (deterministic in `salt`): a valid model with a new content id.
pub fn perturbed(base: &[u8], salt: u32, n: usize) -> Vec<u8> {
    let mut out = base.to_vec();
    let h = gguf::parse_header(base).unwrap();
    let t = h.tensors.iter().find(|t| t.ty == GgmlType::BF16 && t.name.starts_with("blk.")).unwrap();
    let r = h.tensor_range(t);
    let elems = (r.end - r.start) / 2;
    for k in 0..n {
        let i = (k * 7919 + salt as usize * 104_729) % elems;
        let at = r.start + 2 * i;
        out[at] ^= 1 + (salt as u8 & 0x3);
    }
    assert_ne!(content_id_of(&h, &out), content_id_of(&h, base));
    Checkpoint::from_bytes(out.clone()).unwrap();
    out
}

/// The dev trainer's connection.
pub async fn trainer_session(net: &Net) -> Session {
    let key = node::dev_key(Role::Trainer);
    within(30, Session::connect(net.node.quic, &net.node.fingerprint, &key, Role::Trainer)).await.unwrap()
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
    let key = node::dev_key(Role::Trainer);
    let body = CheckpointBody {
        id,
        kind: base.map_or(CheckpointKind::Full, |base| CheckpointKind::Delta { base }),
        len: payload.len() as u64,
        payload_hash: *blake3::hash(payload).as_bytes(),
        window,
        trainer: key.public(),
    };
    within(30, s.send(&Frame::PublishCheckpoint(PublishCheckpoint::sign(body, &key)))).await.unwrap();
    for (i, c) in payload.chunks(MAX_CHUNK_LEN as usize).enumerate() {
        let f = Frame::CheckpointChunk(CheckpointChunk { id, offset: (i * MAX_CHUNK_LEN as usize) as u64, data: Blob(c.to_vec()) });
        within(30, s.send(&f)).await.unwrap();
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
    content_id_of(&gguf::parse_header(bytes).unwrap(), bytes)
}

/// A file's bytes.
pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}
