//! Each tag's body decoder directly (the first byte picks the tag).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tributary_protocol::wire::{Frame, Tag};

fuzz_target!(|data: &[u8]| {
    if let Some((&pick, body)) = data.split_first() {
        let tag = Tag::ALL[pick as usize % Tag::ALL.len()];
        let _ = Frame::decode_body(tag, body);
    }
});
