//! The operators' live status page: `GET /` serves a self-contained page
//! (inline CSS, JS and SVG; no network beyond this coordinator) that polls
//! `GET /api/status` every second and draws it.
//!
//! Everything shown is what the coordinator itself holds: the window clock,
//! per-miner counts of door decisions and verdicts, weights, each window's
//! stored rollouts (count per miner, mean reward, mean completion length, read
//! back from the database), validators' verdicts per window, the relay's
//! checkpoint and delta history, and the trainer's signed step reports (loss,
//! entropy, clip fractions, kept/dropped groups, delta size), which the
//! trainer sends after each publication ([`crate::server::receive_trainer_stats`], stored per
//! publication window, also served at `GET /api/training`).
//!
//! The status and the miners' list are snapshots at most [`SNAPSHOT_MS`]
//! old, shared by every request: a dashboard tab (or anyone who can reach the
//! listener) costs the coordinator at most one computation a second, and a
//! computation reads only the verdicts of the windows shown and the rollouts
//! stored since the last one. An operator's live ban, unban or cleared
//! validator ([`Shared::note_admin_change`]) makes the next request build a
//! new snapshot, so the dashboard shows it at once.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::TrainerStats;

use crate::relay::CheckpointJson;
use crate::server::Shared;
use crate::store::StoreError;

/// Windows of history the status reports.
pub const HISTORY_WINDOWS: u64 = 48;

/// The whole status (`GET /api/status`).
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The coordinator's key (hex).
    pub coordinator: String,
    /// The coordinator's clock.
    pub now_ms: u64,
    /// The window in progress (none before genesis).
    pub window: Option<WindowId>,
    /// Window length.
    pub window_ms: u64,
    /// Submission grace after a window ends.
    pub grace_ms: u64,
    /// When the current window opened.
    pub opens_at_ms: u64,
    /// When the current window ends (submissions are taken for `grace_ms` more).
    pub ends_at_ms: u64,
    /// Milliseconds until the current window ends.
    pub time_left_ms: u64,
    /// Active environment.
    pub env: String,
    /// Groups per miner per window.
    pub groups_per_miner: u32,
    /// Rollouts per group.
    pub group_size: u32,
    /// Checkpoint miners must use now (hex).
    pub checkpoint: String,
    /// Miners, by key.
    pub miners: Vec<MinerRow>,
    /// Rollouts refused at the door, by reason (every miner and anonymous peers).
    pub door_refusals: BTreeMap<String, u64>,
    /// Validators' verdicts over the recent windows (those of `windows`).
    pub verdicts: VerdictTotals,
    /// Recent windows, oldest first.
    pub windows: Vec<WindowRow>,
    /// Every checkpoint the relay holds, oldest first.
    pub checkpoints: Vec<CheckpointJson>,
    /// The interval of the latest signed weights document (the miners'
    /// `weight` is from it), if one is signed yet.
    pub weights_interval: Option<WindowId>,
    /// The trainer's step reports of the recent publication windows, oldest first.
    pub training: Vec<TrainingJson>,
    /// Each validator: flagged (its evidence refuted, its verdicts set aside) or not.
    pub validators: Vec<crate::bans::ValidatorStatus>,
}

/// One training step as the trainer reported it (`GET /api/training`).
#[derive(Debug, Clone, Serialize)]
pub struct TrainingJson {
    /// The window the step's checkpoint was published for.
    pub window: WindowId,
    /// The checkpoint published (hex).
    pub checkpoint: String,
    /// First window trained on.
    pub first_trained: WindowId,
    /// Last window trained on.
    pub last_trained: WindowId,
    /// Optimiser step.
    pub step: u64,
    /// Learning rate.
    pub lr: f64,
    /// Total loss.
    pub loss: f64,
    /// Policy-gradient part.
    pub pg_loss: f64,
    /// KL part.
    pub kl: f64,
    /// Mean token entropy.
    pub entropy: f64,
    /// Fraction of sequences clipped low.
    pub clip_low_frac: f64,
    /// Fraction of sequences clipped high.
    pub clip_high_frac: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Mean reward of the sequences trained on.
    pub reward_mean: f64,
    /// Their reward standard deviation.
    pub reward_std: f64,
    /// Sequences trained on.
    pub seqs: u64,
    /// Completion tokens trained on.
    pub tokens: u64,
    /// Groups kept.
    pub groups_kept: u64,
    /// Groups dropped.
    pub groups_dropped: u64,
    /// Groups held for verdicts.
    pub groups_held: u64,
    /// Payload bytes published (delta or full).
    pub payload_bytes: u64,
    /// Full checkpoint bytes.
    pub checkpoint_bytes: u64,
    /// Whether the payload is a delta.
    pub delta: bool,
    /// Changed / total elements of the delta.
    pub change_fraction: Option<f64>,
    /// The trainer's key (hex).
    pub trainer: String,
    /// The trainer's signature (hex) over `postcard(body)` under `tributary/trainer-stats/v1`.
    pub signature: String,
}

