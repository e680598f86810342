//! The model's tokenizer, rebuilt from a GGUF file's vocabulary with the
//! Hugging Face `tokenizers` crate, producing exactly the ids llama.cpp
//! produces for `tokenize(text, add_special = false, parse_special = true)`.
//!
//! Recipe (checked against llama.cpp on every GSM8K test question plus
//! unicode, whitespace and special-token cases, `edge-miner/tests/tokenizer_parity.rs`):
//! - model: byte-level BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`
//!   (GGUF `tokenizer.ggml.model = "gpt2"`);
//! - pre-tokenizer by `tokenizer.ggml.pre` ([`PreTokenizer`]):
//!   - `smollm`: single digits, then the GPT-2 regex with byte-level mapping
//!     and no prefix space (`Sequence[Digits(individual), ByteLevel(false, true, true)]`);
//!   - `qwen2` (Qwen2/2.5/3): the Qwen2 regex (single digits) split with
//!     `Isolated`, then byte-level mapping without the GPT-2 regex, as the
//!     models' `tokenizer.json` does and llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2`;
//!   - `llama-bpe` / `llama3` (Llama 3.x): the same with digit runs of up to
//!     three, and BPE that takes a whole pre-token found in the vocabulary
//!     as one id (llama.cpp's `ignore_merges`, HF's `ignore_merges: true`);
//! - every control token (`token_type` 3) is a special added token, matched
//!   verbatim anywhere in the text (so the ChatML markers become single ids),
//!   and every user-defined token (`token_type` 4) an ordinary added token;
//! - no BOS/EOS is added.
//!
//! End-of-generation ids follow llama.cpp: the EOS id, the EOT id when the file
//! names one, and every control token whose text is a known end marker
//! (`<|im_end|>`, `<|endoftext|>`, ...). For SmolLM2 that is `{0, 2}`.

use std::collections::{BTreeSet, HashSet};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

/// GGUF `tokenizer.ggml.token_type` value of an ordinary token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// GGUF `tokenizer.ggml.token_type` value of a control token (`<|im_start|>` ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF `tokenizer.ggml.token_type` value of a user-defined token.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Largest vocabulary accepted from a file (guards allocations on hostile input).
pub const MAX_VOCAB: usize = 1 << 22;

/// Texts that mark the end of generation when they are tokens of the vocabulary
/// (the subset of llama.cpp's list that concerns byte-level BPE chat models).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<eos>",
];

