//! GRPO step bench on SmolLM2 (issue #6): one optimiser step of the Rust
//! trainer on a saved batch of miner rollouts, the sparse delta it publishes
//! against the full checkpoint, and the same step in PyTorch (HF
//! transformers, `scripts/pytorch-grpo-bench.py`) on the same batch, same
//! micro-batching, same thread count, as the ratio to beat.
//!
//! ```text
//! edge-miner generate --model .cache/models/SmolLM2-135M-Instruct.bf16.gguf --env gsm8k \
//!     --data /work/shared/data/gsm8k/train.jsonl --tasks 4 --group 8 --max-new-tokens 128 \
//!     --seed 7 --out .cache/bench/grpo-batch.jsonl
//! cargo run -p trainer --bin grpo-bench -- --batch .cache/bench/grpo-batch.jsonl
//! ```
//!
//! Before the step it also exports the base for transformers and has the
//! script compare transformers' next-token logits with the reference model's
//! on the first prompt (this is what proves the export's Q/K un-permutation).
//!
//! `--verify` measures instead what the trainer's proof costs on the same
//! batch against the step it guards ([`trainer::proof`]: one no-grad
//! evidence forward per group with the checkpoint the rollouts name, then
//! `verify::verify_tokens` on every rollout), `--rounds` times each, and
//! prints the medians and their ratio (goal ≤ 0.5):
//!
//! ```text
//! cargo run -p trainer --bin grpo-bench -- --batch .cache/bench/grpo-batch.jsonl --verify --rounds 5
//! ```

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use tch::{Device, Kind, Tensor};
use trainer::grpo::group_advantages;
use trainer::train::{Sample, TrainConfig, Trainer};
use tributary_assets as assets;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::delta::{self, DeltaLimits};

#[derive(Parser)]
#[command(name = "grpo-bench", about = "One GRPO step: Rust trainer vs PyTorch, and the published delta's size")]
struct Args {
    /// Rollouts (JSONL, one per line, as `edge-miner generate` writes them).
    #[arg(long, default_value = ".cache/bench/grpo-batch.jsonl")]
    batch: PathBuf,
    /// The BF16 base checkpoint the rollouts were generated with.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Peak learning rate (warm-up off, so step 1 uses it).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f64,
    /// Threads for libtorch (and for the PyTorch run).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Python with torch + transformers (default: `$TRIBUTARY_HOME/../venv-bench`, see scripts/bench-venv.sh).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Timed rounds, each one Rust step then one PyTorch step (a fresh process
    /// from the base), so load from other processes hits both alike; the
    /// table shows medians. The delta figures are those of the first step.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run every sample's prompt in full on both sides (`TrainConfig::share_prompts`
    /// off; the PyTorch script without `--share-prompts`).
    #[arg(long)]
    no_share_prompts: bool,
    /// Skip the PyTorch comparison.
    #[arg(long)]
    no_pytorch: bool,
    /// Measure the trainer's proof of the batch against the step (no PyTorch).
    #[arg(long)]
    verify: bool,
    /// Folder for the HF export of the base.
    #[arg(long, default_value = ".cache/bench/hf-base")]
    hf: PathBuf,
    /// Where to write the checkpoint after the step (for `relay-bench`).
    #[arg(long, default_value = ".cache/bench/grpo-step1.gguf")]
    save: PathBuf,
}

/// The fields of a rollout record (`edge-miner generate` JSONL, or a
/// `Rollout` as JSON) the step needs.
#[derive(serde::Deserialize)]
struct Record {
    group: u32,
    tokens: Vec<u32>,
    prompt_len: u32,
    logprobs: Vec<f32>,
    reward: f32,
}

