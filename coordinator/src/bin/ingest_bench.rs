//! Ingestion bench: signed 512-token rollouts from N concurrent miner
//! connections over loopback QUIC, with the raw cost of signature checks and
//! redb commits measured in the same run.
//!
//! `ingest_bench [N[,N...]] [PER_MINER] [BATCH[,BATCH...]]` (defaults
//! `1,4,8,16 1000 1,64`). BATCH 1 sends one `Submit` frame per rollout;
//! BATCH > 1 sends `SubmitBatch` frames of that many rollouts. Every
//! (N, BATCH) pair runs on a fresh coordinator and database.
//!
//! The miners share the machine's cores with the coordinator, so besides the
//! wall-clock rate the bench reports CPU time per rollout, per thread group
//! (from `/proc/self/task/*/schedstat`, in ns): the coordinator's runtime
//! threads (`coord`: QUIC, door checks, admission), its redb writer thread,
//! and the miners' runtime (`miner`: QUIC client, framing, reading answers).
//! Every rollout is signed and every frame encoded before the clock starts.

use std::time::Instant;

use coordinator::net::{self, Session};
use coordinator::node::{self, Config};
use coordinator::server::door_check;
use coordinator::store::{Store, StoredRollout};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::task_seed;
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::{self, Rollout, RolloutLimits, SamplingParams};
use tributary_protocol::wire::{Blob, Frame, GetWindow, Outcome, Role, Submit, SubmitBatch, WindowInfo};

fn rollout(info: &WindowInfo, key: &Keypair, group: u32, index: u32) -> Rollout {
    let (prompt, completion) = (96usize, 416usize);
    let n = prompt + completion;
    // Distinct pseudo-random tokens per (miner, group, index): no accidental replays.
    let mut xof = blake3::Hasher::new();
    xof.update(key.public().as_bytes());
    xof.update(&group.to_le_bytes());
    xof.update(&index.to_le_bytes());
    let mut raw = vec![0u8; n * 4];
    xof.finalize_xof().fill(&mut raw);
    let words: Vec<u32> = raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut r = Rollout {
        window: info.window,
        checkpoint: info.checkpoint,
        env: info.env,
        group,
        rollout: index,
        task_id: task_seed(&info.seed, key.public().as_bytes(), group),
        sampling: SamplingParams { temperature: 0.7, max_new_tokens: completion as u32 },
        tokens: words.iter().map(|w| w % 49152).collect(),
        prompt_len: prompt as u32,
        logprobs: (0..completion).map(|i| -((i % 97) as f32) / 10.0).collect(),
        sketches: words.iter().map(|w| w.rotate_left(7) & 0x3ffff).collect(),
        reward: 1.0,
        miner: [0; 32],
        signature: [0; 64],
    };
    r.sign(key);
    r
}

/// CPU time (ns) of this process's threads, summed per name prefix in
/// `groups` (the last slot: every other thread), from
/// `/proc/self/task/*/schedstat`. Threads that already ended are not counted.
fn threads_cpu_ns(groups: &[&str]) -> Vec<u64> {
    let mut out = vec![0; groups.len() + 1];
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in dir.flatten() {
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(e.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        let slot = groups.iter().position(|g| name.starts_with(g)).unwrap_or(groups.len());
        out[slot] += ns;
    }
    out
}

/// CPU time of the calling thread (ns), from `/proc/thread-self/schedstat`.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn list(arg: Option<&String>, default: &[usize]) -> anyhow::Result<Vec<usize>> {
    match arg {
        Some(a) => a.split(',').map(|v| Ok(v.parse::<usize>()?.max(1))).collect(),
        None => Ok(default.to_vec()),
    }
}

