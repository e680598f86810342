//! `trainer transplant` (issue 30, item 3): SmolLM2-135M's trained weights
//! re-expressed in the `qwen2` and `llama3` layouts. With zero biases the
//! `qwen2` file computes SmolLM2's function through the other graph (Q/K
//! rows un-permuted for NEOX RoPE), which checks the layout change; with the
//! default seeded biases, and under Llama 3's frequency scaling, it still
//! predicts text as well as SmolLM2 does (a trained model, not noise).

use std::path::Path;

use tch::{Device, Kind, Tensor};
use trainer::transplant::{DEFAULT_BIAS_STD, Layout, TransplantError, TransplantOptions, transplant};
use tributary_assets as assets;
use tributary_policy::ReferenceModel;
use tributary_protocol::checkpoint::{Arch, Checkpoint};
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

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn smollm2_transplanted_to_qwen2_and_llama3_behaves_as_trained() {
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

    // Bad input: a typed error and no file.
    let out = dir.path().join("refused.gguf");
    let again = Checkpoint::open(&qwen2).unwrap();
    let opts = TransplantOptions { layout: Layout::Llama3, seed: 0, bias_std: 0.0 };
    assert!(matches!(transplant(&again, &opts, &out), Err(TransplantError::Source(_))));
    let nan = TransplantOptions { layout: Layout::Qwen2, seed: 0, bias_std: f32::NAN };
    assert!(matches!(transplant(&src, &nan, &out), Err(TransplantError::BiasStd(_))));
    assert!(!out.exists());
}
