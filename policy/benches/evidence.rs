//! Reference-model throughput on one GRPO group (8 rollouts of one prompt):
//! the shared-prompt batch the validator uses, the same rollouts as one plain
//! right-padded batch, and the shared-prompt batch on the model held as BF16
//! (as the validator and the trainer's proof load a BF16 file). Compare with
//! the miner's generation time for the speed goal (verify ÷ generate ≤ 0.5).
//! `EVIDENCE_MODEL=FILE` benches another GGUF with SmolLM2's vocabulary.
// criterion_group! defines an undocumented `pub fn benches`.
#![allow(missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tributary_assets as assets;
use tributary_policy::{EvidenceRequest, ReferenceModel};
use tributary_protocol::tokenizer::Tokenizer;

const GROUP: usize = 8;

fn bench(c: &mut Criterion) {
    tributary_policy::init_threads(None);
    // EVIDENCE_MODEL: another GGUF with SmolLM2's vocabulary (the 0.5B-shape
    // model of docs/model-families.md); default the SmolLM2 BF16 base.
    let path = match std::env::var_os("EVIDENCE_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let bf16 = assets::smollm2_bf16();
            if bf16.exists() { bf16 } else { assets::smollm2_q4_1() }
        }
    };
    eprintln!("evidence bench: model {}", path.display());
    let model = ReferenceModel::open(&path, tributary_policy::default_device()).expect("model");
    let tok = Tokenizer::from_gguf_file(&assets::smollm2_q4_1()).expect("tokenizer");
    let prompt = tok
        .encode(
            "<|im_start|>system\nYou are a careful math assistant. Solve the problem step by step, then end your \
             response with a final line of the form \"Answer: <number>\".<|im_end|>\n<|im_start|>user\nA baker \
             sells 12 loaves a day at 3 dollars each. How much does she earn in a week?<|im_end|>\n\
             <|im_start|>assistant\n",
        )
        .expect("encode");
    let body = tok
        .encode(
            "She sells 12 loaves a day and each costs 3 dollars, so she earns 12 * 3 = 36 dollars a day. \
             A week has 7 days, so in a week she earns 36 * 7 = 252 dollars. ",
        )
        .expect("encode");
    // Completions of 150..220 tokens, as GSM8K answers are.
    let seqs: Vec<Vec<u32>> = (0..GROUP)
        .map(|i| {
            let n = 150 + 10 * i;
            prompt.iter().copied().chain(body.iter().copied().cycle().take(n)).chain([2]).collect()
        })
        .collect();
    let tokens: usize = seqs.iter().map(Vec::len).sum();
    let hidden: Vec<Vec<usize>> = seqs.iter().map(|s| (prompt.len()..s.len()).step_by(8).collect()).collect();
    let reqs: Vec<EvidenceRequest<'_>> = seqs
        .iter()
        .zip(&hidden)
        .map(|(s, h)| EvidenceRequest {
            tokens: s,
            prompt_len: prompt.len(),
            temperature: 0.7,
            eos: 2,
            hidden_positions: h,
        })
        .collect();
    let mut g = c.benchmark_group("evidence");
    g.sample_size(10);
    g.throughput(Throughput::Elements(tokens as u64));
    g.bench_function("group_of_8_shared_prompt", |b| b.iter(|| model.evidence(&reqs).expect("evidence")));
    // Same work with the shared-prompt path defeated: each request alone
    // would lose batching, so perturb one prompt token per rollout instead.
    let distinct: Vec<Vec<u32>> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s[1] = 100 + i as u32;
            s
        })
        .collect();
    let reqs2: Vec<EvidenceRequest<'_>> =
        distinct.iter().zip(&reqs).map(|(s, r)| EvidenceRequest { tokens: s, ..*r }).collect();
    g.bench_function("group_of_8_padded_batch", |b| b.iter(|| model.evidence(&reqs2).expect("evidence")));
    // The same group after its system prompt's keys and values, kept from an
    // earlier group (`prefix_for`, as the validator and the trainer's proof
    // run every group after the first): one packed row of the question and
    // the completions, no padding.
    // `<|im_start|>` (id 1) opens the user turn after the system turn.
    let system = prompt.iter().skip(1).position(|&t| t == 1).expect("a user turn") + 1;
    let kept = model.prefix_cache(&prompt[..system]).expect("prefix");
    g.bench_function("group_of_8_after_kept_system_prompt", |b| {
        b.iter(|| model.evidence_drawn_after(Some(&kept), &reqs, &[]).expect("evidence"))
    });
    // The same group on the model as the validator and the trainer's proof
    // hold it (`load_for_inference`): BF16 matrices widened to f32 for each
    // product when the file is BF16 (half the memory, the same bits).
    let ckpt = tributary_protocol::checkpoint::Checkpoint::open(&path).expect("checkpoint");
    if ReferenceModel::can_hold_bf16(&ckpt) {
        let held = ReferenceModel::load_for_inference(&ckpt, tributary_policy::default_device()).expect("model");
        g.bench_function("group_of_8_shared_prompt_bf16_held", |b| b.iter(|| held.evidence(&reqs).expect("evidence")));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
