//! What one re-generation of the trainer's proof costs (issue 28,
//! calibration §6c): an off-draw rollout is re-generated from its first
//! off-draw position with the trainer's own seeded draws by cached decoding
//! (one position a step, from an f32 copy of the BF16-held weights), then
//! settled by one evidence forward ([`trainer::proof::regenerate`]); the
//! proof spends at most
//! `max_repairs_per_window` of them a window. Beside it, its anchor: the
//! proof's own evidence forward of the same rollout, which every proven
//! rollout costs anyway.
//!
//! Each rep re-generates a whole completion (from its first token: the most a
//! re-generation can cost) and half of one, alternating with the evidence
//! forward; the table gives true medians. One JSON line per rep goes to
//! stdout before the table.
//!
//! ```text
//! cargo run -p trainer --bin repair-bench -- --max-new-tokens 128 --reps 5 --threads 2
//! ```

#[path = "../bench_stats.rs"]
mod bench_stats;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bench_stats::median;
use clap::Parser;
use tributary_assets as assets;
use tributary_policy::{EvidenceRequest, ReferenceModel};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{EnvId, Environment, RewardRule, task_seed};
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, SamplingParams};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::wire::WindowInfo;

#[derive(Parser)]
#[command(name = "repair-bench", about = "One proof re-generation vs the proof's evidence forward")]
struct Args {
    /// BF16 checkpoint (default: the SmolLM2 BF16 base).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Arith level of the prompt.
    #[arg(long, default_value_t = 102)]
    difficulty: u32,
    /// The window's token budget (a re-generation stops there or at EOS).
    #[arg(long, default_value_t = 128)]
    max_new_tokens: u32,
    /// Repetitions (medians reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// libtorch threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Tasks tried until one's honest completion is at least
    /// `max_new_tokens / 2` tokens long.
    #[arg(long, default_value_t = 16)]
    tasks: u32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let threads = tributary_policy::init_threads(args.threads);
    let path = args.model.unwrap_or_else(assets::smollm2_bf16);
    let ckpt = Checkpoint::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let model = ReferenceModel::load_for_inference(&ckpt, tributary_policy::default_device())?;
    let tok = Tokenizer::from_gguf_file(&path)?;
    let seed = Seed([29; 32]);
    let miner = [5; 32];
    let sampling = SamplingParams { temperature: 0.7, max_new_tokens: args.max_new_tokens };
    let info = WindowInfo {
        window: 1,
        opens_at_ms: 0,
        closes_at_ms: 1,
        seed,
        commitment: [0; 32],
        checkpoint: ckpt.content_id(),
        env: EnvId::Arith,
        groups_per_miner: args.tasks,
        group_size: 1,
        sampling,
        difficulty: args.difficulty,
        dataset: None,
        reward: RewardRule::Lenient,
    };
    let env = Environment::for_window(&info, None)?;
    // A rollout record holding only the prompt: re-generating it from its
    // first completion position is the honest rollout, in full.
    let bare = |group: u32| -> Result<Rollout> {
        let task_id = task_seed(&seed, &miner, group);
        let prompt = tok.encode(&env.prompt_text(&env.task(task_id)))?;
        Ok(Rollout {
            window: info.window,
            checkpoint: info.checkpoint,
            env: info.env,
            group,
            rollout: 0,
            task_id,
            sampling,
            sketches: vec![0; prompt.len()],
            logprobs: Vec::new(),
            prompt_len: prompt.len() as u32,
            tokens: prompt,
            reward: 0.0,
            miner,
            signature: [0; 64],
        })
    };
    let regen = |r: &Rollout, from: usize| -> Result<(Rollout, usize)> {
        trainer::proof::regenerate(&model, &tok, &env, r, &seed, from)?
            .context("the re-generation did not settle with its evidence forward")
    };
    let mut honest = None;
    for g in 0..args.tasks {
        let b = bare(g)?;
        let (r, _) = regen(&b, b.prompt_len as usize)?;
        let n = r.tokens.len() - r.prompt_len as usize;
        eprintln!("task {g}: honest completion of {n} tokens");
        if 2 * n >= args.max_new_tokens as usize {
            honest = Some((b, r));
            break;
        }
    }
    let (bare, honest) = honest.context("no task's completion reached max_new_tokens / 2: raise --tasks")?;
    let pl = honest.prompt_len as usize;
    let n = honest.tokens.len() - pl;
    let half = pl + n / 2;
    let evidence = || -> Result<()> {
        let req = EvidenceRequest {
            tokens: &honest.tokens,
            prompt_len: pl,
            temperature: sampling.temperature,
            eos: tok.eos_id(),
            hidden_positions: &[],
        };
        model.evidence(&[req])?;
        Ok(())
    };
    evidence()?; // warm-up
    let (mut whole, mut halfway, mut ev) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..args.reps {
        let t = Instant::now();
        let (r, w_rounds) = regen(&bare, pl)?;
        let w = t.elapsed().as_secs_f64();
        if r.tokens != honest.tokens {
            bail!("rep {rep}: the re-generation is not the honest completion");
        }
        let t = Instant::now();
        let (r, h_rounds) = regen(&honest, half)?;
        let h = t.elapsed().as_secs_f64();
        if r.tokens != honest.tokens {
            bail!("rep {rep}: the re-generation from half way is not the honest completion");
        }
        let t = Instant::now();
        evidence()?;
        let e = t.elapsed().as_secs_f64();
        println!(
            "{{\"rep\":{rep},\"prompt_tokens\":{pl},\"completion_tokens\":{n},\"threads\":{threads},\
             \"regenerate_whole_s\":{w:.4},\"regenerate_half_s\":{h:.4},\"evidence_forward_s\":{e:.4},\
             \"rounds_whole\":{w_rounds},\"rounds_half\":{h_rounds}}}"
        );
        whole.push(w);
        halfway.push(h);
        ev.push(e);
    }
    let e = median(&ev);
    println!(
        "\nmodel {}, {} threads, arith {}, prompt {pl} tokens, honest completion {n} tokens, {} reps (true medians)",
        path.display(),
        threads,
        args.difficulty,
        args.reps
    );
    println!("| what | median s | min–max s | ÷ evidence forward |");
    println!("|---|---|---|---|");
    for (name, v) in [
        (format!("re-generation of all {n} completion tokens"), &whole),
        (format!("re-generation of the last {} tokens", n - n / 2), &halfway),
        ("evidence forward of the rollout (anchor: the proof's own cost)".to_string(), &ev),
    ] {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        println!("| {name} | {:.3} | {lo:.3}–{hi:.3} | {:.1} |", median(v), median(v) / e);
    }
    Ok(())
}
