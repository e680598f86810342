//! Property tests of the protocol tokenizer on the real SmolLM2 vocabulary:
//! decoding an encoding gives the text back, special markers are single ids,
//! and hostile metadata is rejected with an error, never a panic.

use std::sync::OnceLock;

use proptest::prelude::*;
use tributary_assets as assets;
use tributary_protocol::tokenizer::{Tokenizer, TokenizerSpec};

fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_gguf_file(&assets::smollm2_q4_1()).expect("SmolLM2 tokenizer"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decode_inverts_encode(s in "\\PC{0,64}") {
        let tok = smollm2();
        let ids = tok.encode(&s).unwrap();
        prop_assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        prop_assert_eq!(tok.decode(&ids).unwrap(), s);
    }

    #[test]
    fn chat_markers_are_single_ids(a in "[a-z0-9 \\n]{0,20}", b in "[a-z0-9 \\n]{0,20}") {
        let tok = smollm2();
        let text = format!("{a}<|im_start|>{b}<|im_end|>");
        let ids = tok.encode(&text).unwrap();
        prop_assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
        prop_assert_eq!(*ids.last().unwrap(), 2);
        prop_assert_eq!(tok.decode(&ids).unwrap(), text);
    }

    #[test]
    fn arbitrary_metadata_never_panics(
        tokens in prop::collection::vec("\\PC{0,4}", 0..40),
        types in prop::collection::vec(0i32..6, 0..40),
        merges in prop::collection::vec("\\PC{0,6}", 0..40),
        eos in 0u32..64,
        text in "\\PC{0,16}",
    ) {
        let spec = TokenizerSpec {
            model: "gpt2",
            pre: "smollm",
            tokens: &tokens,
            token_types: &types,
            merges: &merges,
            eos_id: eos,
            eot_id: None,
        };
        if let Ok(tok) = Tokenizer::from_spec(spec) {
            // encoding may fail (characters outside a toy vocabulary), never panic
            if let Ok(ids) = tok.encode(&text) {
                let _ = tok.decode(&ids);
            }
        }
    }
}

#[test]
fn smollm2_ids() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.eos_id(), 2);
    assert_eq!(tok.eog_ids().collect::<Vec<_>>(), vec![0, 2]);
    assert!(tok.is_special(1) && !tok.is_special(100));
    assert_eq!(
        tok.encode("<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n").unwrap(),
        vec![1, 4093, 198, 19556, 17, 2, 198, 1, 520, 9531, 198]
    );
    // single digits
    assert_eq!(tok.encode("123").unwrap().len(), 3);
    assert!(tok.decode(&[49152]).is_err());
}
