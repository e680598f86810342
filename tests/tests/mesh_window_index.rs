//! Review W3 on the mesh factory: a validator never holds a whole window.
//! Two validators with committees of one each judge part of the miners; each
//! computes its assignment from the window's index (`GetWindowIndex`) and
//! fetches only the rollouts of the miners it judges, so what it fetched is
//! exactly those miners' rollouts, fewer than the window holds.

use std::collections::BTreeSet;

use tributary_protocol::identity::PublicKey;
use tributary_tests::{Mesh, MeshConfig};
use validator::service::WindowReport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validator_fetches_only_the_miners_it_judges() {
    let mesh = Mesh::start(MeshConfig::committees_of_one(&["a", "b", "c", "d"], false)).await;
    let mut validators = mesh.assigned_validators();
    let miners: BTreeSet<PublicKey> = mesh.miners.iter().map(|m| m.key.public()).collect();
    let mut checked = 0;
    for _ in 0..12 {
        let reports: Vec<WindowReport> = {
            let mut out = Vec::new();
            for v in validators.iter_mut() {
                out.push(v.next_report(180).await);
            }
            out
        };
        let core = mesh.net.node.shared.core();
        for r in &reports {
            let stored: u32 = miners.iter().filter_map(|m| core.submitted(r.window, m)).map(|s| s.rollouts).sum();
            let judged: u32 = r.miners.keys().filter_map(|m| core.submitted(r.window, m)).map(|s| s.rollouts).sum();
            eprintln!(
                "window {}: judged {} miners, fetched {} rollouts; theirs {judged}, the window's {stored}",
                r.window,
                r.miners.len(),
                r.fetched
            );
            assert_eq!(r.fetched, judged as usize, "fetched exactly the judged miners' rollouts");
            let all_stored = miners.iter().all(|m| core.submitted(r.window, m).is_some());
            if all_stored && r.miners.len() < miners.len() {
                assert!(r.fetched < stored as usize);
                checked += 1;
            }
        }
        if checked >= 2 {
            break;
        }
    }
    assert!(checked >= 2, "no window where both validators judged part of four miners");
    for v in validators {
        v.kill().await;
    }
    mesh.stop().await;
}