/// The Qwen2 pre-tokenizer regex, as the models' `tokenizer.json` writes it
/// (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` spells the case-insensitive
/// contractions out; same matches).
pub const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Llama 3 pre-tokenizer regex (`tokenizer.json` of Llama 3.x; llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_LLAMA3`): as Qwen2's with digit runs of up to three.
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer this module reproduces, named by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `smollm` (SmolLM/SmolLM2).
    Smollm,
    /// `qwen2` (Qwen2, Qwen2.5, Qwen3).
    Qwen2,
    /// `llama-bpe` or `llama3` (Llama 3.x).
    Llama3,
}

impl PreTokenizer {
    /// The pre-tokenizer `tokenizer.ggml.pre` names, if supported.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        match name {
            "smollm" => Some(Self::Smollm),
            "qwen2" => Some(Self::Qwen2),
            "llama-bpe" | "llama3" => Some(Self::Llama3),
            _ => None,
        }
    }

    /// The `tokenizers` pre-tokenizer (splitting plus byte-level mapping).
    pub fn hf_pre_tokenizer(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = |re: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
            let pattern = tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_owned());
            Ok(Split::new(pattern, SplitDelimiterBehavior::Isolated, false).map_err(hf_err)?.into())
        };
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(match self {
            Self::Smollm => vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()],
            Self::Qwen2 => vec![split(QWEN2_REGEX)?, ByteLevel::new(false, false, false).into()],
            Self::Llama3 => vec![split(LLAMA3_REGEX)?, ByteLevel::new(false, true, false).into()],
        })))
    }

    /// Whether BPE emits a pre-token found whole in the vocabulary as one id.
    pub fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// The pre-tokens `text` splits into (byte-level mapped), before BPE:
    /// where the families' regexes differ, whatever the vocabulary makes of it.
    pub fn pre_tokens(self, text: &str) -> Result<Vec<String>, TokenizerError> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};
        let mut pre = PreTokenizedString::from(text);
        self.hf_pre_tokenizer()?.pre_tokenize(&mut pre).map_err(hf_err)?;
        Ok(pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_owned())
            .collect())
    }
}

/// What can go wrong building or using a [`Tokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is not a byte-level BPE (`gpt2`).
    #[error("unsupported tokenizer model {0:?} (only byte-level BPE \"gpt2\" is supported)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this module cannot reproduce.
    #[error("unsupported pre-tokenizer {0:?} (supported: \"smollm\", \"qwen2\", \"llama-bpe\", \"llama3\")")]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is empty or larger than [`MAX_VOCAB`].
    #[error("vocabulary size {0} out of range 1..={MAX_VOCAB}")]
    VocabSize(usize),
    /// `token_type` does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TokenTypeCount {
        /// Number of tokens.
        tokens: usize,
        /// Number of token types.
        types: usize,
    },
    /// Two ids share one token text.
    #[error("token {0:?} appears twice in the vocabulary")]
    DuplicateToken(String),
    /// A merge rule is not two space-separated tokens.
    #[error("malformed merge rule #{index}: {rule:?}")]
    BadMerge {
        /// Position of the rule.
        index: usize,
        /// The rule's text.
        rule: String,
    },
    /// An id (EOS, EOT, or an id given to `decode`) is outside the vocabulary.
    #[error("token id {id} outside the vocabulary of {vocab}")]
    IdOutOfRange {
        /// The id.
        id: u64,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A required GGUF metadata key is missing or has the wrong type.
    #[error("GGUF metadata: {0}")]
    Metadata(String),
    /// The `tokenizers` crate rejected the model or the input.
    #[error("tokenizers: {0}")]
    Hf(String),
}

