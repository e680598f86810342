//! Readers of closed windows go to the object store (issue 21): a
//! coordinator process archives each closed window to its store (a local
//! folder) and names the store's public URL; a real HTTP server serves that
//! folder. The validator service judges a closed window reading its
//! rollouts from the store. A validator's client (`tributary_net::Client` with the
//! `StoreSource`) asks the coordinator for a closed window's signed
//! manifest, downloads the segments of the miners it reads and gets exactly
//! the rollouts the coordinator serves; a tampered segment sends it back to
//! the coordinator. Then the coordinator is killed mid-window (`kill -9`)
//! and the client keeps reading the closed window's miners from the store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use edge_miner::run::RunEvent;
use edge_miner::uplink::UplinkConfig;
use tributary_net::store_read::StoreSource;
use tributary_net::{Client, ClientConfig, Session};
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::Role;
use tributary_tests::http::StaticServer;
use tributary_tests::{
    CoordinatorProcess, Miner, NetConfig, ValidatorHandle, coordinator_rollouts, miner_config, seeded_key, within,
};

fn client(quic: SocketAddr, fingerprint: &str, source: &StoreSource) -> Client {
    let key = tributary_protocol::dev::key(Role::Validator);
    let mut cfg = ClientConfig::new(quic, fingerprint, key, Role::Validator);
    cfg.request.attempts = 2;
    cfg.connect.attempts = 2;
    let mut c = Client::new(cfg);
    c.add_window_source(Box::new(source.clone()));
    c
}

/// The segments of `window` in the store folder.
fn segments(objects: &Path, window: u64) -> Vec<PathBuf> {
    let dir = objects.join(format!("windows/{window:020}"));
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "bin")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_read_closed_windows_from_the_store_and_keep_reading_when_the_coordinator_dies() {
    tributary_tests::test_tracing();
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let data = dir.path().join("coordinator");
    let objects = data.join("objects");
    let http_server = StaticServer::start(objects.clone()).await.unwrap();
    let (http, served) = (http_server.addr, http_server.counter());
    let url = format!("http://{http}/");
    let cfg = NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(3_000, 500, 2, 2) };
    let coord = CoordinatorProcess::spawn_with_env(
        exe,
        &data,
        &cfg,
        0,
        &[("MESH_ARCHIVE", "objects"), ("MESH_STORE_URL", url.as_str())],
    );
    let (quic, fingerprint) = (coord.quic, coord.fingerprint.clone());
    let genesis_bytes = coordinator::node::dev_tiny_bytes().expect("tiny model");

    // Two miners store rollouts in one window W.
    let mut miners: Vec<Miner> = ["m0", "m1"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let key = seeded_key(i as u64, name);
            let up = UplinkConfig::new(quic, fingerprint.clone());
            Miner::spawn(miner_config(dir.path(), up, name, key, Some(&genesis_bytes)))
        })
        .collect();
    let w = match miners[0].wait_for(120, |e| matches!(e, RunEvent::Submitted { stored, .. } if *stored > 0)).await {
        RunEvent::Submitted { window, .. } => window,
        _ => unreachable!(),
    };
    miners[1]
        .wait_for(120, |e| matches!(e, RunEvent::Submitted { window, stored, .. } if *window >= w && *stored > 0))
        .await;
    // W closes and is archived (segments, then its manifest) at its close:
    // the validator service, judging W right after its reveal, reads every
    // segment of W from the store (it fetches every miner).
    let w = w + 1;
    let before_validator = served.load(Ordering::SeqCst);
    let mut vcfg = validator::service::ServiceConfig::new(
        quic,
        fingerprint.clone(),
        tributary_protocol::dev::key(Role::Validator),
        dir.path().join("validator"),
    );
    vcfg.sample = validator::service::SampleConfig::ALL;
    vcfg.poll = Duration::from_millis(100);
    vcfg.start_window = Some(w);
    let mut validator = ValidatorHandle::spawn(vcfg);
    let manifest = objects.join(format!("windows/{w:020}/manifest.json"));
    within(120, async {
        while !manifest.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(!segments(&objects, w).is_empty(), "window {w} has no segments");

    let seg_bytes: u64 = segments(&objects, w).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    let report = validator.until(120, |r| r.window == w).await;
    assert!(report.fetched > 0, "the validator fetched nothing of window {w}");
    let by_validator = served.load(Ordering::SeqCst) - before_validator;
    assert!(by_validator >= seg_bytes, "the validator read {by_validator} bytes from the store, W has {seg_bytes}");
    validator.kill().await;

    // The coordinator's own answer, miner by miner, for comparison.
    let mut direct = within(
        30,
        Session::connect(quic, &fingerprint, &tributary_protocol::dev::key(Role::Validator), Role::Validator),
    )
    .await
    .expect("validator connects");
    let source = StoreSource::new();
    let mut c = client(quic, &fingerprint, &source);
    let index = within(30, c.window_index(w)).await.expect("window index");
    assert!(index.len() >= 2, "both miners stored in window {w}: {index:?}");
    let first = index[0].miner;
    let want = coordinator_rollouts(&mut direct, w, first).await;
    let got = within(30, c.miner_rollouts(w, &first)).await.expect("rollouts of the first miner");
    assert_eq!(got, want, "the store's rollouts are the coordinator's");
    let read = source.stats();
    assert!(read.segments >= 1 && read.bytes > 0, "nothing came from the store: {read:?}");
    assert!(served.load(Ordering::SeqCst) >= read.bytes);

    // A tampered segment: a fresh reader refuses it and gets the
    // coordinator's rollouts instead.
    let seg = segments(&objects, w)[0].clone();
    let original = std::fs::read(&seg).unwrap();
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&seg, &bad).unwrap();
    let fresh = StoreSource::new();
    let mut c2 = client(quic, &fingerprint, &fresh);
    let again = within(30, c2.miner_rollouts(w, &first)).await.expect("rollouts by the fallback");
    assert_eq!(again, want, "the fallback gives the coordinator's rollouts");
    assert_eq!(fresh.stats().segments, 0, "a tampered segment was accepted");
    std::fs::write(&seg, &original).unwrap();

    // Mid-window: kill the coordinator. The first client holds W's manifest
    // and reads every other miner of W from the store.
    assert!(source.holds(w));
    coord.kill9();
    let before = served.load(Ordering::SeqCst);
    let mut total = got.len();
    for m in &index[1..] {
        let rs = within(60, c.miner_rollouts(w, &m.miner)).await.expect("rollouts with the coordinator down");
        assert_eq!(rs.len() as u32, m.rollouts, "miner {}: every stored rollout", m.miner);
        assert_eq!(rs.iter().map(|r| r.len() as u64).sum::<u64>(), m.bytes, "miner {}: the stored bytes", m.miner);
        for r in &rs {
            let r = Rollout::decode(r, &RolloutLimits::DEFAULT).expect("a rollout decodes");
            assert_eq!(r.miner, m.miner.0);
            r.verify_signature().expect("the miner's signature");
            assert_eq!(r.window, w);
        }
        total += rs.len();
    }
    assert_eq!(total as u64, index.iter().map(|m| u64::from(m.rollouts)).sum::<u64>());
    assert!(served.load(Ordering::SeqCst) >= before, "the store served the reads after the kill");
    assert!(source.stats().segments >= 1);
    for m in miners {
        m.abort().await;
    }
}
