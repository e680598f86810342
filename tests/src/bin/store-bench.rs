//! Coordinator egress per published update, with and without the object
//! store (issue 21 item 4), on loopback: an in-process `--dev` coordinator
//! (the tiny model as genesis), a static HTTP server over its store folder,
//! and N simulated miners, each the miner's real checkpoint sync
//! (`edge_miner::sync::run_sync`: QUIC relay client, HTTP store client, every
//! payload verified, deltas applied in place) with a stub model loader
//! instead of llama.cpp, so that N can be large on a small machine.
//!
//! For each N, twice (relay only; store with `store_url`): the miners join
//! without a model (the genesis full file), then the dev trainer publishes
//! one delta. For each of the two it prints the checkpoint payload bytes the
//! coordinator's relay served, the bytes the store's HTTP server served, and
//! the time from the start (or the publication) to every miner having it
//! staged. Frames other than payload chunks (path answers, a few hundred
//! bytes per poll) are not counted.
//!
//! `cargo run --release -p tributary-tests --features edge-miner/wgpu --bin store-bench -- [N...]` (default 1 10 50)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coordinator::node::{self, Config};
use edge_miner::backend::{Backend, BackendError, GeneratedSeq, GroupRequest};
use edge_miner::sync::{Loader, Models, SyncConfig, SyncEvent, run_sync};
use edge_miner::uplink::{Uplink, UplinkConfig};
use tributary_net::Session;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{Frame, Role};
use tributary_tests::http::StaticServer;
use tributary_tests::{id_of, perturbed, publish, within};

/// BF16 elements the published update changes (the delta's size).
const CHANGED: usize = 20_000;

/// A model that loads instantly and generates nothing (the bench measures
/// checkpoint transfer, not inference).
struct Stub;

impl Backend for Stub {
    fn generate_group(&mut self, _req: &GroupRequest<'_>) -> Result<Vec<GeneratedSeq>, BackendError> {
        Ok(Vec::new())
    }
    fn hidden_size(&self) -> usize {
        64
    }
    fn vocab_size(&self) -> usize {
        256
    }
}

/// One measured transfer: relay payload bytes, store bytes, time to all staged.
struct Transfer {
    relay: u64,
    store: u64,
    secs: f64,
}

/// Waits until each of the `n` miners reported `id` staged.
async fn all_staged(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, SyncEvent)>,
    n: usize,
    id: ContentId,
) -> Result<()> {
    let mut done = vec![false; n];
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.iter().any(|d| !d) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some((i, SyncEvent::Staged { id: s, .. }))) if s == id => done[i] = true,
            Ok(Some(_)) => {}
            Ok(None) => bail!("the miners stopped"),
            Err(_) => bail!("{} of {n} miners staged {id} in 600 s", done.iter().filter(|d| **d).count()),
        }
    }
    Ok(())
}

