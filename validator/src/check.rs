//! `validator check`: every model check of the protocol, offline, on a JSONL
//! file of rollouts written by `edge-miner generate`.
//!
//! The seed `S` stands in for the coordinator: window 0 of
//! [`OfflineWindow::from_seed`] gives the sampling seed, the challenge secret
//! and the miner key the rollouts must match. Each record is turned into a
//! protocol [`Rollout`] and an [`Assignment`] (task re-derived from the seed,
//! prompt re-tokenized, reward recomputed), the reference model computes the
//! evidence in length-sorted batches, and [`verify::verify_rollout`] gives the
//! verdict. A rejected rollout is data; only I/O and setup problems are errors.
//!
//! Offline stand-ins for what a coordinator would fix: `groups_per_miner`
//! and `group_size` are the largest indices in the file plus one; unless
//! given, `max_new_tokens` is the longest completion in the file and the
//! temperature is the record's own. The record's `model` content id (when
//! present) is taken as the assigned checkpoint, since a miner may run a
//! quantization of the validator's file; the model checks tell them apart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tributary_policy::{EvidenceRequest, PolicyError, ReferenceModel};
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError, ContentId};
use tributary_protocol::env::{ArithEnv, EnvError, EnvId, Environment, Gsm8kEnv, SatEnv, Task, task_seed};
use tributary_protocol::offline::OfflineWindow;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, RolloutLimits, SamplingParams};
use tributary_protocol::sketch::{self, SketchError, SketchKey};
use tributary_protocol::tokenizer::{Tokenizer, TokenizerError};
use tributary_protocol::verify::{self, Assignment, Evidence, Status, Verdict, VerifyError, VerifyParams};

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
    /// GSM8K JSONL file (for gsm8k rollouts).
    pub data: Option<PathBuf>,
    /// Difficulty of the arith environment (as given to the miner).
    pub difficulty: u32,
    /// The assigned `max_new_tokens` (default: longest completion in the file).
    pub max_new_tokens: Option<u32>,
    /// The assigned temperature (default: each record's own).
    pub temperature: Option<f32>,
    /// libtorch threads (default: available cores).
    pub threads: Option<usize>,
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
            difficulty: 3,
            max_new_tokens: None,
            temperature: None,
            threads: None,
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
    /// The evidence did not fit a rollout (a validator bug).
    #[error("evidence: {0}")]
    Verify(#[from] VerifyError),
    /// Sketching the reference hidden state failed.
    #[error("sketch: {0}")]
    Sketch(#[from] SketchError),
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

/// A record that passed the offline pre-checks, with its assignment data.
struct Prepared {
    line: usize,
    rollout: Rollout,
    task_id: u64,
    prompt: Vec<u32>,
    reward: f32,
}

/// Everything shared by all rollouts of the run.
struct Context {
    window: OfflineWindow,
    miner: [u8; 32],
    checkpoint: ContentId,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    vocab: usize,
    context_length: usize,
    envs: BTreeMap<EnvId, Environment>,
}

impl Context {
    fn ensure_env(&mut self, id: EnvId, opts: &CheckOptions) -> Result<(), CheckError> {
        if let std::collections::btree_map::Entry::Vacant(slot) = self.envs.entry(id) {
            let env = match id {
                EnvId::Arith => Environment::Arith(ArithEnv::new(opts.difficulty)),
                EnvId::Sat => Environment::Sat(SatEnv),
                EnvId::Gsm8k => {
                    let data = opts
                        .data
                        .as_deref()
                        .ok_or_else(|| CheckError::Options("gsm8k rollouts need --data FILE.jsonl".to_owned()))?;
                    Environment::Gsm8k(Gsm8kEnv::load(data)?)
                }
            };
            slot.insert(env);
        }
        Ok(())
    }

    /// Turns a record into a protocol rollout plus its task, or a reason to reject it.
    fn prepare(
        &mut self,
        line: usize,
        rec: RolloutRecord,
        opts: &CheckOptions,
    ) -> Result<Result<Prepared, String>, CheckError> {
        let seed: Seed = match rec.window_seed.parse() {
            Ok(s) => s,
            Err(e) => return Ok(Err(format!("window_seed: {e}"))),
        };
        if seed != self.window.secrets.seed {
            return Ok(Err(format!("window seed {seed} is not the one of --seed {}", opts.seed)));
        }
        let miner = match tributary_protocol::identity::decode_hex::<32>(&rec.miner) {
            Ok(m) => m,
            Err(e) => return Ok(Err(format!("miner: {e}"))),
        };
        let checkpoint = match rec.model.as_deref().map(str::parse::<ContentId>) {
            None => self.checkpoint,
            Some(Ok(id)) => id,
            Some(Err(e)) => return Ok(Err(format!("model: {e}"))),
        };
        let limit = RolloutLimits::DEFAULT.max_tokens.min(self.context_length);
        if rec.tokens.len() > limit {
            return Ok(Err(format!("{} tokens, limit {limit}", rec.tokens.len())));
        }
        let Ok(prompt_len) = u32::try_from(rec.prompt_len) else {
            return Ok(Err(format!("prompt_len {}", rec.prompt_len)));
        };
        self.ensure_env(rec.env, opts)?;
        let env = self.envs.get(&rec.env).ok_or_else(|| CheckError::Env(format!("environment {} missing", rec.env)))?;
        let task = env.task(task_seed(&self.window.secrets.seed, &self.miner, rec.group));
        let prompt = self.tokenizer.encode(&env.prompt_text(&task))?;
        let completion = rec.tokens.get(rec.prompt_len.min(rec.tokens.len())..).unwrap_or(&[]);
        let reward = match recompute_reward(&self.tokenizer, env, &task, completion) {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
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
        Ok(Ok(Prepared { line, rollout, task_id: task.id, prompt, reward }))
    }
}

/// The assignment a coordinator would have given for `p` (offline stand-ins, module docs).
fn make_assignment<'a>(
    p: &'a Prepared,
    cx: &'a Context,
    opts: &CheckOptions,
    groups_per_miner: u32,
    group_size: u32,
    vocab_size: u32,
) -> Assignment<'a> {
    Assignment {
        window: 0,
        checkpoint: p.rollout.checkpoint,
        env: p.rollout.env,
        miner: cx.miner,
        task_id: p.task_id,
        sampling: SamplingParams {
            temperature: opts.temperature.unwrap_or(p.rollout.sampling.temperature),
            max_new_tokens: p.rollout.sampling.max_new_tokens,
        },
        prompt_tokens: &p.prompt,
        groups_per_miner,
        group_size,
        vocab_size,
        eos_tokens: &cx.eos,
        sampling_seed: cx.window.secrets.seed,
        challenge_secret: cx.window.secrets.challenge,
    }
}

/// Groups rollouts into forward passes: one prompt per batch (the reference
/// runs a group's prompt once), length-sorted, at most `max_rows` rollouts and
/// `max_tokens` padded tokens each (a longer rollout runs alone). Returns
/// indices into `rollouts`; every index appears exactly once.
pub fn plan_batches(rollouts: &[&Rollout], max_rows: usize, max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rollouts.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (rollouts[a], rollouts[b]);
        ra.prompt().cmp(rb.prompt()).then(ra.tokens.len().cmp(&rb.tokens.len()))
    });
    let mut out = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let mut end = at + 1;
        while end < order.len()
            && end - at < max_rows
            && (end - at + 1) * rollouts[order[end]].tokens.len() <= max_tokens
            && rollouts[order[end]].prompt() == rollouts[order[at]].prompt()
        {
            end += 1;
        }
        out.push(order[at..end].to_vec());
        at = end;
    }
    out
}

