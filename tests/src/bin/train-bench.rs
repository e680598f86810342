//! `train-bench`: the measuring half of `scripts/train-bench.sh`.
//!
//! - `eval`: greedy accuracy (llama.cpp, T = 0, `--batch` problems decoded
//!   together, each as it decodes alone) of one or more
//!   checkpoints on three held-out columns of arith problems: `test`, the
//!   test split of the training level (`Environment::test_problems`: no window
//!   ever assigns them, nor, from level 105 on, their swapped twins); `band`,
//!   problems of a level whose operands the training level never draws
//!   (default 106: an operand in 90..=99); `ood`, an out-of-distribution level
//!   (default 107: a three-digit and a two-digit operand). On a
//!   worked-example level (`115`, whose prompt shows three worked examples:
//!   `protocol::env::WORKED_LEVELS`) the band and ood columns are `116` and
//!   `117`, the same problems asked the same way, and `fewshot` is left out
//!   of the base's default prompts (it is the level's own prompt). A network
//!   trained on `108` (`118`), `105`'s problems subtracting three times in
//!   four, is measured on `105`–`107`'s (`115`–`117`'s) columns, test
//!   included: the same problems as a `105` network's ([`held_out_levels`]). With
//!   `--gsm8k-test FILE` GSM8K's own test file is a fourth column. Every
//!   completion is scored three ways: strict (the last non-empty line is a
//!   well-formed `Answer: N` with the right `N`, training's default reward),
//!   lenient (the last number after a marker, else anywhere) and format (a
//!   well-formed final `Answer:` line, any value). The first model (the base)
//!   is also run with prompted variants (`--base-prompts`): `answer-prefill`
//!   (the assistant turn starts `Answer: `), `expr-prefill` (it starts
//!   `a + b = `, the outside review's format prefill) and `fewshot` (three
//!   worked examples as earlier chat turns); the best of them per column and
//!   rule is "the best prompted base". Per-problem lines go to
//!   `eval-<label>-<prompt>-<column>.jsonl` in `--out-dir`, then `report`
//!   runs on that folder.
//! - `report --dir DIR`: every figure of `eval` recomputed from the JSONL
//!   files alone (plain or `.jsonl.gz`, read through `gzip -dc`): accuracy per
//!   model, prompt and column, and each trained model against the
//!   default-prompt base and the best prompted base on the same problems,
//!   strict and lenient, with 95 % paired-bootstrap intervals; and, where
//!   the folder's `trainer-<arm>.log` lines carry the trainer's phase times
//!   (`take_s`, `prove_s`, `step_s`, `export_s`, `save_s`, `upload_s`), their
//!   medians per arm for the rounds that stepped and those that kept their
//!   groups, and the groups they dropped by reason (a folder of such logs
//!   alone reports only that).
//! - `plot`: mean reward per window (`reward.csv` as written by the script),
//!   one line per arm (`--csv` and `--label` repeat), as a PNG (plotters, bitmap backend; text in DejaVu Sans read at run time).
//! - `groups --store coordinator.redb`: what training saw, one JSON line per
//!   stored group (a miner's task in a window): the window, the problem and
//!   its answer (arith level `--difficulty`, default 115), each rollout's
//!   reward, and with `--trainer DIR` (a trainer's folder: its `batches/`) how many of
//!   its rollouts a step trained on; with `--completions MODEL.gguf`, each
//!   rollout's completion as text (to read what training saw fail, not the
//!   held-out columns). Run it on a stopped coordinator's store
//!   (a copy: opening it may add the store's window index).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use edge_miner::backend::Backend;
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use tributary_protocol::chat::{IM_END, IM_START};
use tributary_protocol::env::{
    ArithEnv, Environment, Gsm8kEnv, RewardRule, Task, WORKED_EXAMPLES, WORKED_LEVELS, completion_text_ids,
};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_tests::median;

const USAGE: &str = "usage:
  train-bench eval --model CKPT.gguf [--label NAME] [--model ... --label ...] [--difficulty D]
                   [--band LEVEL|none] [--ood LEVEL|none] [--tasks N] [--gsm8k-test FILE]
                   [--base-prompts default,answer-prefill,expr-prefill,fewshot]
                   [--max-new-tokens T] [--threads K] [--jobs J] [--batch B] [--out-dir DIR]
  train-bench report --dir DIR [--base LABEL]
  train-bench plot --csv reward.csv [--label NAME] [--csv ... --label ...] --out reward.png
                   [--title TEXT] [--font FILE.ttf]
  train-bench groups --store coordinator.redb [--trainer DIR] [--difficulty D] [--windows N]
                   [--completions MODEL.gguf] [--out FILE.jsonl]
  train-bench groups --relabel GROUPS.jsonl[.gz] [--difficulty D] [--out FILE.jsonl]";

/// The font `plot` writes with unless `--font` names another.
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else { bail!("{USAGE}") };
    let opts = Opts::parse(rest)?;
    opts.only(match cmd.as_str() {
        "eval" => &[
            "model",
            "label",
            "difficulty",
            "band",
            "ood",
            "tasks",
            "gsm8k-test",
            "base-prompts",
            "max-new-tokens",
            "threads",
            "jobs",
            "batch",
            "out-dir",
        ],
        "report" => &["dir", "base"],
        "plot" => &["csv", "label", "out", "title", "font"],
        "groups" => &["store", "trainer", "difficulty", "windows", "completions", "relabel", "out"],
        _ => bail!("{USAGE}"),
    })?;
    match cmd.as_str() {
        "eval" => eval(&opts),
        "report" => {
            let dir = PathBuf::from(opts.get("dir").context("--dir DIR")?);
            report(&dir, opts.get("base").unwrap_or("base"))
        }
        "plot" => plot(&opts),
        "groups" => groups(&opts),
        _ => bail!("{USAGE}"),
    }
}

/// `--key value` pairs; `--model` may repeat.
struct Opts(Vec<(String, String)>);

impl Opts {
    fn parse(args: &[String]) -> Result<Self> {
        let mut out = Vec::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(key) = k.strip_prefix("--") else { bail!("unexpected {k:?}\n{USAGE}") };
            let Some(v) = it.next() else { bail!("--{key} needs a value\n{USAGE}") };
            out.push((key.to_owned(), v.clone()));
        }
        Ok(Opts(out))
    }

    /// Refuses an option not in `known` (a misspelt or stale option would
    /// otherwise be ignored silently).
    fn only(&self, known: &[&str]) -> Result<()> {
        match self.0.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            Some((k, _)) => bail!("unknown option --{k}\n{USAGE}"),
            None => Ok(()),
        }
    }

    fn all(&self, key: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.all(key).last().copied()
    }

    fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T>
    where
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        match self.get(key) {
            Some(v) => v.parse().with_context(|| format!("--{key} {v}")),
            None => Ok(default),
        }
    }
}

