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
        // Only changed tensors are listed.
        for t in &d.tensors {
            prop_assert!(t.changed > 0);
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
    fn arbitrary_streams_restore_the_target(
        stream in proptest::collection::vec(any::<u8>(), 0..200),
        changed in 1u64..32,
    ) {
        // The range decoder on hostile bytes: an error with the target as it
        // was, or exactly the announced result.
        let (base, new) = pair(8, &[(1, 5)], &[]);
        let d = Delta {
            base: id_of(&base),
            result: id_of(&new),
            tensors: vec![TensorDelta { name: "a.matrix".into(), elem: ElemKind::U16, n_elements: 16, changed }],
            stream,
        };
        let mut t = base.clone();
        match delta::apply_in_place(&d, &mut t) {
            Ok(()) => prop_assert_eq!(&t, &new),
            Err(_) => prop_assert_eq!(&t, &base),
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
    d.result = tributary_protocol::checkpoint::ContentId([7; 32]);
    let mut t = base.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::ResultMismatch { .. })));
    assert_eq!(t, base, "target restored after a refused delta");
}

#[test]
fn every_corrupted_stream_is_refused_and_target_restored() {
    // Past the payload hash (a relay that re-signs, or a bug): any change to
    // the coded stream is caught by the counts, the stream's end or the
    // result id, and the target is left as it was.
    let (base, new) = pair(64, &[(3, 1), (70, 9), (127, 0xffff), (20, 0x3f80)], &[(5, 42)]);
    let d = delta::decode(&delta::encode_gguf(&base, &new, 3).unwrap(), &limits(&base)).unwrap();
    // A flip in the coder's final flush bytes may decode to the same
    // changes: then the result is the announced one, and that is all that
    // matters. Anything else is refused with the target restored.
    let mut refused = 0;
    let mut tries = 0;
    let mut check = |bad: &Delta| {
        let mut t = base.clone();
        tries += 1;
        match delta::apply_in_place(bad, &mut t) {
            Err(_) => {
                refused += 1;
                assert_eq!(t, base, "target not restored");
            }
            Ok(()) => assert_eq!(t, new, "a corrupted stream was accepted with a wrong result"),
        }
    };
    for i in 0..d.stream.len() {
        for mask in [0x01u8, 0x10, 0x80] {
            let mut bad = d.clone();
            bad.stream[i] ^= mask;
            check(&bad);
        }
    }
    for cut in 0..d.stream.len() {
        let mut bad = d.clone();
        bad.stream.truncate(cut);
        check(&bad);
    }
    assert!(refused * 10 >= tries * 8, "only {refused} of {tries} corruptions refused");
    let mut longer = d.clone();
    longer.stream.push(0);
    let mut t = base.clone();
    assert!(matches!(delta::apply_in_place(&longer, &mut t), Err(DeltaError::Malformed(_))));
    assert_eq!(t, base);
    // A wrong announced count.
    let mut bad = d.clone();
    bad.tensors[0].changed += 1;
    let mut t = base.clone();
    assert!(matches!(delta::apply_in_place(&bad, &mut t), Err(DeltaError::Malformed(_))));
    assert_eq!(t, base);
}

/// splitmix64, for reproducible synthetic checkpoints.
fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn entropy_bits(counts: &[u64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 * (n as f64 / c as f64).log2()).sum()
}

