//! `validator check` end to end on the protocol's tiny model: honest rollouts
//! (sampled with the protocol's seeded sampler from the reference model's own
//! logits, sketched from its own hidden states, written in the miner's JSONL
//! format) are accepted; each kind of tampering is rejected by its check.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use proptest::prelude::*;
use serde_json::{Value, json};
use tch::Device;
use tributary_assets as assets;
use tributary_policy::{ReferenceModel, pad_batch};
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{ArithEnv, Environment, Gsm8kEnv, task_seed};
use tributary_protocol::offline::OfflineWindow;
use tributary_protocol::sketch::{self, SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_protocol::verify::{CheckKind, VerifyParams};
use tributary_protocol::{sampling, tiny};
use validator::check::{CheckOptions, CheckSummary, LineVerdict, read_records, run_check};

const SEED: u64 = 42;
const TASKS: u32 = 2;
const GROUP: u32 = 2;
const MAX_NEW: usize = 24;
const TEMPERATURE: f32 = 0.8;

struct Fixture {
    _dir: tempfile::TempDir,
    model: PathBuf,
    records: Vec<Value>,
}

/// Writes the tiny model and generates honest records once per test binary.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| make_fixture().expect("fixture"))
}

fn make_fixture() -> Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let model_path = dir.path().join("tiny.gguf");
    tiny::write_tiny(3, &Checkpoint::open(&assets::smollm2_q4_1())?, &model_path)?;
    let records = make_records(&model_path, &Environment::Arith(ArithEnv::new(3)), TASKS)?;
    Ok(Fixture { _dir: dir, model: model_path, records })
}

/// Honest records of `tasks` groups on `env`, with the fields `edge-miner
/// generate` writes but without its settings.
fn make_records(model_path: &Path, env: &Environment, tasks: u32) -> Result<Vec<Value>> {
    let model = ReferenceModel::open(model_path, Device::Cpu)?;
    let tok = Tokenizer::from_gguf_file(model_path)?;
    let w = OfflineWindow::from_seed(SEED);
    let seed = w.secrets.seed;
    let miner = *w.miner.public().as_bytes();
    let key = SketchKey::derive(&seed, model.dims().d_model);
    let vocab = model.dims().vocab_size;
    let mut records = Vec::new();
    for group in 0..tasks {
        let task = env.task(task_seed(&seed, &miner, group));
        let prompt = tok.encode(&env.prompt_text(&task))?;
        for rollout in 0..GROUP {
            // Token by token: the logits of the last position pick the next
            // token with the protocol's seeded inverse-CDF sampler.
            let mut tokens = prompt.clone();
            let mut logprobs = Vec::new();
            for _ in 0..MAX_NEW {
                let (batch, _) = pad_batch(&[&tokens], vocab, 0, Device::Cpu)?;
                let h = tch::no_grad(|| model.forward_hidden(&batch))?;
                let last = h.get(0).get(tokens.len() as i64 - 1);
                let logits: Vec<f32> = Vec::try_from(tch::no_grad(|| model.lm_head(&last))?)?;
                let u = sampling::draw_u(&seed, &miner, group, rollout, tokens.len() as u32);
                let s = sampling::sample_with_logprob(&logits, TEMPERATURE, u);
                tokens.push(s.token);
                logprobs.push(s.logprob_t1);
                if tok.is_eog(s.token) {
                    break;
                }
            }
            let (batch, _) = pad_batch(&[&tokens], vocab, 0, Device::Cpu)?;
            let h: Vec<f32> = Vec::try_from(tch::no_grad(|| model.forward_hidden(&batch))?.flatten(0, -1))?;
            let sketches = sketch::sketch_rows(&h, &key, &SketchParams::DEFAULT)?;
            let completion = &tokens[prompt.len()..];
            let text_ids = match completion.split_last() {
                Some((&l, rest)) if tok.is_eog(l) => rest,
                _ => completion,
            };
            let reward = env.reward(&task, &tok.decode(text_ids)?);
            // The fields `edge-miner generate` writes (edge-miner/src/offline.rs).
            records.push(json!({
                "env": env.id(), "task_id": task.id, "group": group, "rollout": rollout,
                "window_seed": seed.to_string(), "miner": hex::encode(miner), "model": null,
                "temperature": TEMPERATURE, "tokens": tokens, "prompt_len": prompt.len(),
                "logprobs": logprobs, "sketches": sketches, "eog": tok.is_eog(*completion.last().context("empty")?),
                "completion": tok.decode(text_ids)?, "reward": reward,
            }));
        }
    }
    Ok(records)
}

