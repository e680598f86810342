//! Rollout bytes on the coordinator's disk (redb) against the object store
//! after K windows with retention on (issue 21 item 4): an in-process
//! `--dev` coordinator with `archive` a local folder and `keep_windows`
//! small, and M real llama.cpp miners on the tiny model, run for K windows.
//! Then, for every window, it prints the rollouts and their bytes redb still
//! holds (what the coordinator serves), the bytes of the window's segment
//! objects and manifest in the store, and the totals with the redb file's
//! size (redb reuses freed pages; it does not shrink the file). Retention
//! runs every 30 s; the bench runs one pass before it measures.
//!
//! `cargo run -p tributary-tests --bin archive-bench -- [K] [KEEP_WINDOWS] [MINERS] [WINDOW_MS]`
//! (defaults 12 2 2 3000)
//!
//! Measured (2 shared cores, `archive-bench 12 2 2 3000`; tiny-model
//! rollouts of 16 tokens, about 490 bytes each, 16 a window): after 16
//! windows redb held the rollouts of windows 13-15 only (36 rollouts,
//! 17,605 bytes: the two closed windows `keep_windows` keeps and the open
//! one), the store every closed window archived so far, 0-12 (13 windows,
//! 101,412 bytes of segments and 6,581 of manifests, 107,993 in all;
//! 13 and 14 were archived within the next 5 s pass). The redb file stayed
//! at 2,641,920 bytes (pages are reused, never returned). A segment is the
//! rollouts' bytes plus about 34 bytes of framing.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use coordinator::node::{self, Config};
use edge_miner::uplink::UplinkConfig;
use tributary_tests::{Miner, miner_config, seeded_key, within};

fn dir_bytes(p: &Path) -> (u64, u64) {
    let (mut segs, mut manifest) = (0, 0);
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let len = e.metadata().map_or(0, |m| m.len());
        if e.file_name().to_string_lossy().ends_with(".bin") {
            segs += len;
        } else {
            manifest += len;
        }
    }
    (segs, manifest)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let arg = |i: usize, d: u64| args.get(i).copied().unwrap_or(d);
    let (k, keep, miners, window_ms) = (arg(0, 12), arg(1, 2), arg(2, 2), arg(3, 3000));
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::dev(dir.path().join("coordinator"));
    cfg.window_ms = window_ms;
    cfg.grace_ms = 500;
    cfg.groups_per_miner = 2;
    cfg.group_size = 4;
    cfg.max_new_tokens = 16;
    cfg.keep_windows = keep;
    cfg.archive = Some("objects".into());
    let genesis = node::prepare_genesis(&cfg)?;
    let n = within(30, node::start(&cfg, genesis)).await.context("coordinator")?;
    let model = node::dev_tiny_bytes()?;
    let now = || tributary_net::now_ms();
    let start = n.shared.core().current_window(now()).context("no window")?;
    let ms: Vec<Miner> = (0..miners)
        .map(|i| {
            let name = format!("m{i}");
            let up = UplinkConfig::new(n.quic, n.fingerprint.clone());
            Miner::spawn(miner_config(dir.path(), up, &name, seeded_key(i, &name), Some(&model)))
        })
        .collect();
    // K windows, plus one so the K-th has closed and been archived.
    let end = start + k + 1;
    while n.shared.core().current_window(now()).unwrap_or(0) < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    for m in ms {
        m.abort().await;
    }
    // Retention runs every 30 s; one pass now, as a steady network has had.
    let pruned = n.shared.apply_retention(now());
    let objects = cfg.data_dir.join("objects");
    println!(
        "{k} windows of {window_ms} ms, {miners} tiny-model miners, keep_windows = {keep}, archive = local folder \
         (a retention pass at the end deleted {pruned} rollouts)"
    );
    println!("{:>7} | {:>9} {:>11} | {:>11} {:>9}", "window", "redb n", "redb bytes", "store segs", "manifest");
    let (mut redb_total, mut store_total) = (0u64, 0u64);
    // Every window so far, the open one last (not archived: still open).
    let current = n.shared.core().current_window(now()).unwrap_or(end);
    for w in start..=current {
        let (idx, _) = n.shared.store.window_index(w, None, usize::MAX, |_| true)?;
        let (count, bytes): (u64, u64) = idx.iter().fold((0, 0), |(c, b), m| (c + u64::from(m.rollouts), b + m.bytes));
        let (segs, manifest) = dir_bytes(&objects.join(format!("windows/{w:020}")));
        redb_total += bytes;
        store_total += segs + manifest;
        println!("{w:>7} | {count:>9} {bytes:>11} | {segs:>11} {manifest:>9}");
    }
    let file = std::fs::metadata(cfg.data_dir.join("coordinator.redb")).map_or(0, |m| m.len());
    println!("total   | rollout bytes in redb {redb_total} (file {file}) | in the store {store_total}");
    Ok(())
}
