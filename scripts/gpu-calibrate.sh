#!/usr/bin/env bash
# The first run on a GPU machine, in one command: builds `calibrate` and
# `gen-bench` with the llama.cpp GPU backend this machine has (CUDA when
# nvidia-smi sees a GPU, else Vulkan), calibrates each numerics setting of
# that backend against the libtorch reference (honest rollouts and the
# standard cheaters, as docs/calibration.md), runs the speed arms, and writes
# one report. docs/gpu-backends.md says what the settings are and why.
#
#   scripts/gpu-calibrate.sh [--backend cuda|vulkan] [--out FILE] [--work DIR]
#
#   GPU_CALIBRATE_QUICK=1  a smoke run of every step (1 arith task x 2 rollouts
#                          x 8 tokens, the `edit` cheater only, one 4-token speed
#                          rep): for Mesa lavapipe, a CPU Vulkan driver that
#                          compiles each of ggml's pipelines with LLVM on first
#                          use (minutes each; Mesa caches them on disk)
#   TASKS, GROUP, TOKENS   override the calibration's size (full: 56 x 8 x 128)
#   ARMS                   gen-bench arms (full: its defaults; quick: raw-bf16,miner-f32)
#   THREADS                CPU threads for llama.cpp and libtorch (default: all)
#   GSM8K                  GSM8K test.jsonl (default: shared/data/gsm8k beside
#                          the repository; without it the arith environment)
#
# Columns: the CPU (the calibrated reference column), then every GPU setting
# with all layers offloaded. Rollout caches live under --work, one file per
# setting, so a re-run only generates what is missing.
#
# Needs scripts/setup.sh first; for Vulkan `TRIBUTARY_VULKAN=1 scripts/setup.sh`
# (glslc, the Vulkan headers), for CUDA the CUDA toolkit (nvcc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

backend="" out="" work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="${2:?}"; shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    --work) work="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-calibrate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { printf 'gpu-calibrate: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ggml's build script hands every GGML_* variable to CMake (and rebuilds
# llama.cpp when one changes): none may be set while cargo runs. The kernel
# switches below are set per command instead.
for v in $(env | sed -n 's/^\(GGML_[A-Za-z0-9_]*\)=.*/\1/p'); do
  die "$v is set in the environment: unset it (it would rebuild llama.cpp); this script sets the kernel switches itself"
done

# 1. The backend, and the device it will use.
if [ -z "$backend" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    backend=cuda
  else
    backend=vulkan
  fi
fi
visible=()   # extra environment for every GPU command
case "$backend" in
  cuda)
    command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
      die "CUDA backend: nvcc not found (install the CUDA toolkit, or put /usr/local/cuda/bin on PATH)"
    device="$(nvidia-smi -L | head -1)"
    ;;
  vulkan)
    command -v glslc >/dev/null 2>&1 || die "Vulkan backend: glslc not found (run TRIBUTARY_VULKAN=1 scripts/setup.sh)"
    command -v vulkaninfo >/dev/null 2>&1 || die "Vulkan backend: vulkaninfo not found (run TRIBUTARY_VULKAN=1 scripts/setup.sh)"
    # ggml-vulkan needs Vulkan-Headers >= 1.3.272; older system headers get
    # the shim in vendor/vulkan-compat (vendor/README.md).
    hdr="$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' /usr/include/vulkan/vulkan_core.h 2>/dev/null || true)"
    [ -n "$hdr" ] || die "Vulkan backend: no /usr/include/vulkan/vulkan_core.h (run TRIBUTARY_VULKAN=1 scripts/setup.sh)"
    if [ -z "${VULKAN_SDK:-}" ] && [ "$hdr" -lt 272 ]; then
      say "Vulkan headers 1.3.$hdr predate VK_EXT_layer_settings: building with vendor/vulkan-compat"
      export VULKAN_SDK="$root/vendor/vulkan-compat"
    fi
    summary="$(vulkaninfo --summary 2>/dev/null || true)"
    # One "index type name" line per physical device.
    devs="$(printf '%s\n' "$summary" | awk '
      /^GPU[0-9]+:/ { i = substr($1, 4, length($1) - 4) }
      /deviceType/ { t = $3 }
      /deviceName/ { sub(/^[^=]*= /, ""); print i, t, $0 }')"
    [ -n "$devs" ] || die "Vulkan backend: vulkaninfo lists no device (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
    gpu="$(printf '%s\n' "$devs" | awk '$2 ~ /DISCRETE_GPU|INTEGRATED_GPU/ { print; exit }')"
    if [ -n "$gpu" ]; then
      device="${gpu#* * }"
    else
      # ggml skips CPU Vulkan devices (lavapipe) unless named explicitly.
      cpu="$(printf '%s\n' "$devs" | head -1)"
      device="${cpu#* * } (a CPU Vulkan driver: correctness only, its speed says nothing about a GPU)"
      visible=("GGML_VK_VISIBLE_DEVICES=${cpu%% *}")
    fi
    ;;
  *) die "--backend cuda|vulkan" ;;
