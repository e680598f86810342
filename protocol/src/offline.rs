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

use crate::identity::Keypair;
use crate::window::WindowSecrets;

/// blake3 key-derivation context of an offline run's master secret.
pub const OFFLINE_MASTER_CONTEXT: &str = "tributary 2025 offline generate master v1";
/// blake3 key-derivation context of an offline run's miner key.
pub const OFFLINE_MINER_CONTEXT: &str = "tributary 2025 offline generate miner key v1";

/// The window secrets and miner key of an offline run.
#[derive(Clone)]
pub struct OfflineWindow {
    /// Window 0's seed (= sampling seed) and challenge secret.
    pub secrets: WindowSecrets,
    /// The miner's key.
    pub miner: Keypair,
}

impl std::fmt::Debug for OfflineWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineWindow")
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
        Self { secrets, miner }
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
}