fn loadavg() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Raw costs on one core, in CPU time of this thread (other processes on a
/// loaded machine do not count), best of 5 interleaved rounds; redb commits
/// into a fresh file in `dir`.
fn raw_costs(sample: &[Vec<u8>], dir: &std::path::Path) -> anyhow::Result<()> {
    let decoded: Vec<Rollout> =
        sample.iter().map(|b| Rollout::decode(b, &RolloutLimits::DEFAULT)).collect::<Result<_, _>>()?;
    let digests: Vec<[u8; 32]> = decoded.iter().map(Rollout::digest).collect();
    let count = sample.len() as f64;
    let mut best = [f64::MAX; 5];
    for _ in 0..5 {
        let rounds: [&dyn Fn() -> anyhow::Result<()>; 5] = [
            &|| {
                for b in sample {
                    std::hint::black_box(door_check(b).map_err(|r| anyhow::anyhow!("{r:?}"))?);
                }
                Ok(())
            },
            &|| {
                for (r, d) in decoded.iter().zip(&digests) {
                    rollout::verify_digest(&r.miner, d, &r.signature)?;
                }
                Ok(())
            },
            &|| {
                for b in sample {
                    std::hint::black_box(Rollout::decode(b, &RolloutLimits::DEFAULT)?);
                }
                Ok(())
            },
            &|| {
                for r in &decoded {
                    std::hint::black_box(r.digest());
                }
                Ok(())
            },
            &|| {
                for r in &decoded {
                    std::hint::black_box(r.content_hash());
                }
                Ok(())
            },
        ];
        for (b, f) in best.iter_mut().zip(rounds) {
            let t = thread_cpu_ns();
            f()?;
            *b = b.min((thread_cpu_ns() - t) as f64 * 1e-3 / count);
        }
    }
    let [door, verify, decode, digest, content] = best;
    println!(
        "raw_us_per_rollout_one_core: door_check={door:.1} (= decode + schema + digest + ed25519 verify_strict + content hash) \
         ed25519_verify_strict={verify:.1} decode={decode:.1} digest(canonical bytes + blake3)={digest:.1} content_hash={content:.1}"
    );
    println!("raw_door_checks_per_sec_one_core={:.0}", 1e6 / door);
    let cands: Vec<_> = sample
        .iter()
        .map(|b| door_check(b).map(|(_, c)| c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|r| anyhow::anyhow!("{r:?}"))?;
    let stored: Vec<StoredRollout> =
        cands.iter().zip(sample).map(|(c, b)| StoredRollout { candidate: c.clone(), bytes: b.clone() }).collect();
    let store = Store::open(&dir.join("raw.redb"))?;
    let (ones, rest) = stored.split_at(100.min(stored.len()));
    let (t, c) = (Instant::now(), thread_cpu_ns());
    for r in ones {
        store.put_rollouts(std::slice::from_ref(r))?;
    }
    let n = ones.len().max(1) as f64;
    let (single_ms, single_cpu_us) = (t.elapsed().as_secs_f64() * 1e3 / n, (thread_cpu_ns() - c) as f64 * 1e-3 / n);
    for size in [64, 256] {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        for chunk in rest.chunks(size) {
            store.put_rollouts(chunk)?;
        }
        let n = rest.len().max(1) as f64;
        println!(
            "raw_redb_commit_{size}_per_txn: wall_us_per_rollout={:.1} cpu_us_per_rollout={:.1} (durable commits, {} bytes each)",
            t.elapsed().as_secs_f64() * 1e6 / n,
            (thread_cpu_ns() - c) as f64 * 1e-3 / n,
            sample[0].len()
        );
    }
    println!("raw_redb_single_rollout_commit: wall_ms={single_ms:.2} cpu_us={single_cpu_us:.0}");
    Ok(())
}

/// One run: `miners` connections each sending `per_miner` rollouts in frames of `batch`.
async fn run(
    miner_rt: &tokio::runtime::Runtime,
    miners: usize,
    per_miner: usize,
    batch: usize,
) -> anyhow::Result<WindowInfo> {
    let group_size = 16u32;
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 3_600_000;
    cfg.groups_per_miner = per_miner.div_ceil(group_size as usize) as u32;
    cfg.group_size = group_size;
    cfg.rollouts_per_sec = 1_000_000;
    cfg.kib_per_sec = 1 << 30;
    let n = node::start(&cfg, ContentId([1; 32])).await?;

    // Connect, sign every rollout and encode every frame up front (not timed).
    let mut sessions = Vec::new();
    let mut frames = Vec::new();
    let mut window = None;
    for m in 0..miners {
        let key = Keypair::from_seed([m as u8 + 1; 32]);
        let (quic, fp, k) = (n.quic, n.fingerprint.clone(), key.clone());
        let mut s = miner_rt.spawn(async move { Session::connect(quic, &fp, &k, Role::Miner).await }).await??;
        let Frame::WindowInfo(info) = s.request(&Frame::GetWindow(GetWindow { window: None })).await? else {
            anyhow::bail!("no window")
        };
        let encoded: Vec<Vec<u8>> =
            (0..per_miner as u32).map(|i| rollout(&info, &key, i / group_size, i % group_size).encode()).collect();
        window = Some(info);
        let mut wire = Vec::new();
        for (k, chunk) in encoded.chunks(batch).enumerate() {
            let seq = (k * batch) as u64;
            let f = if batch == 1 {
                Frame::Submit(Submit { seq, rollout: Blob(chunk[0].clone()) })
            } else {
                Frame::SubmitBatch(SubmitBatch { seq, rollouts: chunk.iter().cloned().map(Blob).collect() })
            };
            wire.push(f.encode());
        }
        sessions.push(s);
        frames.push(wire);
    }

    const GROUPS: [&str; 3] = ["coord", "redb-writer", "miner"];
    let cpu0 = threads_cpu_ns(&GROUPS);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (s, wire) in sessions.into_iter().zip(frames) {
        tasks.push(miner_rt.spawn(async move {
            let answers = wire.len();
            let (mut send, mut recv) = (s.send, s.recv);
            let reader = tokio::spawn(async move {
                let mut stored = 0usize;
                for _ in 0..answers {
                    match net::read_frame(&mut recv).await {
                        Ok(Some(Frame::Ack(_))) => stored += 1,
                        Ok(Some(Frame::BatchAnswer(b))) => {
                            for o in b.outcomes {
                                match o {
                                    Outcome::Stored(_) => stored += 1,
                                    Outcome::Refused(r) => anyhow::bail!("refused: {r:?}"),
                                }
                            }
                        }
                        Ok(Some(f)) => anyhow::bail!("unexpected {f:?}"),
                        Ok(None) => anyhow::bail!("closed"),
                        Err(e) => anyhow::bail!("{e}"),
                    }
                }
                Ok(stored)
            });
            let mut sent = Ok(());
            for f in &wire {
                sent = send.write_all(f).await;
                if sent.is_err() {
                    break;
                }
            }
            let stored = reader.await??;
            sent?;
            drop(s.conn);
            Ok::<_, anyhow::Error>(stored)
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu: Vec<f64> = threads_cpu_ns(&GROUPS)
        .iter()
        .zip(&cpu0)
        .map(|(b, a)| b.saturating_sub(*a) as f64 * 1e-3 / acked as f64)
        .collect();
    let (coord, writer, miner, other) = (cpu[0], cpu[1], cpu[2], cpu[3]);
    let stored = n.shared.store.rollout_count()?;
    anyhow::ensure!(stored == acked as u64, "{acked} acknowledged but {stored} stored");
    println!(
        "N={miners} batch={batch} rollouts={acked} seconds={secs:.2} rollouts_per_sec={:.0} | cpu_us_per_rollout: \
         coordinator={:.1} (runtime {coord:.1} + redb writer {writer:.1}) miners={miner:.1} other={other:.1} \
         -> 2 idle cores: ~{:.0}/s all in, ~{:.0}/s coordinator alone | loadavg {}",
        acked as f64 / secs,
        coord + writer,
        2e6 / (coord + writer + miner + other),
        2e6 / (coord + writer),
        loadavg()
    );
    n.server.endpoint.close(0u32.into(), b"bench done");
    window.ok_or_else(|| anyhow::anyhow!("no miners"))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let miners = list(args.first(), &[1, 4, 8, 16])?;
    let per_miner = args.get(1).map(|a| a.parse::<usize>()).transpose()?.unwrap_or(1000).max(1);
    let batches = list(args.get(2), &[1, 64])?;
    // The coordinator and the miners run on runtimes of their own (threads
    // named "coord" and "miner"), so their shares of the CPU can be told apart.
    let coord_rt = tokio::runtime::Builder::new_multi_thread().thread_name("coord").enable_all().build()?;
    let miner_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("miner").enable_all().build()?;
    println!(
        "ingest_bench: {} cores, per miner {per_miner} rollouts of 512 tokens, loadavg {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let mut info = None;
    for &m in &miners {
        for &b in &batches {
            info = Some(coord_rt.block_on(run(&miner_rt, m, per_miner, b))?);
        }
    }
    // The raw costs, on rollouts like those ingested (2,000 distinct ones).
    let info = info.ok_or_else(|| anyhow::anyhow!("nothing ran"))?;
    let key = Keypair::from_seed([99; 32]);
    let sample: Vec<Vec<u8>> = (0..2000u32).map(|i| rollout(&info, &key, i / 16, i % 16).encode()).collect();
    let dir = tempfile::tempdir()?;
    raw_costs(&sample, dir.path())?;
    println!("bytes_per_rollout={}", sample[0].len());
    miner_rt.shutdown_background();
    coord_rt.shutdown_background();
    Ok(())
}
