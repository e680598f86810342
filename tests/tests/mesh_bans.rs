//! Issue 16 item 2 on loopback: bans need evidence.
//!
//! - A validator posting a false failing verdict (sampling evidence on an
//!   honest miner's rollout) bans nobody: the failure waits for a second
//!   party, listed as a confirmation for the other member of the miner's
//!   committee; the honest validator proves only the cited rollout, passing,
//!   which flags the liar (its verdicts stop counting, `/api/validators`
//!   says so) until an operator clears it through the live admin socket.
//! - A cheater caught with evidence the coordinator re-checks itself (an
//!   inflated reward) by a single validator is banned, and its whole window
//!   is excluded from what the trainer fetches.

use std::time::Duration;

use edge_miner::adversary::{self, Attack, AttackOptions};
use tributary_net::Session;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{
    FailedCheck, FailureEvidence, FetchRollouts, Figures, Frame, MinerStanding, Role, Verdict, VerdictBody,
};
use tributary_tests::{
    Miner, Net, NetConfig, extra_validator_key, http_json, trainer_session, validator_config, within,
};
use validator::service::{Service, WindowReport};

/// One network at a time: the machine's cores are shared by the miners and a validator.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn net_config() -> NetConfig {
    NetConfig { max_new_tokens: 16, extra_validators: 1, ..NetConfig::new(3_000, 500, 1, 2) }
}

