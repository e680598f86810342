//! The wgpu backend on the tiny model (real WGSL on whatever adapter wgpu
//! finds; Mesa's lavapipe on CI machines): logits against a plain-Rust f64
//! forward and against the libtorch reference model, prefill/decode
//! agreement, tensor updates, request checks, and rollouts that pass the
//! reference validator with sketch distances within half the tolerance.
#![cfg(feature = "wgpu")]

mod common;

use std::io::BufWriter;
use std::path::Path;

use edge_miner::backend::{Backend, BackendError, DrawKey, GroupRequest};
use edge_miner::offline::{self, GenerateOptions, Job, OfflineWindow, RolloutRecord};
use edge_miner::wgpu::{WgpuBackend, WgpuConfig, WgpuError, WgpuModel, list_adapters};
use tributary_assets as assets;
use tributary_policy::ReferenceModel;
use tributary_protocol::checkpoint::{Checkpoint, ModelConfig};
use tributary_protocol::env::{ArithEnv, Environment};
use tributary_protocol::sketch::{self, SketchKey, SketchParams};
use tributary_protocol::tokenizer::Tokenizer;

use common::write_tiny;

fn backend(path: &Path) -> WgpuBackend {
    let b = WgpuBackend::load(&WgpuConfig::new(path))
        .expect("wgpu backend (is a Vulkan driver such as lavapipe installed?)");
    eprintln!("adapter: {}", b.adapter());
    b
}

/// Plain-Rust f64 llama forward: logits `[L, vocab]` of a token sequence.
fn cpu_logits(ckpt: &Checkpoint, tokens: &[u32]) -> Vec<f64> {
    let c: ModelConfig = *ckpt.config();
    let t = |n: &str| -> Vec<f64> { ckpt.tensor_f32(n).unwrap().into_iter().map(f64::from).collect() };
    let (d, hd, nh, nkv, ff, v) = (c.d_model, c.head_dim(), c.n_head, c.n_head_kv, c.d_ff, c.vocab_size);
    let l = tokens.len();
    let eps = f64::from(c.rms_eps);
    let norm = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let ms = x.iter().map(|a| a * a).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(a, b)| a * s * b).collect()
    };
    // y = W x with W row-major [out][in]
    let mv = |w: &[f64], x: &[f64], out: usize| -> Vec<f64> {
        (0..out).map(|o| w[o * x.len()..(o + 1) * x.len()].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    };
    let rope = |x: &mut [f64], pos: usize| {
        for h in x.chunks_mut(hd) {
            for i in 0..hd / 2 {
                let a = pos as f64 * f64::from(c.rope_theta).powf(-2.0 * i as f64 / hd as f64);
                let (s, co) = a.sin_cos();
                let (x0, x1) = (h[2 * i], h[2 * i + 1]);
                h[2 * i] = x0 * co - x1 * s;
                h[2 * i + 1] = x0 * s + x1 * co;
            }
        }
    };
    let emb = t("token_embd.weight");
    let mut xs: Vec<Vec<f64>> =
        tokens.iter().map(|&tok| emb[tok as usize * d..(tok as usize + 1) * d].to_vec()).collect();
    for b in 0..c.n_layer {
        let w = |n: &str| t(&format!("blk.{b}.{n}.weight"));
        let (an, wq, wk, wv, wo) = (w("attn_norm"), w("attn_q"), w("attn_k"), w("attn_v"), w("attn_output"));
        let (fnw, wg, wu, wd) = (w("ffn_norm"), w("ffn_gate"), w("ffn_up"), w("ffn_down"));
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = norm(x, &an);
            let mut q = mv(&wq, &h, d);
            let mut k = mv(&wk, &h, nkv * hd);
            rope(&mut q, pos);
            rope(&mut k, pos);
            qs.push(q);
            ks.push(k);
            vs.push(mv(&wv, &h, nkv * hd));
        }
        for pos in 0..l {
            let mut att = vec![0.0; d];
            for head in 0..nh {
                let kh = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let sc: Vec<f64> = (0..=pos)
                    .map(|j| {
                        q.iter().zip(&ks[j][kh * hd..(kh + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for dd in 0..hd {
                        att[head * hd + dd] += p / z * vs[j][kh * hd + dd];
                    }
                }
            }
            let o = mv(&wo, &att, d);
            let x = &mut xs[pos];
            for (a, b) in x.iter_mut().zip(&o) {
                *a += b;
            }
            let h = norm(x, &fnw);
            let g = mv(&wg, &h, ff);
            let u = mv(&wu, &h, ff);
            let a: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let dn = mv(&wd, &a, d);
            for (x, y) in x.iter_mut().zip(&dn) {
                *x += y;
            }
        }
    }
    let on = t("output_norm.weight");
    let mut out = Vec::with_capacity(l * v);
    for x in &xs {
        out.extend(mv(&emb, &norm(x, &on), v));
    }
    out
}

fn max_abs(a: &[f32], b: impl Iterator<Item = f64>) -> f64 {
    a.iter().zip(b).map(|(&x, y)| (f64::from(x) - y).abs()).fold(0.0, f64::max)
}

fn ref_logits(model: &ReferenceModel, tokens: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let x = tch::Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let out = tch::no_grad(|| model.forward(&x)).unwrap();
    Vec::<f32>::try_from(out.logits.flatten(0, -1)).unwrap()
}

#[test]
fn adapters_are_listed() {
    let adapters = list_adapters();
    for a in &adapters {
        eprintln!("adapter: {a}");
    }
    assert!(!adapters.is_empty(), "wgpu sees no adapter");
}

#[test]
fn logits_match_cpu_f64_and_libtorch() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), 3);
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut b = backend(&path);
    // 70 tokens: crosses a prefill chunk boundary (64 rows)
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 7919 + 13) % 49152).collect();
    let mut logits = Vec::new();
    let mut hidden_norms = Vec::new();
    b.forward_each(&tokens, |_, h, l| {
        logits.extend_from_slice(l);
        hidden_norms.push(h.iter().map(|x| x * x).sum::<f32>().sqrt());
        Ok(())
    })
    .unwrap();
    let cpu = cpu_logits(&ckpt, &tokens);
    assert_eq!(logits.len(), cpu.len());
    let scale = cpu.iter().map(|x| x.abs()).fold(0.0, f64::max);
    let err_cpu = max_abs(&logits, cpu.iter().copied());
    let reference = ReferenceModel::load(&ckpt, tributary_policy::default_device()).unwrap();
    let torch = ref_logits(&reference, &tokens);
    let err_torch = max_abs(&logits, torch.iter().map(|&x| f64::from(x)));
    let err_torch_cpu = max_abs(&torch, cpu.iter().copied());
    eprintln!(
        "logits {}x{}: max |logit| {scale:.3}; max abs error wgpu vs f64 {err_cpu:.3e}, wgpu vs libtorch {err_torch:.3e}, libtorch vs f64 {err_torch_cpu:.3e}",
        tokens.len(),
        ckpt.config().vocab_size
    );
    assert!(hidden_norms.iter().all(|n| n.is_finite() && *n > 1.0));
    assert!(err_cpu < 1e-3, "wgpu vs f64: {err_cpu}");
    assert!(err_torch < 1e-3, "wgpu vs libtorch: {err_torch}");
}

