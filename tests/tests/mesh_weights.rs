//! Issue #8 item 1 on the mesh factory: two honest miners, one mining every
//! assigned group and one only half of them, with the real validator proving
//! every rollout. Both pass; the weights follow grail's superlinear rule:
//! the ratio of their weights is the ratio of their valid rollouts to the
//! fourth power (the network's exponent), about 2⁴ = 16 here.

use tributary_tests::{Mesh, MeshConfig, MinerSpec, NetConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_weights_superlinear() {
    let mut mesh = Mesh::start(MeshConfig {
        net: NetConfig { max_new_tokens: 12, ..NetConfig::new(4_000, 600, 4, 2) },
        miners: vec![MinerSpec::honest("full"), MinerSpec::honest("half").max_groups(2)],
        trainer: false,
        validator: true,
    })
    .await;
    let full = mesh.miners[0].key.public();
    let half = mesh.miners[1].key.public();
    // Two windows in which both miners did all they mine (4 and 2 groups of 2).
    let mut windows = Vec::new();
    while windows.len() < 2 {
        let r = mesh
            .validator()
            .until(120, |r| {
                r.miners.get(&full).is_some_and(|m| m.body.checked >= 7)
                    && r.miners.get(&half).is_some_and(|m| m.body.checked >= 3)
            })
            .await;
        for k in [&full, &half] {
            let m = &r.miners[k];
            assert!(
                !m.body.hard_failure && m.body.soft_failures == 0 && m.body.valid == m.body.checked,
                "{:?}",
                m.body
            );
        }
        windows.push(r.window);
    }
    let last = *windows.last().expect("windows");
    {
        let core = mesh.net.node.shared.core();
        // U: valid rollouts over the windows the weights look back on.
        let u = |k| -> f64 {
            (0..=last).flat_map(|w| core.verdicts_on(w, k)).map(|v| f64::from(v.estimated_valid.max(v.valid))).sum()
        };
        let (uf, uh) = (u(&full), u(&half));
        let ratio = uf / uh;
        assert!((1.5..=2.7).contains(&ratio), "the full miner produced {uf} valid rollouts, the half miner {uh}");
        let weights = core.weights(last, mesh.net.node.shared.key.public());
        let w = |k| weights.weights.iter().find(|(m, _)| m == k).map_or(0.0, |(_, x)| *x);
        let (wf, wh) = (w(&full), w(&half));
        eprintln!("valid rollouts {uf} vs {uh} (ratio {ratio:.3}); weights {wf:.4} vs {wh:.4} (ratio {:.2})", wf / wh);
        assert!((wf + wh - 1.0).abs() < 1e-9);
        assert!(((wf / wh) / ratio.powi(4) - 1.0).abs() < 1e-9, "weights ∝ U⁴: {wf}/{wh} vs {ratio}⁴");
        assert!(wf / wh > 2.0 * ratio, "superlinear: weight ratio {} for a production ratio {ratio}", wf / wh);
    }
    mesh.stop().await;
}
