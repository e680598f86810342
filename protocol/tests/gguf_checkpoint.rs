//! Checkpoints: base BF16 conversion of the real SmolLM2 Q4_1 file, content
//! ids, and the tiny model.

use tributary_assets as assets;
use tributary_protocol::checkpoint::{Checkpoint, ContentId, FILE_TYPE_MOSTLY_BF16, convert_to_bf16};
use tributary_protocol::gguf::{GgmlType, GgufWriter, MetaValue, parse_header};
use tributary_protocol::tiny;

fn q4_1() -> Checkpoint {
    Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 Q4_1 file (run scripts/setup.sh)")
}

#[test]
fn real_file_config() {
    let c = q4_1();
    let cfg = c.config();
    assert_eq!(
        (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_head_kv, cfg.d_ff, cfg.vocab_size),
        (30, 576, 9, 3, 1536, 49152)
    );
    assert_eq!(cfg.rope_theta, 100_000.0);
    assert_eq!(cfg.context_length, 8192);
    assert!(c.tied_embeddings());
    // Which types does the file hold? Q8_0 embedding, Q4_1 matrices, F32 norms.
    let mut types: Vec<GgmlType> = c.header().tensors.iter().map(|t| t.ty).collect();
    types.sort();
    types.dedup();
    assert_eq!(types, vec![GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]);
}

#[test]
fn base_conversion_is_exact_and_stable() {
    let src = q4_1();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    let id_a = convert_to_bf16(&src, &a).unwrap();
    let id_b = convert_to_bf16(&src, &b).unwrap();
    assert_eq!(id_a, id_b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    let out = Checkpoint::open(&a).unwrap();
    assert_eq!(out.content_id(), id_a);
    assert_eq!(out.config(), src.config());
    assert!(out.tied_embeddings());
    assert_eq!(out.header().get_u32("general.file_type"), Some(FILE_TYPE_MOSTLY_BF16));
    // All metadata but file_type is kept, in order.
    let keys = |c: &Checkpoint| c.header().metadata.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&out), keys(&src));
    for (k, v) in &src.header().metadata {
        if k != "general.file_type" {
            assert_eq!(out.header().get(k), Some(v), "{k}");
        }
    }
    assert!(out.header().get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));
    // Every tensor: same name/dims/order; matrices are BF16 equal to the
    // dequantized source rounded to nearest-even; norms are the same F32.
    assert_eq!(out.header().tensors.len(), src.header().tensors.len());
    for (t, s) in out.header().tensors.iter().zip(&src.header().tensors) {
        assert_eq!((&t.name, &t.dims), (&s.name, &s.dims));
        let want = src.tensor_f32(&s.name).unwrap();
        let got = out.tensor_bytes(&t.name).unwrap();
        if s.dims.len() == 2 {
            assert_eq!(t.ty, GgmlType::BF16, "{}", t.name);
            for (i, (x, c)) in want.iter().zip(got.chunks_exact(2)).enumerate() {
                let bits = u16::from_le_bytes([c[0], c[1]]);
                assert_eq!(bits, half::bf16::from_f32(*x).to_bits(), "{}[{i}]", t.name);
            }
        } else {
            assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
            assert_eq!(got, src.tensor_bytes(&s.name).unwrap());
        }
    }
    // Dequantized values look like a trained model, not garbage.
    let emb = out.tensor_f32("token_embd.weight").unwrap();
    let rms = (emb.iter().map(|x| (x * x) as f64).sum::<f64>() / emb.len() as f64).sqrt();
    assert!(rms > 0.01 && rms < 1.0, "embedding rms {rms}");
}

