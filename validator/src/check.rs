//! `validator check`: every model check of the protocol, offline, on a JSONL
//! file of rollouts written by `edge-miner generate`.
//!
//! The seed `S` stands in for the coordinator: window 0 of
//! [`OfflineWindow::from_seed`] gives the sampling seed, the challenge secret
//! and the miner key the rollouts must match. Each record is turned into a
//! protocol [`Rollout`] and a [`Contract`], and judged exactly as `validator
//! run` judges a window's rollouts ([`crate::judge`]: the checks that need no
//! model first, then the reference model in length-sorted batches). A
//! rejected rollout is data; only I/O and setup problems are errors.
//!
//! Each record carries the settings it was generated with
//! ([`GenerateSettings`]: environment, difficulty, data file, temperature,
//! `max_new_tokens`, seed); a flag given here overrides them, and records
//! without settings fall back to the flags' defaults. Offline stand-ins for
//! what a coordinator would fix: `groups_per_miner` and `group_size` are the
//! largest indices in the file plus one; `max_new_tokens`, when neither a
//! flag nor the record gives it, is the longest completion in the file. The
//! record's `model` content id (when present) is taken as the assigned
//! checkpoint, since a miner may run a quantization of the validator's file;
//! the model checks tell them apart. Records are unsigned: no signature check.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tributary_policy::{PolicyError, ReferenceModel};
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{EnvError, EnvSpec, Environment};
pub use tributary_protocol::offline::GenerateSettings;
use tributary_protocol::offline::OfflineWindow;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, RolloutLimits, SamplingParams};
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};
use tributary_protocol::verify::{Status, Verdict, VerifyParams};

use crate::judge::{self, Case, Contract, Judge, JudgeConfig, JudgeError, RolloutFailure};

/// Longest JSONL line read (a record of 16 384 tokens is well under 1 MiB).
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// Options of one offline check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The checkpoint the reference model runs.
    pub model: PathBuf,
    /// The miner's JSONL file.
    pub rollouts: PathBuf,
    /// The seed the miner ran with.
    pub seed: u64,
    /// Most rollouts per forward pass.
    pub batch: usize,
    /// Most tokens (rows × longest sequence) per forward pass.
    pub batch_tokens: usize,
    /// GSM8K JSONL file (for gsm8k rollouts; default: each record's own).
    pub data: Option<PathBuf>,
    /// Difficulty of the arith environment (default: each record's own, else 3).
    pub difficulty: Option<u32>,
    /// The assigned `max_new_tokens` (default: each record's own, else the
    /// longest completion in the file).
    pub max_new_tokens: Option<u32>,
    /// The assigned temperature (default: each record's own).
    pub temperature: Option<f32>,
    /// libtorch threads (default: available cores).
    pub threads: Option<usize>,
    /// Where the reference model runs.
    pub device: tch::Device,
    /// Verification constants.
    pub params: VerifyParams,
}

impl CheckOptions {
    /// Defaults for everything but the three required inputs.
    pub fn new(model: PathBuf, rollouts: PathBuf, seed: u64) -> Self {
        Self {
            model,
            rollouts,
            seed,
            batch: 8,
            batch_tokens: 8192,
            data: None,
            difficulty: None,
            max_new_tokens: None,
            temperature: None,
            threads: None,
            device: tributary_policy::default_device(),
            params: VerifyParams::DEFAULT,
        }
    }
}

