//! Answers in request order, and the relay's checkpoint chunks: a chunk is
//! read only when the connection's writer gets to it, a piece at a time, within
//! the peer's share of the relay budget and a write deadline.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::{self, ErrorCode, Frame, Role};

use crate::net::{self};
use crate::relay::{PIECE_LEN, Payload, RelayError};

use super::*;

/// What the connection's writer sends next, in request order.
pub(super) enum Answer {
    /// A frame ready now or once its work is done (submissions).
    Ready(oneshot::Receiver<Frame>),
    /// A checkpoint payload chunk, read only when the writer gets to it, so
    /// a peer that does not read its answers makes the server hold at most
    /// one chunk per connection (and the relay budget caps them all).
    Payload { what: Payload, id: ContentId, offset: u64 },
    /// An answer computed when the writer gets to it, off the async workers
    /// (store reads of any size: rollouts, standing, weights).
    Later(LaterAnswer),
}

/// How an [`Answer::Later`] is computed.
pub(super) type LaterAnswer = Box<dyn FnOnce(&Arc<Shared>) -> Frame + Send>;

pub(super) fn relay_err(e: &RelayError) -> Frame {
    let code = match e {
        RelayError::NotFound(_) => ErrorCode::NotFound,
        RelayError::BadPayload(_) | RelayError::Delta(_) | RelayError::WindowTaken { .. } => ErrorCode::Malformed,
        RelayError::Io { .. } => ErrorCode::Internal,
    };
    err(code, &e.to_string())
}

/// How a payload answer ended short of being sent whole.
enum PayloadEnd {
    /// An answer to send instead (the payload is unknown, or unreadable
    /// before anything of it was written).
    Instead(Box<Frame>),
    /// The connection is done: a write failed, or waited past the deadline
    /// (the connection is then closed, `relay write deadline`).
    Closed,
}

/// Sends a payload chunk as one `CheckpointChunk` frame without holding it:
/// the frame's prefix, then the chunk a piece ([`PIECE_LEN`]) at a time, each
/// read only within `peer`'s share of the relay budget
/// ([`crate::relay::RelayBudget`]), its permit released once the piece is
/// written. A write that waits past the budget's deadline (the peer stopped
/// reading) closes the connection and releases what it held; the peer
/// resumes from the bytes it holds.
async fn send_payload(
    sh: &Arc<Shared>,
    send: &mut quinn::SendStream,
    conn: &quinn::Connection,
    (role, peer): (Role, PublicKey),
    what: Payload,
    id: ContentId,
    offset: u64,
) -> Result<(), PayloadEnd> {
    let relay = sh.relay.clone();
    let mut chunk = match tokio::task::spawn_blocking(move || relay.open_chunk(what, offset)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(PayloadEnd::Instead(Box::new(relay_err(&e)))),
        Err(e) => return Err(PayloadEnd::Instead(Box::new(err(ErrorCode::Internal, &e.to_string())))),
    };
    let budget = &sh.relay_budget;
    let deadline = budget.write_deadline();
    let timed_out = || {
        metrics::counter!("tributary_connections_closed_total", "reason" => "relay_write_deadline").increment(1);
        sh.warn_refusal("relay_write_deadline", || {
            format!("{} closed: a relay write waited more than {deadline:?} (the peer does not read)", peer.short())
        });
        conn.close(5u32.into(), b"relay write deadline");
        PayloadEnd::Closed
    };
    let prefix = wire::CheckpointChunk::frame_prefix(id, offset, chunk.len());
    match tokio::time::timeout(deadline, send.write_all(&prefix)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(PayloadEnd::Closed),
        Err(_) => return Err(timed_out()),
    }
    let piece_kib = (PIECE_LEN >> 10) as u32;
    while chunk.remaining() > 0 {
        // Bytes, not requests: a miner key pulls at most `relay_kib_per_sec`
        // (waiting here holds none of the relay budget).
        if role == Role::Miner {
            let n = std::num::NonZeroU32::new(piece_kib).unwrap_or(std::num::NonZeroU32::MIN);
            if sh.relay_rate.check_key_n(&peer, n).is_ok_and(|r| r.is_err()) {
                metrics::counter!("tributary_relay_throttled_total").increment(1);
                let _ = sh.relay_rate.until_key_n_ready(&peer, n).await;
            }
        }
        let permit = budget.acquire(peer, piece_kib).await;
        let read = tokio::task::spawn_blocking(move || {
            let p = chunk.read_piece(PIECE_LEN);
            (chunk, p)
        })
        .await;
        let piece = match read {
            Ok((back, Ok(p))) => {
                chunk = back;
                p
            }
            Ok((_, Err(e))) => {
                // Part of the frame is out: the stream cannot carry an error now.
                tracing::error!(error = %e, "reading a relay piece");
                conn.close(6u32.into(), b"relay read failed");
                return Err(PayloadEnd::Closed);
            }
            Err(e) => {
                tracing::error!(error = %e, "reading a relay piece");
                conn.close(6u32.into(), b"relay read failed");
                return Err(PayloadEnd::Closed);
            }
        };
        match tokio::time::timeout(deadline, send.write_all(&piece)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(PayloadEnd::Closed),
            Err(_) => return Err(timed_out()),
        }
        drop(piece);
        drop(permit);
    }
    Ok(())
}

/// The connection's writer: sends each answer in request order once it is
/// ready; a checkpoint chunk is read only now, a piece at a time
/// ([`send_payload`]). Ends when the answers end, a write fails or an
/// answer closes the connection; returns the stream for the close.
pub(super) async fn write_answers(
    wsh: Arc<Shared>,
    mut send: quinn::SendStream,
    conn: quinn::Connection,
    who: (Role, PublicKey),
    mut ans_rx: mpsc::Receiver<Answer>,
) -> quinn::SendStream {
    while let Some(a) = ans_rx.recv().await {
        let frame = match a {
            Answer::Ready(rx) => match rx.await {
                Ok(f) => f,
                Err(_) => continue,
            },
            Answer::Payload { what, id, offset } => {
                match send_payload(&wsh, &mut send, &conn, who, what, id, offset).await {
                    Ok(()) => continue,
                    Err(PayloadEnd::Instead(f)) => *f,
                    Err(PayloadEnd::Closed) => break,
                }
            }
            Answer::Later(f) => {
                let s = wsh.clone();
                tokio::task::spawn_blocking(move || f(&s))
                    .await
                    .unwrap_or_else(|e| err(ErrorCode::Internal, &e.to_string()))
            }
        };
        let close = matches!(&frame, Frame::Error(e) if e.code.closes_connection());
        let sent = net::write_frame(&mut send, &frame).await;
        drop(frame);
        if sent.is_err() || close {
            break;
        }
    }
    send
}