/// How a problem is put to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PromptStyle {
    /// The protocol's prompt (`Environment::prompt_text`), what training sees.
    Default,
    /// The assistant turn starts with `Answer: `.
    AnswerPrefill,
    /// The assistant turn starts with the expression and ` = ` (arith only).
    ExprPrefill,
    /// Three worked examples (`a op b = c` then `Answer: c`) as earlier turns.
    FewShot,
}

impl PromptStyle {
    const ALL: [PromptStyle; 4] =
        [PromptStyle::Default, PromptStyle::AnswerPrefill, PromptStyle::ExprPrefill, PromptStyle::FewShot];

    fn name(self) -> &'static str {
        match self {
            PromptStyle::Default => "default",
            PromptStyle::AnswerPrefill => "answer-prefill",
            PromptStyle::ExprPrefill => "expr-prefill",
            PromptStyle::FewShot => "fewshot",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s).with_context(|| format!("unknown prompt style {s:?}"))
    }

    /// The prompt text and the prefill (the start of the assistant's turn,
    /// part of the text that is scored); `None` when the style does not apply.
    fn render(self, env: &Environment, task: &Task) -> Option<(String, String)> {
        let base = env.prompt_text(task);
        let arith = matches!(env, Environment::Arith(_));
        match self {
            PromptStyle::Default => Some((base, String::new())),
            PromptStyle::AnswerPrefill => Some((base, "Answer: ".to_owned())),
            PromptStyle::ExprPrefill if arith => {
                let expr = task.prompt.strip_prefix("Compute ")?.strip_suffix('.')?;
                Some((base, format!("{expr} = ")))
            }
            PromptStyle::FewShot if arith => {
                let mut s = String::new();
                let turn = |s: &mut String, role: &str, text: &str| {
                    s.push_str(&format!("{IM_START}{role}\n{text}{IM_END}\n"));
                };
                turn(&mut s, "system", env.system_prompt());
                for (q, a) in WORKED_EXAMPLES {
                    turn(&mut s, "user", &format!("Compute {q}."));
                    turn(&mut s, "assistant", &format!("{q} = {a}\nAnswer: {a}"));
                }
                turn(&mut s, "user", &task.prompt);
                s.push_str(&format!("{IM_START}assistant\n"));
                Some((s, String::new()))
            }
            _ => None,
        }
    }
}

/// One evaluation: a model, a prompt style and a column.
struct Job<'a> {
    model: usize,
    style: PromptStyle,
    column: &'a Column,
}

/// Held-out problems of one kind.
struct Column {
    name: String,
    env: Environment,
    tasks: Vec<Task>,
}

/// What an evaluation file's lines record of how they were made, beyond the
/// label, prompt and column: the model file's name (a trained checkpoint's
/// is its content id) and the generation budget.
struct Settings {
    model_file: String,
    max_new_tokens: usize,
}

impl Settings {
    fn of(model: &Path, max_new_tokens: usize) -> Self {
        let model_file = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Settings { model_file, max_new_tokens }
    }
}

/// Whether `out` already holds this evaluation: one line per task of the
/// column, in order, each with this label, prompt, column, model file and
/// budget. Such a file is kept, so an evaluation can be finished in parts
/// (e.g. the base's prompts while the arms train); anything else (a file of
/// another model or budget, an older file without these fields, a short or
/// unreadable one) is evaluated again and overwritten.
fn done_before(out: &Path, label: &str, style: PromptStyle, col: &Column, settings: &Settings) -> bool {
    let Ok(text) = std::fs::read_to_string(out) else { return false };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines.len() == col.tasks.len()
        && lines.iter().zip(&col.tasks).all(|(line, task)| {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { return false };
            v["model"] == label
                && v["prompt"] == style.name()
                && v["column"] == col.name.as_str()
                && v["task"] == task.id
                && v["model_file"] == settings.model_file.as_str()
                && v["max_new_tokens"] == settings.max_new_tokens
        })
}

