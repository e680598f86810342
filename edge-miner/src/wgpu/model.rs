//! The llama forward pass on the device: weights uploaded once (one buffer
//! per tensor, so a checkpoint update rewrites only the changed tensors),
//! a workspace of activations and per-layer KV caches sized for one group,
//! and [`WgpuModel::forward`] over one batch of (token, position, sequence)
//! rows.
//!
//! Every kernel reduces in a fixed order that does not depend on the batch
//! (workgroup sizes are constants, never read from the adapter, and no
//! subgroup operation is used), so a row's hidden state and logits are the
//! same bits whether it is computed in a prefill chunk or in a decode step.

use std::collections::BTreeMap;
use std::ops::Range;

use tributary_protocol::checkpoint::{Checkpoint, ModelConfig};
use tributary_protocol::gguf::GgmlType;
use wgpu::util::DeviceExt;

use super::WgpuError;
use super::gpu::Gpu;
use crate::schedule::Row;

const PRELUDE: &str = include_str!("shaders/prelude.wgsl");
const EMBED: &str = include_str!("shaders/embed.wgsl");
const RMSNORM: &str = include_str!("shaders/rmsnorm.wgsl");
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const ROPE_STORE: &str = include_str!("shaders/rope_store.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const SWIGLU: &str = include_str!("shaders/swiglu.wgsl");

/// Threads per workgroup of every kernel (a constant: results must not
/// depend on the adapter).
const WG: u32 = 64;
/// Batches above this many rows use the 32-row tiled matmul.
const TILE_ROWS_MIN: usize = 8;
/// Rows of the tiled matmul's tile.
const TILE_ROWS: u32 = 32;

/// What one forward returns.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOut {
    /// Post-final-norm hidden states, row-major `[rows, d_model]`.
    pub hidden: Vec<f32>,
    /// Logits of the requested rows, row-major `[lm_rows, vocab]`.
    pub logits: Vec<f32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Uniform,
    Read,
    Write,
}

fn bind_layout(device: &wgpu::Device, label: &str, slots: &[Slot]) -> wgpu::BindGroupLayout {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match s {
                    Slot::Uniform => wgpu::BufferBindingType::Uniform,
                    Slot::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Slot::Write => wgpu::BufferBindingType::Storage { read_only: false },
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries: &entries })
}

/// A compute kernel: its pipeline and bind-group layout.
struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

impl Kernel {
    fn new(device: &wgpu::Device, name: &str, src: &str, entry: &str, layout: wgpu::BindGroupLayout) -> Self {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(format!("{PRELUDE}\n{src}").into()),
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        Self { pipeline, layout }
    }

    fn bind(&self, device: &wgpu::Device, bufs: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &self.layout, entries: &entries })
    }
}

struct Kernels {
    embed: Kernel,
    rmsnorm: Kernel,
    matmul_rows: Kernel,
    matmul_tile: Kernel,
    rope_store: Kernel,
    attention: Kernel,
    swiglu: Kernel,
}

impl Kernels {
    fn new(device: &wgpu::Device) -> Self {
        use Slot::{Read as R, Uniform as U, Write as W};
        let mm = || bind_layout(device, "matmul", &[R, R, R, W, U]);
        Self {
            embed: Kernel::new(device, "embed", EMBED, "main", bind_layout(device, "embed", &[R, R, R, W, U])),
            rmsnorm: Kernel::new(device, "rmsnorm", RMSNORM, "main", bind_layout(device, "rmsnorm", &[R, R, R, W, U])),
            matmul_rows: Kernel::new(device, "matmul_rows4", MATMUL, "rows4", mm()),
            matmul_tile: Kernel::new(device, "matmul_tile32", MATMUL, "tile32", mm()),
            rope_store: Kernel::new(
                device,
                "rope_store",
                ROPE_STORE,
                "main",
                bind_layout(device, "rope_store", &[R, R, W, R, R, W, W, R, U]),
            ),
            attention: Kernel::new(
                device,
                "attention",
                ATTENTION,
                "main",
                bind_layout(device, "attention", &[R, R, R, R, R, W, W, U]),
            ),
            swiglu: Kernel::new(device, "swiglu", SWIGLU, "main", bind_layout(device, "swiglu", &[R, W, R, U])),
        }
    }
}