/// Why a check could not run (not: why a rollout was rejected).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Reading the rollouts file or writing the report failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint could not be opened.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The tokenizer could not be built from the checkpoint.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// An environment could not be set up.
    #[error("environment: {0}")]
    Env(String),
    /// The reference model failed (load, shapes, out of memory).
    #[error("reference model: {0}")]
    Policy(#[from] PolicyError),
    /// The judge failed (a validator bug or the model).
    #[error("{0}")]
    Judge(#[from] JudgeError),
    /// Unusable options.
    #[error("{0}")]
    Options(String),
}

impl From<EnvError> for CheckError {
    fn from(e: EnvError) -> Self {
        CheckError::Env(e.to_string())
    }
}

pub use tributary_protocol::offline::RolloutRecord;

/// The verdict on one line of the file.
#[derive(Debug, Clone, PartialEq)]
pub enum LineVerdict {
    /// Not a usable record (malformed JSON, bad hex, wrong seed...).
    Malformed {
        /// 1-based line number.
        line: usize,
        /// Why.
        reason: String,
    },
    /// Every check ran.
    Checked {
        /// 1-based line number.
        line: usize,
        /// Group index.
        group: u32,
        /// Rollout index.
        rollout: u32,
        /// The checks' outcomes.
        verdict: Verdict,
    },
    /// Rejected before any check could give a verdict (the completion does
    /// not decode, the rollout exceeds the model's context...).
    Rejected {
        /// 1-based line number.
        line: usize,
        /// Group index.
        group: u32,
        /// Rollout index.
        rollout: u32,
        /// Why.
        failure: RolloutFailure,
    },
}

impl LineVerdict {
    /// Whether the rollout is accepted (no hard failure).
    pub fn accepted(&self) -> bool {
        matches!(self, LineVerdict::Checked { verdict, .. } if verdict.accepted())
    }

    /// One human-readable line: accepted, or the failing checks with figures.
    pub fn render(&self) -> String {
        match self {
            LineVerdict::Malformed { line, reason } => format!("line {line}: rejected: malformed: {reason}"),
            LineVerdict::Rejected { line, group, rollout, failure } => {
                format!("line {line} (group {group}, rollout {rollout}): rejected; {failure}")
            }
            LineVerdict::Checked { line, group, rollout, verdict } => {
                let mut s = format!("line {line} (group {group}, rollout {rollout}): ");
                let c = verdict.sampling_counts;
                if verdict.accepted() {
                    s.push_str("accepted");
                } else {
                    s.push_str("rejected");
                }
                for c in &verdict.checks {
                    if let Status::Fail(f) = &c.status {
                        let _ = write!(s, "; {:?} ({:?}): {f:?}", c.kind, c.severity);
                    }
                }
                let _ = write!(s, " [sampling: {} inside, {} ambiguous, {} outside]", c.inside, c.ambiguous, c.outside);
                s
            }
        }
    }
}

/// Totals of one check run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CheckSummary {
    /// Lines checked (records and malformed lines).
    pub checked: usize,
    /// Rollouts accepted.
    pub accepted: usize,
    /// Rollouts rejected (including malformed lines).
    pub rejected: usize,
    /// Tokens run through the reference model.
    pub tokens: usize,
    /// Seconds spent in the reference model (forward, evidence, sketches).
    pub model_seconds: f64,
}

impl CheckSummary {
    /// The summary line `checked N: A accepted, R rejected`.
    pub fn line(&self) -> String {
        format!("checked {}: {} accepted, {} rejected", self.checked, self.accepted, self.rejected)
    }
}

/// Reads the next line (without its newline) into `buf`, never holding more
/// than `max` bytes: `Ok(None)` at end of file, `Ok(Some(false))` if the line
/// was longer than `max` (the rest of it is skipped).
fn read_bounded_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<Option<bool>> {
    buf.clear();
    let n = r.by_ref().take(max as u64 + 1).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Some(true));
    }
    if buf.len() <= max {
        return Ok(Some(true)); // last line without a newline
    }
    // Too long: drop the rest of the line in bounded chunks.
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            r.consume(i + 1);
            break;
        }
        let len = chunk.len();
        r.consume(len);
    }
    buf.clear();
    Ok(Some(false))
}

/// Parses the rollouts file: one entry per non-empty line, in order.
pub fn read_records<R: Read>(input: R) -> std::io::Result<Vec<(usize, Result<RolloutRecord, String>)>> {
    let mut r = BufReader::new(input);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut line = 0;
    while let Some(fits) = read_bounded_line(&mut r, &mut buf, MAX_LINE_BYTES)? {
        line += 1;
        if fits && buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let rec = if fits {
            serde_json::from_slice::<RolloutRecord>(&buf).map_err(|e| format!("not a rollout record: {e}"))
        } else {
            Err(format!("line longer than {MAX_LINE_BYTES} bytes"))
        };
        out.push((line, rec));
    }
    Ok(out)
}

