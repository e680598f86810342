//! The coordinator's sans-IO core: window clock, assignment, admission rules,
//! verdicts, weights and bans. It is fed decoded events and the current time
//! and never touches a socket, a disk or a clock; the QUIC server and the redb
//! store wrap it.
//!
//! Admission of a rollout is two-phase so that an acknowledgement is only sent
//! once the rollout is durable: [`Core::admit`] runs every door check and
//! reserves the rollout's slot and digest (so a concurrent duplicate is
//! refused); the caller stores it and then calls [`Core::commit`], or
//! [`Core::abort`] if storing failed.
//!
//! Dedupe at the door is per slot and per signed bytes only: two rollouts of
//! one honest miner may share a completion. Copies *across* miners are judged
//! by validators, whose proofs tell the owner (its assignment and seeded
//! draws) from the copier; the door cannot, since anyone may recompute an
//! honest miner's rollout and race it in.
//!
//! Door failures that only the authenticated miner itself can cause (a bad
//! signature over its own key, a stale checkpoint) fail the miner's window
//! like a validator's hard verdict ([`Core::door_penalty`]).
//!
//! Weights are published per interval: the document of window `W` (weights
//! over the windows ending at `W`) is due once `W + 1` has ended, since
//! validators check `W` during `W + 1` ([`Core::weights_interval`]). Only the
//! configured trainer key's step reports are taken ([`Core::check_trainer_stats`]).

mod admission;
mod assignment;
mod banning;
mod challenge;
mod trainer_stats;
mod verdicts;
mod weights;
mod windows;

pub use admission::{Candidate, PROVEN_REFRESH_MS, Shape, Submitted};
pub use banning::SOFT_BAN_PROBABILITY;
pub use challenge::{BEACON_COMMIT_AHEAD, BeaconBook, BeaconRefusal, MIN_REVEAL_MS, WITHHOLD_LIMIT};
pub use trainer_stats::StatsError;
pub use verdicts::VerdictError;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;
use tributary_protocol::assign;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::SamplingParams;
use tributary_protocol::window::{Schedule, WindowId};
use tributary_protocol::wire::{Role, VerdictBody};

use crate::bans::Tribunal;

use admission::WindowBook;

/// Who may do what.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// If set, only these keys may mine.
    pub miner_allow: Option<HashSet<PublicKey>>,
    /// These keys may not mine.
    pub miner_deny: HashSet<PublicKey>,
    /// Keys allowed to post verdicts.
    pub validators: HashSet<PublicKey>,
    /// The one key allowed to publish checkpoints.
    pub trainer: Option<PublicKey>,
}

impl Access {
    /// Whether `key` may take `role`.
    pub fn permits(&self, role: Role, key: &PublicKey) -> bool {
        match role {
            Role::Miner => {
                !self.miner_deny.contains(key) && self.miner_allow.as_ref().is_none_or(|allow| allow.contains(key))
            }
            Role::Validator => self.validators.contains(key),
            Role::Trainer => self.trainer.as_ref() == Some(key),
        }
    }
}

/// Parameters of the core.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The window clock.
    pub schedule: Schedule,
    /// Master secret from which every window's seed and challenge derive.
    pub master: [u8; 32],
    /// Active environment.
    pub env: EnvId,
    /// Groups each miner may submit per window.
    pub groups_per_miner: u32,
    /// Rollouts per group.
    pub group_size: u32,
    /// Sampling parameters every rollout must carry (the generation contract).
    pub sampling: SamplingParams,
    /// Longest prompt, in tokens, a rollout may carry (the generation contract).
    pub max_prompt_tokens: u32,
    /// The model's vocabulary size when known: every token id must be below it.
    pub vocab_size: Option<u32>,
    /// Rollout bytes stored per window, all miners together: past it,
    /// submissions are refused (`rate_limited`) until the next window.
    pub max_window_bytes: u64,
    /// Distinct miners storing rollouts per window: a key past it is refused
    /// (`rate_limited`); bounds what each window's verdicts and standing list.
    pub max_window_miners: u32,
    /// Difficulty of the procedural environments.
    pub difficulty: u32,
    /// blake3 of the environment's dataset file (gsm8k), if any.
    pub dataset: Option<[u8; 32]>,
    /// How every role scores completions (announced with each window).
    pub reward: tributary_protocol::env::RewardRule,
    /// The checkpoint in force before any is published.
    pub genesis_checkpoint: ContentId,
    /// Who may do what.
    pub access: Access,
    /// Windows a hard failure bans a miner for.
    pub ban_windows: u64,
    /// 0 (the default): soft failures are a statistic, they neither ban nor
    /// lower a weight (docs/calibration.md §5b: the distribution check fails
    /// 5–23 % of honest rollouts depending on the task, and proves nothing
    /// the exact sampling check at every position does not). Above 0: the
    /// fewest soft failures in one verdict that count as a hard failure, which
    /// the binomial gate ([`SOFT_BAN_PROBABILITY`]) raises for the number of
    /// rollouts checked, and soft failures beyond an honest miner's rate
    /// lower the weight.
    pub soft_failure_threshold: u32,
    /// Windows the weights look back over (grail: 12).
    pub weight_windows: u64,
    /// Valid rollouts per window counted at most (grail: 5000).
    pub unique_cap_per_window: u64,
    /// Superlinear exponent (grail: 4).
    pub weight_exponent: i32,
    /// Validators judging each miner per window ([`tributary_protocol::assign`]).
    pub committee: u32,
    /// Rollouts each validator proves per window at most (its assigned share).
    pub validator_budget: u32,
    /// How long after a window's submissions close a committed contribution
    /// to its challenge may still be revealed ([`Core::challenge`]).
    pub reveal_ms: u64,
}

