#!/usr/bin/env bash
# Creates the Python environment for the comparison benches (docs/benchmarks.md):
# the full CPU-capable torch from PyPI plus transformers. Separate from the
# project venv ($TRIBUTARY_CACHE/venv), whose torch is the slim libtorch-only
# install that `tch` links against and that Python cannot import.
# Idempotent; prints the interpreter path on stdout.
#
#   TRIBUTARY_CACHE   cache folder (default ~/.cache/tributary)
set -euo pipefail

cache="${TRIBUTARY_CACHE:-$HOME/.cache/tributary}"
venv="$cache/venv-bench"
TORCH_VERSION="2.13.0"

say() { printf 'bench-venv: %s\n' "$*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors, numpy' 2>/dev/null; then
  say "installing torch==$TORCH_VERSION transformers safetensors numpy (large download)"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "torch==$TORCH_VERSION" transformers safetensors numpy
fi
"$venv/bin/python" -c 'import torch, transformers; print("bench-venv: torch", torch.__version__, "transformers", transformers.__version__)' >&2
echo "$venv/bin/python"