/// Rollouts → samples with group-relative advantages (every group kept, as
/// the batch's shape is what is measured).
fn load_samples(path: &Path) -> Result<Vec<Sample>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut groups: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(&line)?;
        groups.entry(r.group).or_default().push(r);
    }
    let mut out = Vec::new();
    for rs in groups.values() {
        let rewards: Vec<f32> = rs.iter().map(|r| r.reward).collect();
        for (r, a) in rs.iter().zip(group_advantages(&rewards, 1e-8)) {
            out.push(Sample {
                tokens: r.tokens.clone(),
                prompt_len: r.prompt_len as usize,
                old_logprobs: r.logprobs.clone(),
                advantage: a,
                reward: r.reward,
            });
        }
    }
    if out.is_empty() {
        bail!("{} holds no rollouts", path.display());
    }
    Ok(out)
}

/// User + system CPU seconds of this process so far (`/proc/self/stat`).
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) in clock ticks of 1/100 s.
    let field = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(14) + field(15)) / 100.0
}

fn default_python() -> PathBuf {
    let cache = std::env::var_os("TRIBUTARY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".cache/tributary"));
    cache.join("venv-bench/bin/python")
}

/// Runs the PyTorch script and returns its `key=value` lines.
fn run_pytorch(
    args: &Args,
    python: &Path,
    cfg: &TrainConfig,
    check: Option<(&Path, &[u32])>,
) -> Result<BTreeMap<String, String>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pytorch-grpo-bench.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script)
        .args(["--hf".as_ref(), args.hf.as_os_str()])
        .args(["--batch".as_ref(), args.batch.as_os_str()])
        .args(["--threads", &args.threads.to_string(), "--lr", &args.lr.to_string()])
        .args(["--micro-batch-tokens", &cfg.micro_batch_tokens.to_string()]);
    if cfg.share_prompts {
        cmd.arg("--share-prompts");
    }
    if let Some((ref_logits, prompt)) = check {
        let prompt: Vec<String> = prompt.iter().map(u32::to_string).collect();
        cmd.args(["--ref-logits".as_ref(), ref_logits.as_os_str()]).args(["--prompt", &prompt.join(",")]);
    }
    let out =
        cmd.output().with_context(|| format!("running {} (create it with scripts/bench-venv.sh)", python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("PyTorch bench failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// The trainer's proof of every rollout of the batch file (as
/// `trainer::proof::Prover::prove_group` runs it, the window contract taken
/// from the records): seconds, and how many rollouts passed.
fn prove_batch(path: &Path, model: &tributary_policy::ReferenceModel, eos: &[u32]) -> Result<(f64, usize, usize)> {
    use tributary_protocol::offline::RolloutRecord;
    use tributary_protocol::rollout::{Rollout, SamplingParams};
    use tributary_protocol::verify::{self, Assignment, VerifyParams};
    let text = std::fs::read_to_string(path)?;
    let mut groups: BTreeMap<u32, Vec<(Rollout, tributary_protocol::prf::Seed)>> = BTreeMap::new();
    let max_new = 128;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let r: RolloutRecord = serde_json::from_str(line)?;
        let seed: tributary_protocol::prf::Seed = r.window_seed.parse().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let miner = tributary_protocol::identity::decode_hex::<32>(&r.miner).map_err(|e| anyhow::anyhow!("{e}"))?;
        let rollout = Rollout {
            window: 0,
            checkpoint: tributary_protocol::checkpoint::ContentId([0; 32]),
            env: r.env,
            group: r.group,
            rollout: r.rollout,
            task_id: r.task_id,
            sampling: SamplingParams { temperature: r.temperature, max_new_tokens: max_new },
            tokens: r.tokens,
            prompt_len: r.prompt_len as u32,
            logprobs: r.logprobs,
            sketches: r.sketches,
            reward: r.reward,
            miner,
            signature: [0; 64],
        };
        groups.entry(r.group).or_default().push((rollout, seed));
    }
    let params = VerifyParams::DEFAULT;
    let vocab = model.dims().vocab_size as u32;
    let t = Instant::now();
    let (mut passed, mut total) = (0, 0);
    for rs in groups.values() {
        let reqs: Vec<tributary_policy::EvidenceRequest<'_>> = rs
            .iter()
            .map(|(r, _)| tributary_policy::EvidenceRequest {
                tokens: &r.tokens,
                prompt_len: r.prompt_len as usize,
                temperature: r.sampling.temperature,
                eos: eos[0],
                hidden_positions: &[],
            })
            .collect();
        let evidence = model.evidence(&reqs)?;
        for ((r, seed), ev) in rs.iter().zip(evidence) {
            let a = Assignment {
                window: 0,
                checkpoint: r.checkpoint,
                env: r.env,
                miner: r.miner,
                task_id: r.task_id,
                sampling: r.sampling,
                prompt_tokens: r.prompt(),
                groups_per_miner: u32::MAX,
                group_size: u32::MAX,
                vocab_size: vocab,
                eos_tokens: eos,
                sampling_seed: *seed,
                challenge_secret: *seed,
            };
            let v = verify::verify_tokens(r, &a, r.reward, &ev.positions(), &params)?;
            total += 1;
            passed += usize::from(v.accepted());
        }
    }
    Ok((t.elapsed().as_secs_f64(), passed, total))
}

/// `--verify`: the proof's cost against the step's on the same batch.
fn verify_arm(args: &Args, base: &Checkpoint, samples: &[Sample], cfg: TrainConfig) -> Result<()> {
    let model = tributary_policy::ReferenceModel::load(base, Device::Cpu)?;
    let tok = tributary_protocol::tokenizer::Tokenizer::from_checkpoint(base)?;
    let eos: Vec<u32> = std::iter::once(tok.eos_id()).chain(tok.eog_ids()).collect();
    let mut trainer = Trainer::from_checkpoint(base, Device::Cpu, cfg)?;
    let (mut proof, mut step) = (Vec::new(), Vec::new());
    let mut verdicts = (0, 0);
    for round in 0..args.rounds.max(1) {
        let (secs, passed, total) = prove_batch(&args.batch, &model, &eos)?;
        verdicts = (passed, total);
        proof.push(secs);
        let t = Instant::now();
        trainer.step(samples)?;
        step.push(t.elapsed().as_secs_f64());
        eprintln!("round {}: proof {secs:.2} s ({passed}/{total} rollouts pass), step {:.2} s", round + 1, step[round]);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, s) = (median(&proof), median(&step));
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("threads={} loadavg={}", args.threads, load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!("| figure | value |");
    println!("|---|---|");
    println!("| rollouts proven (pass / total) | {} / {} |", verdicts.0, verdicts.1);
    println!("| trainer proof, median (s) | {p:.2} ({}) |", list(&proof));
    println!("| GRPO step, median (s) | {s:.2} ({}) |", list(&step));
    println!("| proof / step (goal ≤ 0.5) | {:.2} |", p / s);
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let threads = tributary_policy::init_threads(Some(args.threads));
    let model = args.model.clone().unwrap_or_else(assets::smollm2_bf16);
    let base = Checkpoint::open(&model).with_context(|| format!("{} (run `trainer init-base`)", model.display()))?;
    let samples = load_samples(&args.batch)?;
    if args.verify {
        let cfg =
            TrainConfig { lr: args.lr, warmup_steps: 1, share_prompts: !args.no_share_prompts, ..Default::default() };
        return verify_arm(&args, &base, &samples, cfg);
    }
    let seqs = samples.len();
    let prompt_tokens: usize = samples.iter().map(|s| s.prompt_len).sum();
    let completion_tokens: usize = samples.iter().map(|s| s.tokens.len() - s.prompt_len).sum();
    let share_prompts = !args.no_share_prompts;
    let cfg = TrainConfig { lr: args.lr, warmup_steps: 1, share_prompts, ..TrainConfig::default() };
    let mut trainer = Trainer::from_checkpoint(&base, Device::Cpu, cfg)?;

    // Reference next-token logits on the first prompt (for the HF parity check).
    let prompt = samples[0].tokens[..samples[0].prompt_len].to_vec();
    let ref_logits: Vec<f32> = tch::no_grad(|| -> Result<Vec<f32>> {
        let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        let x = Tensor::f_from_slice(&ids)?.f_view([1, -1])?;
        let h = trainer.model().forward_hidden(&x)?;
        let last = h.f_select(1, -1)?;
        let logits = trainer.model().lm_head(&last)?.f_to_kind(Kind::Float)?.f_flatten(0, -1)?;
        Ok(Vec::<f32>::try_from(&logits)?)
    })?;

    // Round 1's Rust step, then what it publishes.
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    let stats = trainer.step(&samples)?;
    let mut rust_wall = vec![t.elapsed().as_secs_f64()];
    let mut rust_cpu = vec![process_cpu_secs() - cpu];
    let split = |tr: &Trainer| {
        let t = tr.last_timings();
        eprintln!(
            "Rust step: {} micro-batches ({} with a shared prompt), {} positions; forward {:.2} s, backward {:.2} s, optimiser {:.2} s",
            t.micro_batches, t.shared_prompt_batches, t.positions, t.forward_s, t.backward_s, t.optimizer_s
        );
    };
    split(&trainer);

    let t = Instant::now();
    let new_bytes = trainer.export_checkpoint(&base)?;
    let export_ms = t.elapsed().as_secs_f64() * 1e3;
    let new = Checkpoint::from_bytes(new_bytes)?;
    let t = Instant::now();
    let d = delta::encode(&base, &new)?;
    let encode_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut target = base.bytes().to_vec();
    let t = Instant::now();
    let decoded = delta::decode(&d, &DeltaLimits::for_base_len(target.len() as u64))?;
    delta::apply_in_place(&decoded, &mut target)?;
    let apply_ms = t.elapsed().as_secs_f64() * 1e3;
    if target != new.bytes() {
        bail!("applying the delta did not reproduce the new checkpoint");
    }
    drop(target);
    let (changed, total) = delta::change_stats(base.bytes(), new.bytes())?;
    let full = new.bytes().len();
    std::fs::write(&args.save, new.bytes()).with_context(|| format!("writing {}", args.save.display()))?;
    let d_len = d.len();
    drop((new, d, decoded));

    // PyTorch on the same batch, alternating with further Rust steps (same
    // batch, same cost per step).
    let mut py = BTreeMap::new();
    let (mut py_wall, mut py_cpu) = (Vec::new(), Vec::new());
    let mut loads = Vec::new();
    let loadavg = || {
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().next().unwrap_or("").to_owned()
    };
    if !args.no_pytorch {
        trainer::hf::export(&base, &args.hf)?;
        let ref_path = args.hf.join("ref_logits.f32");
        let raw: Vec<u8> = ref_logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&ref_path, raw)?;
        let python = args.python.clone().unwrap_or_else(default_python);
        for round in 0..args.rounds.max(1) {
            if round > 0 {
                let (t, cpu) = (Instant::now(), process_cpu_secs());
                trainer.step(&samples)?;
                rust_wall.push(t.elapsed().as_secs_f64());
                rust_cpu.push(process_cpu_secs() - cpu);
                split(&trainer);
            }
            let check = (round == 0).then_some((ref_path.as_path(), prompt.as_slice()));
            let out = run_pytorch(&args, &python, &cfg, check)?;
            let get = |k: &str| out.get(k).and_then(|v| v.parse::<f64>().ok());
            if let (Some(w), Some(c)) = (get("pytorch_step_seconds"), get("pytorch_step_cpu_seconds")) {
                py_wall.push(w);
                py_cpu.push(c);
            }
            loads.push(loadavg());
            eprintln!(
                "round {}: Rust {:.2} s ({:.2} CPU s), PyTorch {:.2} s ({:.2} CPU s), load {}",
                round + 1,
                rust_wall[round],
                rust_cpu[round],
                py_wall.last().copied().unwrap_or(f64::NAN),
                py_cpu.last().copied().unwrap_or(f64::NAN),
                loads[round]
            );
            if round == 0 {
                py = out;
            }
        }
    }
    let median = |v: &[f64]| -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
    };
    let (rust_step, rust_cpu_m) = (median(&rust_wall), median(&rust_cpu));

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "batch: {seqs} sequences, {prompt_tokens} prompt + {completion_tokens} completion tokens, micro_batch_tokens={}, share_prompts={}",
        cfg.micro_batch_tokens, cfg.share_prompts
    );
    println!(
        "step: lr={:e} loss={:.6} grad_norm={:.4} ratio_mean={:.4} entropy={:.4}",
        stats.lr, stats.loss, stats.grad_norm, stats.ratio_mean, stats.entropy
    );
    println!("threads={threads} loadavg={}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
    println!("| rounds (Rust step, then PyTorch step) | {} (load {}) |", rust_wall.len(), loads.join(", "));
    println!("| Rust step, median (s) | {rust_step:.2} ({}) |", list(&rust_wall));
    println!("| Rust step CPU, median (s) | {rust_cpu_m:.2} ({}) |", list(&rust_cpu));
    if !py_wall.is_empty() {
        let (p, pc) = (median(&py_wall), median(&py_cpu));
        println!("| PyTorch step, median (s) | {p:.2} ({}) |", list(&py_wall));
        println!("| PyTorch step CPU, median (s) | {pc:.2} ({}) |", list(&py_cpu));
        // Each round's own ratio (its Rust and PyTorch steps ran back to
        // back, under about the same load), then their median.
        let per_round: Vec<f64> = py_wall.iter().zip(&rust_wall).map(|(p, r)| p / r).collect();
        let per_round_cpu: Vec<f64> = py_cpu.iter().zip(&rust_cpu).map(|(p, r)| p / r).collect();
        let list2 = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
        println!(
            "| PyTorch / Rust per round, wall (goal ≥ 1.0) | median {:.2} ({}) |",
            median(&per_round),
            list2(&per_round)
        );
        println!(
            "| PyTorch / Rust per round, CPU | median {:.2} ({}) |",
            median(&per_round_cpu),
            list2(&per_round_cpu)
        );
        println!("| PyTorch / Rust, medians, wall | {:.2} |", p / rust_step);
        println!("| PyTorch / Rust, medians, CPU | {:.2} |", pc / rust_cpu_m);
    }
    if let Some(l) = py.get("pytorch_loss") {
        println!("| PyTorch loss, step 1 (Rust {:.6}) | {l} |", stats.loss);
    }
    if let Some(g) = py.get("pytorch_grad_norm") {
        println!("| PyTorch grad norm, step 1 (Rust {:.4}) | {g} |", stats.grad_norm);
    }
    if let Some(v) = py.get("hf_logits_max_abs_diff") {
        println!("| HF export vs reference, next-token logits max abs diff | {v} |");
    }
    if let Some(v) = py.get("hf_argmax_match") {
        println!("| HF export vs reference, same argmax | {v} |");
    }
    println!("| full checkpoint (bytes) | {full} |");
    println!("| delta (bytes) | {d_len} |");
    println!("| full / delta (goal ≥ 130) | {:.1} |", full as f64 / d_len as f64);
    println!("| changed elements | {changed} of {total} ({:.4} %) |", 100.0 * changed as f64 / total as f64);
    println!("| export BF16 GGUF (ms) | {export_ms:.0} |");
    println!("| delta encode (ms) | {encode_ms:.0} |");
    println!("| delta decode + apply in place (ms) | {apply_ms:.0} |");
    Ok(())
}