esac
say "backend $backend on $device"

quick="${GPU_CALIBRATE_QUICK:-0}"
if [ "$quick" = 1 ]; then
  tasks="${TASKS:-1}" group="${GROUP:-2}" tokens="${TOKENS:-8}"
  cheaters=edit challenge=() bench=(--groups 2 --max-new-tokens 4 --reps 1 --arms "${ARMS:-raw-bf16,miner-f32}")
else
  tasks="${TASKS:-56}" group="${GROUP:-8}" tokens="${TOKENS:-128}"
  cheaters="tiny,q4_0,perturb-0.03,perturb-0.01,perturb-0.003,perturb-0.001,edit,other-model,q8_0,q4_1"
  challenge=(--challenge-all) bench=(--groups 1,8,16 --max-new-tokens 128 --reps 5)
  [ -n "${ARMS:-}" ] && bench+=(--arms "$ARMS")
fi
threads="${THREADS:-$(nproc)}"
work="${work:-$root/target/gpu-calibrate/$backend}"
mkdir -p "$work"
out="${out:-$work/report-$(date -u +%Y%m%dT%H%M%SZ).md}"

# 2. Build (a feature set of its own: llama.cpp is built once more, with the
#    GPU backend, beside the default build, which it leaves alone).
features="validator/wgpu,edge-miner/$backend"
say "building calibrate and gen-bench with $features (first time: llama.cpp with $backend, many minutes)"
t0=$(date +%s)
cargo build -p validator -p edge-miner --features "$features" --bin calibrate --bin gen-bench
build_s=$(( $(date +%s) - t0 ))
bin="${CARGO_TARGET_DIR:-$root/target}/debug"

model="$root/.cache/models/SmolLM2-135M-Instruct.bf16.gguf"
if [ ! -f "$model" ]; then
  say "no BF16 base yet: trainer init-base"
  cargo build -p trainer --bin trainer
  "$bin/trainer" init-base
fi
gsm8k="${GSM8K:-}"
if [ -z "$gsm8k" ]; then
  for d in "${TRIBUTARY_GSM8K_DIR:-/nonexistent}" "$root/../shared/data/gsm8k" "$root/shared/data/gsm8k"; do
    [ -f "$d/test.jsonl" ] && { gsm8k="$d/test.jsonl"; break; }
  done
fi
if [ "$quick" = 1 ]; then
  gsm8k=""  # arith prompts are a few dozen tokens: prefill is most of a quick run
fi
if [ -n "$gsm8k" ]; then
  env_args=(--env gsm8k --data "$gsm8k") env_desc="GSM8K"
else
  env_args=(--env arith) env_desc="arith environment"
fi

# 3. The settings: a name, the kernel switches, extra calibrate flags.
#    "exact" is every switch ggml offers toward f32 matmul inputs (on Vulkan
#    the ones the miner sets itself; exact with vendored change 3,
#    docs/gpu-backends.md §1); it also gets the cheaters. (Each name is a column; keep them in sync with the doc.)
case "$backend" in
  vulkan)
    exact_env="GGML_VK_DISABLE_F16=1 GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1"
    settings=(
      "defaults||"
      "exact|$exact_env|"
      "exact-bf16-published|$exact_env|--gpu-bf16-as-published"
    )
    ;;
  cuda)
    exact_env="NVIDIA_TF32_OVERRIDE=0"
    settings=(
      "defaults||"
      "exact|$exact_env|"
      "exact-bf16-published|$exact_env|--gpu-bf16-as-published"
    )
    ;;
esac

common=(--model "$model" "${env_args[@]}" --tasks "$tasks" --group "$group" --max-new-tokens "$tokens"
        --seed 7 --threads "$threads" --work "$work" --cheater-tasks 1 "${challenge[@]}")

# Prints a table row from a calibrate output: the first honest section.
summarise() {
  awk -v name="$1" '
    /^### / { sec++ }
    sec == 1 && /^\| sketch distance ÷ tolerance/ { split($0, c, "|"); smax = c[3] }
    sec == 1 && /^\| abs Δ logprob/ { split($0, c, "|"); lmax = c[3]; l99 = c[4] }
    sec == 1 && /^accepted / && !acc {
      acc = $2; sub(/;$/, "", acc)
      match($0, /interval: [0-9]+ of [0-9]+/); outside = substr($0, RSTART, RLENGTH); sub(/^[^:]*: /, "", outside)
    }
    sec == 1 && /^false-positive budget/ && !fp {
      fp = 1; match($0, /beyond [^:]*: [0-9]+/); beyond = substr($0, RSTART, RLENGTH); sub(/^[^:]*: /, "", beyond)
    }
    /generated by this run/ && !rate {
      match($0, /[0-9.]+ tok\/s/); rate = substr($0, RSTART, RLENGTH)
    }
    END { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, acc, lmax, l99, outside, beyond, smax, rate }
  ' "$2"
}

