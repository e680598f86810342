//! Calibration bench (issue #3 item 7; the false-positive budget of #5.4).
//!
//! Honest llama.cpp CPU rollouts of the BF16 base on GSM8K are checked by the
//! libtorch reference, and the distributions the proof constants are chosen
//! from are printed: sketch distance ÷ tolerance at the challenged positions,
//! |Δ logprob| at every completion position, how far the seeded draw lies
//! from the reference CDF interval's nearest edge (the sampling check's ε
//! must exceed every honest miss), and the share of positions skipped as
//! ambiguous. Then cheaters, each checked against the honest checkpoint, with
//! the share of their rollouts rejected by each hard check.
//!
//! ```text
//! cargo run -p validator --features calibrate --bin calibrate -- \
//!     --model .cache/models/SmolLM2-135M-Instruct.bf16.gguf \
//!     --data /work/shared/data/gsm8k/test.jsonl --tasks 25 --group 8 --max-new-tokens 128
//! ```
//!
//! Generated rollouts are cached as JSONL under `--work` (delete to regenerate).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use edge_miner::backend::Backend;
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use edge_miner::offline::{GenerateOptions, Job, OfflineWindow, RolloutRecord, generate};
use edge_miner::quantize::{FileType, quantize};
use tributary_policy::{EvidenceRequest, ReferenceModel};
use tributary_protocol::checkpoint::{Checkpoint, ContentId};
use tributary_protocol::env::{Environment, Gsm8kEnv};
use tributary_protocol::gguf::{self, GgmlType};
use tributary_protocol::rollout::{Rollout, SamplingParams};
use tributary_protocol::sampling;
use tributary_protocol::sketch::{self, SketchKey};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::{self, Assignment, CheckKind, Evidence, PositionEvidence, Severity, Verdict, VerifyParams};

#[derive(Parser, Debug)]
#[command(about = "Calibrate the proof constants on the real model")]
struct Args {
    /// The honest checkpoint (BF16 GGUF).
    #[arg(long)]
    model: PathBuf,
    /// GSM8K JSONL file.
    #[arg(long)]
    data: PathBuf,
    /// Honest tasks (one group each).
    #[arg(long, default_value_t = 25)]
    tasks: usize,
    /// Rollouts per task.
    #[arg(long, default_value_t = 8)]
    group: usize,
    /// Most completion tokens per rollout.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Offline window seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// CPU threads (llama.cpp and libtorch).
    #[arg(long)]
    threads: Option<usize>,
    /// Cache of generated rollouts and derived checkpoints.
    #[arg(long, default_value = "/tmp/tributary-calibrate")]
    work: PathBuf,
    /// Tasks (groups) generated per cheater.
    #[arg(long, default_value_t = 2)]
    cheater_tasks: usize,
    /// Cheaters to run (comma separated): tiny, q4_0, q8_0, q4_1, perturb-<rel>,
    /// edit, other-model.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tiny,q4_0,perturb-0.03,perturb-0.01,perturb-0.003,perturb-0.001,edit,other-model,q8_0,q4_1"
    )]
    cheaters: Vec<String>,
    /// Check the sketch at every position (prompt included), not only at the
    /// challenged ones: the false-positive budget of issue #5 counts them all.
    #[arg(long)]
    challenge_all: bool,
    /// Only compare llama.cpp's teacher-forced hidden states and logits with
    /// the reference's on the first honest rollout, position by position.
    #[arg(long)]
    diagnose: bool,
}

/// Everything shared by the run.
struct Run {
    args: Args,
    tokenizer: Tokenizer,
    env: Environment,
    window: OfflineWindow,
    params: VerifyParams,
    threads: usize,
}

