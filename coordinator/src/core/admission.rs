//! Admission at the door: the checks a decoded rollout passes before it is
//! stored (window, assignment, contract, dedupe, the window's budget), its
//! two-phase reservation ([`Core::admit`], [`Core::commit`], [`Core::abort`]) and
//! what each miner stored.

use std::collections::{BTreeSet, HashMap, HashSet};

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, SamplingParams};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{RejectReason, Role, VerdictBody};

use super::*;

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

impl Candidate {
    /// The door facts of `r`, a decoded rollout `bytes` long when encoded,
    /// whose digest (what its miner signed, [`Rollout::digest`]) is `digest`.
    /// Checks nothing: the door checks the signature over `digest` before
    /// it calls this, and [`Core::admit`] the rest.
    pub fn of(r: &Rollout, digest: [u8; 32], bytes: u32) -> Candidate {
        Candidate {
            window: r.window,
            checkpoint: r.checkpoint,
            env: r.env,
            group: r.group,
            index: r.rollout,
            task_id: r.task_id,
            miner: PublicKey(r.miner),
            digest,
            content: r.content_hash(),
            shape: Shape::of(r, bytes),
        }
    }
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
    /// The shape of `r`, `bytes` long when encoded.
    pub fn of(r: &Rollout, bytes: u32) -> Shape {
        Shape {
            sampling: r.sampling,
            prompt_len: r.prompt_len,
            completion_len: r.tokens.len().saturating_sub(r.prompt_len as usize) as u32,
            max_token: r.tokens.iter().copied().max().unwrap_or(0),
            bytes,
        }
    }

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
    /// Rollouts stored per group: a group counts as work only whole (issue 28 item 4).
    pub per_group: BTreeMap<u32, u32>,
    /// Keyed 8-byte fingerprints of the digests stored, sorted: what
    /// [`Core::holds`] answers from (8 bytes a rollout, not 32; the key is
    /// the coordinator's secret, so a made-up digest matches one with
    /// probability 2⁻⁶⁴ per stored rollout).
    prints: Vec<u64>,
}

impl Submitted {
    /// The groups stored whole (`size` rollouts each).
    pub fn whole_groups(&self, size: u32) -> impl Iterator<Item = u32> + '_ {
        self.per_group.iter().filter(move |(_, n)| **n >= size).map(|(g, _)| *g)
    }

    /// Rollouts in whole groups.
    pub fn whole_rollouts(&self, size: u32) -> u64 {
        self.whole_groups(size).count() as u64 * u64::from(size)
    }

    fn holds(&self, print: u64) -> bool {
        self.prints.binary_search(&print).is_ok()
    }
}

/// How often the cached [`Core::proven_miners`] is recomputed even if no
/// verdict changed (trainer verdicts and bans change it too).
pub const PROVEN_REFRESH_MS: u64 = 10_000;

/// The cached [`Core::proven_miners`] of one window.
#[derive(Debug)]
pub(super) struct ProvenKeys {
    /// (window, verdicts, set-aside verdicts) it was computed for.
    stamp: (WindowId, usize, usize),
    at_ms: u64,
    keys: std::sync::Arc<HashSet<PublicKey>>,
}

/// Per-window bookkeeping.
#[derive(Debug, Default)]
pub(super) struct WindowBook {
    pub(super) digests: HashSet<[u8; 32]>,
    pub(super) slots: HashMap<PublicKey, HashSet<(u32, u32)>>,
    /// Bytes of the rollouts reserved or stored.
    pub(super) bytes: u64,
    /// Those bytes by miner (each key's share of the budget).
    pub(super) miner_bytes: HashMap<PublicKey, u64>,
}

impl Core {
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

