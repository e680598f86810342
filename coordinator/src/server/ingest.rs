//! Miners' submissions: the stateless door checks, each connection's
//! ingestion pipeline, admission through the core, the group-commit writer
//! (durable before acknowledged) and door penalties.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{self, Rollout, RolloutLimits};
use tributary_protocol::window::Schedule;
use tributary_protocol::wire::{self, Ack, BatchAnswer, Frame, Outcome, Refused, RejectReason};

use crate::core::Candidate;
use crate::store::{Store, StoredRollout};

use super::*;

pub(super) struct WriteJob {
    pub(super) rollouts: Vec<StoredRollout>,
    /// Per rollout: whether it was stored (`false`: its window had closed
    /// before the commit), or why the commit failed.
    pub(super) done: oneshot::Sender<Result<Vec<bool>, String>>,
}

/// Seals windows: a rollout becomes durable only in a commit that began
/// before its window closed, and a fetch of a closed window waits for the
/// commit in progress, so every reader of a closed window sees the same set.
pub struct Seal {
    pub(super) lock: Mutex<()>,
    pub(super) schedule: Schedule,
}

impl Seal {
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The most rollouts the writer gathers into one transaction.
pub(super) const MAX_COMMIT_ROLLOUTS: usize = 4096;

/// Group commit: every job waiting (up to [`MAX_COMMIT_ROLLOUTS`] rollouts,
/// from any number of connections) is written in one durable transaction,
/// and each job is answered only after that commit. Admission is decided
/// by commit time: under the [`Seal`], a rollout whose window has closed is
/// left out (its submission is refused as `WrongWindow`).
pub(super) fn writer_loop(store: Arc<Store>, mut rx: mpsc::Receiver<WriteJob>, seal: Arc<Seal>, min_free: u64) {
    while let Some(first) = rx.blocking_recv() {
        let mut count = first.rollouts.len();
        let mut jobs = vec![first];
        while count < MAX_COMMIT_ROLLOUTS {
            let Ok(j) = rx.try_recv() else { break };
            count += j.rollouts.len();
            jobs.push(j);
        }
        let guard = seal.lock();
        let now = now_ms();
        // Moved, not copied: each rollout's bytes go to the database once.
        let mut all: Vec<StoredRollout> = Vec::with_capacity(jobs.iter().map(|j| j.rollouts.len()).sum());
        let mut done = Vec::with_capacity(jobs.len());
        let mut late = 0usize;
        for j in jobs {
            let mut flags = Vec::with_capacity(j.rollouts.len());
            for r in j.rollouts {
                let open = now < seal.schedule.closes_at(r.candidate.window);
                flags.push(open);
                if open {
                    all.push(r);
                } else {
                    late += 1;
                }
            }
            done.push((j.done, flags));
        }
        let started = Instant::now();
        // A nearly full disk refuses new rollouts (the miner retries) before
        // redb hits an I/O error; everything stored is still served.
        let free = store.free_bytes();
        let res = if all.is_empty() {
            Ok(())
        } else if free.is_some_and(|f| f < min_free) {
            metrics::counter!("tributary_rollouts_refused_disk_full_total").increment(all.len() as u64);
            Err(format!("disk nearly full: {} MiB free, {} MiB kept free", free.unwrap_or(0) >> 20, min_free >> 20))
        } else {
            store.put_rollouts(&all).map_err(|e| {
                if Store::is_poisoned(&e) {
                    // redb refuses everything after an I/O error until it is
                    // reopened: exit so the supervisor restarts the coordinator
                    // (every acknowledged rollout is durable).
                    tracing::error!(error = %e, "database unusable after an I/O error; exiting for a restart");
                    std::process::exit(75);
                }
                e.to_string()
            })
        };
        drop(guard);
        if late > 0 {
            tracing::warn!(late, "rollouts refused: their window closed before they could be committed");
        }
        if let Err(e) = &res {
            tracing::error!(error = %e, rollouts = all.len(), "storing rollouts failed; their submissions are refused");
        }
        metrics::histogram!("tributary_redb_commit_seconds").record(started.elapsed().as_secs_f64());
        for (d, flags) in done {
            let _ = d.send(res.clone().map(|()| flags));
        }
    }
}

/// Why a rollout failed the stateless door checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorRefusal {
    /// The reason sent back.
    pub reason: RejectReason,
    /// For a bad signature: the window and the miner the rollout names (only
    /// that miner can have sent bytes signed over its own key that fail).
    pub signer: Option<(u64, PublicKey)>,
}

