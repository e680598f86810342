//! Architecture as data (issue 30): the model family and its settings come
//! from the GGUF metadata; an unknown family, a missing key, a tensor the
//! family does not use or a setting the project does not compute is a typed
//! error at load, never a silent fallback.

use tributary_assets as assets;
use tributary_protocol::checkpoint::{Arch, Checkpoint, CheckpointError};
use tributary_protocol::gguf::{GgmlType, GgufWriter, MetaValue};
use tributary_protocol::tiny::{self, TinyFamily};
use tributary_protocol::tokenizer::Tokenizer;

fn smol() -> Checkpoint {
    Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 Q4_1 file (run scripts/setup.sh)")
}

fn family(f: TinyFamily, seed: u64) -> Checkpoint {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    tiny::write_tiny_family(f, seed, &smol(), &path).unwrap();
    Checkpoint::from_bytes(std::fs::read(&path).unwrap()).unwrap()
}

/// A copy of `ck` through `edit`, which may change metadata and add tensors;
/// tensors named in `drop` are left out.
fn rewrite(ck: &Checkpoint, drop: &[&str], edit: impl FnOnce(&mut GgufWriter<'_>)) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in &ck.header().metadata {
        w.set_meta(k, v.clone());
    }
    for t in &ck.header().tensors {
        if !drop.contains(&t.name.as_str()) {
            w.add_tensor(&t.name, t.ty, &t.dims, ck.tensor_bytes(&t.name).unwrap().to_vec()).unwrap();
        }
    }
    edit(&mut w);
    w.to_bytes().unwrap()
}

#[test]
fn every_family_loads_with_the_settings_its_metadata_names() {
    let llama = family(TinyFamily::Llama, 0);
    assert_eq!(
        llama.bytes(),
        tiny::tiny_checkpoint_bytes(0, &smol()).unwrap().as_slice(),
        "the llama family is the tiny model, byte for byte"
    );
    let c = llama.config();
    assert_eq!((c.arch, c.head_dim(), c.qkv_bias, c.rope_freqs, c.key_length), (Arch::Llama, 16, false, false, None));

    let l3 = family(TinyFamily::Llama3, 0);
    let c = l3.config();
    assert_eq!((c.arch, c.head_dim(), c.qkv_bias, c.rope_freqs), (Arch::Llama, 16, false, true));
    let f = l3.tensor_f32("rope_freqs.weight").unwrap();
    // The three bands of Llama 3 scaling all occur: 1, blended, the factor 8.
    assert_eq!(f.len(), 8);
    assert_eq!(f[0], 1.0);
    assert!(f.iter().any(|&x| x > 1.0 && x < 8.0), "{f:?}");
    assert_eq!(*f.last().unwrap(), 8.0);

    let q2 = family(TinyFamily::Qwen2, 0);
    let c = q2.config();
    assert_eq!((c.arch, c.head_dim(), c.qkv_bias, c.rope_freqs), (Arch::Qwen2, 16, true, false));
    assert!(c.arch.rope_neox() && !c.arch.qk_norm());

    let q3 = family(TinyFamily::Qwen3, 0);
    let c = q3.config();
    assert_eq!((c.arch, c.head_dim(), c.q_dim(), c.d_model, c.qkv_bias), (Arch::Qwen3, 32, 128, 64, false));
    assert!(c.arch.rope_neox() && c.arch.qk_norm());
    assert_eq!(q3.tensor_info("blk.1.attn_output.weight").unwrap().dims, vec![128, 64]);

    // Each carries its family's pre-tokenizer, which the protocol tokenizer builds.
    for (ck, pre) in [(&l3, "llama-bpe"), (&q2, "qwen2"), (&q3, "qwen2")] {
        assert_eq!(ck.header().get_str("tokenizer.ggml.pre"), Some(pre));
        let tok = Tokenizer::from_checkpoint(ck).unwrap();
        assert_eq!(
            tok.decode(&tok.encode("Qwen's 12345 tokens\n\n  ok").unwrap()).unwrap(),
            "Qwen's 12345 tokens\n\n  ok"
        );
    }
    // Distinct families, distinct ids.
    let ids: std::collections::BTreeSet<_> = [&llama, &l3, &q2, &q3].iter().map(|c| c.content_id()).collect();
    assert_eq!(ids.len(), 4);
}

