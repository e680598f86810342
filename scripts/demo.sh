#!/usr/bin/env bash
# Tributary's main job, on one machine: a model gets better from rollouts
# that other processes produced. Installs what is missing, builds the BF16
# base checkpoint from the real SmolLM2-135M-Instruct, then starts on
# loopback, as separate processes: a coordinator, two edge miners
# (llama.cpp), a validator (if this build has `validator run`) and a trainer
# (libtorch GRPO). Shows progress per window and ends with a summary: per
# window the rollouts stored, the validators' verdicts, the mean reward, the
# checkpoint in force and the delta published (every window it waited for,
# also those generated on trained checkpoints; the columns are explained
# below the table); then the base against the last checkpoint on held-out
# problems (`train-bench eval`, with a 95 % interval), the time each phase
# took, and the dashboard, which stays live until Ctrl-C.
#
#   DEMO_WINDOWS=N      closed windows to run (default 3)
#   DEMO_WINDOW_MS=MS   window length (default 90000: 2 miners x 2 groups x G=4
#                       x 48 tokens on one CPU thread each, plus a GRPO step)
#   DEMO_GROUPS=N       groups per miner per window (default 2)
#   DEMO_GROUP_SIZE=G   rollouts per group (default 4)
#   DEMO_TOKENS=N       most new tokens per rollout (default 48)
#   DEMO_DIFFICULTY=D   arith difficulty (default 102, a bridge level: one-digit
#                       a - b with a >= b; greedy base accuracy 36% on 50 tasks
#                       at 48 tokens, against 90% at 0 and ~7% at 1; see
#                       docs/training.md)
#   DEMO_LR=X           trainer learning rate (default 1e-5)
#   DEMO_REWARD=RULE    the coordinator's reward rule: strict, lenient or format
#                       (default lenient: the number after the last marker, else the
#                       last number. Under the coordinator's default, strict, which pays
#                       only a final `Answer: N` line, SmolLM2 scores 0 on every rollout
#                       (it writes "the answer is 7"): no group has a reward spread, the
#                       trainer has nothing to learn from and publishes nothing)
#   DEMO_VALIDATOR=0    run no validator (the trainer then trusts unjudged rollouts)
#   DEMO_KEEP_CHECKPOINTS=N  checkpoints the relay and the trainer keep on disk (default 4)
#   DEMO_MIN_GROUPS=N   groups a training step needs at least; fewer are kept for a
#                       later step (trainer `min_train_groups`; default 1: no floor)
#   DEMO_KEEP=0         stop everything after the summary (default 1: the network and
#                       its dashboard keep running until Ctrl-C)
#   DEMO_EVAL_TASKS=N   problems per column of the base-vs-last-checkpoint evaluation
#                       (default 50; 0 skips it, as train-bench does before its own evaluation)
#   DEMO_EXTRA_WINDOWS=N  after the last window, wait at most N more windows for one
#                       generated on a trained checkpoint (default 3)
#   DEMO_ARCH=FAMILY    llama (default: SmolLM2 as it is), qwen2, qwen3 or llama3: SmolLM2's
#                       weights re-expressed in that family's layout (`trainer transplant`:
#                       qwen2 = Q/K/V biases and NEOX RoPE, qwen3 = q/k RMSNorm measured on
#                       SmolLM2 and NEOX RoPE, llama3 = RoPE frequency
#                       scaling; docs/model-families.md). The proof contract is
#                       calibrated on these files in docs/calibration.md §6d.
#   DEMO_MODEL=FILE     run on this GGUF checkpoint as it is instead of SmolLM2 (e.g. the
#                       0.5B-shape model of docs/model-families.md; not with DEMO_ARCH)
#   DEMO_MINERS=N       edge miners (default 2)
#   DEMO_THREADS=N      CPU threads of each miner and of the validator (default 1)
#   DEMO_DIR=DIR        working folder (default: a new temporary folder)
#   DEMO_BIN=DIR        run these prebuilt binaries instead of building (train-bench.sh
#                       copies them once, so its networks keep running while the tree changes)
set -euo pipefail
# The whole script is parsed before it runs (the braces close at its end): an
# edit of this file, or a `git pull`, during a demo does not change the demo.
{
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
windows="${DEMO_WINDOWS:-3}"
window_ms="${DEMO_WINDOW_MS:-90000}"
groups="${DEMO_GROUPS:-2}"
group_size="${DEMO_GROUP_SIZE:-4}"
tokens="${DEMO_TOKENS:-48}"
difficulty="${DEMO_DIFFICULTY:-102}"
lr="${DEMO_LR:-1e-5}"
keep="${DEMO_KEEP_CHECKPOINTS:-4}"
min_groups="${DEMO_MIN_GROUPS:-1}"
dir="${DEMO_DIR:-$(mktemp -d -t tributary-demo.XXXXXX)}"
eval_tasks="${DEMO_EVAL_TASKS:-50}"
mkdir -p "$dir"

# Time per phase: `phase NAME` ends the previous phase and starts NAME.
phase_names=() phase_secs=() phase_name="" phase_start=$SECONDS demo_start=$SECONDS
phase() {
  if [ -n "$phase_name" ]; then phase_names+=("$phase_name"); phase_secs+=($((SECONDS - phase_start))); fi
  phase_name="$1" phase_start=$SECONDS
  [ -z "$1" ] || echo "== $1"
}
phase_report() {
  phase ""
  echo "== time per phase"
  for i in "${!phase_names[@]}"; do
    printf '   %-28s %4dm %02ds\n' "${phase_names[$i]}" $((phase_secs[i] / 60)) $((phase_secs[i] % 60))
  done
  printf '   %-28s %4dm %02ds\n' "total" $(((SECONDS - demo_start) / 60)) $(((SECONDS - demo_start) % 60))
}

phase "setup"
bash scripts/setup.sh
if [ -n "${DEMO_BIN:-}" ]; then
  bin="$DEMO_BIN"
  phase "build: skipped, binaries from $bin (DEMO_BIN)"
else
  phase "build"
  if [ ! -x "$root/target/debug/trainer" ]; then
    echo "   first build: llama.cpp, libtorch's glue and ~400 crates compile once;"
    echo "   about 15-20 minutes on 2 cores (later builds take seconds). Cargo shows its progress below."
  fi
  cargo build -p coordinator -p edge-miner -p trainer -p validator
  [ "$eval_tasks" = 0 ] || cargo build -p tributary-tests --bin train-bench
  bin="$root/target/debug"
fi

phase "base checkpoint (SmolLM2-135M-Instruct Q4_1 -> BF16)"
"$bin/trainer" init-base
base="$root/.cache/models/SmolLM2-135M-Instruct.bf16.gguf"
arch="${DEMO_ARCH:-llama}"
case "$arch" in
  llama) ;;
  qwen2|qwen3|llama3)
    phase "base in the $arch layout (trainer transplant)"
    "$bin/trainer" transplant --family "$arch" --src "$base" --out "$dir/base-$arch.gguf"
    base="$dir/base-$arch.gguf"
    ;;
  *) echo "DEMO_ARCH=$arch: expected llama, qwen2, qwen3 or llama3" >&2; exit 2 ;;
