//! Review W3 for the trainer: it never holds a whole window. Four miners
//! store two groups of four rollouts each per window; a trainer that keeps
//! one group per window walks the window's index miner by miner and holds at
//! most one miner's rollouts plus the groups it will train on (and as many
//! again ranked next, for groups that fail their proof), never every
//! rollout of the windows it trains on.

use std::collections::BTreeSet;

use tributary_protocol::identity::PublicKey;
use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig, trainer_config, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trainer_holds_one_miner_and_what_it_trains_on() {
    let (groups, size) = (2u32, 4u32);
    let mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 8, ..NetConfig::new(4_000, 600, groups, size) },
        miners: ["a", "b", "c", "d"].into_iter().map(MinerSpec::honest).collect(),
        trainer: false,
        validator: false,
    })
    .await;
    let net = &mesh.net;
    let mut cfg = trainer_config(net.node.quic, &net.node.fingerprint, &net.dir.path().join("t"), &net.genesis_bytes);
    cfg.select.max_groups_per_window = 1;
    let mut s = within(30, trainer::service::Service::open(cfg)).await.unwrap();
    let miners: BTreeSet<PublicKey> = mesh.miners.iter().map(|m| m.key.public()).collect();
    let per_miner = (groups * size) as usize;
    let mut checked = 0;
    within(240, async {
        while checked < 2 {
            let r = s.round().await.unwrap();
            if r.windows.is_empty() {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            let (stored, full) = {
                let core = net.node.shared.core();
                let stored: u32 = r
                    .windows
                    .iter()
                    .flat_map(|w| miners.iter().filter_map(|m| core.submitted(*w, m)))
                    .map(|s| s.rollouts)
                    .sum();
                let full = r.windows.iter().all(|w| miners.iter().all(|m| core.submitted(*w, m).is_some()));
                (stored as usize, full)
            };
            // One miner's rollouts, plus per window the group kept and one ranked next.
            let bound = per_miner + 2 * size as usize * r.windows.len();
            eprintln!(
                "windows {:?}: held at most {} rollouts (bound {bound}); stored {stored}; fetched {}; {} groups trained",
                r.windows, r.peak_held, r.rollouts, r.groups
            );
            assert!(r.peak_held <= bound, "held {} > {bound}", r.peak_held);
            if full && stored > bound {
                checked += 1;
            }
        }
    })
    .await;
    drop(s);
    mesh.stop().await;
}
