//! Fuzz the GGUF reader: `cargo +nightly fuzz run gguf_header`.
//! Any input must give `Ok` or a typed error, never a panic, hang or huge
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::checkpoint::Checkpoint;
use tributary_protocol::gguf::{GgufWriter, parse_header};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = parse_header(data) {
        // Whatever parses must write back and parse to the same header.
        if let Ok(w) = GgufWriter::from_parsed(&h, data) {
            if let Ok(bytes) = w.to_bytes() {
                let again = parse_header(&bytes).expect("re-parse of written file");
                assert_eq!(again.tensors.len(), h.tensors.len());
            }
        }
    }
    let _ = Checkpoint::from_bytes(data.to_vec());
});
