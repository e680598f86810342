//! The passes the coordinator's background tasks ([`crate::node`]) run over
//! the shared state ([`Shared`]): checkpoint retention, and writing closed
//! windows, checkpoints and weights documents to the object store
//! ([`crate::archive`]). They live here, above [`crate::server`], so that
//! `relay` and `archive` (which the shared state holds) do not import it
//! back: the coordinator's modules form no import cycle.

use std::collections::HashSet;

use tributary_protocol::checkpoint::ContentId;
use tributary_protocol::window::WindowId;
use tributary_protocol::wire::store_key;

use crate::archive::{
    ARCHIVED_UPTO, Archive, ArchiveError, MANIFEST_RECORDS_KEPT, WEIGHTS_PER_PASS, WEIGHTS_STORED_UPTO, archived_upto,
    prune_manifest_records, record_manifest,
};
use crate::relay::RelayError;
use crate::server::Shared;
use crate::store::StoreError;

/// Retention failures.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// The store refused the deletion.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A payload file could not be deleted.
    #[error("{0}")]
    Relay(#[from] RelayError),
}

/// Deletes the checkpoints past the retention: every entry but the `keep`
/// most recent publications (0 keeps all), the genesis checkpoint (every
/// start reads it) and the checkpoints of the window open at `now_ms`, of
/// the one before (validators verify it now), and of any later window
/// already announced. Their relay records go first, durably, then their
/// files (a crash between leaves files that the next start deletes,
/// [`crate::relay::Relay::remove_orphans`]). The window → checkpoint announcements stay:
/// they are small and keep every window's checkpoint id exact. Each kept
/// checkpoint keeps its full file and its own delta, so nothing older is
/// needed to serve it, and a miner holding the base of the oldest kept
/// delta still gets a delta chain. Returns the ids deleted.
///
/// Blocking (writes the store, deletes files).
pub fn apply_retention(shared: &Shared, keep: u64, now_ms: u64) -> Result<Vec<ContentId>, RetentionError> {
    if keep == 0 {
        return Ok(vec![]);
    }
    let in_use: HashSet<ContentId> = {
        let core = shared.core();
        let mut ids = HashSet::from([core.config().genesis_checkpoint]);
        if let Some(w) = core.current_window(now_ms) {
            ids.extend((w.saturating_sub(1)..=w.saturating_add(1)).map(|w| core.checkpoint_for(w)));
        }
        ids
    };
    let after = shared.core().current_window(now_ms).unwrap_or(0);
    let doomed = shared.relay.past_retention(usize::try_from(keep).unwrap_or(usize::MAX), &in_use, after);
    if doomed.is_empty() {
        return Ok(doomed);
    }
    shared.store.delete_relay_entries(&doomed)?;
    let freed = shared.relay.remove(&doomed)?;
    metrics::counter!("tributary_checkpoints_deleted_total").increment(doomed.len() as u64);
    tracing::info!(checkpoints = doomed.len(), mib = freed >> 20, "old checkpoints deleted (retention)");
    Ok(doomed)
}

/// Archives every window whose submissions have closed and that is not
/// archived yet, oldest first, then records how far it got; returns the
/// windows archived. The first run starts `keep_windows` before the current
/// window (older windows may already be pruned; 0 keeps all: window 0) and
/// records that start. A window is streamed from redb to the store a page
/// at a time ([`crate::archive::WindowWriter`]: one segment in memory at
/// most); its manifest is then recorded in redb
/// ([`crate::archive::record_manifest`], the only manifest readers are
/// signed) before the progress moves past it. A failure stops the pass; the
/// next one retries from the same window.
pub async fn archive_closed_windows(
    sh: &std::sync::Arc<Shared>,
    archive: &Archive,
    now_ms: u64,
) -> Result<Vec<WindowId>, ArchiveError> {
    let (current, keep) = (sh.core().current_window(now_ms), sh.limits().keep_windows);
    let Some(current) = current else { return Ok(Vec::new()) };
    let store_err = |e: StoreError| ArchiveError::Malformed { window: current, what: format!("store: {e}") };
    let mut next = match archived_upto(&sh.store).map_err(store_err)? {
        Some(upto) => upto,
        None => {
            // Where archiving starts, recorded at once so that later passes
            // go on from it whatever the clock says then.
            let start = if keep == 0 { 0 } else { current.saturating_sub(keep) };
            sh.store.put_meta(ARCHIVED_UPTO, &start.to_le_bytes()).map_err(store_err)?;
            start
        }
    };
    let mut done = Vec::new();
    while next < current && sh.core().closed(next, now_ms) {
        let window = next;
        let m = archive_window(sh, archive, window).await?;
        let sh2 = sh.clone();
        let m2 = m.clone();
        tokio::task::spawn_blocking(move || {
            record_manifest(&sh2.store, &m2)?;
            sh2.store.put_meta(ARCHIVED_UPTO, &(window + 1).to_le_bytes())?;
            prune_manifest_records(&sh2.store, (window + 1).saturating_sub(MANIFEST_RECORDS_KEPT)).map(drop)
        })
        .await
        .map_err(|e| ArchiveError::Malformed { window, what: format!("store task: {e}") })?
        .map_err(store_err)?;
        tracing::info!(
            window,
            rollouts = m.rollouts,
            segments = m.segments.len(),
            store = archive.url(),
            "window archived"
        );
        metrics::counter!("tributary_windows_archived_total").increment(1);
        done.push(window);
        next = window + 1;
    }
    Ok(done)
}