/// Figures of one checked rollout.
#[derive(Default)]
struct Figures {
    verdict: Verdict,
    /// Sketch distance ÷ tolerance at every challenged position.
    sketch_ratio: Vec<f64>,
    /// Raw sketch distance at every challenged position.
    sketch_dist: Vec<u32>,
    /// |lp_miner − lp_ref| at every completion position.
    dlp: Vec<f64>,
    /// Distance of u to the nearest interval edge, and whether u is inside.
    edge: Vec<(f64, bool)>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let threads = tributary_policy::init_threads(args.threads);
    std::fs::create_dir_all(&args.work)?;
    let tokenizer = Tokenizer::from_gguf_file(&args.model)?;
    let env = Environment::Gsm8k(Gsm8kEnv::load(&args.data)?);
    let window = OfflineWindow::from_seed(args.seed);
    let run = Run { tokenizer, env, window, params: VerifyParams::DEFAULT, threads, args };
    let a = &run.args;
    println!(
        "calibration: {} × {} rollouts, ≤ {} new tokens, T = {}, seed {}, {} threads; constants: {:?}, sample_eps {}, logprob_is_eps {}",
        a.tasks, a.group, a.max_new_tokens, a.temperature, a.seed, threads, run.params.sketch, run.params.sample_eps, run.params.logprob_is_eps
    );

    let ckpt = Checkpoint::open(&a.model)?;
    let honest_id = ckpt.content_id();
    let model = ReferenceModel::load(&ckpt, tributary_policy::default_device())?;
    drop(ckpt);

    // Honest rollouts.
    let (honest, made) = run.generate_cached(&a.model, "honest", a.tasks)?;
    let tokens: usize = honest.iter().map(|r| r.tokens.len() - r.prompt_len).sum();
    println!(
        "honest generation: {} rollouts, {} completion tokens; generated by this run: {} rollouts, {} tokens in {:.1}s ({:.1} tok/s; the rest read from the cache)",
        honest.len(),
        tokens,
        made.rollouts,
        made.tokens,
        made.secs,
        made.tokens as f64 / made.secs.max(1e-9)
    );
    if run.args.diagnose {
        return diagnose(&run, &model, &honest[0]);
    }
    let started = Instant::now();
    let figs = run.check(&model, &honest)?;
    let ver_secs = started.elapsed().as_secs_f64();
    let ver_rate = honest.len() as f64 / ver_secs.max(1e-9);
    println!("honest verification: {} rollouts in {ver_secs:.1}s ({ver_rate:.2} rollouts/s)", honest.len());
    if made.rollouts > 0 {
        // Per-rollout seconds, so a partly cached run still compares like with like.
        let gen_rate = made.rollouts as f64 / made.secs.max(1e-9);
        println!(
            "verify ÷ generate (same machine, seconds per rollout): {:.3} ({ver_rate:.2} vs {gen_rate:.2} rollouts/s)",
            gen_rate / ver_rate
        );
    }
    println!();
    println!("## Honest: llama.cpp CPU (BF16) rollouts checked by the libtorch reference");
    report_honest("honest rollouts", &figs, &run.params);

    // Cheaters.
    println!();
    println!("## Cheaters, checked against the honest checkpoint");
    println!(
        "| cheater | rollouts | rejected | sketch | logprob | sampling | termination | other hard | median sketch d/τ | median |Δlp| | outside frac |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for name in run.args.cheaters.clone() {
        match run.cheater(&name, &honest, honest_id) {
            Ok(recs) if recs.is_empty() => println!("| {name} | 0 | – | | | | | | | | |"),
            Ok(recs) => {
                let figs = run.check(&model, &recs)?;
                report_cheater(&name, &figs);
            }
            Err(e) => println!("| {name} | error: {e:#} | | | | | | | | | |"),
        }
    }
    Ok(())
}

impl Run {
    fn gen_opts(&self) -> GenerateOptions {
        GenerateOptions {
            first_task: 0,
            tasks: 0,
            group: self.args.group,
            max_new_tokens: self.args.max_new_tokens,
            temperature: self.args.temperature,
            sketch_params: self.params.sketch,
        }
    }

