//! `trainer transplant` (issue 30, item 3): SmolLM2-135M's trained weights
//! re-expressed in the `qwen2`, `llama3` and `qwen3` layouts. With zero
//! biases the `qwen2` file computes SmolLM2's function through the other
//! graph (Q/K rows un-permuted for NEOX RoPE), which checks the layout
//! change; with the default seeded biases, and under Llama 3's frequency
//! scaling, it still predicts text as well as SmolLM2 does (a trained model,
//! not noise). `qwen3`'s per-head q/k RMSNorm changes the function whatever
//! its weights: norm weights alone lose 2.4 nats a token; with the heads
//! widened by dimensions that carry the RMS (`transplant` module doc) the
//! model predicts text within 0.11 nats of SmolLM2.

use std::path::Path;

use tch::{Device, Kind, Tensor};
use trainer::transplant::{
    DEFAULT_BIAS_STD, Layout, QWEN3_EXTRA_DIMS, TransplantError, TransplantOptions, qwen3_fit, transplant,
    transplant_with,
};
use tributary_assets as assets;
use tributary_policy::ReferenceModel;
use tributary_protocol::chat;
use tributary_protocol::checkpoint::{Arch, Checkpoint};
use tributary_protocol::env::NUMERIC_SYSTEM_PROMPT;
use tributary_protocol::tokenizer::Tokenizer;

const TEXT: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
How many clips did Natalia sell altogether in April and May? Natalia sold 48/2 = 24 clips in May. \
Natalia sold 48+24 = 72 clips altogether in April and May. The answer is 72. Weng earns $12 an hour \
for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?";

/// log p(token t+1 | tokens ..= t) under the reference model of `path`.
fn next_token_logprobs(path: &Path, tokens: &[i64]) -> Vec<f64> {
    let ckpt = Checkpoint::open(path).unwrap();
    let model = ReferenceModel::load(&ckpt, Device::Cpu).unwrap();
    tch::no_grad(|| {
        let input = Tensor::from_slice(tokens).unsqueeze(0);
        let lp = model.forward(&input).unwrap().logits.to_kind(Kind::Double).log_softmax(-1, Kind::Double);
        let next = Tensor::from_slice(&tokens[1..]).view([1, -1, 1]);
        let got = lp.narrow(1, 0, tokens.len() as i64 - 1).gather(-1, &next, false);
        Vec::try_from(got.flatten(0, -1)).unwrap()
    })
}

/// How far (nats per token) the `qwen3` transplant's mean log p may be from SmolLM2's.
const QWEN3_TOL: f64 = 0.2;

/// The GSM8K question of [`TEXT`], as a chat turn.
const QUESTION: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
How many clips did Natalia sell altogether in April and May?";