/// Rollout bytes read from redb per page while archiving.
const ARCHIVE_PAGE_BYTES: usize = 8 << 20;

/// Writes one closed window: miner by miner (key order), each miner's
/// rollouts in digest order, a page at a time, into the store's segments.
async fn archive_window(
    sh: &std::sync::Arc<Shared>,
    archive: &Archive,
    window: WindowId,
) -> Result<crate::archive::Manifest, ArchiveError> {
    let failed = |e: StoreError| ArchiveError::Malformed { window, what: format!("store: {e}") };
    let joined = |e: tokio::task::JoinError| ArchiveError::Malformed { window, what: format!("reader task: {e}") };
    // A commit that began before the close may still add to the window:
    // wait for it, as a fetch does.
    let sh2 = sh.clone();
    tokio::task::spawn_blocking(move || drop(sh2.hold_commits())).await.map_err(joined)?;
    let mut writer = archive.window_writer(window);
    let mut after_miner = None;
    loop {
        let am = after_miner;
        let sh2 = sh.clone();
        let (miners, next) =
            tokio::task::spawn_blocking(move || sh2.store.window_index(window, am.as_ref(), 256 << 10, |_| true))
                .await
                .map_err(joined)?
                .map_err(failed)?;
        for w in miners {
            let mut after = None;
            loop {
                let sh2 = sh.clone();
                let (items, more) = tokio::task::spawn_blocking(move || {
                    sh2.store.rollouts_within(window, Some(&w.miner), after, 256, ARCHIVE_PAGE_BYTES)
                })
                .await
                .map_err(joined)?
                .map_err(failed)?;
                for r in items {
                    writer.push(w.miner, r).await?;
                }
                match more {
                    Some(d) => after = Some(d),
                    None => break,
                }
            }
        }
        match next {
            Some(m) if Some(m) != after_miner => after_miner = Some(m),
            _ => break,
        }
    }
    writer.finish().await
}

/// Writes every relayed checkpoint the store does not hold yet (its full
/// file, then its delta, each content-addressed) and marks it stored in the
/// relay, so that relay retention may delete the local copy and paths to it
/// carry the store's URL; then the signed weights documents not written yet.
/// Returns the checkpoints newly marked stored. A failure stops the pass; the
/// next one retries (what was written is found by its key and skipped).
pub async fn store_checkpoints(sh: &std::sync::Arc<Shared>, archive: &Archive) -> Result<Vec<ContentId>, ArchiveError> {
    let relay = &sh.relay;
    let mut done = Vec::new();
    for e in relay.entries() {
        if relay.is_stored(&e.id) {
            continue;
        }
        let mut files = vec![(store_key(&e.id, None, &e.full_hash), relay.full_path(&e.id), e.full_len, e.full_hash)];
        files.extend(e.delta.map(|(base, len, hash)| {
            (store_key(&e.id, Some(&base), &hash), relay.delta_path(&base, &e.id), len, hash)
        }));
        let mut wrote = 0u64;
        for (key, file, len, hash) in files {
            match archive.put_file(&key, &file, len, &hash).await {
                Ok(true) => wrote += len,
                Ok(false) => {}
                // Deleted by retention meanwhile (it was stored before a restart): nothing to do.
                Err(ArchiveError::Io { .. }) if relay.entry(&e.id).is_none() => break,
                Err(err) => return Err(err),
            }
        }
        if relay.entry(&e.id).is_none() {
            continue;
        }
        relay.mark_stored(e.id);
        if wrote > 0 {
            tracing::info!(id = %e.id, bytes = wrote, store = archive.url(), "checkpoint stored");
            metrics::counter!("tributary_checkpoints_stored_total").increment(1);
        }
        done.push(e.id);
    }
    store_weights(sh, archive).await?;
    Ok(done)
}

/// Writes the signed weights documents not in the store yet (at most
/// [`WEIGHTS_PER_PASS`], the newest), then records how far it got.
async fn store_weights(sh: &std::sync::Arc<Shared>, archive: &Archive) -> Result<(), ArchiveError> {
    let store_err = |e: StoreError| ArchiveError::Malformed { window: 0, what: format!("store: {e}") };
    let sh2 = sh.clone();
    let docs = tokio::task::spawn_blocking(move || {
        let next = sh2.store.meta(WEIGHTS_STORED_UPTO)?.and_then(|v| v.try_into().ok()).map(u64::from_le_bytes);
        let Some(latest) = sh2.store.weights_docs(WindowId::MAX, 1)?.pop().map(|d| d.body.window) else {
            return Ok(Vec::new());
        };
        let from = next.unwrap_or(0);
        if latest < from {
            return Ok(Vec::new());
        }
        let n = usize::try_from(latest - from + 1).unwrap_or(usize::MAX).min(WEIGHTS_PER_PASS);
        let mut docs = sh2.store.weights_docs(WindowId::MAX, n)?;
        docs.retain(|d| d.body.window >= from);
        docs.reverse();
        Ok::<_, StoreError>(docs)
    })
    .await
    .map_err(|e| ArchiveError::Malformed { window: 0, what: format!("reader task: {e}") })?
    .map_err(store_err)?;
    for d in docs {
        archive.put_weights(&d).await?;
        sh.store.put_meta(WEIGHTS_STORED_UPTO, &(d.body.window + 1).to_le_bytes()).map_err(store_err)?;
        tracing::debug!(interval = d.body.window, store = archive.url(), "weights document stored");
    }
    Ok(())
}
