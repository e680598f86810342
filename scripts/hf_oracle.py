#!/usr/bin/env python3
"""Independent oracle for the model families (issue 30): Hugging Face
`transformers` builds a tiny random-weight model of a family from its config
(no download), and scores token sequences with it.

  hf_oracle.py make  --arch {llama,llama3,qwen2,qwen3} --out DIR [--seed N]
      DIR/config.json + model.safetensors (save_pretrained, float32 holding
      BF16-representable values, so a BF16 GGUF of it is exact), and
      DIR/oracle.safetensors: `tokens` [B, L] int64 (seeded), `ids` [B, L, K]
      int64 (per position: the next token first, then K-1 seeded ids) and
      `logprobs` [B, L, K] float64: the log-probabilities transformers
      computes in float64 (the model's f32 forward is itself ~1e-4 from it at
      these scales, so the oracle must be finer than the bound it checks;
      transformers computes RoPE angles in f32 whatever the dtype, so this
      script replaces its rotary embedding by a float64 one: `exact_rope`).
  hf_oracle.py make  --shape qwen2.5-0.5b --out DIR [--seed N]
      A random-weight model with Qwen2.5-0.5B's shapes (24 layers, width 896,
      14 heads, 2 KV heads, FFN 4,864, rope base 1e6, tied head) and
      SmolLM2's vocabulary, initialised as the tiny ones but with embeddings
      of std 8/sqrt(width) (logits' std about 8, as the tiny test model's):
      DIR/config.json + model.safetensors only (no oracle: the float64
      forward at this size is minutes). `trainer import-hf DIR --out M.gguf`
      makes the BF16 GGUF (docs/model-families.md, 0.5B).
  hf_oracle.py score --model DIR --tokens FILE --out FILE
      Loads DIR with AutoModelForCausalLM.from_pretrained (e.g. the project's
      HF export, whatever its dtype) and writes the same float64 `logprobs`
      for FILE's `tokens` and `ids`.

Runs with the project's venv (`.cache/venv`, torch + transformers +
safetensors). The venv's torch is the slim CPU install (scripts/setup.sh):
its CUDA libraries are absent, so before importing torch this script loads
empty stand-ins under their sonames (built once with gcc into
`.cache/cuda-stubs`); nothing here calls CUDA.
"""

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
from pathlib import Path

CUDA_SONAMES = {
    # soname: version nodes torch's libraries ask of it
    "libcudnn.so.9": ["libcudnn.so.9"],
    "libcufile.so.0": [],
    "libnccl.so.2": [],
    "libcusparse.so.12": ["libcusparse.so.12"],
    "libcufft.so.12": ["libcufft.so.12"],
    "libcusparseLt.so.0": [],
    "libcurand.so.10": [],
    "libcublas.so.13": ["libcublas.so.13"],
    "libcublasLt.so.13": ["libcublasLt.so.13"],
    "libnvrtc.so.13": ["libnvrtc.so.13"],
    "libnvshmem_host.so.3": ["NVSHMEM"],
}


def import_torch():
    try:
        import torch  # noqa: F401

        return torch
    except ImportError as e:
        if "cannot open shared object file" not in str(e):
            raise
    stub_dir = Path(os.environ.get("TRIBUTARY_CUDA_STUBS", Path(__file__).resolve().parent.parent / ".cache" / "cuda-stubs"))
    stub_dir.mkdir(parents=True, exist_ok=True)
    src = stub_dir / "stub.c"
    if not src.exists():
        src.write_text("void tributary_cuda_stub(void) {}\n")
    for soname, versions in CUDA_SONAMES.items():
        lib = stub_dir / soname
        if not lib.exists():
            vmap = stub_dir / (soname + ".map")
            vmap.write_text("".join(f"{v} {{ }};\n" for v in versions) or "{ local: *; };\n")
            tmp = stub_dir / (soname + f".tmp{os.getpid()}")
            subprocess.run(
                ["gcc", "-shared", "-fPIC", "-o", str(tmp), str(src), f"-Wl,-soname,{soname}", f"-Wl,--version-script={vmap}"],
                check=True,
            )
            os.replace(tmp, lib)
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
    # The failed import left torch's submodules behind; start afresh.
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        del sys.modules[name]
    import torch

    return torch


torch = import_torch()
from safetensors.torch import load_file, save_file  # noqa: E402
import transformers  # noqa: E402

VOCAB = 49152  # SmolLM2's tokenizer, which the converted GGUF carries
B, L, K = 4, 260, 32


def config_for(arch):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":
        return transformers.LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=True, **common)
    if arch == "llama3":
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64)
        return transformers.LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=False, rope_scaling=scaling, **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=32,
                                        use_sliding_window=False, **common)
    raise SystemExit(f"unknown arch {arch}")