/// p(`token` | `prompt`) under the reference model of `path`.
fn first_token_prob(path: &Path, prompt: &[i64], token: i64) -> f64 {
    let model = ReferenceModel::load(&Checkpoint::open(path).unwrap(), Device::Cpu).unwrap();
    tch::no_grad(|| {
        let lp = model.forward(&Tensor::from_slice(prompt).unsqueeze(0)).unwrap().logits.to_kind(Kind::Double);
        lp.log_softmax(-1, Kind::Double).double_value(&[0, prompt.len() as i64 - 1, token]).exp()
    })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn smollm2_transplanted_to_qwen2_llama3_and_qwen3_behaves_as_trained() {
    tributary_policy::init_threads(Some(2));
    let base = assets::smollm2_bf16();
    let src = Checkpoint::open(&base).expect("the BF16 SmolLM2 base (trainer init-base)");
    let tokens: Vec<i64> =
        Tokenizer::from_checkpoint(&src).unwrap().encode(TEXT).unwrap().into_iter().map(i64::from).collect();
    assert!(tokens.len() >= 64, "{} tokens", tokens.len());
    let want = next_token_logprobs(&base, &tokens);
    eprintln!("SmolLM2: {} positions, mean log p {:.4}", want.len(), mean(&want));
    let dir = tempfile::tempdir().unwrap();
    let diff = |got: &[f64]| got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);

    // qwen2, no biases: SmolLM2's function through the qwen2 graph.
    let exact = dir.path().join("qwen2-exact.gguf");
    transplant(&src, &TransplantOptions { layout: Layout::Qwen2, seed: 0, bias_std: 0.0 }, &exact).unwrap();
    let c = *Checkpoint::open(&exact).unwrap().config();
    assert!(c.arch == Arch::Qwen2 && c.qkv_bias && c.arch.rope_neox(), "{c:?}");
    let d = diff(&next_token_logprobs(&exact, &tokens));
    eprintln!("qwen2, zero biases: max |Δ log p| vs SmolLM2 {d:.2e}");
    assert!(d <= 1e-4, "the qwen2 layout changed the function: {d}");

    // qwen2 with the default seeded biases, and llama3: trained behaviour.
    let qwen2 = dir.path().join("qwen2.gguf");
    transplant(&src, &TransplantOptions { layout: Layout::Qwen2, seed: 7, bias_std: DEFAULT_BIAS_STD }, &qwen2)
        .unwrap();
    let llama3 = dir.path().join("llama3.gguf");
    transplant(&src, &TransplantOptions { layout: Layout::Llama3, seed: 0, bias_std: 0.0 }, &llama3).unwrap();
    assert!(Checkpoint::open(&llama3).unwrap().config().rope_freqs);
    for (name, path) in [("qwen2 (default biases)", &qwen2), ("llama3", &llama3)] {
        let got = next_token_logprobs(path, &tokens);
        let (d, m) = (diff(&got), mean(&got));
        eprintln!("{name}: mean log p {m:.4} (SmolLM2 {:.4}), max |Δ log p| {d:.2e}", mean(&want));
        assert!(d > 1e-4, "{name}: the change did nothing ({d})");
        assert!((m - mean(&want)).abs() < 0.1, "{name}: mean log p {m} vs SmolLM2's {}", mean(&want));
    }

    // qwen3: heads widened by dimensions that carry the RMS, norms measured
    // on the source (other prompts than TEXT).
    let qwen3 = dir.path().join("qwen3.gguf");
    transplant(&src, &TransplantOptions { layout: Layout::Qwen3, seed: 0, bias_std: 0.0 }, &qwen3).unwrap();
    let q3 = Checkpoint::open(&qwen3).unwrap();
    let c = *q3.config();
    assert!(c.arch == Arch::Qwen3 && !c.qkv_bias && c.arch.qk_norm() && c.arch.rope_neox(), "{c:?}");
    let hd = src.config().head_dim() + QWEN3_EXTRA_DIMS;
    assert_eq!((c.key_length, c.head_dim()), (Some(hd), hd));
    let fit = qwen3_fit(&src, QWEN3_EXTRA_DIMS).unwrap();
    let norms = fit.iter().flat_map(|l| [l.norm_q, l.norm_k]);
    let (lo, hi) = norms.fold((f32::MAX, 0f32), |(a, b), x| (a.min(x), b.max(x)));
    eprintln!("qwen3: {} layers, head size {hd}, norm weights from {lo:.3} to {hi:.3}", fit.len());
    let qn = q3.tensor_f32("blk.0.attn_q_norm.weight").unwrap();
    let half = src.config().head_dim() / 2;
    assert!(qn[..half].iter().chain(&qn[hd / 2..hd / 2 + half]).all(|&w| w == fit[0].norm_q), "{qn:?}");
    assert!(qn[half..hd / 2].iter().chain(&qn[hd / 2 + half..]).all(|&w| w == 0.0), "{qn:?}");
    let got = next_token_logprobs(&qwen3, &tokens);
    let (d, m) = (diff(&got), mean(&got));
    eprintln!("qwen3: mean log p {m:.4} (SmolLM2 {:.4}), max |Δ log p| {d:.2e}", mean(&want));
    assert!((m - mean(&want)).abs() < QWEN3_TOL, "qwen3: mean log p {m} vs SmolLM2's {}", mean(&want));
    // In the chat format the answers start: the end of turn is as unlikely
    // before an answer's first token as under SmolLM2 (it was 0.10 when the
    // norms ignored the wider head's attention scale).
    let chat = chat::chatml_prompt(Some(NUMERIC_SYSTEM_PROMPT), QUESTION);
    let prompt: Vec<i64> =
        Tokenizer::from_checkpoint(&src).unwrap().encode(&chat).unwrap().into_iter().map(i64::from).collect();
    let eos = i64::from(Tokenizer::from_checkpoint(&src).unwrap().eos_id());
    let (p_src, p_q3) = (first_token_prob(&base, &prompt, eos), first_token_prob(&qwen3, &prompt, eos));
    eprintln!("p(end of turn) before the answer: SmolLM2 {p_src:.1e}, qwen3 {p_q3:.1e}");
    assert!(p_q3 < 1e-4, "qwen3 ends its answer at once with probability {p_q3}");
    // Norm weights alone (no added dimensions) cannot keep the queries' and
    // keys' norms: the widening is what makes the model predict text.
    let alone = dir.path().join("qwen3-alone.gguf");
    transplant_with(&src, &TransplantOptions { layout: Layout::Qwen3, seed: 0, bias_std: 0.0 }, 0, &alone).unwrap();
    let alone = mean(&next_token_logprobs(&alone, &tokens));
    eprintln!("qwen3, norm weights alone: mean log p {alone:.4}");
    assert!(alone < m - 1.0, "norms alone {alone} vs widened {m}");

    // Bad input: a typed error and no file.
    let out = dir.path().join("refused.gguf");
    let again = Checkpoint::open(&qwen2).unwrap();
    let opts = TransplantOptions { layout: Layout::Llama3, seed: 0, bias_std: 0.0 };
    assert!(matches!(transplant(&again, &opts, &out), Err(TransplantError::Source(_))));
    let nan = TransplantOptions { layout: Layout::Qwen2, seed: 0, bias_std: f32::NAN };
    assert!(matches!(transplant(&src, &nan, &out), Err(TransplantError::BiasStd(_))));
    assert!(!out.exists());
}