fn request<'a>(
    prompt: &'a [u32],
    key: &'a SketchKey,
    eog: &'a [u32],
    g: usize,
    max_new: usize,
    t: f32,
) -> GroupRequest<'a> {
    let w = OfflineWindow::from_seed(4);
    GroupRequest {
        prompt,
        group_size: g,
        max_new_tokens: max_new,
        temperature: t,
        draw: DrawKey { sampling_seed: w.secrets.seed, miner: [9; 32], group: 2 },
        sketch_key: key,
        sketch_params: SketchParams::DEFAULT,
        eog,
    }
}

#[test]
fn generation_matches_teacher_forcing_and_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), 5);
    let mut b = backend(&path);
    let key = SketchKey::derive(&OfflineWindow::from_seed(4).secrets.seed, b.hidden_size());
    let prompt: Vec<u32> = (0..11u32).map(|i| (i * 104_729 + 1) % 49152).collect();
    let eog = [2u32];
    let req = request(&prompt, &key, &eog, 4, 20, 1.0);
    let a = b.generate_group(&req).unwrap();
    let again = b.generate_group(&req).unwrap();
    assert_eq!(a, again, "same request, same rollouts");
    assert_eq!(a.len(), 4);
    let distinct: std::collections::HashSet<_> = a.iter().map(|s| s.completion.clone()).collect();
    assert!(distinct.len() > 1, "all rollouts identical");
    for s in &a {
        assert_eq!(s.sketches.len(), prompt.len() + s.completion.len());
        assert_eq!(s.logprobs.len(), s.completion.len());
        let mut tokens = prompt.clone();
        tokens.extend(&s.completion);
        let (sk, lp) = b.teacher_forced(&tokens, &key, &SketchParams::DEFAULT).unwrap();
        // fixed-order kernels: a row's state is the same bits in a decode step and in a prefill chunk
        assert_eq!(sk, s.sketches, "sketches");
        assert_eq!(&lp[prompt.len() - 1..], &s.logprobs[..], "logprobs");
    }
}

