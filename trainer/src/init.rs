//! `trainer init-base`, `init-tiny` and `info`: make and inspect checkpoints.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_protocol::checkpoint::{Checkpoint, ContentId, convert_to_bf16_with_progress};
use tributary_protocol::gguf::GgmlType;
use tributary_protocol::tiny;

/// Whether `ck` is already a BF16 checkpoint of `src`'s model: same config,
/// same tensors, matrices BF16 and vectors F32.
fn is_bf16_of(ck: &Checkpoint, src: &Checkpoint) -> bool {
    ck.config() == src.config()
        && ck.header().tensors.len() == src.header().tensors.len()
        && ck.header().tensors.iter().all(|t| {
            let want = if t.dims.len() >= 2 { GgmlType::BF16 } else { GgmlType::F32 };
            t.ty == want && src.tensor_info(&t.name).is_some_and(|s| s.dims == t.dims)
        })
}

/// Convert the quantized `src` into the BF16 base checkpoint `out`, unless a
/// valid one is already there. Prints `content_id=<hex>` and the path.
pub(crate) fn init_base(src: &Path, out: &Path) -> Result<ContentId> {
    let source = Checkpoint::open(src).with_context(|| format!("opening source {}", src.display()))?;
    if out.exists() {
        match Checkpoint::open(out) {
            Ok(existing) if is_bf16_of(&existing, &source) => {
                let id = existing.content_id();
                eprintln!("{} already exists and is valid", out.display());
                println!("content_id={id}");
                println!("path={}", out.display());
                return Ok(id);
            }
            Ok(_) => eprintln!("{} exists but is not a BF16 copy of the source; rebuilding", out.display()),
            Err(e) => eprintln!("{} exists but is invalid ({e}); rebuilding", out.display()),
        }
    }
    let total = source.header().tensors.len() as u64;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("converting {bar:40} {pos}/{len} tensors {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let id = convert_to_bf16_with_progress(&source, out, |done, _| bar.set_position(done as u64))
        .with_context(|| format!("converting {} to {}", src.display(), out.display()))?;
    bar.finish_and_clear();
    println!("content_id={id}");
    println!("path={}", out.display());
    Ok(id)
}

/// Write the tiny test model for `seed` to `out`, with the tokenizer of
/// `tokenizer_src`. Prints `content_id=<hex>` and the path.
pub(crate) fn init_tiny(seed: u64, family: tiny::TinyFamily, tokenizer_src: &Path, out: &Path) -> Result<ContentId> {
    let source = Checkpoint::open(tokenizer_src).with_context(|| format!("opening {}", tokenizer_src.display()))?;
    let id =
        tiny::write_tiny_family(family, seed, &source, out).with_context(|| format!("writing {}", out.display()))?;
    println!("content_id={id}");
    println!("path={}", out.display());
    Ok(id)
}

/// Print a checkpoint's config, tensors by type, and content id.
/// A reader that closes the pipe (`trainer info FILE | head`) ends the
/// output, not the process with a panic.
pub(crate) fn info(path: &Path) -> Result<()> {
    let ck = Checkpoint::open(path).with_context(|| format!("opening {}", path.display()))?;
    match write_info(path, &ck, &mut std::io::stdout().lock()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn write_info(path: &Path, ck: &Checkpoint, out: &mut impl Write) -> std::io::Result<()> {
    let h = ck.header();
    let c = ck.config();
    writeln!(out, "path={}", path.display())?;
    writeln!(out, "gguf_version={} metadata_keys={} alignment={}", h.version, h.metadata.len(), h.alignment)?;
    if let Some(name) = h.get_str("general.name") {
        writeln!(out, "name={name}")?;
    }
    writeln!(
        out,
        "config: arch={} n_layer={} d_model={} n_head={} n_head_kv={} head_dim={} d_ff={} vocab_size={} rms_eps={:e} rope_theta={} context_length={} qkv_bias={} rope_freqs={}",
        c.arch,
        c.n_layer,
        c.d_model,
        c.n_head,
        c.n_head_kv,
        c.head_dim(),
        c.d_ff,
        c.vocab_size,
        c.rms_eps,
        c.rope_theta,
        c.context_length,
        c.qkv_bias,
        c.rope_freqs
    )?;
    writeln!(out, "tied_embeddings={}", ck.tied_embeddings())?;
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in &h.tensors {
        let e = by_type.entry(format!("{:?}", t.ty)).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
    }
    let n_params: u64 = h.tensors.iter().map(|t| t.n_elements()).sum();
    writeln!(out, "tensors={} parameters={n_params}", h.tensors.len())?;
    for (ty, (n, elems)) in by_type {
        writeln!(out, "  {ty}: {n} tensors, {elems} elements")?;
    }
    if let Some(t) = h.get_str("tokenizer.ggml.model") {
        let n_tokens = h.get_str_array("tokenizer.ggml.tokens").map_or(0, <[String]>::len);
        writeln!(out, "tokenizer={t} pre={} tokens={n_tokens}", h.get_str("tokenizer.ggml.pre").unwrap_or("-"))?;
    }
    writeln!(out, "chat_template={}", h.get_str("tokenizer.chat_template").is_some())?;
    writeln!(out, "content_id={}", ck.content_id())?;
    Ok(())
}