/// Everything the tokenizer is built from: the GGUF `tokenizer.ggml.*` values.
#[derive(Debug, Clone, Copy)]
pub struct TokenizerSpec<'a> {
    /// `tokenizer.ggml.model` (must be `"gpt2"`).
    pub model: &'a str,
    /// `tokenizer.ggml.pre` (see [`PreTokenizer::from_gguf_name`]).
    pub pre: &'a str,
    /// `tokenizer.ggml.tokens`, indexed by id (byte-level strings, `Ġ` for space).
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type`, one per token.
    pub token_types: &'a [i32],
    /// `tokenizer.ggml.merges`, each `"left right"`, highest priority first.
    pub merges: &'a [String],
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: u32,
    /// `tokenizer.ggml.eot_token_id`, if present.
    pub eot_id: Option<u32>,
}

/// The model's tokenizer (see the module docs for the exact recipe).
#[derive(Clone)]
pub struct Tokenizer {
    inner: HfTokenizer,
    vocab_size: usize,
    eos_id: u32,
    eog: BTreeSet<u32>,
    special: HashSet<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("eos_id", &self.eos_id)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

fn hf_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF tokenizer metadata.
    pub fn from_spec(spec: TokenizerSpec<'_>) -> Result<Self, TokenizerError> {
        if spec.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(spec.model.to_owned()));
        }
        let pre = PreTokenizer::from_gguf_name(spec.pre)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(spec.pre.to_owned()))?;
        let n = spec.tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(TokenizerError::VocabSize(n));
        }
        if spec.token_types.len() != n {
            return Err(TokenizerError::TokenTypeCount { tokens: n, types: spec.token_types.len() });
        }
        let check_id = |id: u32| {
            if (id as usize) < n { Ok(id) } else { Err(TokenizerError::IdOutOfRange { id: u64::from(id), vocab: n }) }
        };
        let eos_id = check_id(spec.eos_id)?;
        let eot_id = spec.eot_id.map(check_id).transpose()?;

        let mut vocab = Vocab::default();
        vocab.reserve(n);
        for (id, tok) in spec.tokens.iter().enumerate() {
            // n <= MAX_VOCAB < u32::MAX, so the cast is exact.
            if vocab.insert(tok.clone(), id as u32).is_some() {
                return Err(TokenizerError::DuplicateToken(tok.clone()));
            }
        }
        let mut merges = Vec::with_capacity(spec.merges.len().min(MAX_VOCAB));
        for (index, rule) in spec.merges.iter().enumerate() {
            match rule.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    merges.push((a.to_owned(), b.to_owned()));
                }
                _ => return Err(TokenizerError::BadMerge { index, rule: rule.clone() }),
            }
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(hf_err)?;
        let mut inner = HfTokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.hf_pre_tokenizer()?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let mut special = HashSet::new();
        let mut eog = BTreeSet::from([eos_id]);
        eog.extend(eot_id);
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (id, (tok, &ty)) in spec.tokens.iter().zip(spec.token_types).enumerate() {
            match ty {
                TOKEN_TYPE_CONTROL => {
                    special.insert(id as u32);
                    control.push(AddedToken::from(tok.clone(), true));
                    if EOG_TEXTS.contains(&tok.as_str()) {
                        eog.insert(id as u32);
                    }
                }
                TOKEN_TYPE_USER_DEFINED => user.push(AddedToken::from(tok.clone(), false)),
                _ => {}
            }
        }
        inner.add_special_tokens(control).map_err(hf_err)?;
        inner.add_tokens(user).map_err(hf_err)?;
        Ok(Self { inner, vocab_size: n, eos_id, eog, special })
    }

    /// Builds the tokenizer from a parsed GGUF header
    /// (`tokenizer.ggml.{model, pre, tokens, token_type, merges, eos_token_id, eot_token_id}`).
    pub fn from_gguf(header: &crate::gguf::GgufHeader) -> Result<Self, TokenizerError> {
        let missing = |key: &str| TokenizerError::Metadata(format!("{key} missing or of the wrong type"));
        let str_key = |key: &str| header.get_str(key).ok_or_else(|| missing(key));
        let tokens = header.get_str_array("tokenizer.ggml.tokens").ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let merges = header.get_str_array("tokenizer.ggml.merges").ok_or_else(|| missing("tokenizer.ggml.merges"))?;
        let token_types =
            header.get_i32_array("tokenizer.ggml.token_type").ok_or_else(|| missing("tokenizer.ggml.token_type"))?;
        let eos_id =
            header.get_u32("tokenizer.ggml.eos_token_id").ok_or_else(|| missing("tokenizer.ggml.eos_token_id"))?;
        Self::from_spec(TokenizerSpec {
            model: str_key("tokenizer.ggml.model")?,
            pre: str_key("tokenizer.ggml.pre")?,
            tokens,
            token_types,
            merges,
            eos_id,
            eot_id: header.get_u32("tokenizer.ggml.eot_token_id"),
        })
    }

    /// Builds the tokenizer from an opened checkpoint's GGUF metadata.
    pub fn from_checkpoint(ckpt: &crate::checkpoint::Checkpoint) -> Result<Self, TokenizerError> {
        Self::from_gguf(ckpt.header())
    }

    /// Builds the tokenizer from the metadata of the GGUF file at `path`
    /// (any GGUF, including quantized files [`Checkpoint`](crate::checkpoint::Checkpoint) rejects).
    pub fn from_gguf_file(path: &std::path::Path) -> Result<Self, TokenizerError> {
        let io = |e: std::io::Error| TokenizerError::Metadata(format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and dropped before returning; a file
        // truncated underneath would fault, as with any mmap'ed model file.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header = crate::gguf::parse_header(&map)
            .map_err(|e| TokenizerError::Metadata(format!("{}: {e}", path.display())))?;
        Self::from_gguf(&header)
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`)
    /// become their single ids. No BOS/EOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.inner.encode_fast(text, false).map_err(hf_err)?.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens rendered verbatim. Invalid UTF-8 that
    /// a partial byte sequence leaves behind becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::IdOutOfRange { id: u64::from(id), vocab: self.vocab_size });
        }
        self.inner.decode(ids, false).map_err(hf_err)
    }

    /// The end-of-sequence id (`<|im_end|>` for SmolLM2-Instruct).
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// Whether generation stops at `id` (EOS, EOT or another end marker).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Whether `id` is a control (special) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn toy() -> (Vec<String>, Vec<i32>, Vec<String>) {
        let mut tokens: Vec<String> =
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].iter().map(|s| s.to_string()).collect();
        let mut types = vec![TOKEN_TYPE_CONTROL; 3];
        // every byte-level character, so any text is encodable
        let bl = ByteLevel::alphabet();
        let mut chars: Vec<char> = bl.into_iter().collect();
        chars.sort_unstable();
        for c in chars {
            tokens.push(c.to_string());
            types.push(TOKEN_TYPE_NORMAL);
        }
        tokens.push("he".into());
        types.push(TOKEN_TYPE_NORMAL);
        tokens.push("Ġhe".into());
        types.push(TOKEN_TYPE_NORMAL);
        let merges = vec!["h e".to_string(), "Ġ he".to_string()];
        (tokens, types, merges)
    }

    pub(crate) fn spec<'a>(t: &'a [String], ty: &'a [i32], m: &'a [String]) -> TokenizerSpec<'a> {
        TokenizerSpec { model: "gpt2", pre: "smollm", tokens: t, token_types: ty, merges: m, eos_id: 2, eot_id: None }
    }

    #[test]
    fn toy_vocab_round_trips_and_parses_specials() {
        let (t, ty, m) = toy();
        let tok = Tokenizer::from_spec(spec(&t, &ty, &m)).unwrap();
        let ids = tok.encode("<|im_start|>he he 12<|im_end|>").unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(*ids.last().unwrap(), 2);
        let he = t.iter().position(|s| s == "he").unwrap() as u32;
        let ghe = t.iter().position(|s| s == "Ġhe").unwrap() as u32;
        assert_eq!(&ids[1..3], &[he, ghe]);
        assert_eq!(tok.decode(&ids).unwrap(), "<|im_start|>he he 12<|im_end|>");
        assert!(tok.is_eog(0) && tok.is_eog(2) && !tok.is_eog(1));
        assert!(tok.decode(&[t.len() as u32]).is_err());
    }

    #[test]
    fn family_pre_tokenizers_split_where_their_regexes_differ() {
        let split = |p: PreTokenizer, s: &str| p.pre_tokens(s).unwrap();
        use PreTokenizer::{Llama3, Qwen2, Smollm};
        // Upper-case contractions: GPT-2's are case-sensitive.
        assert_eq!(split(Smollm, "DON'T"), ["DON", "'", "T"]);
        assert_eq!(split(Qwen2, "DON'T"), ["DON", "'T"]);
        // A mark glued to the letters after it.
        assert_eq!(split(Smollm, "x.append"), ["x", ".", "append"]);
        assert_eq!(split(Qwen2, "x.append"), ["x", ".append"]);
        // Digits: one at a time, or up to three (Llama 3).
        assert_eq!(split(Qwen2, "12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(split(Smollm, "12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(split(Llama3, "12345"), ["123", "45"]);
        // A mark keeps the line breaks after it.
        assert_eq!(split(Qwen2, "end.\n\nx"), ["end", ".ĊĊ", "x"]);
        assert_eq!(split(Smollm, "end.\n\nx"), ["end", ".", "Ċ", "Ċ", "x"]);
    }

    #[test]
    fn rejects_bad_metadata() {
        let (t, ty, m) = toy();
        assert!(matches!(
            Tokenizer::from_spec(TokenizerSpec { pre: "gpt-4o", ..spec(&t, &ty, &m) }),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
        assert!(matches!(Tokenizer::from_spec(spec(&t, &ty[1..], &m)), Err(TokenizerError::TokenTypeCount { .. })));
        let bad = vec!["hе".to_string()];
        assert!(matches!(Tokenizer::from_spec(spec(&t, &ty, &bad)), Err(TokenizerError::BadMerge { .. })));
        let mut dup = t.clone();
        dup[5] = dup[4].clone();
        assert!(matches!(Tokenizer::from_spec(spec(&dup, &ty, &m)), Err(TokenizerError::DuplicateToken(_))));
        assert!(matches!(
            Tokenizer::from_spec(TokenizerSpec { eos_id: 1 << 30, ..spec(&t, &ty, &m) }),
            Err(TokenizerError::IdOutOfRange { .. })
        ));
    }
}
