#!/usr/bin/env bash
# Runs every fuzz target for a fixed number of executions (default 1e6 each;
# FUZZ_RUNS=N to change), with cargo-fuzz on the stable toolchain
# (RUSTC_BOOTSTRAP=1 lets it use the nightly-only sanitizer flags). Each
# target's corpus lives in fuzz/corpus/<target> and grows across runs; a
# crash stops the script with the target's artifact path.
#
#   cargo install cargo-fuzz     # once (a few minutes)
#   scripts/fuzz.sh              # every target, 1e6 runs each
#   FUZZ_RUNS=10000 scripts/fuzz.sh rollout_decode
#
# CI only type-checks the targets (scripts/test.sh); this is run by hand.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: cargo install cargo-fuzz" >&2; exit 1; }
runs=${FUZZ_RUNS:-1000000}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== $t: $runs runs"
  start=$(date +%s)
  set +e
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" "corpus/$t" -- -runs="$runs" -max_len=1048576 -rss_limit_mb=4096 \
    >"corpus/$t.log" 2>&1
  rc=$?
  set -e
  grep -E "DONE|Done [0-9]+ runs|ERROR|SUMMARY|artifact" "corpus/$t.log" | tail -5
  if [ $rc -ne 0 ]; then
    echo "== $t: FAILED (exit $rc), log: fuzz/corpus/$t.log" >&2
    exit $rc
  fi
  echo "== $t: done in $(( $(date +%s) - start )) s"
done
