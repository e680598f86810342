//! Every signing domain and every hash or key-derivation context of the
//! protocol, in one registry.
//!
//! A string here separates one use of a key or hash from every other, so two
//! entries must never be equal (a test checks the whole registry). Signing
//! domains are `tributary/<what>/v<N>`; blake3 key-derivation contexts follow
//! blake3's advice (`"<app> <year> <purpose> v<N>"`). Changing a value is a
//! protocol change: bump its version.

/// Signing domains: prefixed to a message before ed25519 signs it
/// ([`crate::identity::Keypair::sign`]).
pub mod sign {
    /// A miner's signature over `Rollout::signing_bytes()`.
    pub const ROLLOUT: &str = "tributary/rollout/v1";
    /// A peer's proof of key possession in the connection handshake.
    pub const HANDSHAKE: &str = "tributary/handshake/v1";
    /// The coordinator's proof, in each handshake, that it holds the key it
    /// names (a client checks it against the key it pinned).
    pub const COORDINATOR_HANDSHAKE: &str = "tributary/coordinator-handshake/v1";
    /// A validator's verdict on one miner's rollouts in one window.
    pub const VERDICT: &str = "tributary/verdict/v1";
    /// The coordinator's weights document.
    pub const WEIGHTS: &str = "tributary/weights/v1";
    /// The trainer's announcement of a checkpoint (distinct from the content
    /// id's hash context, [`super::context::CONTENT_ID`]).
    pub const CHECKPOINT: &str = "tributary/checkpoint-announcement/v1";
    /// The trainer's report of one training step (loss, reward, delta figures).
    pub const TRAINER_STATS: &str = "tributary/trainer-stats/v1";
    /// A validator's or the trainer's commitment to its contribution to a
    /// window's challenge ([`crate::beacon`]).
    pub const BEACON_COMMIT: &str = "tributary/beacon-commit/v1";
    /// The signature a party's contribution secret is derived from (never
    /// published; deterministic, so a restart re-derives the same secret).
    pub const BEACON_SECRET: &str = "tributary/beacon-secret/v1";
    /// The coordinator's manifest of a window archived in the object store.
    pub const WINDOW_MANIFEST: &str = "tributary/window-manifest/v1";
}

/// Hash and key-derivation contexts.
pub mod context {
    /// The protocol's PRF ([`crate::prf`]).
    pub const PRF: &str = "tributary 2025 prf v1";
    /// A network's id from its coordinator's key ([`crate::wire::NetworkId`]).
    pub const NETWORK_ID: &str = "tributary 2025 network id v1";
    /// A window's public seed from the master secret ([`crate::window`]).
    pub const WINDOW_SEED: &str = "tributary 2025 window seed v1";
    /// A window's challenge secret from the master secret.
    pub const CHALLENGE_SECRET: &str = "tributary 2025 window challenge secret v1";
    /// The commitment to a window's challenge secret.
    pub const CHALLENGE_COMMIT: &str = "tributary 2025 window challenge commitment v1";
    /// A checkpoint's content id (hashed as a length-prefixed string, [`crate::checkpoint`]).
    pub const CONTENT_ID: &str = "tributary/checkpoint/v1";
    /// The master secret an offline seed stands for ([`crate::offline`]).
    pub const OFFLINE_MASTER: &str = "tributary 2025 offline generate master v1";
    /// The miner key an offline seed stands for.
    pub const OFFLINE_MINER: &str = "tributary 2025 offline generate miner key v1";
    /// The `--dev` role keys ([`crate::dev`]).
    pub const DEV_KEY: &str = "tributary 2025 dev role key v1";
    /// Which rollouts of a miner a validator samples.
    pub const VALIDATOR_SAMPLE: &str = "tributary 2025 validator sample v1";
    /// Which groups of a miner a validator samples.
    pub const VALIDATOR_GROUP_SAMPLE: &str = "tributary 2025 validator group sample v1";
    /// The problem-level train/test split of the procedural environments.
    pub const PROBLEM_SPLIT: &str = "tributary 2025 problem split v1";
    /// The QUIC stateless-reset key of an endpoint.
    pub const QUIC_STATELESS_RESET: &str = "tributary 2025 quic stateless reset v1";
    /// Validator committees and the groups they prove ([`crate::assign`]).
    pub const VALIDATOR_ASSIGNMENT: &str = "tributary 2025 validator assignment v1";
    /// A party's contribution secret from its signature ([`crate::beacon`]).
    pub const BEACON_SECRET: &str = "tributary 2025 beacon contribution secret v1";
    /// The commitment to a party's contribution.
    pub const BEACON_COMMIT: &str = "tributary 2025 beacon contribution commitment v1";
    /// A window's challenge from the coordinator's secret and the revealed contributions.
    pub const WINDOW_CHALLENGE: &str = "tributary 2025 window challenge v1";
}

