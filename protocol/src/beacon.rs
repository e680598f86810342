//! Each window's challenge, mixed from contributions no single party fixes.
//!
//! The challenge decides which sketch positions are checked and which
//! validators judge which miners' groups ([`crate::assign`]). Derived from
//! the coordinator's master secret alone, the operator would know every
//! future challenge. So every authorised validator and the trainer
//! contribute a secret of their own, by commit and reveal:
//!
//! 1. **Commit** (before window `W`'s submissions close): a party posts
//!    [`commit`], its signed [`commitment`] to [`contribution_secret`]. The
//!    secret is derived from the party's deterministic ed25519 signature over
//!    (network, `W`), so a restarted party re-derives the same secret; a
//!    second, different commitment for the same window is refused.
//! 2. **Reveal** (once `W`'s submissions have closed): the party posts the
//!    secret; it must match the commitment.
//! 3. **Mix**: once every committed party has revealed, or the reveal
//!    deadline passed, the challenge is [`mix`] over the network, `W`, the
//!    coordinator's own secret (committed to in the window's public
//!    parameters at open) and every revealed contribution, in key order. A
//!    commitment without a reveal is left out and published as withheld.
//!
//! Anyone holding the window's [`Reveal`] recomputes the challenge with
//! [`check_reveal`]: the coordinator's secret against its commitment, each
//! contribution's signature, network and commitment, and the mix.
//!
//! What a party can still do: reveals reach only the coordinator until the
//! challenge is fixed, so a validator or the trainer that withholds its
//! reveal does so blind (it knows its own secret, never the others'); the
//! coordinator, which sees every reveal first, can choose to drop a reveal,
//! which gives it one bit of choice per dropped party, and each drop is
//! published (the party is listed as withheld) and visible to the party it
//! wronged. With no contribution (no validator, or a `--dev` network whose
//! role keys are public) the challenge rests on the coordinator's secret
//! alone.

use std::collections::BTreeMap;

use crate::domain;
use crate::identity::{Keypair, PublicKey};
use crate::prf::Seed;
use crate::window::{WindowId, verify_reveal};
use crate::wire::{BeaconCommit, BeaconCommitBody, NetworkId, Reveal, Signed};

/// The secret `key` contributes to `window`'s challenge on `network`: blake3
/// (derive-key mode, [`domain::context::BEACON_SECRET`]) of the key's
/// ed25519 signature over `(network, window)` under
/// [`domain::sign::BEACON_SECRET`]. Signing is deterministic (RFC 8032), so
/// the party derives the same secret after a restart and keeps nothing.
pub fn contribution_secret(key: &Keypair, network: &NetworkId, window: WindowId) -> [u8; 32] {
    let signature = key.sign(domain::sign::BEACON_SECRET, &crate::wire::canonical(&(network, window)));
    blake3::derive_key(domain::context::BEACON_SECRET, signature.as_bytes())
}

/// The commitment to `secret`: blake3 (derive-key mode,
/// [`domain::context::BEACON_COMMIT`]) over network ‖ window (u64 LE) ‖ party ‖ secret.
pub fn commitment(network: &NetworkId, window: WindowId, party: &PublicKey, secret: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(domain::context::BEACON_COMMIT);
    h.update(&network.0);
    h.update(&window.to_le_bytes());
    h.update(party.as_bytes());
    h.update(secret);
    *h.finalize().as_bytes()
}

/// `key`'s signed commitment to its contribution to `window`.
pub fn commit(key: &Keypair, network: &NetworkId, window: WindowId) -> BeaconCommit {
    let party = key.public();
    let secret = contribution_secret(key, network, window);
    let body = BeaconCommitBody { window, party, commitment: commitment(network, window, &party, &secret) };
    Signed::sign(body, key, network)
}

/// Whether `secret` is the one `c` commits to.
pub fn opens(c: &BeaconCommit, secret: &[u8; 32]) -> bool {
    commitment(&c.network, c.body.window, &c.body.party, secret) == c.body.commitment
}

