//! The model families (issue 30) on the miner, against an independent
//! oracle: Hugging Face `transformers` builds a tiny random-weight model of
//! the family from its config (`scripts/hf_oracle.py`, no download), the
//! project converts it to GGUF (`trainer::hf::import`), and the miner's
//! (llama.cpp, exact-F32 profile) log-probabilities agree with transformers'
//! and with the reference model's to ≤ 1e-4 over 1,040 positions × 32
//! vocabulary entries. (The trainer's side — reference, GRPO step, delta, HF
//! export — is `trainer/tests/hf_families.rs`.)
//!
//! Families: `llama` (SmolLM2's layout), `llama3` (Llama 3 RoPE frequency
//! scaling), `qwen2` (Q/K/V biases, NEOX RoPE), `qwen3` (q/k norms, head size
//! independent of the width, untied head). The oracle needs `transformers`
//! and `safetensors` in the project's venv (`.cache/venv`).
//!
//! Also without Python: the protocol's tiny model of each family runs
//! through `edge-miner generate` and `validator check` with every rollout
//! accepted (the whole proof: sampling draws, sketches, log-probs).

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;

use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use edge_miner::offline::{self, GenerateOptions, OfflineWindow};
use tch::{Device, Kind, Tensor};
use trainer::hf;
use tributary_assets as assets;
use tributary_policy::ReferenceModel;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::env::{ArithEnv, Environment};
use tributary_protocol::sketch::SketchParams;
use tributary_protocol::tiny::{self, TinyFamily};
use tributary_protocol::tokenizer::Tokenizer;
use tributary_tests::Mesh;

/// The bound of the issue: |Δ log p| against transformers.
const TOL: f64 = 1e-4;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

fn python() -> PathBuf {
    let venv = std::env::var_os("TRIBUTARY_VENV").map(PathBuf::from).unwrap_or_else(|| assets::home().join("venv"));
    venv.join("bin").join("python")
}