impl From<RejectReason> for DoorRefusal {
    fn from(reason: RejectReason) -> Self {
        Self { reason, signer: None }
    }
}

/// Door checks that need no state: size, decoding, schema, signature.
pub fn door_check(bytes: &[u8]) -> Result<(Rollout, Candidate), RejectReason> {
    door(bytes).map_err(|r| r.reason)
}

/// [`door_check`], telling who signed a rollout whose signature fails.
pub fn door(bytes: &[u8]) -> Result<(Rollout, Candidate), DoorRefusal> {
    if bytes.len() > wire::MAX_ROLLOUT_LEN as usize {
        return Err(RejectReason::Oversized.into());
    }
    let r = Rollout::decode(bytes, &RolloutLimits::DEFAULT).map_err(|_| RejectReason::Malformed)?;
    let n = r.tokens.len();
    let p = r.prompt_len as usize;
    if p == 0 || p >= n || r.logprobs.len() != n - p || r.sketches.len() != n || !r.reward.is_finite() {
        return Err(RejectReason::Schema.into());
    }
    // The digest names the rollout and is what the miner signed: one encode,
    // one hash (the same computation as `Rollout::digest` and `Rollout::verify_signature`).
    let digest = r.digest();
    if rollout::verify_digest(&r.miner, &digest, &r.signature).is_err() {
        return Err(DoorRefusal { reason: RejectReason::BadSignature, signer: Some((r.window, PublicKey(r.miner))) });
    }
    let c = Candidate::of(&r, digest, bytes.len() as u32);
    Ok((r, c))
}

/// Records the coordinator's own hard verdict on `miner`'s `window` when a
/// refusal is one only that miner can have caused ([`Core::door_penalty`]),
/// and logs it at warn with its figures (the checkpoint the rollout named,
/// if it decoded, and the one its window uses) and the ban it starts.
pub(super) fn penalise(
    sh: &Shared,
    now: u64,
    window: u64,
    miner: &PublicKey,
    reason: RejectReason,
    named: Option<ContentId>,
) {
    let body = sh.core().door_penalty(now, window, miner, reason, sh.key.public());
    let Some(body) = body else { return };
    // Each penalty is a signature and an fsync'd write: fresh keys must not
    // buy them without bound (the rollout is refused all the same).
    if sh.penalty_limit.check().is_err() {
        metrics::counter!("tributary_door_penalties_skipped_total").increment(1);
        sh.warn_refusal("penalty_rate", || {
            format!(
                "door penalty not recorded (global limit {}/s): miner {} window {window} reason {}",
                sh.limits.penalties_per_sec,
                miner.short(),
                reason.as_str()
            )
        });
        return;
    }
    let v = wire::Verdict::sign(body, &sh.key, &sh.network());
    match sh.store.put_verdict(&v) {
        Ok(()) => {
            let mut core = sh.core();
            core.apply_verdict(&v.body);
            let banned_through = core.miners().get(miner).and_then(|m| m.banned_through);
            let window_checkpoint = core.checkpoint_for(window);
            drop(core);
            metrics::counter!("tributary_door_penalties_total", "reason" => reason.as_str()).increment(1);
            tracing::warn!(
                miner = %miner.short(),
                window,
                reason = reason.as_str(),
                named_checkpoint = ?named.map(|c| c.to_string()),
                %window_checkpoint,
                ?banned_through,
                "miner failed at the door"
            );
        }
        Err(e) => tracing::error!(error = %e, "storing a door penalty"),
    }
}

pub(super) fn count_reject(reason: RejectReason) {
    metrics::counter!("tributary_rollouts_rejected_total", "reason" => reason.as_str()).increment(1);
}

/// In-flight submission bytes per connection (KiB): past this, the
/// connection's reader waits for answers, and QUIC flow control slows the sender.
pub(super) const INFLIGHT_KIB: usize = 16 << 10;

/// Submissions of at least this many rollouts have their door checks on the
/// blocking pool; smaller ones on their own task.
pub(super) const BLOCKING_CHECKS: usize = 4;

