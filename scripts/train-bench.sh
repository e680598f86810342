#!/usr/bin/env bash
# Does training work? Runs the whole network (scripts/demo.sh: coordinator,
# two llama.cpp miners, a validator that samples, and the trainer that proves
# every rollout it trains on; SmolLM2-135M-Instruct on arith) once per arm —
# two training arms with the strict reward and independent network randomness
# (fresh keys, so other challenges, tasks and sampling seeds), and a
# format-only control (paid for a well-formed final `Answer:` line,
# correctness ignored) — for K windows each; then measures greedy held-out
# accuracy of the base (with its default prompt and prompted variants) and of
# every arm's final checkpoint on three columns (the training level's test
# split, an operand band no window draws from, an out-of-distribution level),
# strict and lenient, each arm against the default-prompt base and the best
# prompted base with paired-bootstrap intervals; writes the mean reward per
# window as CSV, plots the arms in one PNG, and keeps the evidence. Figures:
# docs/training.md.
#
#   BENCH_WINDOWS=K     windows per arm (default 40)
#   BENCH_TASKS=N       held-out problems per column (default 500)
#   BENCH_ARMS="NAME:REWARD[:LR] ..."  arms (default
#                       "seed-a:strict seed-b:strict control:format", lr $DEMO_LR);
#                       "none": no training, only the base's evaluation (the baselines)
#   BENCH_SERIAL=1      run the arms one after another (default: all at once;
#                       each arm's trainer peaks near 5 GiB)
#   BENCH_DIR=DIR       working folder; an arm whose DIR/NAME/net/status.json
#                       exists is not run again (so a bench can be finished
#                       in parts)
#   BENCH_EVAL_JOBS=J   evaluations run at once (default 2, one llama.cpp thread each)
#   BENCH_EVAL_BATCH=B  problems each evaluation decodes together (default 32; the
#                       completions are the same as one at a time, bit for bit)
#   BENCH_EVIDENCE=DIR  also keep the evidence there (e.g. docs/training-evidence):
#                       every eval JSONL (gzip), each arm's reward.csv, the final
#                       checkpoints' content ids, the report, every stored group
#                       (groups-ARM.jsonl.gz: `train-bench groups`); `train-bench
#                       report --dir DIR` recomputes every figure from those files.
#                       A bench finished in parts on fresh machines: the
#                       evaluations DIR already holds are reused (train-bench eval
#                       keeps a file of the same model file, prompt, column,
#                       problems and budget), and the arms DIR holds from earlier
#                       parts keep their line in checkpoints.txt and their curve
#                       in the plot
#   BENCH_PNG=FILE      also copy the plot there (e.g. docs/train-reward.png); with
#                       BENCH_EVIDENCE, the plot of every arm the evidence holds
#   DEMO_*              passed to scripts/demo.sh; the bench's defaults:
#                       DEMO_DIFFICULTY=115 (the problems of 105 with three worked
#                       examples in the prompt: protocol::env::WORKED_LEVELS;
#                       118 trains on the same problems subtracting three times
#                       in four and is measured on 115's columns),
#                       DEMO_TOKENS=96, DEMO_GROUPS=4 (2 miners x 4 groups x 8:
#                       64 rollouts a window), DEMO_GROUP_SIZE=8,
#                       DEMO_WINDOW_MS=150000, DEMO_LR=3e-5, DEMO_VALIDATOR=1,
#                       DEMO_MIN_GROUPS=8 (a step takes at least 8 proven groups
#                       with an advantage, as many as one window holds; fewer
#                       wait for the next windows' groups)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
k="${BENCH_WINDOWS:-40}"
tasks="${BENCH_TASKS:-500}"
export DEMO_DIFFICULTY="${DEMO_DIFFICULTY:-115}"
export DEMO_TOKENS="${DEMO_TOKENS:-96}"
export DEMO_GROUPS="${DEMO_GROUPS:-4}"
export DEMO_MIN_GROUPS="${DEMO_MIN_GROUPS:-8}"
export DEMO_GROUP_SIZE="${DEMO_GROUP_SIZE:-8}"
export DEMO_WINDOW_MS="${DEMO_WINDOW_MS:-150000}"
export DEMO_LR="${DEMO_LR:-3e-5}"
export DEMO_VALIDATOR="${DEMO_VALIDATOR:-1}"
# Each arm is a demo network that must stop after its last window (demo.sh
# otherwise keeps it running until Ctrl-C) and skip demo.sh's own small
# evaluation: this script evaluates every arm itself, after all have trained.
export DEMO_KEEP=0
export DEMO_EVAL_TASKS=0
# libtorch's OpenMP threads sleep instead of spinning while they wait: several
# networks share the cores.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
arms="${BENCH_ARMS:-seed-a:strict seed-b:strict control:format}"
if [ "$arms" = none ]; then arms=""; fi
dir="${BENCH_DIR:-$(mktemp -d -t tributary-bench.XXXXXX)}"
mkdir -p "$dir"
font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ -n "$arms" ] && [ ! -f "$font" ]; then
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