fn oracle(args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(repo().join("scripts/hf_oracle.py"))
        .args(args)
        .env("TRIBUTARY_CUDA_STUBS", assets::home().join("cuda-stubs"))
        .output()
        .expect("run scripts/hf_oracle.py with the project's venv");
    assert!(
        out.status.success(),
        "hf_oracle.py {args:?} failed (needs transformers and safetensors in the venv):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read_st(path: &Path) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(path).expect("read safetensors").into_iter().collect()
}

/// max |Δ| between `ours` (`[B, L, K]` log-probs) and the oracle's, and the count compared.
fn max_diff(ours: &Tensor, theirs: &Tensor) -> (f64, i64) {
    assert_eq!(ours.size(), theirs.size());
    ((ours.to_kind(Kind::Double) - theirs.to_kind(Kind::Double)).abs().max().double_value(&[]), theirs.numel() as i64)
}

/// The reference's log-probs of `ids` after each position of `tokens`.
fn reference_logprobs(model: &ReferenceModel, tokens: &Tensor, ids: &Tensor) -> Tensor {
    tch::no_grad(|| {
        let logits = model.forward(tokens).unwrap().logits;
        logits.to_kind(Kind::Double).log_softmax(-1, Kind::Double).gather(-1, ids, false)
    })
}

/// The miner's (llama.cpp) log-probs of `ids`, one teacher-forced replay per row.
fn miner_logprobs(path: &Path, tokens: &Tensor, ids: &Tensor) -> Tensor {
    let backend = LlamaCppBackend::load(&LlamaConfig { threads: 2, ..LlamaConfig::new(path) })
        .expect("llama.cpp loads the family");
    let (b, l, k) = (ids.size()[0], ids.size()[1], ids.size()[2]);
    let mut out = vec![0f64; (b * l * k) as usize];
    for r in 0..b {
        let row: Vec<i64> = Vec::try_from(tokens.get(r)).unwrap();
        let row: Vec<u32> = row.into_iter().map(|t| t as u32).collect();
        let want: Vec<i64> = Vec::try_from(ids.get(r).flatten(0, -1)).unwrap();
        backend
            .forward_each(&row, |pos, _hidden, logits| {
                let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lse = f64::from(m) + logits.iter().map(|&x| f64::from(x - m).exp()).sum::<f64>().ln();
                for j in 0..k as usize {
                    let id = want[pos * k as usize + j] as usize;
                    out[((r * l) as usize + pos) * k as usize + j] = f64::from(logits[id]) - lse;
                }
                Ok(())
            })
            .unwrap();
    }
    Tensor::from_slice(&out).reshape([b, l, k])
}

fn miner_against_transformers(arch: &str, expect_class: &str) {
    tributary_policy::init_threads(Some(2));
    let dir = tempfile::tempdir().unwrap();
    let hf_dir = dir.path().join("hf");
    let made = oracle(&["make", "--arch", arch, "--out", hf_dir.to_str().unwrap(), "--seed", "3"]);
    eprintln!("{arch}: {made}");
    assert!(made.contains(expect_class), "{made}");
    let st = read_st(&hf_dir.join("oracle.safetensors"));
    let (tokens, ids, want) = (&st["tokens"], &st["ids"], &st["logprobs"]);

    // Convert (the project's own converter), then load as every role does.
    let gguf = dir.path().join(format!("{arch}.gguf"));
    let smol = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF (scripts/setup.sh)");
    hf::import(&hf_dir, &smol, &gguf, hf::ImportOptions::default()).unwrap();
    let ckpt = Checkpoint::open(&gguf).unwrap();
    eprintln!("{arch}: {:?}", ckpt.config());

    let reference = ReferenceModel::load(&ckpt, Device::Cpu).unwrap();
    let ours = reference_logprobs(&reference, tokens, ids);
    let (d_ref, n) = max_diff(&ours, want);
    let miner = miner_logprobs(&gguf, tokens, ids);
    let (d_miner, _) = max_diff(&miner, want);
    let (d_mr, _) = max_diff(&miner, &ours);
    let spread = want.std(true).double_value(&[]);
    eprintln!(
        "{arch}: {} positions x {} ids: max |Δ log p| reference-transformers {d_ref:.2e}, miner-transformers {d_miner:.2e}, miner-reference {d_mr:.2e} (log p std {spread:.2})",
        tokens.numel(),
        ids.size()[2]
    );
    assert!(tokens.numel() >= 1000 && n >= 1000);
    assert!(spread > 1.0, "the oracle model is too flat to tell families apart (std {spread})");
    assert!(d_ref <= TOL, "{arch}: reference vs transformers {d_ref:.2e}");
    assert!(d_miner <= TOL, "{arch}: llama.cpp vs transformers {d_miner:.2e}");
}

#[test]
fn miner_llama_against_transformers() {
    miner_against_transformers("llama", "LlamaForCausalLM");
}

#[test]
fn miner_llama3_rope_scaling_against_transformers() {
    miner_against_transformers("llama3", "LlamaForCausalLM");
}

#[test]
fn miner_qwen2_against_transformers() {
    miner_against_transformers("qwen2", "Qwen2ForCausalLM");
}

#[test]
fn miner_qwen3_against_transformers() {
    miner_against_transformers("qwen3", "Qwen3ForCausalLM");
}

/// Every family's tiny model: rollouts generated by the miner pass the
/// validator's whole check (the proof contract, calibrated on SmolLM2, holds).
#[test]
fn every_family_generates_rollouts_the_validator_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let src = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF");
    for family in [TinyFamily::Llama3, TinyFamily::Qwen2, TinyFamily::Qwen3] {
        let model = dir.path().join(format!("tiny-{}.gguf", family.name()));
        tiny::write_tiny_family(family, 4, &src, &model).unwrap();
        let tokenizer = Tokenizer::from_gguf_file(&model).unwrap();
        let mut backend = LlamaCppBackend::load(&LlamaConfig { threads: 1, ..LlamaConfig::new(&model) }).unwrap();
        let seed = 17;
        let window = OfflineWindow::from_seed(seed);
        let env = Environment::Arith(ArithEnv::new(102));
        let opts = GenerateOptions {
            first_task: 0,
            tasks: 2,
            group: 3,
            max_new_tokens: 48,
            temperature: 1.0,
            sketch_params: SketchParams::DEFAULT,
        };
        let job =
            offline::Job { tokenizer: &tokenizer, env: &env, model: None, data: None, window: &window, opts: &opts };
        let out = dir.path().join(format!("{}.jsonl", family.name()));
        let file = std::fs::File::create(&out).unwrap();
        offline::generate(&mut backend, &job, offline::jsonl_sink(BufWriter::new(file)), |_| {}).unwrap();

        let mut check = validator::check::CheckOptions::new(model.clone(), out, seed);
        check.threads = Some(1);
        let mut report = Vec::new();
        let summary = validator::check::run_check(&check, &mut report).unwrap();
        let report = String::from_utf8(report).unwrap();
        eprintln!("{}: {summary:?}", family.name());
        assert_eq!((summary.accepted, summary.rejected), (6, 0), "{}: {report}", family.name());
    }
}

