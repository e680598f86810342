//! The operators' HTTP listener: Prometheus `/metrics` (conventions in
//! [`tributary_net::metrics`]), `/health` (200 while the process serves) and
//! `/ready` (200 until it begins to stop, then 503), `/api/miners`
//! (counts, bans and each miner's checkpoint), `/api/weights` (miner key in
//! hex → weight, from the latest signed document, or computed now while none
//! is signed yet), `/api/weights/signed` (the latest signed weights document,
//! or `?window=W`'s; see [`crate::weights`]), `/api/weights/history` (the recent documents, newest first; `?limit=N`),
//! `/api/training` (the trainer's signed step reports: loss, entropy, clip
//! fractions, groups, delta size; `?from=W`), `/api/checkpoints` (every
//! relayed checkpoint with its full and delta sizes), `/api/validators`
//! (each validator, flagged or not, with the refutations of its evidence
//! and the recent windows whose challenge was fixed without its
//! contribution, [`validator_views`]), `/api/status`
//! (everything the live status page shows, see [`crate::dashboard`]) and the
//! status page itself at `/`. `/api/status` and `/api/miners` answer from a
//! snapshot at most [`crate::dashboard::SNAPSHOT_MS`] old, so any number of
//! requests reads the database and locks the core at most once a second.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Html;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::server::{Shared, now_ms};

/// Installs the process-wide Prometheus recorder once (with the
/// conventions of [`tributary_net::metrics`]) and returns its handle.
pub fn prometheus() -> Option<PrometheusHandle> {
    tributary_net::metrics::install("coordinator")
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    history: Arc<crate::dashboard::History>,
    /// Cancelled when the coordinator stops: `/ready` then answers 503.
    stop: tributary_net::shutdown::CancellationToken,
}

/// Binds the HTTP listener and serves it in the background until `stop` is
/// cancelled (then it takes no new request, and its task ends once those in
/// flight are answered); returns the bound address and the task.
pub async fn start(
    listen: SocketAddr,
    shared: Arc<Shared>,
    stop: tributary_net::shutdown::CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let _ = prometheus();
    let state = AppState { shared, history: Arc::default(), stop: stop.clone() };
    let app = axum::Router::new()
        .route("/", get(status))
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_page))
        .route("/api/miners", get(miners))
        .route("/api/weights", get(weights_map))
        .route("/api/weights/signed", get(weights))
        .route("/api/weights/history", get(weights_history))
        .route("/api/training", get(training))
        .route("/api/checkpoints", get(checkpoints))
        .route("/api/status", get(api_status))
        .route("/api/validators", get(validators))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::error!(error = %e, "http listener failed");
        }
    });
    Ok((addr, task))
}

async fn metrics_page(State(s): State<AppState>) -> String {
    let now = now_ms();
    {
        let core = s.shared.core();
        if let Some(w) = core.current_window(now) {
            metrics::gauge!("tributary_window").set(w as f64);
            metrics::gauge!("tributary_window_rollouts").set(core.window_count(w) as f64);
        }
        metrics::gauge!("tributary_miners").set(core.miners().len() as f64);
    }
    tributary_net::metrics::render()
}

/// `/ready`: 200 while the coordinator serves (it listens only once its
/// database, keys and QUIC endpoint are up), 503 once it is stopping.
async fn ready(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.stop.is_cancelled() { (StatusCode::SERVICE_UNAVAILABLE, "stopping\n") } else { (StatusCode::OK, "ready\n") }
}

/// Every miner and synced peer, from a snapshot at most a second old
/// ([`crate::dashboard::History::miners`]), built off the async threads.
async fn miners(State(s): State<AppState>) -> Result<Json<crate::dashboard::Miners>, HttpError> {
    let m = blocking(move || Ok(s.history.miners(&s.shared, now_ms()))).await?;
    Ok(Json((*m).clone()))
}

/// Each authorised validator (and any flagged key): whether it is flagged
/// (another party's proof refuted its evidence; its verdicts are set aside
/// until `coordinator clear-validator`), its refutations and its counted
/// verdicts, and its absent beacon windows ([`ValidatorView`]).
async fn validators(State(s): State<AppState>) -> Json<Vec<ValidatorView>> {
    Json(validator_views(&s.shared, now_ms()))
}

/// Recent windows `/api/validators` looks at for absent contributions.
pub const BEACON_WINDOWS_SHOWN: u64 = 16;

