//! Requests after the handshake: which frames each role may send, and the
//! dispatch of each frame to its handler (rate limits, body deadlines).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::{self, ErrorCode, ErrorFrame, Frame, Progress, Role, Tag, VerdictAck};

use crate::net::{self, NetError};
use crate::relay::Payload;

use super::answers::{Answer, relay_err};
use super::beacon::beacon_answer;
use super::ingest::Ingest;
use super::reads::{fetch, standing_page, weights_part, window_index};
use super::trainer::receive_checkpoint;
use super::verdicts::{confirmations_answer, log_failure, recheck};
use super::*;

/// Whether `role` may send a frame with `tag` after the handshake (checked
/// on the header, before the body is read).
pub(super) fn allowed(role: Role, tag: Tag) -> bool {
    use Tag as T;
    let any = matches!(
        tag,
        T::GetWindow | T::GetReveal | T::GetWeights | T::GetCheckpointPath | T::GetCheckpoint | T::GetDelta
    );
    any || match role {
        Role::Miner => matches!(tag, T::GetProgress | T::Submit | T::SubmitBatch),
        Role::Validator => matches!(
            tag,
            T::FetchRollouts
                | T::GetWindowIndex
                | T::GetWindowManifest
                | T::GetStanding
                | T::PostVerdict
                | T::PostBeaconCommit
                | T::PostBeaconReveal
                | T::GetConfirmations
        ),
        Role::Trainer => matches!(
            tag,
            T::FetchRollouts
                | T::GetWindowIndex
                | T::GetWindowManifest
                | T::GetStanding
                | T::PostTrainerStats
                | T::PublishCheckpoint
                | T::PostVerdict
                | T::PostBeaconCommit
                | T::PostBeaconReveal
        ),
    }
}

