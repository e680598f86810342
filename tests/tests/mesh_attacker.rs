//! Issue #8 item 1 on the mesh factory: two honest miners and one attacker
//! (forged hidden-state sketches) mine against a coordinator while the real
//! validator service proves every rollout. The attacker's window fails on the
//! sketch check; the evidence is model-based, so a second validator (issue 16
//! item 2: a ban needs confirmation) proves the same windows; the coordinator
//! then bans it and gives it zero weight, its later submissions are refused
//! as banned, and the honest miners pass every check with full acceptance in
//! the same windows.

use edge_miner::adversary::{self, Attack, AttackOptions};
use edge_miner::run::RunEvent;
use tributary_protocol::wire::{MinerStanding, RejectReason};
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, ValidatorHandle, extra_validator_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_attacker_banned_zero_weight() {
    let work = tempfile::tempdir().expect("temporary folder");
    let opts = AttackOptions { work_dir: Some(work.path().to_path_buf()), threads: 1, ..Default::default() };
    let attack = adversary::setup(Attack::ForgedSketch, &opts).expect("attack setup");
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 16, extra_validators: 1, ..NetConfig::new(3_000, 500, 2, 2) },
        miners: vec![
            MinerSpec::honest("honest0"),
            MinerSpec::honest("honest1"),
            MinerSpec::boxed("attacker", attack.tamper, attack.loader),
        ],
        trainer: false,
        validator: true,
    })
    .await;
    let honest: Vec<_> = mesh.miners[..2].iter().map(|m| m.key.public()).collect();
    let a = mesh.miners[2].key.public();

    // The first window the attacker is judged in, with both honest miners in it.
    let r = mesh
        .validator()
        .until(120, |r| {
            r.miners.get(&a).is_some_and(|m| m.body.hard_failure) && honest.iter().all(|h| r.miners.contains_key(h))
        })
        .await;
    let w = r.window;
    assert!(!mesh.net.node.shared.core().is_banned(&a, w + 1), "banned on one validator's model evidence");
    // The second validator proves that window only (no extra load on the miners before or after).
    let mut second_cfg = extra_validator_config(&mesh.net, w, 0);
    second_cfg.sample = validator::service::SampleConfig::ALL;
    let mut second = ValidatorHandle::spawn(second_cfg);
    second.until(90, |r| r.window >= w).await;
    let _ = second.kill().await;
    let caught = &r.miners[&a];
    assert!(caught.failed("sketch"), "forged sketches fail the sketch check: {:?}", caught.failed);
    assert!(caught.body.reasons.iter().any(|x| x.contains("sketch")), "{:?}", caught.body.reasons);
    assert_eq!(caught.body.estimated_valid, 0);
    for h in &honest {
        let m = &r.miners[h];
        assert!(
            m.body.checked > 0 && m.body.valid == m.body.checked,
            "honest miner failed in window {w}: {:?}",
            m.body
        );
        assert!(!m.body.hard_failure && m.body.soft_failures == 0, "{:?}", m.body.reasons);
    }
    {
        let core = mesh.net.node.shared.core();
        assert!(core.is_banned(&a, w + 1), "attacker not banned after window {w}");
        assert!(core.standing(w).contains(&(a, MinerStanding::Failed)));
        let weights = core.weights(w, mesh.net.node.shared.key.public());
        assert!(
            weights.weights.iter().all(|(k, x)| *k != a || *x == 0.0),
            "attacker has weight: {:?}",
            weights.weights
        );
        let total: f64 = weights.weights.iter().map(|(_, x)| x).sum();
        assert!((total - 1.0).abs() < 1e-9, "{:?}", weights.weights);
        for h in &honest {
            assert!(
                weights.weights.iter().any(|(k, x)| k == h && *x > 0.0),
                "honest miner without weight: {:?}",
                weights.weights
            );
        }
    }
    // Banned: the attacker's next submissions are refused at the door.
    mesh.miners[2]
        .wait_for(60, |e| matches!(e, RunEvent::Submitted { refused, .. } if refused.contains(&RejectReason::Banned)))
        .await;
    // The honest miners kept full acceptance through all of it.
    for h in &honest {
        let acc = mesh.acceptance(h);
        assert_eq!(acc, 1.0, "honest acceptance {acc}: {:?}", mesh.stats(h).rejected);
        assert!(mesh.stats(h).accepted >= 8);
    }
    mesh.stop().await;
}