/// Greedy generation of `model` on the column's problems in `style`, one
/// JSON line per problem to `out`.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    model: &Path,
    label: &str,
    style: PromptStyle,
    col: &Column,
    max_new_tokens: usize,
    threads: usize,
    batch: usize,
    out: &Path,
) -> Result<()> {
    let tokenizer = Tokenizer::from_gguf_file(model).context("building the tokenizer")?;
    let backend = LlamaCppBackend::load(&LlamaConfig { model: model.to_path_buf(), threads, gpu_layers: 0 })?;
    if tokenizer.vocab_size() != backend.vocab_size() {
        bail!("tokenizer has {} tokens, model {}", tokenizer.vocab_size(), backend.vocab_size());
    }
    let eog: Vec<u32> = tokenizer.eog_ids().collect();
    let settings = Settings::of(model, max_new_tokens);
    let tmp = out.with_extension("part");
    let mut file = BufWriter::new(File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?);
    // `batch` problems decoded together (`LlamaCppBackend::greedy_many`:
    // each completion is the one its prompt gives alone).
    for tasks in col.tasks.chunks(batch.max(1)) {
        let mut rendered = Vec::with_capacity(tasks.len());
        for task in tasks {
            let Some((prompt_text, prefill)) = style.render(&col.env, task) else { return Ok(()) };
            rendered.push((tokenizer.encode(&format!("{prompt_text}{prefill}"))?, prefill));
        }
        let prompts: Vec<Vec<u32>> = rendered.iter().map(|r| r.0.clone()).collect();
        let completions = backend.greedy_many(&prompts, max_new_tokens, &eog)?;
        for ((task, (_, prefill)), completion) in tasks.iter().zip(&rendered).zip(&completions) {
            let text_ids = completion_text_ids(&tokenizer, completion);
            let ended = text_ids.len() < completion.len();
            let text = format!("{prefill}{}", tokenizer.decode(text_ids)?);
            let score = |rule| task.answer.score(rule, &text) >= 1.0;
            let line = serde_json::json!({
                "model": label, "prompt": style.name(), "column": col.name, "task": task.id,
                "model_file": settings.model_file, "max_new_tokens": max_new_tokens,
                "problem": task.prompt, "completion": text, "ended": ended,
                "strict": score(RewardRule::Strict), "lenient": score(RewardRule::Lenient),
                "format": score(RewardRule::Format),
            });
            writeln!(file, "{line}")?;
        }
    }
    file.flush()?;
    drop(file);
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// An arith level by number, or `none`.
fn level(o: &Opts, key: &str, default: u32) -> Result<Option<u32>> {
    match o.get(key) {
        Some("none") => Ok(None),
        Some(v) => Ok(Some(v.parse().with_context(|| format!("--{key} {v}"))?)),
        None => Ok(Some(default)),
    }
}

/// The levels whose problems measure a network trained on arith level
/// `difficulty`: `(test, band, ood)`. The test column is the test split of
/// `test`, the problems no window of `difficulty` assigns. A
/// worked-example level's band and ood are asked the same way (`116`,
/// `117`); level `108` (`118`) draws `105`'s (`115`'s) problems with another
/// mix of operations, so its columns are those of `105` (`115`).
fn held_out_levels(difficulty: u32) -> (u32, u32, u32) {
    match difficulty {
        108 => (105, 106, 107),
        118 => (115, 116, 117),
        d if WORKED_LEVELS.contains(&d) => (d, 116, 117),
        d => (d, 106, 107),
    }
}

fn eval(o: &Opts) -> Result<()> {
    let models: Vec<PathBuf> = o.all("model").into_iter().map(PathBuf::from).collect();
    if models.is_empty() {
        bail!("give at least one --model\n{USAGE}");
    }
    let mut labels: Vec<String> = o.all("label").into_iter().map(str::to_owned).collect();
    if labels.is_empty() {
        labels = (0..models.len()).map(|i| if i == 0 { "base".to_owned() } else { format!("model{i}") }).collect();
    }
    if labels.len() != models.len() || labels.iter().any(|l| l.is_empty() || l.contains(['/', ' '])) {
        bail!("give one --label (no spaces or slashes) per --model, or none");
    }
    let difficulty: u32 = o.num("difficulty", 105)?;
    let n: usize = o.num("tasks", 200)?;
    let threads: usize = o.num("threads", 1)?;
    let jobs_at_once: usize = o.num("jobs", 2)?;
    let batch: usize = o.num("batch", 8)?;
    let max_new_tokens: usize = o.num("max-new-tokens", 96)?;
    // `fewshot` on a worked-example level would be its default prompt again.
    let default_styles = if WORKED_LEVELS.contains(&difficulty) {
        "default,answer-prefill,expr-prefill"
    } else {
        "default,answer-prefill,expr-prefill,fewshot"
    };
    let base_styles: Vec<PromptStyle> =
        o.get("base-prompts").unwrap_or(default_styles).split(',').map(PromptStyle::parse).collect::<Result<_>>()?;
    let out_dir = PathBuf::from(o.get("out-dir").unwrap_or("."));
    std::fs::create_dir_all(&out_dir)?;

    let mut columns = Vec::new();
    let (test, band, ood) = held_out_levels(difficulty);
    let train = Environment::Arith(ArithEnv::new(test));
    columns.push(Column { name: "test".into(), tasks: train.test_problems(n), env: train });
    for (name, lvl) in [("band", level(o, "band", band)?), ("ood", level(o, "ood", ood)?)] {
        if let Some(l) = lvl {
            let env = Environment::Arith(ArithEnv::new(l));
            columns.push(Column { name: name.into(), tasks: env.distinct_problems(n), env });
        }
    }
    if let Some(path) = o.get("gsm8k-test") {
        let gsm = Environment::Gsm8k(Gsm8kEnv::load(Path::new(path)).with_context(|| format!("loading {path}"))?);
        columns.push(Column { name: "gsm8k".into(), tasks: gsm.test_problems(n), env: gsm });
    }
    for c in &columns {
        println!(
            "column {}: {} distinct held-out problems, greedy, {max_new_tokens} new tokens",
            c.name,
            c.tasks.len()
        );
    }
    let mut jobs = Vec::new();
    for column in &columns {
        for (model, _) in models.iter().enumerate() {
            let styles = if model == 0 { base_styles.as_slice() } else { &[PromptStyle::Default] };
            jobs.extend(styles.iter().map(|&style| Job { model, style, column }));
        }
    }
    // The longest jobs first: columns in order, so a cut-short run has whole columns.
    let queue = Mutex::new(jobs.into_iter().rev().collect::<Vec<_>>());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs_at_once.max(1) {
            s.spawn(|| {
                loop {
                    let Some(job) = queue.lock().expect("queue").pop() else { break };
                    let label = &labels[job.model];
                    let out = out_dir.join(format!("eval-{label}-{}-{}.jsonl", job.style.name(), job.column.name));
                    let settings = Settings::of(&models[job.model], max_new_tokens);
                    if done_before(&out, label, job.style, job.column, &settings) {
                        eprintln!("kept {} (written before with these settings)", out.display());
                        continue;
                    }
                    let t0 = std::time::Instant::now();
                    let r = evaluate(
                        &models[job.model],
                        label,
                        job.style,
                        job.column,
                        max_new_tokens,
                        threads,
                        batch,
                        &out,
                    );
                    match r {
                        Ok(()) => eprintln!("done {} ({:.0} s)", out.display(), t0.elapsed().as_secs_f64()),
                        Err(e) => failures.lock().expect("failures").push(format!("{}: {e:#}", out.display())),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("failures");
    if !failures.is_empty() {
        bail!("evaluations failed:\n{}", failures.join("\n"));
    }
    report(&out_dir, &labels[0])
}

/// One scored completion, as `eval` writes it.
#[derive(serde::Deserialize)]
struct Row {
    model: String,
    prompt: String,
    column: String,
    problem: String,
    strict: bool,
    lenient: bool,
    format: bool,
    ended: bool,
}

/// The rows of one JSONL file (gzip-compressed when it ends in `.gz`).
fn read_rows(path: &Path) -> Result<Vec<Row>> {
    read_text(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}

/// A text file's contents (gzip-compressed when it ends in `.gz`, read through `gzip -dc`).
fn read_text(path: &Path) -> Result<String> {
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        let out = std::process::Command::new("gzip")
            .arg("-dc")
            .arg(path)
            .output()
            .with_context(|| format!("running gzip -dc {}", path.display()))?;
        if !out.status.success() {
            bail!("gzip -dc {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        }
        String::from_utf8(out.stdout)?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    })
}

/// A model's outcomes on one column in one prompt style, by problem.
struct Outcomes {
    rows: Vec<Row>,
}

impl Outcomes {
    fn rate(&self, pick: impl Fn(&Row) -> bool) -> f64 {
        100.0 * self.rows.iter().filter(|r| pick(r)).count() as f64 / self.rows.len().max(1) as f64
    }

    /// `(self, other)` outcomes on the problems both have, in `self`'s order.
    fn paired(&self, other: &Outcomes, pick: &dyn Fn(&Row) -> bool) -> Vec<(bool, bool)> {
        let theirs: BTreeMap<&str, bool> = other.rows.iter().map(|r| (r.problem.as_str(), pick(r))).collect();
        self.rows.iter().filter_map(|r| theirs.get(r.problem.as_str()).map(|&o| (pick(r), o))).collect()
    }
}

fn report(dir: &Path, base: &str) -> Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with("eval-") && (name.ends_with(".jsonl") || name.ends_with(".jsonl.gz"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        // A folder of trainer logs alone (a measurement of the rounds).
        if trainer_rounds(dir)? == 0 {
            bail!("{}: no eval-*.jsonl[.gz] files, nor trainer logs with phase times", dir.display());
        }
        return Ok(());
    }
    // (column, model, prompt) -> outcomes.
    let mut all: BTreeMap<(String, String, String), Outcomes> = BTreeMap::new();
    for f in &files {
        for r in read_rows(f)? {
            let key = (r.column.clone(), r.model.clone(), r.prompt.clone());
            all.entry(key).or_insert_with(|| Outcomes { rows: Vec::new() }).rows.push(r);
        }
    }
    let columns: Vec<String> = {
        let mut c: Vec<String> = all.keys().map(|k| k.0.clone()).collect();
        c.dedup();
        c
    };
    println!("{} files in {}; base = {base:?}", files.len(), dir.display());
    println!(
        "{:<8} {:<10} {:<15} {:>5} {:>8} {:>8} {:>8} {:>8}",
        "column", "model", "prompt", "n", "strict", "lenient", "format", "ended"
    );
    for ((col, model, prompt), o) in &all {
        println!(
            "{col:<8} {model:<10} {prompt:<15} {:>5} {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}%",
            o.rows.len(),
            o.rate(|r| r.strict),
            o.rate(|r| r.lenient),
            o.rate(|r| r.format),
            o.rate(|r| r.ended)
        );
    }
    type Rule<'a> = (&'a str, &'a dyn Fn(&Row) -> bool);
    let rules: [Rule<'_>; 2] = [("strict", &|r: &Row| r.strict), ("lenient", &|r: &Row| r.lenient)];
    for col in &columns {
        let base_default = all.get(&(col.clone(), base.to_owned(), "default".to_owned()));
        let base_styles: Vec<(&String, &Outcomes)> =
            all.iter().filter(|(k, _)| &k.0 == col && k.1 == base).map(|(k, o)| (&k.2, o)).collect();
        for ((c, model, prompt), o) in &all {
            if c != col || model == base || prompt != "default" {
                continue;
            }
            for (rule, pick) in rules {
                let mut line = format!("{model} vs {base} on {col}, {rule}: {:.1}%", o.rate(pick));
                if let Some(b) = base_default {
                    let d = paired_bootstrap(&o.paired(b, pick), BOOTSTRAP_SEED);
                    line.push_str(&format!(" | vs default-prompt base ({:.1}%) {d}", b.rate(pick)));
                }
                // The best prompted base on this column and rule (the
                // highest accuracy over every prompt the base was run with:
                // the baseline most favourable to the base).
                if let Some((style, b)) = base_styles.iter().max_by(|x, y| x.1.rate(pick).total_cmp(&y.1.rate(pick))) {
                    let d = paired_bootstrap(&o.paired(b, pick), BOOTSTRAP_SEED);
                    line.push_str(&format!(" | vs best prompted base ({style}, {:.1}%) {d}", b.rate(pick)));
                }
                println!("{line}");
            }
        }
    }
    trainer_rounds(dir)?;
    Ok(())
}

/// The phases a trainer's round logs (`trainer-<arm>.log`, the lines the
/// script keeps), in the order they run.
const PHASES: [&str; 6] = ["take_s", "prove_s", "step_s", "export_s", "save_s", "upload_s"];

/// `key=value` of a tracing line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Per arm, the medians of each phase of its stepping rounds and of its
/// rounds that kept their groups, from `trainer-*.log` lines that carry
/// phase times (logs from before they were logged print nothing). Returns
/// the number of rows printed.
fn trainer_rounds(dir: &Path) -> Result<usize> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("trainer-")))
        .collect();
    logs.sort();
    let mut printed = 0;
    for log in logs {
        let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        let arm = log.file_stem().unwrap_or_default().to_string_lossy().trim_start_matches("trainer-").to_owned();
        let rounds = round_phases(&text);
        for (kind, rows) in [("step", &rounds.0), ("keep", &rounds.1)] {
            if rows.is_empty() {
                continue;
            }
            if printed == 0 {
                println!("trainer rounds, median seconds of each phase (count of rounds):");
                println!("{:<12} {:<5} {:>6} {}", "arm", "round", "n", PHASES.map(|p| format!("{p:>9}")).join(""));
            }
            printed += 1;
            let cells: Vec<String> = (0..PHASES.len())
                .map(|i| {
                    let v: Vec<f64> = rows.iter().filter_map(|r| r[i]).collect();
                    if v.is_empty() { format!("{:>9}", "-") } else { format!("{:>9.1}", median(&v)) }
                })
                .collect();
            println!("{arm:<12} {kind:<5} {:>6} {}", rows.len(), cells.join(""));
        }
        let dropped = dropped_groups(&text);
        if !dropped.is_empty() {
            let list: Vec<String> = dropped.iter().map(|(r, n)| format!("{r} {n}")).collect();
            println!("{arm:<12} groups not trained on, by reason, over these rounds: {}", list.join(", "));
        }
    }
    Ok(printed)
}

/// The groups a trainer's rounds dropped, summed by reason over the lines
/// that log `dropped=reason:n,...`.
fn dropped_groups(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        for item in field(line, "dropped").unwrap_or("").split(',').filter(|i| !i.is_empty()) {
            if let Some((reason, n)) = item.split_once(':')
                && let Ok(n) = n.parse::<u64>()
            {
                *out.entry(reason.to_owned()).or_default() += n;
            }
        }
    }
    out
}

/// One round's phase seconds, by [`PHASES`] (`None` where not logged).
type Phases = [Option<f64>; 6];

/// The stepping rounds' and the keeping rounds' phases of a trainer log
/// (only lines with at least `take_s`).
fn round_phases(text: &str) -> (Vec<Phases>, Vec<Phases>) {
    let (mut step, mut keep) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let phases: Phases = PHASES.map(|p| field(line, p).and_then(|v| v.parse().ok()));
        if phases[0].is_none() {
            continue;
        }
        if line.contains("trained step=") {
            step.push(phases);
        } else if line.contains("kept for a later step") {
            keep.push(phases);
        }
    }
    (step, keep)
}

/// Resamples of the paired bootstrap.
const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// Fixed, so the printed interval is reproducible.
const BOOTSTRAP_SEED: u64 = 0x7472_6962_7574_6172;

/// A difference in accuracy (percentage points) with its 95 % paired
/// bootstrap interval: problems are resampled with replacement, each keeping
/// both models' outcomes on it, so the interval reflects the pairing.
struct Diff {
    points: f64,
    lo: f64,
    hi: f64,
}

impl std::fmt::Display for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:+.1} pts (95% paired bootstrap CI {:+.1} to {:+.1})", self.points, self.lo, self.hi)
    }
}