esac
if [ -n "${DEMO_MODEL:-}" ]; then
  [ "$arch" = llama ] || { echo "DEMO_MODEL and DEMO_ARCH exclude each other" >&2; exit 2; }
  base="$(cd "$(dirname "$DEMO_MODEL")" && pwd)/$(basename "$DEMO_MODEL")"
  phase "base: $base (DEMO_MODEL)"
fi
miners="${DEMO_MINERS:-2}"
threads="${DEMO_THREADS:-1}"

pids=()
roles=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Waits until FILE has a line KEY=..., prints the value.
value() {
  local file="$1" key="$2"
  for _ in $(seq 600); do
    if grep -q "^$key=" "$file" 2>/dev/null; then
      grep -m1 "^$key=" "$file" | cut -d= -f2-
      return 0
    fi
    sleep 0.2
  done
  echo "demo: $key never appeared in $file" >&2
  return 1
}

phase "network start"
echo "== keys"
trainer_key="$("$bin/edge-miner" init --data "$dir/trainer-key" | cut -d= -f2)"
echo "trainer $trainer_key"

echo "== coordinator (window ${window_ms} ms, ${groups} groups x ${group_size} per miner, ${tokens} tokens, arith difficulty ${difficulty}, reward ${DEMO_REWARD:-lenient})"
cat > "$dir/coordinator.toml" <<EOF
listen = "127.0.0.1:0"
http = "127.0.0.1:0"
data_dir = "$dir/coordinator"
window_ms = $window_ms
grace_ms = 5000
env = "arith"
difficulty = $difficulty
temperature = 0.7
max_new_tokens = $tokens
groups_per_miner = $groups
group_size = $group_size
model = "$base"
trainer = "$trainer_key"
# A demo keeps few checkpoints (each is ~260 MiB here): the relay's newest
# $keep and the trainer's last $keep publications.
keep_checkpoints = $keep
EOF
echo "reward = \"${DEMO_REWARD:-lenient}\"" >> "$dir/coordinator.toml"
validator_args=()
has_validator=0
if [ "${DEMO_VALIDATOR:-1}" != 0 ] && "$bin/validator" --help 2>/dev/null | grep -q "^  run"; then
  has_validator=1
  validator_key="$("$bin/edge-miner" init --data "$dir/validator-key" | cut -d= -f2)"
  validator_args=(--validator "$validator_key")
