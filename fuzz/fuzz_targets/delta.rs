//! Fuzz the sparse-delta decoder and in-place application: arbitrary bytes
//! must give a typed error or a delta whose application either succeeds with
//! the announced result or leaves the target untouched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::checkpoint::content_id_of;
use tributary_protocol::delta::{self, DeltaLimits};
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

fuzz_target!(|data: &[u8]| {
    let base = base();
    if let Ok(d) = delta::decode(data, &DeltaLimits::for_base_len(base.len() as u64)) {
        let mut target = base.clone();
        match delta::apply_in_place(&d, &mut target) {
            Ok(()) => {
                let h = gguf::parse_header(&target).expect("still a gguf");
                assert_eq!(content_id_of(&h, &target), d.result);
            }
            Err(_) => assert_eq!(target, base),
        }
    }
});
