//! Hugging Face export: `model.safetensors` (BF16), `config.json`,
//! `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`
//! for `LlamaForCausalLM`, from any checkpoint.
//!
//! GGUF files store Q and K projection rows permuted for llama.cpp's
//! adjacent-pair RoPE (`convert_hf_to_gguf.py`'s `permute`: rows
//! `(head, half, pair)` ← HF rows `(head, pair, half)`); the export applies
//! the inverse so transformers' rotate-half RoPE computes the same model.

use std::path::Path;

use serde_json::{Value, json};
use tch::{Kind, Tensor};
use tributary_protocol::checkpoint::{Checkpoint, CheckpointError};

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

/// Inverse of `convert_hf_to_gguf.py`'s Q/K permutation for `[out, in]`
/// weights with `n_head` heads.
pub fn unpermute(w: &Tensor, n_head: i64) -> Result<Tensor, tch::TchError> {
    let s = w.size();
    let (out, inp) = (s[0], s[1]);
    w.f_reshape([n_head, out / n_head / 2, 2, inp])?.f_transpose(1, 2)?.f_reshape([out, inp])
}

/// `convert_hf_to_gguf.py`'s Q/K permutation (for tests).
pub fn permute(w: &Tensor, n_head: i64) -> Tensor {
    let s = w.size();
    let (out, inp) = (s[0], s[1]);
    w.reshape([n_head, 2, out / n_head / 2, inp]).transpose(1, 2).reshape([out, inp])
}

/// Writes the HF export of `ckpt` into `dir`.
pub fn export(ckpt: &Checkpoint, dir: &Path) -> Result<(), HfError> {
    std::fs::create_dir_all(dir).map_err(|source| HfError::Io { path: dir.to_path_buf(), source })?;
    let c = *ckpt.config();
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for info in &ckpt.header().tensors {
        let name = hf_name(&info.name).ok_or_else(|| HfError::UnknownTensor(info.name.clone()))?;
        let data = ckpt.tensor_f32(&info.name)?;
        let shape: Vec<i64> = info.dims.iter().rev().map(|&d| d as i64).collect();
        let mut t = Tensor::f_from_slice(&data)?.f_reshape(shape)?;
        if info.name.ends_with("attn_q.weight") {
            t = unpermute(&t, c.n_head as i64)?;
        } else if info.name.ends_with("attn_k.weight") {
            t = unpermute(&t, c.n_head_kv as i64)?;
        }
        tensors.push((name, t.f_to_kind(Kind::BFloat16)?.f_contiguous()?));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors"))?;

    let h = ckpt.header();
    let id = |k: &str| h.get_u32(k).map(Value::from).unwrap_or(Value::Null);
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "head_dim": c.head_dim(),
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": ckpt.tied_embeddings(),
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
        "pad_token_id": id("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
        "tributary_content_id": ckpt.content_id().to_string(),
    });
    write(dir.join("config.json"), &serde_json::to_vec_pretty(&config)?)?;
    write(
        dir.join("generation_config.json"),
        &serde_json::to_vec_pretty(
            &json!({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}),
        )?,
    )?;
    write_tokenizer(ckpt, dir)
}

/// `tokenizer.json` (byte-level BPE with single-digit splitting, as
/// SmolLM2's) and `tokenizer_config.json` from the GGUF vocabulary.
fn write_tokenizer(ckpt: &Checkpoint, dir: &Path) -> Result<(), HfError> {
    let h = ckpt.header();
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
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    write(dir.join("tokenizer.json"), &serde_json::to_vec(&tok)?)?;
    let name = |k: &str| h.get_u32(k).and_then(|i| tokens.get(i as usize)).cloned();
    let cfg = json!({
        "tokenizer_class": "GPT2Tokenizer",
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
    }
}
