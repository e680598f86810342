//! Relay fairness bench (issue 29 item 2): an honest miner's checkpoint
//! download over loopback QUIC, unloaded and under the probe's load
//! (network-security review 2, finding 2: connections that ask for chunks
//! and never read), in one run, side by side.
//!
//! `relay_bench [MIB] [REPS] [HOGS]` (defaults 64 MiB, 5 reps, 64 unread
//! connections of 16 keys, each asking for 2 chunks). Each rep downloads the
//! whole payload chunk by chunk as a miner resumes, after one warm-up
//! download that is not counted; the figure is the true
//! median of the reps (MiB/s). The loaded column starts the hogs first and
//! keeps them connected through every rep. Prints one JSON line per rep
//! (`"arm"`, `"rep"`, `"mib_per_s"`, `"relay_inflight_kib"`) and a summary.
//! The relay's per-key rate (`relay_kib_per_sec`) is lifted so the link, not
//! the quota, is what is measured.

use std::time::{Duration, Instant};

use coordinator::net::Session;
use coordinator::node::{self, Config};
use coordinator::relay::CHUNK_LEN;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::Keypair;
use tributary_protocol::wire::{CheckpointChunk, Frame, GetCheckpoint, Role};

async fn download(s: &mut Session, id: ContentId, len: u64) -> u64 {
    let mut got = 0u64;
    while got < len {
        match s.request(&Frame::GetCheckpoint(GetCheckpoint { id, offset: got })).await.expect("a chunk") {
            Frame::CheckpointChunk(CheckpointChunk { data, .. }) if !data.0.is_empty() => got += data.0.len() as u64,
            f => panic!("unexpected answer {f:?}"),
        }
    }
    got
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(64);
    let reps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let hogs: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let dir = tempfile::tempdir().expect("temporary folder");
    let mut cfg = Config::dev(dir.path().to_path_buf());
    cfg.window_ms = 3_600_000;
    cfg.relay_kib_per_sec = u32::MAX;
    cfg.connections_per_sec = 100_000;
    cfg.max_connections_per_address = 100_000;
    let node = node::start(&cfg, ContentId([1; 32])).await.expect("coordinator");
    let id = ContentId([9; 32]);
    let len = mib << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    node.shared.relay.insert_unannounced(id, 5, &data).expect("the payload");
    let (quic, pin) = (node.quic, node.fingerprint.clone());
    let connect = |seed: u8| {
        let pin = pin.clone();
        async move { Session::connect(quic, &pin, &Keypair::from_seed([seed; 32]), Role::Miner).await }
    };
    let mut honest = connect(200).await.expect("honest miner");
    // One warm-up download (page cache, connection windows), not counted.
    download(&mut honest, id, len).await;
    let mut figures = Vec::new();
    let mut hold = Vec::new();
    for arm in ["unloaded", "loaded"] {
        if arm == "loaded" {
            for h in 0..hogs {
                let mut s = connect(10 + (h % 16) as u8).await.expect("a hog");
                for c in 0..2u64 {
                    let offset = (c * CHUNK_LEN as u64) % len;
                    s.send(&Frame::GetCheckpoint(GetCheckpoint { id, offset })).await.expect("a hog's request");
                }
                hold.push(s);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut rates = Vec::new();
        for rep in 0..reps {
            let t = Instant::now();
            let got = download(&mut honest, id, len).await;
            let secs = t.elapsed().as_secs_f64();
            let rate = got as f64 / (1 << 20) as f64 / secs;
            println!(
                "{{\"arm\":\"{arm}\",\"rep\":{rep},\"mib\":{mib},\"hogs\":{},\"mib_per_s\":{rate:.2},\"relay_inflight_kib\":{}}}",
                if arm == "loaded" { hogs } else { 0 },
                node.shared.relay_inflight_kib()
            );
            rates.push(rate);
        }
        figures.push((arm, median(rates)));
    }
    let (u, l) = (figures[0].1, figures[1].1);
    println!(
        "relay: honest download of {mib} MiB, median of {reps}: unloaded {u:.1} MiB/s | under {hogs} unread connections \
         ({} keys) {l:.1} MiB/s | ratio {:.2} (goal >= 0.50)",
        hogs.min(16),
        l / u
    );
    drop(hold);
}
