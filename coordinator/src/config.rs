//! The coordinator's configuration file ([`Config`], TOML, every field with
//! a default) and the settings it refuses to start with ([`ConfigError`]).
//! Read by `coordinator run` ([`crate::node`]) and by the operator's
//! commands ([`crate::admin`]), and depends on neither.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use tributary_protocol::env::EnvId;
use tributary_protocol::identity::PublicKey;
use tributary_protocol::wire::{self, Role};

use crate::server::Limits;

/// The coordinator's configuration file (TOML). Every field has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// QUIC address. Default `0.0.0.0:4433`.
    pub listen: SocketAddr,
    /// HTTP address. Default `127.0.0.1:9090`.
    pub http: SocketAddr,
    /// Data folder (database, keys, certificate). Default `./coordinator-data`.
    pub data_dir: PathBuf,
    /// Window length in milliseconds. Default 360 000 (grail's 30 blocks).
    pub window_ms: u64,
    /// Submission grace after a window ends, in milliseconds. Default 5 000.
    pub grace_ms: u64,
    /// Active environment. Default `arith`.
    pub env: EnvId,
    /// Groups per miner per window. Default 32.
    pub groups_per_miner: u32,
    /// Rollouts per group. Default 16.
    pub group_size: u32,
    /// Sampling temperature of every rollout (the generation contract). Default 0.7.
    pub temperature: f32,
    /// Most completion tokens per rollout. Default 64 (`--dev`: 32).
    pub max_new_tokens: u32,
    /// Difficulty of the arith environment. Default 102 (one-digit
    /// subtraction: SmolLM2-135M solves ~36% greedy, so groups disagree and
    /// GRPO has a signal; see `protocol::env::arith`). `--dev`: the practice
    /// level (`protocol::env::PRACTICE_LEVEL`), which the random tiny model earns.
    pub difficulty: u32,
    /// How every role scores completions, announced with each window:
    /// `strict` (default: only a well-formed final `Answer: N` with the right
    /// `N` earns 1), `lenient` (the last number after a marker, else anywhere)
    /// or `format` (a well-formed final `Answer:` line, correctness ignored:
    /// a control). See `protocol::env::RewardRule`.
    pub reward: tributary_protocol::env::RewardRule,
    /// The dataset file of the gsm8k environment (its blake3 is published
    /// with each window so miners and validators use the same file).
    pub dataset: Option<PathBuf>,
    /// The genesis model (its content id is the first checkpoint). Required outside `--dev`.
    pub model: Option<PathBuf>,
    /// Validator keys (hex).
    pub validators: Vec<String>,
    /// Trainer key (hex).
    pub trainer: Option<String>,
    /// If set, only these miner keys (hex) may mine.
    pub miner_allow: Option<Vec<String>>,
    /// Miner keys (hex) that may not mine.
    pub miner_deny: Vec<String>,
    /// Windows a hard failure bans for. Default 14 (grail).
    pub ban_windows: u64,
    /// 0: soft failures (the distribution and coverage checks) are shown but
    /// neither ban nor lower a weight. Above 0: the fewest soft failures in one
    /// verdict that ban, raised by the binomial gate so that an honest miner's
    /// chance of a soft ban per verdict stays at most 1e-6 at the calibrated
    /// honest rate (e.g. 17 of 64 checked). Default 0 (docs/calibration.md §5b).
    pub soft_failure_threshold: u32,
    /// Windows the weights look back over. Default 12 (grail).
    pub weight_windows: u64,
    /// Valid rollouts counted per window at most. Default 5000 (grail).
    pub unique_cap_per_window: u64,
    /// The superlinear exponent of the weights (weight ∝ score^exponent). Default 4 (grail).
    pub weight_exponent: i32,
    /// Validators that judge each miner every window (fewer if fewer are
    /// authorised). Default 2.
    pub committee: u32,
    /// Rollouts each validator proves per window for its assignment (every
    /// validator must be able to). Default 4096.
    pub validator_budget: u32,
    /// Connection attempts per second per address. Default 20.
    pub connections_per_sec: u32,
    /// KiB per second per miner. Default 65 536.
    pub kib_per_sec: u32,
    /// Rollouts per second per miner. Default 20 000.
    pub rollouts_per_sec: u32,
    /// Requests other than submissions per second per miner key (window,
    /// reveal, progress, weights, checkpoint paths and chunks). Default 200.
    pub requests_per_sec: u32,
    /// Longest prompt (tokens) a rollout may carry; longer ones are refused
    /// at the door (`schema`). Default 1024.
    pub max_prompt_tokens: u32,
    /// Authenticated connections open at once, in all. Default 2048.
    pub max_connections: u32,
    /// Of `max_connections`, slots only validators and the trainer may take. Default 64.
    pub reserved_role_connections: u32,
    /// Connections open at once before they authenticate. Default 256.
    pub max_unauthenticated: u32,
    /// Connections open at once from one IPv4 address or IPv6 /64. Default 64.
    pub max_connections_per_address: u32,
    /// Authenticated connections open at once per key. Default 8.
    pub max_connections_per_key: u32,
    /// A miner connection silent for this long is closed (ms). Default 300 000.
    pub idle_timeout_ms: u64,
    /// A connection must finish its handshake this long after it is up (ms). Default 10 000.
    pub handshake_timeout_ms: u64,
    /// Door penalties recorded per second, in all. Default 2.
    pub penalties_per_sec: u32,
    /// MiB of checkpoint payload held for answers at once, in all. Default 256.
    pub relay_inflight_mib: u32,
    /// Checkpoint payload KiB per second per miner key. Default 32 768.
    pub relay_kib_per_sec: u32,
    /// MiB of submissions read and not yet answered, in all. Default 256.
    pub ingest_inflight_mib: u32,
    /// MiB of rollouts stored per window, all miners together. Default 4096.
    pub max_window_mib: u64,
    /// Distinct miners storing rollouts per window. Default 5 000 (it also
    /// bounds each window's standing list, 33 bytes a miner over `ban_windows`
    /// windows, under its 4 MiB frame).
    pub max_window_miners: u32,
    /// Windows of rollouts kept; older ones are deleted (0: keep all). Default 240.
    pub keep_windows: u64,
    /// Free MiB the data folder's disk must keep: below it new rollouts are
    /// refused (`internal`, the miner retries) while everything stored is
    /// still served. Default 1024.
    pub min_free_mib: u64,
    /// Published checkpoints kept in the relay (full file, delta, record),
    /// the most recent first; older ones are deleted (0: keep all). The
    /// genesis checkpoint and every checkpoint the open window or the one
    /// being verified uses are kept whatever this says. Default 16.
    pub keep_checkpoints: u64,
    /// Object store for closed windows' rollouts ([`crate::archive`]): a
    /// folder (relative to `data_dir`), `file:///ABSOLUTE/PATH`, or
    /// `s3://BUCKET/PREFIX` (a coordinator built with the `s3` feature; the
    /// endpoint, region and credentials from `AWS_*` variables). With one,
    /// `keep_windows` deletes only windows already archived. Every published
    /// checkpoint's full file and delta and every signed weights document go
    /// there too, and `keep_checkpoints` then deletes only checkpoints the
    /// store holds. Default: none.
    pub archive: Option<String>,
    /// The public base URL of `archive` (its public-read endpoint, or a CDN
    /// in front of it), `http://` or `https://`: miners download checkpoints
    /// and deltas from there, verify them, and fall back to the relay on any
    /// failure. Needs `archive`. Default: none (miners use the relay).
    pub store_url: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        let l = Limits::default();
        Self {
            listen: ([0, 0, 0, 0], 4433).into(),
            http: ([127, 0, 0, 1], 9090).into(),
            data_dir: "coordinator-data".into(),
            window_ms: 360_000,
            grace_ms: 5_000,
            env: EnvId::Arith,
            groups_per_miner: 32,
            group_size: 16,
            temperature: 0.7,
            max_new_tokens: 64,
            difficulty: 102,
            reward: tributary_protocol::env::RewardRule::Strict,
            dataset: None,
            model: None,
            validators: vec![],
            trainer: None,
            miner_allow: None,
            miner_deny: vec![],
            ban_windows: 14,
            soft_failure_threshold: 0,
            weight_windows: 12,
            unique_cap_per_window: 5000,
            weight_exponent: 4,
            committee: tributary_protocol::assign::DEFAULT_COMMITTEE,
            validator_budget: tributary_protocol::assign::DEFAULT_BUDGET,
            connections_per_sec: l.connections_per_sec,
            kib_per_sec: l.kib_per_sec,
            rollouts_per_sec: l.rollouts_per_sec,
            requests_per_sec: l.requests_per_sec,
            max_prompt_tokens: 1024,
            max_connections: l.max_connections,
            reserved_role_connections: l.reserved_role_connections,
            max_unauthenticated: l.max_unauthenticated,
            max_connections_per_address: l.max_connections_per_address,
            max_connections_per_key: l.max_connections_per_key,
            idle_timeout_ms: l.idle_timeout_ms,
            handshake_timeout_ms: l.handshake_timeout_ms,
            penalties_per_sec: l.penalties_per_sec,
            relay_inflight_mib: l.relay_inflight_mib,
            relay_kib_per_sec: l.relay_kib_per_sec,
            ingest_inflight_mib: l.ingest_inflight_mib,
            max_window_mib: 4096,
            max_window_miners: 5_000,
            keep_windows: l.keep_windows,
            min_free_mib: l.min_free_mib,
            keep_checkpoints: 16,
            archive: None,
            store_url: None,
        }
    }
}

