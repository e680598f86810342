//! Hostile GGUF input is refused with a typed error, never a panic or a
//! huge allocation.

use std::borrow::Cow;

use proptest::prelude::*;
use tributary_assets as assets;
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError};
use tributary_protocol::gguf::{GgmlType, GgufError, GgufWriter, MetaValue, parse_header};
use tributary_protocol::tiny;

/// A small valid file: two metadata keys and two tensors.
fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_meta("general.architecture", MetaValue::Str("llama".into()));
    w.set_meta("a.list", MetaValue::Array(tributary_protocol::gguf::MetaArray::Str(vec!["x".into(), "yz".into()])));
    w.add_tensor("a", GgmlType::F32, &[4, 2], Cow::Owned(vec![1u8; 32])).unwrap();
    w.add_tensor("b", GgmlType::Q4_1, &[32], Cow::Owned(vec![2u8; 20])).unwrap();
    w.to_bytes().unwrap()
}

/// The fixed 24-byte GGUF v3 header with the given counts.
fn header_prefix(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A file with no metadata and one tensor descriptor, then `data_len` bytes of data.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header_prefix(1, 0);
    put_str(&mut b, name);
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + data_len, 0);
    b
}

#[test]
fn valid_small_file_parses() {
    let b = small_file();
    let h = parse_header(&b).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[1].offset, 32);
}

#[test]
fn wrong_magic_and_version() {
    let mut b = small_file();
    b[0] = b'X';
    assert!(matches!(parse_header(&b), Err(GgufError::BadMagic(_))));
    let mut b = small_file();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(parse_header(&b), Err(GgufError::UnsupportedVersion(1))));
    let mut b = small_file();
    b[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(parse_header(&b), Err(GgufError::UnsupportedVersion(99))));
}

#[test]
fn every_truncation_is_refused() {
    let b = small_file();
    // The last tensor's trailing padding is optional; every shorter cut fails.
    let h = parse_header(&b).unwrap();
    let end = h.tensors.iter().map(|t| h.tensor_range(t).end).max().unwrap();
    assert!(parse_header(&b[..end]).is_ok());
    for len in 0..end {
        let r = parse_header(&b[..len]);
        assert!(r.is_err(), "prefix of {len} bytes accepted");
    }
}

#[test]
fn every_truncation_of_tiny_model_header_is_refused() {
    let src = Checkpoint::open(&assets::smollm2_q4_1()).unwrap();
    let b = tiny::tiny_checkpoint_bytes(1, &src).unwrap();
    let data_offset = parse_header(&b).unwrap().data_offset as usize;
    // Every cut in the first 4 KiB, a sample of cuts through the rest of the
    // header (the tokenizer arrays), and a sample inside the tensor data.
    for len in (0..4096).chain((4096..data_offset).step_by(997)) {
        assert!(parse_header(&b[..len]).is_err(), "prefix of {len} bytes accepted");
    }
    for len in (data_offset..b.len()).step_by(40_009) {
        assert!(Checkpoint::from_bytes(b[..len].to_vec()).is_err(), "prefix of {len} bytes accepted");
    }
}

#[test]
fn absurd_counts_do_not_allocate() {
    // 2^62 tensors / keys claimed in a 24-byte file: refused by the
    // remaining-bytes check before any allocation.
    let b = header_prefix(1 << 62, 0);
    assert!(matches!(parse_header(&b), Err(GgufError::CountTooLarge { .. })));
    let b = header_prefix(0, u64::MAX);
    assert!(matches!(parse_header(&b), Err(GgufError::CountTooLarge { .. })));
    // A string array claiming 2^61 elements.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&8u32.to_le_bytes()); // of strings
    b.extend_from_slice(&(1u64 << 61).to_le_bytes());
    assert!(matches!(parse_header(&b), Err(GgufError::CountTooLarge { .. })));
    // A u64 array whose byte size overflows.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&10u32.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse_header(&b), Err(GgufError::CountTooLarge { .. })));
}

#[test]
fn string_lengths_beyond_the_file() {
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(b"key, then some more bytes");
    assert!(matches!(parse_header(&b), Err(GgufError::Truncated { .. })));
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&1_000_000u64.to_le_bytes());
    b.extend_from_slice(b"short");
    assert!(matches!(parse_header(&b), Err(GgufError::Truncated { .. })));
}

#[test]
fn bad_values() {
    // Unknown value type.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&13u32.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert!(matches!(parse_header(&b), Err(GgufError::UnknownValueType(13))));
    // Invalid UTF-8.
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&[0xff, 0xfe]);
    b.extend_from_slice(&[0; 16]);
    assert!(matches!(parse_header(&b), Err(GgufError::InvalidUtf8(_))));
    // Bool byte 2.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.extend_from_slice(&[2; 16]);
    assert!(matches!(parse_header(&b), Err(GgufError::InvalidBool { .. })));
    // Arrays nested without end.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "k");
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    assert!(matches!(parse_header(&b), Err(GgufError::ArrayTooDeep)));
    // Duplicate key.
    let mut b = header_prefix(0, 2);
    for _ in 0..2 {
        put_str(&mut b, "k");
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
    }
    assert!(matches!(parse_header(&b), Err(GgufError::DuplicateKey(_))));
    // Alignment not a power of two.
    let mut b = header_prefix(0, 1);
    put_str(&mut b, "general.alignment");
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&24u32.to_le_bytes());
    assert!(matches!(parse_header(&b), Err(GgufError::BadAlignment(24))));
}

