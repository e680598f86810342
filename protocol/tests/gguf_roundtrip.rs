//! GGUF read → write → read is bit-identical: on random small files
//! (proptest), on the real SmolLM2 Q4_1 file, and on the tiny model.

use std::borrow::Cow;

use proptest::prelude::*;
use tributary_assets as assets;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::gguf::{GgmlType, GgufWriter, MetaArray, MetaValue, parse_header};
use tributary_protocol::tiny;

fn rewrite(bytes: &[u8]) -> Vec<u8> {
    let h = parse_header(bytes).expect("parse");
    GgufWriter::from_parsed(&h, bytes).expect("writer").to_bytes().expect("write")
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![".{0,12}", "[a-z._]{1,20}"]
}

fn arb_array(depth: u32) -> BoxedStrategy<MetaArray> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(MetaArray::U8),
        prop::collection::vec(any::<i8>(), 0..8).prop_map(MetaArray::I8),
        prop::collection::vec(any::<u16>(), 0..8).prop_map(MetaArray::U16),
        prop::collection::vec(any::<i16>(), 0..8).prop_map(MetaArray::I16),
        prop::collection::vec(any::<u32>(), 0..8).prop_map(MetaArray::U32),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(MetaArray::I32),
        prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..8).prop_map(MetaArray::F32),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(MetaArray::Bool),
        prop::collection::vec(arb_string(), 0..6).prop_map(MetaArray::Str),
        prop::collection::vec(any::<u64>(), 0..8).prop_map(MetaArray::U64),
        prop::collection::vec(any::<i64>(), 0..8).prop_map(MetaArray::I64),
        prop::collection::vec(any::<u64>().prop_map(f64::from_bits), 0..8).prop_map(MetaArray::F64),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![4 => leaf, 1 => prop::collection::vec(arb_array(depth - 1), 0..3).prop_map(MetaArray::Array)]
            .boxed()
    }
}

fn arb_value() -> impl Strategy<Value = MetaValue> {
    prop_oneof![
        any::<u8>().prop_map(MetaValue::U8),
        any::<i8>().prop_map(MetaValue::I8),
        any::<u16>().prop_map(MetaValue::U16),
        any::<i16>().prop_map(MetaValue::I16),
        any::<u32>().prop_map(MetaValue::U32),
        any::<i32>().prop_map(MetaValue::I32),
        any::<u32>().prop_map(|b| MetaValue::F32(f32::from_bits(b))),
        any::<bool>().prop_map(MetaValue::Bool),
        arb_string().prop_map(MetaValue::Str),
        arb_array(2).prop_map(MetaValue::Array),
        any::<u64>().prop_map(MetaValue::U64),
        any::<i64>().prop_map(MetaValue::I64),
        any::<u64>().prop_map(|b| MetaValue::F64(f64::from_bits(b))),
    ]
}

#[derive(Debug, Clone)]
struct TensorSpec {
    ty: GgmlType,
    dims: Vec<u64>,
    fill: u8,
}

fn arb_tensor() -> impl Strategy<Value = TensorSpec> {
    let ty = prop::sample::select(vec![
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::I8,
    ]);
    (ty, prop::collection::vec(1u64..4, 0..3), 1u64..3, any::<u8>()).prop_map(|(ty, mut rest, row_blocks, fill)| {
        let mut dims = vec![row_blocks * ty.block_size()];
        dims.append(&mut rest);
        TensorSpec { ty, dims, fill }
    })
}

fn build(meta: &[(String, MetaValue)], tensors: &[TensorSpec], alignment: Option<u32>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.set_meta(k, v.clone());
    }
    if let Some(a) = alignment {
        w.set_meta("general.alignment", MetaValue::U32(a));
    }
    for (i, t) in tensors.iter().enumerate() {
        let n: u64 = t.dims.iter().product();
        let len = t.ty.bytes_for(n).unwrap() as usize;
        let data: Vec<u8> = (0..len).map(|j| t.fill.wrapping_add((j * 31 + i) as u8)).collect();
        w.add_tensor(&format!("t{i}.weight"), t.ty, &t.dims, Cow::Owned(data)).unwrap();
    }
    w.to_bytes().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_gguf_roundtrips(
        meta in prop::collection::btree_map("[a-z]{1,8}\\.[a-z_]{1,10}", arb_value(), 0..10),
        tensors in prop::collection::vec(arb_tensor(), 0..5),
        alignment in prop::option::of(prop::sample::select(vec![1u32, 8, 32, 64])),
    ) {
        let meta: Vec<(String, MetaValue)> = meta.into_iter().filter(|(k, _)| k != "general.alignment").collect();
        let bytes = build(&meta, &tensors, alignment);
        let h = parse_header(&bytes).unwrap();
        prop_assert_eq!(h.version, 3);
        prop_assert_eq!(h.tensors.len(), tensors.len());
        prop_assert_eq!(h.alignment, u64::from(alignment.unwrap_or(32)));
        // Metadata comes back in order; compare encodings (NaN != NaN).
        prop_assert_eq!(h.metadata.len(), meta.len() + usize::from(alignment.is_some()));
        for ((k, v), (k2, v2)) in meta.iter().zip(&h.metadata) {
            prop_assert_eq!(k, k2);
            prop_assert_eq!(format!("{v:?}"), format!("{v2:?}"));
        }
        for (t, spec) in h.tensors.iter().zip(&tensors) {
            prop_assert_eq!(&t.dims, &spec.dims);
            prop_assert_eq!(t.ty, spec.ty);
            prop_assert_eq!(t.offset % h.alignment, 0);
        }
        let again = rewrite(&bytes);
        prop_assert_eq!(&again, &bytes);
        prop_assert_eq!(parse_header(&again).unwrap().tensors, h.tensors);
    }
}

#[test]
fn real_q4_1_file_roundtrips_bit_identically() {
    let path = assets::smollm2_q4_1();
    let bytes = std::fs::read(&path).expect("SmolLM2 Q4_1 file (run scripts/setup.sh)");
    let h = parse_header(&bytes).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.metadata.len(), 33);
    assert_eq!(h.tensors.len(), 272);
    assert_eq!(h.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
    assert_eq!(h.tensor("blk.0.attn_q.weight").unwrap().ty, GgmlType::Q4_1);
    assert_eq!(h.tensor("blk.0.attn_norm.weight").unwrap().ty, GgmlType::F32);
    assert_eq!(h.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(h.get_i32_array("tokenizer.ggml.token_type").unwrap()[0], 3);
    let again = rewrite(&bytes);
    assert_eq!(again.len(), bytes.len());
    assert!(again == bytes, "rewritten file differs");
}

#[test]
fn tiny_model_roundtrips_bit_identically() {
    let src = Checkpoint::open(&assets::smollm2_q4_1()).unwrap();
    let bytes = tiny::tiny_checkpoint_bytes(7, &src).unwrap();
    let again = rewrite(&bytes);
    assert!(again == bytes, "rewritten tiny file differs");
}