/// Steps `v` over closed windows until `done` accepts a report.
async fn until(v: &mut Service, secs: u64, mut done: impl FnMut(&WindowReport) -> bool) -> WindowReport {
    within(secs, async {
        loop {
            match v.step().await.expect("validator step") {
                Some(r) if done(&r) => return r,
                Some(_) => {}
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
}

fn to_hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The rollouts of `miner` in closed window `w`, fetched as role `role` by `s`.
async fn fetch(s: &mut Session, w: WindowId, miner: Option<PublicKey>) -> Vec<Rollout> {
    let req = Frame::FetchRollouts(FetchRollouts { window: w, miner, after: None, limit: 256 });
    match within(30, s.request(&req)).await.expect("fetch") {
        Frame::Rollouts(r) => {
            r.items.iter().map(|b| Rollout::decode(&b.0, &RolloutLimits::DEFAULT).expect("a stored rollout")).collect()
        }
        f => panic!("unexpected answer {f:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_false_failing_verdict_bans_nobody_and_flags_its_validator() {
    let _serial = SERIAL.lock().await;
    let net = Net::with(net_config()).await;
    let mut honest_validator =
        within(30, Service::open(validator_config(&net, net.window()))).await.expect("validator");
    let miners: Vec<Miner> = (0..2).map(|i| Miner::spawn(net.miner(&format!("honest{i}"), true))).collect();
    let victim = miners[0].key.public();

    // A closed window in which the victim stored rollouts.
    let mut w = None;
    net.until(90, |n| {
        let now = coordinator::server::now_ms();
        let core = n.node.shared.core();
        let cur = core.current_window(now).unwrap_or(0);
        w = (0..cur).rev().find(|&x| core.reveal(x, now).is_some() && core.submitted(x, &victim).is_some());
        w.is_some()
    })
    .await;
    let w = w.expect("a judged window");

    // The liar: an authorised validator key that claims a sampling failure
    // on one of the victim's (honest) rollouts.
    let liar = extra_validator_key(net.config.seed, 0);
    let mut s = within(30, Session::connect(net.node.quic, &net.node.fingerprint, &liar, Role::Validator))
        .await
        .expect("the liar connects");
    let rollouts = fetch(&mut s, w, Some(victim)).await;
    let target = rollouts.first().expect("the victim's rollouts");
    let mut body = VerdictBody {
        window: w,
        miner: victim,
        validator: liar.public(),
        checked: rollouts.len() as u32,
        valid: 0,
        estimated_valid: 0,
        hard_failure: true,
        soft_failures: 0,
        reasons: vec![],
        passed: vec![],
        evidence: vec![],
    };
    body.add_reason("sampling (hard): made up");
    body.add_evidence(FailureEvidence::of_rollout(
        target,
        FailedCheck::Sampling,
        Some(target.prompt_len as usize),
        Figures::Sampling { u: 0.5, lo: 0.6, hi: 0.7, outside: 1 },
    ));
    let v = Verdict::sign(body, &liar, &s.network());
    assert!(matches!(within(30, s.request(&Frame::PostVerdict(v))).await, Ok(Frame::VerdictAck(_))));
    let honest_key = tributary_protocol::dev::key(Role::Validator).public();
    {
        let core = net.node.shared.core();
        assert!(!core.is_banned(&victim, w + 1), "one validator's model-based failure banned an honest miner");
        assert!(core.pending(w, &victim));
        assert!(core.standing(w).contains(&(victim, MinerStanding::Suspect)));
        assert!(!core.is_flagged(&liar.public()));
        let waiting = core.confirmations(&honest_key, None, 64);
        let c = waiting.items.iter().find(|c| (c.window, c.miner) == (w, victim)).expect("a pending confirmation");
        assert_eq!((c.digests.clone(), c.claimants.clone()), (vec![target.digest()], vec![liar.public()]));
    }

    // The honest validator, the other member of the committee, proves only
    // the cited rollout: it passes, and the liar is refuted.
    let reports = within(120, honest_validator.confirm_pending()).await.expect("confirmations");
    let r = reports.iter().find(|r| r.window == w).expect("the confirmation of window w");
    assert_eq!(r.proved, 1, "only the cited rollout is proved");
    let judged = &r.miners[&victim].body;
    assert_eq!(judged.checked, 1, "{judged:?}");
    assert!(!judged.hard_failure && judged.passed == vec![target.digest()], "{judged:?}");
    assert!(rollouts.len() > 1, "the victim stored more than the cited rollout");
    {
        let core = net.node.shared.core();
        assert!(core.is_flagged(&liar.public()), "the refuted validator is flagged");
        assert!(!core.is_banned(&victim, w + 1));
        assert!(core.standing(w).contains(&(victim, MinerStanding::Passed)));
        assert!(core.verdicts_on(w, &victim).iter().all(|v| v.validator != liar.public()), "set aside");
    }
    let listed = http_json(net.node.http, "/api/validators").await;
    let entry = listed
        .as_array()
        .expect("a list")
        .iter()
        .find(|v| v["key"] == liar.public().to_string())
        .unwrap_or_else(|| panic!("the liar is listed: {listed}"))
        .clone();
    assert_eq!(entry["flagged"], true, "{entry}");
    assert_eq!(entry["refutations"][0]["digest"], to_hex(&target.digest()), "{entry}");
    let status = http_json(net.node.http, "/api/status").await;
    assert!(status["validators"].as_array().is_some_and(|v| v.iter().any(|x| x["flagged"] == true)), "{status}");

    // An operator clears it on the running coordinator.
    let data = net.dir.path().join("coordinator");
    let _admin = coordinator::admin::serve_live(&data, net.node.shared.clone()).expect("admin socket");
    let key = liar.public().to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        coordinator::admin::cli(&coordinator::admin::AdminCmd::ClearValidator { data, key }, &mut out)
            .map(|()| String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .expect("admin task")
    .expect("clear-validator");
    assert!(out.contains("was_flagged=true") && out.contains("applied=live"), "{out}");
    assert!(!net.node.shared.core().is_flagged(&liar.public()));
    assert!(!net.node.shared.core().is_banned(&victim, w + 1), "clearing does not turn a refuted claim into a ban");
    for m in miners {
        m.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cheater_caught_with_checkable_evidence_is_banned_and_its_window_excluded() {
    let _serial = SERIAL.lock().await;
    let net = Net::with(net_config()).await;
    let mut validator = within(30, Service::open(validator_config(&net, net.window()))).await.expect("validator");
    let honest: Vec<Miner> = (0..2).map(|i| Miner::spawn(net.miner(&format!("honest{i}"), true))).collect();
    let mut cfg = net.miner("attacker", true);
    let opts = AttackOptions { work_dir: Some(net.dir.path().join("attacker-work")), threads: 1, ..Default::default() };
    cfg.tamper = Some(adversary::setup(Attack::RewardInflation, &opts).expect("attack setup").tamper);
    let attacker = Miner::spawn(cfg);
    let a = attacker.key.public();
    let honest_keys: Vec<PublicKey> = honest.iter().map(|m| m.key.public()).collect();

    // One validator catches it; the coordinator re-computes the reward itself.
    let r = until(&mut validator, 120, |r| {
        r.miners.get(&a).is_some_and(|m| m.body.hard_failure) && honest_keys.iter().all(|h| r.miners.contains_key(h))
    })
    .await;
    let w = r.window;
    let caught = &r.miners[&a].body;
    assert!(caught.evidence.iter().any(|e| e.hard && e.check == FailedCheck::Reward), "{:?}", caught.evidence);
    let coordinator_key = net.node.shared.key.public();
    {
        let core = net.node.shared.core();
        assert!(core.is_banned(&a, w + 1), "attacker not banned after window {w}");
        assert!(core.standing(w).contains(&(a, MinerStanding::Failed)));
        let own = core.verdicts_on(w, &a);
        assert!(
            own.iter().any(|v| v.validator == coordinator_key
                && v.hard_failure
                && v.evidence.iter().any(|e| e.check == FailedCheck::Reward)),
            "the coordinator's own re-check confirms it: {own:?}"
        );
        for h in &honest_keys {
            assert!(!core.is_banned(h, w + 1));
            assert!(core.standing(w).contains(&(*h, MinerStanding::Passed)));
        }
    }
    // The whole window of the cheater is excluded from what the trainer
    // fetches; the honest miners' rollouts of it are all there.
    let mut v = within(
        30,
        Session::connect(
            net.node.quic,
            &net.node.fingerprint,
            &tributary_protocol::dev::key(Role::Validator),
            Role::Validator,
        ),
    )
    .await
    .expect("validator connects");
    let stored = fetch(&mut v, w, None).await;
    assert!(stored.iter().any(|x| PublicKey(x.miner) == a), "the cheater's rollouts are stored");
    let mut t = trainer_session(&net).await;
    let trained = fetch(&mut t, w, None).await;
    assert!(trained.iter().all(|x| PublicKey(x.miner) != a), "the cheater's window reaches the trainer");
    assert_eq!(trained.len(), stored.iter().filter(|x| PublicKey(x.miner) != a).count());
    for m in honest {
        m.stop().await;
    }
    let _ = attacker.abort().await;
}
