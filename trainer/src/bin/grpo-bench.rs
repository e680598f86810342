//! GRPO step bench on SmolLM2 (issues #6, #18): optimiser steps of the Rust
//! trainer on a saved batch of miner rollouts, the sparse delta step 1
//! publishes against the full checkpoint, and the same steps in PyTorch (HF
//! transformers, `scripts/pytorch-grpo-bench.py`) on the same batch, same
//! micro-batching, same thread count, as the ratio to beat.
//!
//! Step 1 is the warm-up on both sides (left out of the medians); its
//! weights are compared across the sides (max abs difference of the fp32
//! masters) and its delta is measured. Then `--rounds` rounds alternate a
//! Rust step and a PyTorch step (one warm PyTorch process), and the table
//! shows true medians. The batch must have non-zero advantages.
//!
//! ```text
//! edge-miner generate --model .cache/models/SmolLM2-135M-Instruct.bf16.gguf --env arith \
//!     --difficulty 1 --tasks 4 --group 8 --max-new-tokens 128 --seed 11 --out .cache/bench/grpo-batch.jsonl
//! cargo run -p trainer --bin grpo-bench -- --batch .cache/bench/grpo-batch.jsonl --lr 3e-5 --rounds 5
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

#[path = "../bench_stats.rs"]
mod bench_stats;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bench_stats::median;
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
    /// Peak learning rate (warm-up off, so step 1 uses it). The default is
    /// the lr of the training run in docs/training.md (3e-5): the delta's
    /// size depends on it (Adam moves every weight by about lr per step).
    #[arg(long, default_value_t = 3e-5)]
    lr: f64,
    /// Threads for libtorch (and for the PyTorch run).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Python with torch + transformers (default: `$TRIBUTARY_HOME/../venv-bench`, see scripts/bench-venv.sh).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Timed rounds after the warm-up step 1, each one Rust step then one
    /// PyTorch step (one warm PyTorch process throughout), so load from
    /// other processes hits both alike; the table shows true medians. The
    /// delta and weight figures are those of step 1.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Measure a batch whose advantages are all 0 (only the entropy bonus has a gradient).
    #[arg(long)]
    allow_zero_advantages: bool,
    /// The trainer's full-anchor period (`full_every` in trainer.toml): a
    /// miner downloads one full checkpoint and `full_every - 1` deltas per
    /// period; the table shows the average.
    #[arg(long, default_value_t = 8)]
    full_every: u64,
    /// Run every sample's prompt in full on both sides (`TrainConfig::share_prompts`
    /// off; the PyTorch script without `--share-prompts`).
    #[arg(long)]
    no_share_prompts: bool,
    /// Run each group's prompt once per micro-batch with its completions
    /// padded on both sides (`TrainConfig::pack_prompts` off; the PyTorch
    /// script without `--pack-prompts`) instead of the step's common prompt
    /// prefix once a step and micro-batches packed without padding.
    #[arg(long)]
    no_pack: bool,
    /// Skip the PyTorch comparison.
    #[arg(long)]
    no_pytorch: bool,
    /// Measure the trainer's proof of the batch against the step (no PyTorch).
    #[arg(long)]
    verify: bool,
    /// Only measure the delta codec between two saved checkpoints (BASE NEW,
    /// e.g. `--save`'s `.last-base.gguf` and `.last.gguf`): size, ratio,
    /// times, and the entropy floor. No training.
    #[arg(long, num_args = 2, value_names = ["BASE", "NEW"])]
    delta_pair: Option<Vec<PathBuf>>,
    /// Folder for the HF export of the base.
    #[arg(long, default_value = ".cache/bench/hf-base")]
    hf: PathBuf,
    /// Where to write the checkpoint after step 1 (for `relay-bench` and the delta codec bench).
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
                // The records' log-probs are the raw (T = 1) ones, so the
                // bench's step is taken at T = 1 too (it times the step).
                temperature: 1.0,
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