/// One validator in `/api/validators`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ValidatorView {
    /// Flag, refutations, verdicts, withheld reveals.
    #[serde(flatten)]
    pub status: crate::bans::ValidatorStatus,
    /// Of the last [`BEACON_WINDOWS_SHOWN`] windows whose challenge is fixed,
    /// those mixed without this validator's contribution and without
    /// listing it as withheld: it did not commit, or its commitment was
    /// refused or dropped (review finding H; the validator itself logs an
    /// error when the coordinator had acknowledged it).
    pub beacon_absent: Vec<tributary_protocol::window::WindowId>,
}

/// What `/api/validators` answers at `now_ms`.
pub fn validator_views(shared: &Shared, now_ms: u64) -> Vec<ValidatorView> {
    let core = shared.core();
    let current = core.current_window(now_ms).unwrap_or(0);
    let fixed: Vec<u64> =
        (current.saturating_sub(BEACON_WINDOWS_SHOWN)..=current).filter(|&w| core.challenge_fixed(w, now_ms)).collect();
    core.validator_statuses()
        .into_iter()
        .map(|status| {
            let key = status.key.parse::<tributary_protocol::identity::PublicKey>().ok();
            let beacon_absent = fixed
                .iter()
                .copied()
                .filter(|&w| key.is_some_and(|k| core.beacon_book(w).is_none_or(|b| !b.commits.contains_key(&k))))
                .collect();
            ValidatorView { status, beacon_absent }
        })
        .collect()
}

async fn checkpoints(State(s): State<AppState>) -> Json<Vec<crate::relay::CheckpointJson>> {
    Json(s.shared.relay.entries().iter().map(Into::into).collect())
}

type HttpError = (StatusCode, String);

/// Runs a database read off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, HttpError> {
    let internal = |e: String| (StatusCode::INTERNAL_SERVER_ERROR, e);
    tokio::task::spawn_blocking(f).await.map_err(|e| internal(e.to_string()))?.map_err(|e| internal(e.to_string()))
}

#[derive(serde::Deserialize)]
struct WeightsQuery {
    window: Option<u64>,
}

/// Miner key (hex) → weight: the latest signed document's, or, before the
/// first is signed, the weights the verdicts so far give.
async fn weights_map(State(s): State<AppState>) -> Result<Json<BTreeMap<String, f64>>, HttpError> {
    let sh = s.shared.clone();
    let doc = blocking(move || crate::weights::latest(&sh)).await?;
    Ok(Json(match doc {
        Some(d) => d.body.weights.iter().map(|(k, w)| (k.to_string(), *w)).collect(),
        None => {
            let core = s.shared.core();
            let upto = core.current_window(now_ms()).unwrap_or(0).saturating_sub(2);
            core.delayed_weights(upto, crate::weights::PAY_DELAY_WINDOWS, s.shared.key.public())
                .weights
                .into_iter()
                .map(|(k, w)| (k.to_string(), w))
                .collect()
        }
    }))
}

async fn weights(
    State(s): State<AppState>,
    Query(q): Query<WeightsQuery>,
) -> Result<Json<crate::weights::WeightsJson>, HttpError> {
    let sh = s.shared.clone();
    let doc = blocking(move || match q.window {
        Some(w) => sh.store.weights_doc(w),
        None => crate::weights::latest(&sh),
    })
    .await?;
    match doc {
        Some(d) => Ok(Json((&d).into())),
        None => Err((
            StatusCode::NOT_FOUND,
            "no signed weights document for that interval (window W's is signed when W + 1 ends)".into(),
        )),
    }
}

#[derive(serde::Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
}

async fn weights_history(
    State(s): State<AppState>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<Vec<crate::weights::WeightsJson>>, HttpError> {
    let limit = q.limit.unwrap_or(crate::dashboard::HISTORY_WINDOWS as usize).clamp(1, 1000);
    let sh = s.shared.clone();
    let docs = blocking(move || sh.store.weights_docs(u64::MAX, limit)).await?;
    Ok(Json(docs.iter().map(Into::into).collect()))
}

#[derive(serde::Deserialize)]
struct TrainingQuery {
    from: Option<u64>,
}

async fn training(
    State(s): State<AppState>,
    Query(q): Query<TrainingQuery>,
) -> Result<Json<Vec<crate::dashboard::TrainingJson>>, HttpError> {
    let sh = s.shared.clone();
    blocking(move || crate::dashboard::training(&sh, q.from.unwrap_or(0), u64::MAX)).await.map(Json)
}

async fn status() -> Html<&'static str> {
    Html(crate::dashboard::PAGE)
}

async fn api_status(State(s): State<AppState>) -> Result<Json<crate::dashboard::Status>, HttpError> {
    let status = blocking(move || s.history.status(&s.shared, now_ms())).await?;
    Ok(Json((*status).clone()))
}