#[test]
fn the_content_id_covers_the_family_keys() {
    let q2 = family(TinyFamily::Qwen2, 1);
    let id = q2.content_id();
    let changed = rewrite(&q2, &[], |w| {
        w.set_meta("qwen2.rope.freq_base", MetaValue::F32(10_000.0));
    });
    assert_ne!(
        Checkpoint::from_bytes(changed).unwrap().content_id(),
        id,
        "qwen2.* keys change what the model computes"
    );
    let renamed = rewrite(&q2, &[], |w| {
        w.set_meta("general.name", MetaValue::Str("another name".into()));
    });
    assert_eq!(Checkpoint::from_bytes(renamed).unwrap().content_id(), id);
}

#[test]
fn unknown_families_missing_keys_and_foreign_tensors_are_typed_errors() {
    let q2 = family(TinyFamily::Qwen2, 2);
    let q3 = family(TinyFamily::Qwen3, 2);
    let llama = family(TinyFamily::Llama, 2);

    let bytes = rewrite(&q2, &[], |w| {
        w.set_meta("general.architecture", MetaValue::Str("gemma2".into()));
    });
    assert!(
        matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::UnknownArchitecture(Some(a))) if a == "gemma2")
    );

    // A key the family needs, named with its prefix.
    let bytes = rewrite(&q2, &[], |w| {
        w.remove_meta("qwen2.block_count");
    });
    assert!(matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::MissingKey(k)) if k == "qwen2.block_count"));
    // A llama file relabelled qwen2 has no qwen2.* keys.
    let bytes = rewrite(&llama, &[], |w| {
        w.set_meta("general.architecture", MetaValue::Str("qwen2".into()));
    });
    assert!(matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::MissingKey(_))));

    // qwen2 without its biases.
    let bytes = rewrite(&q2, &["blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"], |_| {});
    assert!(matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::MissingTensor(_))));
    // qwen3 without a q norm.
    let bytes = rewrite(&q3, &["blk.1.attn_q_norm.weight"], |_| {});
    assert!(
        matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::MissingTensor(t)) if t == "blk.1.attn_q_norm.weight")
    );

    // Tensors llama.cpp would use and the reference would not: refused.
    let zeros = |n: usize| vec![0u8; 4 * n];
    for (ck, name, len) in [
        (&llama, "blk.0.attn_output.bias", 64),
        (&llama, "blk.1.ffn_down.bias", 64),
        (&q2, "output.bias", 49152),
        (&q3, "rope_freqs.weight", 16),
    ] {
        let bytes = rewrite(ck, &[], |w| {
            w.add_tensor(name, GgmlType::F32, &[len as u64], zeros(len)).unwrap();
        });
        assert!(
            matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::UnexpectedTensor(ref t)) if t == name),
            "{name} accepted"
        );
    }
    // rope_freqs of the wrong length.
    let bytes = rewrite(&llama, &[], |w| {
        w.add_tensor("rope_freqs.weight", GgmlType::F32, &[4], zeros(4)).unwrap();
    });
    assert!(matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::BadShape { .. })));

    // Settings the project does not compute.
    for (key, value) in [
        ("qwen2.rope.scaling.type", MetaValue::Str("yarn".into())),
        ("qwen2.rope.scaling.factor", MetaValue::F32(4.0)),
        ("qwen2.rope.dimension_count", MetaValue::U32(8)),
        ("qwen2.attention.scale", MetaValue::F32(0.1)),
        ("qwen2.attention.value_length", MetaValue::U32(32)),
        ("qwen2.expert_count", MetaValue::U32(8)),
    ] {
        let bytes = rewrite(&q2, &[], |w| {
            w.set_meta(key, value);
        });
        assert!(matches!(Checkpoint::from_bytes(bytes), Err(CheckpointError::Unsupported(_))), "{key} accepted");
    }
    // Neutral values of the same keys load.
    let bytes = rewrite(&q2, &[], |w| {
        w.set_meta("qwen2.rope.scaling.type", MetaValue::Str("none".into()));
        w.set_meta("qwen2.rope.scaling.factor", MetaValue::F32(1.0));
        w.set_meta("qwen2.expert_count", MetaValue::U32(0));
    });
    assert_eq!(Checkpoint::from_bytes(bytes).unwrap().config(), q2.config());
}
