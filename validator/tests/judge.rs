//! The validator's judge without sockets, on the protocol's tiny model with the
//! real libtorch reference: cheap checks come before any model work, each
//! failure is typed and logged with its figures, and copies name the copier.

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use tch::Device;
use tributary_assets as assets;
use tributary_policy::{EvidenceRequest, ModelConfig, PolicyError, ReferenceModel, SequenceEvidence, pad_batch};
use tributary_protocol::checkpoint::{Checkpoint, ContentId};
use tributary_protocol::env::{ArithEnv, Environment, completion_reward, task_seed};
use tributary_protocol::identity::Keypair;
use tributary_protocol::prf::Seed;
use tributary_protocol::rollout::{Rollout, SamplingParams};
use tributary_protocol::sketch::{self, SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::{CheckKind, Failure, Status};
use tributary_protocol::{sampling, tiny};
use validator::judge::{Contract, Judge, JudgeConfig, Reference, RolloutFailure, SampleConfig};

const MAX_NEW: u32 = 24;
const TEMPERATURE: f32 = 0.8;

struct Fixture {
    _dir: tempfile::TempDir,
    model: ReferenceModel,
    tokenizer: Tokenizer,
    checkpoint: ContentId,
    env: Environment,
}

/// The tiny model and its reference (per test: libtorch models are not `Sync`).
fn fixture() -> Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.gguf");
    let checkpoint = tiny::write_tiny(3, &Checkpoint::open(&assets::smollm2_q4_1())?, &path)?;
    let model = ReferenceModel::open(&path, Device::Cpu)?;
    let tokenizer = Tokenizer::from_gguf_file(&path)?;
    Ok(Fixture { _dir: dir, model, tokenizer, checkpoint, env: Environment::Arith(ArithEnv::new(3)) })
}

fn contract(f: &Fixture) -> Contract<'_> {
    Contract {
        window: 5,
        checkpoint: f.checkpoint,
        env: &f.env,
        sampling: SamplingParams { temperature: TEMPERATURE, max_new_tokens: MAX_NEW },
        groups_per_miner: 2,
        group_size: 2,
        miner: None,
        seed: Seed([9; 32]),
        challenge: Seed([10; 32]),
    }
}

/// An honest rollout: sampled token by token with the protocol's seeded
/// sampler from the reference model's own logits, sketched from its own
/// hidden states, signed by `key`.
fn honest(f: &Fixture, c: &Contract<'_>, key: &Keypair, group: u32, rollout: u32) -> Result<Rollout> {
    let miner = *key.public().as_bytes();
    let vocab = f.model.dims().vocab_size;
    let task = f.env.task(task_seed(&c.seed, &miner, group));
    let prompt = f.tokenizer.encode(&f.env.prompt_text(&task))?;
    let mut tokens = prompt.clone();
    let mut logprobs = Vec::new();
    for _ in 0..MAX_NEW {
        let (batch, _) = pad_batch(&[&tokens], vocab, 0, Device::Cpu)?;
        let h = tch::no_grad(|| f.model.forward_hidden(&batch))?;
        let last = h.get(0).get(tokens.len() as i64 - 1);
        let logits: Vec<f32> = Vec::try_from(tch::no_grad(|| f.model.lm_head(&last))?)?;
        let u = sampling::draw_u(&c.seed, &miner, group, rollout, tokens.len() as u32);
        let s = sampling::sample_with_logprob(&logits, TEMPERATURE, u);
        tokens.push(s.token);
        logprobs.push(s.logprob_t1);
        if f.tokenizer.is_eog(s.token) {
            break;
        }
    }
    let (batch, _) = pad_batch(&[&tokens], vocab, 0, Device::Cpu)?;
    let h: Vec<f32> = Vec::try_from(tch::no_grad(|| f.model.forward_hidden(&batch))?.flatten(0, -1))?;
    let sketches =
        sketch::sketch_rows(&h, &SketchKey::derive(&c.seed, f.model.dims().d_model), &SketchParams::DEFAULT)?;
    let reward = completion_reward(&f.tokenizer, &f.env, &task, &tokens[prompt.len()..])?;
    let mut r = Rollout {
        window: c.window,
        checkpoint: c.checkpoint,
        env: f.env.id(),
        group,
        rollout,
        task_id: task.id,
        sampling: c.sampling,
        prompt_len: u32::try_from(prompt.len())?,
        tokens,
        logprobs,
        sketches,
        reward,
        miner,
        signature: [0; 64],
    };
    r.sign(key);
    Ok(r)
}

