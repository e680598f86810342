//! Sparse delta: round trips (proptest) and hostile inputs.

use proptest::prelude::*;
use tributary_protocol::checkpoint::content_id_of;
use tributary_protocol::delta::{self, Delta, DeltaError, DeltaLimits, ElemKind, TensorDelta};
use tributary_protocol::gguf::{self, GgmlType, GgufWriter, MetaValue};

/// A GGUF with a BF16 matrix, an F32 vector and a Q8_0 tensor (which must
/// never change), filled from `bf16`, `f32`.
fn gguf_bytes(bf16: &[u16], f32s: &[u32], q8: &[u8]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_meta("general.architecture", MetaValue::Str("test".into()));
    w.set_meta("test.note", MetaValue::U32(7));
    let m: Vec<u8> = bf16.iter().flat_map(|v| v.to_le_bytes()).collect();
    let v: Vec<u8> = f32s.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor("a.matrix", GgmlType::BF16, &[bf16.len() as u64 / 2, 2], m).unwrap();
    w.add_tensor("b.norm", GgmlType::F32, &[f32s.len() as u64], v).unwrap();
    w.add_tensor("c.quant", GgmlType::Q8_0, &[32], q8.to_vec()).unwrap();
    w.to_bytes().unwrap()
}

fn q8_block() -> Vec<u8> {
    let mut b = vec![0u8; 34];
    b[0] = 0x00;
    b[1] = 0x3c; // f16 scale 1.0
    b
}

/// Base and new files with the given changes (index → new bits).
fn pair(n: usize, bf_changes: &[(usize, u16)], f_changes: &[(usize, u32)]) -> (Vec<u8>, Vec<u8>) {
    let bf: Vec<u16> = (0..2 * n).map(|i| (i as u16).wrapping_mul(40503)).collect();
    let f: Vec<u32> = (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
    let (mut bf2, mut f2) = (bf.clone(), f.clone());
    for &(i, v) in bf_changes {
        bf2[i % (2 * n)] = v;
    }
    for &(i, v) in f_changes {
        f2[i % n] = v;
    }
    (gguf_bytes(&bf, &f, &q8_block()), gguf_bytes(&bf2, &f2, &q8_block()))
}

fn limits(base: &[u8]) -> DeltaLimits {
    DeltaLimits::for_base_len(base.len() as u64)
}

fn id_of(bytes: &[u8]) -> tributary_protocol::checkpoint::ContentId {
    content_id_of(&gguf::parse_header(bytes).unwrap(), bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn roundtrip_is_bit_exact(
        n in 1usize..300,
        bf in proptest::collection::vec((0usize..10_000, any::<u16>()), 0..80),
        f in proptest::collection::vec((0usize..10_000, any::<u32>()), 0..40),
        level in 1i32..6,
    ) {
        let (base, new) = pair(n, &bf, &f);
        let bytes = delta::encode_gguf(&base, &new, level).unwrap();
        let d = delta::decode(&bytes, &limits(&base)).unwrap();
        prop_assert_eq!(d.base, id_of(&base));
        prop_assert_eq!(d.result, id_of(&new));
        let (changed, _) = delta::change_stats(&base, &new).unwrap();
        prop_assert_eq!(d.changed_elements(), changed);
        // Only changed elements are stored.
        for t in &d.tensors {
            prop_assert!(!t.indices.is_empty());
        }
        let mut target = base.clone();
        delta::apply_in_place(&d, &mut target).unwrap();
        prop_assert_eq!(&target, &new);
        // Re-serialising the decoded delta decodes to the same delta.
        let again = delta::decode(&d.to_bytes(level).unwrap(), &limits(&base)).unwrap();
        prop_assert_eq!(again, d);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let (base, _) = pair(8, &[], &[]);
        if let Ok(d) = delta::decode(&bytes, &limits(&base)) {
            let mut t = base.clone();
            let _ = delta::apply_in_place(&d, &mut t);
        }
    }

    #[test]
    fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        // A well-formed envelope around an arbitrary body reaches the body parser.
        let (base, new) = pair(8, &[(1, 5)], &[]);
        let (b, r) = (id_of(&base), id_of(&new));
        let bytes = envelope(b, r, &body);
        if let Ok(d) = delta::decode(&bytes, &limits(&base)) {
            let mut t = base.clone();
            let _ = delta::apply_in_place(&d, &mut t);
        }
    }
}

/// Wrap a raw body in a valid header and zstd payload.
fn envelope(
    base: tributary_protocol::checkpoint::ContentId,
    result: tributary_protocol::checkpoint::ContentId,
    body: &[u8],
) -> Vec<u8> {
    let payload = zstd::bulk::compress(body, 1).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&delta::MAGIC);
    out.push(delta::VERSION);
    out.extend_from_slice(&base.0);
    out.extend_from_slice(&result.0);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(&payload).as_bytes());
    out.extend_from_slice(&payload);
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn unchanged_checkpoint_gives_empty_delta() {
    let (base, _) = pair(16, &[], &[]);
    let bytes = delta::encode_gguf(&base, &base, 3).unwrap();
    let d = delta::decode(&bytes, &limits(&base)).unwrap();
    assert!(d.tensors.is_empty());
    assert_eq!(d.base, d.result);
    let mut t = base.clone();
    delta::apply_in_place(&d, &mut t).unwrap();
    assert_eq!(t, base);
}

