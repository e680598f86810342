#!/usr/bin/env bash
# Does training work? Runs the whole network (scripts/demo.sh: coordinator,
# two llama.cpp miners, a validator that samples, and the trainer that proves
# every rollout it trains on; SmolLM2-135M-Instruct on arith) once per arm —
# two training arms with independent network randomness (fresh keys, so other
# challenges, tasks and sampling seeds) and an lr = 0 control — for K windows
# each, then measures greedy held-out accuracy of the base and every arm's
# final checkpoint on held-out problems (the test split of the arith level,
# which no window assigns, and GSM8K's test file when TRIBUTARY_GSM8K_DIR is
# set), each arm against the base with a paired bootstrap interval, writes the
# mean reward per window as CSV and plots the arms in one PNG. Figures:
# docs/training.md.
#
#   BENCH_WINDOWS=K     windows per arm (default 30)
#   BENCH_TASKS=N       held-out problems per column (default 200)
#   BENCH_ARMS="NAME:LR ..."  arms (default "seed-a:$DEMO_LR seed-b:$DEMO_LR control:0")
#   BENCH_SERIAL=1      run the arms one after another (default: all at once;
#                       each arm's trainer peaks near 5 GiB)
#   BENCH_DIR=DIR       working folder; an arm whose DIR/NAME/net/status.json
#                       exists is not run again (so a bench can be finished
#                       in parts)
#   BENCH_PNG=FILE      also copy the plot there (e.g. docs/train-reward.png)
#   DEMO_*              passed to scripts/demo.sh; the bench's defaults:
#                       DEMO_DIFFICULTY=104, DEMO_TOKENS=48, DEMO_GROUPS=2,
#                       DEMO_GROUP_SIZE=8, DEMO_WINDOW_MS=150000, DEMO_LR=3e-5,
#                       DEMO_VALIDATOR=1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
k="${BENCH_WINDOWS:-30}"
tasks="${BENCH_TASKS:-200}"
export DEMO_DIFFICULTY="${DEMO_DIFFICULTY:-104}"
export DEMO_TOKENS="${DEMO_TOKENS:-48}"
export DEMO_GROUPS="${DEMO_GROUPS:-2}"
export DEMO_GROUP_SIZE="${DEMO_GROUP_SIZE:-8}"
export DEMO_WINDOW_MS="${DEMO_WINDOW_MS:-150000}"
export DEMO_LR="${DEMO_LR:-3e-5}"
export DEMO_VALIDATOR="${DEMO_VALIDATOR:-1}"
# libtorch's OpenMP threads sleep instead of spinning while they wait: several
# networks share the cores.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
arms="${BENCH_ARMS:-seed-a:$DEMO_LR seed-b:$DEMO_LR control:0}"
dir="${BENCH_DIR:-$(mktemp -d -t tributary-bench.XXXXXX)}"
mkdir -p "$dir"
font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ ! -f "$font" ]; then
  echo "== installing fonts-dejavu-core (the plot's font)"
  { apt-get update -qq && apt-get install -y -qq fonts-dejavu-core; } >/dev/null 2>&1 \
    || echo "could not install fonts-dejavu-core: the plot step will fail" >&2
fi
bash scripts/setup.sh
echo "== build (once; the networks run copies in $dir/bin, so the tree may change meanwhile)"
cargo build -p coordinator -p edge-miner -p trainer -p validator -p tributary-tests --bin train-bench \
  --bin coordinator --bin edge-miner --bin trainer --bin validator
mkdir -p "$dir/bin"
for b in coordinator edge-miner trainer validator train-bench; do cp "$root/target/debug/$b" "$dir/bin/"; done
bin="$dir/bin"
"$bin/trainer" init-base
base="$root/.cache/models/SmolLM2-135M-Instruct.bf16.gguf"

run_arm() {
  local name="$1" lr="$2"
  if [ -f "$dir/$name/net/status.json" ]; then
    echo "== arm $name: done before ($dir/$name/net/status.json)"
    return 0
  fi
  rm -rf "$dir/$name"
  mkdir -p "$dir/$name"
  echo "== arm $name: $k windows of $DEMO_WINDOW_MS ms, arith $DEMO_DIFFICULTY, lr $lr (log $dir/$name/demo.txt)"
  DEMO_BIN="$bin" DEMO_DIR="$dir/$name/net" DEMO_WINDOWS="$k" DEMO_LR="$lr" bash scripts/demo.sh > "$dir/$name/demo.txt" 2>&1
}
pids=()
for arm in $arms; do
  if [ "${BENCH_SERIAL:-0}" = 1 ]; then
    run_arm "${arm%%:*}" "${arm#*:}"
  else
    run_arm "${arm%%:*}" "${arm#*:}" &
    pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p"; done

models=(--model "$base")
plot=()
for arm in $arms; do
  name="${arm%%:*}"
  net="$dir/$name/net"
  tail -n 20 "$dir/$name/demo.txt"
  final="$(ls -t "$net"/trainer/publish/checkpoints/*.gguf 2>/dev/null | head -1 || true)"
  if [ -z "$final" ]; then
    echo "arm $name: the trainer published no checkpoint" >&2
    exit 1
  fi
  echo "arm $name: final checkpoint $(basename "$final")"
  models+=(--model "$final")
  python3 - "$net/status.json" > "$dir/$name/reward.csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("window,rollouts,mean_reward,checkpoint")
for w in s["windows"]:
    if w["closed"] and w["rollouts"]:
        print(f"{w['window']},{w['rollouts']},{w['mean_reward']:.4f},{w['checkpoint'][:16]}")
PY
  plot+=(--csv "$dir/$name/reward.csv" --label "$name (lr ${arm#*:})")
done
"$bin/train-bench" plot "${plot[@]}" --out "$dir/reward.png" \
  --title "SmolLM2-135M, arith $DEMO_DIFFICULTY: mean reward per window (T=0.7)"
if [ -n "${BENCH_PNG:-}" ]; then cp "$dir/reward.png" "$BENCH_PNG"; echo "plot copied to $BENCH_PNG"; fi

echo "== held-out greedy accuracy on test-split problems (model0 = base, then the arms in order; one llama.cpp thread each)"
gsm=()
if [ -n "${TRIBUTARY_GSM8K_DIR:-}" ] && [ -f "$TRIBUTARY_GSM8K_DIR/test.jsonl" ]; then gsm=(--gsm8k-test "$TRIBUTARY_GSM8K_DIR/test.jsonl"); fi
"$bin/train-bench" eval "${models[@]}" --difficulty "$DEMO_DIFFICULTY" --tasks "$tasks" \
  "${gsm[@]}" --max-new-tokens "$DEMO_TOKENS" --threads 1 --out-dir "$dir" | tee "$dir/heldout.txt"
echo "arms: $arms; completions in $dir/heldout-*.jsonl; working folder $dir"