    /// The first `tasks` groups generated with llama.cpp on `model`, and the
    /// seconds and rollouts generated by this run (groups already in the
    /// cache are read, not regenerated: the cache grows one group at a time,
    /// so an interrupted or extended run resumes where it stopped).
    fn generate_cached(&self, model: &Path, name: &str, tasks: usize) -> Result<(Vec<RolloutRecord>, Generated)> {
        let a = &self.args;
        let file = a.work.join(format!("{name}-s{}-g{}-n{}.jsonl", a.seed, a.group, a.max_new_tokens));
        let mut have = complete_groups(&file, a.group)?;
        if have.is_empty() {
            // A cache written by an earlier version: `{name}-s…-t{N}-g…-n….jsonl`.
            if let Some(old) = legacy_cache(&a.work, name, a.seed, a.group, a.max_new_tokens)? {
                have = complete_groups(&old, a.group)?;
            }
        }
        let done = have.len() / a.group;
        // Rewrite the cache with whole groups only (drops a torn last line).
        write_jsonl(&file, &have)?;
        let mut made = Generated::default();
        if done < tasks {
            let mut backend =
                LlamaCppBackend::load(&LlamaConfig { model: model.to_owned(), threads: self.threads, gpu_layers: 0 })?;
            let id = Checkpoint::open(model).map(|c| c.content_id()).ok();
            let opts = GenerateOptions { first_task: done, tasks: tasks - done, ..self.gen_opts() };
            let job = Job { tokenizer: &self.tokenizer, env: &self.env, model: id, window: &self.window, opts: &opts };
            let mut w = std::fs::OpenOptions::new().append(true).open(&file)?;
            let started = Instant::now();
            let mut pending = Vec::new();
            generate(
                &mut backend,
                &job,
                |r| {
                    made.rollouts += 1;
                    made.tokens += r.tokens.len() - r.prompt_len;
                    pending.push(r);
                    if pending.len() == a.group {
                        // One write per whole group, so the cache never holds half a group.
                        let mut buf = Vec::new();
                        for r in pending.drain(..) {
                            serde_json::to_writer(&mut buf, &r).map_err(edge_miner::offline::OfflineError::Json)?;
                            buf.push(b'\n');
                            have.push(r);
                        }
                        w.write_all(&buf)?;
                        w.flush()?;
                    }
                    Ok(())
                },
                |g| eprint!("\r{name}: {}/{tasks} groups", done + g),
            )?;
            eprintln!();
            made.secs = started.elapsed().as_secs_f64();
        }
        have.truncate(tasks * a.group);
        Ok((have, made))
    }

