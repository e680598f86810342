//! Checkpoints over HTTP from the object store (issue 21 item 2), end to end
//! on loopback with a real llama.cpp miner on the tiny model: the
//! coordinator writes every checkpoint and delta to its store (a local
//! folder) and names the store's public URL in paths; a real HTTP server
//! serves that folder. A miner downloads a full checkpoint and a delta from
//! it (the relay serves none of those bytes); when the HTTP side serves
//! tampered bytes, or is gone, the miner fetches from the QUIC relay and
//! still runs exactly the trainer's checkpoint.

use std::path::Path;
use std::sync::atomic::Ordering;

use coordinator::node::{self, Config};
use edge_miner::run::RunEvent;
use edge_miner::sync::SyncEvent;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::delta;
use tributary_protocol::wire::Frame;
use tributary_tests::http::StaticServer;
use tributary_tests::{Miner, Net, NetConfig, id_of, perturbed, publish, trainer_session, within};

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
    let server = StaticServer::start(dir.path().join("coordinator/objects")).await.unwrap();
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
            "gone" => server.stop(),
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