#[test]
fn content_id_ignores_order_padding_and_irrelevant_keys() {
    let src = q4_1();
    let t = tiny::tiny_checkpoint_bytes(5, &src).unwrap();
    let base = Checkpoint::from_bytes(t.clone()).unwrap();
    let id = base.content_id();
    assert_eq!(id.to_string().len(), 64);
    assert_eq!(id.to_string().parse::<ContentId>().unwrap(), id);
    assert!("xyz".parse::<ContentId>().is_err());

    let h = parse_header(&t).unwrap();
    type Edit<'a> = &'a dyn Fn(&mut Vec<(String, MetaValue)>, &mut Vec<usize>);
    let rebuild = |f: Edit<'_>| {
        let mut meta = h.metadata.clone();
        let mut order: Vec<usize> = (0..h.tensors.len()).collect();
        f(&mut meta, &mut order);
        let mut w = GgufWriter::new();
        for (k, v) in meta {
            w.set_meta(&k, v);
        }
        for i in order {
            let ti = &h.tensors[i];
            w.add_tensor(&ti.name, ti.ty, &ti.dims, &t[h.tensor_range(ti)]).unwrap();
        }
        Checkpoint::from_bytes(w.to_bytes().unwrap()).unwrap().content_id()
    };
    // Reordered metadata and tensors, other alignment, renamed model: same id.
    assert_eq!(rebuild(&|_, _| {}), id);
    assert_eq!(
        rebuild(&|m, o| {
            m.reverse();
            o.reverse();
        }),
        id
    );
    assert_eq!(rebuild(&|m, _| m.push(("general.alignment".into(), MetaValue::U32(64)))), id);
    assert_eq!(rebuild(&|m, _| m[1].1 = MetaValue::Str("renamed".into())), id);
    // Hyperparameters, tokenizer and chat template matter.
    let set = |key: &'static str, v: MetaValue| {
        move |m: &mut Vec<(String, MetaValue)>, _: &mut Vec<usize>| {
            m.iter_mut().find(|(k, _)| k == key).unwrap().1 = v.clone();
        }
    };
    assert_ne!(rebuild(&set("llama.rope.freq_base", MetaValue::F32(10_000.0))), id);
    assert_ne!(rebuild(&set("tokenizer.chat_template", MetaValue::Str("{{x}}".into()))), id);
    assert_ne!(rebuild(&set("tokenizer.ggml.eos_token_id", MetaValue::U32(0))), id);
    // One flipped weight bit changes the id.
    let mut flipped = t.clone();
    let ti = h.tensor("blk.0.attn_q.weight").unwrap();
    flipped[h.tensor_range(ti).start + 10] ^= 1;
    assert_ne!(Checkpoint::from_bytes(flipped).unwrap().content_id(), id);
}

#[test]
fn tiny_model_is_deterministic_and_well_formed() {
    let src = q4_1();
    let a = tiny::tiny_checkpoint_bytes(42, &src).unwrap();
    let b = tiny::tiny_checkpoint_bytes(42, &src).unwrap();
    let c = tiny::tiny_checkpoint_bytes(43, &src).unwrap();
    assert!(a == b);
    let (ca, cc) = (Checkpoint::from_bytes(a).unwrap(), Checkpoint::from_bytes(c).unwrap());
    assert_ne!(ca.content_id(), cc.content_id());
    let cfg = ca.config();
    assert_eq!(
        (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_head_kv, cfg.d_ff, cfg.vocab_size),
        (2, 64, 4, 2, 128, 49152)
    );
    assert_eq!((cfg.rope_theta, cfg.context_length), (100_000.0, 2048));
    assert!(ca.tied_embeddings());
    for k in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.chat_template",
        "tokenizer.ggml.pre",
    ] {
        assert_eq!(ca.header().get(k), src.header().get(k), "{k}");
    }
    for t in &ca.header().tensors {
        let want = if t.dims.len() == 2 { GgmlType::BF16 } else { GgmlType::F32 };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    // Embedding rows have RMS ~1 (logit std ~ sqrt(d_model) after the final norm).
    let emb = ca.tensor_f32("token_embd.weight").unwrap();
    let rms = (emb.iter().map(|x| (x * x) as f64).sum::<f64>() / emb.len() as f64).sqrt();
    assert!((0.95..1.05).contains(&rms), "embedding rms {rms}");
    let norm = ca.tensor_f32("output_norm.weight").unwrap();
    assert!(norm.iter().all(|x| (0.7..1.3).contains(x)));
}

/// The tiny model's bytes are pinned: the same seed gives the same content
/// id on every machine.
#[test]
fn tiny_model_content_id_is_pinned() {
    let src = q4_1();
    let id = Checkpoint::from_bytes(tiny::tiny_checkpoint_bytes(0, &src).unwrap()).unwrap().content_id();
    assert_eq!(id.to_string(), PINNED_TINY_SEED0);
}

const PINNED_TINY_SEED0: &str = "536669d45273f3349914c060f3d61dfbb094019ca4ef21d05fa7c929cdcdd590";
