//! Prometheus for every role, by the conventions: one `tributary_` prefix,
//! a `# HELP` line for every metric ([`METRICS`], checked against every
//! `metrics::*!` call in the workspace by a test), histograms with buckets
//! (aggregatable, not summaries), a role's counters present from its start
//! (at 0), `tributary_build_info` (version, commit, protocol) and the
//! standard `process_*` metrics (CPU, memory, file descriptors, threads).
//!
//! [`install`] sets up the process's recorder once; [`render`] is the text
//! of `/metrics`; [`serve_metrics`](crate::serve_metrics) serves it for the
//! validator, trainer and miner (the coordinator serves it on its HTTP
//! listener).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// What a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution in [`SECONDS_BUCKETS`] (`_seconds`).
    Histogram,
}

/// One metric: its name, kind, the role that exports it and its help text.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// The name, `tributary_...`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// The role whose `/metrics` has it: coordinator, validator, trainer or miner.
    pub role: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
}

const fn m(name: &'static str, kind: Kind, role: &'static str, help: &'static str) -> Metric {
    Metric { name, kind, role, help }
}

use Kind::{Counter as C, Gauge as G, Histogram as H};

/// Every metric a role exports (besides `process_*`).
pub const METRICS: &[Metric] = &[
    m("tributary_build_info", G, "all", "Always 1; the labels name the version, git commit and wire protocol."),
    // coordinator
    m("tributary_window", G, "coordinator", "The open window's number."),
    m("tributary_window_rollouts", G, "coordinator", "Rollouts stored in the open window so far."),
    m(
        "tributary_miners",
        G,
        "coordinator",
        "Miners the coordinator keeps books on (keys active within the span bans and weights read).",
    ),
    m("tributary_connections", G, "coordinator", "QUIC connections open now."),
    m(
        "tributary_connections_unauthenticated",
        G,
        "coordinator",
        "QUIC connections open now that have not authenticated yet.",
    ),
    m("tributary_connections_refused_total", C, "coordinator", "Connections refused, by reason."),
    m("tributary_connections_closed_total", C, "coordinator", "Connections closed by the coordinator, by reason."),
    m("tributary_frames_refused_total", C, "coordinator", "Frames refused (malformed or unexpected), by reason."),
    m("tributary_requests_refused_total", C, "coordinator", "Requests refused, by reason (rate_limited)."),
    m("tributary_rollouts_accepted_total", C, "coordinator", "Rollouts stored."),
    m("tributary_rollouts_rejected_total", C, "coordinator", "Rollouts refused at the door, by reason."),
    m("tributary_rollouts_refused_disk_full_total", C, "coordinator", "Rollouts refused because the disk is full."),
    m("tributary_rollout_bytes_total", C, "coordinator", "Bytes of submissions read."),
    m("tributary_door_penalties_total", C, "coordinator", "Penalties recorded against a miner at the door, by reason."),
    m("tributary_door_penalties_skipped_total", C, "coordinator", "Door penalties not recorded (over the rate)."),
    m("tributary_ingest_latency_seconds", H, "coordinator", "Time from a submission's arrival to its answer."),
    m("tributary_redb_commit_seconds", H, "coordinator", "Time of one group commit to the database."),
    m("tributary_trainer_stats_refused_total", C, "coordinator", "Trainer step reports refused."),
    // Set by the trainer for each step, and by the coordinator from the trainer's signed step reports.
    m("tributary_trainer_loss", G, "trainer", "Loss of the trainer's latest step."),
    m("tributary_trainer_entropy", G, "trainer", "Mean token entropy of the trainer's latest step."),
    m("tributary_trainer_step", G, "trainer", "The trainer's latest step."),
    m("tributary_checkpoints_published_total", C, "coordinator", "Checkpoints the trainer published."),
    m("tributary_checkpoints_stored_total", C, "coordinator", "Checkpoints copied to the object store."),
    m("tributary_checkpoints_deleted_total", C, "coordinator", "Relayed checkpoints deleted by retention."),
    m("tributary_relay_bytes_total", C, "coordinator", "Checkpoint bytes served by the relay, by kind."),
    m(
        "tributary_relay_throttled_total",
        C,
        "coordinator",
        "Relay pieces a miner key waited for (past relay_kib_per_sec).",
    ),
    m("tributary_weights_interval", G, "coordinator", "The window of the latest signed weights."),
    m("tributary_windows_archived_total", C, "coordinator", "Closed windows written to the object store."),
    m("tributary_archive_conflicts_total", C, "coordinator", "Archive writes that met a different object."),
    // validator
    m("tributary_validator_reconnects_total", C, "validator", "Reconnections to the coordinator."),
    m("tributary_validator_windows_behind", G, "validator", "Closed windows not yet verified."),
    m(
        "tributary_validator_model_bytes",
        G,
        "validator",
        "Bytes of the reference model's parameters (2 a BF16-held matrix element).",
    ),
    m("tributary_validator_contributions_excluded_total", C, "validator", "Beacon contributions left out of a mix."),
    m("tributary_validator_contributions_withheld_total", C, "validator", "Beacon reveals withheld."),
    m("tributary_validator_window_seconds", H, "validator", "Time to verify one window."),
    m("tributary_validator_rollouts_proved_total", C, "validator", "Rollouts proved with the reference model."),
    m("tributary_validator_undecodable_total", C, "validator", "Stored rollouts that did not decode."),
    m("tributary_validator_check_failures_total", C, "validator", "Rollouts that failed a check, by check."),
    m("tributary_validator_verdicts_total", C, "validator", "Verdicts posted, by outcome."),
    m("tributary_validator_confirmations_total", C, "validator", "Confirmations posted, by outcome."),
    // trainer
    m("tributary_trainer_groups_kept_total", C, "trainer", "Groups trained on."),
    m("tributary_trainer_groups_held_total", C, "trainer", "Groups held back for a later window."),
    m("tributary_trainer_groups_dropped_total", C, "trainer", "Groups not trained on, by reason."),
    m(
        "tributary_trainer_groups_pending",
        G,
        "trainer",
        "Proven groups kept for a later step, below min_train_groups (0 after a step).",
    ),
    m(
        "tributary_trainer_round_phase_seconds",
        H,
        "trainer",
        "Seconds of a round's phases: take (read and prove), prove (its proof), step, export, save, upload.",
    ),
    m("tributary_trainer_rollouts_rejected_total", C, "trainer", "Rollouts the trainer's proof refused, by check."),
    m(
        "tributary_trainer_rollouts_off_draw_total",
        C,
        "trainer",
        "Proven rollouts off the trainer's own draw whose groups were not trained on (re-generations spent).",
    ),
    m(
        "tributary_trainer_rollouts_repaired_total",
        C,
        "trainer",
        "Rollouts off the trainer's own draw re-generated with its draws, their groups trained.",
    ),
    m("tributary_trainer_delta_bytes", G, "trainer", "Bytes of the latest published delta."),
    m("tributary_trainer_delta_change_fraction", G, "trainer", "Fraction of weights the latest delta changed."),
    m("tributary_trainer_published_window", G, "trainer", "The window of the latest published checkpoint."),
    m("tributary_trainer_lr", G, "trainer", "Learning rate of the latest step."),
    m("tributary_trainer_pg_loss", G, "trainer", "Policy-gradient loss of the latest step."),
    m("tributary_trainer_ratio_mean", G, "trainer", "Mean importance ratio of the latest step."),
    m("tributary_trainer_clip_low_fraction", G, "trainer", "Fraction of tokens clipped low in the latest step."),
    m("tributary_trainer_clip_high_fraction", G, "trainer", "Fraction of tokens clipped high in the latest step."),
    m("tributary_trainer_delta_cap_fraction", G, "trainer", "Fraction of weights at the delta cap."),
    m("tributary_trainer_grad_norm", G, "trainer", "Gradient norm of the latest step (before clipping)."),
    m("tributary_trainer_reward_mean", G, "trainer", "Mean reward of the latest step's rollouts."),
    m("tributary_trainer_reward_std", G, "trainer", "Reward standard deviation of the latest step's rollouts."),
    m("tributary_trainer_batch_sequences", G, "trainer", "Sequences in the latest step."),
    m("tributary_trainer_batch_tokens", G, "trainer", "Tokens in the latest step."),
    // miner
    m("tributary_miner_windows_total", C, "miner", "Windows the miner generated in."),
    m("tributary_miner_rollouts_generated_total", C, "miner", "Rollouts generated."),
    m("tributary_miner_rollouts_accepted_total", C, "miner", "Rollouts the coordinator stored."),
    m("tributary_miner_rollouts_refused_total", C, "miner", "Rollouts the coordinator refused."),
    m("tributary_miner_completion_tokens_total", C, "miner", "Completion tokens generated."),
    m("tributary_miner_group_seconds", H, "miner", "Time to generate one group (its _sum: time spent generating)."),
];