/// The window's challenge: blake3 (derive-key mode,
/// [`domain::context::WINDOW_CHALLENGE`]) over network ‖ window (u64 LE) ‖
/// the coordinator's secret ‖ the number of contributions (u32 LE) ‖ each
/// (party ‖ secret) in ascending key order. The map fixes the order, so the
/// challenge does not depend on the order contributions arrived in.
pub fn mix(
    network: &NetworkId,
    window: WindowId,
    coordinator_secret: &[u8; 32],
    contributions: &BTreeMap<PublicKey, [u8; 32]>,
) -> Seed {
    let mut h = blake3::Hasher::new_derive_key(domain::context::WINDOW_CHALLENGE);
    h.update(&network.0);
    h.update(&window.to_le_bytes());
    h.update(coordinator_secret);
    h.update(&u32::try_from(contributions.len()).unwrap_or(u32::MAX).to_le_bytes());
    for (party, secret) in contributions {
        h.update(party.as_bytes());
        h.update(secret);
    }
    Seed(*h.finalize().as_bytes())
}

/// Why a published [`Reveal`] does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BeaconError {
    /// The coordinator's secret does not match the commitment published at open.
    #[error("the coordinator's secret does not match its commitment")]
    CoordinatorSecret,
    /// A commitment names another window or network.
    #[error("a commitment of {0} names another window or network")]
    WrongWindow(PublicKey),
    /// A contributor is neither an authorised validator nor the trainer.
    #[error("{0} may not contribute")]
    Unauthorized(PublicKey),
    /// A commitment's signature does not verify.
    #[error("the commitment of {0} is not signed by it")]
    BadSignature(PublicKey),
    /// A secret does not open its commitment.
    #[error("the secret of {0} does not match its commitment")]
    Mismatch(PublicKey),
    /// A party is listed twice, or the list is not in key order.
    #[error("contributions not in strict key order at {0}")]
    Order(PublicKey),
    /// The published challenge is not the mix of the contributions.
    #[error("the published challenge is not the mix of the contributions")]
    Challenge,
}

/// Checks a window's published [`Reveal`] against the coordinator's
/// `commitment` (from the window's public parameters) on `network`, and
/// returns its challenge recomputed from the public reveals.
pub fn check_reveal(reveal: &Reveal, network: &NetworkId, commitment: &[u8; 32]) -> Result<Seed, BeaconError> {
    if !verify_reveal(reveal.window, commitment, &reveal.secret) {
        return Err(BeaconError::CoordinatorSecret);
    }
    let authorised = |k: &PublicKey| reveal.assign.validators.contains(k) || reveal.trainer.as_ref() == Some(k);
    let check_commit = |c: &BeaconCommit| {
        let party = c.body.party;
        if c.body.window != reveal.window || c.network != *network {
            return Err(BeaconError::WrongWindow(party));
        }
        if !authorised(&party) {
            return Err(BeaconError::Unauthorized(party));
        }
        c.verify(network).map_err(|_| BeaconError::BadSignature(party))
    };
    let mut contributions = BTreeMap::new();
    let mut last: Option<PublicKey> = None;
    for c in &reveal.contributions {
        let party = c.commit.body.party;
        if last.is_some_and(|l| l >= party) {
            return Err(BeaconError::Order(party));
        }
        last = Some(party);
        check_commit(&c.commit)?;
        if !opens(&c.commit, &c.secret) {
            return Err(BeaconError::Mismatch(party));
        }
        contributions.insert(party, c.secret);
    }
    for c in &reveal.withheld {
        check_commit(c)?;
        if contributions.contains_key(&c.body.party) {
            return Err(BeaconError::Order(c.body.party));
        }
    }
    let challenge = mix(network, reveal.window, &reveal.secret, &contributions);
    if challenge.0 != reveal.challenge {
        return Err(BeaconError::Challenge);
    }
    Ok(challenge)
}

