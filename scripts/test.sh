#!/usr/bin/env bash
# The test command: installs whatever is missing, checks formatting, builds
# everything once (one profile: the dev profile with optimised dependencies),
# runs clippy with warnings as errors, prepares the model files the tests
# read, then runs every test in the workspace.
# Non-zero exit on any failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

t0=$(date +%s)
stamp() { printf 'test.sh: [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }

stamp "setup"
bash scripts/setup.sh

# The wgpu miner backend is tested on Mesa's lavapipe (software Vulkan), so
# the one build enables it.
features=(--features edge-miner/wgpu)

# The archive on a real S3 store (Garage; the test store_garage, feature
# tributary-tests/garage = the coordinator's s3): where a garage binary is
# installed (TRIBUTARY_GARAGE=1 scripts/setup.sh, which .ci/run asks for; or
# GARAGE_BIN, or garage on PATH) the one build below includes the feature, so
# the test runs in the same pass and nothing is compiled twice.
garage_bin="${GARAGE_BIN:-$(command -v garage || echo "${TRIBUTARY_CACHE:-$HOME/.cache/tributary}/garage/bin/garage")}"
if [ -x "$garage_bin" ]; then
  export GARAGE_BIN="$garage_bin"
  features+=(--features tributary-tests/garage)
  stamp "garage: $GARAGE_BIN (store_garage runs with the other tests)"
else
  stamp "garage: none installed, store_garage NOT RUN (TRIBUTARY_GARAGE=1 scripts/setup.sh installs it)"
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

# GSM8K (MIT) is not downloadable here: the project's checkouts keep it in
# `shared/data/gsm8k` beside the repository. A clone made elsewhere (a
# throwaway CI folder) finds it beside the repository it was cloned from.
gsm8k_beside() { [ -f "$1/shared/data/gsm8k/test.jsonl" ] && printf '%s/shared/data/gsm8k' "$1"; }
if [ -z "${TRIBUTARY_GSM8K_DIR:-}" ]; then
  d="$root"
  while [ "$d" != / ] && ! gsm8k_beside "$d" >/dev/null; do d="$(dirname "$d")"; done
  if ! gsm8k_beside "$d" >/dev/null; then
    origin="$(git remote get-url origin 2>/dev/null || true)"
    if [ -n "$origin" ] && [ -d "$origin" ]; then
      d="$(cd "$origin" && pwd)"
      while [ "$d" != / ] && ! gsm8k_beside "$d" >/dev/null; do d="$(dirname "$d")"; done
      if dir="$(gsm8k_beside "$d")"; then export TRIBUTARY_GSM8K_DIR="$dir"; fi
    fi
  fi
fi

stamp "format (cargo fmt --check; rustfmt.toml)"
cargo fmt --all --check
if [ -d fuzz ]; then (cd fuzz && cargo fmt --check); fi

stamp "build (workspace, all targets)"
cargo build --workspace --all-targets --locked "${features[@]}"

stamp "model files: BF16 base checkpoint and the tiny test model"
# (the binaries of the build above: `cargo run -p` would resolve features anew)
target="${CARGO_TARGET_DIR:-$root/target}/debug"
"$target/trainer" init-base
"$target/trainer" init-tiny

stamp "lints (clippy, every target, warnings are errors)"
cargo clippy --workspace --all-targets --locked "${features[@]}" -- -D warnings

if [ -d fuzz ]; then
  stamp "fuzz targets (type-check on stable)"
  (cd fuzz && cargo check -q --bins)
fi

stamp "tests"
# One test at a time: the network tests run real windows of a few seconds,
# and on 2 cores parallel tests would starve each other's clocks.
cargo test --workspace --locked --no-fail-fast "${features[@]}" -- --test-threads=1

stamp "done"