/// A mesh on another family (issue 30): the coordinator's genesis is the
/// tiny `qwen2` model (`trainer init-tiny --family qwen2`: Q/K/V biases, NEOX
/// RoPE, the `qwen2` pre-tokenizer), an honest miner and a prefix-editing
/// one mine on llama.cpp, the validator proves every rollout on the libtorch
/// reference, and the trainer trains on the verified windows with GRPO and
/// publishes a sparse delta that the honest miner then generates with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen2_mesh_window_mines_proves_and_publishes_a_delta() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2.gguf");
    let src = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 GGUF");
    tiny::write_tiny_family(TinyFamily::Qwen2, 5, &src, &model).unwrap();
    let cfg = *Checkpoint::open(&model).unwrap().config();
    assert!(cfg.qkv_bias && cfg.arch.rope_neox(), "{cfg:?}");
    mesh_trains_on(&model, &MeshRun { label: "tiny qwen2", window_ms: 4_000, grace_ms: 600, ..MeshRun::DEFAULT }).await;
}

/// How [`mesh_trains_on`] runs a network on a model.
struct MeshRun {
    /// Printed before each figure.
    label: &'static str,
    /// Window length and submission grace.
    window_ms: u64,
    grace_ms: u64,
    /// Completion tokens per rollout.
    max_new_tokens: u32,
    /// llama.cpp threads of each miner.
    miner_threads: usize,
    /// Whether a prefix-editing miner mines beside the honest one.
    editor: bool,
    /// Bound on each wait (the validator's first report, each publication,
    /// the honest miner's submission on the delta), seconds.
    wait_s: u64,
    /// Bound on each service's stop in the end ([`Mesh::stop_within`]): a
    /// 135M or 0.5B GRPO step, proof or group in progress ends first.
    stop_s: u64,
}

impl MeshRun {
    const DEFAULT: MeshRun = MeshRun {
        label: "",
        window_ms: 4_000,
        grace_ms: 600,
        max_new_tokens: 16,
        miner_threads: 1,
        editor: true,
        wait_s: 180,
        stop_s: 60,
    };
}