/// The difficulty of a record with neither a flag nor settings (the miner's default).
const DEFAULT_DIFFICULTY: u32 = 3;

/// A record turned into a protocol rollout, with what its contract needs.
struct Prepared {
    line: usize,
    rollout: Rollout,
    spec: EnvSpec,
    data: Option<PathBuf>,
    max_new_tokens: Option<u32>,
}

/// Everything shared by all rollouts of the run.
struct Context {
    window: OfflineWindow,
    checkpoint: ContentId,
}

impl Context {
    /// Turns a record into a protocol rollout, or a reason to reject it.
    fn prepare(&self, line: usize, rec: RolloutRecord, opts: &CheckOptions) -> Result<Prepared, String> {
        let seed: Seed = rec.window_seed.parse().map_err(|e| format!("window_seed: {e}"))?;
        if let Some(s) = rec.settings.as_ref().filter(|s| s.seed != opts.seed) {
            return Err(format!("generated with seed {}, not the one of --seed {}", s.seed, opts.seed));
        }
        if seed != self.window.secrets.seed {
            return Err(format!("window seed {seed} is not the one of --seed {}", opts.seed));
        }
        let miner = tributary_protocol::identity::decode_hex::<32>(&rec.miner).map_err(|e| format!("miner: {e}"))?;
        let checkpoint = match rec.model.as_deref().map(str::parse::<ContentId>) {
            None => self.checkpoint,
            Some(Ok(id)) => id,
            Some(Err(e)) => return Err(format!("model: {e}")),
        };
        let limit = RolloutLimits::DEFAULT.max_tokens;
        if rec.tokens.len() > limit {
            return Err(format!("{} tokens, limit {limit}", rec.tokens.len()));
        }
        let prompt_len = u32::try_from(rec.prompt_len).map_err(|_| format!("prompt_len {}", rec.prompt_len))?;
        let settings = rec.settings.as_ref();
        if let Some(s) = settings.filter(|s| s.env != rec.env) {
            return Err(format!("settings name environment {}, the rollout {}", s.env, rec.env));
        }
        let spec = EnvSpec {
            env: rec.env,
            difficulty: opts.difficulty.or(settings.map(|s| s.difficulty)).unwrap_or(DEFAULT_DIFFICULTY),
            dataset: settings.and_then(|s| s.dataset),
            reward: settings.map_or(tributary_protocol::env::RewardRule::legacy(), |s| s.reward),
        };
        let data = opts.data.clone().or_else(|| settings.and_then(|s| s.data.clone()));
        let max_new_tokens = opts.max_new_tokens.or(settings.map(|s| s.max_new_tokens));
        let rollout = Rollout {
            window: 0,
            checkpoint,
            env: rec.env,
            group: rec.group,
            rollout: rec.rollout,
            task_id: rec.task_id,
            sampling: SamplingParams { temperature: rec.temperature, max_new_tokens: 0 },
            tokens: rec.tokens,
            prompt_len,
            logprobs: rec.logprobs,
            sketches: rec.sketches,
            reward: rec.reward,
            miner,
            signature: [0; 64],
        };
        Ok(Prepared { line, rollout, spec, data, max_new_tokens })
    }
}