fi
"$bin/coordinator" run --dev --config "$dir/coordinator.toml" "${validator_args[@]}" \
  > "$dir/coordinator.out" 2> "$dir/coordinator.log" &
pids+=($!)
roles+=(coordinator)
quic="$(value "$dir/coordinator.out" quic)"
http="$(value "$dir/coordinator.out" http)"
fp="$(value "$dir/coordinator.out" fingerprint)"
genesis="$(value "$dir/coordinator.out" checkpoint)"
echo "coordinator quic=$quic dashboard=$http genesis=$genesis"

echo "== miners"
for m in $(seq "$miners"); do
  echo "miner$m $("$bin/edge-miner" init --data "$dir/miner$m" | cut -d= -f2)"
  "$bin/edge-miner" run --coordinator "$quic" --fingerprint "$fp" --data "$dir/miner$m" \
    --model "$base" --threads "$threads" > "$dir/miner$m.out" 2> "$dir/miner$m.log" &
  pids+=($!)
  roles+=("miner$m")
done

if [ "$has_validator" = 1 ]; then
  echo "== validator"
  mkdir -p "$dir/validator"
  cp "$dir/validator-key/miner.key" "$dir/validator/validator.key"
  "$bin/validator" run --coordinator "$quic" --fingerprint "$fp" --data "$dir/validator" --threads "$threads" \
    > "$dir/validator.out" 2> "$dir/validator.log" &
  pids+=($!)
  roles+=(validator)
else
  echo "== validator: none (DEMO_VALIDATOR=0 or no 'validator run' in this build); the trainer trusts unjudged rollouts (--dev)"
fi

echo "== trainer"
"$bin/trainer" run --dev --coordinator "$quic" --fingerprint "$fp" --data "$dir/trainer" \
  --key "$dir/trainer-key/miner.key" --model "$base" --lr "$lr" --keep-publications "$keep" \
  --min-train-groups "$min_groups" > "$dir/trainer.out" 2> "$dir/trainer.log" &
pids+=($!)
roles+=(trainer)

status() { curl -fsS "$http/api/status"; }
start="$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["window"])')"
last=$((start + windows))
# Past the last window, the demo waits (at most DEMO_EXTRA_WINDOWS more) for a
# window generated on a checkpoint the trainer published, so the summary shows one.
extra="${DEMO_EXTRA_WINDOWS:-3}"
phase "windows $start..$((last - 1)) (+ at most $extra)"
echo "   progress every 10 s; logs in $dir"
while :; do
  for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "demo: a process exited; see the logs in $dir" >&2; exit 1; }
  done
  s="$(status)"
  done_now="$(python3 - "$s" "$start" "$last" "$extra" "$genesis" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); start, last, extra, genesis = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ms = ", ".join(f"{m['key'][:8]}: {m['accepted']} ok/{m['refused']} refused" for m in s["miners"]) or "no rollouts yet"
print(f"  window {s['window']} ({s['time_left_ms'] / 1000:.0f} s left) | {ms} | checkpoints {len(s['checkpoints'])}", file=sys.stderr)
closed = {w["window"]: w for w in s["windows"] if w["closed"] and w["window"] >= start}
if not all(w in closed for w in range(start, last)):
    print(0)
elif any(w["checkpoint"] != genesis and w["rollouts"] > 0 for w in closed.values()):
    print(1)
elif s["window"] is not None and s["window"] >= last + extra:
    print(1)
else:
    print(2)
PY
)"
  [ "$done_now" = 1 ] && break
  if [ "$done_now" = 2 ] && [ -z "${said_waiting:-}" ]; then
    echo "   waiting for a window generated on a trained checkpoint (at most $extra more windows)"
    said_waiting=1
  fi
  sleep 10
done

phase "summary"
status > "$dir/status.json"
for i in "${!pids[@]}"; do
  echo "peak RSS ${roles[$i]}: $(grep VmHWM "/proc/${pids[$i]}/status" | awk '{print $2, $3}')"