/// The PyTorch script as a server (`--serve`): it loads the HF export,
/// checks logits, takes its warm-up step 1 and compares its weights with
/// ours, then takes one timed step per request.
struct PyServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl PyServer {
    fn start(
        args: &Args,
        python: &Path,
        cfg: &TrainConfig,
        ref_logits: &Path,
        prompt: &[u32],
        weights: &Path,
    ) -> Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pytorch-grpo-bench.py");
        let mut cmd = Command::new(python);
        cmd.arg(&script)
            .args(["--hf".as_ref(), args.hf.as_os_str()])
            .args(["--batch".as_ref(), args.batch.as_os_str()])
            .args(["--threads", &args.threads.to_string(), "--lr", &args.lr.to_string()])
            .args(["--micro-batch-tokens", &cfg.micro_batch_tokens.to_string()])
            .args(["--rust-weights".as_ref(), weights.as_os_str()])
            .arg("--serve");
        if cfg.share_prompts {
            cmd.arg("--share-prompts");
        }
        if cfg.share_prompts && cfg.pack_prompts {
            cmd.arg("--pack-prompts");
        }
        let prompt: Vec<String> = prompt.iter().map(u32::to_string).collect();
        cmd.args(["--ref-logits".as_ref(), ref_logits.as_os_str()]).args(["--prompt", &prompt.join(",")]);
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("running {} (create it with scripts/bench-venv.sh)", python.display()))?;
        let stdin = child.stdin.take();
        let stdout = std::io::BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(PyServer { child, stdin, stdout })
    }

    /// `key=value` lines up to the line `end`.
    fn until(&mut self, end: &str) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                let status = self.child.wait()?;
                bail!("the PyTorch bench ended ({status}) before {end:?}");
            }
            let l = line.trim();
            if l == end {
                return Ok(out);
            }
            if let Some((k, v)) = l.split_once('=') {
                out.insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
    }

    fn step(&mut self) -> Result<BTreeMap<String, String>> {
        let stdin = self.stdin.as_mut().context("PyTorch bench closed")?;
        std::io::Write::write_all(stdin, b"step\n")?;
        std::io::Write::flush(stdin)?;
        self.until("done")
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        // Closing stdin ends its loop.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// The trainer's fp32 weights under their HF names and layout (Q/K rows
/// un-permuted, as `trainer::hf::export` does), for the weight comparison.
fn save_hf_f32(model: &tributary_policy::ReferenceModel, base: &Checkpoint, path: &Path) -> Result<()> {
    let vars = model.var_store().variables();
    let c = *base.config();
    let mut out = Vec::new();
    tch::no_grad(|| -> Result<()> {
        for info in &base.header().tensors {
            let name = trainer::hf::hf_name(&info.name).with_context(|| format!("no HF name for {}", info.name))?;
            let p = vars.get(&info.name).with_context(|| format!("model has no {}", info.name))?;
            let shape: Vec<i64> = info.dims.iter().rev().map(|&d| d as i64).collect();
            let mut t = p.f_to_kind(Kind::Float)?.f_reshape(shape)?;
            if info.name.ends_with("attn_q.weight") {
                t = trainer::hf::unpermute(&t, c.n_head as i64)?;
            } else if info.name.ends_with("attn_k.weight") {
                t = trainer::hf::unpermute(&t, c.n_head_kv as i64)?;
            }
            out.push((name, t.f_contiguous()?));
        }
        Ok(())
    })?;
    Tensor::write_safetensors(&out, path)?;
    Ok(())
}

/// The trainer's proof of every rollout of the batch file (as
/// `trainer::proof::Prover::prove_group` runs it, the window contract taken
/// from the records): seconds, and how many rollouts passed.
fn prove_batch(
    path: &Path,
    model: &tributary_policy::ReferenceModel,
    eos: &[u32],
    pack: bool,
) -> Result<(f64, usize, usize)> {
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
    // With `pack`, the prompt prefix every group shares runs once (the
    // prover keeps it between groups: `Prover::prove_group`).
    let prefix = if pack {
        let prompts = groups.values().flat_map(|rs| rs.iter().map(|(r, _)| &r.tokens[..r.prompt_len as usize]));
        Some(model.prefix_cache(
            &groups.values().next().context("no groups")?[0].0.tokens[..tributary_policy::common_prefix_len(prompts)],
        )?)
    } else {
        None
    };
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
        let evidence = model.evidence_drawn_after(prefix.as_ref(), &reqs, &[])?;
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
        let (secs, passed, total) = prove_batch(&args.batch, &model, &eos, cfg.share_prompts && cfg.pack_prompts)?;
        verdicts = (passed, total);
        proof.push(secs);
        let t = Instant::now();
        trainer.step(samples)?;
        step.push(t.elapsed().as_secs_f64());
        eprintln!("round {}: proof {secs:.2} s ({passed}/{total} rollouts pass), step {:.2} s", round + 1, step[round]);
    }
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

/// Empirical entropy (bits) of a histogram.
fn entropy_bits(counts: impl IntoIterator<Item = u64>) -> f64 {
    let counts: Vec<u64> = counts.into_iter().filter(|&c| c > 0).collect();
    let n: u64 = counts.iter().sum();
    counts.iter().map(|&c| c as f64 * (n as f64 / c as f64).log2()).sum()
}

/// `--delta-pair`: the codec on a saved pair, and where its floor is.
fn delta_pair(base: &Path, new: &Path, full_every: u64) -> Result<()> {
    let (base, new) = (std::fs::read(base)?, std::fs::read(new)?);
    let mut times = Vec::new();
    let mut d = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        d = delta::encode_gguf(&base, &new, delta::DEFAULT_LEVEL)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut apply = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let out = delta::apply_to_copy(&d, &base)?;
        apply.push(t.elapsed().as_secs_f64() * 1e3);
        if out != new {
            bail!("applying the delta did not reproduce the new checkpoint");
        }
    }
    // The floor for a coder that knows the base: per element kind and base
    // exponent, the entropy of "changed" plus that of the bit-pattern
    // difference of the changes (static, fitted to this very pair, so a
    // little optimistic), and the same without the exponent.
    let h = tributary_protocol::gguf::parse_header(&base)?;
    let mut pos: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut diff: BTreeMap<(u32, i64), u64> = BTreeMap::new();
    let mut diff_all: BTreeMap<i64, u64> = BTreeMap::new();
    let mut per_tensor_iid = 0.0;
    for t in &h.tensors {
        let Some(elem) = delta::ElemKind::of(t.ty) else { continue };
        let r = h.tensor_range(t);
        let (a, b) = (&base[r.clone()], &new[r]);
        let size = elem.size();
        let mut c = 0u64;
        for (x, y) in a.chunks_exact(size).zip(b.chunks_exact(size)) {
            let (x, y, e, d) = if size == 2 {
                let (x, y) = (u16::from_le_bytes([x[0], x[1]]), u16::from_le_bytes([y[0], y[1]]));
                (u64::from(x), u64::from(y), u32::from((x >> 7) & 0xff), i64::from(y.wrapping_sub(x) as i16))
            } else {
                let (x, y) =
                    (u32::from_le_bytes([x[0], x[1], x[2], x[3]]), u32::from_le_bytes([y[0], y[1], y[2], y[3]]));
                (u64::from(x), u64::from(y), 256 + ((x >> 23) & 0xff), i64::from(y.wrapping_sub(x) as i32))
            };
            let slot = pos.entry(e).or_default();
            slot.0 += 1;
            if x != y {
                slot.1 += 1;
                c += 1;
                *diff.entry((e, d)).or_default() += 1;
                *diff_all.entry(d).or_default() += 1;
            }
        }
        let n = t.n_elements();
        per_tensor_iid += entropy_bits([c, n - c]);
    }
    let changed: u64 = pos.values().map(|v| v.1).sum();
    let total: u64 = pos.values().map(|v| v.0).sum();
    let pos_bits: f64 = pos.values().map(|&(n, c)| entropy_bits([c, n - c])).sum();
    let mut by_e: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (&(e, _), &n) in &diff {
        by_e.entry(e).or_default().push(n);
    }
    let diff_bits: f64 = by_e.into_values().map(entropy_bits).sum();
    let diff_all_bits = entropy_bits(diff_all.into_values());
    let full = new.len() as f64;
    let per = |bits: f64| bits / changed.max(1) as f64;
    let floor = (pos_bits + diff_bits) / 8.0;
    let k = full_every.max(1) as f64;
    println!("| figure | value |");
    println!("|---|---|");
    println!("| changed elements | {changed} of {total} ({:.3} %) |", 100.0 * changed as f64 / total as f64);
    println!("| delta v{} (bytes) | {} |", delta::VERSION, d.len());
    println!("| full / delta | {:.1} |", full / d.len() as f64);
    println!("| delta, bits per changed element | {:.2} |", 8.0 * d.len() as f64 / changed.max(1) as f64);
    println!(
        "| floor knowing the base: position given exponent {:.2} + difference given exponent {:.2} bits per change | {floor:.0} bytes (full / floor {:.1}) |",
        per(pos_bits),
        per(diff_bits),
        full / floor
    );
    println!(
        "| without the base's exponent: position (per-tensor rate) {:.2} + difference {:.2} bits per change | {:.0} bytes |",
        per(per_tensor_iid),
        per(diff_all_bits),
        (per_tensor_iid + diff_all_bits) / 8.0
    );
    println!(
        "| a miner's download per update over a full-anchor period of {k} | {:.0} bytes (full / that = {:.1}) |",
        (full + (k - 1.0) * d.len() as f64) / k,
        full * k / (full + (k - 1.0) * d.len() as f64)
    );
    println!("| encode, median of 5 (ms) | {:.0} |", median(&times));
    println!("| decode + apply to a copy, median of 5 (ms) | {:.0} |", median(&apply));
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(pair) = &args.delta_pair {
        return delta_pair(&pair[0], &pair[1], args.full_every);
    }
    let threads = tributary_policy::init_threads(Some(args.threads));
    let model = args.model.clone().unwrap_or_else(assets::smollm2_bf16);
    let base = Checkpoint::open(&model).with_context(|| format!("{} (run `trainer init-base`)", model.display()))?;
    let samples = load_samples(&args.batch)?;
    if args.verify {
        let cfg = TrainConfig {
            lr: args.lr,
            warmup_steps: 1,
            share_prompts: !args.no_share_prompts,
            pack_prompts: !args.no_pack,
            ..Default::default()
        };
        return verify_arm(&args, &base, &samples, cfg);
    }
    let seqs = samples.len();
    let prompt_tokens: usize = samples.iter().map(|s| s.prompt_len).sum();
    let completion_tokens: usize = samples.iter().map(|s| s.tokens.len() - s.prompt_len).sum();
    let share_prompts = !args.no_share_prompts;
    let cfg = TrainConfig {
        lr: args.lr,
        warmup_steps: 1,
        share_prompts,
        pack_prompts: !args.no_pack,
        ..TrainConfig::default()
    };
    // A batch whose advantages are all 0 has no policy gradient (only the
    // entropy bonus): the parity and the delta would measure the wrong step.
    let nonzero = samples.iter().filter(|s| s.advantage != 0.0).count();
    if nonzero == 0 && !args.allow_zero_advantages {
        bail!(
            "every advantage of the batch is 0 (no group has reward variance); pass --allow-zero-advantages to measure it anyway"
        );
    }
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

    // Step 1 is the warm-up on both sides (first kernels, Adam state
    // allocated): its time is shown apart and left out of the medians; its
    // weights are the ones compared and published.
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    let stats = trainer.step(&samples)?;
    let warm = (t.elapsed().as_secs_f64(), process_cpu_secs() - cpu);
    let split = |tr: &Trainer| {
        let t = tr.last_timings();
        eprintln!(
            "Rust step: {} micro-batches ({} with a shared prompt), {} positions ({} of them a prefix common to the step); forward {:.2} s, backward {:.2} s, optimiser {:.2} s",
            t.micro_batches,
            t.shared_prompt_batches,
            t.positions,
            t.common_prefix,
            t.forward_s,
            t.backward_s,
            t.optimizer_s
        );
    };
    eprintln!("warm-up step: Rust {:.2} s ({:.2} CPU s)", warm.0, warm.1);
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

    // PyTorch in one process that warms up with its own step 1 (compared
    // with ours), then alternates: a Rust step here, a PyTorch step there,
    // `--rounds` times, so load from other processes hits both alike.
    let mut py = BTreeMap::new();
    let (mut rust_wall, mut rust_cpu) = (Vec::new(), Vec::new());
    let (mut py_wall, mut py_cpu) = (Vec::new(), Vec::new());
    let mut loads = Vec::new();
    let loadavg = || {
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().next().unwrap_or("").to_owned()
    };
    let mut server = if args.no_pytorch {
        None
    } else {
        trainer::hf::export(&base, &args.hf)?;
        let ref_path = args.hf.join("ref_logits.f32");
        let raw: Vec<u8> = ref_logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&ref_path, raw)?;
        let weights = args.hf.join("rust-step1.safetensors");
        save_hf_f32(trainer.model(), &base, &weights)?;
        let python = args.python.clone().unwrap_or_else(default_python);
        let mut server = PyServer::start(&args, &python, &cfg, &ref_path, &prompt, &weights)?;
        py = server.until("ready")?;
        Some(server)
    };
    let rounds = args.rounds.max(1);
    let mut last = None;
    for round in 0..rounds {
        // The last step's delta is the steady-state one: from a base that
        // is itself an export of drifted fp32 masters, as in a training run
        // after its first publication (step 1's base is exactly on the
        // BF16 grid, which makes its changes predictable).
        let prev = (round + 1 == rounds).then(|| trainer.export_checkpoint(&base)).transpose()?;
        let (t, cpu) = (Instant::now(), process_cpu_secs());
        trainer.step(&samples)?;
        rust_wall.push(t.elapsed().as_secs_f64());
        rust_cpu.push(process_cpu_secs() - cpu);
        split(&trainer);
        if let Some(prev) = prev {
            let (prev, next) =
                (Checkpoint::from_bytes(prev)?, Checkpoint::from_bytes(trainer.export_checkpoint(&base)?)?);
            let d = delta::encode(&prev, &next)?;
            if delta::apply_to_copy(&d, prev.bytes())? != next.bytes() {
                bail!("applying the last step's delta did not reproduce its checkpoint");
            }
            let (c, _) = delta::change_stats(prev.bytes(), next.bytes())?;
            let stem = args.save.with_extension("");
            let (pp, np) = (stem.with_extension("last-base.gguf"), stem.with_extension("last.gguf"));
            std::fs::write(&pp, prev.bytes()).with_context(|| format!("writing {}", pp.display()))?;
            std::fs::write(&np, next.bytes()).with_context(|| format!("writing {}", np.display()))?;
            last = Some((round + 2, d.len(), c));
        }
        if let Some(server) = server.as_mut() {
            let out = server.step()?;
            let get = |k: &str| out.get(k).and_then(|v| v.parse::<f64>().ok());
            if let (Some(w), Some(c)) = (get("pytorch_step_seconds"), get("pytorch_step_cpu_seconds")) {
                py_wall.push(w);
                py_cpu.push(c);
            }
        }
        loads.push(loadavg());
        eprintln!(
            "round {}: Rust {:.2} s ({:.2} CPU s), PyTorch {:.2} s ({:.2} CPU s), load {}",
            round + 1,
            rust_wall[round],
            rust_cpu[round],
            py_wall.get(round).copied().unwrap_or(f64::NAN),
            py_cpu.get(round).copied().unwrap_or(f64::NAN),
            loads[round]
        );
    }
    drop(server);
    let (rust_step, rust_cpu_m) = (median(&rust_wall), median(&rust_cpu));

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "batch: {seqs} sequences ({nonzero} with a non-zero advantage), {prompt_tokens} prompt + {completion_tokens} completion tokens, micro_batch_tokens={}, share_prompts={}, pack_prompts={}",
        cfg.micro_batch_tokens, cfg.share_prompts, cfg.pack_prompts
    );
    println!(
        "step 1: lr={:e} loss={:.6} grad_norm={:.4} ratio_mean={:.4} entropy={:.4}",
        stats.lr, stats.loss, stats.grad_norm, stats.ratio_mean, stats.entropy
    );
    println!("threads={threads} loadavg={}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
    println!("| warm-up step 1, Rust (s) | {:.2} ({:.2} CPU s) |", warm.0, warm.1);
    if let (Some(w), Some(c)) = (py.get("pytorch_warmup_seconds"), py.get("pytorch_warmup_cpu_seconds")) {
        println!("| warm-up step 1, PyTorch (s) | {w} ({c} CPU s) |");
    }
    println!(
        "| timed rounds after the warm-up (Rust step, then PyTorch step) | {} (load {}) |",
        rust_wall.len(),
        loads.join(", ")
    );
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
    if let Some(l) = py.get("pytorch_warmup_loss") {
        println!("| PyTorch loss, step 1 (Rust {:.6}) | {l} |", stats.loss);
    }
    if let Some(g) = py.get("pytorch_warmup_grad_norm") {
        println!("| PyTorch grad norm, step 1 (Rust {:.4}) | {g} |", stats.grad_norm);
    }
    if let (Some(d), Some(u)) = (py.get("weights_max_abs_diff"), py.get("weights_max_abs_update")) {
        let worst = py.get("weights_max_abs_diff_tensor").map_or("", String::as_str);
        let n = py.get("weights_compared_tensors").map_or("?", String::as_str);
        println!(
            "| fp32 weights after step 1, Rust vs PyTorch, max abs diff ({n} tensors; largest update {u}) | {d} ({worst}) |"
        );
    }
    if let Some(v) = py.get("hf_logits_max_abs_diff") {
        println!("| HF export vs reference, next-token logits max abs diff | {v} |");
    }
    if let Some(v) = py.get("hf_argmax_match") {
        println!("| HF export vs reference, same argmax | {v} |");
    }
    let k = args.full_every.max(1);
    let lr = args.lr;
    println!("| full checkpoint (bytes) | {full} |");
    println!("| delta of step 1 from the base (bytes), lr {lr:e}, format v{} | {d_len} |", delta::VERSION);
    println!("| full / delta, step 1, lr {lr:e} | {:.1} |", full as f64 / d_len as f64);
    println!("| changed elements, step 1 | {changed} of {total} ({:.4} %) |", 100.0 * changed as f64 / total as f64);
    let steady = match last {
        Some((step, len, c)) => {
            println!("| delta of step {step} from step {} (bytes), lr {lr:e} | {len} |", step - 1);
            println!("| full / delta, step {step}, lr {lr:e} (goal ≥ 40) | {:.1} |", full as f64 / len as f64);
            println!("| changed elements, step {step} | {c} of {total} ({:.4} %) |", 100.0 * c as f64 / total as f64);
            len
        }
        None => d_len,
    };
    let per_update = (full as f64 + (k - 1) as f64 * steady as f64) / k as f64;
    println!(
        "| a miner's download per update, averaged over a full-anchor period of {k} (1 full + {} deltas) (bytes) | {per_update:.0} (full / that = {:.1}) |",
        k - 1,
        full as f64 / per_update
    );
    println!("| export BF16 GGUF (ms) | {export_ms:.0} |");
    println!("| delta encode (ms) | {encode_ms:.0} |");
    println!("| delta decode + apply in place (ms) | {apply_ms:.0} |");
    Ok(())
}
