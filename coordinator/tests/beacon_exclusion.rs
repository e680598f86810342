//! Review incentives-and-proof-2, finding H: a coordinator that
//! acknowledges a validator's commitment to a window's challenge and then
//! drops it mixes the challenge without that validator, and the reveal it
//! publishes still checks (the commitment is in neither list). Exclusion is
//! loud now: the validator's contribution task reads the public reveal of
//! every window it was acknowledged for, and lists (and logs at error) a
//! window that left it out without calling it withheld; `/api/validators`
//! shows the window as absent for that validator.
//!
//! A real coordinator over loopback QUIC; the drop is done to its core, as
//! a coordinator that records nothing of an acknowledged commitment would.

mod common;

use std::time::Duration;

use common::within;
use coordinator::http::validator_views;
use coordinator::node::{self, Config};
use tributary_net::KeyPin;
use tributary_net::beacon::{Contributor, ContributorConfig};
use tributary_protocol::beacon::{self, Inclusion};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::wire::Role;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_commitment_dropped_from_the_reveal_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::dev(dir.path().join("coord"));
    cfg.window_ms = 2_000;
    cfg.grace_ms = 300;
    let node = within(node::start(&cfg, ContentId([1; 32]))).await.unwrap();
    let sh = node.shared.clone();
    let key = tributary_protocol::dev::key(Role::Validator);
    let me = key.public();
    let contributor = Contributor::spawn(ContributorConfig {
        coordinator: node.quic,
        fingerprint: node.fingerprint.clone(),
        coordinator_key: KeyPin::Any,
        key,
        role: Role::Validator,
        poll: Duration::from_millis(50),
    });

    // A window ahead whose commitment the coordinator acknowledged ...
    let w = within(async {
        loop {
            let now = tributary_net::now_ms();
            let next = sh.core().current_window(now).unwrap_or(0) + 1;
            if contributor.acknowledged(next)
                && sh.core().beacon_book(next).is_some_and(|b| b.commits.contains_key(&me))
            {
                break next;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // ... and then dropped, as a coordinator that records nothing of it would.
    {
        let mut core = sh.core();
        let mut book = core.beacon_book(w).cloned().expect("the window's book");
        book.commits.remove(&me);
        core.restore_beacon(w, book);
    }

    // The public reveal of w still checks, and names the validator nowhere.
    let reveal = within(async {
        loop {
            if let Some(r) = sh.core().reveal_frame(w, tributary_net::now_ms()) {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let info = sh.core().window_info(w, tributary_net::now_ms()).expect("w has opened");
    beacon::check_reveal(&reveal, &sh.network(), &info.commitment).expect("the reveal itself holds");
    assert_eq!(beacon::inclusion(&reveal, &me), Inclusion::Absent);

    // The validator's task reports the exclusion ...
    within(async {
        while !contributor.excluded().contains(&w) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(contributor.excluded(), vec![w], "only the window whose commitment was dropped");
    // ... and the next window, committed and revealed normally, is mixed with it.
    let next = within(async {
        loop {
            if let Some(r) = sh.core().reveal_frame(w + 1, tributary_net::now_ms()) {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(beacon::inclusion(&next, &me), Inclusion::Contributed);

    // `/api/validators` shows w as absent for this validator, not w + 1.
    let views = validator_views(&sh, tributary_net::now_ms());
    let v = views.iter().find(|v| v.status.key == me.to_string()).expect("the dev validator is listed");
    assert!(v.beacon_absent.contains(&w), "{:?}", v.beacon_absent);
    assert!(!v.beacon_absent.contains(&(w + 1)), "{:?}", v.beacon_absent);
    let json = serde_json::to_value(v).unwrap();
    assert!(json.get("beacon_absent").is_some() && json.get("flagged").is_some(), "{json}");

    drop(contributor);
    node.shutdown().await;
}
