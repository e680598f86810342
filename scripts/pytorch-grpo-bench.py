#!/usr/bin/env python3
"""The same GRPO step as the Rust trainer, in PyTorch + HF transformers.

Run by `cargo run -p trainer --bin grpo-bench` (which exports the base model
for transformers first); usable alone:

    $(scripts/bench-venv.sh) scripts/pytorch-grpo-bench.py --hf .cache/bench/hf-base \
        --batch .cache/bench/grpo-batch.jsonl --threads 2

Mirrors trainer::train::Trainer::step and trainer::grpo::grpo_loss with the
defaults of TrainConfig/GrpoConfig: fp32 weights; micro-batches of at most
--micro-batch-tokens completion tokens after a stable sort by sequence length (with
--share-prompts, as TrainConfig::share_prompts: the samples of one prompt together, the
prompt run once per micro-batch and its key/value cache repeated over the batch; with
--pack-prompts too, as TrainConfig::pack_prompts: the prefix common to the step's prompts
run once a step, each micro-batch one row without padding under a block mask); right padding
with token 0 (causal attention, so no mask is needed); LM head on the
completion positions only; GSPO sequence ratio against the miner log-probs
(log-ratio clamp ±5, ratio cap 10), asymmetric clip 0.2/0.28, δ = 4 cap for
negative advantages, DAPO token normalisation over the whole batch, entropy
bonus 0.001; global grad-norm clip 1.0; one AdamW step (β 0.9/0.95, ε 1e-8,
weight decay 0.1). Prints key=value lines.

Step 1 is a warm-up (lazy kernel set-up and Adam state), reported apart
(`pytorch_warmup_*`); with --rust-weights its weights are compared with the
Rust trainer's step 1 (max abs difference). The timed steps follow in the
same process: --steps of them, or with --serve one per `step` line on stdin
(grpo-bench alternates them with its own steps, so load hits both alike).
"""

import argparse
import json
import sys
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

CLIP_LOW, CLIP_HIGH, NEG_CAP, LR_CLAMP, RATIO_MAX, ENT_COEF = 0.2, 0.28, 4.0, 5.0, 10.0, 0.001


def group_advantages(rewards, eps=1e-8):
    n = max(len(rewards), 1)
    mean = sum(rewards) / n
    std = max((sum((r - mean) ** 2 for r in rewards) / n) ** 0.5, eps)
    return [(r - mean) / std for r in rewards]


def load_samples(path):
    groups = OrderedDict()
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                groups.setdefault(r["group"], []).append(r)
    samples = []
    for g in sorted(groups):
        rs = groups[g]
        for r, a in zip(rs, group_advantages([float(r["reward"]) for r in rs])):
            samples.append(dict(tokens=r["tokens"], prompt_len=r["prompt_len"], old=r["logprobs"], adv=a))
    return samples


def pack(samples, micro_batch_tokens):
    """Sort by length, then fill micro-batches of at most micro_batch_tokens completion tokens."""
    out, used = [], 0
    for s in sorted(samples, key=lambda s: len(s["tokens"])):
        n = len(s["tokens"]) - s["prompt_len"]
        if out and used + n <= micro_batch_tokens:
            out[-1].append(s)
        else:
            out.append([s])
            used = 0
        used += n
    return out


def micro_batches(samples, micro_batch_tokens, share_prompts):
    """trainer::train::plan_micro_batches: (samples, shared_prompt) pairs."""
    out, rest = [], []
    if share_prompts:
        groups = OrderedDict()
        for s in samples:
            groups.setdefault(tuple(s["tokens"][: s["prompt_len"]]), []).append(s)
        for g in groups.values():
            for mb in pack(g, micro_batch_tokens):
                if len(mb) >= 2:
                    out.append((mb, True))
                else:
                    rest.extend(mb)
    else:
        rest = list(samples)
    if rest:
        out.extend((mb, False) for mb in pack(rest, micro_batch_tokens))
    return out


