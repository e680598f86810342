//! Checkpoint relay bench on SmolLM2 (issue #7): an in-process coordinator
//! on loopback QUIC with the SmolLM2 BF16 base as genesis, N real llama.cpp
//! miners generating on it, and the dev trainer publishing sparse deltas.
//! For each update it prints the time from the start of the publication to
//! every miner having the new checkpoint staged and to every miner generating
//! on it, the generation pause of each miner's swap, and the payload bytes
//! each miner downloaded.
//!
//! The pause is `RunEvent::Swapped::pause`: from the last token of the last
//! group on the old model to the first group on the new one starting to
//! decode (everything the generation loop waits, including a wait for a model
//! not staged in time); `swap` is the part from the batch boundary at which
//! the staged model was found. The first group's time on the new model is
//! printed beside the last one's on the old, so a cold model cannot hide there.
//!
//! `cargo run -p tributary-tests --bin relay-bench -- [MINERS] [UPDATES] [NEXT.gguf] [WINDOW_MS]`
//!
//! `WINDOW_MS` defaults to 20 000 (the `--dev` window; production windows are
//! 360 000 ms).
//!
//! `relay-bench load [ROUNDS]` times, on one thread, what the miner's sync
//! does off the generation thread for each new SmolLM2 model: load (with the
//! F32 widening), warm-up, and dropping a model.
//!
//! Update 1 is `NEXT.gguf` (default `.cache/bench/grpo-step1.gguf`, the
//! checkpoint after one real GRPO step that `grpo-bench` writes) when it
//! exists; later updates change as many BF16 elements of the previous
//! checkpoint as that step did (0.5 % when there is no step file), spread
//! over every matrix.
//!
//! A checkpoint published during window `w` is used from window `w + 1` on
//! (the coordinator's rule), so "publish → all generating" includes the wait
//! for that window to open; the table shows the wait separately.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use coordinator::node::{self, Config};
use coordinator::server::now_ms;
use edge_miner::run::RunEvent;
use edge_miner::sync::SyncEvent;
use tributary_assets as assets;
use tributary_net::Session;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta;
use tributary_protocol::gguf::{self, GgmlType};
use tributary_protocol::wire::{Frame, Role};
use tributary_tests::{Miner, id_of, median, miner_config, publish, seeded_key, within};

/// `base` with about `n` BF16 elements nudged by one unit in the last place,
/// at pseudo-random gaps over every BF16 tensor (deterministic in `salt`).
fn nudge(base: &[u8], salt: u64, n: u64) -> Result<Vec<u8>> {
    let mut out = base.to_vec();
    let h = gguf::parse_header(base)?;
    let ranges: Vec<_> = h.tensors.iter().filter(|t| t.ty == GgmlType::BF16).map(|t| h.tensor_range(t)).collect();
    let total: u64 = ranges.iter().map(|r| (r.end - r.start) as u64 / 2).sum();
    let stride = (total / n.max(1)).max(1);
    let mut state = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut gap = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        1 + (state >> 33) % (2 * stride - 1)
    };
    let mut k = gap() - 1;
    let mut first = 0u64;
    for r in &ranges {
        let elems = (r.end - r.start) as u64 / 2;
        while k < first + elems {
            // Little-endian BF16: the low byte's bit 0 is the mantissa's last bit.
            out[r.start + 2 * (k - first) as usize] ^= 1;
            k += gap();
        }
        first += elems;
    }
    Ok(out)
}

