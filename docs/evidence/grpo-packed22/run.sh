#!/usr/bin/env bash
# The step and proof benches of docs/benchmarks.md "The step's common prompt
# prefix once, packed rows" (session 22, 2026-12-05), on an arith level-115
# batch: the 9 groups of 8 with reward variance among 24 groups the miner
# generated on the BF16 base. The batch is kept here; to make it again:
#   target/debug/edge-miner generate --model .cache/models/SmolLM2-135M-Instruct.bf16.gguf \
#     --env arith --difficulty 115 --tasks 24 --group 8 --max-new-tokens 96 --seed 31 \
#     --out .cache/bench/arith115-24x8.jsonl --threads 2
#   (then keep the first 9 groups, in file order, whose rewards differ)
# Needs scripts/bench-venv.sh (the PyTorch anchor) and a built grpo-bench.
# Run from the repository root: bash docs/evidence/grpo-packed22/run.sh OUT
set -x
out="${1:-/tmp/grpo-packed22}"
mkdir -p "$out" .cache/bench
B=.cache/bench/arith115-9groups.jsonl
zcat docs/evidence/grpo-packed22/arith115-9groups.jsonl.gz > "$B"
uptime
target/debug/grpo-bench --batch $B --lr 3e-5 --rounds 5 --threads 2 --save .cache/bench/arith115-step1.gguf > "$out/step-packed.out" 2> "$out/step-packed.err"
uptime
target/debug/grpo-bench --batch $B --lr 3e-5 --rounds 5 --threads 2 --no-pack --save .cache/bench/arith115-step1-nopack.gguf > "$out/step-pergroup.out" 2> "$out/step-pergroup.err"
uptime
target/debug/grpo-bench --batch $B --lr 3e-5 --rounds 5 --threads 2 --verify > "$out/verify-packed.out" 2> "$out/verify-packed.err"
uptime
target/debug/grpo-bench --batch $B --lr 3e-5 --rounds 5 --threads 2 --verify --no-pack > "$out/verify-pergroup.out" 2> "$out/verify-pergroup.err"
uptime