/// The real reference model, recording the length of every rollout it is asked about.
struct Counting<'m> {
    model: &'m ReferenceModel,
    seen: RefCell<Vec<usize>>,
}

impl Reference for Counting<'_> {
    fn dims(&self) -> &ModelConfig {
        self.model.dims()
    }

    fn evidence(&self, reqs: &[EvidenceRequest<'_>]) -> Result<Vec<SequenceEvidence>, PolicyError> {
        self.seen.borrow_mut().extend(reqs.iter().map(|r| r.tokens.len()));
        self.model.evidence(reqs)
    }
}

/// Everything written to a `tracing` subscriber while `f` runs.
fn captured<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || out.clone())
        .finish();
    let t = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8_lossy(&buf.0.lock().map(|b| b.clone()).unwrap_or_default()).into_owned();
    (t, text)
}

#[test]
fn cheap_failures_never_reach_the_reference_forward() -> Result<()> {
    let f = &fixture()?;
    let c = contract(f);
    let key = Keypair::from_seed([1; 32]);
    let good = [honest(f, &c, &key, 0, 0)?, honest(f, &c, &key, 0, 1)?];

    // A bad signature.
    let mut bad_sig = good[0].clone();
    bad_sig.signature[0] ^= 1;
    // A prompt one token off the assigned task's.
    let mut wrong_prompt = good[1].clone();
    wrong_prompt.tokens[3] += 1;
    wrong_prompt.sign(&key);
    // A wrong prompt of 8 000 tokens (finding 8: must cost no model work).
    let mut long_prompt = good[1].clone();
    let filler: Vec<u32> = (0..8_000u32).map(|i| 100 + i % 1000).collect();
    long_prompt.tokens.splice(..long_prompt.prompt_len as usize, filler.iter().copied());
    long_prompt.prompt_len = 8_000;
    long_prompt.sketches = vec![0; long_prompt.tokens.len()];
    long_prompt.sign(&key);
    // A completion longer than the window's max_new_tokens.
    let mut too_long = good[0].clone();
    let extra = MAX_NEW as usize + 4 - too_long.completion().len();
    too_long.tokens.extend(std::iter::repeat_n(200, extra));
    too_long.logprobs.extend(std::iter::repeat_n(-1.0, extra));
    too_long.sketches.extend(std::iter::repeat_n(0, extra));
    too_long.sign(&key);
    // Generated under another contract (temperature).
    let mut other_contract = good[1].clone();
    other_contract.sampling.temperature = 1.0;
    other_contract.sign(&key);

    let blobs: Vec<Vec<u8>> = [&good[0], &good[1], &bad_sig, &wrong_prompt, &long_prompt, &too_long, &other_contract]
        .iter()
        .map(|r| r.encode())
        .collect();
    let model = Counting { model: &f.model, seen: RefCell::new(Vec::new()) };
    let cfg = JudgeConfig { sample: SampleConfig::ALL, ..JudgeConfig::default() };
    let judge = Judge::new(&cfg, &f.tokenizer, &model);
    let validator = Keypair::from_seed([2; 32]).public();
    let (report, logs) = captured(|| judge.window(&c, validator, blobs));
    let report = report?;

    // Only the two honest rollouts reached the model.
    let mut seen = model.seen.borrow().clone();
    seen.sort_unstable();
    let mut want: Vec<usize> = good.iter().map(|r| r.tokens.len()).collect();
    want.sort_unstable();
    assert_eq!(seen, want, "rollouts run through the reference forward");
    assert_eq!(report.proved, 2);

    let m = &report.miners[&key.public()];
    let failed: Vec<(&str, u32)> = m.failed.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(failed, [("prompt", 2), ("signature", 1), ("structure", 2)], "{:?}", m.body);
    assert_eq!((m.body.checked, m.body.valid, m.body.hard_failure, m.body.estimated_valid), (7, 2, true, 0));

    // Each failure logged at warn with its digest, check, position and figures.
    let line = |r: &Rollout| {
        let d = hex::encode(r.digest());
        logs.lines()
            .find(|l| l.contains(&d))
            .map(str::to_owned)
            .with_context(|| format!("no log line for {d}:\n{logs}"))
    };
    let l = line(&long_prompt)?;
    assert!(l.contains("WARN") && l.contains("check=\"prompt\"") && l.contains("PromptMismatch"), "{l}");
    assert!(l.contains("position=Some(") && l.contains("expected_len"), "{l}");
    let l = line(&too_long)?;
    assert!(l.contains("check=\"structure\"") && l.contains("TooLong"), "{l}");
    assert!(line(&bad_sig)?.contains("check=\"signature\""));
    assert!(line(&other_contract)?.contains("field: \"sampling\""));
    assert!(logs.contains("verdict fails the miner (a hard failure)"), "{logs}");
    Ok(())
}