/// Buckets of every `_seconds` histogram: 1 ms to 10 min.
pub const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

struct Installed {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
}

static INSTALLED: OnceLock<Option<Installed>> = OnceLock::new();

/// Installs the process's Prometheus recorder (once; later calls return the
/// same handle, whatever their role): histograms with [`SECONDS_BUCKETS`],
/// a HELP text for every metric, `role`'s counters at 0, build info and
/// process metrics. `None` if another recorder was installed first.
pub fn install(role: &str) -> Option<PrometheusHandle> {
    INSTALLED
        .get_or_init(|| {
            let handle = PrometheusBuilder::new().set_buckets(SECONDS_BUCKETS).ok()?.install_recorder().ok()?;
            for x in METRICS {
                match x.kind {
                    Kind::Counter => metrics::describe_counter!(x.name, x.help),
                    Kind::Gauge => metrics::describe_gauge!(x.name, x.help),
                    Kind::Histogram => metrics::describe_histogram!(x.name, x.help),
                }
                if x.kind == Kind::Counter && x.role == role {
                    metrics::counter!(x.name).increment(0);
                }
            }
            metrics::gauge!(
                "tributary_build_info",
                "version" => env!("CARGO_PKG_VERSION"),
                "commit" => env!("TRIBUTARY_GIT_COMMIT"),
                "protocol" => tributary_protocol::wire::PROTOCOL_VERSION.to_string(),
                "role" => role.to_string()
            )
            .set(1.0);
            let process = metrics_process::Collector::default();
            process.describe();
            process.collect();
            Some(Installed { handle, process })
        })
        .as_ref()
        .map(|i| i.handle.clone())
}

