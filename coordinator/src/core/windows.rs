//! The window clock as the core sees it: windows' public parameters, their
//! secrets and challenges' timing, and the checkpoint each window uses.

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::prf::Seed;
use tributary_protocol::window::{WindowId, WindowSecrets};
use tributary_protocol::wire::{CheckpointBody, NetworkId, WindowInfo};

use super::*;

impl Core {
    /// The window in progress at `now_ms`.
    pub fn current_window(&self, now_ms: u64) -> Option<WindowId> {
        self.cfg.schedule.window_at(now_ms)
    }

    /// The secrets of a window.
    pub fn secrets(&self, window: WindowId) -> WindowSecrets {
        WindowSecrets::derive(&self.cfg.master, window)
    }

    /// The checkpoint miners must use in `window`.
    pub fn checkpoint_for(&self, window: WindowId) -> ContentId {
        self.checkpoints.range(..=window).next_back().map(|(_, id)| *id).unwrap_or(self.cfg.genesis_checkpoint)
    }

    /// Notes that the caller's clock has reached `now_ms` (the core's time never goes back).
    pub(super) fn observe(&self, now_ms: u64) -> u64 {
        let t = self.clock.get().max(now_ms);
        self.clock.set(t);
        t
    }

    /// A window's public parameters, once it has opened.
    pub fn window_info(&self, window: WindowId, now_ms: u64) -> Option<WindowInfo> {
        let s = &self.cfg.schedule;
        if now_ms < s.opens_at(window) {
            return None;
        }
        self.observe(now_ms);
        let secrets = self.secrets(window);
        Some(WindowInfo {
            window,
            opens_at_ms: s.opens_at(window),
            closes_at_ms: s.closes_at(window),
            seed: secrets.seed,
            commitment: secrets.commitment(),
            checkpoint: self.checkpoint_for(window),
            env: self.cfg.env,
            groups_per_miner: self.cfg.groups_per_miner,
            group_size: self.cfg.group_size,
            sampling: self.cfg.sampling,
            difficulty: self.cfg.difficulty,
            dataset: self.cfg.dataset,
            reward: self.cfg.reward,
        })
    }

    /// Whether `window`'s submissions have closed at `now_ms`.
    pub fn closed(&self, window: WindowId, now_ms: u64) -> bool {
        now_ms >= self.cfg.schedule.closes_at(window)
    }

    /// `window`'s challenge, once fixed ([`Core::challenge_fixed`]): the
    /// coordinator's secret mixed with every contribution revealed
    /// ([`beacon::mix`]). What the assignment and the challenged positions use.
    pub fn reveal(&self, window: WindowId, now_ms: u64) -> Option<Seed> {
        self.challenge_fixed(window, now_ms).then(|| self.mixed_challenge(window))
    }

    /// The network the coordinator's key names (what contributions are signed for).
    pub fn network(&self) -> NetworkId {
        self.coordinator.map_or(NetworkId([0; 32]), |k| NetworkId::of(&k))
    }

    /// The first window a checkpoint announced now would be in force from:
    /// the window after `body.window`, or the first window that has not
    /// opened by `now_ms` (nor by any instant the core was told of earlier),
    /// whichever is later. A window that has opened keeps its checkpoint.
    pub fn checkpoint_from(&self, now_ms: u64, body: &CheckpointBody) -> WindowId {
        let now = self.clock.get().max(now_ms);
        let current = self.current_window(now).unwrap_or(0);
        body.window.max(current).saturating_add(1)
    }

    /// Records a checkpoint announcement (the caller checked the trainer's
    /// signature and stored the payload) from [`Core::checkpoint_from`].
    pub fn publish_checkpoint(&mut self, now_ms: u64, body: &CheckpointBody) -> WindowId {
        let from = self.checkpoint_from(now_ms, body);
        self.observe(now_ms);
        self.checkpoints.insert(from, body.id);
        from
    }

    /// Records a checkpoint announcement that the caller made durable as in
    /// force from `from`, if that is still [`Core::checkpoint_from`] at
    /// `now_ms` (the instant after it became durable). `false` if a window at
    /// or after `from` opened meanwhile: the caller stores it again with a
    /// later `from`.
    pub fn publish_checkpoint_from(&mut self, now_ms: u64, from: WindowId, body: &CheckpointBody) -> bool {
        if self.checkpoint_from(now_ms, body) != from {
            return false;
        }
        self.observe(now_ms);
        self.checkpoints.insert(from, body.id);
        true
    }

    /// Re-adds a checkpoint found in the store at startup.
    pub fn restore_checkpoint(&mut self, from: WindowId, id: ContentId) {
        self.checkpoints.insert(from, id);
    }
}
