//! Hugging Face interchange, both ways.
//!
//! - [`export`]: `model.safetensors` (BF16), `config.json`, `tokenizer.json`,
//!   `tokenizer_config.json` and `generation_config.json` for
//!   `LlamaForCausalLM`, `Qwen2ForCausalLM` or `Qwen3ForCausalLM`, from any
//!   checkpoint.
//! - [`import`] (`trainer import-hf`): a transformers folder (`config.json`,
//!   `model.safetensors`) of one of those families into a GGUF checkpoint
//!   written as llama.cpp's `convert_hf_to_gguf.py` writes it (its tensor
//!   names and keys, `rope_freqs` for Llama 3 scaling, `key_length` for a
//!   head size that does not divide the width), BF16 matrices (or F32) and
//!   F32 vectors, with the tokenizer of a given GGUF.
//!
//! `llama` GGUF files store Q and K projection rows (and biases) permuted for
//! llama.cpp's adjacent-pair RoPE (`convert_hf_to_gguf.py`'s `permute`: rows
//! `(head, half, pair)` ← HF rows `(head, pair, half)`); the import applies it
//! and the export the inverse, so transformers' rotate-half RoPE computes the
//! same model. `qwen2`/`qwen3` use NEOX RoPE in llama.cpp, which is HF's
//! rotate-half: their rows are not permuted.

use std::path::Path;

use serde_json::{Value, json};
use tch::{Kind, Tensor};
use tributary_protocol::checkpoint::{Arch, Checkpoint, CheckpointError, ContentId, FILE_TYPE_MOSTLY_BF16};
use tributary_protocol::gguf::{GgmlType, GgufError, GgufWriter, MetaValue};
use tributary_protocol::quant;
use tributary_protocol::tiny::{HF_ROPE_SCALING_KEY, llama3_rope_freqs};
use tributary_protocol::tokenizer::{LLAMA3_REGEX, PreTokenizer, QWEN2_REGEX};

/// Errors of the Hugging Face export.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// Writing a file or folder failed.
    #[error("I/O on {path}: {source}")]
    Io {
        /// The file or folder.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A tensor could not be read from the checkpoint.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// libtorch failed (reshaping, converting or writing safetensors).
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    /// A JSON file could not be serialised.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A GGUF tensor has no Hugging Face counterpart.
    #[error("no Hugging Face name for tensor {0}")]
    UnknownTensor(String),
    /// The GGUF lacks tokenizer metadata the export needs.
    #[error("GGUF has no {0}")]
    MissingMetadata(&'static str),
    /// A Hugging Face config asks for something the project does not run,
    /// or lacks a field it needs.
    #[error("Hugging Face config: {0}")]
    Config(String),
    /// The RoPE scaling of a checkpoint cannot be written as a transformers
    /// config (parameters missing, or not those of its `rope_freqs`).
    #[error("RoPE scaling: {0}")]
    RopeScaling(String),
    /// Writing the GGUF failed.
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
}

fn write(path: std::path::PathBuf, bytes: &[u8]) -> Result<(), HfError> {
    std::fs::write(&path, bytes).map_err(|source| HfError::Io { path, source })
}

/// HF name of a GGUF tensor.
pub fn hf_name(gguf: &str) -> Option<String> {
    Some(match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => {
            let rest = gguf.strip_prefix("blk.")?;
            let (layer, t) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let hf = match t {
                "attn_q.bias" => "self_attn.q_proj.bias",
                "attn_k.bias" => "self_attn.k_proj.bias",
                "attn_v.bias" => "self_attn.v_proj.bias",
                "attn_q_norm.weight" => "self_attn.q_norm.weight",
                "attn_k_norm.weight" => "self_attn.k_norm.weight",
                "attn_norm.weight" => "input_layernorm.weight",
                "ffn_norm.weight" => "post_attention_layernorm.weight",
                "attn_q.weight" => "self_attn.q_proj.weight",
                "attn_k.weight" => "self_attn.k_proj.weight",
                "attn_v.weight" => "self_attn.v_proj.weight",
                "attn_output.weight" => "self_attn.o_proj.weight",
                "ffn_gate.weight" => "mlp.gate_proj.weight",
                "ffn_up.weight" => "mlp.up_proj.weight",
                "ffn_down.weight" => "mlp.down_proj.weight",
                _ => return None,
            };
            format!("model.layers.{layer}.{hf}")
        }
    })
}

