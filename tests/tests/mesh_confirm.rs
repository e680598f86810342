//! Issue 16's compute goal on loopback: each miner's committee has one
//! prover, which proves the miner's groups ahead of time, and a confirmer,
//! which proves nothing ahead of time. An attacker forges the sketches of
//! the first rollout of each group (a model-based failure the coordinator
//! cannot re-check itself). Its prover catches it and cites those rollouts;
//! nobody is banned yet; the coordinator lists a confirmation for the other
//! member; the confirmer proves only the cited rollouts (fewer than the
//! attacker stored), fails them too, and only then is the attacker banned.

use std::time::Duration;

use edge_miner::adversary::{self, Attack, AttackOptions};
use edge_miner::run::Tamper;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::Rollout;
use tributary_protocol::wire::{FailedCheck, MinerStanding, WindowInfo};
use tributary_tests::{Miner, Net, NetConfig, extra_validator_config, validator_config, within};
use validator::service::{SampleConfig, Service, WindowReport};

/// Applies a tamper to the first rollout of each group only.
struct FirstOfEachGroup(Box<dyn Tamper>);

impl Tamper for FirstOfEachGroup {
    fn tamper(&mut self, info: &WindowInfo, group: &mut Vec<Rollout>) {
        if group.is_empty() {
            return;
        }
        let mut first = vec![group.remove(0)];
        self.0.tamper(info, &mut first);
        group.splice(0..0, first);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_confirmer_proves_only_the_cited_rollouts_and_only_its_verdict_bans() {
    let net =
        Net::with(NetConfig { max_new_tokens: 16, extra_validators: 1, ..NetConfig::new(3_000, 500, 2, 2) }).await;
    let start = net.window();
    let mut first = validator_config(&net, start);
    first.sample = SampleConfig::ASSIGNED;
    let mut validators = [
        within(30, Service::open(first)).await.expect("validator"),
        within(30, Service::open(extra_validator_config(&net, start, 0))).await.expect("validator"),
    ];
    let keys: Vec<PublicKey> = [
        tributary_protocol::dev::key(tributary_protocol::wire::Role::Validator),
        tributary_tests::extra_validator_key(0, 0),
    ]
    .iter()
    .map(|k| k.public())
    .collect();
    let honest = Miner::spawn(net.miner("honest", true));
    let work = tempfile::tempdir().expect("temporary folder");
    let opts = AttackOptions { work_dir: Some(work.path().to_path_buf()), threads: 1, ..Default::default() };
    let forged = adversary::setup(Attack::ForgedSketch, &opts).expect("attack setup").tamper;
    let mut cfg = net.miner("attacker", true);
    cfg.tamper = Some(Box::new(FirstOfEachGroup(forged)));
    let attacker = Miner::spawn(cfg);
    let a = attacker.key.public();

    // Step both validators, each through its assignment only, until the
    // attacker's prover catches it in a window where it stored everything.
    let (w, prover, report): (u64, usize, WindowReport) = within(240, async {
        loop {
            let mut idle = true;
            for (i, v) in validators.iter_mut().enumerate() {
                if let Some(r) = v.step().await.expect("validator step") {
                    idle = false;
                    let full = net.node.shared.core().submitted(r.window, &a).is_some_and(|s| s.rollouts == 4);
                    if full && r.miners.get(&a).is_some_and(|m| m.body.hard_failure) {
                        return (r.window, i, r);
                    }
                }
            }
            if idle {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    })
    .await;
    let confirmer = 1 - prover;
    let claim = &report.miners[&a].body;
    let cited: Vec<[u8; 32]> = claim.evidence.iter().filter(|e| e.hard).map(|e| e.digest).collect();
    assert!(claim.evidence.iter().all(|e| !e.hard || e.check == FailedCheck::Sketch), "{:?}", claim.evidence);
    assert_eq!(cited.len(), 2, "one forged rollout in each of the 2 groups: {:?}", claim.evidence);
    {
        let core = net.node.shared.core();
        let duty = core.duty(w, &a).expect("the attacker's duty");
        assert_eq!((duty.prover(), duty.confirmers()), (Some(&keys[prover]), &[keys[confirmer]][..]));
        assert!(!core.is_banned(&a, w + 1), "one validator's model-based evidence banned");
        assert!(core.standing(w).contains(&(a, MinerStanding::Suspect)));
        let page = core.confirmations(&keys[confirmer], None, 64);
        let c = page.items.iter().find(|c| (c.window, c.miner) == (w, a)).expect("a confirmation is pending");
        let mut want = cited.clone();
        want.sort();
        let mut got = c.digests.clone();
        got.sort();
        assert_eq!(got, want);
    }

    // The confirmer proves only the cited rollouts; its failure bans.
    let reports = within(120, validators[confirmer].confirm_pending()).await.expect("confirmations");
    let r = reports.iter().find(|r| r.window == w).expect("the confirmation of the window");
    let body = &r.miners[&a].body;
    assert_eq!((r.proved, body.checked), (2, 2), "only the cited rollouts, of the 4 stored");
    assert!(body.hard_failure && body.evidence.iter().any(|e| e.check == FailedCheck::Sketch), "{body:?}");
    {
        let core = net.node.shared.core();
        assert!(core.is_banned(&a, w + 1), "the confirming verdict bans");
        assert!(core.standing(w).contains(&(a, MinerStanding::Failed)));
        assert!(!core.is_banned(&honest.key.public(), w + 1));
    }
    honest.stop().await;
    let _ = attacker.abort().await;
}