    /// A derived checkpoint file, made once.
    fn derived(&self, name: &str, make: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
        let path = self.args.work.join(format!("{name}.gguf"));
        if !path.exists() {
            let tmp = path.with_extension("part");
            make(&tmp)?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(path)
    }

    /// The cheater's rollouts.
    fn cheater(&self, name: &str, honest: &[RolloutRecord], honest_id: ContentId) -> Result<Vec<RolloutRecord>> {
        let a = &self.args;
        let n = a.cheater_tasks;
        let threads = self.threads;
        let make = |path: &Path, tag: &str| self.generate_cached(path, tag, n).map(|(r, _)| r);
        match name {
            "tiny" => {
                let src = Checkpoint::open(&a.model)?;
                let path = self.derived("tiny-7", |p| {
                    tributary_protocol::tiny::write_tiny(7, &src, p)?;
                    Ok(())
                })?;
                make(&path, name)
            }
            "q4_0" | "q8_0" => {
                let ft = if name == "q4_0" { FileType::Q4_0 } else { FileType::Q8_0 };
                let path = self.derived(name, |p| Ok(quantize(&a.model, p, ft, threads)?))?;
                make(&path, name)
            }
            "q4_1" => make(&tributary_protocol::assets::smollm2_q4_1(), name),
            "edit" => {
                // The first two completion tokens replaced; everything else as generated.
                let vocab = self.tokenizer.vocab_size() as u32;
                Ok(honest
                    .iter()
                    .take(n * a.group)
                    .map(|r| {
                        let mut r = r.clone();
                        for t in r.tokens.iter_mut().skip(r.prompt_len).take(2) {
                            *t = (*t + 1) % vocab;
                        }
                        r
                    })
                    .collect())
            }
            "other-model" => {
                // Tokens decoded by Q4_0, then proved (sketches, logprobs)
                // with the honest model by teacher forcing.
                let q = self.derived("q4_0", |p| Ok(quantize(&a.model, p, FileType::Q4_0, threads)?))?;
                let recs = make(&q, "q4_0")?;
                let backend = LlamaCppBackend::load(&LlamaConfig { model: a.model.clone(), threads, gpu_layers: 0 })?;
                let key = SketchKey::derive(&self.window.secrets.seed, backend.hidden_size());
                recs.into_iter()
                    .map(|mut r| {
                        let (sk, lp) = backend.teacher_forced(&r.tokens, &key, &self.params.sketch)?;
                        r.sketches = sk;
                        r.logprobs = lp[r.prompt_len - 1..].to_vec();
                        r.model = Some(honest_id.to_string());
                        Ok(r)
                    })
                    .collect()
            }
            _ => {
                if let Some(rel) = name.strip_prefix("perturb-") {
                    let rel: f32 = rel.parse().context("perturb-<relative magnitude>")?;
                    let path = self.derived(name, |p| perturb(&a.model, p, rel))?;
                    make(&path, name)
                } else {
                    bail!("unknown cheater {name}")
                }
            }
        }
    }

    /// Checks `recs` against the honest reference under `numerics`.
    fn check(&self, model: &ReferenceModel, recs: &[RolloutRecord]) -> Result<Vec<Figures>> {
        let p = &self.params;
        let miner = *self.window.miner.public().as_bytes();
        let secrets = &self.window.secrets;
        let eos: Vec<u32> = self.tokenizer.eog_ids().collect();
        let vocab = model.dims().vocab_size as u32;
        let key = SketchKey::derive(&secrets.seed, model.dims().d_model);
        let groups = recs.iter().map(|r| r.group + 1).max().unwrap_or(1);
        let mut out = Vec::with_capacity(recs.len());
        // One group (shared prompt) per forward pass.
        let mut by_group: BTreeMap<u32, Vec<&RolloutRecord>> = BTreeMap::new();
        for r in recs {
            by_group.entry(r.group).or_default().push(r);
        }
        for (_, batch) in by_group {
            let rollouts: Vec<Rollout> = batch.iter().map(|r| to_rollout(r, self.args.max_new_tokens)).collect();
            let challenged: Vec<Vec<usize>> = rollouts
                .iter()
                .map(|r| {
                    if self.args.challenge_all {
                        (0..r.tokens.len()).collect()
                    } else {
                        verify::challenged(r, &secrets.challenge, p).into_iter().filter(|&q| q < r.tokens.len()).collect()
                    }
                })
                .collect();
            // Rollouts the reference cannot even run (structure) are judged without evidence.
            let mut runnable = Vec::new();
            for (i, r) in rollouts.iter().enumerate() {
                let a = assignment(r, &batch[i].tokens[..batch[i].prompt_len], groups, self, &eos, vocab, miner);
                let s = verify::check_structure(r, &a, p);
                if s.failed() {
                    out.push(Figures { verdict: Verdict { checks: vec![s], sampling_counts: Default::default() }, ..Default::default() });
                } else {
                    runnable.push(i);
                }
            }
            if runnable.is_empty() {
                continue;
            }
            let reqs: Vec<EvidenceRequest<'_>> = runnable
                .iter()
                .map(|&i| EvidenceRequest {
                    tokens: &rollouts[i].tokens,
                    prompt_len: rollouts[i].prompt_len as usize,
                    temperature: rollouts[i].sampling.temperature,
                    eos: self.tokenizer.eos_id(),
                    hidden_positions: &challenged[i],
                })
                .collect();
            let evs = model.evidence(&reqs)?;
            for (&i, ev) in runnable.iter().zip(evs) {
                let r = &rollouts[i];
                let mut f = Figures::default();
                let mut sketches = vec![0u32; r.tokens.len()];
                for (k, &pos) in challenged[i].iter().enumerate() {
                    let h = ev.hidden_row(k).context("hidden row")?;
                    let s = sketch::sketch(h, &key, &p.sketch)?;
                    sketches[pos] = s;
                    let d = sketch::distance(r.sketches[pos], s);
                    f.sketch_dist.push(d);
                    f.sketch_ratio.push(f64::from(d) / f64::from(sketch::tolerance(pos, &p.sketch)));
                }
                let pl = r.prompt_len as usize;
                let positions: Vec<PositionEvidence> = (0..ev.len())
                    .map(|j| PositionEvidence {
                        logprob_t1: ev.logprob[j] as f32,
                        prob_t1: ev.prob_t1[j] as f32,
                        prob_sampling: ev.prob_temp[j] as f32,
                        cdf_lo: ev.cdf_lo[j],
                        cdf_hi: ev.cdf_hi[j],
                    })
                    .collect();
                for (j, e) in positions.iter().enumerate() {
                    f.dlp.push((f64::from(r.logprobs[j]) - ev.logprob[j]).abs());
                    let u = sampling::draw_u(&secrets.seed, &r.miner, r.group, r.rollout, (pl + j) as u32);
                    let d = (u - e.cdf_lo).abs().min((u - e.cdf_hi).abs());
                    f.edge.push((d, e.cdf_lo < u && u < e.cdf_hi));
                }
                let a = assignment(r, &batch[i].tokens[..batch[i].prompt_len], groups, self, &eos, vocab, miner);
                f.verdict = verify::verify_rollout(r, &a, batch[i].reward, &Evidence { sketches, positions }, p)?;
                out.push(f);
            }
        }
        Ok(out)
    }
}

fn to_rollout(r: &RolloutRecord, max_new_tokens: usize) -> Rollout {
    Rollout {
        window: 0,
        checkpoint: r.model.as_deref().and_then(|m| m.parse().ok()).unwrap_or(ContentId([0; 32])),
        env: r.env,
        group: r.group,
        rollout: r.rollout,
        task_id: r.task_id,
        sampling: SamplingParams { temperature: r.temperature, max_new_tokens: max_new_tokens as u32 },
        tokens: r.tokens.clone(),
        prompt_len: r.prompt_len as u32,
        logprobs: r.logprobs.clone(),
        sketches: r.sketches.clone(),
        reward: r.reward,
        miner: tributary_protocol::identity::decode_hex::<32>(&r.miner).unwrap_or([0; 32]),
        signature: [0; 64],
    }
}

fn assignment<'a>(
    r: &Rollout,
    prompt: &'a [u32],
    groups: u32,
    run: &Run,
    eos: &'a [u32],
    vocab: u32,
    miner: [u8; 32],
) -> Assignment<'a> {
    Assignment {
        window: 0,
        checkpoint: r.checkpoint,
        env: r.env,
        miner,
        task_id: r.task_id,
        sampling: r.sampling,
        prompt_tokens: prompt,
        groups_per_miner: groups,
        group_size: run.args.group as u32,
        vocab_size: vocab,
        eos_tokens: eos,
        sampling_seed: run.window.secrets.seed,
        challenge_secret: run.window.secrets.challenge,
    }
}