/// splitmix64: a small, well-known generator; enough for resampling indices.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The accuracy difference `model − other` over paired outcomes
/// `(model, other)` on the same problems, with the 2.5 and 97.5 percentiles
/// of [`BOOTSTRAP_RESAMPLES`] paired resamples.
fn paired_bootstrap(pairs: &[(bool, bool)], seed: u64) -> Diff {
    let n = pairs.len();
    if n == 0 {
        return Diff { points: 0.0, lo: 0.0, hi: 0.0 };
    }
    let d: Vec<f64> = pairs.iter().map(|&(m, o)| f64::from(u8::from(m)) - f64::from(u8::from(o))).collect();
    let points = 100.0 * d.iter().sum::<f64>() / n as f64;
    let mut state = seed;
    let mut means: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let sum: f64 = (0..n).map(|_| d[(splitmix64(&mut state) % n as u64) as usize]).sum();
            100.0 * sum / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (means.len() - 1) as f64).round() as usize).min(means.len() - 1)];
    Diff { points, lo: at(0.025), hi: at(0.975) }
}

/// One row of `reward.csv`: `window,rollouts,mean_reward,...`.
fn read_csv(path: &Path) -> Result<Vec<(u64, f64)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(w), Some(r)) = (f.first(), f.get(2)) else {
            bail!("{}:{}: expected window,rollouts,mean_reward", path.display(), n + 1)
        };
        rows.push((
            w.trim().parse().with_context(|| format!("line {}", n + 1))?,
            r.trim().parse().with_context(|| format!("line {}", n + 1))?,
        ));
    }
    if rows.is_empty() {
        bail!("{}: no windows", path.display());
    }
    Ok(rows)
}

