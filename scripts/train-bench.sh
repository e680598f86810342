#!/usr/bin/env bash
# Does training work? Runs the demo network (scripts/demo.sh: coordinator,
# two llama.cpp miners, trainer; SmolLM2-135M-Instruct on arith) for K
# windows, then measures greedy held-out accuracy of the base and the final
# checkpoint on held-out problems (the test split of the arith level, which no
# window assigns, and GSM8K's test file when TRIBUTARY_GSM8K_DIR is set),
# writes the mean reward per window as CSV
# and plots it as a PNG (train-bench plot). Figures: docs/training.md.
#
#   BENCH_WINDOWS=K     windows (default 20)
#   BENCH_TASKS=N       held-out problems per column (default 200)
#   BENCH_PNG=FILE      also copy the plot there (e.g. docs/train-reward.png)
#   DEMO_*              passed to scripts/demo.sh; the bench's defaults:
#                       DEMO_DIFFICULTY=102, DEMO_TOKENS=48, DEMO_GROUPS=2,
#                       DEMO_GROUP_SIZE=8, DEMO_WINDOW_MS=90000, DEMO_LR=3e-5,
#                       DEMO_VALIDATOR=0 (two cores cannot also prove every window)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
k="${BENCH_WINDOWS:-20}"
tasks="${BENCH_TASKS:-200}"
export DEMO_DIFFICULTY="${DEMO_DIFFICULTY:-102}"
export DEMO_TOKENS="${DEMO_TOKENS:-48}"
export DEMO_GROUPS="${DEMO_GROUPS:-2}"
export DEMO_GROUP_SIZE="${DEMO_GROUP_SIZE:-8}"
export DEMO_WINDOW_MS="${DEMO_WINDOW_MS:-90000}"
export DEMO_LR="${DEMO_LR:-3e-5}"
export DEMO_VALIDATOR="${DEMO_VALIDATOR:-0}"
dir="${DEMO_DIR:-$(mktemp -d -t tributary-bench.XXXXXX)}"
mkdir -p "$dir"
font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ ! -f "$font" ]; then
  echo "== installing fonts-dejavu-core (the plot's font)"
  { apt-get update -qq && apt-get install -y -qq fonts-dejavu-core; } >/dev/null 2>&1 \
    || echo "could not install fonts-dejavu-core: the plot step will fail" >&2
fi
echo "== build train-bench"
cargo build -q -p tributary-tests --bin train-bench
bin="$root/target/debug"

echo "== network: $k windows of $DEMO_WINDOW_MS ms, arith difficulty $DEMO_DIFFICULTY, lr $DEMO_LR (working folder $dir)"
DEMO_DIR="$dir" DEMO_WINDOWS="$k" bash scripts/demo.sh | tee "$dir/demo.txt"
base="$root/.cache/models/SmolLM2-135M-Instruct.bf16.gguf"
final="$(ls -t "$dir"/trainer/publish/checkpoints/*.gguf 2>/dev/null | head -1 || true)"
python3 - "$dir/status.json" > "$dir/reward.csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("window,rollouts,mean_reward,checkpoint")
for w in s["windows"]:
    if w["closed"] and w["rollouts"]:
        print(f"{w['window']},{w['rollouts']},{w['mean_reward']:.4f},{w['checkpoint'][:16]}")
PY
echo "== reward per window ($dir/reward.csv)"
cat "$dir/reward.csv"
"$bin/train-bench" plot --csv "$dir/reward.csv" --out "$dir/reward.png" \
  --title "SmolLM2-135M, arith $DEMO_DIFFICULTY: mean reward per window (T=0.7, lr $DEMO_LR)"
if [ -n "${BENCH_PNG:-}" ]; then cp "$dir/reward.png" "$BENCH_PNG"; echo "plot copied to $BENCH_PNG"; fi

echo "== held-out greedy accuracy on test-split problems (base, then final checkpoint; one llama.cpp thread each)"
if [ -z "$final" ]; then
  echo "the trainer published no checkpoint" >&2
  exit 1
fi
gsm=()
if [ -n "${TRIBUTARY_GSM8K_DIR:-}" ] && [ -f "$TRIBUTARY_GSM8K_DIR/test.jsonl" ]; then gsm=(--gsm8k-test "$TRIBUTARY_GSM8K_DIR/test.jsonl"); fi
"$bin/train-bench" eval --model "$base" --model "$final" --difficulty "$DEMO_DIFFICULTY" --tasks "$tasks" \
  "${gsm[@]}" --max-new-tokens "$DEMO_TOKENS" --threads 1 --out-dir "$dir" | tee "$dir/heldout.txt"
echo "model0 = base, model1 = final ($(basename "$final")); completions in $dir/heldout-{0,1}-*.jsonl"