/// One connection's ingestion pipeline. Door checks (decoding, signature) of
/// successive submissions run in parallel on their own tasks; admission
/// (window, assignment, dedupe) and the write queue follow the submission
/// order; each answer goes out, in order, once its rollouts are durable.
pub(super) struct Ingest {
    inflight: Arc<Semaphore>,
    /// Fires once the previous submission has been admitted and queued.
    admitted: Option<oneshot::Receiver<()>>,
}

impl Ingest {
    pub(super) fn new() -> Self {
        Self { inflight: Arc::new(Semaphore::new(INFLIGHT_KIB)), admitted: None }
    }

    /// Takes a submission of one (`Submit`) or several (`SubmitBatch`)
    /// encoded rollouts; the receiver yields its answer frame.
    pub(super) async fn submit(
        &mut self,
        sh: &Arc<Shared>,
        peer: &PublicKey,
        seq: u64,
        items: Vec<Vec<u8>>,
        batch: bool,
        now: u64,
    ) -> oneshot::Receiver<Frame> {
        let (tx, rx) = oneshot::channel();
        let started = Instant::now();
        let kib: usize = items.iter().map(|b| b.len().div_ceil(1024).max(1)).sum();
        let permits = u32::try_from(kib.min(INFLIGHT_KIB)).unwrap_or(u32::MAX);
        // The semaphores are never closed; without a permit the submission simply goes unthrottled.
        let permit = self.inflight.clone().acquire_many_owned(permits).await.ok();
        // And within the budget of all connections together.
        let global = sh.ingest_budget.clone().acquire_many_owned(permits).await.ok();
        // Rate limits, per rollout, in submission order.
        let mut bytes_in = 0u64;
        let items: Vec<Option<Vec<u8>>> = items
            .into_iter()
            .map(|bytes| {
                let kib = NonZeroU32::new((bytes.len() as u32).div_ceil(1024).max(1)).unwrap_or(NonZeroU32::MIN);
                let ok = matches!(sh.byte_limit.check_key_n(peer, kib), Ok(Ok(())))
                    && sh.rollout_limit.check_key(peer).is_ok();
                bytes_in += bytes.len() as u64 * u64::from(ok);
                ok.then_some(bytes)
            })
            .collect();
        metrics::counter!("tributary_rollout_bytes_total").increment(bytes_in);
        let (admitted_tx, admitted_rx) = oneshot::channel();
        let previous = self.admitted.replace(admitted_rx);
        let (sh, peer) = (sh.clone(), *peer);
        tokio::spawn(async move {
            let outcomes = ingest(&sh, peer, items, previous, admitted_tx, now, started).await;
            let answer = match (batch, outcomes.first()) {
                (false, Some(Outcome::Stored(digest))) => Frame::Ack(Ack { seq, digest: *digest }),
                (false, Some(Outcome::Refused(reason))) => Frame::Refused(Refused { seq, reason: *reason }),
                _ => Frame::BatchAnswer(BatchAnswer { seq, outcomes }),
            };
            let _ = tx.send(answer);
            drop(permit);
            drop(global);
        });
        rx
    }
}

pub(super) type Checked = Option<Result<(Candidate, Vec<u8>), DoorRefusal>>;

/// The stateless door checks of a submission's rollouts (`None`: rate limited).
pub(super) fn check_all(items: Vec<Option<Vec<u8>>>) -> Vec<Checked> {
    items.into_iter().map(|item| item.map(|bytes| door(&bytes).map(|(_, c)| (c, bytes)))).collect()
}

