//! Paged reads of closed windows for validators and the trainer: rollouts,
//! the window index, standing and weights documents.

use std::sync::Arc;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::{self, ErrorCode, Frame, Role, Rollouts};

use super::*;

/// A page of a closed window's rollouts, at most [`ROLLOUTS_ANSWER_BYTES`]
/// of them. Blocking: waits for a commit in progress ([`Seal`]) and reads the store.
pub(super) fn fetch(sh: &Arc<Shared>, role: Role, f: wire::FetchRollouts) -> Frame {
    let now = now_ms();
    let core = sh.core();
    if !core.closed(f.window, now) {
        return err(ErrorCode::NotYet, "window's submissions have not closed");
    }
    if role == Role::Trainer
        && let Some(m) = &f.miner
        && core.is_banned(m, f.window)
    {
        return Frame::Rollouts(Rollouts { window: f.window, items: vec![], next: None });
    }
    drop(core);
    // The window closed at `now`: a commit still running may add to it, any
    // later one leaves it out. Wait for the running one.
    drop(sh.seal.lock());
    let limit = (f.limit as usize).clamp(1, 256);
    match sh.store.rollouts_within(f.window, f.miner.as_ref(), f.after, limit, ROLLOUTS_ANSWER_BYTES) {
        Ok((items, next)) => {
            let items = if role == Role::Trainer {
                let core = sh.core();
                items
                    .into_iter()
                    .filter(|b| {
                        Rollout::decode(b, &RolloutLimits::DEFAULT)
                            .is_ok_and(|r| !core.is_banned(&PublicKey(r.miner), f.window))
                    })
                    .collect()
            } else {
                items
            };
            Frame::Rollouts(Rollouts { window: f.window, items: items.into_iter().map(wire::Blob).collect(), next })
        }
        Err(e) => err(ErrorCode::Internal, &e.to_string()),
    }
}

/// A page of a closed window's index ([`Store::window_index`]), at most
/// [`wire::WINDOW_INDEX_ANSWER_BYTES`] of entries; the trainer's leaves out
/// banned miners, as its fetches do. Blocking, like [`fetch`].
pub(super) fn window_index(sh: &Arc<Shared>, role: Role, g: &wire::GetWindowIndex) -> Frame {
    if !sh.core().closed(g.window, now_ms()) {
        return err(ErrorCode::NotYet, "window's submissions have not closed");
    }
    drop(sh.seal.lock());
    let banned: std::collections::HashSet<PublicKey> = if role == Role::Trainer {
        let core = sh.core();
        core.miners().keys().filter(|m| core.is_banned(m, g.window)).copied().collect()
    } else {
        Default::default()
    };
    let keep = |m: &PublicKey| !banned.contains(m);
    match sh.store.window_index(g.window, g.after.as_ref(), sh.list_answer_bytes(wire::WINDOW_INDEX_ANSWER_BYTES), keep)
    {
        Ok((miners, next)) => Frame::WindowIndex(wire::WindowIndex { window: g.window, miners, next }),
        Err(e) => err(ErrorCode::Internal, &e.to_string()),
    }
}

/// What one standing entry costs on the wire, at most (key, variant).
pub(super) const STANDING_ENTRY_BYTES: usize = 33;

/// A page of a window's standing: miners after `g.after` in key order, at
/// most [`wire::STANDING_ANSWER_BYTES`] of entries.
pub(super) fn standing_page(sh: &Arc<Shared>, g: &wire::GetStanding) -> Frame {
    let mut all = sh.core().standing(g.window);
    all.sort_unstable_by_key(|(m, _)| *m);
    let per_page = (sh.list_answer_bytes(wire::STANDING_ANSWER_BYTES) / STANDING_ENTRY_BYTES).max(1);
    let from = g.after.map_or(0, |a| all.partition_point(|(m, _)| *m <= a));
    let rest = all.get(from..).unwrap_or_default();
    let miners: Vec<_> = rest.iter().take(per_page).copied().collect();
    let next = (rest.len() > miners.len()).then(|| miners.last().map(|(m, _)| *m)).flatten();
    Frame::Standing(wire::Standing { window: g.window, miners, next })
}

/// Part of a weights document's bytes: the latest, or the one of `g.window`.
pub(super) fn weights_part(sh: &Arc<Shared>, g: &wire::GetWeights) -> Frame {
    let doc = match g.window {
        Some(w) => sh.store.weights_doc(w),
        None => sh.store.latest_weights_doc(),
    };
    let doc = match doc {
        Ok(Some(d)) => d,
        Ok(None) => return err(ErrorCode::NotYet, "no weights document signed for that interval yet"),
        Err(e) => return err(ErrorCode::Internal, &e.to_string()),
    };
    let bytes = doc.encode();
    let part = sh.list_answer_bytes(wire::WEIGHTS_PART_BYTES);
    let start = usize::try_from(g.offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(part).min(bytes.len());
    let data = wire::Blob(bytes.get(start..end).unwrap_or_default().to_vec());
    Frame::Weights(wire::WeightsPart { window: doc.body.window, len: bytes.len() as u64, offset: g.offset, data })
}
