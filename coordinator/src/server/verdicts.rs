//! Verdicts' side effects: logging failures, the coordinator's model-free
//! re-check of pending failures, and the confirmations a validator is asked for.

use tributary_protocol::identity::PublicKey;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::wire::{self, Frame};

use crate::core::Core;

use super::*;

/// The failures waiting for the authenticated validator's confirmation
/// (`Core::confirmations`): one page.
pub(super) fn confirmations_answer(sh: &Shared, peer: &PublicKey, g: &wire::GetConfirmations) -> Frame {
    Frame::Confirmations(sh.core().confirmations(peer, g.after, g.limit))
}

/// Logs a verdict that says its miner failed: banned once confirmed, else
/// pending (with the evidence a second party would re-check).
pub(super) fn log_failure(core: &Core, b: &wire::VerdictBody, signer_role: &str) {
    let through = core.miners().get(&b.miner).and_then(|m| m.banned_through);
    let evidence: Vec<String> = b
        .evidence
        .iter()
        .map(|e| format!("{} {} at {:?}: {:?}", hex::encode(&e.digest[..8]), e.check.as_str(), e.position, e.figures))
        .collect();
    let what = if core.fails(b) {
        "miner failed a verdict and is banned"
    } else {
        "miner failed a verdict: pending until a second party confirms it"
    };
    tracing::warn!(
        miner = %b.miner.short(),
        window = b.window,
        signer = %b.validator.short(),
        role = signer_role,
        checked = b.checked,
        valid = b.valid,
        hard = b.hard_failure,
        soft = b.soft_failures,
        banned_through = ?through,
        reasons = ?b.reasons,
        evidence = ?evidence,
        "{what}"
    );
}

/// Re-runs the model-free checks ([`crate::bans::Rechecker`]) on the stored
/// rollouts a pending failure's hard evidence names; a failure found there
/// is the coordinator's own, signed, stored and applied as its verdict,
/// which confirms the miner's failure (and bans it).
pub(super) fn recheck(sh: &Shared, body: &wire::VerdictBody) {
    let Some(rc) = &sh.recheck else { return };
    let (w, m) = (body.window, body.miner);
    let digests: std::collections::BTreeSet<[u8; 32]> = body.hard_failed().copied().collect();
    let info = {
        let core = sh.core();
        if !core.pending(w, &m) {
            return;
        }
        match core.window_info(w, now_ms()) {
            Some(i) => i,
            None => return,
        }
    };
    let mut after = None;
    let mut found = None;
    while found.is_none() {
        let (items, next) = match sh.store.rollouts_within(w, Some(&m), after, 256, ROLLOUTS_ANSWER_BYTES) {
            Ok(page) => page,
            Err(e) => {
                tracing::error!(error = %e, "reading rollouts to re-check a failure");
                return;
            }
        };
        found = items
            .iter()
            .filter_map(|b| Rollout::decode(b, &RolloutLimits::DEFAULT).ok())
            .filter(|r| digests.contains(&r.digest()))
            .find_map(|r| rc.check(&r, &info));
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let Some(e) = found else { return };
    let mut v = wire::VerdictBody { checked: 1, hard_failure: true, ..wire::VerdictBody::empty(w, m, sh.key.public()) };
    v.add_reason(&format!(
        "coordinator re-check: {} fails (group {} rollout {}, {:?})",
        e.check.as_str(),
        e.group,
        e.rollout,
        e.figures
    ));
    v.add_evidence(e);
    let signed = wire::Verdict::sign(v, &sh.key, &sh.network());
    match sh.store.put_verdict(&signed) {
        Ok(()) => {
            let mut core = sh.core();
            core.apply_verdict(&signed.body);
            log_failure(&core, &signed.body, "coordinator");
        }
        Err(e) => tracing::error!(error = %e, "storing the coordinator's re-check verdict"),
    }
}