/// GGUF name of an HF tensor (the inverse of [`hf_name`]).
pub fn gguf_name(hf: &str) -> Option<String> {
    Some(match hf {
        "model.embed_tokens.weight" => "token_embd.weight".into(),
        "model.norm.weight" => "output_norm.weight".into(),
        "lm_head.weight" => "output.weight".into(),
        _ => {
            let rest = hf.strip_prefix("model.layers.")?;
            let (layer, t) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let name = format!("blk.{layer}.{}", GGUF_BLOCK.iter().find(|(_, h)| *h == t)?.0);
            (hf_name(&name)? == hf).then_some(name)?
        }
    })
}

/// Block tensors: GGUF suffix, HF suffix.
const GGUF_BLOCK: [(&str, &str); 14] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// Inverse of `convert_hf_to_gguf.py`'s Q/K permutation for `[out, in]`
/// weights (or `[out]` biases) with `n_head` heads.
pub fn unpermute(w: &Tensor, n_head: i64) -> Result<Tensor, tch::TchError> {
    let s = w.size();
    let (out, inp) = (s[0], s.get(1).copied().unwrap_or(1));
    w.f_reshape([n_head, out / n_head / 2, 2, inp])?.f_transpose(1, 2)?.f_reshape(s.as_slice())
}

/// `convert_hf_to_gguf.py`'s Q/K permutation (`[out, in]` or `[out]`).
pub fn permute(w: &Tensor, n_head: i64) -> Tensor {
    let s = w.size();
    let (out, inp) = (s[0], s.get(1).copied().unwrap_or(1));
    w.reshape([n_head, 2, out / n_head / 2, inp]).transpose(1, 2).reshape(s.as_slice())
}

/// transformers' class and `model_type` of an architecture.
fn hf_class(arch: Arch) -> (&'static str, &'static str) {
    match arch {
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
    }
}

/// The Llama 3 scaling parameters (factor, low and high frequency factors,
/// original context) of an HF `rope_scaling`/`rope_parameters` object.
fn llama3_params(v: &Value) -> Result<(f64, f64, f64, f64), HfError> {
    let num = |k: &str, default: f64| -> Result<f64, HfError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_f64().ok_or_else(|| HfError::RopeScaling(format!("{k} is not a number"))),
        }
    };
    // The converter's defaults (convert_hf_to_gguf.py, LlamaModel).
    Ok((
        num("factor", 8.0)?,
        num("low_freq_factor", 1.0)?,
        num("high_freq_factor", 4.0)?,
        num("original_max_position_embeddings", 8192.0)?,
    ))
}