/// Loads, warms and drops the SmolLM2 BF16 base `rounds` times on one thread.
fn load_rounds(rounds: u32) -> Result<()> {
    let path = assets::smollm2_bf16();
    let loader = edge_miner::run::llama_loader(1, 0);
    for k in 1..=rounds {
        let t0 = Instant::now();
        let mut b = loader(&path)?;
        let t1 = Instant::now();
        edge_miner::sync::warm_up(b.as_mut())?;
        let t2 = Instant::now();
        drop(b);
        let t3 = Instant::now();
        println!(
            "round {k}: load (widen + map) {:.0} ms, warm-up {:.0} ms, drop {:.0} ms",
            (t1 - t0).as_secs_f64() * 1e3,
            (t2 - t1).as_secs_f64() * 1e3,
            (t3 - t2).as_secs_f64() * 1e3
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("loadavg={}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    Ok(())
}

fn changed_bf16(a: &[u8], b: &[u8]) -> Result<u64> {
    Ok(delta::change_stats(a, b)?.0)
}

struct Row {
    miner: usize,
    staged_ms: f64,
    prepare_ms: f64,
    load_ms: f64,
    swapped_ms: f64,
    pause_ms: f64,
    swap_ms: f64,
    first_group_ms: f64,
    prev_group_ms: Option<f64>,
    bytes: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("load") {
        return load_rounds(args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(3));
    }
    let miners: usize = args.first().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let updates: u64 = args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(3);
    let next_file = PathBuf::from(args.get(2).cloned().unwrap_or_else(|| ".cache/bench/grpo-step1.gguf".into()));
    let window_ms: u64 = args.get(3).map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    if !(1..=16).contains(&miners) {
        bail!("MINERS must be 1..=16");
    }

    let base_path = assets::smollm2_bf16();
    let genesis_bytes =
        std::fs::read(&base_path).with_context(|| format!("{} (run `trainer init-base`)", base_path.display()))?;
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::dev(dir.path().join("coordinator"));
    cfg.model = Some(base_path.clone());
    cfg.window_ms = window_ms;
    cfg.grace_ms = 1_000;
    cfg.groups_per_miner = 1_000;
    cfg.group_size = 2;
    cfg.max_new_tokens = 8;
    let genesis = node::prepare_genesis(&cfg)?;
    let net = within(60, node::start(&cfg, genesis)).await?;
    let uplink = edge_miner::uplink::UplinkConfig::new(net.quic, net.fingerprint.clone());
    let schedule = *net.shared.core().schedule();

    let mut ms: Vec<Miner> = (0..miners)
        .map(|i| {
            let name = format!("m{i}");
            let mut c = miner_config(dir.path(), uplink.clone(), &name, seeded_key(14, &name), Some(&genesis_bytes));
            c.sync_poll = Duration::from_millis(100);
            Miner::spawn(c)
        })
        .collect();
    for m in &mut ms {
        m.wait_for(180, |e| matches!(e, RunEvent::Submitted { .. })).await;
    }
    eprintln!("relay-bench: {miners} miners generating on the SmolLM2 BF16 genesis {genesis}");

    let trainer_key = tributary_protocol::dev::key(Role::Trainer);
    let mut session = within(30, Session::connect(net.quic, &net.fingerprint, &trainer_key, Role::Trainer)).await?;
    let mut prev = genesis_bytes.clone();
    let mut prev_id: ContentId = genesis;
    let mut per_update_changes = None;
    let mut report = Vec::new();
    for k in 1..=updates {
        let next = if k == 1 && next_file.exists() {
            let b = std::fs::read(&next_file)?;
            per_update_changes = Some(changed_bf16(&prev, &b)?);
            b
        } else {
            let total: u64 = delta::change_stats(&prev, &prev)?.1;
            nudge(&prev, k, per_update_changes.unwrap_or(total / 200))?
        };
        let changed = changed_bf16(&prev, &next)?;
        let id = id_of(&next);
        let d = delta::encode_gguf(&prev, &next, delta::DEFAULT_LEVEL)?;

        // Publish early in a window, so staging is not racing the boundary.
        let w = net.shared.core().current_window(now_ms()).unwrap_or(0);
        while net.shared.core().current_window(now_ms()).unwrap_or(0) == w {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let w = w + 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t0 = Instant::now();
        let t0_ms = now_ms();
        let ans = publish(&mut session, w, id, Some(prev_id), &d).await?;
        let stored_ms = t0.elapsed().as_secs_f64() * 1e3;
        if !matches!(ans, Frame::CheckpointStored(ref s) if s.id == id) {
            bail!("publication refused: {ans:?}");
        }
        let next_open_ms = schedule.opens_at(w + 1).saturating_sub(t0_ms) as f64;

        let mut rows = Vec::new();
        for (i, m) in ms.iter_mut().enumerate() {
            let e = m.wait_for(120, |e| matches!(e, RunEvent::Sync(SyncEvent::Staged { id: s, .. }) if *s == id)).await;
            let RunEvent::Sync(SyncEvent::Staged { bytes, at, by_delta, prepare, load, .. }) = e else {
                unreachable!()
            };
            if !by_delta {
                bail!("miner {i} downloaded the full checkpoint instead of the delta");
            }
            let e = m.wait_for(120, |e| matches!(e, RunEvent::Swapped { id: s, .. } if *s == id)).await;
            let RunEvent::Swapped { pause, swap, at: swapped, first_group, prev_group, .. } = e else { unreachable!() };
            rows.push(Row {
                miner: i,
                staged_ms: at.duration_since(t0).as_secs_f64() * 1e3,
                prepare_ms: prepare.as_secs_f64() * 1e3,
                load_ms: load.as_secs_f64() * 1e3,
                swapped_ms: swapped.duration_since(t0).as_secs_f64() * 1e3,
                pause_ms: pause.as_secs_f64() * 1e3,
                swap_ms: swap.as_secs_f64() * 1e3,
                first_group_ms: first_group.as_secs_f64() * 1e3,
                prev_group_ms: prev_group.map(|d| d.as_secs_f64() * 1e3),
                bytes,
            });
        }
        let all_staged = rows.iter().map(|r| r.staged_ms).fold(0.0, f64::max);
        let all_swapped = rows.iter().map(|r| r.swapped_ms).fold(0.0, f64::max);
        let max_pause = rows.iter().map(|r| r.pause_ms).fold(0.0, f64::max);
        println!(
            "update {k}: {changed} BF16 elements changed, delta {} B of {} B; upload+store {stored_ms:.0} ms; \
             all staged {all_staged:.0} ms; window w+1 opens at {next_open_ms:.0} ms; all generating {all_swapped:.0} ms \
             ({:.0} ms after the window opened); max pause {max_pause:.3} ms",
            d.len(),
            next.len(),
            all_swapped - next_open_ms,
        );
        for r in &rows {
            println!(
                "  miner {}: staged {:.0} ms (slot prepared in {:.0} ms, loaded and warmed in {:.0} ms), generating {:.0} ms, pause {:.3} ms (swap {:.3} ms), first group on the new \
                 model {:.0} ms (last on the old {}), {} bytes",
                r.miner,
                r.staged_ms,
                r.prepare_ms,
                r.load_ms,
                r.swapped_ms,
                r.pause_ms,
                r.swap_ms,
                r.first_group_ms,
                r.prev_group_ms.map_or("-".into(), |p| format!("{p:.0} ms")),
                r.bytes
            );
        }
        report.push((k, changed, d.len(), stored_ms, all_staged, next_open_ms, all_swapped, max_pause, rows));
        prev = next;
        prev_id = id;
    }

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!(
        "miners={miners} window_ms={window_ms} model=SmolLM2-135M BF16 ({} bytes) loadavg={}",
        genesis_bytes.len(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "| update | changed elems | bytes per miner | upload+store ms | publish→all staged ms | window opens ms | publish→all generating ms | after window open ms | max pause ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (k, changed, dlen, stored, staged, open, swapped, pause, rows) in &report {
        let bytes = rows.iter().map(|r| r.bytes).max().unwrap_or(0);
        debug_assert!(bytes as usize >= *dlen);
        println!(
            "| {k} | {changed} | {bytes} | {stored:.0} | {staged:.0} | {open:.0} | {swapped:.0} | {:.0} | {pause:.3} |",
            swapped - open
        );
    }
    let pauses: Vec<f64> = report.iter().flat_map(|r| r.8.iter().map(|r| r.pause_ms)).collect();
    let swaps: Vec<f64> = report.iter().flat_map(|r| r.8.iter().map(|r| r.swap_ms)).collect();
    let firsts: Vec<f64> = report.iter().flat_map(|r| r.8.iter().map(|r| r.first_group_ms)).collect();
    let prevs: Vec<f64> = report.iter().flat_map(|r| r.8.iter().filter_map(|r| r.prev_group_ms)).collect();
    println!();
    println!(
        "pause per swap (ms, update-major, miner-minor): {}",
        pauses.iter().map(|p| format!("{p:.1}")).collect::<Vec<_>>().join(", ")
    );
    println!(
        "pause: max {:.1} ms, median {:.1} ms over {} swaps",
        pauses.iter().copied().fold(0.0, f64::max),
        median(&pauses),
        pauses.len()
    );
    println!(
        "swap part of the pause (ms): {}; max {:.2} ms, median {:.2} ms",
        swaps.iter().map(|p| format!("{p:.2}")).collect::<Vec<_>>().join(", "),
        swaps.iter().copied().fold(0.0, f64::max),
        median(&swaps)
    );
    println!(
        "group time: first on the new model median {:.0} ms (max {:.0}), last on the old model median {:.0} ms (max {:.0})",
        median(&firsts),
        firsts.iter().copied().fold(0.0, f64::max),
        median(&prevs),
        prevs.iter().copied().fold(0.0, f64::max)
    );
    for m in ms {
        m.stop().await;
    }
    Ok(())
}