/// Checks, admits, stores and counts one submission's rollouts; returns
/// their outcomes in order. Nothing is `Stored` before its commit.
pub(super) async fn ingest(
    sh: &Arc<Shared>,
    peer: PublicKey,
    items: Vec<Option<Vec<u8>>>,
    previous: Option<oneshot::Receiver<()>>,
    admitted: oneshot::Sender<()>,
    now: u64,
    started: Instant,
) -> Vec<Outcome> {
    let n = items.len();
    let checked = if items.iter().flatten().count() >= BLOCKING_CHECKS {
        tokio::task::spawn_blocking(move || check_all(items)).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "door checks failed");
            vec![Some(Err(RejectReason::Internal.into())); n]
        })
    } else {
        check_all(items)
    };
    // Admission follows the submission order of the connection.
    if let Some(p) = previous {
        let _ = p.await;
    }
    let mut outcomes = vec![Outcome::Refused(RejectReason::Internal); n];
    let mut to_store = Vec::with_capacity(n);
    let mut slots = Vec::with_capacity(n);
    {
        let mut core = sh.core();
        for (i, c) in checked.into_iter().enumerate() {
            let mut penalty = None;
            let reason = match c {
                None => {
                    core.count_rejection(Some(&peer), RejectReason::RateLimited);
                    RejectReason::RateLimited
                }
                Some(Err(refusal)) => {
                    core.count_rejection(Some(&peer), refusal.reason);
                    // Signed over the peer's own key yet not verifying: only the peer can have sent that.
                    if let Some((window, _)) = refusal.signer.filter(|(_, s)| *s == peer) {
                        penalty = Some((window, None));
                    }
                    refusal.reason
                }
                Some(Ok((candidate, bytes))) => match core.admit(now, &peer, &candidate) {
                    Ok(()) => {
                        slots.push(i);
                        to_store.push(StoredRollout { candidate, bytes });
                        continue;
                    }
                    Err(reason) => {
                        penalty = Some((candidate.window, Some(candidate.checkpoint)));
                        if reason == RejectReason::WindowFull {
                            let (bytes, miners) = core.window_usage(candidate.window);
                            let cfg = core.config();
                            let (max_bytes, max_miners) = (cfg.max_window_bytes, cfg.max_window_miners);
                            sh.warn_refusal("window_budget", || {
                                format!(
                                    "rollout of {} refused (window_full): window {} holds {bytes} bytes of \
                                     {max_bytes} and {miners} miners of {max_miners} (a key's share: {} bytes)",
                                    peer.short(),
                                    candidate.window,
                                    max_bytes / u64::from(max_miners.max(1))
                                )
                            });
                        }
                        if reason == RejectReason::Schema {
                            let s = candidate.shape;
                            sh.warn_refusal("contract", || {
                                format!(
                                    "rollout of {} refused: outside window {}'s generation contract (temperature \
                                     {} max_new_tokens {} prompt {} completion {} max token {})",
                                    peer.short(),
                                    candidate.window,
                                    s.sampling.temperature,
                                    s.sampling.max_new_tokens,
                                    s.prompt_len,
                                    s.completion_len,
                                    s.max_token
                                )
                            });
                        }
                        reason
                    }
                },
            };
            count_reject(reason);
            sh.warn_refusal(reason.as_str(), || format!("rollout from {} refused: {}", peer.short(), reason.as_str()));
            outcomes[i] = Outcome::Refused(reason);
            if let Some((window, named)) = penalty {
                // In force before the next rollout is admitted, as for a stream of single submissions.
                drop(core);
                penalise(sh, now, window, &peer, reason, named);
                core = sh.core();
            }
        }
    }
    let candidates: Vec<Candidate> = to_store.iter().map(|r| r.candidate.clone()).collect();
    let done = if to_store.is_empty() {
        None
    } else {
        let (done_tx, done_rx) = oneshot::channel();
        match sh.writer.send(WriteJob { rollouts: to_store, done: done_tx }).await {
            Ok(()) => Some(done_rx),
            Err(_) => None,
        }
    };
    let _ = admitted.send(());
    if candidates.is_empty() {
        return outcomes;
    }
    let stored: Vec<Option<bool>> = match done {
        Some(rx) => match rx.await {
            Ok(Ok(flags)) => flags.into_iter().map(Some).collect(),
            _ => vec![None; candidates.len()],
        },
        None => vec![None; candidates.len()],
    };
    let mut accepted = 0u64;
    {
        let mut core = sh.core();
        for ((c, &i), stored) in candidates.iter().zip(&slots).zip(stored) {
            match stored {
                Some(true) => {
                    core.commit(c);
                    outcomes[i] = Outcome::Stored(c.digest);
                    accepted += 1;
                }
                // Its window closed before the commit: refused, as at the door.
                Some(false) => {
                    core.abort(c);
                    count_reject(RejectReason::WrongWindow);
                    outcomes[i] = Outcome::Refused(RejectReason::WrongWindow);
                }
                None => {
                    core.abort(c);
                    count_reject(RejectReason::Internal);
                }
            }
        }
    }
    if accepted > 0 {
        if let Some(last) = candidates.last() {
            sh.relay.note_generating(last.miner, last.checkpoint);
        }
        metrics::counter!("tributary_rollouts_accepted_total").increment(accepted);
        metrics::histogram!("tributary_ingest_latency_seconds").record(started.elapsed().as_secs_f64());
    }
    outcomes
}