#[test]
fn small_updates_cost_near_their_entropy_given_the_base() {
    // An RL-like update: BF16 weights of many magnitudes, each moved with a
    // probability that halves per exponent step (an update of fixed size
    // crosses a rounding boundary less often where ulps are wider), by
    // ±1 ulp, sometimes ±2. The delta must come within 15 % of the entropy
    // of that process given the base's exponents (what the receiver knows),
    // far below the 2 bytes per change that storing new values costs.
    let n = 40_000;
    let mut st = 7u64;
    let mut bf = Vec::with_capacity(n);
    let mut next = Vec::with_capacity(n);
    let (mut per_exp, mut diffs) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    for _ in 0..n {
        let r = rng(&mut st);
        let e = 112 + (r % 12) as u16;
        let v = ((r >> 8) as u16 & 0x8000) | (e << 7) | ((r >> 16) as u16 & 0x7f);
        let p = 0.6 * 0.5f64.powi(i32::from(e - 112));
        let moved = ((r >> 32) as f64 / 2f64.powi(32)) < p;
        let step: i16 = if (r >> 28) & 7 == 0 { 2 } else { 1 };
        let d = if (r >> 24) & 1 == 0 { step } else { -step };
        let w = if moved { v.wrapping_add(d as u16) } else { v };
        let slot: &mut (u64, u64) = per_exp.entry(e).or_default();
        slot.0 += 1;
        if moved {
            slot.1 += 1;
            *diffs.entry((e, d)).or_insert(0u64) += 1;
        }
        bf.push(v);
        next.push(w);
    }
    let f: Vec<u32> = vec![0x3f80_0000; 8];
    let (base, new) = (gguf_bytes(&bf, &f, &q8_block()), gguf_bytes(&next, &f, &q8_block()));
    let changed: u64 = per_exp.values().map(|v| v.1).sum();
    let mut ideal: f64 = per_exp.values().map(|&(n, c)| entropy_bits(&[c, n - c])).sum();
    for e in per_exp.keys() {
        let c: Vec<u64> = diffs.iter().filter(|((x, _), _)| x == e).map(|(_, &c)| c).collect();
        ideal += entropy_bits(&c);
    }
    let bytes = delta::encode_gguf(&base, &new, 3).unwrap();
    assert_eq!(delta::apply_to_copy(&bytes, &base).unwrap(), new);
    let ideal_bytes = ideal / 8.0;
    let got = bytes.len() as f64;
    assert!(
        got <= 1.15 * ideal_bytes + 200.0,
        "{got} bytes for {changed} changes ({:.2} bits each); entropy given the base {ideal_bytes:.0} bytes ({:.2} bits each)",
        8.0 * got / changed as f64,
        ideal / changed as f64
    );
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

    // More changes than elements, or none.
    for (n, changed) in [(16u64, 17u64), (16, 0), (u64::MAX / 2, u64::MAX)] {
        let mut body = Vec::new();
        varint(&mut body, 1);
        varint(&mut body, 8);
        body.extend_from_slice(b"a.matrix");
        body.push(1);
        varint(&mut body, n);
        varint(&mut body, changed);
        varint(&mut body, 0);
        assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))), "{n} {changed}");
    }

    // A stream longer than the body: refused before allocating.
    let mut body = Vec::new();
    varint(&mut body, 0);
    varint(&mut body, u64::MAX / 2);
    assert!(matches!(dec(&body), Err(DeltaError::Truncated(_))));

    // A tensor table longer than the body.
    let mut body = Vec::new();
    varint(&mut body, 1 << 15);
    assert!(matches!(dec(&body), Err(DeltaError::Truncated(_))));

    // Absurd element count: decodes, refused against the target before writing.
    let mut body = Vec::new();
    varint(&mut body, 1);
    varint(&mut body, 8);
    body.extend_from_slice(b"a.matrix");
    body.push(1);
    varint(&mut body, u64::MAX);
    varint(&mut body, u64::MAX / 2);
    varint(&mut body, 5);
    body.extend_from_slice(&[0; 5]);
    let d = dec(&body).unwrap();
    let mut t = base.clone();
    assert!(matches!(delta::apply_in_place(&d, &mut t), Err(DeltaError::TensorMismatch { .. })));
    assert_eq!(t, base);

    // A stream that does not start with 0, and a too short one.
    for stream in [&[1u8, 0, 0, 0, 0][..], &[0, 0, 0][..]] {
        let mut body = Vec::new();
        varint(&mut body, 1);
        varint(&mut body, 8);
        body.extend_from_slice(b"a.matrix");
        body.push(1);
        varint(&mut body, 16);
        varint(&mut body, 1);
        varint(&mut body, stream.len() as u64);
        body.extend_from_slice(stream);
        let d = dec(&body).unwrap();
        let mut t = base.clone();
        assert!(delta::apply_in_place(&d, &mut t).is_err());
        assert_eq!(t, base);
    }

    // Unknown element kind, trailing bytes, non-minimal varint, overlong varint.
    let mut body = vec![1, 1, b'x', 9, 0, 0, 0];
    assert!(matches!(dec(&body), Err(DeltaError::Malformed(_))));
    body = vec![0, 0, 0];
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
    for v in [1, 3] {
        let mut e = envelope(b, r, &[0]);
        e[8] = v;
        assert!(matches!(delta::decode(&e, &lim), Err(DeltaError::UnsupportedVersion(x)) if x == v));
    }
}

#[test]
fn mismatched_tensors_are_refused_before_writing() {
    let (base, new) = pair(8, &[(1, 5)], &[]);
    let (b, r) = (id_of(&base), id_of(&new));
    let entry = |name: &str, elem: ElemKind, n: u64| Delta {
        base: b,
        result: r,
        tensors: vec![TensorDelta { name: name.into(), elem, n_elements: n, changed: 1 }],
        stream: vec![0; 5],
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