/// The whole registry, by name: what the uniqueness test walks.
pub const ALL: &[(&str, &str)] = &[
    ("sign::ROLLOUT", sign::ROLLOUT),
    ("sign::HANDSHAKE", sign::HANDSHAKE),
    ("sign::VERDICT", sign::VERDICT),
    ("sign::WEIGHTS", sign::WEIGHTS),
    ("sign::CHECKPOINT", sign::CHECKPOINT),
    ("sign::TRAINER_STATS", sign::TRAINER_STATS),
    ("context::PRF", context::PRF),
    ("context::WINDOW_SEED", context::WINDOW_SEED),
    ("context::CHALLENGE_SECRET", context::CHALLENGE_SECRET),
    ("context::CHALLENGE_COMMIT", context::CHALLENGE_COMMIT),
    ("sign::COORDINATOR_HANDSHAKE", sign::COORDINATOR_HANDSHAKE),
    ("context::NETWORK_ID", context::NETWORK_ID),
    ("context::CONTENT_ID", context::CONTENT_ID),
    ("context::OFFLINE_MASTER", context::OFFLINE_MASTER),
    ("context::OFFLINE_MINER", context::OFFLINE_MINER),
    ("context::DEV_KEY", context::DEV_KEY),
    ("context::VALIDATOR_SAMPLE", context::VALIDATOR_SAMPLE),
    ("context::VALIDATOR_GROUP_SAMPLE", context::VALIDATOR_GROUP_SAMPLE),
    ("context::PROBLEM_SPLIT", context::PROBLEM_SPLIT),
    ("context::QUIC_STATELESS_RESET", context::QUIC_STATELESS_RESET),
    ("context::VALIDATOR_ASSIGNMENT", context::VALIDATOR_ASSIGNMENT),
    ("sign::BEACON_COMMIT", sign::BEACON_COMMIT),
    ("sign::BEACON_SECRET", sign::BEACON_SECRET),
    ("context::BEACON_SECRET", context::BEACON_SECRET),
    ("context::BEACON_COMMIT", context::BEACON_COMMIT),
    ("context::WINDOW_CHALLENGE", context::WINDOW_CHALLENGE),
    ("sign::WINDOW_MANIFEST", sign::WINDOW_MANIFEST),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn every_domain_and_context_is_unique() {
        let mut seen = BTreeMap::new();
        for (name, value) in ALL {
            if let Some(other) = seen.insert(*value, *name) {
                panic!("{name} and {other} share the string {value:?}");
            }
        }
    }

    #[test]
    fn the_registry_lists_every_constant() {
        // A constant added to a module but not to ALL escapes the uniqueness
        // test: count the `pub const` items of this file's two modules.
        let src = include_str!("domain.rs");
        let body = &src[..src.find("pub const ALL").expect("ALL")];
        let consts = body.lines().filter(|l| l.trim_start().starts_with("pub const ")).count();
        assert_eq!(consts, ALL.len(), "every constant of sign:: and context:: is listed in ALL");
    }

    #[test]
    fn every_string_names_the_project_and_a_version() {
        for (name, value) in ALL {
            let version = value.rsplit(['/', ' ']).next().unwrap_or_default();
            assert!(value.starts_with("tributary"), "{name} = {value:?}");
            assert!(
                version.len() > 1 && version.starts_with('v') && version[1..].chars().all(|c| c.is_ascii_digit()),
                "{name} = {value:?} ends in a version"
            );
        }
    }
}
