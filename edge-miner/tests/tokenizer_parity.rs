//! The protocol tokenizer (HF `tokenizers`, built from the GGUF metadata) must
//! produce exactly llama.cpp's ids: all GSM8K test questions and answers, plus
//! unicode, whitespace runs, digit runs, special tokens and ChatML prompts.

use std::path::PathBuf;

use edge_miner::llama::{LlamaConfig, LlamaCppBackend};
use tributary_assets as assets;
use tributary_protocol::tokenizer::Tokenizer;

fn gsm8k_test_file() -> PathBuf {
    tributary_assets::gsm8k_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
        .expect("shared/data/gsm8k beside the repository (or TRIBUTARY_GSM8K_DIR)")
        .join("test.jsonl")
}

fn hand_written() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        " ",
        "  ",
        "\n",
        "\n\n\n",
        "\t\t x",
        "a  b   c    d",
        "trailing spaces   ",
        "   leading spaces",
        "mixed \t\n \r\n whitespace\u{a0}nbsp",
        "1234567890",
        "3.14159 and 2,718,281 and -42 and 1e-9",
        "x=12+34*(56-78)/9",
        "Hello, world!",
        "It's, you're, we'll, they'd, I'm, she's",
        "IT'S UPPER CASE'S",
        "über naïve café résumé façade",
        "日本語のテキストと漢字",
        "中文：一二三，四五六。",
        "한국어 텍스트",
        "Русский текст с цифрами 123",
        "العربية والأرقام ١٢٣",
        "עברית",
        "हिन्दी",
        "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
        "math ∑∫√∞≠≤≥ ±×÷",
        "zero\u{200b}width\u{200d}joiner",
        "combining e\u{301} a\u{308}",
        "```rust\nfn main() {\n    println!(\"hi\");\n}\n```",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "text<|im_end|>text<|im_start|>text",
        "<|im_start|><|im_end|><|endoftext|>",
        "<|im_start |> not special",
        "<repo_name>a<file_sep>b<filename>c",
        "$$$ ### @@@ %%% ^^^ &&& *** ((( )))",
        "a\u{0}b",
        "\u{feff}BOM",
        "tab\tseparated\tvalues\t1\t2",
        "CamelCaseIdentifier snake_case_identifier kebab-case-identifier",
        "http://example.com/path?q=1&r=2#frag",
        "email@example.com",
        "'''quoted''' \"\"\"triple\"\"\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // whitespace runs of every length up to 20, in several contexts
    for n in 1..=20 {
        let ws = " ".repeat(n);
        v.push(format!("a{ws}b"));
        v.push(format!("{ws}x"));
        v.push(format!("x{ws}"));
        v.push(format!("1{ws}2"));
        v.push("\n".repeat(n));
        v.push(format!("line{}", "\n ".repeat(n)));
    }
    // digit runs
    for n in 1..=24 {
        let digits: String = (0..n).map(|i| char::from(b'0' + (i * 7 % 10) as u8)).collect();
        v.push(digits.clone());
        v.push(format!(" {digits}"));
        v.push(format!("${digits}.50"));
    }
    v
}

fn chatml(system: &str, user: &str) -> String {
    format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
}

#[test]
fn tokenizer_matches_llama_cpp() {
    let model = assets::smollm2_q4_1();
    let llama = LlamaCppBackend::load(&LlamaConfig { threads: 1, ..LlamaConfig::new(&model) }).expect("load model");
    let tok = Tokenizer::from_gguf_file(&model).expect("tokenizer from GGUF");

    assert_eq!(tok.vocab_size(), llama.n_vocab(), "vocabulary size");
    // Our end-of-generation set is the protocol's: EOS, EOT and end-marker
    // control tokens. llama.cpp also stops on fill-in-the-middle markers it
    // detects by name (`<reponame>` is its FIM_REP heuristic); those are not
    // ends of a chat turn and are deliberately left out.
    let llama_eog: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&id| llama.llama_is_eog(id)).collect();
    let ours: Vec<u32> = tok.eog_ids().collect();
    eprintln!("llama.cpp EOG ids: {llama_eog:?}; ours: {ours:?}");
    assert_eq!(ours, vec![0, 2]);
    for id in &ours {
        assert!(llama_eog.contains(id), "{id} is EOG for us but not for llama.cpp");
    }
    for id in llama_eog.iter().filter(|id| !ours.contains(id)) {
        let text = tok.decode(&[*id]).unwrap();
        assert!(
            ["<reponame>", "<|repo_name|>", "<file_sep>", "<|file_sep|>", "<fim_pad>", "<|fim_pad|>"]
                .contains(&text.as_str()),
            "llama.cpp EOG token {id} {text:?} missing from ours"
        );
    }
    assert_eq!(tok.eos_id(), 2);

    let gsm = std::fs::read_to_string(gsm8k_test_file()).expect("GSM8K test split (shared/data/gsm8k/test.jsonl)");
    let mut cases = Vec::new();
    for line in gsm.lines().filter(|l| !l.trim().is_empty()) {
        let item: serde_json::Value = serde_json::from_str(line).expect("GSM8K line");
        let q = item["question"].as_str().expect("question").to_owned();
        let a = item["answer"].as_str().expect("answer").to_owned();
        if cases.len() < 20 {
            cases.push(chatml("You are a helpful assistant.", &q));
        }
        cases.push(q);
        cases.push(a);
    }
    assert!(cases.len() >= 2 * 1319, "only {} GSM8K strings", cases.len());
    cases.extend(hand_written());

    let mut mismatches = Vec::new();
    for s in &cases {
        let ours = tok.encode(s).expect("encode");
        let theirs = llama.llama_tokenize(s);
        if ours != theirs {
            mismatches.push((s.clone(), ours.clone(), theirs));
        }
        if !s.contains('\u{0}') {
            assert_eq!(&tok.decode(&ours).expect("decode"), s, "decode round trip");
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} strings differ; first: {:?}",
        mismatches.len(),
        cases.len(),
        mismatches.first()
    );
    eprintln!("tokenizer parity: {} strings identical to llama.cpp", cases.len());

    // the ChatML template llama.cpp reports for this model gives the same ids
    let rendered = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(tok.encode(rendered).unwrap(), vec![1, 4093, 198, 19556, 17, 2, 198, 1, 520, 9531, 198]);
}