/// What the core knows of one miner.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MinerStats {
    /// Rollouts acknowledged.
    pub accepted: u64,
    /// Rollouts refused, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Banned through this window (inclusive), if ever.
    pub banned_through: Option<WindowId>,
    /// Windows with a hard failure (within the span bans and weights read).
    pub failures: Vec<WindowId>,
    /// The latest window the miner stored or was refused in ([`Core::prune`]
    /// forgets a key idle past every rule's reach).
    #[serde(skip)]
    pub last_window: WindowId,
}

/// Entries in the core's books ([`Core::footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Footprint {
    /// Windows with admission books.
    pub books: usize,
    /// Keys, slots and digests in those books.
    pub book_keys: usize,
    /// Keys with statistics.
    pub miners: usize,
    /// Failure windows kept per key, in all.
    pub failures: usize,
    /// Verdicts kept.
    pub verdicts: usize,
    /// Verdicts set aside.
    pub set_aside: usize,
    /// Claims and trainer verdicts the tribunal keeps.
    pub tribunal: usize,
    /// (window, miner) summaries of stored work.
    pub submitted: usize,
    /// Windows with beacon records.
    pub beacon: usize,
    /// Disputed (window, miner) pairs.
    pub disputed: usize,
    /// Committee duties cached.
    pub committees: usize,
}

/// The sans-IO coordinator.
#[derive(Debug)]
pub struct Core {
    cfg: CoreConfig,
    /// Checkpoint in force from a window on.
    checkpoints: BTreeMap<WindowId, ContentId>,
    books: BTreeMap<WindowId, WindowBook>,
    miners: HashMap<PublicKey, MinerStats>,
    /// (window, miner) → validator → verdict (the coordinator's own
    /// included; the trainer's and flagged validators' are elsewhere).
    verdicts: BTreeMap<(WindowId, PublicKey), BTreeMap<PublicKey, VerdictBody>>,
    /// Flagged validators' verdicts, set aside until an operator clears them.
    set_aside: BTreeMap<(WindowId, PublicKey), BTreeMap<PublicKey, VerdictBody>>,
    /// Evidence, confirmations and refutations ([`crate::bans`]).
    tribunal: Tribunal,
    /// The coordinator's own key (its door penalties and re-checks confirm a failure).
    coordinator: Option<PublicKey>,
    /// (window, miner) → what it stored: what the assignment and the weights
    /// are computed from, kept for the windows the weights look back on.
    submitted: BTreeMap<(WindowId, PublicKey), Submitted>,
    rejected_anonymous: BTreeMap<&'static str, u64>,
    /// The latest instant the core was told of: a window that opened by then
    /// may have been handed out, so no publication may change its checkpoint.
    clock: Cell<u64>,
    /// [`Core::soft_ban_threshold`] by rollouts checked: the binomial gate
    /// costs O(checked²) logarithms and every standing and weights query
    /// asks it once per verdict (at most [`MAX_MEMO_THRESHOLDS`] kept).
    soft_thresholds: RefCell<HashMap<u32, u32>>,
    /// Window → contributions to its challenge.
    beacon: BTreeMap<WindowId, BeaconBook>,
    /// Window → miner → its duty (committee and groups), once the window's
    /// challenge is fixed (what [`Core::confirmed`] asks for every failing verdict).
    committees: RefCell<BTreeMap<WindowId, BTreeMap<PublicKey, assign::Duty>>>,
    /// (window, miner) pairs a validator's failing verdict claims: where
    /// [`Core::confirmations`] looks for failures waiting for a second opinion.
    disputed: BTreeSet<(WindowId, PublicKey)>,
    /// Whether the coordinator re-checks model-free evidence itself (the
    /// server's [`crate::bans::Rechecker`]); if not, that evidence also
    /// waits for a confirmer.
    model_free_recheck: bool,
    /// Party → the last window whose withheld reveal an operator cleared.
    withhold_cleared: BTreeMap<PublicKey, WindowId>,
    /// Windows whose withheld contributions were logged.
    withheld_logged: RefCell<BTreeSet<WindowId>>,
    /// The keys admission reserves slots for, cached ([`Core::proven_miners`]).
    proven: RefCell<Option<admission::ProvenKeys>>,
}

