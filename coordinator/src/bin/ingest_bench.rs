//! Ingestion bench: signed 512-token rollouts from N concurrent miner
//! connections over loopback QUIC, with the raw cost of signature checks and
//! redb commits measured in the same run.
//!
//! `cargo run -p coordinator --bin ingest_bench -- [MINERS] [PER_MINER]`

use std::sync::Arc;
use std::time::Instant;

use coordinator::net::{self, Session};
use coordinator::node::{self, Config};
use coordinator::server::door_check;
use coordinator::store::{Store, StoredRollout};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::task_seed;
use tributary_protocol::identity::{self, Keypair, PublicKey};
use tributary_protocol::rollout::{self, Rollout, RolloutLimits, SamplingParams};
use tributary_protocol::wire::{Blob, Frame, GetWindow, Role, Submit, WindowInfo};

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

/// CPU time of the whole process (user + system, ns), from `/proc/self/stat`.
fn process_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the parenthesised command name come fields 3.. (state first);
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(14) + field(15);
    ticks * 10_000_000 // USER_HZ = 100 on Linux
}

/// CPU time (ns) of this process's threads whose name starts with `prefix`,
/// from `/proc/self/task/*/stat` (threads that already ended are not counted).
fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0 };
    let mut ticks = 0;
    for e in dir.flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.split_once('(').is_some_and(|(_, name)| name.starts_with(prefix)) {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        ticks += field(14) + field(15);
    }
    ticks * 10_000_000
}