/// The reference model's [`Evidence`] for a batch of structurally valid
/// rollouts, each with its challenged positions: the validator's sketch at
/// those positions (zero elsewhere) and every completion token's figures.
pub fn rollout_evidence(
    model: &ReferenceModel,
    key: &SketchKey,
    eos: u32,
    items: &[(&Rollout, Vec<usize>)],
    params: &VerifyParams,
) -> Result<Vec<Evidence>, CheckError> {
    let reqs: Vec<EvidenceRequest<'_>> = items
        .iter()
        .map(|(r, ch)| EvidenceRequest {
            tokens: &r.tokens,
            prompt_len: r.prompt_len as usize,
            temperature: r.sampling.temperature,
            eos,
            hidden_positions: ch,
        })
        .collect();
    let evidence = model.evidence(&reqs)?;
    let mut out = Vec::with_capacity(items.len());
    for ((r, ch), ev) in items.iter().zip(evidence) {
        let mut sketches = vec![0u32; r.tokens.len()];
        for (k, &pos) in ch.iter().enumerate() {
            let h = ev.hidden_row(k).ok_or_else(|| CheckError::Options("missing hidden row".to_owned()))?;
            if let Some(s) = sketches.get_mut(pos) {
                *s = sketch::sketch(h, key, &params.sketch)?;
            }
        }
        out.push(Evidence { sketches, positions: ev.positions() });
    }
    Ok(out)
}