fn write_jsonl(dir: &Path, lines: &[String]) -> Result<PathBuf> {
    let p = dir.join("rollouts.jsonl");
    std::fs::write(&p, lines.join("\n") + "\n")?;
    Ok(p)
}

fn check(lines: &[String], seed: u64) -> Result<(CheckSummary, Vec<String>)> {
    let f = fixture();
    let dir = tempfile::tempdir()?;
    let path = write_jsonl(dir.path(), lines)?;
    let mut opts = CheckOptions::new(f.model.clone(), path, seed);
    opts.batch = 3; // more than one batch
    opts.max_new_tokens = Some(MAX_NEW as u32);
    opts.threads = Some(1);
    let mut out = Vec::new();
    let summary = run_check(&opts, &mut out)?;
    let text = String::from_utf8(out)?;
    print!("{text}");
    Ok((summary, text.lines().map(str::to_owned).collect()))
}

fn lines_of(records: &[Value]) -> Vec<String> {
    records.iter().map(Value::to_string).collect()
}

#[test]
fn honest_rollouts_are_accepted() -> Result<()> {
    let f = fixture();
    let (summary, out) = check(&lines_of(&f.records), SEED)?;
    let n = f.records.len();
    assert_eq!((summary.checked, summary.accepted, summary.rejected), (n, n, 0), "{out:#?}");
    assert_eq!(out.last().map(String::as_str), Some(format!("checked {n}: {n} accepted, 0 rejected").as_str()));
    assert_eq!(out.len(), n + 1);
    assert!(out[..n].iter().all(|l| l.contains(": accepted")));
    Ok(())
}

/// Runs the check on the honest records with record `i` modified by `tamper`
/// and returns that record's verdict line.
fn tampered(i: usize, tamper: impl FnOnce(&mut Value)) -> Result<(CheckSummary, String)> {
    let mut recs = fixture().records.clone();
    tamper(&mut recs[i]);
    let (summary, out) = check(&lines_of(&recs), SEED)?;
    Ok((summary, out[i].clone()))
}

fn completion_start(r: &Value) -> usize {
    r["prompt_len"].as_u64().unwrap_or(0) as usize
}

#[test]
fn each_kind_of_tampering_is_rejected_by_its_check() -> Result<()> {
    let n = fixture().records.len();
    let expect = |(s, line): (CheckSummary, String), kind: CheckKind| {
        assert_eq!((s.checked, s.accepted, s.rejected), (n, n - 1, 1), "{line}");
        assert!(line.contains("rejected") && line.contains(&format!("{kind:?} (Hard)")), "expected {kind:?}: {line}");
    };
    // A different token than the seeded draw picked (logprob kept plausible).
    expect(
        tampered(0, |r| {
            let len = r["tokens"].as_array().map_or(0, Vec::len);
            let p = (completion_start(r) + 2).min(len - 1);
            let t = r["tokens"][p].as_u64().unwrap_or(0);
            r["tokens"][p] = json!((t + 1) % 49152);
        })?,
        CheckKind::Sampling,
    );
    // Log-probs that are not the model's (here 0.5 nats lower everywhere).
    expect(
        tampered(1, |r| {
            if let Some(v) = r["logprobs"].as_array_mut() {
                v.iter_mut().for_each(|x| *x = json!(x.as_f64().unwrap_or(0.0) - 0.5));
            }
        })?,
        CheckKind::Logprob,
    );
    // Sketches of some other computation.
    expect(
        tampered(2, |r| {
            if let Some(v) = r["sketches"].as_array_mut() {
                v.iter_mut().for_each(|x| *x = json!((x.as_u64().unwrap_or(0) + 5_000) % u64::from(sketch::Q)));
            }
        })?,
        CheckKind::Sketch,
    );
    // Reward claimed without solving the task.
    expect(
        tampered(3, |r| {
            let w = r["reward"].as_f64().unwrap_or(0.0);
            r["reward"] = json!(1.0 - w);
        })?,
        CheckKind::Reward,
    );
    // A prompt that is not the assigned task's.
    expect(
        tampered(0, |r| {
            r["tokens"][5] = json!(r["tokens"][5].as_u64().unwrap_or(0) + 1);
        })?,
        CheckKind::Prompt,
    );
    // Token id outside the vocabulary: structure, before any model work.
    expect(tampered(1, |r| r["tokens"][1] = json!(49152))?, CheckKind::Structure);
    Ok(())
}