#[test]
fn every_single_byte_flip_is_refused() {
    let (base, new) = pair(64, &[(3, 1), (70, 9), (127, 0xffff)], &[(5, 42)]);
    let bytes = delta::encode_gguf(&base, &new, 3).unwrap();
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80] {
            let mut bad = bytes.clone();
            bad[i] ^= mask;
            let refused = match delta::decode(&bad, &limits(&base)) {
                Err(_) => true,
                Ok(d) => {
                    let mut t = base.clone();
                    let r = delta::apply_in_place(&d, &mut t);
                    // Whatever happened, the target is either the announced
                    // result or untouched.
                    assert!(t == base || id_of(&t) == d.result);
                    r.is_err()
                }
            };
            assert!(refused, "flip of bit {mask:#x} in byte {i} was accepted");
        }
    }
}

#[test]
fn every_truncation_is_refused() {
    let (base, new) = pair(64, &[(3, 1), (90, 2)], &[(0, 1)]);
    let bytes = delta::encode_gguf(&base, &new, 3).unwrap();
    for len in 0..bytes.len() {
        assert!(delta::decode(&bytes[..len], &limits(&base)).is_err(), "prefix of {len} bytes decoded");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(delta::decode(&longer, &limits(&base)), Err(DeltaError::PayloadMismatch)));
}

#[test]
fn wrong_base_is_refused_untouched() {
    let (base, new) = pair(32, &[(1, 1)], &[]);
    let (other, _) = pair(33, &[], &[]);
    let d = delta::decode(&delta::encode_gguf(&base, &new, 3).unwrap(), &limits(&base)).unwrap();
    let mut t = other.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::WrongBase { .. })));
    assert_eq!(t, other);
    // Applying twice: the result is not the base any more.
    let mut t = base.clone();
    delta::apply_in_place(&d, &mut t).unwrap();
    let once = t.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::WrongBase { .. })));
    assert_eq!(t, once);
}

#[test]
fn forged_result_id_is_refused_and_target_restored() {
    let (base, new) = pair(32, &[(1, 1), (40, 7)], &[(2, 3)]);
    let mut d = delta::decode(&delta::encode_gguf(&base, &new, 3).unwrap(), &limits(&base)).unwrap();
    d.tensors[0].values[0] ^= 1;
    let mut t = base.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::ResultMismatch { .. })));
    assert_eq!(t, base, "target restored after a refused delta");
}

