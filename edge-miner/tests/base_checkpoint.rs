//! The BF16 base checkpoint (written by `trainer init-base` from the shipped
//! Q4_1 file) loads in llama.cpp, answers a ChatML prompt coherently, starts
//! the same greedy continuation as the Q4_1 file, and generates
//! deterministically.

use edge_miner::backend::{Backend, DrawKey, GeneratedSeq, GroupRequest};
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use tributary_assets as assets;
use tributary_protocol::chat::chatml_prompt;
use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

fn greedy(backend: &mut LlamaCppBackend, tok: &Tokenizer, prompt: &[u32], n: usize) -> GeneratedSeq {
    let key = SketchKey::derive(&Seed([3; 32]), backend.hidden_size());
    let eog: Vec<u32> = tok.eog_ids().collect();
    let req = GroupRequest {
        prompt,
        group_size: 1,
        max_new_tokens: n,
        temperature: 0.0,
        draw: DrawKey { sampling_seed: Seed([1; 32]), miner: [2; 32], group: 0 },
        sketch_key: &key,
        sketch_params: SketchParams::DEFAULT,
        eog: &eog,
    };
    backend.generate_group(&req).expect("generate").remove(0)
}

#[test]
fn bf16_base_answers_and_matches_q4_1() {
    let bf16 = assets::smollm2_bf16();
    if !bf16.exists() {
        eprintln!("SKIPPED: {} does not exist yet (run `cargo run -p trainer -- init-base`)", bf16.display());
        return;
    }
    let tok = Tokenizer::from_gguf_file(&bf16).expect("tokenizer from the BF16 file");
    let q4_tok = Tokenizer::from_gguf_file(&assets::smollm2_q4_1()).unwrap();
    let text = chatml_prompt(Some("You are a helpful assistant."), "What is the capital of France?");
    let prompt = tok.encode(&text).unwrap();
    assert_eq!(prompt, q4_tok.encode(&text).unwrap(), "both files carry the same tokenizer");

    let mut base = LlamaCppBackend::load(&LlamaConfig { threads: 2, ..LlamaConfig::new(&bf16) }).expect("load BF16");
    let a = greedy(&mut base, &tok, &prompt, 24);
    let answer = tok.decode(&a.completion).unwrap();
    eprintln!("BF16 greedy answer: {answer:?}");
    assert!(answer.contains("Paris"), "answer {answer:?}");
    assert_eq!(a.sketches.len(), prompt.len() + a.completion.len());

    let b = greedy(&mut base, &tok, &prompt, 24);
    assert_eq!(a, b, "greedy generation is deterministic");
    drop(base);

    let mut q4 = LlamaCppBackend::load(&LlamaConfig { threads: 2, ..LlamaConfig::new(assets::smollm2_q4_1()) })
        .expect("load Q4_1");
    let q = greedy(&mut q4, &tok, &prompt, 24);
    let q_answer = tok.decode(&q.completion).unwrap();
    let common = a.completion.iter().zip(&q.completion).take_while(|(x, y)| x == y).count();
    eprintln!("Q4_1 greedy answer: {q_answer:?}; common prefix {common} tokens");
    assert!(common >= 4, "BF16 and Q4_1 greedy continuations diverge after {common} tokens");
}