impl Config {
    /// The `--dev` configuration: loopback, 20-second windows, small groups,
    /// the [`tributary_protocol::dev::key`] trainer and validator authorised.
    pub fn dev(data_dir: PathBuf) -> Self {
        Self {
            trainer: Some(tributary_protocol::dev::key(Role::Trainer).public().to_string()),
            validators: vec![tributary_protocol::dev::key(Role::Validator).public().to_string()],
            listen: ([127, 0, 0, 1], 0).into(),
            http: ([127, 0, 0, 1], 0).into(),
            data_dir,
            window_ms: 20_000,
            grace_ms: 2_000,
            groups_per_miner: 4,
            group_size: 4,
            max_new_tokens: 32,
            // The random tiny model never adds right: at a real level every
            // reward is 0, no group has variance and the trainer never
            // steps. The practice level's brevity credit gives it a signal.
            difficulty: tributary_protocol::env::PRACTICE_LEVEL,
            ..Self::default()
        }
    }
}

/// A configuration the coordinator refuses to start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A `--dev` role key is authorised outside `--dev`.
    #[error(
        "the configured {} key {key} is a public --dev key (its secret is in the source): anyone could sign as \
         it. Configure a key of your own (`coordinator keygen --out FILE`), or run a test network with --dev",
        role.as_str()
    )]
    DevKey {
        /// The role it is authorised as.
        role: Role,
        /// The key.
        key: PublicKey,
    },
    /// `store_url` is not an `http(s)://` URL a miner follows, or there is
    /// no `archive` for it to serve.
    #[error(
        "store_url `{0}`: expected an http:// or https:// URL of at most {max} bytes, the public base URL of the \
         configured `archive` (set `archive` too)",
        max = wire::MAX_STORE_URL_LEN
    )]
    StoreUrl(String),
}