#[test]
fn tensor_updates_swap_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let (p0, p1) = (write_tiny(dir.path(), 0), write_tiny(dir.path(), 1));
    let tokens: Vec<u32> = (0..9u32).map(|i| i * 311 + 5).collect();
    let logits = |b: &mut WgpuBackend| {
        let mut out = Vec::new();
        b.forward_each(&tokens, |_, _, l| {
            out.extend_from_slice(l);
            Ok(())
        })
        .unwrap();
        out
    };
    let mut b1 = backend(&p1);
    let want = logits(&mut b1);
    let mut b = backend(&p0);
    let before = logits(&mut b);
    assert_ne!(before, want);
    let c1 = Checkpoint::open(&p1).unwrap();
    let names: Vec<String> = c1.header().tensors.iter().map(|t| t.name.clone()).collect();
    // one tensor only: the output changes, but is not yet seed 1's
    assert_eq!(b.update_tensors(&c1, ["blk.1.ffn_down.weight"]).unwrap(), 1);
    let partial = logits(&mut b);
    assert_ne!(partial, before);
    assert_ne!(partial, want);
    b.update_tensors(&c1, names.iter().map(String::as_str)).unwrap();
    assert_eq!(logits(&mut b), want, "all tensors updated = the other checkpoint");
    assert!(b.update_tensors(&c1, ["no.such.tensor"]).is_err());
}

#[test]
fn invalid_requests_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), 7);
    let mut b = backend(&path);
    let key = SketchKey::derive(&OfflineWindow::from_seed(0).secrets.seed, b.hidden_size());
    let eog = [0u32, 2];
    let ok = request(&[1, 2, 3], &key, &eog, 2, 4, 0.7);
    assert_eq!(b.generate_group(&ok).unwrap().len(), 2);
    for bad in [
        request(&[1, 49_152], &key, &eog, 2, 4, 0.7),
        request(&[], &key, &eog, 2, 4, 0.7),
        request(&[1, 2], &key, &eog, 0, 4, 0.7),
        request(&[1, 2], &key, &eog, 2, 1 << 20, 0.7),
        request(&[1, 2], &key, &eog, 2, 4, f32::NAN),
    ] {
        assert!(b.generate_group(&bad).is_err(), "{bad:?}");
    }
    let wrong_key = SketchKey::from_coefficients(vec![1; 3]);
    assert!(b.generate_group(&request(&[1, 2], &wrong_key, &eog, 2, 4, 0.7)).is_err());
    assert!(b.forward_each(&[], |_, _, _| Ok(())).is_err());
    // still usable after the refusals
    assert_eq!(b.generate_group(&ok).unwrap().len(), 2);
    // a quantized (non-BF16) file is refused with a typed error, not a panic
    assert!(WgpuBackend::load(&WgpuConfig::new(assets::smollm2_q4_1())).is_err());
}