#[test]
fn wrong_seed_and_garbage_lines_are_rejected_not_errors() -> Result<()> {
    let f = fixture();
    let (s, out) = check(&lines_of(&f.records), SEED + 1)?;
    assert_eq!((s.accepted, s.rejected), (0, f.records.len()));
    assert!(out[0].contains("malformed") && out[0].contains("window seed"), "{}", out[0]);

    let mut lines = lines_of(&f.records[..1]);
    lines.push("{\"env\": \"arith\", \"tokens\": [1, 2".to_owned());
    lines.push("not json at all".to_owned());
    let (s, out) = check(&lines, SEED)?;
    assert_eq!((s.checked, s.accepted, s.rejected), (3, 1, 2));
    assert!(out[1].starts_with("line 2: rejected: malformed"), "{}", out[1]);
    assert_eq!(out[3], "checked 3: 1 accepted, 2 rejected");

    // A missing rollouts file is an error, not a verdict.
    let mut opts = CheckOptions::new(f.model.clone(), PathBuf::from("/nonexistent/rollouts.jsonl"), SEED);
    opts.params = VerifyParams::DEFAULT;
    assert!(run_check(&opts, &mut Vec::new()).is_err());
    Ok(())
}

#[test]
fn overlong_line_is_skipped_without_reading_it_whole() -> Result<()> {
    let mut data = vec![b'x'; validator::check::MAX_LINE_BYTES + 10];
    data.extend_from_slice(b"\n{}\n");
    let recs = read_records(&data[..])?;
    assert_eq!(recs.len(), 2);
    assert!(recs[0].1.as_ref().is_err_and(|e| e.contains("longer")));
    assert_eq!(recs[1].0, 2);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes never panic: one entry per non-blank line.
    #[test]
    fn read_records_never_panics(lines in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let lines: Vec<Vec<u8>> = lines.into_iter().map(|l| l.into_iter().filter(|&b| b != b'\n').collect()).collect();
        let data = lines.join(&b'\n');
        let recs = read_records(&data[..]).expect("reading a slice cannot fail");
        let expected = lines.iter().filter(|l| !l.iter().all(u8::is_ascii_whitespace)).count();
        prop_assert_eq!(recs.len(), expected);
    }

    /// A record survives a JSON round trip through the miner's field names.
    #[test]
    fn record_round_trip(tokens in prop::collection::vec(0u32..49152, 2..40), temp in 0.0f32..2.0, reward in 0.0f32..1.0) {
        let n = tokens.len();
        let v = json!({
            "env": "sat", "task_id": 7u64, "group": 1, "rollout": 2, "window_seed": "00".repeat(32),
            "miner": "ab".repeat(32), "model": null, "temperature": temp, "tokens": tokens,
            "prompt_len": 1, "logprobs": vec![-0.5f32; n - 1], "sketches": vec![3u32; n],
            "eog": false, "completion": "", "reward": reward,
        });
        let recs = read_records(v.to_string().as_bytes()).expect("read");
        let rec = recs[0].1.as_ref().expect("parses");
        prop_assert_eq!(&rec.tokens, &tokens);
        prop_assert_eq!(rec.temperature, temp);
        prop_assert_eq!(rec.reward, reward);
        prop_assert_eq!(rec.sketches.len(), n);
    }
}