SHAPES = {
    # Qwen2.5-0.5B's published config, with SmolLM2's vocabulary.
    "qwen2.5-0.5b": lambda: transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2),
}


def init_weights(model, seed, emb_std=0.5):
    """Scales that give a peaked next-token distribution: embeddings RMS 0.5
    (logits' std about 4), projections a little above 1/sqrt(fan_in), norms
    near 1, seeded biases; every value BF16-representable."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                v = 1.0 + 0.05 * torch.randn(p.shape, generator=g)
            elif name.endswith(".bias"):
                v = (0.1 if "v_proj" in name else 0.5) * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or "lm_head" in name:
                v = emb_std * torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[1]
                gain = 4.0 if "down_proj" in name else (1.5 if any(s in name for s in ("q_proj", "k_proj", "o_proj")) else 1.0)
                v = gain / fan_in**0.5 * torch.randn(p.shape, generator=g)
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def exact_inv_freq(cfg, dim):
    """The RoPE inverse frequencies in float64: theta^(-2i/dim), and for
    `rope_type = llama3` Llama 3's smooth frequency scaling, the formula of
    transformers' `_compute_llama3_parameters` (which computes it in f32)."""
    rp = cfg.rope_parameters
    inv = 1.0 / (float(rp["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    kind = rp.get("rope_type", "default")
    if kind == "llama3":
        factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    if kind != "default":
        raise SystemExit(f"no float64 RoPE for rope_type {kind}")
    return inv


def exact_rope(model):
    """Replace every rotary embedding's forward by one in float64.
    transformers computes the angles `pos * inv_freq` in f32 whatever the
    model's dtype: at position 259 that alone moves log-probs by up to 9e-5
    (llama3) from the float64 values, most of the 1e-4 bound the oracle
    checks. The f64 frequencies are checked against transformers' own f32
    ones, so a wrong formula here fails loudly."""
    cfg = model.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = exact_inv_freq(cfg, dim)
    n = 0
    for m in model.modules():
        if hasattr(m, "original_inv_freq") and hasattr(m, "attention_scaling"):
            theirs = m.original_inv_freq.to(torch.float64)
            rel = ((inv - theirs).abs() / theirs).max().item()
            if rel > 1e-6:
                raise SystemExit(f"float64 RoPE frequencies differ from transformers' by {rel:.2e} (relative)")
            scale = float(m.attention_scaling)

            def forward(x, position_ids, inv=inv, scale=scale):
                freqs = position_ids[..., None].to(torch.float64) * inv.to(x.device)
                emb = torch.cat((freqs, freqs), dim=-1)
                return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

            m.forward = forward
            n += 1
    if n == 0:
        raise SystemExit("no rotary embedding module found")
    return model


def logprobs(model, tokens, ids):
    model = exact_rope(model.to(torch.float64))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
        lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        return torch.gather(lp, -1, ids)


def make_shape(args):
    torch.manual_seed(args.seed)
    cfg = SHAPES[args.shape]()
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.eval()
    init_weights(model, args.seed, emb_std=8.0 / cfg.hidden_size**0.5)
    model.save_pretrained(Path(args.out), safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"shape": args.shape, "architectures": model.config.architectures, "parameters": n,
                      "transformers": transformers.__version__, "torch": torch.__version__}))


def make(args):
    if args.shape:
        return make_shape(args)
    if not args.arch:
        raise SystemExit("make needs --arch or --shape")
    torch.manual_seed(args.seed)
    cfg = config_for(args.arch)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    init_weights(model, args.seed)
    out = Path(args.out)
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, VOCAB, (B, L), generator=g)
    nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1).unsqueeze(-1)
    ids = torch.cat([nxt, torch.randint(0, VOCAB, (B, L, K - 1), generator=g)], dim=-1)
    lp = logprobs(model, tokens, ids)
    save_file({"tokens": tokens, "ids": ids, "logprobs": lp.contiguous()}, str(out / "oracle.safetensors"))
    print(json.dumps({"arch": args.arch, "architectures": model.config.architectures, "positions": B * L,
                      "transformers": transformers.__version__, "torch": torch.__version__}))


def score(args):
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    t = load_file(args.tokens)
    lp = logprobs(model, t["tokens"], t["ids"])
    save_file({"logprobs": lp.contiguous()}, args.out)
    print(json.dumps({"architectures": model.config.architectures, "positions": int(t["tokens"].numel())}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--arch")
    m.add_argument("--shape", choices=sorted(SHAPES))
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score")
    s.add_argument("--model", required=True)
    s.add_argument("--tokens", required=True)
    s.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    make(args) if args.cmd == "make" else score(args)


if __name__ == "__main__":
    main()