/// Refuses a `store_url` miners would not follow or that has no `archive`
/// behind it.
pub fn check_store_url(cfg: &Config) -> Result<(), ConfigError> {
    let Some(url) = &cfg.store_url else { return Ok(()) };
    let scheme = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    if cfg.archive.is_none()
        || url.len() > wire::MAX_STORE_URL_LEN
        || scheme.is_none_or(|rest| rest.is_empty() || rest.chars().any(char::is_whitespace))
    {
        return Err(ConfigError::StoreUrl(url.clone()));
    }
    Ok(())
}

/// Refuses a configuration that authorises a `--dev` role key as validator
/// or trainer (their secrets are public: anyone could post verdicts or
/// publish checkpoints). Called for every start without `--dev`, and by
/// `check-config`. Keys are compared parsed, so no spelling of one passes.
pub fn refuse_dev_keys(cfg: &Config) -> Result<(), ConfigError> {
    let configured =
        [(Role::Validator, cfg.validators.iter().collect::<Vec<_>>()), (Role::Trainer, cfg.trainer.iter().collect())];
    for (role, list) in configured {
        for k in list {
            let Ok(key) = k.trim().parse::<PublicKey>() else { continue };
            if [Role::Validator, Role::Trainer].iter().any(|r| tributary_protocol::dev::key(*r).public() == key) {
                return Err(ConfigError::DevKey { role, key });
            }
        }
    }
    Ok(())
}

/// A setting that cannot work, found before anything starts
/// (`coordinator run` and `check-config` both refuse it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// A value outside what the network can run with.
    #[error("`{key} = {value}`: {allowed}")]
    Range {
        /// The configuration key.
        key: &'static str,
        /// The value given.
        value: String,
        /// What would work.
        allowed: String,
    },
    /// A file the configuration names does not exist.
    #[error("`{key}`: {} does not exist ({make})", path.display())]
    Missing {
        /// The configuration key.
        key: &'static str,
        /// The path (relative paths already resolved against the file's folder).
        path: PathBuf,
        /// How to make it.
        make: &'static str,
    },
}

impl tributary_net::cli::ConfigPaths for Config {
    fn for_each_path(&mut self, f: &mut dyn FnMut(&mut PathBuf)) {
        f(&mut self.data_dir);
        for p in [&mut self.model, &mut self.dataset].into_iter().flatten() {
            f(p);
        }
    }
}