arm_name() { echo "${1%%:*}"; }
arm_reward() { local r="${1#*:}"; echo "${r%%:*}"; }
arm_lr() { local r="${1#*:}"; if [ "${r#*:}" != "$r" ]; then echo "${r#*:}"; else echo "$DEMO_LR"; fi; }

run_arm() {
  local name="$1" reward="$2" lr="$3"
  if [ -f "$dir/$name/net/status.json" ]; then
    echo "== arm $name: done before ($dir/$name/net/status.json)"
    return 0
  fi
  rm -rf "$dir/$name"
  mkdir -p "$dir/$name"
  echo "== arm $name: $k windows of $DEMO_WINDOW_MS ms, arith $DEMO_DIFFICULTY, reward $reward, lr $lr (log $dir/$name/demo.txt)"
  DEMO_BIN="$bin" DEMO_DIR="$dir/$name/net" DEMO_WINDOWS="$k" DEMO_LR="$lr" DEMO_REWARD="$reward" \
    bash scripts/demo.sh > "$dir/$name/demo.txt" 2>&1
}
plot_title="SmolLM2-135M, arith $DEMO_DIFFICULTY: mean reward per window (T=0.7)"
pids=()
for arm in $arms; do
  if [ "${BENCH_SERIAL:-0}" = 1 ]; then
    run_arm "$(arm_name "$arm")" "$(arm_reward "$arm")" "$(arm_lr "$arm")"
  else
    run_arm "$(arm_name "$arm")" "$(arm_reward "$arm")" "$(arm_lr "$arm")" &
    pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait "$p"; done

models=(--model "$base" --label base)
plot=()
ids="$dir/checkpoints.txt"
echo "# arm reward lr windows final_checkpoint_content_id (the file is NET/trainer/publish/checkpoints/<id>.gguf)" > "$ids"
genesis_id="$("$bin/trainer" init-base | sed -n 's/^content_id=//p')"
echo "base - - - $genesis_id" >> "$ids"
for arm in $arms; do
  name="$(arm_name "$arm")"
  net="$dir/$name/net"
  tail -n 20 "$dir/$name/demo.txt"
  final="$(ls -t "$net"/trainer/publish/checkpoints/*.gguf 2>/dev/null | head -1 || true)"
  if [ -z "$final" ]; then
    if [ ! -f "$net/status.json" ]; then
      echo "arm $name: its network did not finish (no $net/status.json)" >&2
      exit 1
    fi
    # The network ran every window but its trainer never stepped (a reward
    # whose groups rarely differ, below the step's floor of groups): the
    # arm's final weights are the genesis checkpoint's, evaluated as such.
    final="$base"
    echo "arm $name: the trainer took no step in $k windows: its final weights are the genesis checkpoint's"
  else
    echo "arm $name: final checkpoint $(basename "$final")"
  fi
  id="$(basename "$final" .gguf)"
  if [ "$final" = "$base" ]; then id="$genesis_id"; fi
  echo "$name $(arm_reward "$arm") $(arm_lr "$arm") $k $id" >> "$ids"
  models+=(--model "$final" --label "$name")
  python3 - "$net/status.json" > "$dir/$name/reward.csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("window,rollouts,mean_reward,checkpoint")
for w in s["windows"]:
    if w["closed"] and w["rollouts"]:
        print(f"{w['window']},{w['rollouts']},{w['mean_reward']:.4f},{w['checkpoint'][:16]}")
PY
  plot+=(--csv "$dir/$name/reward.csv" --label "$name ($(arm_reward "$arm"), lr $(arm_lr "$arm"))")
done
if [ -n "$arms" ]; then
  "$bin/train-bench" plot "${plot[@]}" --out "$dir/reward.png" \
    --title "$plot_title"
  if [ -n "${BENCH_PNG:-}" ] && [ -z "${BENCH_EVIDENCE:-}" ]; then cp "$dir/reward.png" "$BENCH_PNG"; echo "plot copied to $BENCH_PNG"; fi