/// Writes the HF export of `ckpt` into `dir`.
pub fn export(ckpt: &Checkpoint, dir: &Path) -> Result<(), HfError> {
    std::fs::create_dir_all(dir).map_err(|source| HfError::Io { path: dir.to_path_buf(), source })?;
    let c = *ckpt.config();
    let h = ckpt.header();
    let rope_scaling = hf_rope_scaling(ckpt)?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for info in &h.tensors {
        if info.name == "rope_freqs.weight" {
            continue; // config.json's rope_scaling says it
        }
        let name = hf_name(&info.name).ok_or_else(|| HfError::UnknownTensor(info.name.clone()))?;
        let data = ckpt.tensor_f32(&info.name)?;
        let shape: Vec<i64> = info.dims.iter().rev().map(|&d| d as i64).collect();
        let mut t = Tensor::f_from_slice(&data)?.f_reshape(shape)?;
        if c.arch == Arch::Llama {
            if info.name.ends_with("attn_q.weight") || info.name.ends_with("attn_q.bias") {
                t = unpermute(&t, c.n_head as i64)?;
            } else if info.name.ends_with("attn_k.weight") || info.name.ends_with("attn_k.bias") {
                t = unpermute(&t, c.n_head_kv as i64)?;
            }
        }
        // Matrices BF16 as the checkpoint; vectors (norms, biases) keep their f32 values.
        let kind = if info.dims.len() >= 2 { Kind::BFloat16 } else { Kind::Float };
        tensors.push((name, t.f_to_kind(kind)?.f_contiguous()?));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors"))?;

    let id = |k: &str| h.get_u32(k).map(Value::from).unwrap_or(Value::Null);
    let (class, model_type) = hf_class(c.arch);
    let mut rope_parameters = json!({"rope_type": "default", "rope_theta": c.rope_theta});
    if let Some(Value::Object(m)) = &rope_scaling {
        for (k, v) in m {
            rope_parameters[k] = v.clone();
        }
    }
    let mut config = json!({
        "architectures": [class],
        "model_type": model_type,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "head_dim": c.head_dim(),
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": ckpt.tied_embeddings(),
        "attention_bias": c.qkv_bias,
        "mlp_bias": false,
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
        "pad_token_id": id("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "tributary_content_id": ckpt.content_id().to_string(),
    });
    if c.arch != Arch::Llama {
        config["use_sliding_window"] = json!(false);
        config["sliding_window"] = Value::Null;
        config["max_window_layers"] = json!(c.n_layer);
    }
    write(dir.join("config.json"), &serde_json::to_vec_pretty(&config)?)?;
    write(
        dir.join("generation_config.json"),
        &serde_json::to_vec_pretty(
            &json!({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}),
        )?,
    )?;
    write_tokenizer(ckpt, dir)
}

/// The HF `rope_scaling` object of a checkpoint: `None` without
/// `rope_freqs.weight`; with it, the parameters [`HF_ROPE_SCALING_KEY`]
/// records, checked to give exactly the file's factors.
fn hf_rope_scaling(ckpt: &Checkpoint) -> Result<Option<Value>, HfError> {
    let c = ckpt.config();
    if !c.rope_freqs {
        return Ok(None);
    }
    let text = ckpt.header().get_str(HF_ROPE_SCALING_KEY).ok_or_else(|| {
        HfError::RopeScaling(format!("rope_freqs.weight without the {HF_ROPE_SCALING_KEY} parameters"))
    })?;
    let v: Value = serde_json::from_str(text)?;
    if v.get("rope_type").and_then(Value::as_str) != Some("llama3") {
        return Err(HfError::RopeScaling(format!("{HF_ROPE_SCALING_KEY} is not llama3: {text}")));
    }
    let want = llama3_rope_freqs(f64::from(c.rope_theta), c.head_dim(), llama3_params(&v)?);
    if ckpt.tensor_f32("rope_freqs.weight")? != want {
        return Err(HfError::RopeScaling(format!("rope_freqs.weight is not what {text} gives")));
    }
    Ok(Some(v))
}

/// `tokenizer.json` (byte-level BPE with the checkpoint's pre-tokenizer)
/// and `tokenizer_config.json` from the GGUF vocabulary.
fn write_tokenizer(ckpt: &Checkpoint, dir: &Path) -> Result<(), HfError> {
    let h = ckpt.header();
    let pre_name = h.get_str("tokenizer.ggml.pre").ok_or(HfError::MissingMetadata("tokenizer.ggml.pre"))?;
    let pre = PreTokenizer::from_gguf_name(pre_name)
        .ok_or_else(|| HfError::Config(format!("no transformers pre-tokenizer for {pre_name:?}")))?;
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    let pre_tokenizer = match pre {
        PreTokenizer::Smollm => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]}),
        PreTokenizer::Qwen2 => json!({"type": "Sequence", "pretokenizers": [
            split(QWEN2_REGEX),
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]}),
        PreTokenizer::Llama3 => json!({"type": "Sequence", "pretokenizers": [
            split(LLAMA3_REGEX),
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]}),
    };
    let tokens = h.get_str_array("tokenizer.ggml.tokens").ok_or(HfError::MissingMetadata("tokenizer.ggml.tokens"))?;
    let merges = h.get_str_array("tokenizer.ggml.merges").ok_or(HfError::MissingMetadata("tokenizer.ggml.merges"))?;
    let types = h.get_i32_array("tokenizer.ggml.token_type").unwrap_or(&[]);
    let vocab: serde_json::Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == 3 || **ty == 4)
        .map(|(i, (t, ty))| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": *ty == 4, "special": *ty == 3})
        })
        .collect();
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": pre.ignore_merges(), "vocab": vocab, "merges": merges},
    });
    write(dir.join("tokenizer.json"), &serde_json::to_vec(&tok)?)?;
    let name = |k: &str| h.get_u32(k).and_then(|i| tokens.get(i as usize)).cloned();
    let cfg = json!({
        "tokenizer_class": if pre == PreTokenizer::Smollm { "GPT2Tokenizer" } else { "PreTrainedTokenizerFast" },
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": ckpt.config().context_length,
        "chat_template": h.get_str("tokenizer.chat_template"),
    });
    write(dir.join("tokenizer_config.json"), &serde_json::to_vec_pretty(&cfg)?)?;
    Ok(())
}

