//! `train-bench`: the measuring half of `scripts/train-bench.sh`.
//!
//! - `eval`: greedy accuracy of one or more checkpoints on held-out
//!   **problems** (llama.cpp, G = 1, T = 0): the test split of the arith level
//!   (`Environment::test_problems`, problems no window ever assigns, so no
//!   checkpoint trained on them) and, with `--gsm8k-test FILE`, the first
//!   tasks of GSM8K's own test file as a second column. Each column reports
//!   the lenient reward (the protocol's), a strict answer rule (the last line
//!   is exactly `Answer: N`), and format apart from correctness (ended with
//!   an end-of-generation token; wrote an `Answer:` marker). Models are
//!   evaluated side by side, one thread each; per-task lines go to
//!   `heldout-<model>-<column>.jsonl`.
//!   Each model after the first is compared with the first (the base) on
//!   the same problems: the difference in accuracy with a 95 % paired
//!   bootstrap interval, lenient and strict.
//! - `plot`: mean reward per window (`reward.csv` as written by the script),
//!   one line per arm (`--csv` and `--label` repeat), as a PNG (plotters, bitmap backend; text in DejaVu Sans read at run time).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use edge_miner::backend::{Backend, DrawKey, GroupRequest};
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use tributary_protocol::env::{
    ArithEnv, Environment, Gsm8kEnv, Task, TaskAnswer, completion_reward, completion_text_ids,
};
use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

const USAGE: &str = "usage:
  train-bench eval --model CKPT.gguf [--model ...] [--difficulty D] [--tasks N]
                   [--gsm8k-test FILE] [--max-new-tokens T] [--threads K] [--out-dir DIR]
  train-bench plot --csv reward.csv [--label NAME] [--csv ... --label ...] --out reward.png
                   [--title TEXT] [--font FILE.ttf]";

/// The font `plot` writes with unless `--font` names another.
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else { bail!("{USAGE}") };
    let opts = Opts::parse(rest)?;
    match cmd.as_str() {
        "eval" => eval(&opts),
        "plot" => plot(&opts),
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

/// What one model did on one column of held-out problems.
#[derive(Default)]
struct Tally {
    tasks: usize,
    /// Lenient reward 1 (the protocol's answer extraction).
    solved: usize,
    /// Last non-empty line exactly `Answer: <want>`.
    strict: usize,
    /// Ended with an end-of-generation token within the budget.
    ended: usize,
    /// Wrote an `Answer:` marker at all.
    marker: usize,
    secs: f64,
    /// Per problem, in order: (lenient correct, strict correct), for the
    /// paired comparison between models.
    per_task: Vec<(bool, bool)>,
}

impl Tally {
    fn line(&self) -> String {
        let f = |n: usize| n as f64 / self.tasks.max(1) as f64;
        format!(
            "accuracy={:.3} strict={:.3} ended={:.3} marker={:.3} solved={}/{} time={:.0}s",
            f(self.solved),
            f(self.strict),
            f(self.ended),
            f(self.marker),
            self.solved,
            self.tasks,
            self.secs
        )
    }
}

/// The strict answer rule: the completion's last non-empty line is exactly
/// `Answer: <want>` (numbers as the environment canonicalises them).
fn strict_correct(task: &Task, text: &str) -> bool {
    let Some(last) = text.lines().rev().map(str::trim).find(|l| !l.is_empty()) else { return false };
    match &task.answer {
        TaskAnswer::Number(want) | TaskAnswer::Practice(want) => {
            last.strip_prefix("Answer: ").is_some_and(|got| got.trim() == want)
        }
        TaskAnswer::Sat(_) => task.answer.reward(last) >= 1.0,
    }
}

/// Greedy generation of `model` on `tasks`, one per-task JSON line to `out`.
fn evaluate(
    model: &Path,
    env: &Environment,
    tasks: &[Task],
    max_new_tokens: usize,
    threads: usize,
    out: &Path,
) -> Result<Tally> {
    let tokenizer = Tokenizer::from_gguf_file(model).context("building the tokenizer")?;
    let mut backend = LlamaCppBackend::load(&LlamaConfig { model: model.to_path_buf(), threads, gpu_layers: 0 })?;
    if tokenizer.vocab_size() != backend.vocab_size() {
        bail!("tokenizer has {} tokens, model {}", tokenizer.vocab_size(), backend.vocab_size());
    }
    let eog: Vec<u32> = tokenizer.eog_ids().collect();
    // Greedy decoding draws nothing; the key only feeds the unused sketches.
    let seed = Seed([0; 32]);
    let sketch_key = SketchKey::derive(&seed, backend.hidden_size());
    let mut file = BufWriter::new(File::create(out).with_context(|| format!("creating {}", out.display()))?);
    let start = std::time::Instant::now();
    let mut t = Tally { tasks: tasks.len(), ..Tally::default() };
    for (i, task) in tasks.iter().enumerate() {
        let prompt = tokenizer.encode(&env.prompt_text(task))?;
        let req = GroupRequest {
            prompt: &prompt,
            group_size: 1,
            max_new_tokens,
            temperature: 0.0,
            draw: DrawKey { sampling_seed: seed, miner: [0; 32], group: i as u32 },
            sketch_key: &sketch_key,
            sketch_params: SketchParams::DEFAULT,
            eog: &eog,
        };
        let seq = backend.generate_group(&req)?.into_iter().next().context("an empty group")?;
        let reward = completion_reward(&tokenizer, env, task, &seq.completion)?;
        let text_ids = completion_text_ids(&tokenizer, &seq.completion);
        let ended = text_ids.len() < seq.completion.len();
        let text = tokenizer.decode(text_ids)?;
        let strict = strict_correct(task, &text);
        t.solved += usize::from(reward >= 1.0);
        t.strict += usize::from(strict);
        t.ended += usize::from(ended);
        t.marker += usize::from(text.contains("Answer:"));
        t.per_task.push((reward >= 1.0, strict));
        let line = serde_json::json!({
            "task": task.id, "prompt": task.prompt, "completion": text,
            "reward": reward, "strict": strict, "ended": ended,
        });
        writeln!(file, "{line}")?;
    }
    file.flush()?;
    t.secs = start.elapsed().as_secs_f64();
    Ok(t)
}

fn eval(o: &Opts) -> Result<()> {
    let models: Vec<PathBuf> = o.all("model").into_iter().map(PathBuf::from).collect();
    if models.is_empty() {
        bail!("give at least one --model\n{USAGE}");
    }
    let difficulty: u32 = o.num("difficulty", 104)?;
    let n: usize = o.num("tasks", 200)?;
    let threads: usize = o.num("threads", 1)?;
    let max_new_tokens: usize = o.num("max-new-tokens", 48)?;
    let out_dir = PathBuf::from(o.get("out-dir").unwrap_or("."));
    std::fs::create_dir_all(&out_dir)?;
    let mut columns = Vec::new();
    let arith = Environment::Arith(ArithEnv::new(difficulty));
    let tasks = arith.test_problems(n);
    columns.push((format!("arith{}", ArithEnv::new(difficulty).difficulty()), arith, tasks));
    if let Some(path) = o.get("gsm8k-test") {
        let gsm = Environment::Gsm8k(Gsm8kEnv::load(Path::new(path)).with_context(|| format!("loading {path}"))?);
        let tasks = gsm.test_problems(n);
        columns.push(("gsm8k".to_owned(), gsm, tasks));
    }
    for (name, _, tasks) in &columns {
        println!("held-out {name}: {} distinct test problems, greedy, {max_new_tokens} new tokens", tasks.len());
    }
    for (name, env, tasks) in &columns {
        let results: Vec<Result<Tally>> = std::thread::scope(|s| {
            let handles: Vec<_> = models
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let out = out_dir.join(format!("heldout-{i}-{name}.jsonl"));
                    s.spawn(move || evaluate(m, env, tasks, max_new_tokens, threads, &out))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("evaluation thread panicked"))))
                .collect()
        });
        let mut tallies = Vec::with_capacity(models.len());
        for (i, (m, r)) in models.iter().zip(results).enumerate() {
            let t = r.with_context(|| format!("evaluating {} on {name}", m.display()))?;
            println!("model{i} {name} {} file={}", t.line(), m.display());
            tallies.push(t);
        }
        // Each later model against model0 on the same problems.
        for (i, t) in tallies.iter().enumerate().skip(1) {
            let base = &tallies[0].per_task;
            let lenient = paired_bootstrap(base, &t.per_task, |x| x.0, BOOTSTRAP_SEED);
            let strict = paired_bootstrap(base, &t.per_task, |x| x.1, BOOTSTRAP_SEED);
            println!("model{i} vs model0 {name}: lenient {lenient} | strict {strict}");
        }
    }
    Ok(())
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

