//! A stop signal to the validator service after its coordinator died:
//! `Service::run` returns within `STOP_GRACE` instead of waiting forever for
//! the window in progress, whose requests retry the unreachable coordinator
//! without end. Found in a `train-bench.sh` probe (2026-12-04): each arm's
//! demo stopped its coordinator, then sent the validator SIGTERM, and three
//! validators were still retrying seven minutes later, holding the bench.

use std::path::Path;
use std::time::{Duration, Instant};

use tributary_net::shutdown::CancellationToken;
use tributary_protocol::wire::Role;
use tributary_tests::{CoordinatorProcess, NetConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_validator_ends_within_its_grace_when_the_coordinator_is_gone() {
    tributary_tests::test_tracing();
    let exe = Path::new(env!("CARGO_BIN_EXE_mesh-coordinator"));
    let dir = tempfile::tempdir().expect("temporary folder");
    let cfg = NetConfig::new(3_000, 600, 1, 2);
    let coordinator = CoordinatorProcess::spawn(exe, &dir.path().join("coordinator"), &cfg, 0);
    let mut vcfg = validator::service::ServiceConfig::new(
        coordinator.quic,
        coordinator.fingerprint.clone(),
        tributary_protocol::dev::key(Role::Validator),
        dir.path().join("validator"),
    );
    vcfg.poll = Duration::from_millis(100);
    // The service holds libtorch tensors (not Send): it runs on this task,
    // beside the control steps.
    let mut service = validator::service::Service::open(vcfg).await.expect("validator service");
    let stop = CancellationToken::new();
    let stopped_at = std::cell::Cell::new(None);
    let control = async {
        // Serving: polling the live coordinator.
        tokio::time::sleep(Duration::from_secs(3)).await;
        coordinator.kill9();
        // Its next pass is now retrying the dead coordinator.
        tokio::time::sleep(Duration::from_secs(3)).await;
        stopped_at.set(Some(Instant::now()));
        stop.cancel();
    };
    let bound = validator::service::STOP_GRACE + Duration::from_secs(10);
    let (result, ()) = tokio::time::timeout(Duration::from_secs(6) + bound, async {
        tokio::join!(service.run(stop.clone(), |_| {}), control)
    })
    .await
    .unwrap_or_else(|_| panic!("the validator did not stop within {bound:?} of the signal"));
    let took = stopped_at.get().expect("the stop was sent").elapsed();
    eprintln!("stop to end: {took:?}");
    result.expect("run returns Ok when stopped");
    assert!(took <= bound, "the validator took {took:?} to stop");
}