fi

if [ -n "${BENCH_EVIDENCE:-}" ]; then
  # An earlier part's evaluations (the base's prompts, earlier arms) are not
  # run again: train-bench eval keeps a file that matches to the problem.
  mkdir -p "$dir/eval"
  for f in "$BENCH_EVIDENCE"/eval-*.jsonl.gz; do
    [ -f "$f" ] || continue
    out="$dir/eval/$(basename "$f" .gz)"
    if [ ! -f "$out" ]; then gunzip -c "$f" > "$out"; fi
  done
fi

echo "== held-out greedy accuracy (the base with every prompt, then the arms with the training prompt)"
gsm=()
if [ -n "${TRIBUTARY_GSM8K_DIR:-}" ] && [ -f "$TRIBUTARY_GSM8K_DIR/test.jsonl" ]; then gsm=(--gsm8k-test "$TRIBUTARY_GSM8K_DIR/test.jsonl"); fi
"$bin/train-bench" eval "${models[@]}" --difficulty "$DEMO_DIFFICULTY" --tasks "$tasks" \
  "${gsm[@]}" --max-new-tokens "$DEMO_TOKENS" --threads 1 --jobs "${BENCH_EVAL_JOBS:-2}" \
  --batch "${BENCH_EVAL_BATCH:-32}" \
  --out-dir "$dir/eval" | tee "$dir/report.txt"

if [ -n "${BENCH_EVIDENCE:-}" ]; then
  ev="$BENCH_EVIDENCE"
  mkdir -p "$ev"
  for f in "$dir"/eval/eval-*.jsonl; do gzip -9 -n -c "$f" > "$ev/$(basename "$f").gz"; done
  for arm in $arms; do
    name="$(arm_name "$arm")"
    cp "$dir/$name/reward.csv" "$ev/reward-$name.csv"
    # The trainer's steps (step, loss, groups) and the rounds that kept their
    # groups for a later step, each with its phases' seconds (take_s ...
    # upload_s; `train-bench report` prints their medians).
    grep -E 'trained step=|kept for a later step' "$dir/$name/net/trainer.log" \
      | sed 's/\x1b\[[0-9;]*m//g' > "$ev/trainer-$name.log" || true
    # What training saw, group by group (problem, rewards, rollouts trained
    # on), read from a copy of the stopped coordinator's store;
    # `python3 docs/training-evidence/groups-by-op.py DIR` splits them by operation.
    cp "$dir/$name/net/coordinator/coordinator.redb" "$dir/$name/groups-store.redb"
    "$bin/train-bench" groups --store "$dir/$name/groups-store.redb" --trainer "$dir/$name/net/trainer" \
      --difficulty "$DEMO_DIFFICULTY" --out "$dir/$name/groups.jsonl"
    rm -f "$dir/$name/groups-store.redb"
    gzip -9 -n -c "$dir/$name/groups.jsonl" > "$ev/groups-$name.jsonl.gz"
  done
  # The arms of earlier parts (named in the evidence, not in this run) keep
  # their line, after the base's and before this run's arms.
  merged="$dir/checkpoints-merged.txt"
  head -n 2 "$ids" > "$merged"
  if [ -f "$ev/checkpoints.txt" ]; then
    awk 'NR == FNR { if ($1 !~ /^#/) here[$1] = 1; next } $1 !~ /^#/ && !($1 in here)' \
      "$ids" "$ev/checkpoints.txt" >> "$merged"
  fi
  tail -n +3 "$ids" >> "$merged"
  cp "$merged" "$ev/checkpoints.txt"
  "$bin/train-bench" report --dir "$ev" > "$ev/report.txt"
  if [ -n "${BENCH_PNG:-}" ]; then
    every=()
    while read -r name reward lr _; do
      if [ -f "$ev/reward-$name.csv" ]; then every+=(--csv "$ev/reward-$name.csv" --label "$name ($reward, lr $lr)"); fi
    done < <(grep -v '^#' "$ev/checkpoints.txt" | grep -v '^base ')
    "$bin/train-bench" plot "${every[@]}" --out "$BENCH_PNG" \
      --title "$plot_title"
    echo "plot of every arm in $ev written to $BENCH_PNG"
  fi
  echo "evidence kept in $ev (recompute: train-bench report --dir $ev)"
fi
echo "arms: ${arms:-none}; completions in $dir/eval; working folder $dir"