#[test]
fn rollouts_pass_the_reference_validator() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), 0);
    let mut b = backend(&path);
    let tokenizer = Tokenizer::from_gguf_file(&path).unwrap();
    let env = Environment::Arith(ArithEnv::new(3));
    let seed = 21;
    let window = OfflineWindow::from_seed(seed);
    let opts = GenerateOptions {
        first_task: 0,
        tasks: 3,
        group: 4,
        max_new_tokens: 24,
        temperature: 0.9,
        sketch_params: SketchParams::DEFAULT,
    };
    let model_id = Checkpoint::open(&path).unwrap().content_id();
    let job = Job { tokenizer: &tokenizer, env: &env, model: Some(model_id), data: None, window: &window, opts: &opts };
    let out = dir.path().join("rollouts.jsonl");
    let mut recs: Vec<RolloutRecord> = Vec::new();
    {
        let mut sink = offline::jsonl_sink(BufWriter::new(std::fs::File::create(&out).unwrap()));
        offline::generate(
            &mut b,
            &job,
            |r| {
                recs.push(r.clone());
                sink(r)
            },
            |_| {},
        )
        .unwrap();
    }
    assert_eq!(recs.len(), opts.tasks * opts.group);

    // the validator's own offline check
    let check = validator::check::CheckOptions::new(path.clone(), out, seed);
    let mut report = Vec::new();
    let summary = validator::check::run_check(&check, &mut report).unwrap();
    let report = String::from_utf8(report).unwrap();
    eprintln!("{report}");
    assert_eq!(summary.rejected, 0, "{report}");
    assert_eq!(summary.accepted, recs.len());

    // every sketch within half the tolerance of the reference model's
    let ckpt = Checkpoint::open(&path).unwrap();
    let reference = ReferenceModel::load(&ckpt, tributary_policy::default_device()).unwrap();
    let key = SketchKey::derive(&window.secrets.seed, ckpt.config().d_model);
    let params = SketchParams::DEFAULT;
    let mut worst = 0.0f64;
    for r in &recs {
        let ids: Vec<i64> = r.tokens.iter().map(|&t| i64::from(t)).collect();
        let x = tch::Tensor::from_slice(&ids).view([1, ids.len() as i64]);
        let h = tch::no_grad(|| reference.forward_hidden(&x)).unwrap();
        let h = Vec::<f32>::try_from(h.flatten(0, -1)).unwrap();
        let refs = sketch::sketch_rows(&h, &key, &params).unwrap();
        for (pos, (&mine, &theirs)) in r.sketches.iter().zip(&refs).enumerate() {
            let ratio = f64::from(sketch::distance(mine, theirs)) / f64::from(sketch::tolerance(pos, &params));
            worst = worst.max(ratio);
        }
    }
    eprintln!("worst sketch distance / tolerance over {} rollouts: {worst:.4}", recs.len());
    assert!(worst <= 0.5, "sketch distance {worst} × tolerance");
}

/// Issue 30: the wgpu backend computes the `llama` graph, Llama 3's RoPE
/// frequency factors included (checked against libtorch), and refuses the
/// families it does not compute with a typed error naming what is missing.
#[test]
fn families_are_supported_exactly_or_refused_by_name() {
    use tributary_protocol::tiny::{self, TinyFamily};
    let dir = tempfile::tempdir().unwrap();
    let src = Checkpoint::open(&assets::smollm2_q4_1()).expect("SmolLM2 file");
    for (family, missing) in [
        (TinyFamily::Qwen2, vec!["NEOX (split-half) RoPE", "Q/K/V biases"]),
        (
            TinyFamily::Qwen3,
            vec![
                "NEOX (split-half) RoPE",
                "per-head q/k RMSNorm",
                "a head size that does not divide the width (key_length)",
            ],
        ),
    ] {
        let path = dir.path().join(format!("{}.gguf", family.name()));
        tiny::write_tiny_family(family, 1, &src, &path).unwrap();
        // The model: the typed error names the family and what it lacks.
        let ckpt = Checkpoint::open(&path).unwrap();
        match WgpuModel::load(&ckpt, None) {
            Err(WgpuError::UnsupportedArch { arch, missing: got }) => {
                assert_eq!(arch, family.name());
                assert_eq!(got, missing, "{}", family.name());
            }
            Err(other) => panic!("{}: refused with the wrong error: {other}", family.name()),
            Ok(_) => panic!("{}: loaded, not refused", family.name()),
        }
        // The backend (what `edge-miner run --backend wgpu` calls): a load error, the same text.
        let Err(err) = WgpuBackend::load(&WgpuConfig::new(&path)) else {
            panic!("{}: loaded, not refused", family.name())
        };
        let text = err.to_string();
        eprintln!("{}: {text}", family.name());
        assert!(matches!(err, BackendError::Load(_)), "{text}");
        assert!(text.contains(&format!("architecture {}", family.name())), "{text}");
        for m in missing {
            assert!(text.contains(m), "{text} does not name {m}");
        }
    }
    let path = dir.path().join("llama3.gguf");
    tiny::write_tiny_family(TinyFamily::Llama3, 1, &src, &path).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut b = backend(&path);
    let tokens: Vec<u32> = (0..70u32).map(|i| (i * 7919 + 13) % 49152).collect();
    let mut logits = Vec::new();
    b.forward_each(&tokens, |_, _, l| {
        logits.extend_from_slice(l);
        Ok(())
    })
    .unwrap();
    let reference = ReferenceModel::load(&ckpt, tributary_policy::default_device()).unwrap();
    let torch = ref_logits(&reference, &tokens);
    let err = max_abs(&logits, torch.iter().map(|&x| f64::from(x)));
    eprintln!("llama3: wgpu vs libtorch max |Δ logit| {err:.3e}");
    assert!(err < 1e-3, "wgpu vs libtorch on llama3: {err}");
}