/// Options of [`import`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ImportOptions {
    /// Keep matrices F32 instead of rounding them to BF16.
    pub f32: bool,
}

/// Converts the transformers folder `dir` (`config.json`, one
/// `model.safetensors`) of a `llama`, `qwen2` or `qwen3` model into the GGUF
/// checkpoint `out` (written atomically), with the tokenizer metadata of
/// `tokenizer_src` (its `tokenizer.ggml.pre` set to the family's: `qwen2` for
/// the Qwen families, `llama-bpe` for a Llama 3 model). Returns the content id.
/// A setting the project does not compute is a typed error, never dropped.
pub fn import(dir: &Path, tokenizer_src: &Checkpoint, out: &Path, opts: ImportOptions) -> Result<ContentId, HfError> {
    let io = |path: std::path::PathBuf| move |source| HfError::Io { path, source };
    let cfg_path = dir.join("config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).map_err(io(cfg_path.clone()))?)?;
    let bad = |m: String| HfError::Config(m);
    let model_type = cfg.get("model_type").and_then(Value::as_str).ok_or_else(|| bad("no model_type".into()))?;
    let arch = Arch::from_name(model_type)
        .ok_or_else(|| bad(format!("model_type {model_type:?} (supported: llama, qwen2, qwen3)")))?;
    let int = |k: &str| -> Result<u64, HfError> {
        cfg.get(k).and_then(Value::as_u64).ok_or_else(|| bad(format!("{k} missing or not an integer")))
    };
    let opt_int = |k: &str| -> Result<Option<u64>, HfError> {
        match cfg.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(format!("{k} is not an integer"))),
        }
    };
    let flag = |k: &str| cfg.get(k).and_then(Value::as_bool).unwrap_or(false);
    let (d, ff, n_layer, n_head) =
        (int("hidden_size")?, int("intermediate_size")?, int("num_hidden_layers")?, int("num_attention_heads")?);
    let n_kv = opt_int("num_key_value_heads")?.unwrap_or(n_head);
    let ctx = int("max_position_embeddings")?;
    let vocab = int("vocab_size")?;
    if n_head == 0 || n_kv == 0 {
        return Err(bad("zero heads".into()));
    }
    let head_dim = match opt_int("head_dim")? {
        Some(h) => h,
        None if d % n_head == 0 => d / n_head,
        None => return Err(bad("hidden_size is not a multiple of num_attention_heads and no head_dim".into())),
    };
    let eps = cfg.get("rms_norm_eps").and_then(Value::as_f64).ok_or_else(|| bad("rms_norm_eps missing".into()))?;
    if let Some(act) = cfg.get("hidden_act").and_then(Value::as_str)
        && act != "silu"
    {
        return Err(bad(format!("hidden_act {act:?} (only silu)")));
    }
    if flag("mlp_bias") || flag("use_sliding_window") {
        return Err(bad("mlp_bias or use_sliding_window is set".into()));
    }
    if arch == Arch::Qwen3 && flag("attention_bias") {
        return Err(bad("qwen3 with attention_bias".into()));
    }
    // RoPE: transformers 5 writes rope_parameters (theta inside), 4 rope_theta + rope_scaling.
    let rope = cfg.get("rope_parameters").filter(|v| v.is_object());
    let scaling = rope.or_else(|| cfg.get("rope_scaling").filter(|v| v.is_object()));
    let theta = rope
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| cfg.get("rope_theta"))
        .map(|v| v.as_f64().ok_or_else(|| bad("rope_theta is not a number".into())))
        .transpose()?
        .unwrap_or(10_000.0);
    let rope_type =
        scaling.and_then(|s| s.get("rope_type").or_else(|| s.get("type"))).and_then(Value::as_str).unwrap_or("default");
    let llama3 = match rope_type {
        "default" => None,
        "llama3" if arch == Arch::Llama => {
            let p = scaling.map(llama3_params).transpose()?.unwrap_or((8.0, 1.0, 4.0, 8192.0));
            Some(p)
        }
        other => return Err(bad(format!("rope type {other:?} for {model_type} is not supported"))),
    };
    let tied = flag("tie_word_embeddings");

    // Tensors.
    let st_path = dir.join("model.safetensors");
    if !st_path.exists() {
        return Err(HfError::Io {
            path: st_path,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "one model.safetensors expected (sharded folders are not read)",
            ),
        });
    }
    let tensors = Tensor::read_safetensors(&st_path)?;
    let mut by_name: std::collections::BTreeMap<String, Tensor> = std::collections::BTreeMap::new();
    for (hf, t) in tensors {
        if tied && hf == "lm_head.weight" {
            continue; // the tied head is the embedding
        }
        let name = gguf_name(&hf).ok_or(HfError::UnknownTensor(hf))?;
        let mut t = t.f_to_kind(Kind::Float)?;
        if arch == Arch::Llama {
            if name.ends_with("attn_q.weight") || name.ends_with("attn_q.bias") {
                t = permute(&t, n_head as i64);
            } else if name.ends_with("attn_k.weight") || name.ends_with("attn_k.bias") {
                t = permute(&t, n_kv as i64);
            }
        }
        by_name.insert(name, t);
    }

    let src_tokens = tokenizer_src
        .header()
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or(HfError::MissingMetadata("tokenizer.ggml.tokens"))?;
    if src_tokens.len() as u64 != vocab {
        return Err(bad(format!("vocab_size {vocab}, but the tokenizer source has {} tokens", src_tokens.len())));
    }

    let a = arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let mut w = GgufWriter::new();
    w.set_meta("general.architecture", MetaValue::Str(a.into()));
    w.set_meta("general.name", MetaValue::Str(format!("imported from {}", dir.display())));
    w.set_meta("general.file_type", MetaValue::U32(if opts.f32 { 0 } else { FILE_TYPE_MOSTLY_BF16 }));
    let u32v = |x: u64| -> Result<MetaValue, HfError> {
        Ok(MetaValue::U32(u32::try_from(x).map_err(|_| bad(format!("{x} out of range")))?))
    };
    w.set_meta(&k("block_count"), u32v(n_layer)?);
    w.set_meta(&k("context_length"), u32v(ctx)?);
    w.set_meta(&k("embedding_length"), u32v(d)?);
    w.set_meta(&k("feed_forward_length"), u32v(ff)?);
    w.set_meta(&k("attention.head_count"), u32v(n_head)?);
    w.set_meta(&k("attention.head_count_kv"), u32v(n_kv)?);
    w.set_meta(&k("rope.freq_base"), MetaValue::F32(theta as f32));
    w.set_meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(eps as f32));
    if head_dim * n_head != d || arch == Arch::Qwen3 {
        w.set_meta(&k("attention.key_length"), u32v(head_dim)?);
        w.set_meta(&k("attention.value_length"), u32v(head_dim)?);
    }
    w.set_meta(&k("rope.dimension_count"), u32v(head_dim)?);
    w.set_meta(&k("vocab_size"), u32v(vocab)?);
    if let Some(p) = llama3 {
        let json = json!({"rope_type": "llama3", "factor": p.0, "low_freq_factor": p.1, "high_freq_factor": p.2,
                          "original_max_position_embeddings": p.3 as u64});
        w.set_meta(HF_ROPE_SCALING_KEY, MetaValue::Str(json.to_string()));
    }
    for (key, v) in &tokenizer_src.header().metadata {
        if key.starts_with("tokenizer.") {
            w.set_meta(key, v.clone());
        }
    }
    let pre = match (arch, llama3.is_some()) {
        (Arch::Qwen2 | Arch::Qwen3, _) => Some("qwen2"),
        (Arch::Llama, true) => Some("llama-bpe"),
        (Arch::Llama, false) => None,
    };
    if let Some(pre) = pre {
        w.set_meta("tokenizer.ggml.pre", MetaValue::Str(pre.into()));
    }

    // llama.cpp's converter's order: embedding, rope_freqs, blocks, final norm, head.
    let mut order: Vec<String> = vec!["token_embd.weight".into()];
    for l in 0..n_layer {
        order.extend(GGUF_BLOCK.iter().map(|(g, _)| format!("blk.{l}.{g}")));
    }
    order.extend(["output_norm.weight".into(), "output.weight".into()]);
    let write_tensor = |w: &mut GgufWriter<'_>, name: &str, t: &Tensor| -> Result<(), HfError> {
        let dims: Vec<u64> = t.size().iter().rev().map(|&x| x as u64).collect();
        let v: Vec<f32> = Vec::try_from(&t.f_contiguous()?.f_flatten(0, -1)?)?;
        let (ty, bytes) = if dims.len() >= 2 && !opts.f32 {
            (GgmlType::BF16, quant::f32_to_bf16_bytes(&v))
        } else {
            (GgmlType::F32, quant::f32_to_le_bytes(&v))
        };
        w.add_tensor(name, ty, &dims, bytes)?;
        Ok(())
    };
    if let Some(p) = llama3 {
        let f = llama3_rope_freqs(theta, head_dim as usize, p);
        w.add_tensor("rope_freqs.weight", GgmlType::F32, &[f.len() as u64], quant::f32_to_le_bytes(&f))?;
    }
    for name in &order {
        if let Some(t) = by_name.remove(name) {
            write_tensor(&mut w, name, &t)?;
        }
    }
    if let Some(name) = by_name.keys().next() {
        return Err(HfError::UnknownTensor(name.clone()));
    }
    // Validated before anything is written: a file the project would refuse never lands at `out`.
    let ckpt = Checkpoint::from_bytes(w.to_bytes()?)?;
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, ckpt.bytes())
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|source| HfError::Io { path: out.to_path_buf(), source })?;
    Ok(ckpt.content_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_the_gguf_permutation() {
        // 2 heads of dim 4, in = 1: HF rows per head (r0 r1 | r2 r3) — the
        // rotate-half pairs are (r0, r2), (r1, r3); GGUF puts pairs adjacent.
        let hf = Tensor::from_slice(&[0f32, 1., 2., 3., 10., 11., 12., 13.]).reshape([8, 1]);
        let gg = permute(&hf, 2);
        let got: Vec<f32> = Vec::try_from(gg.flatten(0, -1)).unwrap();
        assert_eq!(got, vec![0., 2., 1., 3., 10., 12., 11., 13.]);
        let back = unpermute(&gg, 2).unwrap();
        assert!(back.equal(&hf));
        let w = Tensor::randn([12, 5], (Kind::Float, tch::Device::Cpu));
        assert!(unpermute(&permute(&w, 3), 3).unwrap().equal(&w));
    }

    #[test]
    fn names_map() {
        assert_eq!(hf_name("blk.12.attn_k.weight").as_deref(), Some("model.layers.12.self_attn.k_proj.weight"));
        assert_eq!(hf_name("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(hf_name("blk.x.attn_k.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
        for g in [
            "blk.3.attn_q.bias",
            "blk.0.attn_k_norm.weight",
            "blk.1.ffn_down.weight",
            "output.weight",
            "token_embd.weight",
        ] {
            assert_eq!(gguf_name(&hf_name(g).unwrap()).as_deref(), Some(g));
        }
        assert_eq!(gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"), None);
        assert_eq!(gguf_name("model.layers.0.mlp.gate_proj.bias"), None);
    }

    #[test]
    fn biases_permute_like_their_rows() {
        let w = Tensor::randn([12, 5], (Kind::Float, tch::Device::Cpu));
        let b = Tensor::randn([12], (Kind::Float, tch::Device::Cpu));
        let (pw, pb) = (permute(&w, 3), permute(&b, 3));
        assert!(pb.equal(&permute(&b.unsqueeze(1), 3).squeeze_dim(1)));
        // Row i of the permuted weight keeps the bias of the same source row.
        let x = Tensor::randn([5], (Kind::Float, tch::Device::Cpu));
        let y = w.mv(&x) + &b;
        assert!(permute(&y.unsqueeze(1), 3).squeeze_dim(1).allclose(&(pw.mv(&x) + &pb), 1e-6, 1e-6, false));
        assert!(unpermute(&pb, 3).unwrap().equal(&b));
    }
}
