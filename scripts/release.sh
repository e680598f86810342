#!/usr/bin/env bash
# Release binaries for the current platform, with a checksum file.
#
#   scripts/release.sh [--features-miner cuda|metal|vulkan] [--out DIR]
#                      [--profile release|dev] [--no-build] [--dry-run]
#
# Builds coordinator, edge-miner, validator and trainer (`cargo build
# --profile release --locked`), then writes DIR/tributary-VERSION-TARGET/
# with the binaries, the systemd units, the documented configs, the runbook
# and the miner installer, plus a SHA256SUMS of every file in it; then the
# archive DIR/tributary-VERSION-TARGET.tar.gz and DIR/SHA256SUMS (the archive's). validator and
# trainer link libtorch: the archive's installers/install-roles.sh installs
# them with it (beside the binaries, in PREFIX/lib/tributary; --libtorch DIR on
# another machine than this one); the miner and the coordinator need nothing.
#
# --profile dev --no-build packages what an earlier `cargo build` left in
# target/debug (CI: llama.cpp is built once, in the dev profile).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

out="$root/dist" profile=release build=1 dry=0 miner_features=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?}"; shift 2 ;;
    --profile) profile="${2:?}"; shift 2 ;;
    --features-miner) miner_features="${2:?}"; shift 2 ;;
    --no-build) build=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in release) dir=release ;; dev) dir=debug ;; *) echo "release.sh: --profile release|dev" >&2; exit 2 ;; esac

run() { if [ "$dry" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; echo; else "$@"; fi; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
target="$(rustc -vV | sed -n 's/^host: //p')"
name="tributary-$version-$target"
bins=(coordinator edge-miner validator trainer)
tdir="${CARGO_TARGET_DIR:-$root/target}/$dir"

# Every binary's --version names this commit (net/build.rs reads the variable;
# setting it also rebuilds the stamp, which an incremental build may have kept).
if [ -z "${TRIBUTARY_GIT_COMMIT:-}" ] && git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  TRIBUTARY_GIT_COMMIT="$(git -C "$root" rev-parse --short=12 HEAD)"
  export TRIBUTARY_GIT_COMMIT
fi

if [ "$build" = 1 ]; then
  run cargo build --profile "$profile" --locked -p coordinator -p validator -p trainer --bins
  if [ -n "$miner_features" ]; then
    run cargo build --profile "$profile" --locked -p edge-miner --bin edge-miner --features "$miner_features"
  else
    run cargo build --profile "$profile" --locked -p edge-miner --bin edge-miner
  fi
fi

stage="$out/$name"
if [ "$dry" = 1 ]; then
  echo "would package ${bins[*]} from $tdir into $stage.tar.gz with $out/SHA256SUMS"
  exit 0
fi
for b in "${bins[@]}"; do
  [ -x "$tdir/$b" ] || { echo "release.sh: $tdir/$b missing (build first, or drop --no-build)" >&2; exit 1; }
done
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/systemd" "$stage/config" "$stage/installers"
for b in "${bins[@]}"; do install -m 755 "$tdir/$b" "$stage/bin/$b"; done
install -m 644 installers/systemd/*.service "$stage/systemd/"
install -m 644 docs/config/* "$stage/config/"
install -m 755 installers/install-miner.sh installers/install-roles.sh "$stage/installers/"
install -m 644 docs/runbook.md README.md "$stage/"
[ -z "$miner_features" ] || echo "$miner_features" > "$stage/edge-miner.features"

sha() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }
(cd "$stage" && find . -type f ! -name SHA256SUMS | sort | sed 's|^\./||' | while read -r f; do sha "$f"; done > SHA256SUMS)
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
(cd "$out" && sha "$name.tar.gz" > SHA256SUMS)
echo "release=$out/$name.tar.gz"
echo "checksums=$out/SHA256SUMS"