#[test]
fn hostile_bodies_give_typed_errors() {
    let (base, new) = pair(8, &[(1, 5)], &[]);
    let (b, r) = (id_of(&base), id_of(&new));
    let lim = limits(&base);
    let dec = |body: &[u8]| delta::decode(&envelope(b, r, body), &lim);

    // Absurd tensor count.
    let mut body = Vec::new();
    varint(&mut body, u64::MAX);
    assert!(matches!(dec(&body), Err(DeltaError::TooLarge { .. })));

    // Absurd change count: rejected before allocating.
    let mut body = Vec::new();
    varint(&mut body, 1);
    varint(&mut body, 8);
    body.extend_from_slice(b"a.matrix");
    body.push(1);
    varint(&mut body, u64::MAX);
    varint(&mut body, u64::MAX / 2);
    assert!(matches!(dec(&body), Err(DeltaError::Truncated(_))));

    // Index out of range (n_elements 16, index 16).
    let mut body = Vec::new();
    varint(&mut body, 1);
    varint(&mut body, 8);
    body.extend_from_slice(b"a.matrix");
    body.push(1);
    varint(&mut body, 16);
    varint(&mut body, 1);
    varint(&mut body, 16);
    body.extend_from_slice(&[0, 0]);
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));

    // Gap overflow.
    let mut body = Vec::new();
    varint(&mut body, 1);
    varint(&mut body, 8);
    body.extend_from_slice(b"a.matrix");
    body.push(1);
    varint(&mut body, u64::MAX);
    varint(&mut body, 2);
    varint(&mut body, u64::MAX - 1);
    varint(&mut body, u64::MAX);
    body.extend_from_slice(&[0; 4]);
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));

    // Unknown element kind, trailing bytes, non-minimal varint, overlong varint.
    let mut body = vec![1, 1, b'x', 9];
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));
    body = vec![0, 0];
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));
    body = vec![0x80, 0x00];
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));
    body = vec![0xff; 11];
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));

    // Decompression bomb: a body larger than the limit.
    let big = vec![0u8; 1 << 20];
    let small = DeltaLimits { max_bytes: 1 << 20, max_body: 1 << 16, max_tensors: 16 };
    assert!(matches!(delta::decode(&envelope(b, r, &big), &small), Err(DeltaError::TooLarge { .. })));

    // Oversized delta.
    let tiny = DeltaLimits { max_bytes: 10, max_body: 10, max_tensors: 1 };
    assert!(matches!(delta::decode(&envelope(b, r, &[0]), &tiny), Err(DeltaError::TooLarge { .. })));

    // Bad magic and version.
    let mut e = envelope(b, r, &[0]);
    e[0] = b'X';
    assert!(matches!(delta::decode(&e, &lim), Err(DeltaError::BadMagic)));
    let mut e = envelope(b, r, &[0]);
    e[8] = 2;
    assert!(matches!(delta::decode(&e, &lim), Err(DeltaError::UnsupportedVersion(2))));
}

#[test]
fn mismatched_tensors_are_refused_before_writing() {
    let (base, new) = pair(8, &[(1, 5)], &[]);
    let (b, r) = (id_of(&base), id_of(&new));
    let entry = |name: &str, elem: ElemKind, n: u64| Delta {
        base: b,
        result: r,
        tensors: vec![TensorDelta {
            name: name.into(),
            elem,
            n_elements: n,
            indices: vec![0],
            values: vec![0; elem.size()],
        }],
    };
    for d in [
        entry("nope", ElemKind::U16, 16),
        entry("a.matrix", ElemKind::U32, 16),
        entry("a.matrix", ElemKind::U16, 17),
        entry("c.quant", ElemKind::U16, 32),
    ] {
        let mut t = base.clone();
        assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::TensorMismatch { .. })), "{d:?}");
        assert_eq!(t, base);
    }
}

#[test]
fn layout_changes_and_quantized_changes_cannot_be_encoded() {
    let (base, _) = pair(8, &[], &[]);
    let (other, _) = pair(9, &[], &[]);
    assert!(matches!(delta::encode_gguf(&base, &other, 3), Err(DeltaError::LayoutMismatch(_))));
    let bf: Vec<u16> = (0..16u16).map(|i| i.wrapping_mul(40503)).collect();
    let f: Vec<u32> = (0..8u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let mut q = q8_block();
    q[5] = 1;
    let changed = gguf_bytes(&bf, &f, &q);
    assert!(matches!(delta::encode_gguf(&base, &changed, 3), Err(DeltaError::UnsupportedType { .. })));
}

#[test]
fn apply_file_writes_the_result_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let (base, new) = pair(40, &[(0, 1), (79, 2)], &[(39, 3)]);
    let bp = dir.path().join("base.gguf");
    std::fs::write(&bp, &base).unwrap();
    let bytes = delta::encode_gguf(&base, &new, 3).unwrap();
    let out = dir.path().join("new.gguf");
    let id = delta::apply_file(&bytes, &bp, &out).unwrap();
    assert_eq!(id, id_of(&new));
    assert_eq!(std::fs::read(&out).unwrap(), new);
    assert_eq!(std::fs::read(&bp).unwrap(), base, "base untouched");
    // A refused delta leaves no output and no temporary file.
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let out2 = dir.path().join("bad.gguf");
    assert!(delta::apply_file(&bad, &bp, &out2).is_err());
    assert!(!out2.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}
