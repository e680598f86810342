//! Contributions to each window's challenge (validators and the trainer):
//! recorded by the core, stored, acknowledged.

use std::sync::Arc;

use tributary_protocol::identity::PublicKey;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::{self, ErrorCode, Frame};

use super::*;

/// The prefix of the store's meta keys of each window's challenge contributions.
pub(super) const BEACON_META_PREFIX: &str = "beacon/";

/// The store's meta key of a window's contributions to its challenge.
pub(super) fn beacon_meta_key(window: WindowId) -> String {
    format!("{BEACON_META_PREFIX}{window}")
}

/// Stores the window's contributions after a new commitment or reveal, then
/// answers; a refusal is logged and answered as an error.
pub(super) fn beacon_answer(
    sh: &Arc<Shared>,
    peer: PublicKey,
    window: WindowId,
    res: Result<bool, crate::core::BeaconRefusal>,
) -> Frame {
    match res {
        Ok(false) => Frame::BeaconAck(wire::BeaconAck { window }),
        Ok(true) => {
            let book = sh.core().beacon_book(window).cloned().unwrap_or_default();
            match postcard::to_stdvec(&book) {
                Ok(bytes) => match sh.store.put_meta(&beacon_meta_key(window), &bytes) {
                    Ok(()) => Frame::BeaconAck(wire::BeaconAck { window }),
                    Err(e) => err(ErrorCode::Internal, &e.to_string()),
                },
                Err(e) => err(ErrorCode::Internal, &e.to_string()),
            }
        }
        Err(e) => {
            sh.warn_refusal("beacon", || format!("contribution of {} to window {window} refused: {e}", peer.short()));
            let code = match e {
                crate::core::BeaconRefusal::NotClosed => ErrorCode::NotYet,
                crate::core::BeaconRefusal::Unauthorized => ErrorCode::Unauthorized,
                crate::core::BeaconRefusal::BadSignature | crate::core::BeaconRefusal::Mismatch => {
                    ErrorCode::BadSignature
                }
                _ => ErrorCode::NotFound,
            };
            err(code, &e.to_string())
        }
    }
}
