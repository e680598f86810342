//! Fuzz the sparse-delta decoder and in-place application: arbitrary bytes
//! must give a typed error or a delta whose application either succeeds with
//! the announced result or leaves the target untouched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::checkpoint::content_id_of;
use tributary_protocol::delta::{self, Delta, DeltaLimits, ElemKind, TensorDelta};
use tributary_protocol::gguf::{self, GgmlType, GgufWriter, MetaValue};

fn base() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_meta("general.architecture", MetaValue::Str("fuzz".into()));
    let m: Vec<u8> = (0..64u16).flat_map(|v| v.wrapping_mul(40503).to_le_bytes()).collect();
    let v: Vec<u8> = (0..8u32).flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor("a.matrix", GgmlType::BF16, &[8, 8], m).expect("valid tensor");
    w.add_tensor("b.norm", GgmlType::F32, &[8], v).expect("valid tensor");
    w.to_bytes().expect("valid gguf")
}

/// Applying must give the announced result or leave the target untouched.
fn check_apply(d: &Delta, base: &[u8]) {
    let mut target = base.to_vec();
    match delta::apply_in_place(d, &mut target) {
        Ok(()) => {
            let h = gguf::parse_header(&target).expect("still a gguf");
            assert_eq!(content_id_of(&h, &target), d.result);
        }
        Err(_) => assert_eq!(target, base),
    }
}

fuzz_target!(|data: &[u8]| {
    let base = base();
    if let Ok(d) = delta::decode(data, &DeltaLimits::for_base_len(base.len() as u64)) {
        check_apply(&d, &base);
    }
    // Arbitrary bytes rarely pass the payload hash: also feed them to the
    // range decoder directly, as the stream of a delta against this base.
    if let Some((&counts, stream)) = data.split_first() {
        let id = content_id_of(&gguf::parse_header(&base).expect("valid gguf"), &base);
        let mut tensors = vec![TensorDelta {
            name: "a.matrix".into(),
            elem: ElemKind::U16,
            n_elements: 64,
            changed: u64::from(counts & 0x3f) + 1,
        }];
        if counts & 0x80 != 0 {
            tensors.push(TensorDelta { name: "b.norm".into(), elem: ElemKind::U32, n_elements: 8, changed: 1 });
        }
        check_apply(&Delta { base: id, result: id, tensors, stream: stream.to_vec() }, &base);
    }
});