impl From<&TrainerStats> for TrainingJson {
    fn from(s: &TrainerStats) -> Self {
        let b = &s.body;
        Self {
            window: b.window,
            checkpoint: b.checkpoint.to_string(),
            first_trained: b.first_trained,
            last_trained: b.last_trained,
            step: b.step,
            lr: b.lr,
            loss: b.loss,
            pg_loss: b.pg_loss,
            kl: b.kl,
            entropy: b.entropy,
            clip_low_frac: b.clip_low_frac,
            clip_high_frac: b.clip_high_frac,
            grad_norm: b.grad_norm,
            reward_mean: b.reward_mean,
            reward_std: b.reward_std,
            seqs: b.seqs,
            tokens: b.tokens,
            groups_kept: b.groups_kept,
            groups_dropped: b.groups_dropped,
            groups_held: b.groups_held,
            payload_bytes: b.payload_bytes,
            checkpoint_bytes: b.checkpoint_bytes,
            delta: b.delta,
            change_fraction: b.change_fraction,
            trainer: b.trainer.to_string(),
            signature: s.signature.to_string(),
        }
    }
}

/// The trainer's reports of publication windows `from..=to` as JSON.
pub fn training(shared: &Shared, from: WindowId, to: WindowId) -> Result<Vec<TrainingJson>, StoreError> {
    Ok(shared.store.trainer_stats(from, to)?.iter().map(Into::into).collect())
}

/// One miner.
#[derive(Debug, Clone, Serialize)]
pub struct MinerRow {
    /// Key (hex).
    pub key: String,
    /// Rollouts acknowledged (ever).
    pub accepted: u64,
    /// Rollouts refused at the door (ever).
    pub refused: u64,
    /// Refusals by reason.
    pub refused_by_reason: BTreeMap<&'static str, u64>,
    /// accepted / (accepted + refused), if anything was submitted.
    pub acceptance: Option<f64>,
    /// Rollouts stored in the last closed window.
    pub last_window_rollouts: u64,
    /// Rollouts stored per minute over the recent closed windows.
    pub rollouts_per_min: f64,
    /// Validated rollouts (most conservative validator) over the recent windows.
    pub valid: u64,
    /// Rollouts the validators checked over the recent windows.
    pub checked: u64,
    /// Weight now (0 when none).
    pub weight: f64,
    /// Banned in the current window.
    pub banned: bool,
    /// Banned through this window, if ever.
    pub banned_through: Option<WindowId>,
    /// Checkpoint of its last accepted rollout (hex).
    pub generating: Option<String>,
}

/// Verdict counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerdictTotals {
    /// Verdicts (one per validator, miner and window).
    pub verdicts: u64,
    /// Rollouts checked.
    pub checked: u64,
    /// Rollouts that passed every check.
    pub valid: u64,
    /// Verdicts with a hard failure (proof, log-probs, prompt, reward...).
    pub hard_failures: u64,
    /// Soft check failures (distribution statistics).
    pub soft_failures: u64,
}

impl VerdictTotals {
    fn add(&mut self, v: &tributary_protocol::wire::VerdictBody) {
        self.verdicts += 1;
        self.checked += u64::from(v.checked);
        self.valid += u64::from(v.valid);
        self.hard_failures += u64::from(v.hard_failure);
        self.soft_failures += u64::from(v.soft_failures);
    }
}

