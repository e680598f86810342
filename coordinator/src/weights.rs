//! The signed weights document of every interval.
//!
//! When window `W + 1` ends (`Core::weights_interval`), the coordinator
//! computes the weights of interval `W` — the work of the windows ending at
//! `W − PAY_DELAY_WINDOWS`, zeroed by a hard failure claimed through `W`
//! ([`PAY_DELAY_WINDOWS`], `Core::delayed_weights`) —, signs them with its
//! key (`WeightsDoc`, domain `tributary/weights/v1`) and stores the document
//! in redb once; it never changes afterwards. A background task
//! ([`spawn_signer`]) does this at every window boundary, and after a restart
//! fills in the intervals it missed (at most [`MAX_BACKFILL`] of them).
//!
//! Served as `GET /api/weights` (the latest document, or `?window=W`),
//! `GET /api/weights/history` and the QUIC `GetWeights` frame. The JSON gives
//! the figures for reading and the exact signed document in hex
//! (`document`), which anyone checks against the coordinator's key with
//! `tributary_protocol::wire::WeightsDoc::decode_verified`.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Serialize;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::WeightsDoc;

use crate::server::{Shared, now_ms};
use crate::store::StoreError;

/// Windows a window's work waits before a signed document pays it, and a
/// failure caught meanwhile forfeits it (issue 28 item 9): a miner that
/// fakes a small share of its rollouts is otherwise paid for the windows
/// before its first catch. Measured with `netsim --economics 30 4` at two
/// groups of every miner per validator: a 1 % faker earns 0.071-0.095 of an
/// honest miner with no delay, 0.025-0.034 with 2 (docs/benchmarks.md §5b).
/// An honest miner is paid the same, 2 windows later.
pub const PAY_DELAY_WINDOWS: u64 = 2;

/// Intervals a restarted coordinator signs for at most (the newest ones).
pub const MAX_BACKFILL: u64 = 48;

/// A weights document as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct WeightsJson {
    /// The interval: the last window the weights account for.
    pub window: WindowId,
    /// The signing coordinator's key (hex).
    pub coordinator: String,
    /// Miner key (hex) → weight; the weights sum to 1 (or there are none).
    pub weights: BTreeMap<String, f64>,
    /// The ed25519 signature (hex) over `postcard(body)` under `tributary/weights/v1`.
    pub signature: String,
    /// The whole signed document, `postcard(WeightsDoc)`, in hex.
    pub document: String,
}

impl From<&WeightsDoc> for WeightsJson {
    fn from(d: &WeightsDoc) -> Self {
        Self {
            window: d.body.window,
            coordinator: d.body.coordinator.to_string(),
            weights: d.body.weights.iter().map(|(k, w)| (k.to_string(), *w)).collect(),
            signature: hex::encode(d.signature.0),
            document: hex::encode(d.encode()),
        }
    }
}

/// Signs and stores the document of every interval due at `now_ms` after
/// `signed_through` (the last interval known to be stored; `None`: read it
/// from the store). Returns the last interval stored, if any.
pub fn sign_due(
    shared: &Shared,
    now_ms: u64,
    signed_through: Option<WindowId>,
) -> Result<Option<WindowId>, StoreError> {
    let Some(due) = shared.core().weights_interval(now_ms) else { return Ok(signed_through) };
    let last = match signed_through {
        Some(w) => Some(w),
        None => shared.store.weights_docs(due, 1)?.first().map(|d| d.body.window),
    };
    if last.is_some_and(|l| l >= due) {
        return Ok(last);
    }
    let oldest = due.saturating_sub(MAX_BACKFILL - 1);
    let from = last.map_or(due, |l| l + 1).max(oldest);
    for w in from..=due {
        let body = shared.core().delayed_weights(w, PAY_DELAY_WINDOWS, shared.key.public());
        let doc = WeightsDoc::sign(body, &shared.key, &shared.network());
        if shared.store.put_weights_doc(&doc)? {
            metrics::gauge!("tributary_weights_interval").set(w as f64);
            tracing::info!(interval = w, miners = doc.body.weights.len(), "weights document signed");
        }
    }
    Ok(Some(due))
}

/// Runs [`sign_due`] a few times per window until the coordinator is dropped.
pub fn spawn_signer(shared: &Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let length = shared.core().schedule().length_ms();
    let tick = Duration::from_millis((length / 8).clamp(50, 1_000));
    tokio::spawn(async move {
        let mut through = None;
        loop {
            let Some(sh) = weak.upgrade() else { return };
            let res = tokio::task::spawn_blocking(move || sign_due(&sh, now_ms(), through)).await;
            match res {
                Ok(Ok(t)) => through = t,
                Ok(Err(e)) => tracing::error!(error = %e, "signing the weights document"),
                Err(e) => tracing::error!(error = %e, "weights signer task"),
            }
            tokio::time::sleep(tick).await;
        }
    })
}

/// The latest stored document.
pub fn latest(shared: &Shared) -> Result<Option<WeightsDoc>, StoreError> {
    shared.store.latest_weights_doc()
}
