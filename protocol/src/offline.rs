//! Offline runs (`edge-miner generate`, `validator check`): the window
//! randomness and miner identity that a seed `S` stands in for when there is
//! no coordinator. Miner and validator must derive them identically, so both
//! call [`OfflineWindow::from_seed`].
//!
//! - master secret = `blake3::derive_key(OFFLINE_MASTER_CONTEXT, S as u64 LE)`;
//!   the window's secrets are window 0's [`WindowSecrets::derive`] of that
//!   master: its seed drives tasks, sampling draws and sketch coefficients,
//!   its challenge secret the challenged positions;
//! - the miner key is the ed25519 key whose secret seed is
//!   `blake3::derive_key(OFFLINE_MINER_CONTEXT, S as u64 LE)`.

use std::path::PathBuf;

use crate::env::{EnvId, EnvSpec};
use crate::identity::Keypair;
use crate::window::WindowSecrets;

/// blake3 key-derivation context of an offline run's master secret.
pub const OFFLINE_MASTER_CONTEXT: &str = crate::domain::context::OFFLINE_MASTER;
/// blake3 key-derivation context of an offline run's miner key.
pub const OFFLINE_MINER_CONTEXT: &str = crate::domain::context::OFFLINE_MINER;

/// The window secrets and miner key of an offline run.
#[derive(Clone)]
pub struct OfflineWindow {
    /// The seed `S` the run stands for.
    pub seed: u64,
    /// Window 0's seed (= sampling seed) and challenge secret.
    pub secrets: WindowSecrets,
    /// The miner's key.
    pub miner: Keypair,
}

impl std::fmt::Debug for OfflineWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineWindow")
            .field("seed", &self.seed)
            .field("secrets", &self.secrets)
            .field("miner", &self.miner.public())
            .finish()
    }
}

impl OfflineWindow {
    /// The secrets and miner key for seed `seed` (module docs).
    pub fn from_seed(seed: u64) -> Self {
        let master = blake3::derive_key(OFFLINE_MASTER_CONTEXT, &seed.to_le_bytes());
        let secrets = WindowSecrets::derive(&master, 0);
        let miner = Keypair::from_seed(blake3::derive_key(OFFLINE_MINER_CONTEXT, &seed.to_le_bytes()));
        Self { seed, secrets, miner }
    }
}

/// One rollout as `edge-miner generate` writes it and `validator check`
/// reads it: one JSON object per line, byte arrays as hex. Readers ignore
/// unknown fields; the fields after `sketches` are informative.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RolloutRecord {
    /// The environment.
    pub env: EnvId,
    /// The task seed (`task_seed(window_seed, miner, group)`).
    pub task_id: u64,
    /// Group index (the task's index in the run).
    pub group: u32,
    /// Rollout index within the group.
    pub rollout: u32,
    /// Window (= sampling) seed, hex.
    pub window_seed: String,
    /// Miner public key, hex.
    pub miner: String,
    /// Content id of the model checkpoint, hex, when known.
    #[serde(default)]
    pub model: Option<String>,
    /// Sampling temperature.
    pub temperature: f32,
    /// All token ids, prompt first.
    pub tokens: Vec<u32>,
    /// Number of prompt tokens at the start of `tokens`.
    pub prompt_len: usize,
    /// Raw (T = 1) log-probability of each completion token.
    pub logprobs: Vec<f32>,
    /// Sketch of the hidden state at every position (`tokens.len()` entries).
    pub sketches: Vec<u32>,
    /// Whether the rollout ended with an end-of-generation token.
    #[serde(default)]
    pub eog: bool,
    /// Completion text (without the final end-of-generation token).
    #[serde(default)]
    pub completion: String,
    /// The environment's reward for the completion.
    pub reward: f32,
    /// The settings the rollout was generated with (absent in records
    /// written before they were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<GenerateSettings>,
}

/// The settings of an offline run, recorded in each of its rollouts so that
/// `validator check` derives the same tasks and contract without being told
/// them again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GenerateSettings {
    /// The environment.
    pub env: EnvId,
    /// Difficulty of the procedural environments (arith).
    pub difficulty: u32,
    /// The data file the environment drew from (gsm8k), absolute.
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// blake3 of that file.
    #[serde(default, with = "hex32")]
    pub dataset: Option<[u8; 32]>,
    /// How completions were scored (records written before the rule was
    /// recorded were scored leniently).
    #[serde(default = "crate::env::RewardRule::legacy")]
    pub reward: crate::env::RewardRule,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most completion tokens per rollout.
    pub max_new_tokens: u32,
    /// The seed `S` of the run.
    pub seed: u64,
}

impl GenerateSettings {
    /// The settings that pick the environment.
    pub fn env_spec(&self) -> EnvSpec {
        EnvSpec { env: self.env, difficulty: self.difficulty, dataset: self.dataset, reward: self.reward }
    }
}

/// `Option<[u8; 32]>` as a hex string (or null).
mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_some(&hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|h| crate::identity::decode_hex::<32>(&h).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_deterministic_and_distinct() {
        let (a, b) = (OfflineWindow::from_seed(7), OfflineWindow::from_seed(7));
        assert!(a.secrets == b.secrets);
        assert_eq!(a.miner.public().as_bytes(), b.miner.public().as_bytes());
        let c = OfflineWindow::from_seed(8);
        assert_ne!(a.secrets.seed, c.secrets.seed);
        assert_ne!(a.secrets.seed, a.secrets.challenge);
        assert_ne!(a.miner.public().as_bytes(), c.miner.public().as_bytes());
    }

    #[test]
    fn settings_round_trip_and_old_records_still_read() {
        let settings = GenerateSettings {
            env: EnvId::Gsm8k,
            difficulty: 102,
            data: Some("/data/gsm8k.jsonl".into()),
            dataset: Some([0xab; 32]),
            reward: crate::env::RewardRule::Format,
            temperature: 0.7,
            max_new_tokens: 96,
            seed: 5,
        };
        let json = serde_json::to_value(&settings).unwrap();
        assert_eq!(json["dataset"], serde_json::json!("ab".repeat(32)));
        assert_eq!(serde_json::from_value::<GenerateSettings>(json).unwrap(), settings);
        let old = serde_json::json!({
            "env": "arith", "task_id": 1, "group": 0, "rollout": 0, "window_seed": "00", "miner": "00",
            "temperature": 0.7, "tokens": [1, 2], "prompt_len": 1, "logprobs": [-0.1], "sketches": [0, 0],
            "reward": 0.0,
        });
        assert_eq!(serde_json::from_value::<RolloutRecord>(old).unwrap().settings, None);
    }
}