/// What one run generated (not read from the cache).
#[derive(Debug, Default, Clone, Copy)]
struct Generated {
    rollouts: usize,
    tokens: usize,
    secs: f64,
}

/// The records of the cache file's whole groups, in order (none when absent).
fn complete_groups(path: &Path, group: usize) -> Result<Vec<RolloutRecord>> {
    let Ok(f) = std::fs::File::open(path) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        // A torn last line (interrupted run) ends the usable prefix.
        match serde_json::from_str::<RolloutRecord>(&line?) {
            Ok(r) if r.group as usize == out.len() / group && r.rollout as usize == out.len() % group => out.push(r),
            _ => break,
        }
    }
    out.truncate(out.len() / group * group);
    Ok(out)
}

/// The largest cache of an earlier version (`-t{N}-` in its name), if any.
fn legacy_cache(work: &Path, name: &str, seed: u64, group: usize, n: usize) -> Result<Option<PathBuf>> {
    let prefix = format!("{name}-s{seed}-t");
    let suffix = format!("-g{group}-n{n}.jsonl");
    let mut best: Option<(usize, PathBuf)> = None;
    for e in std::fs::read_dir(work)? {
        let e = e?;
        let fname = e.file_name().to_string_lossy().into_owned();
        let Some(t) = fname.strip_prefix(&prefix).and_then(|r| r.strip_suffix(&suffix)) else { continue };
        if let Ok(t) = t.parse::<usize>()
            && best.as_ref().is_none_or(|(b, _)| t > *b)
        {
            best = Some((t, e.path()));
        }
    }
    Ok(best.map(|(_, p)| p))
}