#[test]
fn bad_tensors() {
    assert!(parse_header(&one_tensor("t", &[8], 0, 0, 32)).is_ok());
    // Unknown type.
    assert!(matches!(
        parse_header(&one_tensor("t", &[8], 99, 0, 32)),
        Err(GgufError::UnknownTensorType { id: 99, .. })
    ));
    // Offset past the end / data running past the end.
    assert!(matches!(parse_header(&one_tensor("t", &[8], 0, 1 << 40, 32)), Err(GgufError::TensorOutOfBounds { .. })));
    assert!(matches!(
        parse_header(&one_tensor("t", &[8], 0, u64::MAX - 30, 32)),
        Err(GgufError::MisalignedTensor { .. })
    ));
    assert!(matches!(parse_header(&one_tensor("t", &[8], 0, !31, 32)), Err(GgufError::TensorOutOfBounds { .. })));
    assert!(matches!(parse_header(&one_tensor("t", &[16], 0, 0, 32)), Err(GgufError::TensorOutOfBounds { .. })));
    // Misaligned.
    assert!(matches!(parse_header(&one_tensor("t", &[2], 0, 4, 32)), Err(GgufError::MisalignedTensor { .. })));
    // Dims: overflow, zero, too many, not whole blocks.
    for dims in [&[u64::MAX, 2][..], &[1 << 32, 1 << 32], &[1 << 62, 4], &[0, 3], &[1, 1, 1, 1, 1]] {
        assert!(matches!(parse_header(&one_tensor("t", dims, 0, 0, 32)), Err(GgufError::BadDims { .. })), "{dims:?}");
    }
    assert!(matches!(parse_header(&one_tensor("t", &[31], 3, 0, 32)), Err(GgufError::BadDims { .. })));
    // Absurd n_dims is refused before reading (or allocating) dims.
    let mut b = header_prefix(1, 0);
    put_str(&mut b, "t");
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    b.resize(64, 0);
    assert!(matches!(parse_header(&b), Err(GgufError::BadDims { .. })));
}

#[test]
fn overlapping_and_duplicate_tensors() {
    let two = |name2: &str, off2: u64| {
        let mut b = header_prefix(2, 0);
        for (name, off) in [("a", 0u64), (name2, off2)] {
            put_str(&mut b, name);
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&16u64.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(32) + 128, 0);
        b
    };
    assert!(parse_header(&two("b", 64)).is_ok());
    assert!(matches!(parse_header(&two("b", 32)), Err(GgufError::OverlappingTensors(..))));
    assert!(matches!(parse_header(&two("b", 0)), Err(GgufError::OverlappingTensors(..))));
    assert!(matches!(parse_header(&two("a", 64)), Err(GgufError::DuplicateTensor(_))));
}

#[test]
fn checkpoint_refuses_non_llama_and_bad_shapes() {
    // A valid GGUF that is not a llama checkpoint.
    assert!(matches!(
        Checkpoint::from_bytes(small_file()),
        Err(CheckpointError::MissingTensor(_) | CheckpointError::MissingKey(_))
    ));
    // The tiny model with one tensor's dims changed in the header bytes is
    // refused as a shape error (or out of bounds), not accepted.
    let src = Checkpoint::open(&assets::smollm2_q4_1()).unwrap();
    let b = tiny::tiny_checkpoint_bytes(3, &src).unwrap();
    let name = b"blk.1.ffn_down.weight";
    let pos = b.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let mut bad = b.clone();
    // n_dims (4 bytes) then ne0 = 128: make it 64.
    bad[pos + 4..pos + 12].copy_from_slice(&64u64.to_le_bytes());
    assert!(matches!(Checkpoint::from_bytes(bad), Err(CheckpointError::BadShape { .. })));
    let mut bad = b;
    let arch = b"llama";
    let p = bad.windows(arch.len()).position(|w| w == arch).unwrap();
    bad[p] = b'L';
    assert!(matches!(Checkpoint::from_bytes(bad), Err(CheckpointError::UnknownArchitecture(_))));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Random byte flips and cuts of a valid file never panic.
    #[test]
    fn mutations_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>()) {
        let mut b = small_file();
        for (i, v) in flips {
            let i = i.index(b.len());
            b[i] = v;
        }
        let cut = cut.index(b.len() + 1);
        let _ = parse_header(&b[..cut]);
        let _ = Checkpoint::from_bytes(b[..cut].to_vec());
    }

    /// Random bytes after a valid magic never panic.
    #[test]
    fn random_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend_from_slice(&tail);
        let _ = parse_header(&b);
    }
}