fn plot(o: &Opts) -> Result<()> {
    use plotters::prelude::*;
    let csvs: Vec<PathBuf> = o.all("csv").into_iter().map(PathBuf::from).collect();
    if csvs.is_empty() {
        bail!("give at least one --csv\n{USAGE}");
    }
    let labels: Vec<&str> = o.all("label");
    if !labels.is_empty() && labels.len() != csvs.len() {
        bail!("give one --label per --csv ({} labels, {} files)", labels.len(), csvs.len());
    }
    let out = PathBuf::from(o.get("out").context("--out FILE.png")?);
    let title = o.get("title").unwrap_or("Mean reward per window").to_owned();
    let font_path = PathBuf::from(o.get("font").unwrap_or(DEFAULT_FONT));
    let font = std::fs::read(&font_path)
        .with_context(|| format!("reading the font {} (Debian: fonts-dejavu-core)", font_path.display()))?;
    // plotters keeps registered fonts for the life of the process.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", font_path.display()))?;

    let arms: Vec<Vec<(u64, f64)>> = csvs.iter().map(|c| read_csv(c)).collect::<Result<_>>()?;
    let first = arms.iter().flatten().map(|r| r.0).min().unwrap_or(0);
    let last = arms.iter().flatten().map(|r| r.0).max().unwrap_or(0);
    let top = arms.iter().flatten().map(|r| r.1).fold(0.0f64, f64::max);
    let y_max = if top <= 0.5 { 0.5 } else { 1.0 };
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");

    let root = BitMapBackend::new(&out, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(first as i64 - 1..last as i64 + 1, 0.0f64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("window")
        .y_desc("mean reward (fraction of rollouts correct)")
        .label_style(("sans-serif", 16))
        .light_line_style(WHITE)
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| err(&e))?;
    let palette = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
    for (k, rows) in arms.iter().enumerate() {
        let color = palette[k % palette.len()];
        let name = labels.get(k).copied().unwrap_or("mean reward");
        // Trailing mean over 3 windows, to see the trend through sampling noise.
        let smooth: Vec<(u64, f64)> = rows
            .iter()
            .enumerate()
            .map(|(i, &(w, _))| {
                let s = &rows[i.saturating_sub(2)..=i];
                (w, s.iter().map(|r| r.1).sum::<f64>() / s.len() as f64)
            })
            .collect();
        chart
            .draw_series(LineSeries::new(rows.iter().map(|&(w, r)| (w as i64, r)), color.mix(0.35).stroke_width(1)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(rows.iter().map(|&(w, r)| Circle::new((w as i64, r), 3, color.mix(0.5).filled())))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(LineSeries::new(smooth.iter().map(|&(w, r)| (w as i64, r)), color.stroke_width(3)))
            .map_err(|e| err(&e))?
            .label(format!("{name} (trailing mean of 3; dots: each window)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    println!("wrote {} ({} arms, windows {first}..={last})", out.display(), arms.len());
    Ok(())
}

/// `groups`: one JSON line per group stored in a coordinator's store; with
/// `--completions MODEL.gguf` (any checkpoint of the network: they share its
/// tokenizer), each line also holds every rollout's completion as text.
/// `--relabel FILE` instead rewrites a groups file's problems ([`relabel`]).
fn groups(o: &Opts) -> Result<()> {
    use coordinator::store::Store;
    use tributary_protocol::rollout::{Rollout, RolloutLimits};
    // What a window assigned for a task id: `Environment::task`, which redraws
    // a seed whose own problem is held out (`ArithEnv::task` would not).
    let env = Environment::Arith(ArithEnv::new(o.num("difficulty", 115u32)?));
    if let Some(file) = o.get("relabel") {
        return relabel(&env, Path::new(file), o.get("out"));
    }
    let store_path = PathBuf::from(o.get("store").context("--store coordinator.redb (or --relabel FILE)")?);
    let windows: u64 = o.num("windows", 4096u64)?;
    let mut trained = std::collections::HashSet::new();
    if let Some(dir) = o.get("trainer") {
        for rec in trainer::service::batch_records(Path::new(dir)).with_context(|| format!("reading {dir}/batches"))? {
            trained.extend(rec.digests);
        }
    }
    let tokenizer = match o.get("completions") {
        Some(m) => Some(Tokenizer::from_gguf_file(Path::new(m)).with_context(|| format!("the tokenizer of {m}"))?),
        None => None,
    };
    let store = Store::open(&store_path).with_context(|| format!("opening {}", store_path.display()))?;
    let mut out = output(o.get("out"))?;
    let (mut n_groups, mut empty_run) = (0u64, 0u64);
    for window in 0..windows {
        let mut by_group: BTreeMap<([u8; 32], u32), Vec<Rollout>> = BTreeMap::new();
        let mut after = None;
        loop {
            let (page, next) = store.rollouts(window, None, after, 1024)?;
            for bytes in page {
                let r = Rollout::decode(&bytes, &RolloutLimits::DEFAULT)?;
                by_group.entry((r.miner, r.group)).or_default().push(r);
            }
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        // Windows are numbered from 0; stop after 16 empty ones in a row.
        if by_group.is_empty() {
            empty_run += 1;
            if empty_run >= 16 {
                break;
            }
            continue;
        }
        empty_run = 0;
        for (_, mut rs) in by_group {
            rs.sort_by_key(|r| r.rollout);
            let mut line = group_line(&env, &rs, &trained);
            if let Some(t) = &tokenizer {
                line["completions"] = completions(t, &rs)?.into();
            }
            writeln!(out, "{line}")?;
            n_groups += 1;
        }
    }
    out.flush()?;
    eprintln!("{n_groups} groups");
    Ok(())
}

/// Where `groups` writes: the file `--out` names, else standard output.
fn output(path: Option<&str>) -> Result<Box<dyn Write>> {
    Ok(match path {
        Some(p) => Box::new(BufWriter::new(File::create(p).with_context(|| format!("creating {p}"))?)),
        None => Box::new(std::io::stdout().lock()),
    })
}

/// The problem and answer a window assigned for `task_id`.
fn problem_of(env: &Environment, task_id: u64) -> (String, String) {
    let task = env.task(task_id);
    let answer = match task.answer {
        tributary_protocol::env::TaskAnswer::Number(n) | tributary_protocol::env::TaskAnswer::Practice(n) => n,
        other => format!("{other:?}"),
    };
    (task.prompt, answer)
}

/// `groups --relabel FILE`: a groups file (plain or `.gz`) with each line's
/// problem and answer recomputed from its task id. Files written before
/// `groups` redrew held-out seeds named, for about one group in eight, the
/// held-out problem its seed stood for instead of the one trained on
/// (rewards, windows and counts were right).
fn relabel(env: &Environment, file: &Path, out: Option<&str>) -> Result<()> {
    let text = read_text(file)?;
    let mut out = output(out)?;
    let (mut n, mut changed) = (0u64, 0u64);
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let mut v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}", file.display(), i + 1))?;
        let id = v["task"].as_u64().with_context(|| format!("{}:{}: no task id", file.display(), i + 1))?;
        let (problem, answer) = problem_of(env, id);
        changed += u64::from(v["problem"] != problem.as_str());
        v["problem"] = problem.into();
        v["answer"] = answer.into();
        writeln!(out, "{v}")?;
        n += 1;
    }
    out.flush()?;
    eprintln!("{n} groups, {changed} relabelled");
    Ok(())
}

/// The completion of each of `rollouts` as text (up to its end-of-generation token).
fn completions(tokenizer: &Tokenizer, rollouts: &[tributary_protocol::rollout::Rollout]) -> Result<Vec<String>> {
    rollouts
        .iter()
        .map(|r| {
            let completion = r.tokens.get(r.prompt_len as usize..).unwrap_or_default();
            Ok(tokenizer.decode(completion_text_ids(tokenizer, completion))?)
        })
        .collect()
}

/// One group's line for `groups`: `rollouts` (one miner's group in one
/// window, in rollout order, at least one) and the digests (hex) a step trained on.
fn group_line(
    env: &Environment,
    rollouts: &[tributary_protocol::rollout::Rollout],
    trained: &std::collections::HashSet<String>,
) -> serde_json::Value {
    let first = &rollouts[0];
    let (problem, answer) = problem_of(env, first.task_id);
    serde_json::json!({
        "window": first.window,
        "miner": hex::encode(&first.miner[..8]),
        "group": first.group,
        "task": first.task_id,
        "problem": problem,
        "answer": answer,
        "rewards": rollouts.iter().map(|r| r.reward).collect::<Vec<_>>(),
        "trained": rollouts.iter().filter(|r| trained.contains(&hex::encode(r.digest()))).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_phases_are_read_from_the_trainer_lines_that_log_them() {
        let log = "\
2026-12-04T19:23:08Z  INFO trainer::service: kept for a later step (below the floor) groups=4 floor=8 next_window=1
2026-12-05T01:00:00Z  INFO trainer::service: kept for a later step (below the floor) groups=4 floor=8 next_window=1 take_s=80.5 prove_s=70.25
2026-12-05T01:04:00Z  INFO trainer::service: trained step=1 loss=0.1 groups=9 take_s=90 prove_s=75 step_s=60.5 export_s=5 save_s=12 upload_s=8
2026-12-05T01:05:00Z  INFO trainer::service: checkpoint uploaded take_s=1
";
        let (step, keep) = round_phases(log);
        assert_eq!(keep, vec![[Some(80.5), Some(70.25), None, None, None, None]]);
        assert_eq!(step, vec![[Some(90.0), Some(75.0), Some(60.5), Some(5.0), Some(12.0), Some(8.0)]]);
        assert_eq!(field("a step_s=1.5 x", "step_s"), Some("1.5"));
        let dropped = "x dropped=zero_variance:10,off_draw:1 y\nx dropped=zero_variance:3\nx dropped= y\n";
        let want: BTreeMap<String, u64> = [("off_draw".to_owned(), 1), ("zero_variance".to_owned(), 13)].into();
        assert_eq!(dropped_groups(dropped), want);
        assert_eq!(field("a take_s=1.5 x", "step_s"), None);
    }

    #[test]
    fn groups_reads_each_stored_group_with_its_problem_rewards_and_trained_rollouts() {
        use coordinator::core::Candidate;
        use coordinator::store::{Store, StoredRollout};
        use tributary_protocol::checkpoint::ContentId;
        use tributary_protocol::env::EnvId;
        use tributary_protocol::identity::Keypair;
        use tributary_protocol::rollout::{Rollout, SamplingParams};

        let dir = tempfile::tempdir().unwrap();
        let key = Keypair::generate();
        let env = Environment::Arith(ArithEnv::new(115));
        // A seed whose own problem is held out: a window assigns it the
        // problem of a redraw, and that is the problem its group names.
        let held = (0u64..).find(|&s| ArithEnv::new(115).task(s).prompt != env.task(s).prompt).unwrap();
        let model = tributary_assets::smollm2_q4_1();
        let tokenizer = Tokenizer::from_gguf_file(&model).expect("SmolLM2 tokenizer (run scripts/setup.sh)");
        let eos = tokenizer.eos_id();
        // Rollout i of a group completes `i - 30 = …` (ended by EOS except the last).
        let text = |i: u32| format!("{i} - 30 = {}\nAnswer: {}", i as i64 - 30, i as i64 - 30);
        // Window 2: groups 0 and 1 of three rollouts; window 5: group 0 of two.
        let mut rollouts = Vec::new();
        for (window, group, n, task) in [(2u64, 0u32, 3u32, 11u64), (2, 1, 3, held), (5, 0, 2, 13)] {
            for i in 0..n {
                let mut tokens = vec![1, 2, 3];
                tokens.extend(tokenizer.encode(&text(i)).unwrap());
                if i + 1 < n {
                    tokens.push(eos);
                }
                let mut r = Rollout {
                    window,
                    checkpoint: ContentId([7; 32]),
                    env: EnvId::Arith,
                    group,
                    rollout: i,
                    task_id: task,
                    sampling: SamplingParams { temperature: 0.7, max_new_tokens: 8 },
                    logprobs: vec![-0.5; tokens.len() - 3],
                    sketches: vec![0; tokens.len()],
                    tokens,
                    prompt_len: 3,
                    reward: if i == 1 { 1.0 } else { 0.0 },
                    miner: key.public().0,
                    signature: [0; 64],
                };
                r.sign(&key);
                rollouts.push(r);
            }
        }
        let stored: Vec<StoredRollout> = rollouts
            .iter()
            .map(|r| {
                let bytes = r.encode();
                let candidate = Candidate::of(r, r.digest(), bytes.len() as u32);
                StoredRollout { candidate, bytes }
            })
            .collect();
        let store_path = dir.path().join("coordinator.redb");
        Store::open(&store_path).unwrap().put_rollouts(&stored).unwrap();
        // A trainer batch record naming two rollouts of window 2's group 1.
        let batches = dir.path().join("batches");
        std::fs::create_dir(&batches).unwrap();
        let trained: Vec<String> = rollouts[3..5].iter().map(|r| hex::encode(r.digest())).collect();
        std::fs::write(
            batches.join("3.json"),
            serde_json::json!({"window": 3, "step": 1, "trained": [2], "digests": trained}).to_string(),
        )
        .unwrap();

        let out = dir.path().join("groups.jsonl");
        let arg = |s: &std::path::Path| s.to_str().unwrap().to_owned();
        let args: Vec<String> = ["--store", &arg(&store_path), "--trainer", &arg(dir.path()), "--out", &arg(&out)]
            .map(str::to_owned)
            .to_vec();
        groups(&Opts::parse(&args).unwrap()).unwrap();
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        let seen: Vec<(u64, u64, u64)> = lines
            .iter()
            .map(|l| (l["window"].as_u64().unwrap(), l["group"].as_u64().unwrap(), l["trained"].as_u64().unwrap()))
            .collect();
        assert_eq!(seen, vec![(2, 0, 0), (2, 1, 2), (5, 0, 0)]);
        for (line, task) in lines.iter().zip([11u64, held, 13]) {
            let want = env.task(task);
            assert_eq!(line["task"].as_u64(), Some(task));
            assert_eq!(line["problem"].as_str(), Some(want.prompt.as_str()));
            let tributary_protocol::env::TaskAnswer::Number(answer) = want.answer else {
                panic!("arith answers a number")
            };
            assert_eq!(line["answer"].as_str(), Some(answer.as_str()));
        }
        assert_eq!(lines[0]["rewards"], serde_json::json!([0.0, 1.0, 0.0]));
        assert_eq!(lines[2]["rewards"], serde_json::json!([0.0, 1.0]));
        assert!(lines.iter().all(|l| l.get("completions").is_none()), "no text unless asked");
        assert_ne!(lines[1]["problem"].as_str(), Some(ArithEnv::new(115).task(held).prompt.as_str()));

        // `--relabel` recomputes a file's problems and answers from its task
        // ids: a line naming the held-out problem its seed stood for is fixed,
        // the others are kept as they were.
        let mut stale = lines.clone();
        stale[1]["problem"] = ArithEnv::new(115).task(held).prompt.into();
        stale[1]["answer"] = "0".into();
        let stale_file = dir.path().join("stale.jsonl");
        let body: String = stale.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&stale_file, body).unwrap();
        let fixed_file = dir.path().join("fixed.jsonl");
        let args: Vec<String> =
            ["--relabel", &arg(&stale_file), "--out", &arg(&fixed_file)].map(str::to_owned).to_vec();
        groups(&Opts::parse(&args).unwrap()).unwrap();
        let fixed: Vec<serde_json::Value> =
            std::fs::read_to_string(&fixed_file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(fixed, lines);

        // With `--completions`, every rollout's text, up to its end token.
        let args: Vec<String> = ["--store", &arg(&store_path), "--completions", &arg(&model), "--out", &arg(&out)]
            .map(str::to_owned)
            .to_vec();
        groups(&Opts::parse(&args).unwrap()).unwrap();
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[1]["completions"], serde_json::json!([text(0), text(1), text(2)]));
        assert_eq!(lines[2]["completions"], serde_json::json!([text(0), text(1)]));
        assert_eq!(lines[1]["trained"], 0, "no --trainer, nothing counted as trained");
    }

    #[test]
    fn every_level_of_the_bench_is_measured_on_the_committed_columns() {
        // The problems `eval` asks (500 a column, as the bench does) are those
        // of the committed evidence of the runs with each arm alone, in
        // order, on 115 and on 118 (105's problems, mostly subtracting): a
        // 118 network is measured on the problems a 115 network was.
        let evidence = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/training-evidence/alone24");
        for difficulty in [115, 118] {
            let (test, band, ood) = held_out_levels(difficulty);
            let columns = [
                ("test", Environment::Arith(ArithEnv::new(test)).test_problems(500)),
                ("band", Environment::Arith(ArithEnv::new(band)).distinct_problems(500)),
                ("ood", Environment::Arith(ArithEnv::new(ood)).distinct_problems(500)),
            ];
            for (name, tasks) in columns {
                let rows = read_rows(&evidence.join(format!("eval-base-default-{name}.jsonl.gz"))).unwrap();
                let asked: Vec<&str> = tasks.iter().map(|t| t.prompt.as_str()).collect();
                let kept: Vec<&str> = rows.iter().map(|r| r.problem.as_str()).collect();
                assert_eq!(asked, kept, "level {difficulty}, column {name}");
            }
        }
        assert_eq!(held_out_levels(105), (105, 106, 107));
        assert_eq!(held_out_levels(108), (105, 106, 107));
        assert_eq!(held_out_levels(104), (104, 106, 107));
        // A 118 network never trains on a problem of its test column.
        let (train, test) = (Environment::Arith(ArithEnv::new(118)), Environment::Arith(ArithEnv::new(115)));
        let held: std::collections::HashSet<String> = test.test_problems(500).into_iter().map(|t| t.prompt).collect();
        assert!((0..5_000u64).all(|s| !held.contains(&train.task(s).prompt)));
    }

    #[test]
    fn an_unknown_option_is_refused() {
        let args: Vec<String> = ["--store", "x.redb", "--batches", "b"].map(str::to_owned).to_vec();
        let opts = Opts::parse(&args).unwrap();
        let err = opts.only(&["store", "trainer"]).unwrap_err().to_string();
        assert!(err.starts_with("unknown option --batches"), "{err}");
        assert!(opts.only(&["store", "batches"]).is_ok());
    }

    #[test]
    fn paired_bootstrap_brackets_the_difference() {
        // 200 problems: the base solves the first 20, the other model the
        // first 50 (it keeps every base success): +15 points.
        let pairs: Vec<(bool, bool)> = (0..200).map(|k| (k < 50, k < 20)).collect();
        let d = paired_bootstrap(&pairs, BOOTSTRAP_SEED);
        assert!((d.points - 15.0).abs() < 1e-9, "{}", d.points);
        assert!(d.lo < 15.0 && d.hi > 15.0 && d.lo > 9.0 && d.hi < 21.0, "{d}");
        // Pairing: the same outcomes give a zero-width interval at 0.
        let same: Vec<(bool, bool)> = (0..200).map(|k| (k < 20, k < 20)).collect();
        let z = paired_bootstrap(&same, BOOTSTRAP_SEED);
        assert_eq!((z.points, z.lo, z.hi), (0.0, 0.0, 0.0));
    }

    #[test]
    fn prompt_styles_render_and_prefills_are_scored() {
        let env = Environment::Arith(ArithEnv::new(105));
        let task = env.test_problems(1).remove(0);
        let (p, pre) = PromptStyle::Default.render(&env, &task).unwrap();
        assert_eq!((p.as_str(), pre.as_str()), (env.prompt_text(&task).as_str(), ""));
        let (_, pre) = PromptStyle::AnswerPrefill.render(&env, &task).unwrap();
        assert_eq!(pre, "Answer: ");
        let (_, pre) = PromptStyle::ExprPrefill.render(&env, &task).unwrap();
        assert!(pre.ends_with(" = ") && task.prompt.contains(pre.trim_end_matches(" = ")), "{pre}");
        let (few, pre) = PromptStyle::FewShot.render(&env, &task).unwrap();
        assert!(pre.is_empty() && few.matches("Answer: ").count() >= 3 && few.ends_with("assistant\n"), "{few}");
        assert!(few.contains(&task.prompt));
        let gsm = Environment::Gsm8k(Gsm8kEnv::from_jsonl("{\"question\": \"q?\", \"answer\": \"#### 3\"}").unwrap());
        let t = gsm.test_problems(1).remove(0);
        assert!(PromptStyle::ExprPrefill.render(&gsm, &t).is_none() && PromptStyle::FewShot.render(&gsm, &t).is_none());
    }

    #[test]
    fn only_a_whole_file_of_the_same_settings_is_kept() {
        let env = Environment::Arith(ArithEnv::new(105));
        let col = Column { name: "test".into(), tasks: env.test_problems(3), env };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("eval-base-fewshot-test.jsonl");
        let settings = Settings::of(Path::new("/m/base.gguf"), 96);
        let line = |task: &Task, model_file: &str, budget: usize| {
            serde_json::json!({
                "model": "base", "prompt": "fewshot", "column": "test", "task": task.id,
                "model_file": model_file, "max_new_tokens": budget, "problem": task.prompt,
                "completion": "", "ended": true, "strict": false, "lenient": false, "format": false,
            })
            .to_string()
        };
        let write = |lines: Vec<String>| std::fs::write(&out, lines.join("\n") + "\n").unwrap();
        let kept = || done_before(&out, "base", PromptStyle::FewShot, &col, &settings);
        assert!(!kept(), "no file");
        write(col.tasks.iter().map(|t| line(t, "base.gguf", 96)).collect());
        assert!(kept(), "the same settings, every task");
        assert!(!done_before(&out, "base", PromptStyle::Default, &col, &settings), "another prompt");
        assert!(!done_before(&out, "arm", PromptStyle::FewShot, &col, &settings), "another label");
        write(col.tasks.iter().map(|t| line(t, "other.gguf", 96)).collect());
        assert!(!kept(), "another model file");
        write(col.tasks.iter().map(|t| line(t, "base.gguf", 48)).collect());
        assert!(!kept(), "another budget");
        write(col.tasks[..2].iter().map(|t| line(t, "base.gguf", 96)).collect());
        assert!(!kept(), "a short file");
        write(col.tasks.iter().rev().map(|t| line(t, "base.gguf", 96)).collect());
        assert!(!kept(), "other tasks in order");
    }
}
