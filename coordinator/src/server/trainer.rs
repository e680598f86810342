//! The trainer's posts: step reports and checkpoint uploads (streamed to a
//! file, checked, handed to the relay, in force from the next window).

use std::sync::Arc;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::{self, ErrorCode, ErrorFrame, Frame};

use crate::net::{self, NetError};
use crate::relay::{Relay, RelayError};

use super::answers::relay_err;
use super::*;

/// Takes a trainer's step report (the QUIC `PostTrainerStats` frame, on a
/// connection authenticated as the trainer): checked against the configured
/// trainer key and its signature, stored, acknowledged. A refused report
/// stores nothing.
pub fn receive_trainer_stats(shared: &Shared, stats: wire::TrainerStats) -> Frame {
    let ok = stats.verify(&shared.network()).is_ok();
    let refuse = |code: ErrorCode, e: &dyn std::fmt::Display| {
        metrics::counter!("tributary_trainer_stats_refused_total").increment(1);
        tracing::warn!(error = %e, "trainer stats refused");
        Frame::Error(ErrorFrame { code, detail: e.to_string() })
    };
    match shared.core().check_trainer_stats(&stats.body, ok) {
        Ok(()) => {}
        Err(e @ (crate::core::StatsError::Unauthorized | crate::core::StatsError::BadSignature)) => {
            return refuse(ErrorCode::BadSignature, &e);
        }
        Err(e @ crate::core::StatsError::Malformed(_)) => return refuse(ErrorCode::Malformed, &e),
    }
    if let Err(e) = shared.store.put_trainer_stats(&stats) {
        return refuse(ErrorCode::Internal, &e);
    }
    let b = &stats.body;
    metrics::gauge!("tributary_trainer_loss").set(b.loss);
    metrics::gauge!("tributary_trainer_entropy").set(b.entropy);
    metrics::gauge!("tributary_trainer_step").set(b.step as f64);
    tracing::info!(window = b.window, step = b.step, loss = b.loss, "trainer stats stored");
    Frame::TrainerStatsAck(wire::TrainerStatsAck { window: b.window })
}

/// Removes an upload's partial file unless it was handed on.
pub(super) struct PartFile(Option<std::path::PathBuf>);

impl Drop for PartFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub(super) async fn receive_checkpoint(
    sh: &Arc<Shared>,
    recv: &mut quinn::RecvStream,
    peer: PublicKey,
    p: wire::PublishCheckpoint,
) -> Result<Frame, NetError> {
    use tokio::io::AsyncWriteExt;
    // Payloads are bounded: 64 GiB at most, streamed to a file chunk by chunk in order.
    if p.body.len > 64 << 30 {
        return Ok(err(ErrorCode::Malformed, "checkpoint too large"));
    }
    let upload = sh.relay.incoming_path(&p.body.id);
    // A failed or abandoned upload leaves no file behind.
    let mut part = PartFile(Some(upload.clone()));
    let mut file = tokio::fs::File::create(&upload).await?;
    let mut hasher = blake3::Hasher::new();
    let mut got = 0u64;
    let mut refusal = None;
    while got < p.body.len {
        let next = tokio::time::timeout(BODY_DEADLINE, net::read_frame(recv))
            .await
            .map_err(|_| NetError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "checkpoint chunk")))?;
        match next?.ok_or(NetError::Closed)? {
            Frame::CheckpointChunk(c) if c.id == p.body.id && c.offset == got => {
                if got + c.data.0.len() as u64 > p.body.len || c.data.0.is_empty() {
                    refusal = Some(err(ErrorCode::Malformed, "chunk empty or past the announced length"));
                    break;
                }
                hasher.update(&c.data.0);
                file.write_all(&c.data.0).await?;
                got += c.data.0.len() as u64;
            }
            _ => {
                refusal = Some(err(ErrorCode::UnexpectedFrame, "expected the next checkpoint chunk"));
                break;
            }
        }
    }
    file.sync_all().await?;
    drop(file);
    let refuse = |f: Frame| {
        if let Frame::Error(e) = &f {
            tracing::warn!(id = %p.body.id, window = p.body.window, code = ?e.code, detail = %e.detail, "checkpoint refused");
        }
        Ok(f)
    };
    if let Some(f) = refusal {
        return refuse(f);
    }
    if hasher.finalize().as_bytes() != &p.body.payload_hash {
        return refuse(err(ErrorCode::Malformed, "payload hash mismatch"));
    }
    // Signed by the authenticated trainer, for this network.
    if p.body.trainer != peer || p.verify(&sh.network()).is_err() {
        return refuse(err(ErrorCode::BadSignature, "checkpoint announcement signature"));
    }
    // The trainer's announcement of the genesis checkpoint (which the relay
    // holds from the start): kept and stored, so miners check the first model too.
    if let Some(e) = sh.relay.entry(&p.body.id)
        && sh.relay.announcement(&e.id).is_none()
        && e.id == sh.core().config().genesis_checkpoint
    {
        if !Relay::announces_full(&p, &e, &peer, &sh.network()) {
            return refuse(err(ErrorCode::Malformed, "not an announcement of the genesis file"));
        }
        if let Err(e) =
            sh.store.put_meta(crate::store::GENESIS_ANNOUNCEMENT, &postcard::to_stdvec(&p).unwrap_or_default())
        {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        sh.relay.set_announcement(p.clone());
        tracing::info!(id = %p.body.id, "genesis checkpoint announced by the trainer");
    }
    // Idempotent for the same checkpoint; never two checkpoints for one window.
    if sh.relay.entry(&p.body.id).is_some() {
        return Ok(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }));
    }
    match sh.store.checkpoints() {
        Ok(all) => {
            if let Some((_, a)) = all.iter().find(|(_, a)| a.body.window == p.body.window) {
                let e = RelayError::WindowTaken { window: p.body.window, existing: a.body.id };
                return refuse(relay_err(&e));
            }
        }
        Err(e) => return refuse(err(ErrorCode::Internal, &e.to_string())),
    }
    let relay = sh.relay.clone();
    let ann = p.clone();
    let incoming = part.0.take().unwrap_or_else(|| upload.clone());
    // The window it takes effect from is decided once it is durable, below.
    let ingested = tokio::task::spawn_blocking(move || relay.ingest(&ann, &incoming, 0)).await;
    let mut entry = match ingested {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return refuse(relay_err(&e)),
        Err(e) => return refuse(err(ErrorCode::Internal, &e.to_string())),
    };
    // In force from the first window that opens after it is durable: stored
    // with the window that is next now, applied only if that window still
    // has not opened once the write is done (else stored again, later).
    let mut from = sh.core().checkpoint_from(now_ms(), &p.body);
    loop {
        entry.from_window = from;
        if let Err(e) = sh.store.put_checkpoint(from, &p, &entry) {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        let next = {
            let mut core = sh.core();
            if core.publish_checkpoint_from(now_ms(), from, &p.body) {
                break;
            }
            core.checkpoint_from(now_ms(), &p.body)
        };
        tracing::warn!(id = %p.body.id, from, next, "a window opened while the checkpoint was being stored; moved");
        if let Err(e) = sh.store.delete_checkpoint(from) {
            return refuse(err(ErrorCode::Internal, &e.to_string()));
        }
        from = next;
    }
    sh.relay.set_announcement(p.clone());
    sh.relay.insert(entry);
    metrics::counter!("tributary_checkpoints_published_total").increment(1);
    tracing::info!(id = %p.body.id, window = p.body.window, from, "checkpoint published");
    Ok(Frame::CheckpointStored(wire::CheckpointStored { id: p.body.id }))
}