#[test]
fn prepare_and_prove_type_every_outcome() -> Result<()> {
    let f = &fixture()?;
    let c = contract(f);
    let key = Keypair::from_seed([3; 32]);
    let good = honest(f, &c, &key, 1, 0)?;
    let mut reward = good.clone();
    reward.reward = 1.0 - reward.reward;
    reward.sign(&key);
    let mut unsigned = good.clone();
    unsigned.signature = [0; 64];

    let cfg = JudgeConfig::default();
    let judge = Judge::new(&cfg, &f.tokenizer, &f.model);
    let mut cases: Vec<_> = [good, reward, unsigned].into_iter().map(|r| judge.prepare(r, c)).collect();
    assert!(cases[0].outcome.is_none() && cases[1].outcome.is_none(), "both wait for the model");
    assert_eq!(cases[2].outcome, Some(Err(RolloutFailure::Signature)));
    let stats = judge.prove(&mut cases)?;
    assert_eq!((stats.proved, stats.batches), (2, 1), "one prompt, one batch");
    assert!(cases[0].passed(), "{:?}", cases[0].outcome);
    match &cases[1].outcome {
        Some(Err(RolloutFailure::Checked(v))) => {
            let failures: Vec<CheckKind> = v.failures().map(|(k, _)| k).collect();
            assert_eq!(failures, [CheckKind::Reward]);
            assert!(matches!(
                v.get(CheckKind::Reward).map(|o| &o.status),
                Some(Status::Fail(Failure::RewardMismatch { .. }))
            ));
        }
        o => panic!("expected a reward failure, got {o:?}"),
    }
    // Offline records are unsigned: the same rollout passes when signatures are not required.
    let offline = JudgeConfig { check_signatures: false, ..JudgeConfig::default() };
    let judge = Judge::new(&offline, &f.tokenizer, &f.model);
    let mut cases = vec![judge.prepare(cases.swap_remove(2).rollout, c)];
    judge.prove(&mut cases)?;
    assert!(cases[0].passed(), "{:?}", cases[0].outcome);
    Ok(())
}

#[test]
fn a_copy_is_named_and_never_proved() -> Result<()> {
    let f = &fixture()?;
    let c = contract(f);
    let (owner, copier) = (Keypair::from_seed([4; 32]), Keypair::from_seed([5; 32]));
    let original = honest(f, &c, &owner, 0, 0)?;
    let mut copy = original.clone();
    copy.miner = *copier.public().as_bytes();
    copy.task_id = task_seed(&c.seed, &copy.miner, copy.group);
    copy.sign(&copier);

    let model = Counting { model: &f.model, seen: RefCell::new(Vec::new()) };
    let cfg = JudgeConfig { sample: SampleConfig::ALL, ..JudgeConfig::default() };
    let judge = Judge::new(&cfg, &f.tokenizer, &model);
    let report = judge.window(&c, Keypair::from_seed([2; 32]).public(), vec![original.encode(), copy.encode()])?;
    assert_eq!(model.seen.borrow().len(), 1, "the copy fails its prompt before the model");
    let o = &report.miners[&owner.public()];
    assert!(!o.body.hard_failure && o.failed.is_empty() && o.body.valid == 1, "{:?}", o.body);
    let m = &report.miners[&copier.public()];
    assert!(m.body.hard_failure && m.failed("copy"), "{:?}", m.failed);
    assert!(m.body.reasons.iter().any(|r| r.contains("own checks failed: prompt")), "{:?}", m.body.reasons);
    Ok(())
}
