//! Issue 16 item 4 on the mesh factory: two validators and the trainer
//! commit to contributions to every window's challenge and reveal them when
//! its submissions close. A window's reveal, fetched over the wire like any
//! client does, lists all three; the challenge it carries is the protocol's
//! recomputation from those public reveals (`protocol::beacon::check_reveal`),
//! it is the one the coordinator assigns with, it is not what the
//! coordinator's secret alone gives, and each validator judged exactly the
//! miners the public reveal assigns it.

use std::collections::{BTreeMap, BTreeSet};

use tributary_net::{KeyPin, Session};
use tributary_protocol::assign::Assignment;
use tributary_protocol::beacon;
use tributary_protocol::identity::{Keypair, PublicKey};
use tributary_protocol::wire::{Frame, GetReveal, GetWindow, Role};
use tributary_tests::{Mesh, MeshConfig, within};
use validator::service::WindowReport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validators_and_the_trainer_mix_the_challenge_anyone_recomputes() {
    let mesh = Mesh::start(MeshConfig::committees_of_one(&["a", "b", "c"], true)).await;
    let mut validators = mesh.assigned_validators();
    let keys: Vec<PublicKey> = validators.iter().map(|v| v.config.key.public()).collect();
    let trainer = mesh.trainer.as_ref().expect("trainer").config.key.public();
    let parties: BTreeSet<PublicKey> = keys.iter().copied().chain([trainer]).collect();

    let mut seen: [BTreeMap<u64, WindowReport>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut done = BTreeSet::new();
    let window = 'found: loop {
        for (i, v) in validators.iter_mut().enumerate() {
            let r = v.next_report(180).await;
            seen[i].insert(r.window, r);
        }
        let both: Vec<u64> =
            seen[0].keys().filter(|w| seen[1].contains_key(w) && !done.contains(*w)).copied().collect();
        for w in both {
            done.insert(w);
            // A client of the network (any role may ask for a window and its reveal).
            let mut client = within(
                30,
                Session::connect_pinned(
                    mesh.net.node.quic,
                    &mesh.net.node.fingerprint,
                    &KeyPin::Any,
                    &Keypair::generate(),
                    Role::Miner,
                ),
            )
            .await
            .expect("client session");
            let network = client.network();
            let info = match client.request(&Frame::GetWindow(GetWindow { window: Some(w) })).await {
                Ok(Frame::WindowInfo(i)) => i,
                other => panic!("window {w}: {other:?}"),
            };
            let reveal = match client.request(&Frame::GetReveal(GetReveal { window: w })).await {
                Ok(Frame::Reveal(r)) => r,
                other => panic!("window {w}: {other:?}"),
            };
            // Every window the validators judged: the published challenge is
            // the recomputation from the public reveals.
            let challenge = beacon::check_reveal(&reveal, &network, &info.commitment).expect("the reveal holds");
            let (core_challenge, coordinator_only, work) = {
                let core = mesh.net.node.shared.core();
                let now = tributary_net::now_ms();
                let work: BTreeMap<PublicKey, BTreeSet<u32>> = mesh
                    .miners
                    .iter()
                    .filter_map(|m| core.submitted(w, &m.key.public()).map(|s| (m.key.public(), s.groups.clone())))
                    .collect();
                (core.reveal(w, now), core.coordinator_only_challenge(w), work)
            };
            assert_eq!(core_challenge, Some(challenge), "window {w}: the coordinator assigns with it");
            // A window where all three contributed and every miner stored work.
            let contributed: BTreeSet<PublicKey> = reveal.contributions.iter().map(|c| c.commit.body.party).collect();
            eprintln!(
                "window {w}: {} contributions, {} withheld, {} miners stored",
                contributed.len(),
                reveal.withheld.len(),
                work.len()
            );
            if contributed != parties || work.len() < mesh.miners.len() {
                continue;
            }
            assert!(reveal.withheld.is_empty());
            assert_ne!(challenge, coordinator_only, "the coordinator's secret alone does not give it");
            // Each validator judged what the public reveal assigns it.
            let a = Assignment::compute(&reveal.assign, w, &challenge, 2, &work);
            for (i, k) in keys.iter().enumerate() {
                let want: BTreeSet<PublicKey> = a.of_validator(k).map(|(m, _)| *m).collect();
                let judged: BTreeSet<PublicKey> = seen[i][&w].miners.keys().copied().collect();
                assert_eq!(judged, want, "window {w}: validator {} judged its public assignment", k.short());
            }
            break 'found w;
        }
        assert!(done.len() < 12, "no window in which both validators and the trainer contributed");
    };
    eprintln!("window {window}: challenge recomputed from the public reveals ({} windows checked)", done.len());
    for v in validators {
        v.kill().await;
    }
    mesh.stop().await;
}
