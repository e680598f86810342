#!/usr/bin/env bash
# Tributary's main job, on one machine. At this stage: install what is
# missing, build the BF16 base checkpoint from the real SmolLM2 model, print
# its content id, and let the miner's llama.cpp backend answer a task from it
# with a full proof record (log-probs and a sketch per token).
#
#   DEMO_ENV=arith|sat|gsm8k   environment (default arith)
#   DEMO_TOKENS=N              most new tokens (default 96)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
env_name="${DEMO_ENV:-arith}"
tokens="${DEMO_TOKENS:-96}"

echo "== setup"
bash scripts/setup.sh
echo "== build"
cargo build -q -p edge-miner -p trainer
bin="$root/target/debug"

echo "== base checkpoint (SmolLM2-135M-Instruct Q4_1 -> BF16)"
"$bin/trainer" init-base
base="$root/.cache/models/SmolLM2-135M-Instruct.bf16.gguf"

echo "== generate (llama.cpp, greedy, env=$env_name)"
out="$(mktemp -d)/rollouts.jsonl"
data_args=()
[ "$env_name" = gsm8k ] && data_args=(--data "$root/../shared/data/gsm8k/test.jsonl")
"$bin/edge-miner" generate --model "$base" --env "$env_name" "${data_args[@]}" \
  --tasks 1 --group 1 --max-new-tokens "$tokens" --seed 1 --temperature 0 --out "$out"
python3 - "$out" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    n = len(r["tokens"]) - r["prompt_len"]
    print(f"completion ({n} tokens, {len(r['sketches'])} sketches, reward {r['reward']}):")
    print("  " + r["completion"].strip().replace("\n", "\n  "))
PY