    pub(super) fn check(&self, now_ms: u64, peer: &PublicKey, c: &Candidate) -> Result<(), RejectReason> {
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
        self.check_budget(now_ms, c)?;
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

    /// The window's storage budget, shared by a rule a Sybil cannot buy with
    /// keys alone (issue 29 item 1; docs/runbook.md "Admission"):
    ///
    /// - **Slots.** At most `max_window_miners` (M) keys store in a window.
    ///   Keys with proven work ([`Core::proven_miners`]: a pass on a stored
    ///   rollout in the last `weight_windows` windows, no failure held
    ///   against them, not banned) have `R = min(proven, ⌊3M/4⌋)` slots
    ///   reserved: new keys together take at most `M − R`, so however many
    ///   new keys arrive first, every proven key finds a slot while there
    ///   are at most ¾M of them.
    /// - **Bytes.** Each key stores at most `max_window_bytes / M` (fixed:
    ///   it depends on neither the order of arrival nor the last window's
    ///   count), so M keys never exceed the window's bytes and the first
    ///   key cannot take what the others need.
    ///
    /// A refusal of either is [`RejectReason::WindowFull`]: final for this
    /// window, the miner retries in the next one.
    pub(super) fn check_budget(&self, now_ms: u64, c: &Candidate) -> Result<(), RejectReason> {
        let cap = self.cfg.max_window_miners.max(1);
        let share = self.cfg.max_window_bytes / u64::from(cap);
        let book = self.books.get(&c.window);
        let mine = book.and_then(|b| b.miner_bytes.get(&c.miner)).copied().unwrap_or(0);
        if mine.saturating_add(u64::from(c.shape.bytes)) > share {
            return Err(RejectReason::WindowFull);
        }
        let Some(book) = book else { return Ok(()) };
        if book.bytes.saturating_add(u64::from(c.shape.bytes)) > self.cfg.max_window_bytes {
            return Err(RejectReason::WindowFull);
        }
        let known = book.slots.get(&c.miner).is_some_and(|s| !s.is_empty());
        if known {
            return Ok(());
        }
        let here = book.slots.values().filter(|s| !s.is_empty()).count();
        if here >= cap as usize {
            return Err(RejectReason::WindowFull);
        }
        let proven = self.proven_miners(now_ms, c.window);
        if proven.contains(&c.miner) {
            return Ok(());
        }
        let reserved = proven.len().min(cap as usize * 3 / 4);
        let new_here = book.slots.iter().filter(|(k, s)| !s.is_empty() && !proven.contains(*k)).count();
        if new_here >= cap as usize - reserved {
            return Err(RejectReason::WindowFull);
        }
        Ok(())
    }

    /// The keys with proven work as of `window`: a pass on a rollout the
    /// store holds, in a counted verdict (a member of the miner's committee,
    /// not set aside, or the trainer) on one of the `weight_windows`
    /// windows before `window`; minus any with a failure held against them
    /// there or banned in `window`. What [`Core::check_budget`] reserves
    /// slots for. Cached per window; recomputed when the verdicts change or
    /// every [`PROVEN_REFRESH_MS`].
    pub fn proven_miners(&self, now_ms: u64, window: WindowId) -> std::sync::Arc<HashSet<PublicKey>> {
        let stamp = (window, self.verdicts.len(), self.set_aside.len());
        if let Some(p) = self.proven.borrow().as_ref()
            && p.stamp == stamp
            && now_ms < p.at_ms.saturating_add(PROVEN_REFRESH_MS)
        {
            return p.keys.clone();
        }
        let from = window.saturating_sub(self.cfg.weight_windows);
        let lo = (from, PublicKey([0; 32]));
        let hi = (window, PublicKey([0; 32]));
        let mut proven = HashSet::new();
        let mut failed = HashSet::new();
        let mut note = |v: &VerdictBody| {
            if self.claim_holds(v) {
                failed.insert(v.miner);
            }
            if v.passed.iter().any(|d| self.holds(v.window, &v.miner, d)) {
                proven.insert(v.miner);
            }
        };
        for w in from..window {
            for v in self.tribunal.trainer_verdicts(w) {
                note(v);
            }
        }
        for (_, by_validator) in self.verdicts.range(lo..hi) {
            for v in by_validator.values().filter(|v| self.member(v)) {
                note(v);
            }
        }
        proven.retain(|k| !failed.contains(k) && !self.is_banned(k, window));
        let keys = std::sync::Arc::new(proven);
        *self.proven.borrow_mut() = Some(ProvenKeys { stamp, at_ms: now_ms, keys: keys.clone() });
        keys
    }

    /// What window `window` holds against its budget: (bytes, miners).
    pub fn window_usage(&self, window: WindowId) -> (u64, usize) {
        self.books.get(&window).map_or((0, 0), |b| (b.bytes, b.slots.values().filter(|s| !s.is_empty()).count()))
    }

    /// The reserved rollout is durable: count it.
    pub fn commit(&mut self, c: &Candidate) {
        let m = self.miners.entry(c.miner).or_default();
        m.accepted += 1;
        m.last_window = m.last_window.max(c.window);
        let print = self.fingerprint(&c.digest);
        let s = self.submitted.entry((c.window, c.miner)).or_default();
        s.rollouts = s.rollouts.saturating_add(1);
        s.groups.insert(c.group);
        *s.per_group.entry(c.group).or_default() += 1;
        if let Err(i) = s.prints.binary_search(&print) {
            s.prints.insert(i, print);
        }
        self.committees.borrow_mut().remove(&c.window);
    }

    /// The keyed fingerprint of a digest ([`Submitted`]): the first 8 bytes of
    /// its blake3 keyed by a key derived from the master secret.
    fn fingerprint(&self, digest: &[u8; 32]) -> u64 {
        let key = blake3::derive_key("tributary coordinator stored-digest fingerprints v1", &self.cfg.master);
        let h = blake3::keyed_hash(&key, digest);
        let mut b = [0u8; 8];
        b.copy_from_slice(&h.as_bytes()[..8]);
        u64::from_le_bytes(b)
    }

    /// Whether the store holds `digest` among `miner`'s rollouts of `window`
    /// (what the core keeps of them: the span the verdicts are kept for).
    /// Evidence and passes count only on such digests (issue 28 items 3, 7).
    pub fn holds(&self, window: WindowId, miner: &PublicKey, digest: &[u8; 32]) -> bool {
        self.submitted.get(&(window, *miner)).is_some_and(|s| s.holds(self.fingerprint(digest)))
    }

    /// What `miner` stored in `window` (while the weights may still look at it).
    pub fn submitted(&self, window: WindowId, miner: &PublicKey) -> Option<&Submitted> {
        self.submitted.get(&(window, *miner))
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
        let now = self.current_window(self.clock.get()).unwrap_or(0);
        let slot = match peer {
            Some(p) => {
                let m = self.miners.entry(*p).or_default();
                m.last_window = m.last_window.max(now);
                &mut m.rejected
            }
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
}