/// How a weight tensor is stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WeightKind {
    /// BF16 matrix, the file's bytes as is (two elements per u32).
    Bf16Matrix,
    /// Norm vector as f32.
    F32Vector,
}

struct Weight {
    buffer: wgpu::Buffer,
    kind: WeightKind,
    /// Dims in ggml order.
    dims: Vec<u64>,
}

/// A matmul dispatch: the weight's name and the shape constants.
struct MatmulBinds {
    rows: wgpu::BindGroup,
    tile: wgpu::BindGroup,
    n: u32,
}

struct LayerBinds {
    attn_norm: wgpu::BindGroup,
    q: MatmulBinds,
    k: MatmulBinds,
    v: MatmulBinds,
    rope: wgpu::BindGroup,
    attn: wgpu::BindGroup,
    o: MatmulBinds,
    ffn_norm: wgpu::BindGroup,
    gate: MatmulBinds,
    up: MatmulBinds,
    swiglu: wgpu::BindGroup,
    down: MatmulBinds,
}

/// Activations, KV caches and bind groups for up to `rows_cap` rows per
/// forward, `n_seq` sequences of `cap` positions, and `lm_cap` logit rows.
struct Workspace {
    rows_cap: usize,
    n_seq: usize,
    cap: usize,
    lm_cap: usize,
    info: wgpu::Buffer,
    rows: wgpu::Buffer,
    hidden: wgpu::Buffer,
    logits: wgpu::Buffer,
    kcache: Vec<wgpu::Buffer>,
    vcache: Vec<wgpu::Buffer>,
    read_hidden: wgpu::Buffer,
    read_logits: wgpu::Buffer,
    embed: wgpu::BindGroup,
    layers: Vec<LayerBinds>,
    final_norm: wgpu::BindGroup,
    lm: MatmulBinds,
}

/// A checkpoint resident on a wgpu device.
pub struct WgpuModel {
    gpu: Gpu,
    cfg: ModelConfig,
    kernels: Kernels,
    weights: BTreeMap<String, Weight>,
    rope: wgpu::Buffer,
    ws: Option<Workspace>,
}

impl std::fmt::Debug for WgpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuModel")
            .field("adapter", &self.gpu.adapter)
            .field("config", &self.cfg)
            .field("tensors", &self.weights.len())
            .finish_non_exhaustive()
    }
}

fn check_config(c: &ModelConfig) -> Result<(), WgpuError> {
    let bad = |why: &str| Err(WgpuError::Unsupported(why.to_owned()));
    // What the kernels compute: the `llama` graph (adjacent-pair RoPE, with
    // or without Llama 3's frequency factors). Anything else is refused by
    // name rather than computed wrongly (issue 30).
    let mut missing = Vec::new();
    if c.arch.rope_neox() {
        missing.push("NEOX (split-half) RoPE");
    }
    if c.qkv_bias {
        missing.push("Q/K/V biases");
    }
    if c.arch.qk_norm() {
        missing.push("per-head q/k RMSNorm");
    }
    if c.key_length.is_some_and(|k| k * c.n_head != c.d_model) {
        missing.push("a head size that does not divide the width (key_length)");
    }
    if !missing.is_empty() {
        return Err(WgpuError::UnsupportedArch { arch: c.arch.to_string(), missing });
    }
    if c.n_layer == 0 || c.d_model == 0 || c.n_head == 0 || c.n_head_kv == 0 || c.d_ff == 0 || c.vocab_size == 0 {
        return bad("zero layers, width, heads or vocabulary");
    }
    if !c.d_model.is_multiple_of(c.n_head) || !c.n_head.is_multiple_of(c.n_head_kv) {
        return bad("d_model must be a multiple of n_head, and n_head of n_head_kv");
    }
    if !c.head_dim().is_multiple_of(2) || !c.d_model.is_multiple_of(2) || !c.d_ff.is_multiple_of(2) {
        return bad("odd head, model or feed-forward width");
    }
    if !(c.rms_eps.is_finite() && c.rms_eps > 0.0 && c.rope_theta.is_finite() && c.rope_theta > 1.0) {
        return bad("rms_eps or rope_theta out of range");
    }
    if c.context_length == 0 || u32::try_from(c.vocab_size.max(c.context_length).max(c.d_ff)).is_err() {
        return bad("sizes beyond u32");
    }
    Ok(())
}

