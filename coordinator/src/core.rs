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

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use tributary_protocol::assign;
use tributary_protocol::beacon;
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::{EnvId, task_seed};
use tributary_protocol::identity::PublicKey;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::SamplingParams;
use tributary_protocol::verify;
use tributary_protocol::window::{Schedule, WindowId, WindowSecrets};
use tributary_protocol::wire::{
    BeaconCommit, BeaconReveal, CheckpointBody, Confirmation, Confirmations, Contribution, MAX_CONFIRMATION_DIGESTS,
    MAX_CONFIRMATION_GROUPS, MAX_CONFIRMATIONS_PAGE, MinerStanding, NetworkId, RejectReason, Reveal, Role,
    TrainerStatsBody, TrainerStatsError, VerdictBody, WeightsBody, WindowInfo,
};

use crate::bans::{Party, Tribunal, ValidatorStatus};

/// The most probability with which an honest miner may be banned by one
/// verdict's soft failures (issue 15: soft checks never ban an honest miner).
pub const SOFT_BAN_PROBABILITY: f64 = 1e-6;

/// Distinct checked counts whose soft-ban threshold the core remembers.
const MAX_MEMO_THRESHOLDS: usize = 4096;

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

/// Windows ahead of the current one a contribution may be committed for
/// (a party commits early so a long verification cannot make it miss the close).
pub const BEACON_COMMIT_AHEAD: u64 = 2;

/// The shortest reveal period a node gives contributions (its grace, if longer).
pub const MIN_REVEAL_MS: u64 = 2_000;

/// Withheld reveals in a row after which a party is *withholding*
/// ([`Core::withholding`]): its commitments are refused and a validator's
/// verdicts are set aside until an operator clears it or the withheld
/// windows leave the kept span. One more than a crash can cause: a party
/// commits at most [`BEACON_COMMIT_AHEAD`] windows ahead of the one it is
/// in, so a party that stops withholds at most that many plus one in a row.
pub const WITHHOLD_LIMIT: usize = BEACON_COMMIT_AHEAD as usize + 2;

/// One window's commitments to, and reveals of, contributions to its
/// challenge ([`tributary_protocol::beacon`]); what the store keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BeaconBook {
    /// Signed commitments, by party.
    pub commits: BTreeMap<PublicKey, BeaconCommit>,
    /// Secrets revealed in time, by party (each opens its commitment).
    pub reveals: BTreeMap<PublicKey, [u8; 32]>,
}

impl BeaconBook {
    /// Parties that committed and have not revealed.
    pub fn unrevealed(&self) -> impl Iterator<Item = &PublicKey> {
        self.commits.keys().filter(|k| !self.reveals.contains_key(k))
    }
}

/// Why a commitment or a reveal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BeaconRefusal {
    /// The signer is neither a configured validator nor the trainer.
    #[error("not a configured validator or the trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A commitment after the window's submissions closed.
    #[error("the window's submissions have closed")]
    Closed,
    /// A commitment too far ahead of the current window.
    #[error("more than {BEACON_COMMIT_AHEAD} windows ahead")]
    TooEarly,
    /// Another commitment of this party for this window is recorded.
    #[error("another commitment for this window is recorded")]
    Conflict,
    /// A reveal before the window's submissions closed.
    #[error("the window's submissions have not closed")]
    NotClosed,
    /// A reveal without a commitment.
    #[error("no commitment for this window")]
    NotCommitted,
    /// A reveal after the window's challenge was fixed.
    #[error("the window's challenge is fixed")]
    Fixed,
    /// The party withheld its last [`WITHHOLD_LIMIT`] reveals in a row.
    #[error("withheld its last {WITHHOLD_LIMIT} reveals in a row: contributions refused until cleared")]
    Withholding,
    /// The secret does not open the commitment.
    #[error("the secret does not match the commitment")]
    Mismatch,
}

/// A decoded, signature-checked rollout's facts that the door checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Window claimed.
    pub window: WindowId,
    /// Checkpoint used.
    pub checkpoint: ContentId,
    /// Environment.
    pub env: EnvId,
    /// Group index within the miner's assignment.
    pub group: u32,
    /// Index within the group.
    pub index: u32,
    /// The task id the rollout claims.
    pub task_id: u64,
    /// The miner named in the rollout (its signer).
    pub miner: PublicKey,
    /// Digest of the whole rollout.
    pub digest: [u8; 32],
    /// Hash of the prompt and completion tokens (what cross-miner copies share).
    pub content: [u8; 32],
    /// What the generation contract is checked against.
    pub shape: Shape,
}

/// The facts of a rollout the window's generation contract bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Sampling parameters it claims.
    pub sampling: SamplingParams,
    /// Prompt tokens.
    pub prompt_len: u32,
    /// Completion tokens.
    pub completion_len: u32,
    /// Its largest token id.
    pub max_token: u32,
    /// Its encoded length (what it costs to store).
    pub bytes: u32,
}

impl Eq for Shape {}

impl Shape {
    /// The shape of a rollout restored from the store (admitted when it was
    /// stored; restoring checks nothing).
    pub const RESTORED: Shape = Shape {
        sampling: SamplingParams { temperature: 0.0, max_new_tokens: 0 },
        prompt_len: 0,
        completion_len: 0,
        max_token: 0,
        bytes: 0,
    };
}

/// What one miner stored in one window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Submitted {
    /// Rollouts stored.
    pub rollouts: u32,
    /// The groups they belong to.
    pub groups: BTreeSet<u32>,
}

/// Per-window bookkeeping.
#[derive(Debug, Default)]
struct WindowBook {
    digests: HashSet<[u8; 32]>,
    slots: HashMap<PublicKey, HashSet<(u32, u32)>>,
    /// Bytes of the rollouts reserved or stored.
    bytes: u64,
    /// Those bytes by miner (each key's share of the budget).
    miner_bytes: HashMap<PublicKey, u64>,
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
    /// Windows with a hard failure.
    pub failures: Vec<WindowId>,
}

/// Why a verdict was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerdictError {
    /// The signer is neither a configured validator nor the trainer.
    #[error("not a configured validator or the trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// The window's submissions have not closed.
    #[error("window not closed")]
    NotClosed,
    /// Inconsistent counts.
    #[error("valid exceeds checked")]
    Inconsistent,
}

