//! `train-bench`: the measuring half of `scripts/train-bench.sh`.
//!
//! - `eval`: greedy held-out accuracy of one or more checkpoints on the same
//!   fixed arith task set (llama.cpp, `edge_miner::offline::generate` with
//!   G = 1 and T = 0; reward from `tributary_protocol::env`). The task set is
//!   that of an offline window of `--seed` (default 12345): task seeds no
//!   network window assigns. Models are evaluated side by side, one thread
//!   each.
//! - `plot`: mean reward per window (`reward.csv` as written by the script)
//!   as a PNG (plotters, bitmap backend; text in DejaVu Sans read at run time).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use edge_miner::backend::Backend;
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use edge_miner::offline::{self, GenerateOptions, Job, OfflineWindow};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{ArithEnv, Environment};
use tributary_protocol::sketch::SketchParams;
use tributary_protocol::tokenizer::Tokenizer;

const USAGE: &str = "usage:
  train-bench eval --model CKPT.gguf [--model ...] [--difficulty D] [--tasks N] [--seed S]
                   [--max-new-tokens T] [--threads K] [--out-dir DIR]
  train-bench plot --csv reward.csv --out reward.png [--title TEXT] [--font FILE.ttf]";

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

/// Greedy accuracy of one model on the held-out set.
struct Accuracy {
    solved: usize,
    tasks: usize,
    secs: f64,
}

fn evaluate(
    model: &Path,
    env: &Environment,
    opts: &GenerateOptions,
    seed: u64,
    threads: usize,
    out: &Path,
) -> Result<Accuracy> {
    let tokenizer = Tokenizer::from_gguf_file(model).context("building the tokenizer")?;
    let model_id = Checkpoint::open(model).ok().map(|c| c.content_id());
    let mut backend = LlamaCppBackend::load(&LlamaConfig { model: model.to_path_buf(), threads, gpu_layers: 0 })?;
    if tokenizer.vocab_size() != backend.vocab_size() {
        bail!("tokenizer has {} tokens, model {}", tokenizer.vocab_size(), backend.vocab_size());
    }
    let window = OfflineWindow::from_seed(seed);
    let job = Job { tokenizer: &tokenizer, env, model: model_id, data: None, window: &window, opts };
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let start = std::time::Instant::now();
    let mut solved = 0;
    let mut write = offline::jsonl_sink(BufWriter::new(file));
    let summary = offline::generate(
        &mut backend,
        &job,
        |rec| {
            if rec.reward >= 1.0 {
                solved += 1;
            }
            write(rec)
        },
        |_| {},
    )?;
    Ok(Accuracy { solved, tasks: summary.rollouts, secs: start.elapsed().as_secs_f64() })
}

fn eval(o: &Opts) -> Result<()> {
    let models: Vec<PathBuf> = o.all("model").into_iter().map(PathBuf::from).collect();
    if models.is_empty() {
        bail!("give at least one --model\n{USAGE}");
    }
    let difficulty: u32 = o.num("difficulty", 100)?;
    let tasks: usize = o.num("tasks", 100)?;
    let seed: u64 = o.num("seed", 12345)?;
    let threads: usize = o.num("threads", 1)?;
    let out_dir = PathBuf::from(o.get("out-dir").unwrap_or("."));
    std::fs::create_dir_all(&out_dir)?;
    let env = Environment::Arith(ArithEnv::new(difficulty));
    let gen_opts = GenerateOptions {
        first_task: 0,
        tasks,
        group: 1,
        max_new_tokens: o.num("max-new-tokens", 48)?,
        temperature: 0.0,
        sketch_params: SketchParams::DEFAULT,
    };
    println!(
        "held-out: arith difficulty {}, {tasks} tasks of offline seed {seed}, greedy, {} new tokens",
        ArithEnv::new(difficulty).difficulty(),
        gen_opts.max_new_tokens
    );
    let results: Vec<Result<Accuracy>> = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (env, gen_opts, out) = (&env, &gen_opts, out_dir.join(format!("heldout-{i}.jsonl")));
                s.spawn(move || evaluate(m, env, gen_opts, seed, threads, &out))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("evaluation thread panicked"))))
            .collect()
    });
    for (i, (m, r)) in models.iter().zip(results).enumerate() {
        let a = r.with_context(|| format!("evaluating {}", m.display()))?;
        println!(
            "model{i} accuracy={:.3} solved={}/{} time={:.0}s file={}",
            a.solved as f64 / a.tasks.max(1) as f64,
            a.solved,
            a.tasks,
            a.secs,
            m.display()
        );
    }
    Ok(())
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
    let csv = PathBuf::from(o.get("csv").context("--csv FILE")?);
    let out = PathBuf::from(o.get("out").context("--out FILE.png")?);
    let title = o.get("title").unwrap_or("Mean reward per window").to_owned();
    let font_path = PathBuf::from(o.get("font").unwrap_or(DEFAULT_FONT));
    let font = std::fs::read(&font_path)
        .with_context(|| format!("reading the font {} (Debian: fonts-dejavu-core)", font_path.display()))?;
    // plotters keeps registered fonts for the life of the process.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", font_path.display()))?;

    let rows = read_csv(&csv)?;
    let first = rows.iter().map(|r| r.0).min().unwrap_or(0);
    let last = rows.iter().map(|r| r.0).max().unwrap_or(0);
    // Trailing mean over 3 windows, to see the trend through sampling noise.
    let smooth: Vec<(u64, f64)> = rows
        .iter()
        .enumerate()
        .map(|(i, &(w, _))| {
            let lo = i.saturating_sub(2);
            let s = &rows[lo..=i];
            (w, s.iter().map(|r| r.1).sum::<f64>() / s.len() as f64)
        })
        .collect();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");

    let root = BitMapBackend::new(&out, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(first as i64 - 1..last as i64 + 1, 0.0f64..1.0)
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
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    chart
        .draw_series(LineSeries::new(rows.iter().map(|&(w, r)| (w as i64, r)), blue.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("mean reward")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart.draw_series(rows.iter().map(|&(w, r)| Circle::new((w as i64, r), 4, blue.filled()))).map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(smooth.iter().map(|&(w, r)| (w as i64, r)), orange.stroke_width(3)))
        .map_err(|e| err(&e))?
        .label("trailing mean of 3 windows")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(3)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    println!("wrote {} ({} windows)", out.display(), rows.len());
    Ok(())
}