runlog="$work/run.log"
: > "$runlog"
rows=()
calibrate() {  # name, env, extra flags, gpu layers, cheaters
  local name="$1" kenv="$2" extra="$3" layers="$4" cheat="$5" log="$work/$1.txt"
  say "calibrating: $name (${kenv:-llama.cpp defaults}) -> $log"
  local dev=("${visible[@]}")
  if [ "$layers" = 0 ]; then
    # With no layer offloaded, llama.cpp still runs ops of >= 32 rows (the
    # miner's prefill micro-batches) on a GPU it sees ("op offload"), with
    # that GPU's default kernels: measured on lavapipe, 0/2 honest rollouts
    # accepted (docs/gpu-backends.md). The CPU column keeps them on the CPU.
    dev=("GGML_OP_OFFLOAD_MIN_BATCH=1000000000")
  fi
  # shellcheck disable=SC2086
  env "${dev[@]}" $kenv "$bin/calibrate" "${common[@]}" --gpu-layers "$layers" --cheaters "$cheat" $extra \
    > "$log" 2>> "$runlog" || { say "calibrate $name failed (see $runlog)"; rows+=("| $name | failed | | | | | | |"); return 0; }
  rows+=("$(summarise "$name" "$log")")
}

calibrate cpu "" "" 0 none
for s in "${settings[@]}"; do
  IFS='|' read -r name kenv extra <<< "$s"
  c=none
  [ "$name" = exact ] && c="$cheaters"
  calibrate "$backend-$name" "$kenv" "$extra" 99 "$c"
done

# 4. Speed: raw llama.cpp (all layers offloaded: llama.cpp's default) and
#    the miner, under llama.cpp's defaults and under the exact setting.
gpu_flag=()
if "$bin/gen-bench" --help 2>/dev/null | grep -q -- '--gpu-layers'; then gpu_flag=(--gpu-layers 99); fi
for s in "defaults|" "exact|$exact_env"; do
  IFS='|' read -r name kenv <<< "$s"
  say "speed arms: $name"
  # shellcheck disable=SC2086
  env "${visible[@]}" $kenv "$bin/gen-bench" --model "$model" --threads "$threads" "${bench[@]}" "${gpu_flag[@]}" \
    > "$work/bench-$name.txt" 2>> "$runlog" || say "gen-bench $name failed (see $runlog)"
done

# 5. The report.
{
  echo "# GPU calibration: $backend"
  echo
  echo "- date: $(date -u +%FT%TZ); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "- device: $device"
  [ "$backend" = cuda ] && echo "- driver: $(nvidia-smi --query-gpu=driver_version,compute_cap --format=csv,noheader | head -1) (driver, compute capability)"
  echo "- build: cargo build -p validator -p edge-miner --features $features ($build_s s this run)"
  echo "- size: $tasks tasks x $group rollouts x <= $tokens tokens, seed 7, $threads threads, $env_desc$([ "$quick" = 1 ] && echo ', QUICK')"
  [ "${#visible[@]}" -gt 0 ] && echo "- every GPU command ran with ${visible[*]}"
  echo
  echo "## Honest rollouts, checked by the libtorch reference"
  echo
  echo "| column | accepted | abs Δ logprob max | p99 | draws outside | outside beyond ε | sketch d/τ max | generation |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Settings: defaults = llama.cpp as built; exact = \`$exact_env\` (every switch ggml offers toward"
  echo "f32 matmul inputs; what the miner runs with; docs/gpu-backends.md §1); exact-bf16-published = exact"
  echo "with the BF16 matrices kept BF16 on the GPU (the miner widens them to F32 when it offloads)."
  echo "The CPU column is the calibrated one (docs/calibration.md); a GPU column is calibrated when it"
  echo "accepts every honest rollout with no draw outside beyond ε and sketch d/τ well under 1."
  for f in "$work"/cpu.txt "$work/$backend"-*.txt; do
    [ -f "$f" ] || continue
    echo
    echo "## $(basename "$f" .txt)"
    echo
    echo '```'
    cat "$f"
    echo '```'
  done
  for f in "$work"/bench-*.txt; do
    [ -f "$f" ] || continue
    echo
    echo "## Speed: $(basename "$f" .txt)${gpu_flag[*]:+ (miner arms with ${gpu_flag[*]})}"
    [ "${#gpu_flag[@]}" -eq 0 ] && echo "(gen-bench has no --gpu-layers: its miner arms ran on the CPU, its raw arms on the GPU)"
    echo
    echo '```'
    cat "$f"
    echo '```'
  done
} > "$out"
say "report: $out"