/// Returns `Ok(true)` if the connection must be closed for a violation.
pub(super) async fn serve_requests(
    conn: &quinn::Connection,
    recv: &mut quinn::RecvStream,
    sh: &Arc<Shared>,
    role: Role,
    peer: PublicKey,
    answers: &mpsc::Sender<Answer>,
) -> Result<bool, NetError> {
    let ready = |f: Frame| {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(f);
        Answer::Ready(rx)
    };
    let malformed = |e: &wire::WireError| {
        metrics::counter!("tributary_frames_refused_total", "reason" => "malformed").increment(1);
        sh.warn_refusal("malformed_frame", || format!("{} {}: malformed frame: {e}", role.as_str(), peer.short()));
        ready(Frame::Error(ErrorFrame { code: ErrorCode::Malformed, detail: e.to_string() }))
    };
    // Miners must keep talking; the configured validator and trainer keys may
    // stay silent (a training step takes minutes).
    let idle = (role == Role::Miner).then(|| Duration::from_millis(sh.limits.idle_timeout_ms.max(1)));
    let mut ingest = Ingest::new();
    loop {
        let header = match idle {
            Some(d) => match tokio::time::timeout(d, net::read_header(recv)).await {
                Ok(h) => h,
                Err(_) => {
                    metrics::counter!("tributary_connections_closed_total", "reason" => "idle").increment(1);
                    sh.warn_refusal("idle_timeout", || {
                        format!("miner {} closed: no frame for {} ms", peer.short(), sh.limits.idle_timeout_ms)
                    });
                    conn.close(4u32.into(), b"idle");
                    return Ok(false);
                }
            },
            None => net::read_header(recv).await,
        };
        let (tag, len) = match header {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(false),
            Err(NetError::Wire(e)) => {
                let _ = answers.send(malformed(&e)).await;
                return Err(NetError::Wire(e));
            }
            Err(e) => return Err(e),
        };
        if !allowed(role, tag) {
            metrics::counter!("tributary_frames_refused_total", "reason" => "unexpected").increment(1);
            sh.warn_refusal("unexpected_frame", || {
                format!("{} {}: {tag:?} ({len} bytes) not allowed, connection closed", role.as_str(), peer.short())
            });
            let detail = format!("{tag:?} not allowed for {}", role.as_str());
            let _ = answers.send(ready(err(ErrorCode::UnexpectedFrame, &detail))).await;
            return Ok(true);
        }
        let frame = match tokio::time::timeout(BODY_DEADLINE, net::read_body(recv, tag, len)).await {
            Ok(Ok(f)) => f,
            Ok(Err(NetError::Wire(e))) => {
                let _ = answers.send(malformed(&e)).await;
                return Err(NetError::Wire(e));
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                sh.warn_refusal("body_deadline", || {
                    format!(
                        "{} {}: {tag:?} body of {len} bytes not sent within {BODY_DEADLINE:?}",
                        role.as_str(),
                        peer.short()
                    )
                });
                return Ok(true);
            }
        };
        // A miner's requests other than submissions have their own budget
        // (the configured validators and trainer are trusted keys).
        if role == Role::Miner
            && !matches!(tag, Tag::Submit | Tag::SubmitBatch)
            && sh.request_limit.check_key(&peer).is_err()
        {
            metrics::counter!("tributary_requests_refused_total", "reason" => "rate_limited").increment(1);
            sh.warn_refusal("request_rate", || {
                format!("miner {}: {tag:?} refused (more than {}/s)", peer.short(), sh.limits.requests_per_sec)
            });
            if answers.send(ready(err(ErrorCode::RateLimited, "too many requests"))).await.is_err() {
                return Ok(false);
            }
            continue;
        }
        let now = now_ms();
        let answer = match (role, frame) {
            (_, Frame::GetWindow(g)) => {
                let core = sh.core();
                let w = g.window.or_else(|| core.current_window(now));
                match w.and_then(|w| core.window_info(w, now)) {
                    Some(info) => Frame::WindowInfo(info),
                    None => err(ErrorCode::NotYet, "window not open"),
                }
            }
            (_, Frame::GetReveal(g)) => match sh.core().reveal_frame(g.window, now) {
                Some(r) => Frame::Reveal(r),
                None => err(ErrorCode::NotYet, "submissions still open or contributions still being revealed"),
            },
            (Role::Validator | Role::Trainer, Frame::PostBeaconCommit(c)) => {
                let ok = c.body.party == peer && c.verify(&sh.network()).is_ok();
                let window = c.body.window;
                let res = sh.core().record_commit(now, &c, ok);
                beacon_answer(sh, peer, window, res)
            }
            (Role::Validator | Role::Trainer, Frame::PostBeaconReveal(r)) => {
                let window = r.window;
                let res = sh.core().record_reveal(now, &peer, &r);
                beacon_answer(sh, peer, window, res)
            }
            (_, Frame::GetWeights(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| weights_part(sh, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Miner, Frame::GetProgress(g)) => {
                Frame::Progress(Progress { window: g.window, slots: sh.core().progress(g.window, &peer) })
            }
            (Role::Miner, Frame::Submit(s)) => {
                let rx = ingest.submit(sh, &peer, s.seq, vec![s.rollout.0], false, now).await;
                if answers.send(Answer::Ready(rx)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Miner, Frame::SubmitBatch(b)) => {
                let items = b.rollouts.into_iter().map(|r| r.0).collect();
                let rx = ingest.submit(sh, &peer, b.seq, items, true, now).await;
                if answers.send(Answer::Ready(rx)).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::FetchRollouts(f)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| fetch(sh, role, f)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::GetStanding(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| standing_page(sh, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::GetWindowIndex(g)) => {
                let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| window_index(sh, role, &g)));
                if answers.send(later).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (Role::Validator | Role::Trainer, Frame::PostVerdict(v)) => {
                // Only the authenticated validator's (or trainer's) own verdicts, signed for this network.
                let ok = v.body.validator == peer && v.verify(&sh.network()).is_ok();
                let res = {
                    let mut core = sh.core();
                    core.record_verdict(now, &v.body, ok).map(|()| {
                        let b = &v.body;
                        if core.claims_failure(b) {
                            log_failure(&core, b, role.as_str());
                        }
                    })
                };
                match res {
                    Ok(()) => match sh.store.put_verdict(&v) {
                        // A failure waiting for confirmation: the coordinator
                        // re-runs what it can without a model first, so the
                        // ack comes after its own confirmation, if any.
                        Ok(())
                            if v.body.hard_failed().next().is_some()
                                && sh.core().pending(v.body.window, &v.body.miner) =>
                        {
                            let later = Answer::Later(Box::new(move |sh: &Arc<Shared>| {
                                recheck(sh, &v.body);
                                Frame::VerdictAck(VerdictAck { window: v.body.window, miner: v.body.miner })
                            }));
                            if answers.send(later).await.is_err() {
                                return Ok(false);
                            }
                            continue;
                        }
                        Ok(()) => Frame::VerdictAck(VerdictAck { window: v.body.window, miner: v.body.miner }),
                        Err(e) => err(ErrorCode::Internal, &e.to_string()),
                    },
                    Err(e) => {
                        sh.warn_refusal("verdict", || format!("verdict from {} refused: {e}", peer.short()));
                        err(ErrorCode::BadSignature, &e.to_string())
                    }
                }
            }
            (Role::Validator | Role::Trainer, Frame::GetWindowManifest(g)) => match sh.readers.get() {
                // Archived means closed: the archiver takes only closed windows.
                Some(r) => Frame::WindowManifest(r.answer(g.window, &sh.key, now).await),
                None => Frame::WindowManifest(wire::WindowManifest {
                    window: g.window,
                    manifest: None,
                    urls: vec![],
                    expires_ms: 0,
                }),
            },
            (Role::Validator, Frame::GetConfirmations(g)) => confirmations_answer(sh, &peer, &g),
            (Role::Trainer, Frame::PostTrainerStats(s)) => receive_trainer_stats(sh, s),
            (Role::Trainer, Frame::PublishCheckpoint(p)) => receive_checkpoint(sh, recv, peer, p).await?,
            (_, Frame::GetCheckpointPath(g)) => {
                sh.relay.note_holds(peer, g.have);
                match sh.relay.path(g.have, g.want) {
                    Ok(p) => Frame::CheckpointPath(p),
                    Err(e) => relay_err(&e),
                }
            }
            (_, Frame::GetCheckpoint(g)) => {
                if answers
                    .send(Answer::Payload { what: Payload::Full(g.id), id: g.id, offset: g.offset })
                    .await
                    .is_err()
                {
                    return Ok(false);
                }
                continue;
            }
            (_, Frame::GetDelta(g)) => {
                let what = Payload::Delta { base: g.base, id: g.id };
                if answers.send(Answer::Payload { what, id: g.id, offset: g.offset }).await.is_err() {
                    return Ok(false);
                }
                continue;
            }
            (_, other) => {
                metrics::counter!("tributary_frames_refused_total", "reason" => "unexpected").increment(1);
                let _ = answers
                    .send(ready(err(
                        ErrorCode::UnexpectedFrame,
                        &format!("{:?} not allowed for {}", other.tag(), role.as_str()),
                    )))
                    .await;
                return Ok(true);
            }
        };
        if answers.send(ready(answer)).await.is_err() {
            return Ok(false);
        }
    }
}