/// CPU time of the calling thread (ns), from `/proc/thread-self/schedstat`.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let miners = args.first().copied().unwrap_or(8);
    let per_miner = args.get(1).copied().unwrap_or(2_000);
    let group_size = 16u32;
    let groups = per_miner.div_ceil(group_size as usize) as u32;

    let dir = tempfile::tempdir()?;
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 3_600_000;
    cfg.groups_per_miner = groups;
    cfg.group_size = group_size;
    cfg.rollouts_per_sec = 1_000_000;
    cfg.kib_per_sec = 1 << 30;
    let n = node::start(&cfg, ContentId([1; 32])).await?;

    // The miners run on their own runtime (threads named "miner"), so the
    // coordinator's share of the CPU can be told apart.
    let miner_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("miner")
        .enable_all()
        .build()?;

    // Prepare every miner's signed rollouts up front (not timed).
    let mut sessions = Vec::new();
    let mut batches = Vec::new();
    for m in 0..miners {
        let key = Keypair::from_seed([m as u8 + 1; 32]);
        let (quic, fp, k) = (n.quic, n.fingerprint.clone(), key.clone());
        let mut s = miner_rt.spawn(async move { Session::connect(quic, &fp, &k, Role::Miner).await }).await??;
        let Frame::WindowInfo(info) = s.request(&Frame::GetWindow(GetWindow { window: None })).await? else {
            anyhow::bail!("no window")
        };
        let encoded: Vec<Vec<u8>> = (0..per_miner as u32)
            .map(|i| rollout(&info, &key, i / group_size, i % group_size).encode())
            .collect();
        sessions.push(s);
        batches.push(encoded);
    }
    let bytes_each = batches[0][0].len();

    // Raw costs, same process, same data, one core, in CPU time of this
    // thread (other processes on a loaded machine do not count). Each figure
    // is the best of 5 rounds, the rounds of all figures interleaved.
    let sample: Vec<&Vec<u8>> = batches.iter().flatten().take(2_000).collect();
    let cands: Vec<_> = sample
        .iter()
        .map(|b| door_check(b).map(|(_, c)| c))
        .collect::<Result<_, _>>()
        .map_err(|r| anyhow::anyhow!("{r:?}"))?;
    let decoded: Vec<Rollout> =
        sample.iter().map(|b| Rollout::decode(b, &RolloutLimits::DEFAULT)).collect::<Result<_, _>>()?;
    let signed: Vec<Vec<u8>> = decoded.iter().map(Rollout::signing_bytes).collect();
    // The door check as it was before rollouts signed their digest: the
    // ed25519 message was the ~4.7 KB canonical bytes (SHA-512 over all of
    // them) and the miner key was decompressed for every rollout.
    let v0_keys: Vec<Keypair> = (0..miners).map(|m| Keypair::from_seed([m as u8 + 1; 32])).collect();
    let mut v0_sigs = Vec::with_capacity(sample.len());
    for (r, s) in decoded.iter().zip(&signed) {
        let k = v0_keys.iter().find(|k| k.public().0 == r.miner).ok_or_else(|| anyhow::anyhow!("no bench key"))?;
        v0_sigs.push(k.sign(identity::domain::ROLLOUT, s).0);
    }
    let count = sample.len() as f64;
    let mut best = [0f64; 6];
    for _ in 0..5 {
        let rounds: [&dyn Fn() -> anyhow::Result<()>; 6] = [
            &|| {
                for b in &sample {
                    std::hint::black_box(door_check(b).map_err(|r| anyhow::anyhow!("{r:?}"))?);
                }
                Ok(())
            },
            &|| {
                for (b, sig) in sample.iter().zip(&v0_sigs) {
                    let r = Rollout::decode(b, &RolloutLimits::DEFAULT)?;
                    let signed = r.signing_bytes();
                    PublicKey(r.miner).verify(identity::domain::ROLLOUT, &signed, &identity::Signature(*sig))?;
                    let digest = *blake3::hash(&signed).as_bytes();
                    std::hint::black_box((digest, coordinator::server::content_hash(&r)));
                }
                Ok(())
            },
            &|| {
                for b in &sample {
                    std::hint::black_box(Rollout::decode(b, &RolloutLimits::DEFAULT)?);
                }
                Ok(())
            },
            &|| {
                for r in &decoded {
                    std::hint::black_box(r.signing_bytes());
                }
                Ok(())
            },
            &|| {
                for r in &decoded {
                    let d = *blake3::hash(&r.signing_bytes()).as_bytes();
                    rollout::verify_digest(&r.miner, &d, &r.signature)?;
                }
                Ok(())
            },
            &|| {
                for s in &signed {
                    std::hint::black_box(blake3::hash(s));
                }
                Ok(())
            },
        ];
        for (b, f) in best.iter_mut().zip(rounds) {
            let t = thread_cpu_ns();
            f()?;
            *b = b.max(count / ((thread_cpu_ns() - t) as f64 * 1e-9));
        }
    }
    let [door_per_sec, door_v0_per_sec, decode_per_sec, encode_per_sec, verify_per_sec, blake3_per_sec] = best;
    let store = Store::open(&dir.path().join("raw.redb"))?;
    let stored: Vec<StoredRollout> = cands.iter().zip(&sample).map(|(c, b)| StoredRollout { candidate: c.clone(), bytes: (*b).clone() }).collect();
    let t = Instant::now();
    for r in stored.iter().take(100) {
        store.put_rollouts(std::slice::from_ref(r))?;
    }
    let single_commit_ms = t.elapsed().as_secs_f64() * 1000.0 / 100.0;
    let t = Instant::now();
    for chunk in stored[100..].chunks(256) {
        store.put_rollouts(chunk)?;
    }
    let batched_per_sec = (stored.len() - 100) as f64 / t.elapsed().as_secs_f64();

    // The ingest run.
    let cpu0 = process_cpu_ns();
    let miner_cpu0 = threads_cpu_ns("miner");
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (mut s, batch) in sessions.into_iter().zip(batches) {
        tasks.push(miner_rt.spawn(async move {
            let total = batch.len();
            let mut recv = s.recv;
            let reader = tokio::spawn(async move {
                let mut acks = 0usize;
                for _ in 0..total {
                    match net::read_frame(&mut recv).await {
                        Ok(Some(Frame::Ack(_))) => acks += 1,
                        Ok(Some(f)) => anyhow::bail!("unexpected {f:?}"),
                        Ok(None) => anyhow::bail!("closed"),
                        Err(e) => anyhow::bail!("{e}"),
                    }
                }
                Ok(acks)
            });
            let mut sent = Ok(());
            for (seq, b) in batch.into_iter().enumerate() {
                sent = net::write_frame(&mut s.send, &Frame::Submit(Submit { seq: seq as u64, rollout: Blob(b) })).await;
                if sent.is_err() {
                    break;
                }
            }
            let acks = reader.await??;
            sent?;
            Ok::<_, anyhow::Error>(acks)
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_secs = (process_cpu_ns() - cpu0) as f64 * 1e-9;
    let miner_cpu_secs = threads_cpu_ns("miner").saturating_sub(miner_cpu0) as f64 * 1e-9;
    let coord_cpu_secs = cpu_secs - miner_cpu_secs;
    let shared = Arc::clone(&n.shared);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("miners={miners} rollouts={acked} bytes_each={bytes_each} seconds={secs:.2} loadavg={}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!("ingest_rollouts_per_sec={:.0}", acked as f64 / secs);
    println!(
        "ingest_cpu_seconds={cpu_secs:.2} (miners and coordinator together) -> rollouts_per_cpu_second={:.0}, \
         on 2 otherwise idle cores ~{:.0}/s",
        acked as f64 / cpu_secs,
        2.0 * acked as f64 / cpu_secs
    );
    println!(
        "coordinator_cpu_us_per_rollout={:.1} miners_cpu_us_per_rollout={:.1} -> coordinator alone on 2 idle cores ~{:.0}/s",
        coord_cpu_secs * 1e6 / acked as f64,
        miner_cpu_secs * 1e6 / acked as f64,
        2.0 * acked as f64 / coord_cpu_secs
    );
    println!("raw_door_checks_per_sec_one_core={door_per_sec:.0} (decode + schema + ed25519 verify + digest)");
    println!(
        "raw_door_checks_per_sec_one_core_before={door_v0_per_sec:.0} (signature over the canonical bytes, key decompressed per rollout)"
    );
    println!(
        "raw_parts_per_sec_one_core: decode={decode_per_sec:.0} canonical_bytes={encode_per_sec:.0} \
         digest+verify={verify_per_sec:.0} blake3_of_canonical_bytes={blake3_per_sec:.0}"
    );
    println!("raw_redb_single_commit_ms={single_commit_ms:.2}");
    println!("raw_redb_batched_rollouts_per_sec={batched_per_sec:.0} (256 per durable commit)");
    println!("stored={}", shared.store.rollout_count()?);
    miner_rt.shutdown_background();
    Ok(())
}