/// A network on `model` (coordinator, an honest miner, optionally a
/// prefix-editing one, the validator, the trainer; arith at the practice
/// level, 2 groups of 4 a miner): the validator proves the honest miner's
/// whole window valid (and the editor's with a hard failure), the trainer
/// trains on verified windows and publishes in full, then a sparse delta over
/// that, and the honest miner submits rollouts generated with the delta's
/// checkpoint. Prints when each step was reached.
async fn mesh_trains_on(model: &Path, run: &MeshRun) {
    use edge_miner::adversary::{self, Attack, AttackOptions};
    use edge_miner::run::{RunEvent, llama_loader};
    use tributary_protocol::env::PRACTICE_LEVEL;
    use tributary_protocol::wire::MinerStanding;
    use tributary_tests::{MeshConfig, MinerSpec, NetConfig};

    let label = run.label;
    let t0 = std::time::Instant::now();
    let mut honest = MinerSpec::honest("honest");
    honest.loader = Some(llama_loader(run.miner_threads, 0));
    let mut miners = vec![honest];
    if run.editor {
        let opts = AttackOptions { threads: run.miner_threads, ..AttackOptions::default() };
        let attack = adversary::setup(Attack::PrefixEdit, &opts).unwrap();
        let mut editor = MinerSpec::boxed("prefix-editor", attack.tamper, attack.loader);
        if editor.loader.is_none() {
            editor.loader = Some(llama_loader(run.miner_threads, 0));
        }
        miners.push(editor);
    }
    let net = NetConfig {
        max_new_tokens: run.max_new_tokens,
        difficulty: PRACTICE_LEVEL,
        ..NetConfig::new(run.window_ms, run.grace_ms, 2, 4)
    };
    let mut mesh =
        Mesh::start_with_model(MeshConfig { net, miners, trainer: true, validator: true }, Some(model)).await;
    eprintln!("{label}: network up at {:.1} s", t0.elapsed().as_secs_f64());
    let honest = mesh.miners[0].key.public();
    let editor = run.editor.then(|| mesh.miners[1].key.public());

    // A window in which the validator proved every miner.
    let r = mesh
        .validator()
        .until(run.wait_s, |r| r.miners.contains_key(&honest) && editor.is_none_or(|e| r.miners.contains_key(&e)))
        .await;
    let h = &r.miners[&honest].body;
    assert!(h.checked > 0 && h.valid == h.checked && !h.hard_failure, "honest miner on {label}: {h:?}");
    if let Some(e) = editor {
        let e = &r.miners[&e].body;
        assert!(e.hard_failure && e.estimated_valid == 0, "prefix editor on {label}: {e:?}");
    }
    assert!(mesh.net.node.shared.core().standing(r.window).contains(&(honest, MinerStanding::Passed)));
    eprintln!(
        "{label}: window {} proven at {:.1} s (honest {}/{} valid)",
        r.window,
        t0.elapsed().as_secs_f64(),
        h.valid,
        h.checked
    );

    // The trainer trains on verified windows and publishes: in full first
    // (a publisher's first payload), then a sparse delta over that.
    let trainer = mesh.trainer.as_mut().expect("trainer");
    let (windows, window, first) = trainer.next_published(run.wait_s).await;
    eprintln!(
        "{label}: trained on windows {windows:?}, published {first} for window {window} (full) at {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let (windows, window, id) = trainer.next_published(run.wait_s).await;
    eprintln!(
        "{label}: trained on windows {windows:?}, published {id} for window {window} at {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(!windows.is_empty());
    let entry = mesh.net.node.shared.relay.entry(&id).expect("the relay has the publication");
    let (base, delta_len, _) = entry.delta.expect("the second publication is a delta");
    assert_eq!(base, first, "the delta is over the previous publication");
    assert!(delta_len > 0 && delta_len < entry.full_len, "delta {delta_len} bytes, full {}", entry.full_len);
    eprintln!("{label}: delta {delta_len} bytes of a {}-byte checkpoint", entry.full_len);
    // The honest miner applies the delta and generates with its result.
    mesh.miners[0]
        .wait_for(run.wait_s, |ev| matches!(ev, RunEvent::Submitted { checkpoint, .. } if *checkpoint == id))
        .await;
    eprintln!("{label}: honest miner submitted on the delta at {:.1} s", t0.elapsed().as_secs_f64());
    mesh.stop_within(run.stop_s).await;
}

const PASSAGE: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
How many clips did Natalia sell altogether in April and May? Natalia sold 48/2 = 24 clips in May. \
Natalia sold 48+24 = 72 clips altogether in April and May. The answer is 72. Weng earns $12 an hour \
for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?";

/// SmolLM2-135M transplanted to `layout` (`trainer transplant`, default biases) in `dir`.
fn transplanted(dir: &Path, name: &str, layout: trainer::transplant::Layout) -> PathBuf {
    use trainer::transplant::{DEFAULT_BIAS_STD, TransplantOptions, transplant};
    let src = Checkpoint::open(&assets::smollm2_bf16()).expect("the BF16 SmolLM2 base (trainer init-base)");
    let model = dir.join(format!("smollm2-{name}.gguf"));
    transplant(&src, &TransplantOptions { layout, seed: 1, bias_std: DEFAULT_BIAS_STD }, &model).unwrap();
    model
}

/// SmolLM2-135M's trained weights transplanted to the `qwen2`, `llama3` and
/// `qwen3` layouts: llama.cpp (exact-F32 profile) and the reference agree on
/// a 116-token GSM8K passage within 1e-4 (SmolLM2's own honest worst is
/// 6.8e-5, `VerifyParams::DEFAULT`), on a model that predicts text.
#[test]
fn transplanted_smollm2_llama_cpp_matches_the_reference() {
    use trainer::transplant::Layout;
    tributary_policy::init_threads(Some(2));
    let dir = tempfile::tempdir().unwrap();
    for (name, layout) in [("qwen2", Layout::Qwen2), ("llama3", Layout::Llama3), ("qwen3", Layout::Qwen3)] {
        let model = transplanted(dir.path(), name, layout);
        let ckpt = Checkpoint::open(&model).unwrap();
        let ids: Vec<i64> =
            Tokenizer::from_gguf_file(&model).unwrap().encode(PASSAGE).unwrap().into_iter().map(i64::from).collect();
        assert!(ids.len() >= 64);
        let tokens = Tensor::from_slice(&ids).unsqueeze(0);
        let next: Vec<i64> = ids[1..].iter().copied().chain([ids[0]]).collect();
        let next = Tensor::from_slice(&next).view([1, -1, 1]);
        let reference = ReferenceModel::load(&ckpt, Device::Cpu).unwrap();
        let want = reference_logprobs(&reference, &tokens, &next);
        drop(reference);
        let (d, n) = max_diff(&miner_logprobs(&model, &tokens, &next), &want);
        let mean = want.narrow(1, 0, n - 1).mean(Kind::Double).double_value(&[]);
        eprintln!(
            "{name} (SmolLM2 transplanted): {n} positions, mean log p {mean:.3}, max |Δ log p| llama.cpp-reference {d:.2e}"
        );
        assert!(d <= TOL, "{name}: llama.cpp vs reference {d:.2e}");
        assert!(mean > -3.5, "{name}: the transplant does not predict text (mean log p {mean})");
    }
}

/// A mesh on SmolLM2-135M's trained weights re-expressed in another family's
/// layout (`trainer transplant`), as the tiny `qwen2` mesh above: an honest
/// miner proven valid and a prefix-editing one caught, a GRPO publication in
/// full, a sparse delta, and the honest miner generating with the delta.
/// Runs by default (issue 30 names it; 120 s on two quiet cores); the
/// `llama3` twin below is ignored to keep CI's time (docs/model-families.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transplanted_qwen2_mesh_window_mines_proves_and_publishes_a_delta() {
    transplanted_mesh("qwen2", trainer::transplant::Layout::Qwen2, "smollm2 as qwen2").await;
}

/// The same on the `llama3` transplant (Llama 3 RoPE frequency scaling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "135M mesh, minutes on two cores: cargo test -p tributary-tests --features edge-miner/wgpu --test families -- --ignored transplanted_llama3_mesh"]
async fn transplanted_llama3_mesh_window_mines_proves_and_publishes_a_delta() {
    transplanted_mesh("llama3", trainer::transplant::Layout::Llama3, "smollm2 as llama3").await;
}

/// The same on the `qwen3` transplant (q/k norms, head size given apart from
/// the model width).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "135M mesh, minutes on two cores: cargo test -p tributary-tests --features edge-miner/wgpu --test families -- --ignored transplanted_qwen3_mesh"]
async fn transplanted_qwen3_mesh_window_mines_proves_and_publishes_a_delta() {
    transplanted_mesh("qwen3", trainer::transplant::Layout::Qwen3, "smollm2 as qwen3").await;
}

/// [`mesh_trains_on`] the 135M transplant in `layout`, with windows long
/// enough for 135M on two cores.
async fn transplanted_mesh(name: &str, layout: trainer::transplant::Layout, label: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let model = transplanted(dir.path(), name, layout);
    let run = MeshRun { label, window_ms: 20_000, grace_ms: 2_000, wait_s: 400, stop_s: 600, ..MeshRun::DEFAULT };
    mesh_trains_on(&model, &run).await;
}

/// The proof contract on the transplanted models: every honest rollout the
/// miner samples is accepted by the validator's whole check (SmolLM2 itself
/// as the control). Failed under protocol 7 on `qwen2`: 1 of 8 honest
/// 64-token arith rollouts (seed 23, group 0 rollout 2, a degenerate
/// completion with median token probability 0.008) was hard-rejected with
/// `TooManyAmbiguous { ambiguous: 20, total: 64, max: 13 }`: a fixed share
/// of the length is no bound for a flat completion, where most tokens have
/// probability below 2ε. Protocol 8 caps the count against what the tokens
/// make honest (`AmbiguityCap`), and all three pass 8/8; the `qwen3`
/// transplant (measured q/k norms) too. About 4 minutes on two cores.
#[test]
fn transplanted_smollm2_rollouts_pass_the_validator() {
    use trainer::transplant::Layout;
    let dir = tempfile::tempdir().unwrap();
    let mut models = vec![("smollm2 (control)".to_owned(), assets::smollm2_bf16())];
    for (name, layout) in [("qwen2", Layout::Qwen2), ("llama3", Layout::Llama3), ("qwen3", Layout::Qwen3)] {
        models.push((name.to_owned(), transplanted(dir.path(), name, layout)));
    }
    let mut rejected = Vec::new();
    for (name, model) in &models {
        let tokenizer = Tokenizer::from_gguf_file(model).unwrap();
        let mut backend = LlamaCppBackend::load(&LlamaConfig { threads: 2, ..LlamaConfig::new(model) }).unwrap();
        let seed = 23;
        let window = OfflineWindow::from_seed(seed);
        let env = Environment::Arith(ArithEnv::new(102));
        let opts = GenerateOptions {
            first_task: 0,
            tasks: 2,
            group: 4,
            max_new_tokens: 64,
            temperature: 1.0,
            sketch_params: SketchParams::DEFAULT,
        };
        let job =
            offline::Job { tokenizer: &tokenizer, env: &env, model: None, data: None, window: &window, opts: &opts };
        let out = dir.path().join(format!("{}.jsonl", rejected.len()));
        let file = std::fs::File::create(&out).unwrap();
        offline::generate(&mut backend, &job, offline::jsonl_sink(BufWriter::new(file)), |_| {}).unwrap();
        drop(backend);
        let mut check = validator::check::CheckOptions::new(model.to_path_buf(), out, seed);
        check.threads = Some(2);
        let mut report = Vec::new();
        let summary = validator::check::run_check(&check, &mut report).unwrap();
        let report = String::from_utf8(report).unwrap();
        eprintln!("{name}: {summary:?}");
        if summary.rejected > 0 {
            eprintln!("{report}");
        }
        rejected.push((name.clone(), summary.accepted, summary.rejected));
    }
    assert!(rejected.iter().all(|(_, a, r)| (*a, *r) == (8, 0)), "honest rollouts rejected: {rejected:?}");
}
