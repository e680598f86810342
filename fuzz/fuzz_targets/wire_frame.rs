//! Every frame decoder via the framed reader: header checks, then the tag's body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::wire::Frame;

fuzz_target!(|data: &[u8]| {
    if let Ok((frame, used)) = Frame::decode(data) {
        assert!(used <= data.len());
        // What decodes re-encodes to bytes that decode again.
        let again = frame.encode();
        assert!(Frame::decode(&again).is_ok());
    }
});
