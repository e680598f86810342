//! Checkpoints over HTTP from the object store (issue 21 item 2), end to end
//! on loopback with a real llama.cpp miner on the tiny model: the
//! coordinator writes every checkpoint and delta to its store (a local
//! folder) and names the store's public URL in paths; a real HTTP server
//! serves that folder. A miner downloads a full checkpoint and a delta from
//! it (the relay serves none of those bytes); when the HTTP side serves
//! tampered bytes, or is gone, the miner fetches from the QUIC relay and
//! still runs exactly the trainer's checkpoint.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use coordinator::node::{self, Config};
use edge_miner::run::RunEvent;
use edge_miner::sync::SyncEvent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta;
use tributary_protocol::wire::Frame;
use tributary_tests::{Miner, Net, NetConfig, id_of, perturbed, publish, trainer_session, within};

/// A static HTTP/1.1 server over a folder: `GET /KEY` answers the file's
/// bytes (200) or 404, then closes the connection. Counts the body bytes it
/// served; with `tamper` on, flips one byte of every body.
struct StoreServer {
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    tamper: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StoreServer {
    async fn start(root: PathBuf) -> StoreServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (served, tamper) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (s2, t2) = (served.clone(), tamper.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { return };
                tokio::spawn(answer(conn, root.clone(), s2.clone(), t2.clone()));
            }
        });
        StoreServer { addr, served, tamper, task }
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
}

async fn answer(mut conn: tokio::net::TcpStream, root: PathBuf, served: Arc<AtomicU64>, tamper: Arc<AtomicBool>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let key = head.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_owned();
    let file = (!key.contains("..")).then(|| root.join(&key));
    let body = match file {
        Some(f) => tokio::fs::read(&f).await.ok(),
        None => None,
    };
    let reply = match body {
        Some(mut b) => {
            if tamper.load(Ordering::SeqCst) && !b.is_empty() {
                let mid = b.len() / 2;
                b[mid] ^= 0x40;
            }
            served.fetch_add(b.len() as u64, Ordering::SeqCst);
            let mut r =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", b.len()).into_bytes();
            r.extend_from_slice(&b);
            r
        }
        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
    };
    let _ = conn.write_all(&reply).await;
    let _ = conn.shutdown().await;
}

/// A `--dev` network whose coordinator stores checkpoints in `objects/`
/// under its data folder and names `url` as the store's public URL.
async fn network(dir: tempfile::TempDir, url: &str) -> Net {
    let config = NetConfig::new(2_500, 500, 1, 2);
    let mut cfg = Config::dev(dir.path().join("coordinator"));
    cfg.window_ms = config.window_ms;
    cfg.grace_ms = config.grace_ms;
    cfg.groups_per_miner = config.groups_per_miner;
    cfg.group_size = config.group_size;
    cfg.max_new_tokens = config.max_new_tokens;
    cfg.archive = Some("objects".into());
    cfg.store_url = Some(url.into());
    let genesis = node::prepare_genesis(&cfg).unwrap();
    let genesis_bytes =
        std::fs::read(coordinator::relay::full_path(&node::relay_dir(&cfg.data_dir), &genesis)).unwrap();
    let node = within(30, node::start(&cfg, genesis)).await.unwrap();
    Net { node, genesis, genesis_bytes, config, dir }
}

/// Waits for the miner to stage `id`; returns (bytes, from_store, by_delta).
async fn staged(m: &mut Miner, id: ContentId) -> (u64, u64, bool) {
    let e = m.wait_for(60, |e| matches!(e, RunEvent::Sync(SyncEvent::Staged { id: s, .. }) if *s == id)).await;
    let RunEvent::Sync(SyncEvent::Staged { bytes, from_store, by_delta, .. }) = e else { unreachable!() };
    (bytes, from_store, by_delta)
}

/// Waits until the miner submits a group generated with `id`.
async fn generates_on(m: &mut Miner, id: ContentId) {
    m.wait_for(60, |e| matches!(e, RunEvent::Submitted { checkpoint, .. } if *checkpoint == id)).await;
}

fn slot_holding(models: &Path, id: ContentId) -> bool {
    (0..2).any(|s| edge_miner::sync::file_content_id(&models.join(format!("slot-{s}.gguf"))) == Some(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miner_follows_checkpoints_from_the_store_and_falls_back_to_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let server = StoreServer::start(dir.path().join("coordinator/objects")).await;
    let net = network(dir, &format!("http://{}/", server.addr)).await;
    let relay = net.node.shared.relay.clone();
    within(30, async {
        while !relay.is_stored(&net.genesis) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;

    // A miner without a model: the genesis file comes from the store, none of it from the relay.
    let cfg = net.miner("m0", false);
    let models = cfg.models_dir.clone();
    let mut m = Miner::spawn(cfg);
    let (bytes, from_store, by_delta) = staged(&mut m, net.genesis).await;
    assert_eq!((from_store, by_delta), (bytes, false));
    assert_eq!(bytes, net.genesis_bytes.len() as u64);
    assert_eq!(relay.bytes_served(), 0, "the relay served checkpoint bytes");
    assert!(server.served() >= bytes);
    generates_on(&mut m, net.genesis).await;

    // Three publications by delta: from the store; from the relay when the
    // store's bytes are tampered with; from the relay when the store is gone.
    let mut t = trainer_session(&net).await;
    let (mut prev, mut prev_id) = (net.genesis_bytes.clone(), net.genesis);
    for (k, case) in ["store", "tampered", "gone"].into_iter().enumerate() {
        match case {
            "tampered" => server.tamper.store(true, Ordering::SeqCst),
            "gone" => server.task.abort(),
            _ => {}
        }
        let next = perturbed(&prev, k as u32 + 1, 300);
        let id = id_of(&next);
        let d = delta::encode_gguf(&prev, &next, delta::DEFAULT_LEVEL).unwrap();
        let (relay_before, http_before) = (relay.bytes_served(), server.served());
        let ans = publish(&mut t, net.window(), id, Some(prev_id), &d).await.unwrap();
        assert!(matches!(ans, Frame::CheckpointStored(ref s) if s.id == id), "{ans:?}");
        let (bytes, from_store, by_delta) = staged(&mut m, id).await;
        assert!(by_delta, "{case}");
        assert_eq!(bytes, d.len() as u64, "{case}");
        let relayed = relay.bytes_served() - relay_before;
        match case {
            "store" => {
                assert_eq!((from_store, relayed), (bytes, 0), "{case}");
                assert_eq!(server.served() - http_before, bytes, "{case}");
            }
            "tampered" => {
                assert_eq!((from_store, relayed), (0, bytes), "{case}");
                assert!(server.served() - http_before >= bytes, "{case}: the miner did not try the store");
            }
            _ => assert_eq!((from_store, relayed), (0, bytes), "{case}"),
        }
        // Exactly the trainer's checkpoint, and generating on it.
        generates_on(&mut m, id).await;
        assert!(slot_holding(&models, id), "{case}");
        (prev, prev_id) = (next, id);
    }
    m.stop().await;
}
