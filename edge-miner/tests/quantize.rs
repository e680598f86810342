//! llama.cpp's quantizer through `edge_miner::quantize`: BF16 base → Q4_0
//! (the "cheaper model" an adversarial miner would run) still loads and answers.

use edge_miner::backend::{Backend, DrawKey, GroupRequest};
use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use edge_miner::quantize::{FileType, quantize};
use tributary_assets as assets;
use tributary_protocol::chat::chatml_prompt;
use tributary_protocol::gguf::parse_header;
use tributary_protocol::prf::Seed;
use tributary_protocol::sketch::{SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

#[test]
fn bf16_to_q4_0_loads_and_generates() {
    let bf16 = assets::smollm2_bf16();
    if !bf16.exists() {
        eprintln!("SKIPPED: {} does not exist yet (run `cargo run -p trainer -- init-base`)", bf16.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q4_0.gguf");
    quantize(&bf16, &out, FileType::Q4_0, 1).expect("quantize");
    let bytes = std::fs::read(&out).unwrap();
    let header = parse_header(&bytes).unwrap();
    assert_eq!(header.get_u32("general.file_type"), Some(FileType::Q4_0.llama_ftype()));
    assert!(bytes.len() < std::fs::metadata(&bf16).unwrap().len() as usize / 2);

    let tok = Tokenizer::from_gguf_file(&out).unwrap();
    let mut backend = LlamaCppBackend::load(&LlamaConfig { threads: 1, ..LlamaConfig::new(&out) }).unwrap();
    let prompt =
        tok.encode(&chatml_prompt(Some("You are a helpful assistant."), "What is the capital of France?")).unwrap();
    let key = SketchKey::derive(&Seed([3; 32]), backend.hidden_size());
    let eog: Vec<u32> = tok.eog_ids().collect();
    let req = GroupRequest {
        prompt: &prompt,
        group_size: 1,
        max_new_tokens: 16,
        temperature: 0.0,
        draw: DrawKey { sampling_seed: Seed([1; 32]), miner: [2; 32], group: 0 },
        sketch_key: &key,
        sketch_params: SketchParams::DEFAULT,
        eog: &eog,
    };
    let seq = backend.generate_group(&req).unwrap().remove(0);
    let text = tok.decode(&seq.completion).unwrap();
    eprintln!("Q4_0 greedy answer: {text:?}");
    assert!(text.contains("Paris"), "{text:?}");

    // a missing input is a typed error, not a crash
    assert!(quantize(&dir.path().join("missing.gguf"), &dir.path().join("x.gguf"), FileType::Q4_0, 1).is_err());
}