/// Writes `recs` to `path` atomically (through a temporary file).
fn write_jsonl(path: &Path, recs: &[RolloutRecord]) -> Result<()> {
    let tmp = path.with_extension("part");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    for r in recs {
        serde_json::to_writer(&mut w, r)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Copies a BF16 checkpoint with every BF16 weight multiplied by
/// `1 + rel·g`, `g` uniform with unit variance (a fixed PRF stream).
fn perturb(src: &Path, dst: &Path, rel: f32) -> Result<()> {
    let mut bytes = std::fs::read(src)?;
    let header = gguf::parse_header(&bytes)?;
    let mut st = tributary_protocol::prf::PrfStream::new("calibrate/perturb", &[&rel.to_le_bytes()]);
    let half_width = 3f64.sqrt();
    for t in &header.tensors {
        if t.ty != GgmlType::BF16 {
            continue;
        }
        let range = header.tensor_range(t);
        for w in bytes[range].chunks_exact_mut(2) {
            let x = f32::from_bits(u32::from(u16::from_le_bytes([w[0], w[1]])) << 16);
            let g = (st.unit_f64() * 2.0 - 1.0) * half_width;
            let y = x * (1.0 + rel * g as f32);
            let b = y.to_bits();
            let r = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            w.copy_from_slice(&r.to_le_bytes());
        }
    }
    std::fs::write(dst, bytes)?;
    Ok(())
}

fn quantiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| verify::quantile_sorted(&v, p);
    (v[v.len() - 1], q(0.99), q(0.5))
}

fn report_honest(title: &str, figs: &[Figures], p: &VerifyParams) {
    let ratio: Vec<f64> = figs.iter().flat_map(|f| f.sketch_ratio.iter().copied()).collect();
    let dist: Vec<f64> = figs.iter().flat_map(|f| f.sketch_dist.iter().map(|&d| f64::from(d))).collect();
    let dlp: Vec<f64> = figs.iter().flat_map(|f| f.dlp.iter().copied()).collect();
    let edges: Vec<(f64, bool)> = figs.iter().flat_map(|f| f.edge.iter().copied()).collect();
    let misses: Vec<f64> = edges.iter().filter(|e| !e.1).map(|e| e.0).collect();
    let accepted = figs.iter().filter(|f| f.verdict.accepted()).count();
    let positions = edges.len();
    let (rmax, r99, rmed) = quantiles(ratio.clone());
    let (dmax, d99, dmed) = quantiles(dist);
    let (lmax, l99, lmed) = quantiles(dlp);
    let miss_max = misses.iter().copied().fold(0.0, f64::max);
    println!();
    println!("### {title}");
    println!("| figure | max | p99 | median |");
    println!("|---|---|---|---|");
    println!("| sketch distance ÷ tolerance ({} challenged positions) | {rmax:.4} | {r99:.4} | {rmed:.4} |", ratio.len());
    println!("| sketch distance (sketch units) | {dmax:.0} | {d99:.0} | {dmed:.0} |");
    println!("| abs Δ logprob ({positions} completion positions) | {lmax:.2e} | {l99:.2e} | {lmed:.2e} |");
    println!(
        "accepted {accepted}/{} rollouts; draws outside the reference interval: {} of {positions} positions, \
         farthest {miss_max:.3e} from an edge",
        figs.len(),
        misses.len()
    );
    for (kind, n) in hard_failures(figs) {
        println!("  hard failures: {kind:?} on {n} rollouts");
    }
    let mut line = String::from("ambiguous share of positions by ε:");
    for eps in [1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5] {
        let amb = edges.iter().filter(|e| e.0 <= eps).count();
        let out = edges.iter().filter(|e| !e.1 && e.0 > eps).count();
        line.push_str(&format!(" ε={eps:.0e}: {:.3}% ({out} outside);", 100.0 * amb as f64 / positions.max(1) as f64));
    }
    println!("{line}");
    let amb = edges.iter().filter(|e| e.0 <= p.sample_eps).count();
    println!(
        "at the current ε = {}: {amb} ambiguous ({:.3}%), false positives (honest rollouts rejected): {}",
        p.sample_eps,
        100.0 * amb as f64 / positions.max(1) as f64,
        figs.len() - accepted
    );
    let over = ratio.iter().filter(|&&r| r > 1.0).count();
    let dlp_over = figs.iter().flat_map(|f| f.dlp.iter()).filter(|&&d| d.exp() - 1.0 > p.logprob_is_eps).count();
    println!(
        "false-positive budget: {} positions checked ({} sketch positions, {positions} logprob + sampling positions); \
         sketch over tolerance: {over}; logprob over bound: {dlp_over}; draws outside beyond ε: {}; \
         max sketch distance ÷ tolerance {rmax:.4} (goal ≤ 0.5)",
        ratio.len() + positions,
        ratio.len(),
        edges.iter().filter(|e| !e.1 && e.0 > p.sample_eps).count()
    );
}

fn hard_failures(figs: &[Figures]) -> BTreeMap<CheckKind, usize> {
    let mut m = BTreeMap::new();
    for f in figs {
        for c in &f.verdict.checks {
            if c.severity == Severity::Hard && c.failed() {
                *m.entry(c.kind).or_insert(0) += 1;
            }
        }
    }
    m
}

fn report_cheater(name: &str, figs: &[Figures]) {
    let n = figs.len();
    let rejected = figs.iter().filter(|f| !f.verdict.accepted()).count();
    let fails = hard_failures(figs);
    let get = |k| fails.get(&k).copied().unwrap_or(0);
    let other: usize = fails
        .iter()
        .filter(|(k, _)| !matches!(k, CheckKind::Sketch | CheckKind::Logprob | CheckKind::Sampling | CheckKind::Termination))
        .map(|(_, v)| v)
        .sum();
    let ratio: Vec<f64> = figs.iter().flat_map(|f| f.sketch_ratio.iter().copied()).collect();
    let dlp: Vec<f64> = figs.iter().flat_map(|f| f.dlp.iter().copied()).collect();
    let edges: Vec<(f64, bool)> = figs.iter().flat_map(|f| f.edge.iter().copied()).collect();
    let outside = edges.iter().filter(|e| !e.1).count() as f64 / edges.len().max(1) as f64;
    let pct = |k: usize| format!("{k} ({:.0}%)", 100.0 * k as f64 / n.max(1) as f64);
    println!(
        "| {name} | {n} | {} | {} | {} | {} | {} | {other} | {:.3} | {:.3} | {:.3} |",
        pct(rejected),
        pct(get(CheckKind::Sketch)),
        pct(get(CheckKind::Logprob)),
        pct(get(CheckKind::Sampling)),
        pct(get(CheckKind::Termination)),
        quantiles(ratio).2,
        quantiles(dlp).2,
        outside
    );
}

/// Per-position comparison of llama.cpp (teacher forced, the generation
/// schedule) with the reference: relative L2 of the hidden state and the
/// largest logit difference.
fn diagnose(run: &Run, model: &ReferenceModel, rec: &RolloutRecord) -> Result<()> {
    let backend = LlamaCppBackend::load(&LlamaConfig { model: run.args.model.clone(), threads: run.threads, gpu_layers: 0 })?;
    let mut rows = Vec::new();
    backend.forward_each(&rec.tokens, |_, h, l| {
        rows.push((h.to_vec(), l.to_vec()));
        Ok(())
    })?;
    let t = tch::Tensor::from_slice(&rec.tokens.iter().map(|&x| i64::from(x)).collect::<Vec<_>>()).view([1, -1]);
    let out = tch::no_grad(|| model.forward(&t))?;
    let (h, l) = (out.hidden.squeeze_dim(0), out.logits.squeeze_dim(0));
    let mut worst = (0.0f64, 0.0f32);
    for (p, (hl, ll)) in rows.iter().enumerate() {
        let hr: Vec<f32> = Vec::try_from(h.get(p as i64))?;
        let lr: Vec<f32> = Vec::try_from(l.get(p as i64))?;
        let num: f64 = hr.iter().zip(hl).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt();
        let den: f64 = hr.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
        let dl = lr.iter().zip(ll).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        worst = (worst.0.max(num / den), worst.1.max(dl));
    }
    println!(
        "llama.cpp vs reference over {} positions: worst relative L2 of h {:.3e}, worst max |Δ logit| {:.3e}",
        rows.len(),
        worst.0,
        worst.1
    );
    Ok(())
}