/// One window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowRow {
    /// The window.
    pub window: WindowId,
    /// Whether its submissions have closed.
    pub closed: bool,
    /// The checkpoint in force (hex).
    pub checkpoint: String,
    /// Rollouts stored.
    pub rollouts: u64,
    /// Rollouts stored per miner (hex key).
    pub by_miner: BTreeMap<String, u64>,
    /// Mean reward of the stored rollouts (as the miners computed it).
    pub mean_reward: Option<f64>,
    /// Fraction of stored rollouts with reward > 0.
    pub solved: Option<f64>,
    /// Mean completion length in tokens.
    pub mean_completion_tokens: Option<f64>,
    /// Verdicts on the window.
    pub verdicts: VerdictTotals,
}

/// How long an answer of the dashboard is served again before it is
/// recomputed: however many requests arrive, the database and the core's
/// lock are visited at most once per this many milliseconds per answer.
pub const SNAPSHOT_MS: u64 = 1_000;

/// One window's stored rollouts as read so far (in arrival order).
#[derive(Debug, Default)]
struct WindowSums {
    /// The next arrival number to read.
    next: u64,
    row: WindowRow,
    reward: f64,
    solved: u64,
    tokens: u64,
}

/// What the dashboard keeps between requests: each recent window's running
/// sums (every stored rollout is decoded once, when it is new) and the
/// latest answers, served for [`SNAPSHOT_MS`].
#[derive(Debug, Default)]
pub struct History {
    windows: Mutex<BTreeMap<WindowId, WindowSums>>,
    status: Mutex<Option<Snap<Status>>>,
    miners: Mutex<Option<Snap<Miners>>>,
}