/// Where one party's contribution stands in a window's reveal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inclusion {
    /// Among the contributions: it is mixed into the challenge.
    Contributed,
    /// Listed as withheld: committed, not revealed in time (visible to all).
    Withheld,
    /// In neither list. For a party whose commitment the coordinator
    /// acknowledged, the coordinator dropped it silently: the challenge
    /// was mixed without this party (review finding H), and the party must
    /// say so loudly.
    Absent,
}

/// Whether `party`'s contribution is in `reveal` ([`Inclusion`]).
pub fn inclusion(reveal: &Reveal, party: &PublicKey) -> Inclusion {
    if reveal.contributions.iter().any(|c| c.commit.body.party == *party) {
        Inclusion::Contributed
    } else if reveal.withheld.iter().any(|c| c.body.party == *party) {
        Inclusion::Withheld
    } else {
        Inclusion::Absent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::challenge_commitment;
    use crate::wire::Contribution;
    use proptest::prelude::*;

    const NET: NetworkId = NetworkId([7; 32]);

    fn key(i: u8) -> Keypair {
        Keypair::from_seed([i; 32])
    }

    fn reveal_of(window: WindowId, coordinator: [u8; 32], parties: &[Keypair]) -> Reveal {
        let mut contributions: Vec<Contribution> = parties
            .iter()
            .map(|k| Contribution { commit: commit(k, &NET, window), secret: contribution_secret(k, &NET, window) })
            .collect();
        contributions.sort_by_key(|c| c.commit.body.party);
        let map = contributions.iter().map(|c| (c.commit.body.party, c.secret)).collect();
        Reveal {
            window,
            secret: coordinator,
            challenge: mix(&NET, window, &coordinator, &map).0,
            contributions,
            withheld: vec![],
            trainer: None,
            assign: crate::assign::Spec {
                validators: parties.iter().map(Keypair::public).collect(),
                committee: 2,
                budget: 64,
            },
        }
    }

    #[test]
    fn a_restart_rederives_the_same_contribution() {
        let k = key(1);
        assert_eq!(contribution_secret(&k, &NET, 4), contribution_secret(&Keypair::from_seed(k.seed()), &NET, 4));
        assert_ne!(contribution_secret(&k, &NET, 4), contribution_secret(&k, &NET, 5));
        assert_ne!(contribution_secret(&k, &NET, 4), contribution_secret(&k, &NetworkId([8; 32]), 4));
        assert_ne!(contribution_secret(&k, &NET, 4), contribution_secret(&key(2), &NET, 4));
        let c = commit(&k, &NET, 4);
        c.verify(&NET).unwrap();
        assert!(opens(&c, &contribution_secret(&k, &NET, 4)));
        assert!(!opens(&c, &contribution_secret(&k, &NET, 5)));
    }

    #[test]
    fn the_challenge_needs_every_revealed_contribution() {
        let coordinator = [3; 32];
        let alone = mix(&NET, 9, &coordinator, &BTreeMap::new());
        let one: BTreeMap<_, _> = [(key(1).public(), [1; 32])].into();
        assert_ne!(mix(&NET, 9, &coordinator, &one), alone, "the coordinator alone cannot compute it");
        assert_ne!(mix(&NET, 10, &coordinator, &one), mix(&NET, 9, &coordinator, &one));
        assert_ne!(mix(&NetworkId([0; 32]), 9, &coordinator, &one), mix(&NET, 9, &coordinator, &one));
    }

    #[test]
    fn check_reveal_recomputes_and_refuses_tampering() {
        let coordinator = [3; 32];
        let commitment = challenge_commitment(9, &coordinator);
        let parties = [key(1), key(2), key(3)];
        let r = reveal_of(9, coordinator, &parties);
        assert_eq!(check_reveal(&r, &NET, &commitment).unwrap().0, r.challenge);

        let mut bad = r.clone();
        bad.secret = [4; 32];
        assert_eq!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::CoordinatorSecret));
        let mut bad = r.clone();
        bad.contributions[1].secret = [0; 32];
        assert!(matches!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::Mismatch(_))));
        let mut bad = r.clone();
        bad.challenge = [0; 32];
        assert_eq!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::Challenge));
        let mut bad = r.clone();
        bad.contributions.swap(0, 1);
        assert!(matches!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::Order(_))));
        let mut bad = r.clone();
        bad.assign.validators.remove(0);
        assert!(matches!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::Unauthorized(_))));
        // A commitment the coordinator made up for a party it does not hold.
        let mut bad = r.clone();
        bad.contributions[0].commit.body.commitment = [1; 32];
        assert!(matches!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::BadSignature(_))));
        let mut bad = r.clone();
        bad.withheld.push(bad.contributions[0].commit.clone());
        assert!(matches!(check_reveal(&bad, &NET, &commitment), Err(BeaconError::Order(_))));
        assert!(matches!(check_reveal(&r, &NetworkId([8; 32]), &commitment), Err(BeaconError::WrongWindow(_))));
    }

    #[test]
    fn a_dropped_commitment_is_absent_from_the_reveal() {
        let coordinator = [3; 32];
        let parties = [key(1), key(2), key(3)];
        let mut r = reveal_of(9, coordinator, &parties);
        assert_eq!(inclusion(&r, &key(1).public()), Inclusion::Contributed);
        // Committed, not revealed: withheld, in the open.
        let late = r.contributions.remove(1);
        r.withheld.push(late.commit.clone());
        assert_eq!(inclusion(&r, &late.commit.body.party), Inclusion::Withheld);
        // Acknowledged and dropped: in neither list, though the reveal itself holds.
        r.withheld.clear();
        let map = r.contributions.iter().map(|c| (c.commit.body.party, c.secret)).collect();
        r.challenge = mix(&NET, 9, &coordinator, &map).0;
        assert!(check_reveal(&r, &NET, &challenge_commitment(9, &coordinator)).is_ok());
        assert_eq!(inclusion(&r, &late.commit.body.party), Inclusion::Absent);
    }

    proptest! {
        #[test]
        fn the_challenge_changes_with_any_contribution_and_not_with_order(
            coordinator in any::<[u8; 32]>(),
            window in any::<u64>(),
            entries in proptest::collection::vec((any::<[u8; 32]>(), any::<[u8; 32]>()), 1..8),
            which in any::<prop::sample::Index>(),
            flip in 0usize..256,
            rotate in any::<prop::sample::Index>(),
        ) {
            let entries: Vec<(PublicKey, [u8; 32])> = entries.into_iter().map(|(k, s)| (PublicKey(k), s)).collect();
            let map: BTreeMap<PublicKey, [u8; 32]> = entries.iter().copied().collect();
            let base = mix(&NET, window, &coordinator, &map);
            // Any arrival order: the same map, the same challenge.
            let mut rotated = entries.clone();
            let n = rotated.len();
            rotated.rotate_left(rotate.index(n));
            rotated.reverse();
            prop_assert_eq!(mix(&NET, window, &coordinator, &rotated.into_iter().collect()), base);
            // Any one bit of any one contribution changes it.
            let (party, _) = *which.get(&map.iter().map(|(k, s)| (*k, *s)).collect::<Vec<_>>());
            let mut changed = map.clone();
            if let Some(s) = changed.get_mut(&party) {
                s[flip / 8] ^= 1 << (flip % 8);
            }
            prop_assert_ne!(mix(&NET, window, &coordinator, &changed), base);
            // Leaving one out changes it.
            let mut fewer = map.clone();
            fewer.remove(&party);
            prop_assert_ne!(mix(&NET, window, &coordinator, &fewer), base);
            // So does the coordinator's secret.
            let mut other = coordinator;
            other[flip / 8] ^= 1 << (flip % 8);
            prop_assert_ne!(mix(&NET, window, &other, &map), base);
        }
    }
}