def common_prefix(samples):
    """trainer::train::common_prompt_prefix: the prompt tokens every sample
    shares, leaving each prompt's last token out."""
    first = samples[0]["tokens"][: samples[0]["prompt_len"]]
    n = len(first) - 1
    for s in samples:
        p = s["tokens"][: s["prompt_len"]]
        same = 0
        while same < min(n, len(p)) and first[same] == p[same]:
            same += 1
        n = min(same, len(p) - 1)
    return n


def packed_micro_batches(samples, micro_batch_tokens):
    """trainer::train::plan_micro_batches with pack: a prompt's samples cut
    into runs of at most micro_batch_tokens completion tokens, the runs
    filled into micro-batches in turn."""
    groups = OrderedDict()
    for s in samples:
        groups.setdefault(tuple(s["tokens"][: s["prompt_len"]]), []).append(s)
    out, cur, used = [], [], 0
    for g in groups.values():
        for run in pack(g, micro_batch_tokens):
            n = sum(len(s["tokens"]) - s["prompt_len"] for s in run)
            if cur and used + n > micro_batch_tokens:
                out.append(cur)
                cur, used = [], 0
            cur.extend(run)
            used += n
    if cur:
        out.append(cur)
    return out


def cache_of(leaves):
    """A fresh key/value cache holding the prefix's (leaf) keys and values."""
    from transformers import DynamicCache

    c = DynamicCache()
    for i, (k, v) in enumerate(leaves):
        c.update(k, v, i)
    return c


def cache_kv(cache):
    if hasattr(cache, "layers"):
        return [(l.keys, l.values) for l in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def packed_hidden_rows(model, mb, leaves, p0):
    """trainer::train::Trainer::token_logprobs, Layout::Packed: one row, for
    each run of samples with one prompt its tokens after the common prefix
    then every completion but its last token; a block mask (the prefix, the
    prompt's rest, the completion's own earlier tokens) and per-token positions."""
    ids, pos, owner, rows, targets, seq_of = [], [], [], [], [], []
    i, seg = 0, 0
    while i < len(mb):
        p = mb[i]["prompt_len"]
        prompt = mb[i]["tokens"][:p]
        for k in range(p0, p):
            ids.append(prompt[k])
            pos.append(k)
            owner.append((seg, 0))
        last = len(ids) - 1
        while i < len(mb) and mb[i]["tokens"][: mb[i]["prompt_len"]] == prompt:
            s = mb[i]
            c = len(s["tokens"]) - p
            for k in range(c):
                rows.append(last if k == 0 else len(ids) - 1)
                targets.append(s["tokens"][p + k])
                seq_of.append(i)
                if k + 1 < c:
                    ids.append(s["tokens"][p + k])
                    pos.append(p + k)
                    owner.append((seg, i + 1))
            i += 1
        seg += 1
    n = len(ids)
    seg_t = torch.tensor([o[0] for o in owner])
    part_t = torch.tensor([o[1] for o in owner])
    own = (seg_t[:, None] == seg_t[None, :]) & ((part_t[None, :] == 0) | (part_t[:, None] == part_t[None, :]))
    own &= torch.ones(n, n, dtype=torch.bool).tril()
    allowed = torch.cat([torch.ones(n, p0, dtype=torch.bool), own], 1)
    mask = torch.zeros(1, 1, n, p0 + n).masked_fill(~allowed, float("-inf"))
    out = model.model(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([pos]),
        attention_mask=mask,
        past_key_values=cache_of(leaves) if p0 > 0 else None,
        use_cache=p0 > 0,
    ).last_hidden_state
    hidden = out.reshape(-1, out.shape[-1])
    return hidden.index_select(0, torch.tensor(rows)), torch.tensor(targets), torch.tensor(seq_of)


def hidden_rows(model, mb, shared):
    """Post-norm hidden rows predicting each completion token, its target and sequence."""
    rows, targets, seq_of = [], [], []
    if shared:
        # The prompt once; the completions attend to its keys and values
        # (the cache, repeated over the batch, keeps its autograd history).
        p = mb[0]["prompt_len"]
        sufs = [s["tokens"][p:] for s in mb]
        sl = max(len(x) for x in sufs)
        pre = model.model(input_ids=torch.tensor([mb[0]["tokens"][:p]]), use_cache=True)
        cache = pre.past_key_values
        cache.batch_repeat_interleave(len(mb))
        suf = torch.tensor([x + [0] * (sl - len(x)) for x in sufs], dtype=torch.long)
        mask = torch.ones(len(mb), p + sl, dtype=torch.long)
        hs = model.model(input_ids=suf, past_key_values=cache, attention_mask=mask, use_cache=True).last_hidden_state
        d = hs.shape[-1]
        hidden = torch.cat([pre.last_hidden_state.reshape(-1, d), hs.reshape(-1, d)])
        for i, s in enumerate(mb):
            for k in range(len(s["tokens"]) - p):
                rows.append(p - 1 if k == 0 else p + i * sl + k - 1)
                targets.append(s["tokens"][p + k])
                seq_of.append(i)
    else:
        l = max(len(s["tokens"]) for s in mb)
        ids = torch.tensor([s["tokens"] + [0] * (l - len(s["tokens"])) for s in mb], dtype=torch.long)
        for i, s in enumerate(mb):
            for p in range(s["prompt_len"], len(s["tokens"])):
                rows.append(i * l + p - 1)
                targets.append(s["tokens"][p])
                seq_of.append(i)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1])
    return hidden.index_select(0, torch.tensor(rows)), torch.tensor(targets), torch.tensor(seq_of)