/// Refuses values that cannot work: an arith difficulty the environment
/// would silently clamp, groups too small for GRPO's advantage, a negative
/// or non-finite temperature, empty windows and budgets, and a genesis model
/// or dataset that is not there (naming the command that makes it).
pub fn check_values(cfg: &Config, dev: bool) -> Result<(), ValueError> {
    use tributary_protocol::env::{BRIDGE_LEVELS, MAX_DIFFICULTY, PRACTICE_LEVEL, WORKED_LEVELS};
    let range = |key, value: &dyn std::fmt::Display, allowed: &str| {
        Err(ValueError::Range { key, value: value.to_string(), allowed: allowed.to_string() })
    };
    let d = cfg.difficulty;
    let known = d <= MAX_DIFFICULTY || BRIDGE_LEVELS.contains(&d) || WORKED_LEVELS.contains(&d) || d == PRACTICE_LEVEL;
    if cfg.env == EnvId::Arith && !known {
        return range(
            "difficulty",
            &d,
            &format!(
                "the arith levels are 0..={MAX_DIFFICULTY}, {}..={}, {}..={} (worked examples) and {PRACTICE_LEVEL} \
                 (--dev practice); others were clamped to {MAX_DIFFICULTY}",
                BRIDGE_LEVELS.start(),
                BRIDGE_LEVELS.end(),
                WORKED_LEVELS.start(),
                WORKED_LEVELS.end()
            ),
        );
    }
    if cfg.group_size < 2 {
        return range("group_size", &cfg.group_size, "at least 2: GRPO learns from differences within a group");
    }
    if !(cfg.temperature.is_finite() && (0.0..=10.0).contains(&cfg.temperature)) {
        return range("temperature", &cfg.temperature, "a number from 0 (greedy) to 10");
    }
    for (key, v) in [
        ("groups_per_miner", u64::from(cfg.groups_per_miner)),
        ("max_new_tokens", u64::from(cfg.max_new_tokens)),
        ("window_ms", cfg.window_ms),
        ("weight_windows", cfg.weight_windows),
        ("ban_windows", cfg.ban_windows),
        ("committee", u64::from(cfg.committee)),
        ("validator_budget", u64::from(cfg.validator_budget)),
    ] {
        if v == 0 {
            return range(key, &v, "at least 1");
        }
    }
    if cfg.reserved_role_connections >= cfg.max_connections {
        return range(
            "reserved_role_connections",
            &cfg.reserved_role_connections,
            &format!("less than max_connections ({}): miners share the rest", cfg.max_connections),
        );
    }
    if cfg.max_unauthenticated == 0 {
        return range("max_unauthenticated", &cfg.max_unauthenticated, "at least 1");
    }
    if cfg.grace_ms >= cfg.window_ms {
        return range("grace_ms", &cfg.grace_ms, &format!("less than window_ms ({})", cfg.window_ms));
    }
    match &cfg.model {
        Some(p) if !p.is_file() => {
            return Err(ValueError::Missing {
                key: "model",
                path: p.clone(),
                make: "make the BF16 base with `trainer init-base --out PATH`",
            });
        }
        None if !dev => {
            return range("model", &"(none)", "required outside --dev: the genesis checkpoint (`trainer init-base`)");
        }
        _ => {}
    }
    if cfg.env == EnvId::Gsm8k {
        match &cfg.dataset {
            Some(p) if !p.is_file() => {
                return Err(ValueError::Missing {
                    key: "dataset",
                    path: p.clone(),
                    make: "the GSM8K train split as JSONL: scripts/setup.sh downloads it",
                });
            }
            None => return range("dataset", &"(none)", "required with env = \"gsm8k\": the GSM8K JSONL file"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod value_tests {
    use super::*;

    fn refused(edit: impl FnOnce(&mut Config)) -> ValueError {
        let mut c = Config::dev("d".into());
        edit(&mut c);
        check_values(&c, true).expect_err("refused")
    }

    #[test]
    fn values_that_cannot_work_are_refused_naming_the_key() {
        assert_eq!(check_values(&Config::dev("d".into()), true), Ok(()));
        for (e, key) in [
            (refused(|c| c.difficulty = 5000), "difficulty"),
            (refused(|c| c.difficulty = 110), "difficulty"),
            (refused(|c| c.group_size = 1), "group_size"),
            (refused(|c| c.temperature = -1.0), "temperature"),
            (refused(|c| c.temperature = f32::NAN), "temperature"),
            (refused(|c| c.window_ms = 0), "window_ms"),
            (refused(|c| c.grace_ms = c.window_ms), "grace_ms"),
            (refused(|c| c.groups_per_miner = 0), "groups_per_miner"),
            (refused(|c| c.model = Some("/nonexistent/base.gguf".into())), "model"),
        ] {
            assert!(e.to_string().starts_with(&format!("`{key}")), "{e}");
        }
        let e = refused(|c| c.model = Some("/nonexistent/base.gguf".into()));
        assert!(e.to_string().contains("trainer init-base --out"), "{e}");
        for ok in [0, 10, 102, 107, 115, 117, 900] {
            let mut c = Config::dev("d".into());
            c.difficulty = ok;
            assert_eq!(check_values(&c, true), Ok(()), "difficulty {ok}");
        }
        let mut c = Config::dev("d".into());
        c.model = None;
        assert!(check_values(&c, false).is_err(), "no model outside --dev");
    }
}