/// Runs the whole offline check and writes one verdict line per rollout (in
/// file order), then the summary line, to `out`. Returns the totals.
pub fn run_check(opts: &CheckOptions, out: &mut dyn Write) -> Result<CheckSummary, CheckError> {
    if opts.batch == 0 || opts.batch_tokens == 0 {
        return Err(CheckError::Options("--batch and --batch-tokens must be positive".to_owned()));
    }
    let io_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| CheckError::Io { path: path.clone(), source }
    };
    tributary_policy::init_threads(opts.threads);
    let file = std::fs::File::open(&opts.rollouts).map_err(io_err(&opts.rollouts))?;
    let records = read_records(file).map_err(io_err(&opts.rollouts))?;

    let ckpt = Checkpoint::open(&opts.model)?;
    let tokenizer = Tokenizer::from_gguf_file(&opts.model)?;
    let model = ReferenceModel::load_for_inference(&ckpt, opts.device)?;
    let cx = Context { window: OfflineWindow::from_seed(opts.seed), checkpoint: ckpt.content_id() };
    drop(ckpt);

    let mut verdicts: Vec<LineVerdict> = Vec::with_capacity(records.len());
    let mut prepared = Vec::new();
    for (line, rec) in records {
        match rec.and_then(|r| cx.prepare(line, r, opts)) {
            Err(reason) => verdicts.push(LineVerdict::Malformed { line, reason }),
            Ok(p) => prepared.push(p),
        }
    }
    // The environments the records name, each built once.
    let mut envs: HashMap<(EnvSpec, Option<PathBuf>), Environment> = HashMap::new();
    for p in &prepared {
        if let std::collections::hash_map::Entry::Vacant(slot) = envs.entry((p.spec, p.data.clone())) {
            slot.insert(Environment::build(&p.spec, p.data.as_deref())?);
        }
    }
    // Offline stand-ins for the coordinator's window configuration.
    let groups_per_miner = prepared.iter().map(|p| p.rollout.group.saturating_add(1)).max().unwrap_or(1);
    let group_size = prepared.iter().map(|p| p.rollout.rollout.saturating_add(1)).max().unwrap_or(1);
    let longest = prepared.iter().map(|p| p.rollout.completion().len()).max().unwrap_or(0);
    let longest = u32::try_from(longest).unwrap_or(u32::MAX);

    let cfg = JudgeConfig {
        params: opts.params,
        batch: opts.batch,
        batch_tokens: opts.batch_tokens,
        check_signatures: false,
        ..JudgeConfig::default()
    };
    let judge = Judge::new(&cfg, &tokenizer, &model);
    let miner = *cx.window.miner.public().as_bytes();
    let mut lines = Vec::with_capacity(prepared.len());
    let mut cases: Vec<Case<'_>> = Vec::with_capacity(prepared.len());
    for mut p in prepared {
        let env = envs.get(&(p.spec, p.data.clone())).ok_or_else(|| CheckError::Env("environment missing".into()))?;
        let max_new_tokens = p.max_new_tokens.unwrap_or(longest);
        p.rollout.sampling.max_new_tokens = max_new_tokens;
        let contract = Contract {
            window: 0,
            checkpoint: p.rollout.checkpoint,
            env,
            sampling: SamplingParams {
                temperature: opts.temperature.unwrap_or(p.rollout.sampling.temperature),
                max_new_tokens,
            },
            groups_per_miner,
            group_size,
            miner: Some(miner),
            seed: cx.window.secrets.seed,
            challenge: cx.window.secrets.challenge,
        };
        lines.push(p.line);
        cases.push(judge.prepare(p.rollout, contract));
    }
    let started = Instant::now();
    let stats = judge.prove(&mut cases)?;
    let mut summary = CheckSummary {
        tokens: stats.tokens,
        model_seconds: started.elapsed().as_secs_f64(),
        ..CheckSummary::default()
    };

    for (line, case) in lines.into_iter().zip(cases) {
        judge::log_outcome(&case);
        let (group, rollout) = (case.rollout.group, case.rollout.rollout);
        verdicts.push(match case.outcome {
            Some(Ok(verdict)) | Some(Err(RolloutFailure::Checked(verdict))) => {
                LineVerdict::Checked { line, group, rollout, verdict }
            }
            Some(Err(failure)) => LineVerdict::Rejected { line, group, rollout, failure },
            None => return Err(CheckError::Options(format!("line {line} was not judged"))),
        });
    }
    verdicts.sort_by_key(|v| match v {
        LineVerdict::Malformed { line, .. }
        | LineVerdict::Checked { line, .. }
        | LineVerdict::Rejected { line, .. } => *line,
    });
    let out_err = |source| CheckError::Io { path: "output".to_owned(), source };
    for v in &verdicts {
        summary.checked += 1;
        if v.accepted() {
            summary.accepted += 1;
        } else {
            summary.rejected += 1;
        }
        writeln!(out, "{}", v.render()).map_err(out_err)?;
    }
    writeln!(out, "{}", summary.line()).map_err(out_err)?;
    Ok(summary)
}