def grpo_loss(logp, old, seq, lens, adv, entropy, total_tokens, total_seqs):
    b = lens.shape[0]
    logratio = logp - old
    mean_lr = torch.zeros(b).index_add(0, seq, logratio) / lens.clamp_min(1.0)
    ratio = mean_lr.clamp(-LR_CLAMP, LR_CLAMP).exp().clamp_max(RATIO_MAX)
    clipped = ratio.clamp(1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
    neg = adv < 0
    capped = torch.where(~neg, ratio, ratio.clamp_max(NEG_CAP))
    obj = torch.minimum(capped * adv, clipped * adv)
    pg = -(obj * lens).sum() / max(total_tokens, 1.0)
    per_seq_h = torch.zeros(b).index_add(0, seq, entropy) / lens.clamp_min(1.0)
    return pg - per_seq_h.sum() * (ENT_COEF / max(total_seqs, 1.0))


def step(model, opt, samples, micro_batch_tokens, share_prompts, pack_prompts=False):
    total_tokens = sum(len(s["tokens"]) - s["prompt_len"] for s in samples)
    total_seqs = len(samples)
    emb = model.get_output_embeddings().weight
    loss_sum = 0.0
    prefix_kv, leaves, p0 = [], [], 0
    if share_prompts and pack_prompts:
        # The step's common prompt prefix runs once; its keys and values
        # enter every micro-batch as leaves that collect their gradient, and
        # one backward through the prefix at the end passes it on.
        p0 = common_prefix(samples)
        if p0 > 0:
            pre = model.model(input_ids=torch.tensor([samples[0]["tokens"][:p0]]), use_cache=True)
            prefix_kv = cache_kv(pre.past_key_values)
            leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in prefix_kv]
        plan = [(mb, "packed") for mb in packed_micro_batches(samples, micro_batch_tokens)]
    else:
        plan = micro_batches(samples, micro_batch_tokens, share_prompts)
    for mb, shared in plan:
        if shared == "packed":
            h, targets, seq = packed_hidden_rows(model, mb, leaves, p0)
        else:
            h, targets, seq = hidden_rows(model, mb, shared)
        logp_all = F.log_softmax(h @ emb.t(), dim=-1)
        logp = logp_all.gather(1, targets.unsqueeze(1)).squeeze(1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        old = torch.tensor([v for s in mb for v in s["old"]], dtype=torch.float32)
        lens = torch.tensor([len(s["tokens"]) - s["prompt_len"] for s in mb], dtype=torch.float32)
        adv = torch.tensor([s["adv"] for s in mb], dtype=torch.float32)
        loss = grpo_loss(logp, old, seq, lens, adv, entropy, total_tokens, total_seqs)
        loss.backward()
        loss_sum += loss.item()
    if leaves:
        surrogate = sum((t * leaf.grad).sum() for kv, lv in zip(prefix_kv, leaves) for t, leaf in zip(kv, lv))
        surrogate.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    return loss_sum, float(norm)


def compare_weights(model, base_sd, path):
    """Max abs difference between this side's weights and the Rust trainer's (fp32, HF names, same step)."""
    from safetensors.torch import load_file

    rust = load_file(path)
    diff = update = 0.0
    worst = ""
    n = 0
    for name, p in model.state_dict().items():
        if name not in rust:
            continue
        mine = p.detach().float()
        d = (mine - rust[name].float()).abs().max().item()
        u = (mine - base_sd[name]).abs().max().item()
        if d >= diff:
            diff, worst = d, name
        update = max(update, u)
        n += 1
    print(f"weights_compared_tensors={n}")
    print(f"weights_max_abs_diff={diff:.3e}")
    print(f"weights_max_abs_diff_tensor={worst}")
    print(f"weights_max_abs_update={update:.3e}")


def timed_step(model, opt, samples, a, prefix):
    t, cpu = time.perf_counter(), time.process_time()
    loss, norm = step(model, opt, samples, a.micro_batch_tokens, a.share_prompts, a.pack_prompts)
    secs, cpu_secs = time.perf_counter() - t, time.process_time() - cpu
    print(f"{prefix}loss={loss:.6f}")
    print(f"{prefix}grad_norm={norm:.4f}")
    print(f"{prefix}seconds={secs:.3f}")
    print(f"{prefix}cpu_seconds={cpu_secs:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True, help="HF export of the base (trainer export --hf)")
    ap.add_argument("--batch", required=True, help="rollouts JSONL")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--micro-batch-tokens", type=int, default=512, help="TrainConfig::micro_batch_tokens")
    ap.add_argument("--share-prompts", action="store_true", help="TrainConfig::share_prompts: run a shared prompt once")
    ap.add_argument(
        "--pack-prompts",
        action="store_true",
        help="TrainConfig::pack_prompts (with --share-prompts): the common prompt prefix once a step, packed rows",
    )
    ap.add_argument("--ref-logits", help="reference next-token logits (f32 LE) on --prompt")
    ap.add_argument("--prompt", help="comma-separated prompt token ids for the logits check")
    ap.add_argument("--rust-weights", help="the Rust trainer's fp32 weights after its first step (safetensors, HF names)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps after the warm-up step (without --serve)")
    ap.add_argument(
        "--serve", action="store_true", help="after the warm-up step, one timed step per 'step' line on stdin"
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    model = AutoModelForCausalLM.from_pretrained(a.hf, dtype=torch.float32, attn_implementation="sdpa")
    print(f"torch={torch.__version__}")
    if a.ref_logits and a.prompt:
        ids = torch.tensor([[int(t) for t in a.prompt.split(",")]], dtype=torch.long)
        with torch.no_grad():
            got = model(input_ids=ids).logits[0, -1].float().numpy()
        want = np.fromfile(a.ref_logits, dtype="<f4")
        print(f"hf_logits_max_abs_diff={np.abs(got - want).max():.3e}")
        print(f"hf_logits_max_abs={np.abs(want).max():.3f}")
        print(f"hf_argmax_match={int(got.argmax()) == int(want.argmax())}")

    model.train()
    base_sd = {k: v.detach().clone().float() for k, v in model.state_dict().items()} if a.rust_weights else None
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    samples = load_samples(a.batch)
    # Step 1 is the warm-up (first kernels, Adam state allocated): its loss,
    # gradient norm and weights are compared with the Rust step 1, its time
    # is reported apart and left out of the medians.
    timed_step(model, opt, samples, a, "pytorch_warmup_")
    if a.rust_weights:
        compare_weights(model, base_sd, a.rust_weights)
        del base_sd
    if a.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "step":
                break
            timed_step(model, opt, samples, a, "pytorch_step_")
            print("done", flush=True)
    else:
        for _ in range(a.steps):
            timed_step(model, opt, samples, a, "pytorch_step_")


if __name__ == "__main__":
    main()
