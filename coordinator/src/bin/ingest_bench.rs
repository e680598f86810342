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
use tributary_protocol::identity::Keypair;
use tributary_protocol::rollout::{Rollout, SamplingParams};
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

    // Prepare every miner's signed rollouts up front (not timed).
    let mut sessions = Vec::new();
    let mut batches = Vec::new();
    for m in 0..miners {
        let key = Keypair::from_seed([m as u8 + 1; 32]);
        let mut s = Session::connect(n.quic, &n.fingerprint, &key, Role::Miner).await?;
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

    // Raw costs, same process, same data.
    let sample: Vec<&Vec<u8>> = batches.iter().flatten().take(2_000).collect();
    let t = Instant::now();
    let cands: Vec<_> = sample.iter().map(|b| door_check(b).map(|(_, c)| c)).collect::<Result<_, _>>().map_err(|r| anyhow::anyhow!("{r:?}"))?;
    let door_per_sec = sample.len() as f64 / t.elapsed().as_secs_f64();
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
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (mut s, batch) in sessions.into_iter().zip(batches) {
        tasks.push(tokio::spawn(async move {
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
    let shared = Arc::clone(&n.shared);
    println!("miners={miners} rollouts={acked} bytes_each={bytes_each} seconds={secs:.2}");
    println!("ingest_rollouts_per_sec={:.0}", acked as f64 / secs);
    println!("raw_door_checks_per_sec_one_core={door_per_sec:.0} (decode + schema + ed25519 verify + digest)");
    println!("raw_redb_single_commit_ms={single_commit_ms:.2}");
    println!("raw_redb_batched_rollouts_per_sec={batched_per_sec:.0} (256 per durable commit)");
    println!("stored={}", shared.store.rollout_count()?);
    Ok(())
}