/// cos/sin of `pos · θ^(-2i/hd)` (divided by `factors[i]`, Llama 3's
/// `rope_freqs`, when given) for every position and pair, in f64 then
/// rounded, laid out `[pos][i] = (cos, sin)`.
fn rope_table(c: &ModelConfig, factors: Option<&[f32]>) -> Vec<f32> {
    let hd = c.head_dim();
    let theta = f64::from(c.rope_theta);
    let inv: Vec<f64> = (0..hd / 2)
        .map(|i| {
            let f = theta.powf(-2.0 * i as f64 / hd as f64);
            factors.map_or(f, |x| f / f64::from(x[i]))
        })
        .collect();
    let mut out = Vec::with_capacity(c.context_length * hd);
    for pos in 0..c.context_length {
        for &f in &inv {
            let a = pos as f64 * f;
            out.push(a.cos() as f32);
            out.push(a.sin() as f32);
        }
    }
    out
}

fn storage(usage_extra: wgpu::BufferUsages) -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | usage_extra
}

impl WgpuModel {
    /// Uploads `ckpt` to the adapter named like `adapter` (or the best one).
    /// Matrices must be BF16 (the project's checkpoint format); norms may be
    /// any type the checkpoint dequantizes.
    pub fn load(ckpt: &Checkpoint, adapter: Option<&str>) -> Result<Self, WgpuError> {
        let cfg = *ckpt.config();
        check_config(&cfg)?;
        let gpu = Gpu::open(adapter)?;
        let kernels = Kernels::new(&gpu.device);
        let mut names: Vec<(String, WeightKind)> = vec![
            ("token_embd.weight".into(), WeightKind::Bf16Matrix),
            ("output_norm.weight".into(), WeightKind::F32Vector),
        ];
        if !ckpt.tied_embeddings() {
            names.push(("output.weight".into(), WeightKind::Bf16Matrix));
        }
        for l in 0..cfg.n_layer {
            for t in ["attn_norm", "ffn_norm"] {
                names.push((format!("blk.{l}.{t}.weight"), WeightKind::F32Vector));
            }
            for t in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
                names.push((format!("blk.{l}.{t}.weight"), WeightKind::Bf16Matrix));
            }
        }
        let max_binding = gpu.limits.max_storage_buffer_binding_size;
        let mut weights = BTreeMap::new();
        for (name, kind) in names {
            let info =
                ckpt.tensor_info(&name).ok_or_else(|| WgpuError::Unsupported(format!("tensor {name} missing")))?;
            let dims = info.dims.clone();
            let bytes = tensor_upload_bytes(ckpt, &name, kind)?;
            if bytes.len() as u64 > max_binding {
                return Err(WgpuError::TooLarge { what: name, bytes: bytes.len() as u64, limit: max_binding });
            }
            let buffer = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&name),
                contents: &bytes,
                usage: storage(wgpu::BufferUsages::empty()),
            });
            weights.insert(name, Weight { buffer, kind, dims });
        }
        let factors = if cfg.rope_freqs {
            Some(ckpt.tensor_f32("rope_freqs.weight").map_err(|e| WgpuError::Checkpoint(e.to_string()))?)
        } else {
            None
        };
        if factors
            .as_ref()
            .is_some_and(|f| f.len() != cfg.head_dim() / 2 || f.iter().any(|x| !(x.is_finite() && *x > 0.0)))
        {
            return Err(WgpuError::Unsupported("rope_freqs must hold head_dim / 2 positive factors".into()));
        }
        let table = rope_table(&cfg, factors.as_deref());
        let rope = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("rope"),
            contents: bytemuck::cast_slice(&table),
            usage: storage(wgpu::BufferUsages::empty()),
        });
        gpu.wait()?;
        Ok(Self { gpu, cfg, kernels, weights, rope, ws: None })
    }

    /// The model's hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The adapter this model runs on.
    pub fn adapter(&self) -> &super::AdapterSummary {
        &self.gpu.adapter
    }

    /// Rewrites the device buffers of `names` from `ckpt` (after a delta
    /// swap: only the changed tensors move). The checkpoint must have the
    /// loaded model's layout.
    pub fn update_tensors<'n>(
        &mut self,
        ckpt: &Checkpoint,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<usize, WgpuError> {
        if *ckpt.config() != self.cfg {
            return Err(WgpuError::Unsupported("update from a checkpoint of another shape".into()));
        }
        let mut n = 0;
        for name in names {
            let w = self
                .weights
                .get(name)
                .ok_or_else(|| WgpuError::Unsupported(format!("no tensor {name} on the device")))?;
            let info =
                ckpt.tensor_info(name).ok_or_else(|| WgpuError::Unsupported(format!("tensor {name} missing")))?;
            if info.dims != w.dims {
                return Err(WgpuError::Unsupported(format!("tensor {name} changed shape")));
            }
            let bytes = tensor_upload_bytes(ckpt, name, w.kind)?;
            if bytes.len() as u64 != w.buffer.size() {
                return Err(WgpuError::Unsupported(format!("tensor {name} changed size")));
            }
            self.gpu.queue.write_buffer(&w.buffer, 0, &bytes);
            n += 1;
        }
        self.gpu.queue.submit([]);
        self.gpu.wait()?;
        Ok(n)
    }

    fn weight(&self, name: &str) -> Result<&wgpu::Buffer, WgpuError> {
        self.weights
            .get(name)
            .map(|w| &w.buffer)
            .ok_or_else(|| WgpuError::Unsupported(format!("tensor {name} missing")))
    }

    /// Makes sure the workspace holds at least `n_seq` sequences of `cap`
    /// positions, `rows_cap` rows per forward and `lm_cap` logit rows. A
    /// kept workspace keeps stale cache entries, which is harmless: a row
    /// attends to positions `0..=pos` of its sequence, all written before.
    pub fn reserve(&mut self, n_seq: usize, cap: usize, rows_cap: usize, lm_cap: usize) -> Result<(), WgpuError> {
        if n_seq == 0 || cap == 0 || rows_cap == 0 || lm_cap == 0 {
            return Err(WgpuError::Request("empty workspace".into()));
        }
        if cap > self.cfg.context_length {
            return Err(WgpuError::Request(format!(
                "{cap} positions exceed the context of {}",
                self.cfg.context_length
            )));
        }
        if let Some(ws) = &self.ws
            && ws.n_seq >= n_seq
            && ws.cap >= cap
            && ws.rows_cap >= rows_cap
            && ws.lm_cap >= lm_cap
        {
            return Ok(());
        }
        self.ws = None;
        self.ws = Some(self.build_workspace(n_seq, cap, rows_cap, lm_cap)?);
        Ok(())
    }

    fn build_workspace(
        &self,
        n_seq: usize,
        cap: usize,
        rows_cap: usize,
        lm_cap: usize,
    ) -> Result<Workspace, WgpuError> {
        let c = &self.cfg;
        let dev = &self.gpu.device;
        let (d, ff, hd) = (c.d_model, c.d_ff, c.head_dim());
        let kvd = c.n_head_kv * hd;
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        let max_buffer = self.gpu.limits.max_buffer_size;
        let buf = |label: &str, elems: usize, extra: wgpu::BufferUsages| -> Result<wgpu::Buffer, WgpuError> {
            let bytes = (elems as u64).checked_mul(4).filter(|&b| b <= max_binding && b <= max_buffer).ok_or(
                WgpuError::TooLarge {
                    what: label.to_owned(),
                    bytes: (elems as u64).saturating_mul(4),
                    limit: max_binding,
                },
            )?;
            Ok(dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.max(4),
                usage: storage(extra),
                mapped_at_creation: false,
            }))
        };
        let none = wgpu::BufferUsages::empty();
        let src = wgpu::BufferUsages::COPY_SRC;
        let mul =
            |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| WgpuError::Request("workspace size overflow".into()));
        let info = buf("info", 4, none)?;
        let rows = buf("rows", mul(rows_cap, 4)?, none)?;
        let x = buf("x", mul(rows_cap, d)?, none)?;
        let h = buf("h", mul(rows_cap, d)?, none)?;
        let q = buf("q", mul(rows_cap, d)?, none)?;
        let k = buf("k", mul(rows_cap, kvd)?, none)?;
        let v = buf("v", mul(rows_cap, kvd)?, none)?;
        let att = buf("att", mul(rows_cap, d)?, none)?;
        let gate = buf("gate", mul(rows_cap, ff)?, none)?;
        let up = buf("up", mul(rows_cap, ff)?, none)?;
        let hidden = buf("hidden", mul(rows_cap, d)?, src)?;
        let logits = buf("logits", mul(lm_cap, c.vocab_size)?, src)?;
        let scores = buf("scores", mul(mul(rows_cap, c.n_head)?, cap)?, none)?;
        let cache_elems = mul(mul(n_seq, cap)?, kvd)?;
        let mut kcache = Vec::with_capacity(c.n_layer);
        let mut vcache = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            kcache.push(buf(&format!("k_cache.{l}"), cache_elems, src)?);
            vcache.push(buf(&format!("v_cache.{l}"), cache_elems, src)?);
        }
        let readback = |label: &str, size: u64| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: size.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let read_hidden = readback("read_hidden", hidden.size());
        let read_logits = readback("read_logits", logits.size());

        let uniform = |words: [u32; 8]| {
            dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        let u32_of = |n: usize| n as u32; // all sizes checked to fit u32 in check_config / reserve
        let embed_p = uniform([u32_of(d), u32_of(c.vocab_size), 0, 0, 0, 0, 0, 0]);
        let norm_p = uniform([u32_of(d), 0, 0, 0, c.rms_eps.to_bits(), 0, 0, 0]);
        let shape_p = [
            u32_of(c.n_head),
            u32_of(c.n_head_kv),
            u32_of(hd),
            u32_of(cap),
            u32_of(n_seq),
            0,
            0,
            (1.0f32 / (hd as f32).sqrt()).to_bits(),
        ];
        let rope_p = uniform(shape_p);
        let attn_p = uniform(shape_p);
        let swiglu_p = uniform([u32_of(ff), 0, 0, 0, 0, 0, 0, 0]);
        let mm_p = |kk: usize, n: usize, acc: bool, lm: bool| {
            uniform([u32_of(kk), u32_of(n), acc as u32, lm as u32, 0, 0, 0, 0])
        };
        let p_q = mm_p(d, d, false, false);
        let p_kv = mm_p(d, kvd, false, false);
        let p_o = mm_p(d, d, true, false);
        let p_gu = mm_p(d, ff, false, false);
        let p_down = mm_p(ff, d, true, false);
        let p_lm = mm_p(d, c.vocab_size, false, true);

        let kn = &self.kernels;
        let mm = |xin: &wgpu::Buffer, w: &wgpu::Buffer, y: &wgpu::Buffer, p: &wgpu::Buffer, n: usize| MatmulBinds {
            rows: kn.matmul_rows.bind(dev, &[&info, xin, w, y, p]),
            tile: kn.matmul_tile.bind(dev, &[&info, xin, w, y, p]),
            n: u32_of(n),
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for l in 0..c.n_layer {
            let w = |t: &str| self.weight(&format!("blk.{l}.{t}.weight"));
            layers.push(LayerBinds {
                attn_norm: kn.rmsnorm.bind(dev, &[&info, &x, w("attn_norm")?, &h, &norm_p]),
                q: mm(&h, w("attn_q")?, &q, &p_q, d),
                k: mm(&h, w("attn_k")?, &k, &p_kv, kvd),
                v: mm(&h, w("attn_v")?, &v, &p_kv, kvd),
                rope: kn.rope_store.bind(dev, &[&info, &rows, &q, &k, &v, &kcache[l], &vcache[l], &self.rope, &rope_p]),
                attn: kn.attention.bind(dev, &[&info, &rows, &q, &kcache[l], &vcache[l], &scores, &att, &attn_p]),
                o: mm(&att, w("attn_output")?, &x, &p_o, d),
                ffn_norm: kn.rmsnorm.bind(dev, &[&info, &x, w("ffn_norm")?, &h, &norm_p]),
                gate: mm(&h, w("ffn_gate")?, &gate, &p_gu, ff),
                up: mm(&h, w("ffn_up")?, &up, &p_gu, ff),
                swiglu: kn.swiglu.bind(dev, &[&info, &gate, &up, &swiglu_p]),
                down: mm(&gate, w("ffn_down")?, &x, &p_down, d),
            });
        }
        let head = match self.weights.get("output.weight") {
            Some(w) => &w.buffer,
            None => self.weight("token_embd.weight")?,
        };
        let embed = kn.embed.bind(dev, &[&info, &rows, self.weight("token_embd.weight")?, &x, &embed_p]);
        let final_norm = kn.rmsnorm.bind(dev, &[&info, &x, self.weight("output_norm.weight")?, &hidden, &norm_p]);
        let lm = mm(&hidden, head, &logits, &p_lm, c.vocab_size);
        self.gpu.wait()?;
        Ok(Workspace {
            rows_cap,
            n_seq,
            cap,
            lm_cap,
            info,
            rows,
            hidden,
            logits,
            kcache,
            vcache,
            read_hidden,
            read_logits,
            embed,
            layers,
            final_norm,
            lm,
        })
    }

    /// Copies sequence `src`'s first `n` cache positions to every sequence
    /// in `dsts` (in every layer), through a scratch buffer (a copy within
    /// one buffer is not allowed).
    pub fn copy_sequence(&mut self, src: usize, dsts: Range<usize>, n: usize) -> Result<(), WgpuError> {
        let ws = self.ws.as_ref().ok_or_else(|| WgpuError::Request("no workspace".into()))?;
        if src >= ws.n_seq || dsts.end > ws.n_seq || n > ws.cap || dsts.contains(&src) {
            return Err(WgpuError::Request(format!("copy of {n} positions from sequence {src} to {dsts:?}")));
        }
        if dsts.is_empty() || n == 0 {
            return Ok(());
        }
        let kvd = (self.cfg.n_head_kv * self.cfg.head_dim()) as u64;
        let seq_bytes = ws.cap as u64 * kvd * 4;
        let len = n as u64 * kvd * 4;
        let scratch = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kv_copy"),
            size: len,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        for cache in ws.kcache.iter().chain(&ws.vcache) {
            enc.copy_buffer_to_buffer(cache, src as u64 * seq_bytes, &scratch, 0, len);
            for dst in dsts.clone() {
                enc.copy_buffer_to_buffer(&scratch, 0, cache, dst as u64 * seq_bytes, len);
            }
        }
        self.gpu.queue.submit([enc.finish()]);
        self.gpu.wait()
    }

    /// Runs one batch: every row's token at its position in its sequence
    /// (its key and value are stored in the cache first, so rows of one
    /// sequence in one batch see each other causally), returning every
    /// row's post-norm hidden state and the logits of rows `lm`.
    pub fn forward(&mut self, batch: &[Row], lm: Range<usize>) -> Result<ForwardOut, WgpuError> {
        let ws = self.ws.as_ref().ok_or_else(|| WgpuError::Request("no workspace (call reserve)".into()))?;
        let n = batch.len();
        if n == 0 || n > ws.rows_cap {
            return Err(WgpuError::Request(format!("{n} rows (capacity {})", ws.rows_cap)));
        }
        if lm.start > lm.end || lm.end > n || lm.len() > ws.lm_cap {
            return Err(WgpuError::Request(format!("logit rows {lm:?} of {n} (capacity {})", ws.lm_cap)));
        }
        let mut words = Vec::with_capacity(n * 4);
        for r in batch {
            if r.token as usize >= self.cfg.vocab_size || r.pos as usize >= ws.cap || r.seq as usize >= ws.n_seq {
                return Err(WgpuError::Request(format!("row {r:?} outside vocabulary, positions or sequences")));
            }
            words.extend_from_slice(&[r.token, r.pos, r.seq, 0]);
        }
        let c = &self.cfg;
        let kn = &self.kernels;
        let q = &self.gpu.queue;
        q.write_buffer(&ws.info, 0, bytemuck::cast_slice(&[n as u32, lm.start as u32, lm.len() as u32, 0]));
        q.write_buffer(&ws.rows, 0, bytemuck::cast_slice(&words));

        let rows = n as u32;
        let groups = |len: usize| (len as u32).div_ceil(WG);
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            let mut run = |k: &Kernel, bg: &wgpu::BindGroup, x: u32, y: u32| {
                pass.set_pipeline(&k.pipeline);
                pass.set_bind_group(0, bg, &[]);
                pass.dispatch_workgroups(x, y, 1);
            };
            let matmul = |mb: &MatmulBinds, m: u32, run: &mut dyn FnMut(&Kernel, &wgpu::BindGroup, u32, u32)| {
                if m as usize > TILE_ROWS_MIN {
                    run(&kn.matmul_tile, &mb.tile, mb.n.div_ceil(WG), m.div_ceil(TILE_ROWS));
                } else {
                    run(&kn.matmul_rows, &mb.rows, mb.n.div_ceil(WG), m.div_ceil(4));
                }
            };
            run(&kn.embed, &ws.embed, groups(c.d_model / 2), rows);
            let rope_threads = (c.n_head + c.n_head_kv) * c.head_dim() / 2;
            for lb in &ws.layers {
                run(&kn.rmsnorm, &lb.attn_norm, rows, 1);
                matmul(&lb.q, rows, &mut run);
                matmul(&lb.k, rows, &mut run);
                matmul(&lb.v, rows, &mut run);
                run(&kn.rope_store, &lb.rope, groups(rope_threads), rows);
                run(&kn.attention, &lb.attn, c.n_head as u32, rows);
                matmul(&lb.o, rows, &mut run);
                run(&kn.rmsnorm, &lb.ffn_norm, rows, 1);
                matmul(&lb.gate, rows, &mut run);
                matmul(&lb.up, rows, &mut run);
                run(&kn.swiglu, &lb.swiglu, groups(c.d_ff), rows);
                matmul(&lb.down, rows, &mut run);
            }
            run(&kn.rmsnorm, &ws.final_norm, rows, 1);
            if !lm.is_empty() {
                matmul(&ws.lm, lm.len() as u32, &mut run);
            }
        }
        let hidden_bytes = (n * c.d_model * 4) as u64;
        let logit_bytes = (lm.len() * c.vocab_size * 4) as u64;
        enc.copy_buffer_to_buffer(&ws.hidden, 0, &ws.read_hidden, 0, hidden_bytes);
        if logit_bytes > 0 {
            enc.copy_buffer_to_buffer(&ws.logits, 0, &ws.read_logits, 0, logit_bytes);
        }
        q.submit([enc.finish()]);
        let mut out = self.gpu.read_f32(&[(&ws.read_hidden, hidden_bytes), (&ws.read_logits, logit_bytes)])?;
        let logits = out.pop().unwrap_or_default();
        let hidden = out.pop().unwrap_or_default();
        Ok(ForwardOut { hidden, logits })
    }
}

/// The bytes a tensor is stored as on the device.
fn tensor_upload_bytes(ckpt: &Checkpoint, name: &str, kind: WeightKind) -> Result<Vec<u8>, WgpuError> {
    let info = ckpt.tensor_info(name).ok_or_else(|| WgpuError::Unsupported(format!("tensor {name} missing")))?;
    match kind {
        WeightKind::Bf16Matrix => {
            if info.ty != GgmlType::BF16 {
                return Err(WgpuError::Unsupported(format!(
                    "tensor {name} is {:?}; the wgpu backend runs BF16 checkpoints (convert the file first)",
                    info.ty
                )));
            }
            let bytes =
                ckpt.tensor_bytes(name).ok_or_else(|| WgpuError::Unsupported(format!("tensor {name} truncated")))?;
            if bytes.len() % 4 != 0 {
                return Err(WgpuError::Unsupported(format!("tensor {name} has an odd row length")));
            }
            Ok(bytes.to_vec())
        }
        WeightKind::F32Vector => {
            let v = ckpt.tensor_f32(name).map_err(|e| WgpuError::Checkpoint(e.to_string()))?;
            Ok(bytemuck::cast_slice(&v).to_vec())
        }
    }
}
