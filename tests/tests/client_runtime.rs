//! Issue 19 item 4 on a loopback coordinator: the client roles' shared
//! runtime (`tributary_net::Client`). A relay download resumes a partial
//! file and fetches only the rest, refuses a partial file whose bytes are
//! not the payload's (the hash, and the file goes), and refuses an offset
//! that is not the file's length; a paged list comes back whole, in order,
//! across many small pages.

use std::collections::BTreeSet;

use tributary_net::{Client, ClientConfig, DownloadError};
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::wire::{Frame, GetCheckpointPath, GetStanding, Role, Verdict, VerdictBody};
use tributary_tests::{Net, within};

fn validator_client(net: &Net) -> Client {
    let key = tributary_protocol::dev::key(Role::Validator);
    Client::new(ClientConfig::new(net.node.quic, net.node.fingerprint.clone(), key, Role::Validator))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_download_resumes_and_checks_the_payload() {
    let net = Net::start(60_000, 500, 1, 2).await;
    let mut client = validator_client(&net);
    let ask = Frame::GetCheckpointPath(GetCheckpointPath { have: None, want: Some(net.genesis) });
    let step = match within(30, client.request(&ask)).await.expect("checkpoint path") {
        Frame::CheckpointPath(p) => p.steps.into_iter().next().expect("a full file"),
        f => panic!("expected a path, got {f:?}"),
    };
    assert_eq!(step.len as usize, net.genesis_bytes.len());
    let dir = tempfile::tempdir().expect("temporary folder");
    let part = dir.path().join("genesis.part");
    let cut = net.genesis_bytes.len() / 3;

    // A download cut off after its first third: only the rest is fetched.
    std::fs::write(&part, &net.genesis_bytes[..cut]).expect("partial file");
    let mut held = Vec::new();
    let fetched = within(60, client.download(&step, &part, cut as u64, |n| held.push(n))).await.expect("download");
    assert_eq!(fetched, step.len - cut as u64);
    assert!(held.first().is_some_and(|&n| n > cut as u64), "{held:?}");
    assert_eq!(held.last(), Some(&step.len));
    assert!(std::fs::read(&part).expect("downloaded file") == net.genesis_bytes, "the file is the payload");

    // A partial file whose bytes are not the payload's: the whole fails its hash and is removed.
    let mut bad = net.genesis_bytes[..cut].to_vec();
    bad[cut / 2] ^= 1;
    std::fs::write(&part, &bad).expect("partial file");
    match within(60, client.download(&step, &part, cut as u64, |_| {})).await {
        Err(DownloadError::Payload { why, .. }) => assert!(why.contains("hash"), "{why}"),
        r => panic!("expected a hash mismatch, got {r:?}"),
    }
    assert!(!part.exists(), "a payload that fails its hash is removed");

    // An offset that is not the partial file's length: refused before any request.
    std::fs::write(&part, &net.genesis_bytes[..cut]).expect("partial file");
    let r = within(60, client.download(&step, &part, cut as u64 + 1, |_| {})).await;
    assert!(matches!(r, Err(DownloadError::Payload { .. })), "{r:?}");

    // From nothing.
    let fetched = within(60, client.download(&step, &part, 0, |_| {})).await.expect("download");
    assert_eq!(fetched, step.len);
    assert!(std::fs::read(&part).expect("downloaded file") == net.genesis_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_list_comes_back_whole_across_small_pages() {
    let net = Net::start(1_500, 200, 1, 2).await;
    let mut client = validator_client(&net);
    let key = tributary_protocol::dev::key(Role::Validator);
    let schedule = within(30, client.welcome()).await.expect("connected").schedule;
    let wait = schedule.closes_at(0).saturating_sub(coordinator::server::now_ms()) + 20;
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    // Verdicts on twenty miners of window 0: its standing lists them all.
    let miners: BTreeSet<PublicKey> = (0..20u8).map(|i| Keypair::from_seed([60 + i; 32]).public()).collect();
    let network = within(30, client.network()).await.expect("network");
    for m in &miners {
        let body = VerdictBody { checked: 4, valid: 4, estimated_valid: 4, ..VerdictBody::empty(0, *m, key.public()) };
        let answer = within(30, client.request(&Frame::PostVerdict(Verdict::sign(body, &key, &network)))).await;
        assert!(matches!(answer, Ok(Frame::VerdictAck(_))), "{answer:?}");
    }
    net.node.shared.set_list_answer_bytes(100);
    let mut pages = 0;
    let mut got = Vec::new();
    let req = GetStanding { window: 0, after: None };
    within(
        30,
        client.pages(&req, |page| {
            pages += 1;
            got.extend(page);
        }),
    )
    .await
    .expect("standing");
    assert!(pages >= 5, "{pages} pages");
    let mut want = net.node.shared.core().standing(0);
    want.sort_unstable_by_key(|(m, _)| *m);
    assert_eq!(got, want);
    assert_eq!(got.iter().map(|(m, _)| *m).collect::<BTreeSet<_>>(), miners);
    assert_eq!(within(30, client.paged(&req)).await.expect("standing"), want, "paged = every page");
}
