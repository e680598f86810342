#!/usr/bin/env bash
# Does training work? Runs the demo network (scripts/demo.sh: coordinator,
# two llama.cpp miners, trainer, SmolLM2-135M, arith) for K windows, then
# measures greedy held-out accuracy of the base and the final checkpoint on a
# fixed held-out set (seed 12345: tasks no window assigns), and writes the
# mean reward per window as CSV next to the figures.
#
#   BENCH_WINDOWS=K     windows (default 20)
#   BENCH_TASKS=N       held-out tasks (default 100)
#   DEMO_*              passed to scripts/demo.sh (window length, difficulty, tokens, lr)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
k="${BENCH_WINDOWS:-20}"
tasks="${BENCH_TASKS:-100}"
dir="${DEMO_DIR:-$(mktemp -d -t tributary-bench.XXXXXX)}"
difficulty="${DEMO_DIFFICULTY:-0}"
tokens="${DEMO_TOKENS:-48}"
DEMO_DIR="$dir" DEMO_WINDOWS="$k" bash scripts/demo.sh | tee "$dir/demo.txt"
bin="$root/target/debug"
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
accuracy() {
  "$bin/edge-miner" generate --model "$1" --env arith --difficulty "$difficulty" --tasks "$tasks" --group 1 \
    --max-new-tokens "$tokens" --seed 12345 --temperature 0 --threads 2 --out "$2" >/dev/null 2>&1
  python3 -c "import json,sys; r=[json.loads(l)['reward'] for l in open(sys.argv[1])]; print(f'{sum(r)/len(r):.3f}')" "$2"
}
echo "== held-out greedy accuracy (arith difficulty $difficulty, $tasks tasks, seed 12345)"
echo "base  $(accuracy "$base" "$dir/heldout-base.jsonl")"
if [ -n "$final" ]; then
  echo "final $(accuracy "$final" "$dir/heldout-final.jsonl")  ($(basename "$final"))"
else
  echo "final: the trainer published no checkpoint"
fi
echo "reward per window: $dir/reward.csv"