/// The reward of a completion as the environment computes it: the text of
/// the completion without its final end-of-generation token. `Err` when the
/// ids do not decode (out-of-vocabulary ids are left to the structure check).
pub fn recompute_reward(
    tokenizer: &Tokenizer,
    env: &Environment,
    task: &Task,
    completion: &[u32],
) -> Result<f32, String> {
    let text_ids = match completion.split_last() {
        Some((&last, rest)) if tokenizer.is_eog(last) => rest,
        _ => completion,
    };
    if text_ids.iter().any(|&t| t as usize >= tokenizer.vocab_size()) {
        return Ok(f32::NAN);
    }
    tokenizer
        .decode(text_ids)
        .map(|text| env.reward(task, &text))
        .map_err(|e| format!("completion does not decode: {e}"))
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
    let model = ReferenceModel::load(&ckpt, tributary_policy::default_device())?;
    let window = OfflineWindow::from_seed(opts.seed);
    let mut cx = Context {
        miner: *window.miner.public().as_bytes(),
        window,
        checkpoint: ckpt.content_id(),
        eos: tokenizer.eog_ids().collect(),
        vocab: model.dims().vocab_size,
        context_length: model.dims().context_length,
        tokenizer,
        envs: BTreeMap::new(),
    };
    drop(ckpt);

    let mut verdicts: Vec<LineVerdict> = Vec::with_capacity(records.len());
    let mut prepared = Vec::new();
    for (line, rec) in records {
        match rec.map(|r| cx.prepare(line, r, opts)) {
            Err(reason) => verdicts.push(LineVerdict::Malformed { line, reason }),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(Err(reason))) => verdicts.push(LineVerdict::Malformed { line, reason }),
            Ok(Ok(Ok(p))) => prepared.push(p),
        }
    }
    // Offline stand-ins for the coordinator's window configuration.
    let groups_per_miner = prepared.iter().map(|p| p.rollout.group.saturating_add(1)).max().unwrap_or(1);
    let group_size = prepared.iter().map(|p| p.rollout.rollout.saturating_add(1)).max().unwrap_or(1);
    let max_new = opts.max_new_tokens.unwrap_or_else(|| {
        let longest = prepared.iter().map(|p| p.rollout.completion().len()).max().unwrap_or(0);
        u32::try_from(longest).unwrap_or(u32::MAX)
    });
    for p in &mut prepared {
        p.rollout.sampling.max_new_tokens = max_new;
    }

    let params = &opts.params;
    let key = SketchKey::derive(&cx.window.secrets.seed, model.dims().d_model);
    let vocab32 = u32::try_from(cx.vocab).unwrap_or(u32::MAX);
    let mut summary = CheckSummary::default();

    // Structure first (cheap): only well-formed rollouts reach the model.
    let mut to_run: Vec<usize> = Vec::new();
    let mut checked: Vec<Option<Verdict>> = vec![None; prepared.len()];
    for (i, p) in prepared.iter().enumerate() {
        let a = make_assignment(p, &cx, opts, groups_per_miner, group_size, vocab32);
        let s = verify::check_structure(&p.rollout, &a, params);
        if s.failed() {
            checked[i] = Some(Verdict { checks: vec![s], sampling_counts: Default::default() });
        } else {
            to_run.push(i);
        }
    }
    let started = Instant::now();
    let refs: Vec<&Rollout> = to_run.iter().map(|&i| &prepared[i].rollout).collect();
    for batch in plan_batches(&refs, opts.batch, opts.batch_tokens) {
        let items: Vec<(&Rollout, Vec<usize>)> = batch
            .iter()
            .map(|&k| (refs[k], verify::challenged(refs[k], &cx.window.secrets.challenge, params)))
            .collect();
        let evidence = rollout_evidence(&model, &key, cx.tokenizer.eos_id(), &items, params)?;
        for (&k, ev) in batch.iter().zip(evidence) {
            let p = &prepared[to_run[k]];
            summary.tokens += p.rollout.tokens.len();
            let a = make_assignment(p, &cx, opts, groups_per_miner, group_size, vocab32);
            checked[to_run[k]] = Some(verify::verify_rollout(&p.rollout, &a, p.reward, &ev, params)?);
        }
    }
    summary.model_seconds = started.elapsed().as_secs_f64();

    for (p, v) in prepared.iter().zip(checked) {
        if let Some(verdict) = v {
            verdicts.push(LineVerdict::Checked {
                line: p.line,
                group: p.rollout.group,
                rollout: p.rollout.rollout,
                verdict,
            });
        }
    }
    verdicts.sort_by_key(|v| match v {
        LineVerdict::Malformed { line, .. } | LineVerdict::Checked { line, .. } => *line,
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