impl Core {
    /// A fresh core.
    pub fn new(cfg: CoreConfig) -> Self {
        let mut checkpoints = BTreeMap::new();
        checkpoints.insert(0, cfg.genesis_checkpoint);
        Self {
            cfg,
            checkpoints,
            books: BTreeMap::new(),
            miners: HashMap::new(),
            verdicts: BTreeMap::new(),
            set_aside: BTreeMap::new(),
            tribunal: Tribunal::default(),
            coordinator: None,
            submitted: BTreeMap::new(),
            rejected_anonymous: BTreeMap::new(),
            clock: Cell::new(0),
            soft_thresholds: RefCell::new(HashMap::new()),
            beacon: BTreeMap::new(),
            committees: RefCell::new(BTreeMap::new()),
            withheld_logged: RefCell::new(BTreeSet::new()),
            disputed: BTreeSet::new(),
            model_free_recheck: true,
            withhold_cleared: BTreeMap::new(),
            proven: RefCell::new(None),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// The window clock.
    pub fn schedule(&self) -> &Schedule {
        &self.cfg.schedule
    }

    /// Who may do what.
    pub fn access(&self) -> &Access {
        &self.cfg.access
    }

    /// Per-miner statistics.
    pub fn miners(&self) -> &HashMap<PublicKey, MinerStats> {
        &self.miners
    }

    /// Forgets what no rule reads any more: admission books of windows
    /// that can no longer take submissions, and verdicts, claims, beacon
    /// records, committees, stored-work summaries and per-key statistics of
    /// windows (and keys idle since then) older than every ban and weight
    /// reaches. Called at start and as windows close (the server's upkeep,
    /// every 30 s), so the core's memory is bounded by the span its rules
    /// read, not by how long it runs or how many keys ever knocked (issue 29
    /// item 5; [`Core::footprint`]).
    pub fn prune(&mut self, now_ms: u64) {
        self.observe(now_ms);
        let s = self.cfg.schedule;
        self.books.retain(|w, _| s.closes_at(*w) > now_ms);
        // Proofs and claims matter while a window's verdicts may still come.
        let current = self.current_window(now_ms).unwrap_or(0);
        let horizon = current.saturating_sub(self.cfg.ban_windows.max(self.cfg.weight_windows) + 2);
        self.tribunal.prune(horizon);
        // Verdicts older than every window a ban or a weight still reads
        // stay in the store (the dashboard reads them there), not in memory:
        // without this the core grows by every verdict of every window.
        self.verdicts.retain(|(w, _), _| *w >= horizon);
        self.set_aside.retain(|(w, _), _| *w >= horizon);
        self.beacon.retain(|w, _| *w >= horizon);
        self.disputed.retain(|(w, _)| *w >= horizon);
        self.committees.borrow_mut().retain(|w, _| *w >= horizon);
        self.withheld_logged.borrow_mut().retain(|w| *w >= horizon);
        // What was stored (counts, whole groups, digest fingerprints) as long as
        // the verdicts: their evidence and committees are read from it
        // (`Core::holds`, `Core::duty`; issue 28), and the weights of window `W`
        // look back `weight_windows` windows from `W`.
        self.submitted.retain(|(w, _), _| *w >= horizon);
        // Keys: a Sybil wave leaves one entry per key it refused; a key idle
        // since before the horizon and not banned any more is forgotten.
        self.miners.retain(|_, m| {
            m.failures.retain(|w| *w >= horizon);
            m.last_window >= horizon || m.banned_through.is_some_and(|t| t >= current)
        });
        self.miners.shrink_to_fit();
        *self.proven.borrow_mut() = None;
    }

    /// How many entries the core's books hold, map by map: what
    /// [`Core::prune`] bounds (tests check it stays flat over hundreds of
    /// windows).
    pub fn footprint(&self) -> Footprint {
        Footprint {
            books: self.books.len(),
            book_keys: self.books.values().map(|b| b.slots.len() + b.miner_bytes.len() + b.digests.len()).sum(),
            miners: self.miners.len(),
            failures: self.miners.values().map(|m| m.failures.len()).sum(),
            verdicts: self.verdicts.values().map(BTreeMap::len).sum(),
            set_aside: self.set_aside.values().map(BTreeMap::len).sum(),
            tribunal: self.tribunal.len(),
            submitted: self.submitted.len(),
            beacon: self.beacon.len(),
            disputed: self.disputed.len(),
            committees: self.committees.borrow().values().map(BTreeMap::len).sum(),
        }
    }

    /// Rejections not tied to an authenticated miner.
    pub fn anonymous_rejections(&self) -> &BTreeMap<&'static str, u64> {
        &self.rejected_anonymous
    }
}

#[cfg(test)]
mod tests;
