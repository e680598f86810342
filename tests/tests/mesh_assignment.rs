//! Issue 16 item 1 on the mesh factory: two validators, each proving only
//! what the window's assignment (`protocol::assign`, from the reveal) gives
//! it, with committees of one. In a window where four honest miners stored
//! rollouts, the two validators judge different miners, together every miner
//! that stored a rollout, each exactly the coordinator's recomputed
//! assignment, and every miner passes.

use std::collections::{BTreeMap, BTreeSet};

use tributary_protocol::identity::PublicKey;
use tributary_tests::{Mesh, MeshConfig};
use validator::service::WindowReport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_validators_split_the_miners_and_cover_them_all() {
    let mesh = Mesh::start(MeshConfig::committees_of_one(&["a", "b", "c", "d"], false)).await;
    let mut validators = mesh.assigned_validators();
    let keys: Vec<PublicKey> = validators.iter().map(|v| v.config.key.public()).collect();
    let miners: BTreeSet<PublicKey> = mesh.miners.iter().map(|m| m.key.public()).collect();
    let mut seen: [BTreeMap<u64, WindowReport>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let window = 'found: loop {
        for (i, v) in validators.iter_mut().enumerate() {
            let r = v.next_report(180).await;
            seen[i].insert(r.window, r);
        }
        let core = mesh.net.node.shared.core();
        for (w, a) in &seen[0] {
            let Some(b) = seen[1].get(w) else { continue };
            let stored: BTreeSet<PublicKey> =
                miners.iter().filter(|m| core.submitted(*w, m).is_some()).copied().collect();
            if stored.len() < miners.len() {
                continue;
            }
            let judged_a: BTreeSet<PublicKey> = a.miners.keys().copied().collect();
            let judged_b: BTreeSet<PublicKey> = b.miners.keys().copied().collect();
            eprintln!("window {w}: validator A judged {}, B {} of {}", judged_a.len(), judged_b.len(), stored.len());
            assert!(!judged_a.is_empty() && !judged_b.is_empty(), "both validators have a share");
            assert!(judged_a.is_disjoint(&judged_b), "committees of one: the two shares differ");
            assert_eq!(&judged_a | &judged_b, stored, "together they judge every miner that stored a rollout");
            assert_eq!((a.assigned, b.assigned), (judged_a.len(), judged_b.len()), "all of it assigned, no extras");
            // The coordinator recomputes the same assignment from the reveal.
            let now = tributary_net::now_ms();
            let assignment = core.assignment(*w, now).expect("revealed");
            for (k, judged) in keys.iter().zip([&judged_a, &judged_b]) {
                let want: BTreeSet<PublicKey> = assignment.of_validator(k).map(|(m, _)| *m).collect();
                assert_eq!(&want, judged, "validator {} proved its assignment", k.short());
            }
            for r in [a, b] {
                for m in r.miners.values() {
                    assert!(m.body.checked > 0 && !m.body.hard_failure, "{:?}", m.body);
                }
            }
            break 'found *w;
        }
    };
    eprintln!("checked window {window}");
    for v in validators {
        v.kill().await;
    }
    mesh.stop().await;
}