/// `b`'s accuracy minus `a`'s on the same problems, with the 2.5 and 97.5
/// percentiles of [`BOOTSTRAP_RESAMPLES`] paired resamples.
fn paired_bootstrap(a: &[(bool, bool)], b: &[(bool, bool)], pick: impl Fn(&(bool, bool)) -> bool, seed: u64) -> Diff {
    let n = a.len().min(b.len());
    if n == 0 {
        return Diff { points: 0.0, lo: 0.0, hi: 0.0 };
    }
    let d: Vec<f64> = (0..n).map(|k| f64::from(u8::from(pick(&b[k]))) - f64::from(u8::from(pick(&a[k])))).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_bootstrap_brackets_the_difference() {
        // 200 problems: the base solves the first 20, the other model the
        // first 50 (it keeps every base success): +15 points.
        let a: Vec<(bool, bool)> = (0..200).map(|k| (k < 20, false)).collect();
        let b: Vec<(bool, bool)> = (0..200).map(|k| (k < 50, k < 10)).collect();
        let d = paired_bootstrap(&a, &b, |x| x.0, BOOTSTRAP_SEED);
        assert!((d.points - 15.0).abs() < 1e-9, "{}", d.points);
        assert!(d.lo < 15.0 && d.hi > 15.0 && d.lo > 9.0 && d.hi < 21.0, "{d}");
        // Pairing: the same outcomes give a zero-width interval at 0.
        let same = paired_bootstrap(&a, &a, |x| x.0, BOOTSTRAP_SEED);
        assert_eq!((same.points, same.lo, same.hi), (0.0, 0.0, 0.0));
        let strict = paired_bootstrap(&a, &b, |x| x.1, BOOTSTRAP_SEED);
        assert!((strict.points - 5.0).abs() < 1e-9 && strict.lo > 0.0, "{strict}");
    }
}
