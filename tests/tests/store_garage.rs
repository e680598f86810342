//! A window cycle with the object store on a real S3 server (issue 21 item
//! 3): a single-node Garage (`scripts/garage.sh`) holds the coordinator's
//! `s3://` archive. Two miners submit, the trainer trains on the closed
//! window and publishes, the miners generate on the new checkpoint; the
//! closed window is archived to Garage and a validator's client reads it
//! from Garage through presigned URLs (the bucket is private), getting
//! exactly the coordinator's rollouts; then the coordinator is killed
//! mid-window and the client reads the window's other miners from Garage.
//!
//! Built only with `--features garage` (the coordinator's `s3` feature);
//! `scripts/test.sh` runs it when a garage binary is installed
//! (`TRIBUTARY_GARAGE=1 scripts/setup.sh`). Without one it fails, saying so.

use std::path::Path;
use std::time::Duration;

use edge_miner::run::RunEvent;
use edge_miner::uplink::UplinkConfig;
use tributary_net::store_read::StoreSource;
use tributary_net::{Client, ClientConfig, Session};
use tributary_protocol::env::PRACTICE_LEVEL;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::{Frame, GetWindowManifest, Role};
use tributary_tests::garage::Garage;
use tributary_tests::{
    CoordinatorProcess, Miner, NetConfig, TrainerHandle, coordinator_rollouts, miner_config, seeded_key,
    trainer_config, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_cycle_with_the_archive_on_garage() {
    tributary_tests::test_tracing();
    let garage = Garage::start().unwrap_or_else(|e| panic!("this test needs garage: {e}"));
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let data = dir.path().join("coordinator");
    let archive = format!("s3://{}/net", garage.bucket);
    let mut env: Vec<(&str, &str)> = garage.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.push(("MESH_ARCHIVE", &archive));
    let cfg = NetConfig { max_new_tokens: 16, difficulty: PRACTICE_LEVEL, ..NetConfig::new(4_000, 600, 2, 4) };
    let coord = CoordinatorProcess::spawn_with_env(exe, &data, &cfg, 0, &env);
    let (quic, fingerprint, genesis) = (coord.quic, coord.fingerprint.clone(), coord.genesis);
    let genesis_bytes = coordinator::node::dev_tiny_bytes().expect("tiny model");

    let mut miners: Vec<Miner> = ["m0", "m1"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let up = UplinkConfig::new(quic, fingerprint.clone());
            Miner::spawn(miner_config(dir.path(), up, name, seeded_key(i as u64, name), Some(&genesis_bytes)))
        })
        .collect();
    let mut trainer =
        TrainerHandle::spawn(trainer_config(quic, &fingerprint, &dir.path().join("trainer"), &genesis_bytes));
    // Submit, train, publish, follow: a miner generates on the trained checkpoint.
    let (trained, _, published) = trainer.next_published(180).await;
    assert_ne!(published, genesis);
    miners[0].wait_for(180, |e| matches!(e, RunEvent::Submitted { checkpoint, .. } if *checkpoint != genesis)).await;

    // The first window trained on is archived in Garage: the coordinator
    // hands out its signed manifest with presigned Garage URLs.
    let w = *trained.first().expect("a trained window");
    let key = tributary_protocol::dev::key(Role::Validator);
    let mut direct = within(30, Session::connect(quic, &fingerprint, &key, Role::Validator)).await.expect("connects");
    let answer = within(60, async {
        loop {
            match direct.request(&Frame::GetWindowManifest(GetWindowManifest { window: w })).await.expect("manifest") {
                Frame::WindowManifest(a) if a.manifest.is_some() => return a,
                Frame::WindowManifest(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                f => panic!("{f:?}"),
            }
        }
    })
    .await;
    let endpoint = garage.var("AWS_ENDPOINT");
    assert!(answer.expires_ms > 0, "S3 URLs are presigned and expire");
    assert!(answer.urls.iter().all(|u| u.starts_with(endpoint) && u.contains("X-Amz-Signature=")), "{:?}", answer.urls);
    // Without the signature the private bucket refuses: the URL is what grants access.
    let unsigned = answer.urls[0].split('?').next().unwrap().to_owned();
    let status = http_status(&unsigned).await;
    assert_ne!(status, 200, "the bucket is private");

    let source = StoreSource::new();
    let mut ccfg = ClientConfig::new(quic, fingerprint.clone(), key.clone(), Role::Validator);
    ccfg.request.attempts = 2;
    ccfg.connect.attempts = 2;
    let mut c = Client::new(ccfg);
    c.add_window_source(Box::new(source.clone()));
    let index = within(30, c.window_index(w)).await.expect("window index");
    assert!(!index.is_empty());
    let first = index[0].miner;
    let want = coordinator_rollouts(&mut direct, w, first).await;
    let got = within(60, c.miner_rollouts(w, &first)).await.expect("rollouts from Garage");
    assert_eq!(got, want, "Garage's rollouts are the coordinator's");
    assert!(source.stats().segments >= 1, "nothing came from Garage: {:?}", source.stats());

    // Mid-window: the coordinator dies; the window's miners are read from Garage.
    coord.kill9();
    for m in &index {
        let rs = within(60, c.miner_rollouts(w, &m.miner)).await.expect("rollouts with the coordinator down");
        assert_eq!(rs.len() as u32, m.rollouts, "miner {}", m.miner);
        for r in &rs {
            let r = Rollout::decode(r, &RolloutLimits::DEFAULT).expect("decodes");
            r.verify_signature().expect("the miner's signature");
            assert_eq!((r.miner, r.window), (m.miner.0, w));
        }
    }
    drop(trainer);
    for m in miners {
        m.abort().await;
    }
}

/// The status line's code of a plain `GET` of an `http://HOST:PORT/PATH` URL.
async fn http_status(url: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connects");
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut head = vec![0u8; 64];
    let n = s.read(&mut head).await.expect("answer");
    let line = String::from_utf8_lossy(&head[..n]).to_string();
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}
