//! Answers in request order, and the relay's checkpoint chunks: a chunk is
//! read only when the connection's writer gets to it, within the relay budget.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::wire::{self, ErrorCode, Frame};

use crate::net::{self};
use crate::relay::{CHUNK_LEN, Payload, RelayError};

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

/// Reads a payload chunk for the writer, within the relay budget; the
/// permit is held until the chunk is sent.
pub(super) async fn payload_answer(
    sh: &Arc<Shared>,
    what: Payload,
    id: ContentId,
    offset: u64,
) -> (Frame, Option<OwnedSemaphorePermit>) {
    let kib = (CHUNK_LEN >> 10) as u32;
    let permit = sh.relay_budget.clone().acquire_many_owned(kib).await.ok();
    let relay = sh.relay.clone();
    let frame = tokio::task::spawn_blocking(move || match relay.read(what, offset) {
        Ok(data) => Frame::CheckpointChunk(wire::CheckpointChunk { id, offset, data: wire::Blob(data) }),
        Err(e) => relay_err(&e),
    })
    .await
    .unwrap_or_else(|e| err(ErrorCode::Internal, &e.to_string()));
    (frame, permit)
}

/// The connection's writer: sends each answer in request order once it is
/// ready; a checkpoint chunk is read only now ([`payload_answer`]). Ends
/// when the answers end, a write fails or an answer closes the connection;
/// returns the stream for the close.
pub(super) async fn write_answers(
    wsh: Arc<Shared>,
    mut send: quinn::SendStream,
    mut ans_rx: mpsc::Receiver<Answer>,
) -> quinn::SendStream {
    while let Some(a) = ans_rx.recv().await {
        let (frame, permit) = match a {
            Answer::Ready(rx) => match rx.await {
                Ok(f) => (f, None),
                Err(_) => continue,
            },
            Answer::Payload { what, id, offset } => payload_answer(&wsh, what, id, offset).await,
            Answer::Later(f) => {
                let s = wsh.clone();
                let frame = tokio::task::spawn_blocking(move || f(&s))
                    .await
                    .unwrap_or_else(|e| err(ErrorCode::Internal, &e.to_string()));
                (frame, None)
            }
        };
        let close = matches!(&frame, Frame::Error(e) if e.code.closes_connection());
        let sent = net::write_frame(&mut send, &frame).await;
        drop(frame);
        drop(permit);
        if sent.is_err() || close {
            break;
        }
    }
    send
}