/// N miners join, then follow one delta; with or without the store.
async fn run(n: usize, with_store: bool) -> Result<(u64, u64, Transfer, Transfer)> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("coordinator");
    let mut cfg = Config::dev(data.clone());
    cfg.window_ms = 600_000;
    cfg.max_connections_per_address = (n as u32 + 8).max(64);
    cfg.connections_per_sec = (n as u32 * 4).max(20);
    let http = if with_store {
        let server = StaticServer::start(data.join("objects")).await?;
        let (addr, served) = (server.addr, server.counter());
        cfg.archive = Some("objects".into());
        cfg.store_url = Some(format!("http://{addr}"));
        Some(served)
    } else {
        None
    };
    let http_served = || http.as_ref().map_or(0, |s| s.load(Ordering::Relaxed));
    let genesis = node::prepare_genesis(&cfg)?;
    let genesis_bytes = std::fs::read(coordinator::relay::full_path(&node::relay_dir(&cfg.data_dir), &genesis))?;
    let coord = within(30, node::start(&cfg, genesis)).await?;
    let relay = coord.shared.relay.clone();
    if with_store {
        within(60, async {
            while !relay.is_stored(&genesis) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    let loader: Loader = Arc::new(|_| Ok(Box::new(Stub)));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = tributary_net::shutdown::CancellationToken::new();
    let started = Instant::now();
    for i in 0..n {
        let models = Models::open(&dir.path().join(format!("m{i}")))?;
        let uplink = Uplink::new(UplinkConfig::new(coord.quic, coord.fingerprint.clone()), Keypair::generate());
        let sync =
            SyncConfig { poll: Duration::from_millis(200), attempts: 3, progress: false, loader: loader.clone() };
        let (etx, mut erx) = tokio::sync::mpsc::unbounded_channel();
        let tx = tx.clone();
        let m2 = models.clone();
        tokio::spawn(async move {
            while let Some(e) = erx.recv().await {
                // The generator's swap at the next batch boundary: the staged
                // model becomes the active one (what later paths start from).
                if matches!(e, SyncEvent::Staged { .. }) {
                    let mut st = m2.state();
                    if let Some(s) = st.staged.take() {
                        st.active = Some(s.slot);
                    }
                }
                if tx.send((i, e)).is_err() {
                    return;
                }
            }
        });
        tokio::spawn(run_sync(uplink, models, sync, Some(etx), stop.clone()));
    }
    all_staged(&mut rx, n, genesis).await?;
    let join = Transfer { relay: relay.bytes_served(), store: http_served(), secs: started.elapsed().as_secs_f64() };

    let next = perturbed(&genesis_bytes, 1, CHANGED);
    let id = id_of(&next);
    let d = delta::encode_gguf(&genesis_bytes, &next, delta::DEFAULT_LEVEL)?;
    let (relay0, http0) = (relay.bytes_served(), http_served());
    let trainer = tributary_protocol::dev::key(Role::Trainer);
    let mut t = within(30, Session::connect(coord.quic, &coord.fingerprint, &trainer, Role::Trainer)).await?;
    let started = Instant::now();
    let ans = publish(&mut t, 0, id, Some(genesis), &d).await.context("publishing")?;
    if !matches!(ans, Frame::CheckpointStored(_)) {
        bail!("publication refused: {ans:?}");
    }
    all_staged(&mut rx, n, id).await?;
    let update = Transfer {
        relay: relay.bytes_served() - relay0,
        store: http_served() - http0,
        secs: started.elapsed().as_secs_f64(),
    };
    stop.cancel();
    Ok((genesis_bytes.len() as u64, d.len() as u64, join, update))
}

fn kib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1024.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let ns: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let ns = if ns.is_empty() { vec![1, 10, 50] } else { ns };
    println!("coordinator egress (checkpoint payload KiB the relay served) per update, N simulated miners, loopback");
    println!(
        "{:>5} {:>8} | {:>12} {:>12} {:>9} | {:>12} {:>12} {:>9}",
        "N", "what", "relay-only", "", "", "with store", "", ""
    );
    println!(
        "{:>5} {:>8} | {:>12} {:>12} {:>9} | {:>12} {:>12} {:>9}",
        "", "", "relay KiB", "store KiB", "secs", "relay KiB", "store KiB", "secs"
    );
    for n in ns {
        let (full, delta_len, j0, u0) = run(n, false).await?;
        let (_, _, j1, u1) = run(n, true).await?;
        for (what, a, b) in [("join", &j0, &j1), ("delta", &u0, &u1)] {
            println!(
                "{n:>5} {what:>8} | {:>12} {:>12} {:>9.2} | {:>12} {:>12} {:>9.2}",
                kib(a.relay),
                kib(a.store),
                a.secs,
                kib(b.relay),
                kib(b.store),
                b.secs
            );
        }
        println!("      (full file {} KiB, delta {} KiB)", kib(full), kib(delta_len));
    }
    Ok(())
}
