//! `Rollout::decode`, what the coordinator's door runs on every submitted
//! rollout, then the digest and the re-encoding of whatever decodes: the
//! re-encoding must decode to the same bytes again. The first byte also
//! drives `sketch::decode_sketches` on the rest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::rollout::{Rollout, RolloutLimits};
use tributary_protocol::sketch::decode_sketches;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Rollout::decode(data, &RolloutLimits::DEFAULT) {
        let _ = r.digest();
        let again = r.encode();
        let back = Rollout::decode(&again, &RolloutLimits::DEFAULT);
        assert!(back.is_ok_and(|b| b.encode() == again), "a decoded rollout's encoding must decode to itself");
    }
    if let Some((&n, rest)) = data.split_first() {
        let _ = decode_sketches(rest, usize::from(n) * 64);
    }
});