/// Issue 19 item 7: records generated at another difficulty carry it, and
/// the check reads it without being told (`--difficulty` is not repeated);
/// a flag still overrides the record.
#[test]
fn records_carry_the_settings_they_were_generated_with() -> Result<()> {
    let f = fixture();
    let mut records = make_records(&f.model, &Environment::Arith(ArithEnv::new(102)), 1)?;
    for r in &mut records {
        r["settings"] = json!({
            "env": "arith", "difficulty": 102, "data": null, "dataset": null,
            "temperature": TEMPERATURE, "max_new_tokens": MAX_NEW, "seed": SEED,
        });
    }
    let n = records.len();
    let dir = tempfile::tempdir()?;
    let path = write_jsonl(dir.path(), &lines_of(&records))?;
    let mut opts = CheckOptions::new(f.model.clone(), path, SEED);
    opts.threads = Some(1);
    let mut out = Vec::new();
    let s = run_check(&opts, &mut out)?;
    let text = String::from_utf8(out)?;
    assert_eq!((s.accepted, s.rejected), (n, 0), "{text}");

    // The flag overrides the record: difficulty 3 is not what these were generated at.
    opts.difficulty = Some(3);
    let mut out = Vec::new();
    let s = run_check(&opts, &mut out)?;
    let text = String::from_utf8(out)?;
    assert_eq!((s.accepted, s.rejected), (0, n), "{text}");
    assert!(text.contains("Prompt (Hard)"), "{text}");

    // A record generated with another seed says so.
    records[0]["settings"]["seed"] = json!(SEED + 1);
    let path = write_jsonl(dir.path(), &lines_of(&records))?;
    let mut out = Vec::new();
    run_check(&CheckOptions { rollouts: path, difficulty: None, ..opts }, &mut out)?;
    let text = String::from_utf8(out)?;
    assert!(text.lines().next().is_some_and(|l| l.contains("generated with seed 43")), "{text}");
    Ok(())
}

/// A GSM8K record names its data file and the file's blake3: the check
/// loads that file without `--data`, and refuses a different one.
#[test]
fn records_name_their_data_file() -> Result<()> {
    let f = fixture();
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("gsm8k.jsonl");
    let text = "{\"question\": \"What is 2 + 3?\", \"answer\": \"2 + 3 = 5 #### 5\"}\n\
                {\"question\": \"What is 7 * 6?\", \"answer\": \"7 * 6 = 42 #### 42\"}\n";
    std::fs::write(&data, text)?;
    let env = Environment::Gsm8k(Gsm8kEnv::from_jsonl(text)?);
    let mut records = make_records(&f.model, &env, 1)?;
    for r in &mut records {
        r["settings"] = json!({
            "env": "gsm8k", "difficulty": 0, "data": data, "dataset": blake3::hash(text.as_bytes()).to_hex().as_str(),
            "temperature": TEMPERATURE, "max_new_tokens": MAX_NEW, "seed": SEED,
        });
    }
    let n = records.len();
    let path = write_jsonl(dir.path(), &lines_of(&records))?;
    let mut opts = CheckOptions::new(f.model.clone(), path, SEED);
    opts.threads = Some(1);
    let mut out = Vec::new();
    let s = run_check(&opts, &mut out)?;
    assert_eq!((s.accepted, s.rejected), (n, 0), "{}", String::from_utf8_lossy(&out));

    // Another file under --data is not the dataset the records were generated from.
    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, text.replace("#### 42", "#### 43"))?;
    opts.data = Some(other);
    let err = run_check(&opts, &mut Vec::new()).err().context("a different data file must be refused")?;
    assert!(err.to_string().contains("not the dataset"), "{err}");
    Ok(())
}

#[test]
fn verdict_lines_name_the_failing_figures() {
    let v = LineVerdict::Malformed { line: 3, reason: "x".to_owned() };
    assert!(!v.accepted());
    assert_eq!(v.render(), "line 3: rejected: malformed: x");
}