/// Why a trainer's step report was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// The signer is not the configured trainer.
    #[error("not the configured trainer")]
    Unauthorized,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// The figures are not well formed.
    #[error("malformed report: {0}")]
    Malformed(#[from] TrainerStatsError),
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
    fn observe(&self, now_ms: u64) -> u64 {
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

    /// Whether `window`'s challenge is fixed at `now_ms`: its submissions
    /// have closed and every committed contribution is revealed, or the
    /// reveal period (`reveal_ms`) after the close has passed.
    pub fn challenge_fixed(&self, window: WindowId, now_ms: u64) -> bool {
        let closes = self.cfg.schedule.closes_at(window);
        if now_ms < closes {
            return false;
        }
        let all_in = self.beacon.get(&window).is_none_or(|b| b.unrevealed().next().is_none());
        all_in || now_ms >= closes.saturating_add(self.cfg.reveal_ms)
    }

    /// The mix of the coordinator's secret and the contributions revealed so far.
    fn mixed_challenge(&self, window: WindowId) -> Seed {
        let empty = BTreeMap::new();
        let reveals = self.beacon.get(&window).map_or(&empty, |b| &b.reveals);
        beacon::mix(&self.network(), window, &self.secrets(window).challenge.0, reveals)
    }

    /// What the coordinator alone could compute for `window`: the mix with
    /// no contribution (a network without validators, or before any reveal).
    pub fn coordinator_only_challenge(&self, window: WindowId) -> Seed {
        beacon::mix(&self.network(), window, &self.secrets(window).challenge.0, &BTreeMap::new())
    }

    /// Records a validator's or the trainer's signed commitment to its
    /// contribution to a window's challenge. `Ok(true)` if new (store it),
    /// `Ok(false)` if the same commitment was already recorded.
    pub fn record_commit(&mut self, now_ms: u64, c: &BeaconCommit, signature_ok: bool) -> Result<bool, BeaconRefusal> {
        let party = c.body.party;
        if !self.cfg.access.permits(Role::Validator, &party) && !self.cfg.access.permits(Role::Trainer, &party) {
            return Err(BeaconRefusal::Unauthorized);
        }
        if !signature_ok || c.network != self.network() {
            return Err(BeaconRefusal::BadSignature);
        }
        let w = c.body.window;
        if self.closed(w, now_ms) {
            return Err(BeaconRefusal::Closed);
        }
        if w > self.current_window(now_ms).unwrap_or(0).saturating_add(BEACON_COMMIT_AHEAD) {
            return Err(BeaconRefusal::TooEarly);
        }
        let known = self.beacon.get(&w).and_then(|b| b.commits.get(&party)).is_some();
        if !known && self.withholding(&party, now_ms) {
            return Err(BeaconRefusal::Withholding);
        }
        let book = self.beacon.entry(w).or_default();
        match book.commits.get(&party) {
            Some(old) if old.body.commitment == c.body.commitment => Ok(false),
            Some(_) => Err(BeaconRefusal::Conflict),
            None => {
                book.commits.insert(party, c.clone());
                Ok(true)
            }
        }
    }

    /// Records the authenticated `party`'s reveal of its contribution.
    /// `Ok(true)` if new (store it), `Ok(false)` if already recorded.
    pub fn record_reveal(&mut self, now_ms: u64, party: &PublicKey, r: &BeaconReveal) -> Result<bool, BeaconRefusal> {
        if !self.closed(r.window, now_ms) {
            return Err(BeaconRefusal::NotClosed);
        }
        let Some(commit) = self.beacon.get(&r.window).and_then(|b| b.commits.get(party)) else {
            return Err(BeaconRefusal::NotCommitted);
        };
        if !beacon::opens(commit, &r.secret) {
            return Err(BeaconRefusal::Mismatch);
        }
        if self.beacon.get(&r.window).is_some_and(|b| b.reveals.get(party) == Some(&r.secret)) {
            return Ok(false);
        }
        if self.challenge_fixed(r.window, now_ms) {
            return Err(BeaconRefusal::Fixed);
        }
        self.beacon.entry(r.window).or_default().reveals.insert(*party, r.secret);
        self.committees.borrow_mut().remove(&r.window);
        Ok(true)
    }

    /// `window`'s commitments and reveals (what the store keeps).
    pub fn beacon_book(&self, window: WindowId) -> Option<&BeaconBook> {
        self.beacon.get(&window)
    }

    /// Re-adds a window's commitments and reveals found in the store at
    /// startup (no checks; before the verdicts, whose committees it fixes).
    pub fn restore_beacon(&mut self, window: WindowId, book: BeaconBook) {
        self.committees.borrow_mut().remove(&window);
        self.beacon.insert(window, book);
    }

    /// The published reveal of `window` once its challenge is fixed: the
    /// coordinator's secret, the contributions revealed (with their signed
    /// commitments), the commitments withheld, the challenge and the
    /// assignment settings. Anyone checks it with [`beacon::check_reveal`].
    pub fn reveal_frame(&self, window: WindowId, now_ms: u64) -> Option<Reveal> {
        let challenge = self.reveal(window, now_ms)?;
        let book = self.beacon.get(&window).cloned().unwrap_or_default();
        let contributions = book
            .reveals
            .iter()
            .filter_map(|(k, s)| book.commits.get(k).map(|c| Contribution { commit: c.clone(), secret: *s }))
            .collect();
        let withheld: Vec<BeaconCommit> = book.unrevealed().filter_map(|k| book.commits.get(k).cloned()).collect();
        if !withheld.is_empty() && self.withheld_logged.borrow_mut().insert(window) {
            for c in &withheld {
                tracing::warn!(window, party = %c.body.party, "a committed contribution to the challenge was not revealed in time");
            }
        }
        Some(Reveal {
            window,
            secret: self.secrets(window).challenge.0,
            contributions,
            withheld,
            challenge: challenge.0,
            trainer: self.cfg.access.trainer,
            assign: self.assign_spec(),
        })
    }

    /// Windows (still kept) in which each party committed a contribution and
    /// did not reveal it before the challenge was fixed at `now_ms`.
    pub fn withheld(&self, now_ms: u64) -> BTreeMap<PublicKey, Vec<WindowId>> {
        let mut out: BTreeMap<PublicKey, Vec<WindowId>> = BTreeMap::new();
        for (w, b) in &self.beacon {
            if self.challenge_fixed(*w, now_ms) {
                for k in b.unrevealed() {
                    out.entry(*k).or_default().push(*w);
                }
            }
        }
        out
    }

    /// Withheld reveals in a row of `party` among the windows up to `upto`
    /// for which `fixed` holds (newest first, stopping at a revealed one or
    /// at the last window an operator cleared).
    fn withheld_streak(&self, party: &PublicKey, upto: WindowId, fixed: impl Fn(WindowId) -> bool) -> usize {
        let cleared = self.withhold_cleared.get(party).copied();
        let mut n = 0;
        for (w, b) in self.beacon.range(..=upto).rev() {
            if cleared.is_some_and(|c| *w <= c) {
                break;
            }
            if !b.commits.contains_key(party) || !fixed(*w) {
                continue;
            }
            if b.reveals.contains_key(party) {
                break;
            }
            n += 1;
        }
        n
    }

    /// Whether `party` (a validator or the trainer) withheld its last
    /// [`WITHHOLD_LIMIT`] reveals in a row, as of `now_ms`: its commitments
    /// are refused (its contributions stop counting) and a validator's
    /// verdicts are set aside, until an operator clears it
    /// ([`Core::clear_validator`]) or the withheld windows leave the kept
    /// span (`max(ban_windows, weight_windows) + 2` windows).
    pub fn withholding(&self, party: &PublicKey, now_ms: u64) -> bool {
        self.withheld_streak(party, WindowId::MAX, |w| self.challenge_fixed(w, now_ms)) >= WITHHOLD_LIMIT
    }

    /// Whether `party` was withholding when its verdict on `window` came:
    /// counted over the windows up to `window`, every one of them fixed by
    /// then (a validator's verdict is taken only once its window's challenge
    /// is), so a restart that restores the verdicts decides the same.
    fn withholding_at(&self, party: &PublicKey, window: WindowId) -> bool {
        self.withheld_streak(party, window, |_| true) >= WITHHOLD_LIMIT
    }

    /// The task id of `miner`'s group `group` in `window`: what a rollout must claim.
    pub fn assigned_task(&self, window: WindowId, miner: &PublicKey, group: u32) -> u64 {
        task_seed(&self.secrets(window).seed, miner.as_bytes(), group)
    }

    /// Whether `miner` is banned during `window`.
    pub fn is_banned(&self, miner: &PublicKey, window: WindowId) -> bool {
        self.miners.get(miner).and_then(|m| m.banned_through).is_some_and(|through| window <= through)
    }

    /// Every door check on a decoded, signature-checked rollout from the
    /// authenticated `peer`; on success its slot, digest and content are reserved.
    pub fn admit(&mut self, now_ms: u64, peer: &PublicKey, c: &Candidate) -> Result<(), RejectReason> {
        self.observe(now_ms);
        let result = self.check(now_ms, peer, c);
        match result {
            Ok(()) => {
                let book = self.books.entry(c.window).or_default();
                book.digests.insert(c.digest);
                book.slots.entry(c.miner).or_default().insert((c.group, c.index));
                book.bytes += u64::from(c.shape.bytes);
                *book.miner_bytes.entry(c.miner).or_default() += u64::from(c.shape.bytes);
            }
            Err(reason) => self.count_rejection(Some(peer), reason),
        }
        result
    }

    fn check(&self, now_ms: u64, peer: &PublicKey, c: &Candidate) -> Result<(), RejectReason> {
        if c.miner != *peer {
            return Err(RejectReason::WrongMiner);
        }
        if !self.cfg.access.permits(Role::Miner, peer) {
            return Err(RejectReason::NotAllowed);
        }
        if !self.cfg.schedule.accepts(c.window, now_ms) {
            return Err(RejectReason::WrongWindow);
        }
        if self.is_banned(peer, c.window) {
            return Err(RejectReason::Banned);
        }
        if c.checkpoint != self.checkpoint_for(c.window) {
            return Err(RejectReason::StaleCheckpoint);
        }
        if c.env != self.cfg.env {
            return Err(RejectReason::WrongEnv);
        }
        self.check_contract(&c.shape)?;
        if c.group >= self.cfg.groups_per_miner
            || c.index >= self.cfg.group_size
            || c.task_id != self.assigned_task(c.window, peer, c.group)
        {
            return Err(RejectReason::Unassigned);
        }
        if let Some(book) = self.books.get(&c.window)
            && (book.digests.contains(&c.digest)
                || book.slots.get(peer).is_some_and(|s| s.contains(&(c.group, c.index))))
        {
            return Err(RejectReason::Duplicate);
        }
        self.check_budget(c)?;
        Ok(())
    }

    /// The window's generation contract: the coordinator's sampling settings
    /// (bitwise), at most `max_new_tokens` completion tokens, a prompt no
    /// longer than `max_prompt_tokens`, token ids within the vocabulary. A
    /// rollout outside it can only fail validation, and would cost storage
    /// and bandwidth up to ~100× an honest one's.
    pub fn check_contract(&self, s: &Shape) -> Result<(), RejectReason> {
        let want = &self.cfg.sampling;
        let sampling_ok = s.sampling.temperature.to_bits() == want.temperature.to_bits()
            && s.sampling.max_new_tokens == want.max_new_tokens;
        let vocab_ok = self.cfg.vocab_size.is_none_or(|v| s.max_token < v);
        if !sampling_ok
            || s.completion_len > want.max_new_tokens
            || s.prompt_len > self.cfg.max_prompt_tokens
            || !vocab_ok
        {
            return Err(RejectReason::Schema);
        }
        Ok(())
    }

    /// The window's storage budget: bytes in all, and distinct miners.
    fn check_budget(&self, c: &Candidate) -> Result<(), RejectReason> {
        let Some(book) = self.books.get(&c.window) else { return Ok(()) };
        if book.bytes.saturating_add(u64::from(c.shape.bytes)) > self.cfg.max_window_bytes {
            return Err(RejectReason::RateLimited);
        }
        let known = book.slots.get(&c.miner).is_some_and(|s| !s.is_empty());
        let here = book.slots.values().filter(|s| !s.is_empty()).count();
        if !known && here >= self.cfg.max_window_miners as usize {
            return Err(RejectReason::RateLimited);
        }
        // A fair share per key: the budget divided among the keys storing in
        // this window (this one counted) or in the previous one, never less
        // than an even split among `max_window_miners`. Keys that submit
        // first cannot take it all before the others do.
        let before = c.window.checked_sub(1).and_then(|w| self.books.get(&w));
        let last = before.map_or(0, |b| b.slots.values().filter(|s| !s.is_empty()).count());
        let was_there = before.is_some_and(|b| b.slots.get(&c.miner).is_some_and(|s| !s.is_empty()));
        let keys = (here + usize::from(!known)).max(last + usize::from(!was_there)).max(1) as u64;
        let floor = self.cfg.max_window_bytes / u64::from(self.cfg.max_window_miners.max(1));
        let share = (self.cfg.max_window_bytes / keys).max(floor);
        let mine = book.miner_bytes.get(&c.miner).copied().unwrap_or(0);
        if mine > 0 && mine.saturating_add(u64::from(c.shape.bytes)) > share {
            return Err(RejectReason::RateLimited);
        }
        Ok(())
    }

    /// What window `window` holds against its budget: (bytes, miners).
    pub fn window_usage(&self, window: WindowId) -> (u64, usize) {
        self.books.get(&window).map_or((0, 0), |b| (b.bytes, b.slots.values().filter(|s| !s.is_empty()).count()))
    }

    /// The reserved rollout is durable: count it.
    pub fn commit(&mut self, c: &Candidate) {
        self.miners.entry(c.miner).or_default().accepted += 1;
        let s = self.submitted.entry((c.window, c.miner)).or_default();
        s.rollouts = s.rollouts.saturating_add(1);
        s.groups.insert(c.group);
        self.committees.borrow_mut().remove(&c.window);
    }

    /// What `miner` stored in `window` (while the weights may still look at it).
    pub fn submitted(&self, window: WindowId, miner: &PublicKey) -> Option<&Submitted> {
        self.submitted.get(&(window, *miner))
    }

    /// The assignment settings published with every reveal: the authorised
    /// validators (sorted), the committee size and each validator's budget.
    pub fn assign_spec(&self) -> assign::Spec {
        let mut validators: Vec<PublicKey> = self.cfg.access.validators.iter().copied().collect();
        validators.sort_unstable();
        assign::Spec { validators, committee: self.cfg.committee, budget: self.cfg.validator_budget }
    }

    /// The challenge secret of `window` with the assignment settings, once
    /// its submissions have closed ([`Core::reveal`]).
    pub fn reveal_with_assignment(&self, window: WindowId, now_ms: u64) -> Option<(Seed, assign::Spec)> {
        self.reveal(window, now_ms).map(|s| (s, self.assign_spec()))
    }

    /// Which validators judge which of `window`'s miners, and on which
    /// groups: what every validator computes from the reveal
    /// ([`assign::Assignment::compute`]); `None` before the reveal.
    pub fn assignment(&self, window: WindowId, now_ms: u64) -> Option<assign::Assignment> {
        let (challenge, spec) = self.reveal_with_assignment(window, now_ms)?;
        let work: BTreeMap<PublicKey, BTreeSet<u32>> = self
            .submitted
            .range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32])))
            .map(|((_, m), s)| (*m, s.groups.clone()))
            .collect();
        Some(assign::Assignment::compute(&spec, window, &challenge, self.cfg.group_size, &work))
    }

    /// Whether `validator` is in `miner`'s committee for `window`, under the
    /// window's challenge as the contributions recorded fix it (validators'
    /// verdicts are taken only once it is fixed, [`Core::record_verdict`]).
    pub fn in_committee(&self, window: WindowId, miner: &PublicKey, validator: &PublicKey) -> bool {
        self.duty(window, miner).is_some_and(|d| d.committee.contains(validator))
    }

    /// `miner`'s duty in `window` (its committee, prover first, and the
    /// groups its prover proves) under the challenge as the contributions
    /// recorded fix it; `None` if it stored nothing there.
    pub fn duty(&self, window: WindowId, miner: &PublicKey) -> Option<assign::Duty> {
        if let Some(by_miner) = self.committees.borrow().get(&window) {
            return by_miner.get(miner).cloned();
        }
        let work: BTreeMap<PublicKey, BTreeSet<u32>> = self
            .submitted
            .range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32])))
            .map(|((_, m), s)| (*m, s.groups.clone()))
            .collect();
        let challenge = self.mixed_challenge(window);
        let a = assign::Assignment::compute(&self.assign_spec(), window, &challenge, self.cfg.group_size, &work);
        let duty = a.miners.get(miner).cloned();
        self.committees.borrow_mut().insert(window, a.miners);
        duty
    }

    /// Tells the core whether the coordinator re-checks model-free evidence
    /// itself ([`crate::bans::Rechecker`]; assumed until told otherwise).
    /// Without it a confirmer is asked for that evidence too.
    pub fn set_model_free_recheck(&mut self, rechecks: bool) {
        self.model_free_recheck = rechecks;
    }

    /// The failures waiting for `confirmer`'s proof, in (window, miner)
    /// order after `after`, at most `limit` (and [`MAX_CONFIRMATIONS_PAGE`]).
    /// A failure waits for the other members of the miner's committee when
    /// a member's counted verdict claims it, nobody has confirmed it yet, and
    /// its hard evidence cites rollouts the coordinator cannot re-check itself
    /// (model-based checks) that the confirmer's own verdict does not cover;
    /// a claim resting on a count of soft failures asks for the prover's
    /// groups instead. Answered by the confirmer's verdict on the miner.
    pub fn confirmations(
        &self,
        confirmer: &PublicKey,
        after: Option<(WindowId, PublicKey)>,
        limit: u32,
    ) -> Confirmations {
        let limit = limit.clamp(1, MAX_CONFIRMATIONS_PAGE) as usize;
        let start = match after {
            Some(a) => std::ops::Bound::Excluded(a),
            None => std::ops::Bound::Unbounded,
        };
        let mut items = Vec::new();
        for (w, m) in self.disputed.range((start, std::ops::Bound::Unbounded)) {
            if let Some(c) = self.confirmation_for(confirmer, *w, m) {
                if items.len() == limit {
                    let next = items.last().map(|c: &Confirmation| (c.window, c.miner));
                    return Confirmations { items, next };
                }
                items.push(c);
            }
        }
        Confirmations { items, next: None }
    }

    /// What `confirmer` is asked to prove of `miner` in `window`, if anything.
    fn confirmation_for(&self, confirmer: &PublicKey, window: WindowId, miner: &PublicKey) -> Option<Confirmation> {
        if !self.pending(window, miner) {
            return None;
        }
        let duty = self.duty(window, miner)?;
        if !duty.committee.contains(confirmer) {
            return None;
        }
        let by = self.verdicts.get(&(window, *miner))?;
        let claims: Vec<&VerdictBody> = by
            .values()
            .filter(|v| {
                v.validator != *confirmer
                    && duty.committee.contains(&v.validator)
                    && self.party(&v.validator) == Party::Validator
                    && self.claims_failure(v)
            })
            .collect();
        if claims.is_empty() {
            return None;
        }
        let own = by.get(confirmer);
        let covered =
            |d: &[u8; 32]| own.is_some_and(|o| o.passed.contains(d) || o.evidence.iter().any(|e| e.digest == *d));
        let mut digests: Vec<[u8; 32]> = Vec::new();
        let mut groups = Vec::new();
        for v in &claims {
            let hard: Vec<_> = v.evidence.iter().filter(|e| e.hard).collect();
            for e in &hard {
                let needs_model = !e.check.model_free() || !self.model_free_recheck;
                if needs_model && !covered(&e.digest) && !digests.contains(&e.digest) {
                    digests.push(e.digest);
                }
            }
            if !v.hard_failure && own.is_none() {
                groups.clone_from(&duty.groups);
            }
        }
        digests.truncate(MAX_CONFIRMATION_DIGESTS);
        groups.truncate(MAX_CONFIRMATION_GROUPS);
        if digests.is_empty() && groups.is_empty() {
            return None;
        }
        Some(Confirmation {
            window,
            miner: *miner,
            claimants: claims.iter().map(|v| v.validator).collect(),
            digests,
            groups,
        })
    }

    /// Storing the reserved rollout failed: release its reservations.
    pub fn abort(&mut self, c: &Candidate) {
        if let Some(book) = self.books.get_mut(&c.window) {
            book.digests.remove(&c.digest);
            if let Some(s) = book.slots.get_mut(&c.miner) {
                s.remove(&(c.group, c.index));
            }
            book.bytes = book.bytes.saturating_sub(u64::from(c.shape.bytes));
            if let Some(b) = book.miner_bytes.get_mut(&c.miner) {
                *b = b.saturating_sub(u64::from(c.shape.bytes));
            }
        }
        self.count_rejection(Some(&c.miner), RejectReason::Internal);
    }

    /// Re-adds a rollout found in the store at startup (no checks).
    pub fn restore(&mut self, c: &Candidate) {
        let book = self.books.entry(c.window).or_default();
        book.digests.insert(c.digest);
        book.slots.entry(c.miner).or_default().insert((c.group, c.index));
        book.bytes += u64::from(c.shape.bytes);
        *book.miner_bytes.entry(c.miner).or_default() += u64::from(c.shape.bytes);
        self.commit(c);
    }

    /// Counts a rejection decided outside [`Core::admit`] (decode, signature, rate limit).
    pub fn count_rejection(&mut self, peer: Option<&PublicKey>, reason: RejectReason) {
        let slot = match peer {
            Some(p) => &mut self.miners.entry(*p).or_default().rejected,
            None => &mut self.rejected_anonymous,
        };
        *slot.entry(reason.as_str()).or_default() += 1;
    }

    /// The (group, index) slots of `miner` stored in `window`.
    pub fn progress(&self, window: WindowId, miner: &PublicKey) -> Vec<(u32, u32)> {
        let mut v: Vec<_> = self
            .books
            .get(&window)
            .and_then(|b| b.slots.get(miner))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Rollouts stored in `window`.
    pub fn window_count(&self, window: WindowId) -> usize {
        self.books.get(&window).map_or(0, |b| b.digests.len())
    }

    /// Per-miner statistics.
    pub fn miners(&self) -> &HashMap<PublicKey, MinerStats> {
        &self.miners
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

    /// Records a verdict of a validator or of the trainer's proof: checks the
    /// signer and timing, then applies it ([`Core::apply_verdict`]).
    pub fn record_verdict(&mut self, now_ms: u64, body: &VerdictBody, signature_ok: bool) -> Result<(), VerdictError> {
        if !self.cfg.access.permits(Role::Validator, &body.validator)
            && !self.cfg.access.permits(Role::Trainer, &body.validator)
        {
            return Err(VerdictError::Unauthorized);
        }
        if !signature_ok {
            return Err(VerdictError::BadSignature);
        }
        if now_ms < self.cfg.schedule.closes_at(body.window) {
            return Err(VerdictError::NotClosed);
        }
        // A validator proves what the fixed challenge assigns it; before
        // that its committee (what confirms a failure) is not known.
        if self.party(&body.validator) == Party::Validator && !self.challenge_fixed(body.window, now_ms) {
            return Err(VerdictError::NotClosed);
        }
        if body.valid > body.checked {
            return Err(VerdictError::Inconsistent);
        }
        self.apply_verdict(body);
        Ok(())
    }

    /// Operator override (`coordinator ban`/`unban`, see [`crate::admin`]):
    /// `miner` is banned through `through` (inclusive), or not at all with
    /// `None`; later verdicts extend it as usual.
    pub fn set_banned_through(&mut self, miner: PublicKey, through: Option<WindowId>) {
        self.miners.entry(miner).or_default().banned_through = through;
    }

    /// The verdict the coordinator itself records when the authenticated
    /// miner submits what only it can be blamed for in `window`: a rollout
    /// signed over its own key that does not verify, or one made with a
    /// checkpoint other than the window's. `None` for every other refusal.
    /// Apply it with [`Core::apply_verdict`] (and store it).
    pub fn door_penalty(
        &self,
        now_ms: u64,
        window: WindowId,
        miner: &PublicKey,
        reason: RejectReason,
        coordinator: PublicKey,
    ) -> Option<VerdictBody> {
        if !matches!(reason, RejectReason::BadSignature | RejectReason::StaleCheckpoint) {
            return None;
        }
        // Only for a window taking submissions (a made-up window number must not
        // make the coordinator record arbitrary penalties), once per window.
        if !self.cfg.schedule.accepts(window, now_ms)
            || self.verdicts.get(&(window, *miner)).is_some_and(|by| by.contains_key(&coordinator))
        {
            return None;
        }
        let mut body =
            VerdictBody { checked: 1, hard_failure: true, ..VerdictBody::empty(window, *miner, coordinator) };
        body.add_reason(&format!("door: {}", reason.as_str()));
        Some(body)
    }

    /// What the verdicts say about every miner known in `window`: passed or
    /// failed once judged (failed: a confirmed failure, [`crate::bans`]);
    /// `Suspect` while a failure waits for confirmation, or if unjudged but
    /// banned or failed within the ban span.
    pub fn standing(&self, window: WindowId) -> Vec<(PublicKey, MinerStanding)> {
        let mut out: BTreeMap<PublicKey, MinerStanding> = BTreeMap::new();
        for ((_, miner), by) in self.verdicts.range((window, PublicKey([0; 32]))..=(window, PublicKey([0xff; 32]))) {
            let st = if by.values().any(|v| self.fails(v)) {
                MinerStanding::Failed
            } else if by.values().any(|v| self.claims_failure(v)) {
                MinerStanding::Suspect
            } else {
                MinerStanding::Passed
            };
            out.insert(*miner, st);
        }
        for v in self.tribunal.trainer_verdicts(window) {
            if self.claims_failure(v) {
                out.insert(v.miner, MinerStanding::Failed);
            }
        }
        for (miner, m) in &self.miners {
            let recent = m.failures.iter().any(|w| *w <= window && window <= w.saturating_add(self.cfg.ban_windows));
            if !out.contains_key(miner) && (recent || self.is_banned(miner, window)) {
                out.insert(*miner, MinerStanding::Suspect);
            }
        }
        out.into_iter().collect()
    }

    /// Whether a verdict fails its miner (and so bans it for `ban_windows`):
    /// it claims a failure, its signer counts (not a flagged validator), and
    /// the failure of its miner's window is confirmed ([`Core::confirmed`]).
    pub fn fails(&self, v: &VerdictBody) -> bool {
        self.claims_failure(v) && !self.tribunal.is_flagged(&v.validator) && self.confirmed(v.window, &v.miner)
    }

    /// Whether a verdict says its miner failed: a hard failure, or (where
    /// soft failures count, [`CoreConfig::soft_failure_threshold`] > 0) soft
    /// failures past the binomial gate.
    pub fn claims_failure(&self, v: &VerdictBody) -> bool {
        v.hard_failure || (self.soft_failures_count() && v.soft_failures >= self.soft_ban_threshold(v.checked))
    }

    /// Whether soft failures ban and weigh ([`CoreConfig::soft_failure_threshold`] > 0).
    pub fn soft_failures_count(&self) -> bool {
        self.cfg.soft_failure_threshold > 0
    }

    /// Whether `miner`'s failure in `window` is confirmed: by the
    /// coordinator itself (a door penalty, a model-free re-check), by the
    /// trainer's proof, or by two validators whose verdicts count and who
    /// are both members of the miner's committee for the window
    /// ([`Core::in_committee`]): a validator outside it, or one proving
    /// extras, can claim a failure but not confirm one.
    pub fn confirmed(&self, window: WindowId, miner: &PublicKey) -> bool {
        if self.tribunal.trainer_verdict(window, miner).is_some_and(|v| self.claims_failure(v)) {
            return true;
        }
        let mut validators = 0;
        for v in self.verdicts.get(&(window, *miner)).into_iter().flat_map(|by| by.values()) {
            if self.claims_failure(v) {
                match self.party(&v.validator) {
                    Party::Validator if self.in_committee(window, miner, &v.validator) => validators += 1,
                    Party::Validator => {}
                    Party::Coordinator | Party::Trainer => return true,
                }
            }
        }
        validators >= 2
    }

    /// Whether a counted verdict fails `miner` in `window` but nobody confirmed it yet.
    pub fn pending(&self, window: WindowId, miner: &PublicKey) -> bool {
        let claimed =
            self.verdicts.get(&(window, *miner)).is_some_and(|by| by.values().any(|v| self.claims_failure(v)));
        claimed && !self.confirmed(window, miner)
    }

    /// Sets the coordinator's own key: its verdicts (door penalties,
    /// re-checks) confirm a failure by themselves. Set before restoring verdicts.
    pub fn set_coordinator(&mut self, key: PublicKey) {
        self.coordinator = Some(key);
    }

    /// The role of a verdict's signer.
    pub fn party(&self, signer: &PublicKey) -> Party {
        if self.coordinator.as_ref() == Some(signer) {
            Party::Coordinator
        } else if self.cfg.access.permits(Role::Trainer, signer) {
            Party::Trainer
        } else {
            Party::Validator
        }
    }

    /// Whether `validator`'s verdicts are set aside: its evidence was
    /// refuted, or it is withholding its reveals ([`Core::withholding`]).
    pub fn is_flagged(&self, validator: &PublicKey) -> bool {
        self.tribunal.is_flagged(validator) || self.withholding(validator, self.clock.get())
    }

    /// The authorised validators (and any flagged key): flagged or not,
    /// refutations, verdicts that count (`/api/validators`).
    pub fn validator_statuses(&self) -> Vec<ValidatorStatus> {
        let mut counted: HashMap<PublicKey, usize> = HashMap::new();
        for v in self.verdicts.values().flat_map(|by| by.keys()) {
            *counted.entry(*v).or_default() += 1;
        }
        let validators = self.cfg.access.validators.iter().copied();
        let mut statuses = self.tribunal.statuses(validators, |k| counted.get(k).copied().unwrap_or(0));
        let now = self.clock.get();
        let withheld = self.withheld(now);
        for s in &mut statuses {
            let Ok(k) = s.key.parse::<PublicKey>() else { continue };
            if let Some(ws) = withheld.get(&k) {
                s.beacon_withheld.clone_from(ws);
            }
            s.withholding = self.withholding(&k, now);
            s.flagged |= s.withholding;
        }
        statuses
    }

    /// An operator clears `validator` (or the trainer): its verdicts count
    /// again (failures they confirm ban), until another refutation, and its
    /// withheld reveals so far no longer make it withholding. Returns its
    /// refutations so far, which [`Core::restore_clear`] takes back at start
    /// (the withholding clear is not kept across a restart: the flag comes
    /// back while its windows are in the kept span).
    pub fn clear_validator(&mut self, validator: &PublicKey) -> usize {
        if let Some(last) = self.beacon.iter().rev().find(|(_, b)| b.commits.contains_key(validator)).map(|(w, _)| *w) {
            self.withhold_cleared.insert(*validator, last);
        }
        let n = self.tribunal.clear(validator);
        self.restore_set_aside(validator);
        n
    }

    /// Re-applies an operator's clear of `validator` (at start, after the verdicts).
    pub fn restore_clear(&mut self, validator: PublicKey, refutations: usize) {
        self.tribunal.set_cleared(validator, refutations);
        self.restore_set_aside(&validator);
    }

    fn restore_set_aside(&mut self, validator: &PublicKey) {
        if self.tribunal.is_flagged(validator) {
            return;
        }
        if self.withholding(validator, self.clock.get()) {
            return;
        }
        let mut back = Vec::new();
        for (k, by) in self.set_aside.iter_mut() {
            if let Some(v) = by.remove(validator) {
                back.push((*k, v));
            }
        }
        self.set_aside.retain(|_, by| !by.is_empty());
        for (k, v) in back {
            self.verdicts.entry(k).or_default().insert(*validator, v);
            if self.confirmed(k.0, &k.1) {
                self.ban(k.0, k.1);
            }
        }
    }

    fn set_aside_verdicts(&mut self, validator: &PublicKey) {
        for (k, by) in self.verdicts.iter_mut() {
            if let Some(v) = by.remove(validator) {
                self.set_aside.entry(*k).or_default().insert(*validator, v);
            }
        }
        self.verdicts.retain(|_, by| !by.is_empty());
    }

    fn ban(&mut self, window: WindowId, miner: PublicKey) {
        let m = self.miners.entry(miner).or_default();
        let through = window.saturating_add(self.cfg.ban_windows);
        m.banned_through = Some(m.banned_through.map_or(through, |t| t.max(through)));
        if !m.failures.contains(&window) {
            m.failures.push(window);
        }
    }

    /// The soft failures among `checked` rollouts that ban: at least the
    /// configured floor, and never fewer than an honest miner (soft-failure
    /// rate [`verify::HONEST_SOFT_FAILURE_RATE`], calibrated) reaches with
    /// probability above [`SOFT_BAN_PROBABILITY`]. A small sample can then
    /// never ban on soft failures alone.
    pub fn soft_ban_threshold(&self, checked: u32) -> u32 {
        if let Some(t) = self.soft_thresholds.borrow().get(&checked) {
            return *t;
        }
        let gate = verify::soft_ban_threshold(checked, verify::HONEST_SOFT_FAILURE_RATE, SOFT_BAN_PROBABILITY);
        let t = gate.max(self.cfg.soft_failure_threshold.max(1));
        let mut memo = self.soft_thresholds.borrow_mut();
        if memo.len() < MAX_MEMO_THRESHOLDS {
            memo.insert(checked, t);
        }
        t
    }

    /// The verdicts recorded on `miner` in `window`, by validator.
    pub fn verdicts_on(&self, window: WindowId, miner: &PublicKey) -> Vec<VerdictBody> {
        self.verdicts.get(&(window, *miner)).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// Applies a verdict without checks (startup restore): its evidence
    /// and passing proofs go to the ban rules ([`crate::bans`]), which may
    /// flag a validator whose evidence they refute (its verdicts are set
    /// aside); the trainer's verdict is kept apart from the validators'
    /// (it is no sample for the weights); a confirmed failure bans.
    pub fn apply_verdict(&mut self, body: &VerdictBody) {
        let party = self.party(&body.validator);
        let provers: BTreeMap<[u8; 32], Vec<(PublicKey, Party)>> =
            body.hard_failed().map(|d| (*d, self.provers_of(body.window, &body.miner, d))).collect();
        let provers = |d: &[u8; 32]| provers.get(d).cloned().unwrap_or_default();
        for flagged in self.tribunal.note(body, party, provers) {
            tracing::warn!(validator = %flagged, "validator flagged: another party's proof refutes its evidence");
            self.set_aside_verdicts(&flagged);
        }
        let key = (body.window, body.miner);
        // A validator withholding its reveals when its verdict came: set aside like a refuted one.
        let aside = self.tribunal.is_flagged(&body.validator)
            || (party == Party::Validator && self.withholding_at(&body.validator, body.window));
        if party != Party::Trainer {
            let book = if aside { &mut self.set_aside } else { &mut self.verdicts };
            book.entry(key).or_default().insert(body.validator, body.clone());
        }
        if party == Party::Validator && !aside && self.claims_failure(body) {
            self.disputed.insert(key);
        }
        if self.claims_failure(body) && !aside && self.confirmed(key.0, &key.1) {
            self.ban(key.0, key.1);
        }
    }

    /// Who proved `miner`'s rollout `digest` of `window` passing, in the
    /// verdicts that count (validators not set aside, and the trainer).
    fn provers_of(&self, window: WindowId, miner: &PublicKey, digest: &[u8; 32]) -> Vec<(PublicKey, Party)> {
        let mut out: Vec<(PublicKey, Party)> = self
            .verdicts
            .get(&(window, *miner))
            .into_iter()
            .flat_map(|by| by.values())
            .filter(|v| v.passed.contains(digest))
            .map(|v| (v.validator, self.party(&v.validator)))
            .collect();
        if let Some(t) = self.tribunal.trainer_verdict(window, miner).filter(|t| t.passed.contains(digest)) {
            out.push((t.validator, Party::Trainer));
        }
        out
    }

    /// Superlinear weights over the `weight_windows` windows ending at
    /// `upto`, normalised by what each miner was asked to do and by what was
    /// checked (grail's A/C, over the whole span rather than per window).
    ///
    /// Per miner: `A` = rollouts it stored in the span, each window capped at
    /// `unique_cap_per_window` (the door already caps it at what the miner
    /// was assigned, `groups_per_miner × group_size`); `C` = rollouts checked
    /// and `S` = soft-failed ones, from the most conservative verdict of each
    /// window it was judged in. The score is `A · q`, where `q` is the share
    /// of checked rollouts that passed *beyond an honest miner's own noise*:
    /// `q = 1 − max(0, S − h·C − 2·√(h(1−h)C)) / C` with `h` the calibrated
    /// honest soft-failure rate ([`verify::HONEST_SOFT_FAILURE_RATE`]). The
    /// weight is `score^weight_exponent`, normalised. Zero if the miner failed
    /// a verdict in the span or is banned, or was never judged in the span.
    ///
    /// Why this and not a sum of per-window extrapolations: a window in which
    /// the budget left a miner unjudged no longer counts as zero work (`A`
    /// counts every window it stored rollouts in, `q` pools every window it
    /// was checked in), and an honest miner's soft-failure noise is not
    /// rewarded or punished, so two identical honest miners get the same
    /// score unless the noise goes past two standard deviations — under
    /// exponent 4 a 5 % difference in score is a 22 % difference in weight.
    /// A miner that soft-fails more than honest miners do loses one unit of
    /// `q` per excess failure; a hard failure still bans. When the coordinator
    /// holds no count for a judged window (verdicts restored without their
    /// rollouts), that window's most conservative `estimated_valid` stands in.
    pub fn weights(&self, upto: WindowId, coordinator: PublicKey) -> WeightsBody {
        let from = upto.saturating_sub(self.cfg.weight_windows.saturating_sub(1));
        let cap = self.cfg.unique_cap_per_window;
        let lo = |w| (w, PublicKey([0; 32]));
        let hi = |w| (w, PublicKey([0xff; 32]));
        #[derive(Default)]
        struct Tally {
            asked: u64,
            stand_in: u64,
            checked: u64,
            soft: u64,
            judged: bool,
            failed: bool,
        }
        let mut tallies: BTreeMap<PublicKey, Tally> = BTreeMap::new();
        for ((_, miner), s) in self.submitted.range(lo(from)..=hi(upto)) {
            tallies.entry(*miner).or_default().asked += u64::from(s.rollouts).min(cap);
        }
        for ((w, miner), by_validator) in self.verdicts.range(lo(from)..=hi(upto)) {
            let t = tallies.entry(*miner).or_default();
            t.failed |= by_validator.values().any(|v| self.fails(v));
            // The most conservative verdict: the lowest share of valid rollouts.
            let Some(v) = by_validator.values().filter(|v| v.checked > 0).min_by(|a, b| {
                let share = |v: &VerdictBody| f64::from(v.valid) / f64::from(v.checked);
                share(a).total_cmp(&share(b)).then(a.valid.cmp(&b.valid))
            }) else {
                continue;
            };
            t.judged = true;
            t.checked += u64::from(v.checked);
            t.soft += u64::from(v.checked.saturating_sub(v.valid));
            if !self.submitted.contains_key(&(*w, *miner)) {
                t.stand_in += u64::from(v.estimated_valid.max(v.valid)).min(cap);
            }
        }
        let h = verify::HONEST_SOFT_FAILURE_RATE;
        let scores: Vec<(PublicKey, f64)> = tallies
            .into_iter()
            .filter(|(miner, t)| t.judged && !t.failed && !self.is_banned(miner, upto))
            .map(|(miner, t)| {
                let c = t.checked as f64;
                let tolerated = h * c + 2.0 * (h * (1.0 - h) * c).sqrt();
                let q = match (c > 0.0, self.soft_failures_count()) {
                    (false, _) => 0.0,
                    (true, false) => 1.0,
                    (true, true) => 1.0 - (t.soft as f64 - tolerated).max(0.0) / c,
                };
                let score = t.asked as f64 * q.clamp(0.0, 1.0) + t.stand_in as f64;
                (miner, score.powi(self.cfg.weight_exponent))
            })
            .filter(|(_, s)| *s > 0.0)
            .collect();
        let sum: f64 = scores.iter().map(|(_, s)| s).sum();
        let weights = if sum > 0.0 { scores.into_iter().map(|(k, s)| (k, s / sum)).collect() } else { Vec::new() };
        WeightsBody { window: upto, weights, coordinator }
    }

    /// The latest interval whose signed weights document is due at `now_ms`:
    /// window `W`'s once `W + 1` has ended (its verdicts are posted during
    /// `W + 1`). `None` before window 2.
    pub fn weights_interval(&self, now_ms: u64) -> Option<WindowId> {
        self.current_window(now_ms)?.checked_sub(2)
    }

    /// Checks a trainer's step report: signed by the configured trainer key,
    /// figures well formed.
    pub fn check_trainer_stats(&self, body: &TrainerStatsBody, signature_ok: bool) -> Result<(), StatsError> {
        if !self.cfg.access.permits(Role::Trainer, &body.trainer) {
            return Err(StatsError::Unauthorized);
        }
        if !signature_ok {
            return Err(StatsError::BadSignature);
        }
        body.check()?;
        Ok(())
    }

    /// Forgets bookkeeping of windows that can no longer take submissions.
    pub fn prune(&mut self, now_ms: u64) {
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
        // The weights of window `W` are signed once `W + 1` ends and look back
        // `weight_windows` windows from `W`.
        let keep_from = self.current_window(now_ms).unwrap_or(0).saturating_sub(self.cfg.weight_windows + 2);
        self.submitted.retain(|(w, _), _| *w >= keep_from);
    }

    /// Rejections not tied to an authenticated miner.
    pub fn anonymous_rejections(&self) -> &BTreeMap<&'static str, u64> {
        &self.rejected_anonymous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_protocol::identity::Keypair;

    const LEN: u64 = 1_000;

    fn cfg() -> CoreConfig {
        let validator = Keypair::from_seed([100; 32]).public();
        CoreConfig {
            schedule: Schedule::new(10_000, LEN, 100).unwrap(),
            master: [42; 32],
            env: EnvId::Arith,
            groups_per_miner: 2,
            group_size: 4,
            sampling: SamplingParams { temperature: 0.7, max_new_tokens: 32 },
            max_prompt_tokens: 256,
            vocab_size: Some(1000),
            max_window_bytes: 1 << 30,
            max_window_miners: 1000,
            difficulty: 3,
            dataset: None,
            reward: tributary_protocol::env::RewardRule::Strict,
            genesis_checkpoint: ContentId([1; 32]),
            access: Access { validators: [validator].into_iter().collect(), ..Access::default() },
            ban_windows: 3,
            soft_failure_threshold: 2,
            weight_windows: 12,
            unique_cap_per_window: 5000,
            weight_exponent: 4,
            committee: 2,
            validator_budget: 4096,
            reveal_ms: 300,
        }
    }

    fn miner(n: u8) -> PublicKey {
        Keypair::from_seed([n; 32]).public()
    }

    /// A candidate of 2000 bytes within the core's contract.
    fn cand(core: &Core, window: WindowId, m: PublicKey, group: u32, index: u32) -> Candidate {
        crate::testing::candidate(core, window, m, group, index, 2000)
    }

    fn at(window: WindowId) -> u64 {
        10_000 + window * LEN + 1
    }

    fn verdict(window: WindowId, m: PublicKey, valid: u32, hard: bool) -> VerdictBody {
        VerdictBody {
            window,
            miner: m,
            validator: Keypair::from_seed([100; 32]).public(),
            checked: valid.max(1),
            valid,
            estimated_valid: valid,
            hard_failure: hard,
            soft_failures: 0,
            reasons: vec![],
            passed: vec![],
            evidence: vec![],
        }
    }

    #[test]
    fn window_transitions_and_reveal_ordering() {
        let core = Core::new(cfg());
        assert_eq!(core.current_window(9_999), None);
        assert!(core.window_info(0, 9_999).is_none());
        let info = core.window_info(2, at(2)).unwrap();
        assert_eq!(info.window, 2);
        assert_eq!(info.closes_at_ms, 10_000 + 3 * LEN + 100);
        // The commitment is public at open; the secret only after close.
        assert!(core.reveal(2, at(2)).is_none());
        assert!(core.reveal(2, info.closes_at_ms - 1).is_none());
        let reveal = core.reveal_frame(2, info.closes_at_ms).unwrap();
        assert!(tributary_protocol::window::verify_reveal(2, &info.commitment, &reveal.secret));
        let challenge = beacon::check_reveal(&reveal, &core.network(), &info.commitment).unwrap();
        assert_eq!(core.reveal(2, info.closes_at_ms), Some(challenge));
        // A restarted core with the same master secret re-derives the same window.
        assert_eq!(Core::new(cfg()).window_info(2, at(2)).unwrap(), info);
    }

    #[test]
    fn assignment_is_deterministic_and_per_miner() {
        let core = Core::new(cfg());
        let a = core.assigned_task(1, &miner(1), 0);
        assert_eq!(a, Core::new(cfg()).assigned_task(1, &miner(1), 0));
        assert_ne!(a, core.assigned_task(1, &miner(2), 0));
        assert_ne!(a, core.assigned_task(1, &miner(1), 1));
        assert_ne!(a, core.assigned_task(2, &miner(1), 0));
        assert_eq!(a, task_seed(&core.window_info(1, at(1)).unwrap().seed, miner(1).as_bytes(), 0));
    }

    #[test]
    fn admission_rules() {
        let mut core = Core::new(cfg());
        let m = miner(1);
        let ok = cand(&core, 1, m, 0, 0);
        assert_eq!(core.admit(at(1), &m, &ok), Ok(()));
        core.commit(&ok);
        // Same bytes again, same slot with other bytes.
        assert_eq!(core.admit(at(1), &m, &ok), Err(RejectReason::Duplicate));
        let mut same_slot = ok.clone();
        same_slot.digest = [9; 32];
        same_slot.content = [9; 32];
        assert_eq!(core.admit(at(1), &m, &same_slot), Err(RejectReason::Duplicate));
        // The same content in another slot of the same miner (an honest group
        // whose rollouts coincide), or under another key (validators judge copies), is admitted.
        let mut twin = cand(&core, 1, m, 1, 3);
        twin.content = ok.content;
        assert_eq!(core.admit(at(1), &m, &twin), Ok(()));
        core.abort(&twin);
        let other = miner(2);
        let mut copy = cand(&core, 1, other, 0, 0);
        copy.content = ok.content;
        assert_eq!(core.admit(at(1), &other, &copy), Ok(()));
        core.abort(&copy);
        // Submitted by a peer other than the signer.
        assert_eq!(core.admit(at(1), &other, &cand(&core, 1, m, 0, 1)), Err(RejectReason::WrongMiner));
        // Window not open (future, and closed past the grace).
        assert_eq!(core.admit(at(1), &m, &cand(&core, 2, m, 0, 1)), Err(RejectReason::WrongWindow));
        assert_eq!(core.admit(at(2) + 100, &m, &cand(&core, 1, m, 0, 1)), Err(RejectReason::WrongWindow));
        // Within the grace the old window still accepts.
        assert_eq!(core.admit(at(2) + 50, &m, &cand(&core, 1, m, 0, 1)), Ok(()));
        // Unassigned: group out of range, index out of range, wrong task id.
        assert_eq!(core.admit(at(1), &m, &cand(&core, 1, m, 2, 0)), Err(RejectReason::Unassigned));
        assert_eq!(core.admit(at(1), &m, &cand(&core, 1, m, 0, 4)), Err(RejectReason::Unassigned));
        let mut wrong_task = cand(&core, 1, m, 1, 0);
        wrong_task.task_id ^= 1;
        assert_eq!(core.admit(at(1), &m, &wrong_task), Err(RejectReason::Unassigned));
        // Stale checkpoint and wrong env.
        let mut stale = cand(&core, 1, m, 1, 0);
        stale.checkpoint = ContentId([7; 32]);
        assert_eq!(core.admit(at(1), &m, &stale), Err(RejectReason::StaleCheckpoint));
        let mut env = cand(&core, 1, m, 1, 0);
        env.env = EnvId::Sat;
        assert_eq!(core.admit(at(1), &m, &env), Err(RejectReason::WrongEnv));
        let stats = &core.miners()[&m];
        assert_eq!(stats.accepted, 1);
        assert_eq!(stats.rejected["duplicate"], 2);
        assert_eq!(stats.rejected["internal"], 1);
        assert_eq!(stats.rejected["unassigned"], 3);
        assert_eq!(core.progress(1, &m), vec![(0, 0), (0, 1)]);
    }

    #[test]
    fn abort_releases_reservation() {
        let mut core = Core::new(cfg());
        let m = miner(1);
        let c = cand(&core, 1, m, 0, 0);
        core.admit(at(1), &m, &c).unwrap();
        core.abort(&c);
        assert_eq!(core.admit(at(1), &m, &c), Ok(()));
    }

    #[test]
    fn allow_and_deny_lists() {
        let mut c = cfg();
        c.access.miner_deny.insert(miner(3));
        c.access.miner_allow = Some([miner(1), miner(3)].into_iter().collect());
        let mut core = Core::new(c);
        let cand2 = cand(&core, 1, miner(2), 0, 0);
        assert_eq!(core.admit(at(1), &miner(2), &cand2), Err(RejectReason::NotAllowed));
        let cand3 = cand(&core, 1, miner(3), 0, 0);
        assert_eq!(core.admit(at(1), &miner(3), &cand3), Err(RejectReason::NotAllowed));
        let cand1 = cand(&core, 1, miner(1), 0, 0);
        assert_eq!(core.admit(at(1), &miner(1), &cand1), Ok(()));
        assert!(!core.access().permits(Role::Trainer, &miner(1)));
    }

    #[test]
    fn checkpoint_takes_effect_next_window() {
        let mut core = Core::new(cfg());
        let body = CheckpointBody {
            id: ContentId([2; 32]),
            kind: tributary_protocol::wire::CheckpointKind::Full,
            len: 0,
            payload_hash: [0; 32],
            window: 1,
            trainer: miner(9),
        };
        assert_eq!(core.publish_checkpoint(at(1), &body), 2);
        assert_eq!(core.checkpoint_for(1), ContentId([1; 32]));
        assert_eq!(core.checkpoint_for(2), ContentId([2; 32]));
        assert_eq!(core.checkpoint_for(9), ContentId([2; 32]));
        // A rollout of window 2 made with the old checkpoint is stale.
        let m = miner(1);
        let mut c = cand(&core, 2, m, 0, 0);
        c.checkpoint = ContentId([1; 32]);
        assert_eq!(core.admit(at(2), &m, &c), Err(RejectReason::StaleCheckpoint));
    }

    #[test]
    fn the_door_enforces_the_generation_contract() {
        let mut core = Core::new(cfg());
        let m = miner(1);
        let base = cand(&core, 1, m, 0, 0);
        let mut bad: Vec<(&str, Candidate)> = Vec::new();
        let mut c = base.clone();
        c.shape.sampling.temperature = 1.0;
        bad.push(("temperature", c));
        let mut c = base.clone();
        c.shape.sampling.temperature = f32::from_bits(0.7f32.to_bits() + 1);
        bad.push(("temperature off by one ulp", c));
        let mut c = base.clone();
        c.shape.sampling.max_new_tokens = 16_384;
        bad.push(("max_new_tokens claimed", c));
        let mut c = base.clone();
        c.shape.completion_len = 33;
        bad.push(("completion past max_new_tokens", c));
        let mut c = base.clone();
        c.shape.prompt_len = 257;
        bad.push(("prompt too long", c));
        let mut c = base.clone();
        c.shape.max_token = 1000;
        bad.push(("token outside the vocabulary", c));
        for (what, c) in &bad {
            assert_eq!(core.admit(at(1), &m, c), Err(RejectReason::Schema), "{what}");
        }
        assert_eq!(core.admit(at(1), &m, &base), Ok(()));
        // Without a known vocabulary only the other bounds apply.
        let mut c = cfg();
        c.vocab_size = None;
        let mut core = Core::new(c);
        let mut big = cand(&core, 1, m, 0, 0);
        big.shape.max_token = u32::MAX;
        assert_eq!(core.admit(at(1), &m, &big), Ok(()));
    }

    /// network-security E3: a window's storage is bounded in bytes and in
    /// distinct miners, whatever the number of keys; an aborted rollout gives
    /// its bytes back.
    #[test]
    fn a_window_has_a_storage_budget() {
        let mut c = cfg();
        c.max_window_bytes = 5_000;
        c.max_window_miners = 3;
        let mut core = Core::new(c);
        let (a, b) = (miner(1), miner(2));
        let x = cand(&core, 1, a, 0, 0);
        assert_eq!(core.admit(at(1), &a, &x), Ok(()));
        assert_eq!(core.admit(at(1), &a, &cand(&core, 1, a, 0, 1)), Ok(()));
        assert_eq!(core.admit(at(1), &b, &cand(&core, 1, b, 0, 0)), Err(RejectReason::RateLimited));
        assert_eq!(core.window_usage(1), (4_000, 1));
        core.abort(&x);
        assert_eq!(core.admit(at(1), &b, &cand(&core, 1, b, 0, 0)), Ok(()));
        // Another window has its own budget.
        assert_eq!(core.admit(at(2), &b, &cand(&core, 2, b, 0, 0)), Ok(()));
        // Distinct miners: the third key fits, the fourth does not.
        let mut c = cfg();
        c.max_window_miners = 3;
        let mut core = Core::new(c);
        for n in 1..=3 {
            assert_eq!(core.admit(at(1), &miner(n), &cand(&core, 1, miner(n), 0, 0)), Ok(()));
        }
        assert_eq!(core.admit(at(1), &miner(4), &cand(&core, 1, miner(4), 0, 0)), Err(RejectReason::RateLimited));
        assert_eq!(core.admit(at(1), &miner(1), &cand(&core, 1, miner(1), 0, 1)), Ok(()));
    }

    /// proof-soundness finding 3: the announcement's frame was read in window
    /// 1 and its upload became durable in window 2, after window 2's
    /// parameters were handed out; window 2 keeps its checkpoint.
    #[test]
    fn a_publication_never_changes_an_opened_window() {
        let mut core = Core::new(cfg());
        let m = miner(1);
        let info = core.window_info(2, at(2)).unwrap();
        assert_eq!(info.checkpoint, ContentId([1; 32]));
        let body = CheckpointBody {
            id: ContentId([2; 32]),
            kind: tributary_protocol::wire::CheckpointKind::Full,
            len: 0,
            payload_hash: [0; 32],
            window: 1,
            trainer: miner(9),
        };
        // A stale clock reading (taken when the announcement arrived).
        assert_eq!(core.publish_checkpoint(at(1) + 990, &body), 3);
        assert_eq!(core.window_info(2, at(2) + 1).unwrap().checkpoint, info.checkpoint);
        let c = cand(&core, 2, m, 0, 0);
        assert_eq!(c.checkpoint, ContentId([1; 32]));
        assert_eq!(core.admit(at(2) + 2, &m, &c), Ok(()));
        assert_eq!(core.checkpoint_for(3), ContentId([2; 32]));
        // Made durable as from window 3, but window 3 opened before the
        // caller re-read the clock: refused, to be stored again from window 4.
        let mut core = Core::new(cfg());
        let from = core.checkpoint_from(at(2), &body);
        assert_eq!(from, 3);
        assert!(!core.publish_checkpoint_from(at(3), from, &body));
        assert_eq!(core.checkpoint_for(3), ContentId([1; 32]));
        assert!(core.publish_checkpoint_from(at(3), 4, &body));
        assert_eq!(core.checkpoint_for(4), ContentId([2; 32]));
    }

    /// A second authorised validator (key 101) and the trainer (key 77).
    fn cfg_two_validators() -> CoreConfig {
        let mut c = cfg();
        c.access.validators.insert(second().validator);
        c.access.trainer = Some(Keypair::from_seed([77; 32]).public());
        c
    }

    /// `v` as signed by the second validator.
    fn by(signer: u8, mut v: VerdictBody) -> VerdictBody {
        v.validator = Keypair::from_seed([signer; 32]).public();
        v
    }

    fn second() -> VerdictBody {
        by(101, verdict(0, miner(0), 0, false))
    }

    /// A hard failure of rollout `digest` with its evidence (sampling, model-based).
    fn failing(window: WindowId, m: PublicKey, digest: [u8; 32]) -> VerdictBody {
        let mut v = verdict(window, m, 0, true);
        v.checked = 2;
        v.add_evidence(tributary_protocol::wire::FailureEvidence {
            digest,
            group: 0,
            rollout: 1,
            check: tributary_protocol::wire::FailedCheck::Sampling,
            hard: true,
            position: Some(44),
            figures: tributary_protocol::wire::Figures::Sampling { u: 0.5, lo: 0.1, hi: 0.2, outside: 1 },
        });
        v
    }

    #[test]
    fn verdicts_bans_and_weights() {
        let mut core = Core::new(cfg_two_validators());
        let (a, b, c) = (miner(1), miner(2), miner(3));
        let closed = at(2) + 200;
        // Before close: refused.
        assert_eq!(core.record_verdict(at(1), &verdict(1, a, 10, false), true), Err(VerdictError::NotClosed));
        // Wrong signer / bad signature.
        let mut forged = verdict(1, a, 10, false);
        forged.validator = miner(50);
        assert_eq!(core.record_verdict(closed, &forged, true), Err(VerdictError::Unauthorized));
        assert_eq!(core.record_verdict(closed, &verdict(1, a, 10, false), false), Err(VerdictError::BadSignature));
        core.record_verdict(closed, &verdict(1, a, 20, false), true).unwrap();
        core.record_verdict(closed, &verdict(1, b, 10, false), true).unwrap();
        // Confirmations come from the miner's committee: c stored a group.
        store(&mut core, 1, c, 1);
        core.record_verdict(closed, &verdict(1, c, 30, true), true).unwrap();
        // One validator's failure waits for a second party.
        assert!(!core.is_banned(&c, 2) && core.pending(1, &c));
        assert!(core.standing(1).contains(&(c, MinerStanding::Suspect)));
        core.record_verdict(closed, &by(101, verdict(1, c, 30, true)), true).unwrap();
        assert!(core.standing(1).contains(&(c, MinerStanding::Failed)));
        // c is banned for windows 2..=4, and not in window 5.
        assert!(core.is_banned(&c, 2) && core.is_banned(&c, 4));
        assert!(!core.is_banned(&c, 5));
        let cc = cand(&core, 3, c, 0, 0);
        assert_eq!(core.admit(at(3), &c, &cc), Err(RejectReason::Banned));
        let w = core.weights(1, miner(99));
        let get = |k| w.weights.iter().find(|(m, _)| *m == k).map(|(_, w)| *w);
        // share^4: 20^4 / (20^4 + 10^4) = 16/17.
        assert!((get(a).unwrap() - 16.0 / 17.0).abs() < 1e-12);
        assert!((get(b).unwrap() - 1.0 / 17.0).abs() < 1e-12);
        assert_eq!(get(c), None);
        // Soft failures ban only past the binomial gate: of 10 checked, 6 is
        // within an honest miner's reach at p = 1e-6 (the floor of 2 is not
        // enough), 7 is not.
        assert_eq!(core.soft_ban_threshold(10), 7);
        assert_eq!(core.soft_ban_threshold(4), 5, "4 checked rollouts never soft-ban");
        let d = miner(4);
        store(&mut core, 1, d, 1);
        let mut soft = verdict(1, d, 10, false);
        soft.soft_failures = 6;
        core.record_verdict(closed, &soft, true).unwrap();
        core.record_verdict(closed, &by(101, soft.clone()), true).unwrap();
        assert!(!core.is_banned(&d, 2), "6 soft failures of 10 are within honest reach");
        soft.soft_failures = 7;
        core.record_verdict(closed, &soft, true).unwrap();
        assert!(!core.is_banned(&d, 2), "one validator's soft failures wait for a second");
        core.record_verdict(closed, &by(101, soft), true).unwrap();
        assert!(core.is_banned(&d, 2));
    }

    /// The default (soft_failure_threshold 0): soft failures are a statistic.
    /// An honest SAT miner fails the distribution check on 17-30 % of its
    /// rollouts (docs/calibration.md §5b); with the binomial gate at the
    /// calibrated arith rate, both committee members' verdicts of 24 soft
    /// failures in 64 banned it (as `verdicts_bans_and_weights` shows for the
    /// gate) and its weight fell with every soft failure.
    #[test]
    fn soft_failures_neither_ban_nor_weigh_by_default() {
        let mut c = cfg_two_validators();
        c.soft_failure_threshold = 0;
        let mut core = Core::new(c);
        let closed = at(2) + 200;
        let (sat, twin) = (miner(5), miner(6));
        for m in [sat, twin] {
            store(&mut core, 1, m, 1);
        }
        let mut soft = verdict(1, sat, 40, false);
        soft.checked = 64;
        soft.soft_failures = 24;
        core.record_verdict(closed, &soft, true).unwrap();
        core.record_verdict(closed, &by(101, soft), true).unwrap();
        let mut clean = verdict(1, twin, 64, false);
        clean.checked = 64;
        core.record_verdict(closed, &clean, true).unwrap();
        core.record_verdict(closed, &by(101, clean), true).unwrap();
        assert!(!core.is_banned(&sat, 2), "an honest SAT miner's soft failures banned it");
        assert!(core.standing(1).contains(&(sat, MinerStanding::Passed)), "{:?}", core.standing(1));
        let w = core.weights(1, miner(99));
        let get = |k| w.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
        assert!(get(sat) > 0.0 && (get(sat) / get(twin) - 1.0).abs() < 1e-12, "{} vs {}", get(sat), get(twin));
    }

    #[test]
    fn door_penalties_fail_the_window_and_standing_reports_it() {
        let mut core = Core::new(cfg());
        let coord = miner(99);
        core.set_coordinator(coord);
        let (a, b) = (miner(1), miner(2));
        // Only signature and checkpoint refusals, only for an open window, once.
        assert!(core.door_penalty(at(1), 1, &a, RejectReason::Unassigned, coord).is_none());
        assert!(core.door_penalty(at(1), 7, &a, RejectReason::BadSignature, coord).is_none());
        let p = core.door_penalty(at(1), 1, &a, RejectReason::StaleCheckpoint, coord).unwrap();
        assert!(p.hard_failure && p.reasons == vec!["door: stale_checkpoint".to_string()]);
        core.apply_verdict(&p);
        assert!(core.door_penalty(at(1), 1, &a, RejectReason::BadSignature, coord).is_none());
        assert!(core.is_banned(&a, 2));
        core.apply_verdict(&verdict(1, b, 8, false));
        let st = core.standing(1);
        assert_eq!(
            st,
            vec![(a, MinerStanding::Failed), (b, MinerStanding::Passed)]
                .into_iter()
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect::<Vec<_>>()
        );
        // Window 2: a is unjudged but banned.
        assert_eq!(core.standing(2), vec![(a, MinerStanding::Suspect)]);
        let w = core.weights(1, coord);
        assert_eq!(w.weights.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![b]);
    }

    #[test]
    fn trainer_stats_only_from_the_trainer_key() {
        let trainer = Keypair::from_seed([77; 32]);
        let mut c = cfg();
        c.access.trainer = Some(trainer.public());
        let core = Core::new(c);
        let mut body = TrainerStatsBody {
            window: 3,
            checkpoint: ContentId([2; 32]),
            first_trained: 1,
            last_trained: 2,
            step: 1,
            lr: 1e-3,
            loss: 0.1,
            pg_loss: 0.1,
            kl: 0.0,
            entropy: 1.0,
            clip_low_frac: 0.0,
            clip_high_frac: 0.0,
            grad_norm: 1.0,
            reward_mean: 0.5,
            reward_std: 0.1,
            seqs: 4,
            tokens: 64,
            groups_kept: 1,
            groups_dropped: 0,
            groups_held: 0,
            payload_bytes: 10,
            checkpoint_bytes: 100,
            delta: false,
            change_fraction: None,
            trainer: trainer.public(),
        };
        assert_eq!(core.check_trainer_stats(&body, true), Ok(()));
        assert_eq!(core.check_trainer_stats(&body, false), Err(StatsError::BadSignature));
        // A validator's or a miner's key is not the trainer's, even with a good signature.
        for k in [Keypair::from_seed([100; 32]).public(), miner(1)] {
            let mut other = body.clone();
            other.trainer = k;
            assert_eq!(core.check_trainer_stats(&other, true), Err(StatsError::Unauthorized));
        }
        // No trainer configured: nobody.
        assert_eq!(Core::new(cfg()).check_trainer_stats(&body, true), Err(StatsError::Unauthorized));
        body.loss = f64::INFINITY;
        assert_eq!(
            core.check_trainer_stats(&body, true),
            Err(StatsError::Malformed(TrainerStatsError::NotFinite("loss")))
        );
    }

    #[test]
    fn weights_interval_waits_for_the_next_window_to_end() {
        let core = Core::new(cfg());
        assert_eq!(core.weights_interval(9_999), None);
        assert_eq!(core.weights_interval(at(0)), None);
        assert_eq!(core.weights_interval(at(1)), None);
        assert_eq!(core.weights_interval(at(2)), Some(0));
        assert_eq!(core.weights_interval(at(7)), Some(5));
    }

    #[test]
    fn weights_cap() {
        let mut c = cfg();
        c.unique_cap_per_window = 10;
        c.weight_windows = 1;
        let mut core = Core::new(c);
        core.apply_verdict(&verdict(1, miner(1), 1000, false));
        core.apply_verdict(&verdict(1, miner(2), 10, false));
        let w = core.weights(1, miner(99));
        assert_eq!(w.weights.len(), 2);
        assert!(w.weights.iter().all(|(_, x)| (*x - 0.5).abs() < 1e-12));
    }

    /// The core forgets verdicts no rule reads any more (the store keeps
    /// them), so its memory per miner is bounded however long it runs.
    #[test]
    fn prune_forgets_verdicts_older_than_bans_and_weights_read() {
        let mut core = Core::new(cfg());
        let horizon = core.cfg.ban_windows.max(core.cfg.weight_windows) + 2;
        let last = horizon + 5;
        for w in 0..=last {
            core.apply_verdict(&verdict(w, miner(1), 4, false));
        }
        let before = core.weights(last, miner(99));
        let standing = core.standing(last);
        core.prune(at(last) + 1);
        assert!(core.verdicts_on(0, &miner(1)).is_empty(), "window 0 is past every rule's reach");
        assert!(core.verdicts_on(last - horizon - 1, &miner(1)).is_empty());
        for w in last - horizon..=last {
            assert_eq!(core.verdicts_on(w, &miner(1)).len(), 1, "window {w} is still read");
        }
        assert_eq!(core.verdicts.len() as u64, horizon + 1);
        assert_eq!(core.weights(last, miner(99)).weights, before.weights);
        assert_eq!(core.standing(last), standing);
    }

    /// issue 16: a validator posting a false failing verdict against an
    /// honest miner bans nobody; another validator's passing proof of the
    /// same rollout flags it, its verdicts stop counting (standing, bans,
    /// confirmations) until an operator clears it.
    #[test]
    fn a_refuted_validator_is_flagged_and_its_verdicts_set_aside_until_cleared() {
        let mut core = Core::new(cfg_two_validators());
        let closed = at(2) + 200;
        let (honest, other) = (miner(1), miner(2));
        let liar = Keypair::from_seed([100; 32]).public();
        let good = second().validator;
        // Confirmations come from the committee of a miner that stored work.
        store(&mut core, 1, other, 1);
        core.record_verdict(closed, &failing(1, honest, [5; 32]), true).unwrap();
        assert!(!core.is_banned(&honest, 2) && core.pending(1, &honest));
        assert!(!core.is_flagged(&liar));
        let mut pass = by(101, verdict(1, honest, 2, false));
        pass.add_passed([5; 32]);
        pass.add_passed([6; 32]);
        core.record_verdict(closed, &pass, true).unwrap();
        assert!(core.is_flagged(&liar) && !core.is_flagged(&good));
        assert!(!core.is_banned(&honest, 2) && !core.pending(1, &honest));
        assert_eq!(core.standing(1), vec![(honest, MinerStanding::Passed)]);
        assert_eq!(core.verdicts_on(1, &honest), vec![pass.clone()]);
        let st = core.validator_statuses();
        let s = st.iter().find(|s| s.key == liar.to_string()).unwrap();
        assert!(s.flagged && s.refuted == 1 && s.verdicts == 0, "{s:?}");
        assert_eq!(s.refutations[0].digest, hex::encode([5; 32]));
        // While flagged, its failures confirm nothing: with the good
        // validator's failure on `other`, that one waits for another party.
        core.record_verdict(closed, &failing(1, other, [7; 32]), true).unwrap();
        core.record_verdict(closed, &by(101, failing(1, other, [7; 32])), true).unwrap();
        assert!(!core.is_banned(&other, 2) && core.pending(1, &other));
        // Cleared: its verdicts count again, and the two failures on `other` ban.
        assert_eq!(core.clear_validator(&liar), 1);
        assert!(!core.is_flagged(&liar));
        assert!(core.is_banned(&other, 2));
        assert!(!core.is_banned(&honest, 2), "the refuted failure alone still bans nobody");
        // A restart replays the verdicts, then the operator's clear.
        let mut again = Core::new(cfg_two_validators());
        store(&mut again, 1, other, 1);
        for v in [failing(1, honest, [5; 32]), pass, failing(1, other, [7; 32]), by(101, failing(1, other, [7; 32]))] {
            again.apply_verdict(&v);
        }
        assert!(again.is_flagged(&liar));
        again.restore_clear(liar, 1);
        assert!(!again.is_flagged(&liar) && again.is_banned(&other, 2));
    }

    /// issue 16: the trainer's own proof failure bans alone (the trainer may
    /// post verdicts), and is kept out of the validators' verdicts (weights);
    /// its passing proof refutes a validator's sampling evidence.
    #[test]
    fn the_trainers_proof_confirms_a_failure_and_refutes_false_evidence() {
        let mut core = Core::new(cfg_two_validators());
        let closed = at(2) + 200;
        let (cheat, honest) = (miner(1), miner(2));
        core.record_verdict(closed, &failing(1, cheat, [5; 32]), true).unwrap();
        assert!(!core.is_banned(&cheat, 2));
        core.record_verdict(closed, &by(77, failing(1, cheat, [5; 32])), true).unwrap();
        assert!(core.is_banned(&cheat, 2));
        assert_eq!(core.standing(1), vec![(cheat, MinerStanding::Failed)]);
        assert_eq!(core.verdicts_on(1, &cheat).len(), 1, "the trainer's verdict is not a validator's");
        // The trainer alone, on a window no validator judged: failed there.
        core.record_verdict(closed, &by(77, failing(0, honest, [8; 32])), true).unwrap();
        assert!(core.standing(0).contains(&(honest, MinerStanding::Failed)));
        // A false sampling failure that the trainer proved passing flags its validator.
        let mut c = cfg_two_validators();
        c.access.validators.remove(&second().validator);
        let mut core = Core::new(c);
        core.record_verdict(closed, &failing(1, honest, [9; 32]), true).unwrap();
        let mut pass = by(77, verdict(1, honest, 1, false));
        pass.add_passed([9; 32]);
        core.record_verdict(closed, &pass, true).unwrap();
        assert!(core.is_flagged(&Keypair::from_seed([100; 32]).public()));
        assert!(!core.is_banned(&honest, 2));
    }

    /// Stores `groups` full groups of `m` in window `w`.
    fn store(core: &mut Core, w: WindowId, m: PublicKey, groups: u32) {
        for g in 0..groups {
            for i in 0..core.config().group_size {
                let c = cand(core, w, m, g, i);
                core.admit(at(w), &m, &c).unwrap();
                core.commit(&c);
            }
        }
    }

    /// proof-soundness finding 11: miner A judged in 1 window, B in 3, the
    /// same work every window. Summing what was judged gave (3/1)⁴ = 81:1;
    /// normalised by what was stored and what was checked, 1:1. A miner
    /// that soft-fails past an honest miner's noise scores lower; honest
    /// noise costs nothing.
    #[test]
    fn weights_are_normalised_by_what_was_asked_and_checked() {
        let mut c = cfg();
        c.weight_windows = 3;
        let mut core = Core::new(c);
        let (a, b, d) = (miner(1), miner(2), miner(3));
        for w in 1..=3 {
            for m in [a, b, d] {
                store(&mut core, w, m, 2);
            }
        }
        core.apply_verdict(&verdict(1, a, 8, false));
        for w in 1..=3 {
            core.apply_verdict(&verdict(w, b, 8, false));
        }
        // d: 32 checked in all, 8 of them soft failures (25 %, honest ≤ 6.7 %).
        for w in 1..=2 {
            let mut v = verdict(w, d, 16, false);
            v.valid = 12;
            v.soft_failures = 4;
            core.apply_verdict(&v);
        }
        let weights = core.weights(3, miner(99));
        let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
        assert!((get(a) / get(b) - 1.0).abs() < 1e-12, "{} vs {}", get(a), get(b));
        // q = 1 − (8 − 0.067·32 − 2·√(0.067·0.933·32)) / 32 ≈ 0.9
        let q = (get(d) / get(a)).powf(0.25);
        assert!((0.85..0.95).contains(&q), "q = {q}");
        // One soft failure in 8 (within honest noise) costs nothing.
        let mut v = verdict(2, a, 8, false);
        v.valid = 7;
        v.soft_failures = 1;
        core.apply_verdict(&v);
        let weights = core.weights(3, miner(99));
        let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
        assert!((get(a) / get(b) - 1.0).abs() < 1e-12);
        // The exponent is a setting.
        let mut c = cfg();
        c.weight_windows = 3;
        c.weight_exponent = 1;
        let mut lin = Core::new(c);
        store(&mut lin, 1, a, 2);
        store(&mut lin, 1, b, 1);
        lin.apply_verdict(&verdict(1, a, 8, false));
        lin.apply_verdict(&verdict(1, b, 4, false));
        let weights = lin.weights(1, miner(99));
        let get = |k| weights.weights.iter().find(|(m, _)| *m == k).map_or(0.0, |(_, x)| *x);
        assert!((get(a) - 2.0 / 3.0).abs() < 1e-12 && (get(b) - 1.0 / 3.0).abs() < 1e-12);
    }

    /// Issue 16 item 1: the core recomputes the assignment of a closed
    /// window from what was stored; with two validators and committees of
    /// one, their shares differ and together cover every miner.
    #[test]
    fn the_assignment_covers_every_miner_that_stored() {
        let mut c = cfg();
        let (v1, v2) = (Keypair::from_seed([100; 32]).public(), Keypair::from_seed([101; 32]).public());
        c.access.validators = [v1, v2].into_iter().collect();
        c.committee = 1;
        let mut core = Core::new(c);
        // Distinct first bytes: the test candidates' digests are built from it.
        let mut firsts = BTreeSet::new();
        let miners: Vec<PublicKey> = (1..=60).map(miner).filter(|m| firsts.insert(m.0[0])).take(9).collect();
        for m in &miners {
            store(&mut core, 1, *m, 1 + u32::from(m.0[0] % 2));
        }
        assert!(core.assignment(1, at(2)).is_none(), "not before the reveal");
        let a = core.assignment(1, at(2) + 200).unwrap();
        let share = |v| a.of_validator(v).map(|(m, _)| *m).collect::<BTreeSet<_>>();
        let (s1, s2) = (share(&v1), share(&v2));
        assert!(s1.is_disjoint(&s2) && !s1.is_empty() && !s2.is_empty());
        assert_eq!(&s1 | &s2, miners.iter().copied().collect());
        assert_eq!(core.reveal_with_assignment(1, at(2) + 200).unwrap().1.validators, {
            let mut v = vec![v1, v2];
            v.sort();
            v
        });
    }

    /// `key`'s commitment to its contribution to `window` on `core`'s network.
    fn commit_of(core: &Core, key: &Keypair, window: WindowId) -> BeaconCommit {
        beacon::commit(key, &core.network(), window)
    }

    fn reveal_of(core: &Core, key: &Keypair, window: WindowId) -> BeaconReveal {
        BeaconReveal { window, secret: beacon::contribution_secret(key, &core.network(), window) }
    }

    #[test]
    fn a_reveal_must_open_its_commitment() {
        let mut core = Core::new(cfg_two_validators());
        core.set_coordinator(Keypair::from_seed([9; 32]).public());
        let (v, t) = (Keypair::from_seed([100; 32]), Keypair::from_seed([77; 32]));
        let closes = core.schedule().closes_at(1);
        // Commitments while the window is open (or up to two windows ahead), by authorised keys.
        assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 1), true), Ok(true));
        assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 1), true), Ok(false), "the same again");
        assert_eq!(core.record_commit(at(0), &commit_of(&core, &t, 1), true), Ok(true));
        assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 4), true), Err(BeaconRefusal::TooEarly));
        let outsider = Keypair::from_seed([55; 32]);
        assert_eq!(core.record_commit(at(1), &commit_of(&core, &outsider, 1), true), Err(BeaconRefusal::Unauthorized));
        assert_eq!(core.record_commit(at(1), &commit_of(&core, &v, 2), false), Err(BeaconRefusal::BadSignature));
        let elsewhere = beacon::commit(&v, &NetworkId([1; 32]), 2);
        assert_eq!(core.record_commit(at(1), &elsewhere, true), Err(BeaconRefusal::BadSignature));
        // No re-roll: another commitment for the same window is refused.
        let mut reroll = commit_of(&core, &v, 1);
        reroll.body.commitment = [5; 32];
        assert_eq!(core.record_commit(at(1), &reroll, true), Err(BeaconRefusal::Conflict));
        // No commitment once submissions close.
        let late = Keypair::from_seed([101; 32]);
        assert_eq!(core.record_commit(closes, &commit_of(&core, &late, 1), true), Err(BeaconRefusal::Closed));

        // Reveals only after the close, and only the committed secret.
        assert_eq!(
            core.record_reveal(closes - 1, &v.public(), &reveal_of(&core, &v, 1)),
            Err(BeaconRefusal::NotClosed)
        );
        let wrong = BeaconReveal { window: 1, secret: beacon::contribution_secret(&v, &core.network(), 2) };
        assert_eq!(core.record_reveal(closes, &v.public(), &wrong), Err(BeaconRefusal::Mismatch));
        let wrong = BeaconReveal { window: 1, secret: [0; 32] };
        assert_eq!(core.record_reveal(closes, &v.public(), &wrong), Err(BeaconRefusal::Mismatch));
        // Another party's secret under one's own key opens nothing.
        assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &t, 1)), Err(BeaconRefusal::Mismatch));
        assert_eq!(
            core.record_reveal(closes, &late.public(), &reveal_of(&core, &late, 1)),
            Err(BeaconRefusal::NotCommitted)
        );
        assert!(core.beacon_book(1).unwrap().reveals.is_empty(), "nothing refused was recorded");
        assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &v, 1)), Ok(true));
        assert_eq!(core.record_reveal(closes, &v.public(), &reveal_of(&core, &v, 1)), Ok(false));
    }

    #[test]
    fn the_challenge_waits_for_the_reveals_and_the_coordinator_alone_cannot_compute_it() {
        let mut core = Core::new(cfg_two_validators());
        core.set_coordinator(Keypair::from_seed([9; 32]).public());
        let (v1, v2, t) = (Keypair::from_seed([100; 32]), Keypair::from_seed([101; 32]), Keypair::from_seed([77; 32]));
        for k in [&v1, &v2, &t] {
            core.record_commit(at(1), &commit_of(&core, k, 1), true).unwrap();
        }
        let closes = core.schedule().closes_at(1);
        let deadline = closes + core.config().reveal_ms;
        // Closed, nothing revealed: not fixed (the coordinator's secret alone fixes nothing).
        assert!(core.reveal(1, closes).is_none());
        assert!(core.reveal_frame(1, closes).is_none());
        // A validator's verdict waits for the challenge (its assignment).
        assert_eq!(core.record_verdict(closes, &verdict(1, miner(1), 1, false), true), Err(VerdictError::NotClosed));
        core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, 1)).unwrap();
        core.record_reveal(closes, &t.public(), &reveal_of(&core, &t, 1)).unwrap();
        assert!(core.reveal(1, closes + 1).is_none(), "v2 may still reveal");
        core.record_reveal(closes + 1, &v2.public(), &reveal_of(&core, &v2, 1)).unwrap();
        // All revealed: fixed before the deadline.
        let challenge = core.reveal(1, closes + 1).expect("every contribution revealed");
        assert_ne!(challenge, core.coordinator_only_challenge(1), "the operator could not compute it in advance");
        assert_ne!(challenge, core.secrets(1).challenge);
        // Anyone recomputes it from the public reveal.
        let r = core.reveal_frame(1, closes + 1).unwrap();
        assert_eq!(r.contributions.len(), 3);
        assert!(r.withheld.is_empty());
        let commitment = core.window_info(1, at(1)).unwrap().commitment;
        assert_eq!(beacon::check_reveal(&r, &core.network(), &commitment), Ok(challenge));
        assert_eq!(core.record_verdict(closes + 1, &verdict(1, miner(1), 1, false), true), Ok(()));

        // Window 2: v2 withholds. Fixed at the deadline without it, and listed.
        for k in [&v1, &v2, &t] {
            core.record_commit(at(2), &commit_of(&core, k, 2), true).unwrap();
        }
        let closes = core.schedule().closes_at(2);
        let deadline2 = closes + core.config().reveal_ms;
        core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, 2)).unwrap();
        core.record_reveal(closes, &t.public(), &reveal_of(&core, &t, 2)).unwrap();
        assert!(core.reveal(2, deadline2 - 1).is_none());
        let r = core.reveal_frame(2, deadline2).expect("fixed at the deadline");
        assert_eq!(r.withheld.iter().map(|c| c.body.party).collect::<Vec<_>>(), vec![v2.public()]);
        assert_eq!(
            beacon::check_reveal(&r, &core.network(), &core.window_info(2, at(2)).unwrap().commitment).unwrap().0,
            r.challenge
        );
        assert_eq!(core.record_reveal(deadline2, &v2.public(), &reveal_of(&core, &v2, 2)), Err(BeaconRefusal::Fixed));
        assert_eq!(core.withheld(deadline2).get(&v2.public()), Some(&vec![2]));
        core.observe(deadline2);
        let st = core.validator_statuses();
        let shown = |k: &Keypair| st.iter().find(|s| s.key == k.public().to_string()).unwrap().beacon_withheld.clone();
        assert_eq!((shown(&v1), shown(&v2)), (vec![], vec![2]), "/api/validators shows who withheld");
        assert!(deadline > closes - LEN, "window 1's deadline came before window 2's close");
        // A restarted core with the stored books recomputes the same challenges.
        let mut again = Core::new(cfg_two_validators());
        again.set_coordinator(Keypair::from_seed([9; 32]).public());
        for w in [1, 2] {
            again.restore_beacon(w, core.beacon_book(w).cloned().unwrap());
        }
        assert_eq!(again.reveal(1, deadline2), Some(challenge));
        assert_eq!(again.reveal(2, deadline2).map(|s| s.0), Some(r.challenge));
    }

    /// Issue 16 item 3: the second validator that confirms a failure must be
    /// in the miner's committee for the window (three validators, committees
    /// of two: a validator outside the committee confirms nothing).
    #[test]
    fn a_ban_needs_two_members_of_the_miners_committee() {
        let mut c = cfg_two_validators();
        let third = Keypair::from_seed([102; 32]).public();
        c.access.validators.insert(third);
        let mut core = Core::new(c);
        let m = miner(1);
        store(&mut core, 1, m, 2);
        let closed = at(2) + 200;
        let committee = core.assignment(1, closed).unwrap().miners[&m].committee.clone();
        assert_eq!(committee.len(), 2);
        let outsider = *core.config().access.validators.iter().find(|v| !committee.contains(v)).unwrap();
        let signer = |k: &PublicKey| (100..=102u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
        let claim = |k: &PublicKey| by(signer(k), failing(1, m, [7; 32]));
        core.record_verdict(closed, &claim(&committee[0]), true).unwrap();
        core.record_verdict(closed, &claim(&outsider), true).unwrap();
        assert!(!core.confirmed(1, &m), "a validator outside the committee does not confirm");
        assert!(!core.is_banned(&m, 2));
        assert_eq!(core.standing(1), vec![(m, MinerStanding::Suspect)]);
        core.record_verdict(closed, &claim(&committee[1]), true).unwrap();
        assert!(core.confirmed(1, &m) && core.is_banned(&m, 2), "two members of the committee confirm");
    }
    /// Issue 16's compute goal: only a miner's prover proves its groups
    /// ahead of time. A failing verdict whose evidence needs the model waits
    /// as a confirmation for the other member of the committee, which proves
    /// only the cited rollouts: its failing verdict bans, its passing proof
    /// refutes (and flags) the claimant. Evidence the coordinator re-checks
    /// itself asks nobody, unless the coordinator cannot re-check.
    #[test]
    fn a_failure_waits_for_its_confirmer_and_only_the_confirming_verdict_bans() {
        let mut core = Core::new(cfg_two_validators());
        let (m, honest) = (miner(1), miner(2));
        store(&mut core, 1, m, 2);
        store(&mut core, 1, honest, 2);
        let closed = at(2) + 200;
        let signer = |k: &PublicKey| (100..=101u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
        let duty = core.duty(1, &m).unwrap();
        let (prover, confirmer) = (duty.committee[0], duty.committee[1]);
        assert_eq!(duty.confirmers(), [confirmer]);
        core.record_verdict(closed, &by(signer(&prover), failing(1, m, [7; 32])), true).unwrap();
        assert!(!core.is_banned(&m, 2), "one model-based failure bans nobody");
        assert_eq!(core.standing(1), vec![(m, MinerStanding::Suspect)]);
        let page = core.confirmations(&confirmer, None, 10);
        assert_eq!(page.items.len(), 1, "a pending confirmation for the other member");
        let c = &page.items[0];
        assert_eq!((c.window, c.miner, c.digests.clone(), c.claimants.clone()), (1, m, vec![[7; 32]], vec![prover]));
        assert!(c.groups.is_empty());
        assert!(core.confirmations(&prover, None, 10).items.is_empty(), "nothing for the claimant itself");
        // A verdict of the confirmer that does not cover the cited rollout leaves it waiting.
        let mut unrelated = by(signer(&confirmer), verdict(1, m, 1, false));
        unrelated.add_passed([8; 32]);
        core.record_verdict(closed, &unrelated, true).unwrap();
        assert!(!core.is_banned(&m, 2));
        assert_eq!(core.confirmations(&confirmer, None, 10).items.len(), 1);
        // The confirming verdict (the cited rollout fails for it too) bans.
        core.record_verdict(closed, &by(signer(&confirmer), failing(1, m, [7; 32])), true).unwrap();
        assert!(core.is_banned(&m, 2), "the confirming verdict bans");
        assert!(core.confirmations(&confirmer, None, 10).items.is_empty(), "answered");

        // The confirmer proves the cited rollout passing: no ban, the claimant is flagged.
        let duty = core.duty(1, &honest).unwrap();
        let (prover, confirmer) = (duty.committee[0], duty.committee[1]);
        core.record_verdict(closed, &by(signer(&prover), failing(1, honest, [9; 32])), true).unwrap();
        assert_eq!(core.confirmations(&confirmer, None, 10).items.len(), 1);
        let mut pass = by(signer(&confirmer), verdict(1, honest, 1, false));
        pass.add_passed([9; 32]);
        core.record_verdict(closed, &pass, true).unwrap();
        assert!(!core.is_banned(&honest, 2));
        assert!(core.is_flagged(&prover), "refuted by the confirmer's proof");
        assert!(core.confirmations(&confirmer, None, 10).items.is_empty());

        // Model-free evidence: the coordinator re-checks it, nobody else is asked.
        let mut core = Core::new(cfg_two_validators());
        store(&mut core, 1, m, 2);
        let duty = core.duty(1, &m).unwrap();
        let mut reward = by(signer(&duty.committee[0]), failing(1, m, [7; 32]));
        reward.evidence[0].check = tributary_protocol::wire::FailedCheck::Reward;
        core.record_verdict(closed, &reward, true).unwrap();
        assert!(core.confirmations(&duty.committee[1], None, 10).items.is_empty());
        core.set_model_free_recheck(false);
        assert_eq!(core.confirmations(&duty.committee[1], None, 10).items.len(), 1, "unless it cannot re-check");
    }

    /// Confirmations are paged in (window, miner) order.
    #[test]
    fn confirmations_are_paged() {
        let mut core = Core::new(cfg_two_validators());
        let closed = at(3) + 200;
        let signer = |k: &PublicKey| (100..=101u8).find(|s| Keypair::from_seed([*s; 32]).public() == *k).unwrap();
        let confirmer = Keypair::from_seed([101; 32]).public();
        let mut want = Vec::new();
        for w in 1..=2 {
            for n in 1..=3 {
                store(&mut core, w, miner(n), 1);
            }
            for n in 1..=3 {
                let duty = core.duty(w, &miner(n)).unwrap();
                core.record_verdict(closed, &by(signer(&duty.committee[0]), failing(w, miner(n), [n; 32])), true)
                    .unwrap();
                if duty.committee[1] == confirmer {
                    want.push((w, miner(n)));
                }
            }
        }
        want.sort();
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let page = core.confirmations(&confirmer, after, 1);
            assert!(page.items.len() <= 1);
            got.extend(page.items.iter().map(|c| (c.window, c.miner)));
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(got, want);
        assert!(!want.is_empty());
    }

    /// Issue 16: a party that withholds its reveal `WITHHOLD_LIMIT` times
    /// in a row stops counting: its commitments are refused, a validator's
    /// verdicts are set aside and `/api/validators` flags it, until an
    /// operator clears it. Fewer in a row (what a crash causes) change nothing.
    #[test]
    fn a_party_that_keeps_withholding_stops_counting_until_cleared() {
        let mut core = Core::new(cfg_two_validators());
        core.set_coordinator(Keypair::from_seed([9; 32]).public());
        let (v1, v2) = (Keypair::from_seed([100; 32]), Keypair::from_seed([101; 32]));
        let deadline = |core: &Core, w| core.schedule().closes_at(w) + core.config().reveal_ms;
        let limit = WITHHOLD_LIMIT as u64;
        // v2 commits to windows 1..=limit and reveals none; v1 reveals every one.
        for w in 1..=limit {
            for k in [&v1, &v2] {
                core.record_commit(at(w), &commit_of(&core, k, w), true).unwrap();
            }
            let closes = core.schedule().closes_at(w);
            core.record_reveal(closes, &v1.public(), &reveal_of(&core, &v1, w)).unwrap();
            core.observe(deadline(&core, w));
            let expect = w >= limit;
            assert_eq!(core.withholding(&v2.public(), deadline(&core, w)), expect, "after {w} withheld in a row");
            assert!(!core.withholding(&v1.public(), deadline(&core, w)));
        }
        let now = deadline(&core, limit);
        let next = limit + 1;
        assert_eq!(core.record_commit(now, &commit_of(&core, &v2, next + 1), true), Err(BeaconRefusal::Withholding));
        assert_eq!(core.record_commit(now, &commit_of(&core, &v1, next + 1), true), Ok(true));
        // Its verdicts stop counting (stored, set aside); /api/validators flags it.
        let m = miner(1);
        core.record_verdict(now, &by(101, verdict(limit, m, 1, false)), true).unwrap();
        assert!(core.verdicts_on(limit, &m).is_empty(), "a withholder's verdict is set aside");
        assert!(core.is_flagged(&v2.public()));
        let st = core.validator_statuses();
        let shown = st.iter().find(|s| s.key == v2.public().to_string()).unwrap();
        assert!(shown.flagged && shown.withholding, "{shown:?}");
        assert!(!st.iter().find(|s| s.key == v1.public().to_string()).unwrap().flagged);
        // An operator clears it: its verdicts count again, it may contribute again.
        core.clear_validator(&v2.public());
        assert!(!core.is_flagged(&v2.public()));
        assert_eq!(core.verdicts_on(limit, &m).len(), 1);
        assert_eq!(core.record_commit(now, &commit_of(&core, &v2, next + 1), true), Ok(true));
    }
}