/// A snapshot: when it was made, after how many live operator actions
/// ([`Shared::admin_changes`]), and the answer.
type Snap<T> = (u64, u64, Arc<T>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The snapshot in `slot` if it was made less than [`SNAPSHOT_MS`] before
/// `now_ms` and no operator action was applied since, else a new one from
/// `make` (concurrent callers wait for it).
fn snapshot<T, E>(
    slot: &Mutex<Option<Snap<T>>>,
    shared: &Shared,
    now_ms: u64,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<Arc<T>, E> {
    let mut slot = lock(slot);
    // Read before `make`: an action applied while it runs makes the next call build again.
    let changes = shared.admin_changes();
    if let Some((at, seen, v)) = slot.as_ref()
        && *seen == changes
        && (*at..at.saturating_add(SNAPSHOT_MS)).contains(&now_ms)
    {
        return Ok(v.clone());
    }
    let v = Arc::new(make()?);
    *slot = Some((now_ms, changes, v.clone()));
    Ok(v)
}

impl History {
    /// The status at `now_ms`: the snapshot of the last second, or a new one
    /// (reads the database: call off the async threads).
    pub fn status(&self, shared: &Shared, now_ms: u64) -> Result<Arc<Status>, StoreError> {
        snapshot(&self.status, shared, now_ms, || status(shared, self, now_ms))
    }

    /// Every miner and synced peer (`GET /api/miners`): the snapshot of the
    /// last second, or a new one (the core is locked only to copy the
    /// counts; the rows are built after).
    pub fn miners(&self, shared: &Shared, now_ms: u64) -> Arc<Miners> {
        match snapshot(&self.miners, shared, now_ms, || Ok::<_, std::convert::Infallible>(miners(shared, now_ms))) {
            Ok(m) => m,
            Err(never) => match never {},
        }
    }

    /// Brings the rows of windows `first..=last` up to date with the store
    /// (reading only the rollouts stored since the last call) and forgets older ones.
    fn window_rows(&self, shared: &Shared, first: WindowId, last: WindowId) -> Result<Vec<WindowRow>, StoreError> {
        let mut windows = lock(&self.windows);
        windows.retain(|w, _| *w >= first);
        let mut rows = Vec::new();
        for window in first..=last {
            let sums = windows.entry(window).or_default();
            sums.row.window = window;
            read_new_rollouts(shared, window, sums)?;
            rows.push(sums.row.clone());
        }
        Ok(rows)
    }
}

fn read_new_rollouts(shared: &Shared, window: WindowId, sums: &mut WindowSums) -> Result<(), StoreError> {
    loop {
        let (items, more) = shared.store.rollouts_since(window, sums.next, crate::store::PAGE_BYTES)?;
        for (seq, bytes) in &items {
            sums.next = seq + 1;
            // Stored rollouts passed the door checks; one that no longer decodes is skipped.
            let Ok(r) = Rollout::decode(bytes, &RolloutLimits::DEFAULT) else { continue };
            sums.row.rollouts += 1;
            *sums.row.by_miner.entry(PublicKey(r.miner).to_string()).or_default() += 1;
            sums.reward += f64::from(r.reward);
            sums.solved += u64::from(r.reward > 0.0);
            sums.tokens += r.completion().len() as u64;
        }
        if !more {
            break;
        }
    }
    let row = &mut sums.row;
    if row.rollouts > 0 {
        let n = row.rollouts as f64;
        row.mean_reward = Some(sums.reward / n);
        row.solved = Some(sums.solved as f64 / n);
        row.mean_completion_tokens = Some(sums.tokens as f64 / n);
    }
    Ok(())
}

/// One miner (`GET /api/miners`).
#[derive(Debug, Clone, Serialize)]
pub struct MinerJson {
    /// Rollouts acknowledged (ever).
    pub accepted: u64,
    /// Refusals by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Banned in the current window.
    pub banned: bool,
    /// Banned through this window, if ever.
    pub banned_through: Option<u64>,
    /// Checkpoint of the miner's last accepted rollout (hex).
    pub checkpoint: Option<String>,
    /// Checkpoint the miner last said it holds (hex).
    pub synced: Option<String>,
}

/// Miner key (hex) → its row.
pub type Miners = BTreeMap<String, MinerJson>;

fn miners(shared: &Shared, now_ms: u64) -> Miners {
    let peers = shared.relay.peers();
    // Copied under the lock, turned into rows after.
    let (stats, banned, roles) = {
        let core = shared.core();
        let w = core.current_window(now_ms).unwrap_or(0);
        let stats: Vec<_> = core.miners().iter().map(|(k, m)| (*k, m.clone())).collect();
        let banned: HashSet<PublicKey> =
            stats.iter().map(|(k, _)| k).chain(peers.keys()).filter(|k| core.is_banned(k, w)).copied().collect();
        // The trainer and the validators download checkpoints too: they are not miners.
        let access = core.access();
        let roles: HashSet<PublicKey> = access.validators.iter().chain(access.trainer.iter()).copied().collect();
        (stats, banned, roles)
    };
    let mut out: Miners = stats
        .into_iter()
        .map(|(k, m)| {
            let p = peers.get(&k).copied().unwrap_or_default();
            let row = MinerJson {
                accepted: m.accepted,
                rejected: m.rejected,
                banned: banned.contains(&k),
                banned_through: m.banned_through,
                checkpoint: p.generating.map(|c| c.to_string()),
                synced: p.holds.map(|c| c.to_string()),
            };
            (k.to_string(), row)
        })
        .collect();
    // Peers that synced a checkpoint but have no rollout yet (not the
    // trainer or a validator, nor a key that only connected, as `doctor` does).
    for (k, p) in peers {
        if roles.contains(&k) || (p.generating.is_none() && p.holds.is_none()) {
            continue;
        }
        out.entry(k.to_string()).or_insert_with(|| MinerJson {
            accepted: 0,
            rejected: BTreeMap::new(),
            banned: banned.contains(&k),
            banned_through: None,
            checkpoint: p.generating.map(|c| c.to_string()),
            synced: p.holds.map(|c| c.to_string()),
        });
    }
    out
}

/// Computes the status at `now_ms` (reads the database: call off the async threads).
pub fn status(shared: &Shared, history: &History, now_ms: u64) -> Result<Status, StoreError> {
    let (schedule, cfg_env, groups, group_size, current, weights_upto) = {
        let core = shared.core();
        let c = core.config();
        let current = core.current_window(now_ms);
        (*core.schedule(), c.env, c.groups_per_miner, c.group_size, current, current.unwrap_or(0).saturating_sub(2))
    };
    let w = current.unwrap_or(0);
    let first = w.saturating_sub(HISTORY_WINDOWS - 1);
    let mut windows = match current {
        Some(_) => history.window_rows(shared, first, w)?,
        None => Vec::new(),
    };
    for row in &mut windows {
        row.closed = schedule.closes_at(row.window) <= now_ms;
    }
    // The verdicts of the windows shown, not every verdict ever.
    let mut verdicts = VerdictTotals::default();
    let mut per_miner: BTreeMap<PublicKey, (u64, u64)> = BTreeMap::new();
    for v in shared.store.verdicts_from(first)? {
        let b = &v.body;
        if b.window > w {
            continue;
        }
        verdicts.add(b);
        if let Some(row) = windows.iter_mut().find(|r| r.window == b.window) {
            row.verdicts.add(b);
        }
        let e = per_miner.entry(b.miner).or_default();
        e.0 += u64::from(b.valid);
        e.1 += u64::from(b.checked);
    }
    let signed = crate::weights::latest(shared)?;
    let training = training(shared, first, w.saturating_add(1))?;
    let core = shared.core();
    for row in &mut windows {
        row.checkpoint = core.checkpoint_for(row.window).to_string();
    }
    let weights_interval = signed.as_ref().map(|d| d.body.window);
    let weights: BTreeMap<PublicKey, f64> = match signed {
        Some(d) => d.body.weights.into_iter().collect(),
        None => core
            .delayed_weights(weights_upto, crate::weights::PAY_DELAY_WINDOWS, shared.key.public())
            .weights
            .into_iter()
            .collect(),
    };
    let peers = shared.relay.peers();
    let closed_rows: Vec<&WindowRow> = windows.iter().filter(|r| r.closed && r.rollouts > 0).collect();
    let last_closed = windows.iter().rev().find(|r| r.closed);
    let span_min = closed_rows.len() as f64 * schedule.length_ms() as f64 / 60_000.0;
    let mut door_refusals: BTreeMap<String, u64> =
        core.anonymous_rejections().iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let mut miners: Vec<MinerRow> = core
        .miners()
        .iter()
        .map(|(k, m)| {
            let hex = k.to_string();
            for (r, n) in &m.rejected {
                *door_refusals.entry(r.to_string()).or_default() += n;
            }
            let refused: u64 = m.rejected.values().sum();
            let total: u64 = closed_rows.iter().map(|r| r.by_miner.get(&hex).copied().unwrap_or(0)).sum();
            let (valid, checked) = per_miner.get(k).copied().unwrap_or_default();
            MinerRow {
                accepted: m.accepted,
                refused,
                refused_by_reason: m.rejected.clone(),
                acceptance: (m.accepted + refused > 0).then(|| m.accepted as f64 / (m.accepted + refused) as f64),
                last_window_rollouts: last_closed.and_then(|r| r.by_miner.get(&hex).copied()).unwrap_or(0),
                rollouts_per_min: if span_min > 0.0 { total as f64 / span_min } else { 0.0 },
                valid,
                checked,
                weight: weights.get(k).copied().unwrap_or(0.0),
                banned: core.is_banned(k, w),
                banned_through: m.banned_through,
                generating: peers.get(k).and_then(|p| p.generating).map(|c| c.to_string()),
                key: hex,
            }
        })
        .collect();
    miners.sort_by(|a, b| a.key.cmp(&b.key));
    let ends_at_ms = schedule.opens_at(w.saturating_add(1));
    Ok(Status {
        coordinator: shared.key.public().to_string(),
        now_ms,
        window: current,
        window_ms: schedule.length_ms(),
        grace_ms: schedule.grace_ms(),
        opens_at_ms: schedule.opens_at(w),
        ends_at_ms,
        time_left_ms: if current.is_some() { ends_at_ms.saturating_sub(now_ms) } else { 0 },
        env: cfg_env.to_string(),
        groups_per_miner: groups,
        group_size,
        checkpoint: core.checkpoint_for(w).to_string(),
        miners,
        door_refusals,
        verdicts,
        windows,
        checkpoints: {
            let mut c: Vec<CheckpointJson> = shared.relay.entries().iter().map(Into::into).collect();
            c.sort_by_key(|e| (e.from_window, e.window));
            c
        },
        weights_interval,
        training,
        validators: core.validator_statuses(),
    })
}

/// The page: static HTML; its script fills it from `/api/status`.
pub const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Tributary coordinator</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}
main{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:14px;padding:14px 20px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;overflow:auto;min-width:0}
p.note{margin:6px 0 0;font-size:12px;color:#7a8499;white-space:normal}
svg{max-width:100%;height:auto}
section.wide{grid-column:1 / span 2}
h2{font-size:14px;margin:0 0 8px;text-transform:uppercase;letter-spacing:.04em;color:#55607a}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:right;padding:3px 8px;border-bottom:1px solid #eef0f3;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
code{font-size:12px}
.bar{height:8px;background:#dde1e7;border-radius:4px;width:220px;display:inline-block;vertical-align:middle}
.bar>div{height:8px;background:#3b82f6;border-radius:4px}
.bad{color:#b91c1c;font-weight:600}.ok{color:#15803d}
.muted{color:#7a8499}
svg text{font-size:11px;fill:#55607a}
</style></head>
<body>
<header><h1>Tributary coordinator</h1>
<span>window <b id="window">-</b></span>
<span>time left <b id="left">-</b> <span class="bar"><div id="leftbar" style="width:0"></div></span></span>
<span>env <b id="env">-</b></span>
<span>checkpoint <code id="checkpoint">-</code></span>
<span>weights signed for window <b id="weightswin">-</b></span>
<span class="muted" id="updated">connecting…</span></header>
<main>
<section class="wide"><h2>Miners</h2><table id="miners"><thead><tr><th>miner</th><th>accepted</th><th>refused</th><th>acceptance</th><th>last window</th><th>rollouts/min</th><th>valid / checked</th><th>weight</th><th>status</th></tr></thead><tbody></tbody></table>
<p class="note" id="miners-note">weight: the miner's share of the latest signed weights, from its verified rollouts over the recent windows; the status says why a weight is 0.</p></section>
<section class="wide"><h2>Validators</h2><table id="validators"><thead><tr><th>validator</th><th>verdicts counted</th><th>refuted</th><th>cleared</th><th>latest refutation</th><th>status</th></tr></thead><tbody></tbody></table>
<p class="note">status: no verdict yet (authorised, has posted nothing), counted (its verdicts count), or flagged (another party's proof refuted its evidence; its verdicts are set aside).</p></section>
<section><h2>Mean reward per window</h2><div id="reward"></div></section>
<section><h2>Rollouts per window</h2><div id="volume"></div></section>
<section><h2>Training loss per publication window</h2><div id="loss"></div></section>
<section><h2>Entropy and clipping per publication window</h2><div id="entropy"></div></section>
<section><h2>Verification outcomes</h2><table id="verdicts"><tbody></tbody></table>
<h2 style="margin-top:10px">Refused at the door, by check</h2><table id="door"><tbody></tbody></table></section>
<section><h2>Windows</h2><table id="windows"><thead><tr><th>window</th><th>rollouts</th><th>mean reward</th><th>solved</th><th>tokens</th><th>verdicts valid/checked</th><th>checkpoint</th></tr></thead><tbody></tbody></table>
<p class="note" id="windows-note">mean reward: the average reward of the window's stored rollouts (0 to 1, as the environment scores a completion). solved: the share of stored rollouts whose reward is above 0 (a partly right answer counts as solved where the reward rule gives partial credit). tokens: mean completion length.</p></section>
<section class="wide"><h2>Training steps (signed by the trainer)</h2><table id="training"><thead><tr><th>published for</th><th>step</th><th>trained on</th><th>loss</th><th>pg loss</th><th>kl</th><th>entropy</th><th>clipped</th><th>reward mean ± std</th><th>groups kept / dropped</th><th>payload</th><th>changed</th></tr></thead><tbody></tbody></table></section>
<section class="wide"><h2>Checkpoints and deltas</h2><table id="checkpoints"><thead><tr><th>checkpoint</th><th>published for</th><th>in force from</th><th>full</th><th>delta</th><th>delta / full</th></tr></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c]));
const short = h => h ? esc(h.slice(0, 12)) : "-";
const pct = x => x == null ? "-" : (100 * x).toFixed(1) + "%";
const num = (x, d) => x == null ? "-" : Number(x).toFixed(d);
const bytes = n => n == null ? "-" : n >= 1048576 ? (n / 1048576).toFixed(2) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B";
function rows(tbody, list) { tbody.innerHTML = list.map(r => "<tr>" + r.map(c => "<td>" + c + "</td>").join("") + "</tr>").join(""); }
function chart(el, points, label, max) {
  const W = 520, H = 170, L = 40, B = 22, T = 8;
  if (!points.length) { el.innerHTML = '<p class="muted">no windows yet</p>'; return; }
  const xs = points.map(p => p[0]), lo = Math.min(...xs), hi = Math.max(lo + 1, Math.max(...xs));
  const top = max != null ? max : Math.max(1e-9, ...points.map(p => p[1]));
  const X = x => L + (W - L - 8) * (x - lo) / (hi - lo), Y = y => T + (H - T - B) * (1 - y / top);
  const path = points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
  const dots = points.map(p => '<circle cx="' + X(p[0]).toFixed(1) + '" cy="' + Y(p[1]).toFixed(1) + '" r="2.5" fill="#3b82f6"/>').join("");
  el.innerHTML = '<svg width="' + W + '" height="' + H + '" role="img" aria-label="' + esc(label) + '">' +
    '<line x1="' + L + '" y1="' + Y(0) + '" x2="' + (W - 8) + '" y2="' + Y(0) + '" stroke="#ccd"/>' +
    '<line x1="' + L + '" y1="' + T + '" x2="' + L + '" y2="' + Y(0) + '" stroke="#ccd"/>' +
    '<text x="2" y="' + (T + 8) + '">' + num(top, 2) + '</text><text x="2" y="' + Y(0) + '">0</text>' +
    '<text x="' + L + '" y="' + (H - 6) + '">window ' + lo + '</text><text x="' + (W - 70) + '" y="' + (H - 6) + '">window ' + hi + '</text>' +
    '<path d="' + path + '" fill="none" stroke="#3b82f6" stroke-width="2"/>' + dots + '</svg>';
}
function lines(el, series, label) {
  const W = 520, H = 170, L = 48, B = 22, T = 8, pts = series.flatMap(s => s.points);
  if (!pts.length) { el.innerHTML = '<p class="muted">no training steps reported yet</p>'; return; }
  const xs = pts.map(p => p[0]), lo = Math.min(...xs), hi = Math.max(lo + 1, Math.max(...xs));
  const ys = pts.map(p => p[1]);
  let bot = Math.min(0, ...ys), top = Math.max(0, ...ys);
  if (top - bot < 1e-9) top = bot + 1;
  const X = x => L + (W - L - 8) * (x - lo) / (hi - lo), Y = y => T + (H - T - B) * (top - y) / (top - bot);
  const body = series.map(s => {
    const path = s.points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    const dots = s.points.map(p => '<circle class="pt" cx="' + X(p[0]).toFixed(1) + '" cy="' + Y(p[1]).toFixed(1) + '" r="2.5" fill="' + s.color + '"/>').join("");
    return '<path d="' + path + '" fill="none" stroke="' + s.color + '" stroke-width="2"/>' + dots;
  }).join("");
  const legend = series.map((s, i) => '<text x="' + (L + 8 + 130 * i) + '" y="' + (T + 10) + '" style="fill:' + s.color + '">' + esc(s.name) + '</text>').join("");
  el.innerHTML = '<svg width="' + W + '" height="' + H + '" role="img" aria-label="' + esc(label) + '" data-points="' + pts.length + '">' +
    '<line x1="' + L + '" y1="' + Y(0) + '" x2="' + (W - 8) + '" y2="' + Y(0) + '" stroke="#ccd"/>' +
    '<line x1="' + L + '" y1="' + T + '" x2="' + L + '" y2="' + (H - B) + '" stroke="#ccd"/>' +
    '<text x="2" y="' + (T + 8) + '">' + num(top, 3) + '</text><text x="2" y="' + (H - B) + '">' + num(bot, 3) + '</text>' +
    '<text x="' + L + '" y="' + (H - 6) + '">window ' + lo + '</text><text x="' + (W - 70) + '" y="' + (H - 6) + '">window ' + hi + '</text>' +
    body + legend + '</svg>';
}
// Why a miner's weight is what it is.
function minerStatus(m, s) {
  if (m.banned) return '<span class="bad">banned' + (m.banned_through == null ? "" : " through window " + m.banned_through) + '</span>';
  if (m.weight > 0) return '<span class="ok">earning</span>';
  if (s.weights_interval == null) return '<span class="muted">weight 0: no weights signed yet</span>';
  if (m.checked == 0) return '<span class="muted">weight 0: no verdict on its rollouts yet</span>';
  if (m.valid == 0) return '<span class="bad">weight 0: none of its checked rollouts passed</span>';
  return '<span class="muted">weight 0: its verified rollouts are not in the signed weights\' windows yet</span>';
}
function draw(s) {
  $("window").textContent = s.window == null ? "not started" : s.window;
  $("left").textContent = (s.time_left_ms / 1000).toFixed(1) + " s";
  $("leftbar").style.width = (100 * s.time_left_ms / Math.max(1, s.window_ms)).toFixed(1) + "%";
  $("env").textContent = s.env + " · " + s.groups_per_miner + "×" + s.group_size;
  $("checkpoint").textContent = s.checkpoint.slice(0, 16);
  $("updated").textContent = "updated " + new Date(s.now_ms).toLocaleTimeString();
  rows($("miners").tBodies[0], s.miners.map(m => [
    "<code>" + short(m.key) + "</code>", m.accepted, m.refused, pct(m.acceptance), m.last_window_rollouts,
    num(m.rollouts_per_min, 1), m.valid + " / " + m.checked, num(m.weight, 3),
    minerStatus(m, s)]));
  rows($("validators").tBodies[0], s.validators.map(v => [
    "<code>" + short(v.key) + "</code>", v.verdicts, v.refuted, v.cleared,
    v.refutations.length ? v.refutations[0].check + " on " + v.refutations[0].digest.slice(0, 12) + " (window " +
      v.refutations[0].window + ", by " + v.refutations[0].by_party + ")" : "",
    v.flagged ? '<span class="bad">flagged</span>' : v.verdicts > 0 ? '<span class="ok">counted</span>' :
      '<span class="muted">no verdict yet</span>']));
  const closed = s.windows.filter(w => w.closed && w.rollouts > 0);
  chart($("reward"), closed.map(w => [w.window, w.mean_reward]), "mean reward per window", 1);
  chart($("volume"), s.windows.map(w => [w.window, w.rollouts]), "rollouts per window", null);
  const t = s.training;
  $("weightswin").textContent = s.weights_interval == null ? "none yet" : s.weights_interval;
  lines($("loss"), [{name: "loss", color: "#dc2626", points: t.map(x => [x.window, x.loss])}], "training loss per window");
  lines($("entropy"), [{name: "entropy", color: "#7c3aed", points: t.map(x => [x.window, x.entropy])},
    {name: "clipped fraction", color: "#f59e0b", points: t.map(x => [x.window, x.clip_low_frac + x.clip_high_frac])}],
    "entropy and clipping per window");
  rows($("training").tBodies[0], t.slice().reverse().slice(0, 12).map(x => [
    x.window, x.step, x.first_trained == x.last_trained ? x.first_trained : x.first_trained + "–" + x.last_trained,
    num(x.loss, 4), num(x.pg_loss, 4), num(x.kl, 4), num(x.entropy, 3), pct(x.clip_low_frac + x.clip_high_frac),
    num(x.reward_mean, 3) + " ± " + num(x.reward_std, 3), x.groups_kept + " / " + x.groups_dropped,
    bytes(x.payload_bytes) + (x.delta ? " delta" : " full"), pct(x.change_fraction)]));
  const v = s.verdicts;
  rows($("verdicts").tBodies[0], [["verdicts", v.verdicts], ["rollouts checked", v.checked], ["passed every check", v.valid],
    ["hard failures (ban)", v.hard_failures], ["soft check failures", v.soft_failures]]);
  const door = Object.entries(s.door_refusals);
  rows($("door").tBodies[0], door.length ? door.map(([k, n]) => [esc(k), n]) : [["none", 0]]);
  rows($("windows").tBodies[0], s.windows.slice().reverse().filter(w => w.rollouts > 0 || !w.closed).slice(0, 12).map(w => [
    w.window + (w.closed ? "" : " (open)"), w.rollouts, num(w.mean_reward, 3), pct(w.solved), num(w.mean_completion_tokens, 1),
    w.verdicts.valid + " / " + w.verdicts.checked, "<code>" + short(w.checkpoint) + "</code>"]));
  rows($("checkpoints").tBodies[0], s.checkpoints.slice().reverse().map(c => [
    "<code>" + short(c.id) + "</code>", c.window, c.from_window, bytes(c.full_bytes), bytes(c.delta_bytes),
    c.delta_bytes == null ? "-" : pct(c.delta_bytes / c.full_bytes)]));
  // The page's width, for the check that nothing overflows a 1,280 px window.
  document.body.dataset.scrollWidth = document.documentElement.scrollWidth;
}
async function tick() {
  try { const r = await fetch("/api/status", {cache: "no-store"}); draw(await r.json()); }
  catch (e) { $("updated").textContent = "disconnected: " + e; }
  setTimeout(tick, 1000);
}
tick();
</script></body></html>
"##;