/// The `/metrics` text: the process metrics refreshed, then everything
/// recorded (empty before [`install`]).
pub fn render() -> String {
    match INSTALLED.get().and_then(Option::as_ref) {
        Some(i) => {
            i.process.collect();
            i.handle.render()
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `metrics::counter!/gauge!/histogram!("name"` in the workspace's
    /// sources is in [`METRICS`] with its kind, and every name has the prefix.
    #[test]
    fn every_metric_in_the_sources_is_listed_with_help() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut found = Vec::new();
        let mut stack: Vec<std::path::PathBuf> = ["coordinator", "validator", "trainer", "edge-miner", "net"]
            .iter()
            .map(|d| root.join(d).join("src"))
            .collect();
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") && p.file_name().is_some_and(|n| n != "metrics.rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (macro_name, kind) in [("counter!(", C), ("gauge!(", G), ("histogram!(", H)] {
                        for (i, _) in text.match_indices(&format!("metrics::{macro_name}")) {
                            let rest = &text[i + "metrics::".len() + macro_name.len()..];
                            let rest = rest.trim_start();
                            if let Some(q) = rest.strip_prefix('"') {
                                let name = &q[..q.find('"').unwrap()];
                                found.push((name.to_string(), kind, p.display().to_string()));
                            }
                        }
                    }
                }
            }
        }
        assert!(found.len() > 30, "{found:?}");
        for (name, kind, file) in &found {
            let listed = METRICS.iter().find(|x| x.name == name);
            assert!(listed.is_some_and(|x| x.kind == *kind), "{name} ({kind:?}, {file}) is not in METRICS");
        }
        for x in METRICS {
            assert!(x.name.starts_with("tributary_") && !x.help.is_empty(), "{}", x.name);
            assert!(x.kind != Kind::Counter || x.name.ends_with("_total"), "{}", x.name);
            assert!(x.kind != Kind::Histogram || x.name.ends_with("_seconds"), "{}", x.name);
        }
    }
}
