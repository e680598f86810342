//! The trainer's proof holds the checkpoints it proves against in BF16 with
//! f32 arithmetic, as the miner does (issue 30 item 4): 2 bytes a parameter
//! instead of 4 (the trainer keeps the last `keep_checkpoints`, 3 by default,
//! beside its own f32 masters, gradients and AdamW moments), and the same
//! bits as a model held in f32.

use tch::{Device, Kind, Tensor};
use trainer::proof::{ProofConfig, Prover};
use tributary_assets as assets;
use tributary_protocol::checkpoint::Checkpoint;

#[test]
fn proof_checkpoints_are_held_at_two_bytes_a_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let genesis = tributary_protocol::dev::ensure_genesis(dir.path(), &assets::smollm2_q4_1())
        .expect("dev genesis (SmolLM2 GGUF: run scripts/setup.sh)");
    let ckpt = Checkpoint::open(&genesis).unwrap();
    let (mut matrices, mut vectors) = (0usize, 0usize);
    for t in &ckpt.header().tensors {
        if t.dims.len() >= 2 { matrices += t.n_elements() as usize } else { vectors += t.n_elements() as usize }
    }
    let mut prover = Prover::new(&genesis, ProofConfig::default()).unwrap();
    prover.load(ckpt.content_id(), &genesis).unwrap();
    let held = prover.held_bytes();
    assert_eq!(held, 2 * matrices + 4 * vectors, "{held} bytes for {matrices} matrix and {vectors} vector elements");
}

/// The BF16-held model computes the same bits as the f32-held one: the
/// forward (hidden states and logits), the shared-prefix forward the proof
/// batches a group with, and the proof's evidence.
#[test]
fn a_bf16_held_checkpoint_gives_the_f32_held_models_bits() {
    use tributary_policy::{EvidenceRequest, ReferenceModel};
    let dir = tempfile::tempdir().unwrap();
    let genesis = tributary_protocol::dev::ensure_genesis(dir.path(), &assets::smollm2_q4_1())
        .expect("dev genesis (SmolLM2 GGUF: run scripts/setup.sh)");
    let ckpt = Checkpoint::open(&genesis).unwrap();
    assert!(ReferenceModel::can_hold_bf16(&ckpt));
    let f32_held = ReferenceModel::load(&ckpt, Device::Cpu).unwrap();
    let bf16_held = ReferenceModel::load_bf16_held(&ckpt, Device::Cpu).unwrap();
    assert_eq!(2 * bf16_held.parameter_bytes() - f32_held.parameter_bytes(), {
        let vectors: u64 = ckpt.header().tensors.iter().filter(|t| t.dims.len() < 2).map(|t| t.n_elements()).sum();
        4 * vectors as usize
    });
    let same = |a: &Tensor, b: &Tensor, what: &str| {
        assert_eq!(a.kind(), Kind::Float, "{what}");
        assert!(a.equal(b), "{what}: max |diff| {}", (a - b).abs().max().double_value(&[]));
    };
    let tokens = Tensor::randint_low(0, 49152, [2, 37], (Kind::Int64, Device::Cpu));
    tch::no_grad(|| {
        let (a, b) = (f32_held.forward(&tokens).unwrap(), bf16_held.forward(&tokens).unwrap());
        same(&a.hidden, &b.hidden, "hidden");
        same(&a.logits, &b.logits, "logits");
        let (prefix, suffix) = (tokens.narrow(0, 0, 1).narrow(1, 0, 20), tokens.narrow(1, 20, 17));
        let (ap, as_) = f32_held.forward_hidden_shared_prefix(&prefix, &suffix).unwrap();
        let (bp, bs) = bf16_held.forward_hidden_shared_prefix(&prefix, &suffix).unwrap();
        same(&ap, &bp, "shared prefix");
        same(&as_, &bs, "continuations");
    });
    let seq: Vec<u32> = (0..40).map(|i| (i * 977 + 13) % 49152).collect();
    let positions = [12, 20, 39];
    let req = EvidenceRequest { tokens: &seq, prompt_len: 12, temperature: 0.7, eos: 2, hidden_positions: &positions };
    let (a, b) = (f32_held.evidence(&[req]).unwrap(), bf16_held.evidence(&[req]).unwrap());
    assert!(a == b, "evidence differs");
}