done | tee "$dir/peak-rss.txt"
python3 - "$dir/status.json" "$start" "$last" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); start, last = int(sys.argv[2]), int(sys.argv[3])
# Every published checkpoint by the window it was published for (not the genesis).
cps = {c["window"]: c for c in s["checkpoints"] if c["from_window"] > 0}
print(f"{'window':>6} {'stored':>6} {'verdicts ok/checked':>19} {'mean reward':>11} {'solved':>6} {'checkpoint':>12} {'published':>12} {'delta':>10}")
# Every closed window since the start, also those past `last` generated on a
# trained checkpoint while the demo waited.
for w in s["windows"]:
    if not (w["window"] >= start and w["closed"]):
        continue
    c = cps.get(w["window"])
    r = "-" if w["mean_reward"] is None else f"{w['mean_reward']:.3f}"
    solved = "-" if w["solved"] is None else f"{100 * w['solved']:.0f}%"
    v = w["verdicts"]
    delta = "-" if c is None else "full" if c["delta_bytes"] is None else f"{c['delta_bytes'] / 1024:.0f} KiB"
    print(f"{w['window']:>6} {w['rollouts']:>6} {v['valid']:>9}/{v['checked']:<9} {r:>11} {solved:>6} {w['checkpoint'][:12]:>12} {(c['id'][:12] if c else '-'):>12} {delta:>10}")
stored = sorted(w["rollouts"] for w in s["windows"] if w["window"] >= start and w["closed"] and w["rollouts"])
n = stored[len(stored) // 2] if stored else 0
# One sampling standard deviation of a mean of n rewards in 0..1 is at most
# 0.5 / sqrt(n); a group's rollouts share a problem, so the real one is larger.
noise = f"at least ~{0.5 / n ** 0.5:.2f}" if n else "a lot"
print(f"""
  stored     rollouts the coordinator stored for the window (every miner)
  verdicts   rollouts found valid / rollouts checked, summed over every verdict posted
             for the window (one per validator and miner); the trainer re-checks what it
             trains on as well (its refusals are in trainer.log); 0/0: not judged yet
  mean reward  mean reward of the stored rollouts (0..1: 1 for the right number, under
             the demo's default lenient rule the last number after a marker such as
             `Answer:`, else the last number; under strict only a final `Answer: N` line)
  solved     share of stored rollouts with a reward above 0
  checkpoint the checkpoint the window's rollouts were generated on (genesis = the base)
  published  the checkpoint the trainer published from this window's rollouts; delta its size
  With {n} rollouts a window, one window's mean reward moves by {noise} from sampling
  alone: the evaluation below, not this table, says whether training helped.""")
print("refused at the door:", s["door_refusals"] or "none")
for m in s["miners"]:
    acc = "-" if m["acceptance"] is None else f"{100 * m['acceptance']:.1f}%"
    print(f"miner {m['key'][:16]}: accepted {m['accepted']}, acceptance {acc}, weight {m['weight']:.3f}")
PY
latest="$(python3 -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["checkpoints"] if c["from_window"] > 0]; print(c[-1]["id"] if c else "")' "$dir/status.json")"
if [ "$eval_tasks" = 0 ] || [ ! -x "$bin/train-bench" ]; then
  # train-bench runs the demo with DEMO_EVAL_TASKS=0 and evaluates its arms itself afterwards.
  echo "no evaluation here (DEMO_EVAL_TASKS=0 or no train-bench in $bin): the table above cannot"
  echo "show learning alone (train-bench evaluates its arms after the network stops; docs/training.md has measured runs)."
elif [ -z "$latest" ] || [ ! -f "$dir/coordinator/relay/full/$latest.gguf" ]; then
  echo "smoke test only: no trained checkpoint was published in these windows."
else
  phase "evaluation: base vs ${latest:0:12} (greedy)"
  # Two columns: `test`, the level's held-out problems (no window assigns them;
  # a small level has few: level 102 has 55 problems, 5 held out), and `band`,
  # up to DEMO_EVAL_TASKS problems of the same level from both sides of the
  # split (the network trains on some of them).
  "$bin/train-bench" eval --model "$base" --label base --model "$dir/coordinator/relay/full/$latest.gguf" \
    --label trained --difficulty "$difficulty" --band "$difficulty" --ood none --tasks "$eval_tasks" \
    --base-prompts default --max-new-tokens "$tokens" --threads 2 --out-dir "$dir/eval" 2>"$dir/eval.log" \
    | tee "$dir/eval.txt" || echo "evaluation failed; see $dir/eval.log"
  echo "   (accuracy in %, strict and lenient scoring; the demo trains on the ${DEMO_REWARD:-lenient} reward."
  echo "   test: the level's held-out problems; band: problems of the same level, some of which the"
  echo "   network trained on. 'trained - base' with its 95 % paired-bootstrap interval: an interval"
  echo "   that contains 0 means these few windows made no measurable difference)"
fi
phase_report
echo "working folder: $dir ($(du -sh "$dir" 2>/dev/null | cut -f1)); remove it with: rm -rf $dir"
if [ "${DEMO_KEEP:-1}" = 1 ]; then
  echo "dashboard: $http/ (status JSON: $http/api/status) -- the network keeps running; Ctrl-C stops it"
  wait
else
  echo "DEMO_KEEP=0: stopping (the dashboard was $http/)"
fi
exit
}
