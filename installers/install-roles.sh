#!/usr/bin/env bash
# Tributary server roles installer: the coordinator, the validator and the
# trainer, with the libtorch the last two link, their systemd units and their
# service users.
#
#   installers/install-roles.sh [--from-build DIR] [--libtorch DIR] [--prefix DIR] [options]
#
# The validator and the trainer link libtorch (libtorch_cpu.so, libc10.so) and,
# through it, the CUDA runtime libraries of the torch wheel (libcudart,
# libcupti). A service running as its own user, with ProtectHome=true and no
# LD_LIBRARY_PATH, cannot reach the builder's virtual environment, so this
# installer copies every library they load that is not a system library into
# PREFIX/lib/tributary/, keeping the wheel's layout (torch/lib/...,
# nvidia/cu13/lib/...): the binaries look there first (their runpath
# $ORIGIN/../lib/tributary/torch/lib, set when they are linked, see
# build-support/torch_rpath.rs) and libtorch finds the CUDA libraries through
# its own runpath ($ORIGIN/../../nvidia/...). The libraries are found with
# `ldd` on the binaries being installed; at the end `ldd` on the installed
# binaries, with an empty environment, must find every one of them there.
#
# Options:
#   --from-build DIR   the binaries to install (default: bin/ of the release
#                      archive holding this script)
#   --libtorch DIR     the torch wheel's folder (site-packages/torch) whose lib/
#                      the libraries come from (default: where the binaries
#                      find them now, e.g. the runpath of a build)
#   --roles LIST       comma-separated subset of coordinator,validator,trainer
#                      (default: all three)
#   --prefix DIR       install under DIR (bin/, lib/tributary/,
#                      lib/systemd/system/, etc/tributary in the units) and never
#                      create users or call systemctl; default /usr/local, units
#                      in /etc/systemd/system, users tributary-ROLE created
#   --link             hard-link the libraries instead of copying them (same
#                      file system only; tests: libtorch is ~450 MB)
#   --dry-run          print every action instead of doing it
set -euo pipefail

die() { echo "install-roles: error: $*" >&2; exit 1; }
say() { echo "install-roles: $*"; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
from_build="" libtorch="" roles="coordinator,validator,trainer" prefix="" link=0 dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --from-build) from_build="${2:?}"; shift 2 ;;
    --libtorch) libtorch="${2:?}"; shift 2 ;;
    --roles) roles="${2:?}"; shift 2 ;;
    --prefix) prefix="${2:?}"; shift 2 ;;
    --link) link=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ "$(uname -s)" = Linux ] || die "the server roles install on Linux only"
command -v ldd >/dev/null 2>&1 || die "ldd (glibc) is needed to find the libraries libtorch loads"

IFS=',' read -r -a role_list <<< "$roles"
for r in "${role_list[@]}"; do
  case "$r" in coordinator|validator|trainer) ;; *) die "--roles: unknown role '$r' (coordinator, validator, trainer)" ;; esac
done

if [ -z "$from_build" ]; then
  [ -d "$here/../bin" ] || die "give --from-build DIR (the folder holding the built binaries, e.g. target/release)"
  from_build="$here/../bin"
fi
from_build="$(cd "$from_build" 2>/dev/null && pwd)" || die "--from-build: no folder $from_build"
for r in "${role_list[@]}"; do
  [ -x "$from_build/$r" ] || die "no $r binary in $from_build (build it first: cargo build --release -p $r)"
done
if [ -n "$libtorch" ]; then
  [ -f "$libtorch/lib/libtorch_cpu.so" ] || die "--libtorch $libtorch: no lib/libtorch_cpu.so there (give the torch wheel's folder, site-packages/torch)"
  libtorch="$(cd "$libtorch" && pwd)"
fi
# The units: beside this script in a checkout, in ../systemd in a release archive.
unit_src="$here/systemd"
[ -d "$unit_src" ] || unit_src="$here/../systemd"
[ -f "$unit_src/tributary-coordinator.service" ] || die "no systemd units beside $here"

if [ -n "$prefix" ]; then
  managed=0
  [ "$dry" = 1 ] || mkdir -p "$prefix" || die "cannot create $prefix"
  prefix="$(cd "$prefix" 2>/dev/null && pwd || echo "$prefix")"
  unitdir="$prefix/lib/systemd/system"
  etc="$prefix/etc/tributary"
else
  managed=1
  prefix=/usr/local
  unitdir=/etc/systemd/system
  etc=/etc/tributary
  [ "$dry" = 1 ] || [ "$(id -u)" = 0 ] || die "installing into /usr/local needs root (or give --prefix DIR)"
fi
bindir="$prefix/bin"
libroot="$prefix/lib/tributary"

run() { if [ "$dry" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; echo; else "$@"; fi; }

# "NAME PATH" for every library `ldd` resolves for $1 ("NAME not-found" if it does not).
ldd_libs() {
  local bin="$1" env=()
  [ -z "$libtorch" ] || env=(LD_LIBRARY_PATH="$libtorch/lib")
  env -i "${env[@]}" ldd "$bin" | awk '
    $2 == "=>" && $3 == "not" { print $1, "not-found"; next }
    $2 == "=>" && $3 ~ /^\// { print $1, $3 }'
}
is_system() { case "$1" in /lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*) return 0 ;; *) return 1 ;; esac; }

# ---- the libraries the torch roles load -------------------------------------
declare -A bundle=()  # destination (relative to lib/tributary) -> source file
torch_roles=()
for r in "${role_list[@]}"; do [ "$r" = coordinator ] || torch_roles+=("$r"); done
site=""
for r in "${torch_roles[@]}"; do
  libs="$(ldd_libs "$from_build/$r")"
  missing="$(awk '$2 == "not-found" {print $1}' <<< "$libs" | tr '\n' ' ')"
  [ -z "$missing" ] || die "$from_build/$r cannot find ${missing}(give --libtorch DIR: the torch wheel's folder, site-packages/torch)"
  torch_cpu="$(awk '$1 == "libtorch_cpu.so" {print $2}' <<< "$libs")"
  [ -n "$torch_cpu" ] || die "$from_build/$r does not link libtorch_cpu.so"
  # The wheel's root (site-packages): torch/lib/libtorch_cpu.so is two folders below it.
  s="$(cd "$(dirname "$(readlink -f "$torch_cpu")")/../.." && pwd)"
  [ -z "$site" ] || [ "$site" = "$s" ] || die "validator and trainer link different libtorch copies ($site, $s)"
  site="$s"
  while read -r name path; do
    is_system "$path" && continue
    real="$(readlink -f "$path")"
    case "$real" in "$site"/*) ;; *) die "$r loads $name from $real, outside the torch wheel $site: cannot bundle it" ;; esac
    rel="${real#"$site"/}"
    bundle["$(dirname "$rel")/$name"]="$real"
  done <<< "$libs"
done
# A CUDA build (libtorch_cuda.so in NEEDED): libtorch and cuDNN also dlopen
# companions from their folders at run time (libtorch_cuda_linalg, the cuDNN
# engines, nvrtc builtins), so those folders go whole.
if [ "${#torch_roles[@]}" -gt 0 ] && [ -n "${bundle[torch/lib/libtorch_cuda.so]:-}" ]; then
  [ ! -f "$site/torch/lib/libtorch_cuda_linalg.so" ] || bundle["torch/lib/libtorch_cuda_linalg.so"]="$site/torch/lib/libtorch_cuda_linalg.so"
  for dest in "${!bundle[@]}"; do
    case "$dest" in
      nvidia/*)
        d="$(dirname "$dest")"
        for f in "$site/$d"/*.so*; do [ -f "$f" ] && bundle["$d/$(basename "$f")"]="$f"; done ;;
    esac
  done
fi

# ---- install ----------------------------------------------------------------
put() {  # put SRC DEST MODE: copy (or hard-link with --link) SRC to DEST atomically
  local src="$1" dest="$2" mode="$3" tmp
  if [ "$dry" = 1 ]; then echo "would install $src -> $dest"; return; fi
  mkdir -p "$(dirname "$dest")"
  tmp="$dest.new.$$"
  rm -f "$tmp"
  if [ "$link" = 1 ] && ln "$src" "$tmp" 2>/dev/null; then :; else cp "$src" "$tmp"; chmod "$mode" "$tmp"; fi
  mv -f "$tmp" "$dest"
}
if [ "${#bundle[@]}" -gt 0 ]; then
  say "libtorch from $site: ${#bundle[@]} libraries into $libroot"
  for dest in "${!bundle[@]}"; do put "${bundle[$dest]}" "$libroot/$dest" 755; done
  [ "$dry" = 1 ] || chmod -R a+rX "$libroot"
fi
for r in "${role_list[@]}"; do
  put "$from_build/$r" "$bindir/$r" 755
done
say "binaries: ${role_list[*]} in $bindir"

# Every library the installed roles load is a system one or one in lib/tributary:
# nothing from the builder's home, nothing from the environment.
if [ "$dry" = 0 ]; then
  for r in "${torch_roles[@]}"; do
    libtorch="" # the installed binary alone
    while read -r name path; do
      if [ "$path" = not-found ]; then
        die "the installed $r cannot find $name in $libroot: it was linked without the runpath \$ORIGIN/../lib/tributary/torch/lib (rebuild it from this checkout)"
      fi
      is_system "$path" && continue
      case "$(readlink -f "$path")" in
        "$(readlink -f "$libroot")"/*) ;;
        *) die "the installed $r loads $name from $path, not from $libroot: it was linked without the runpath \$ORIGIN/../lib/tributary/torch/lib (rebuild it from this checkout)" ;;
      esac
    done < <(ldd_libs "$bindir/$r")
  done
  [ "${#torch_roles[@]}" -eq 0 ] || say "libtorch: ${torch_roles[*]} load it from $libroot"
fi

# ---- units and users --------------------------------------------------------
for r in "${role_list[@]}"; do
  unit="tributary-$r.service"
  if [ "$dry" = 1 ]; then echo "would write $unitdir/$unit (binaries in $bindir, configuration in $etc)"; continue; fi
  mkdir -p "$unitdir"
  sed -e "s#/usr/local/bin/#$bindir/#g" -e "s#/etc/tributary/#$etc/#g" "$unit_src/$unit" > "$unitdir/$unit.new.$$"
  chmod 644 "$unitdir/$unit.new.$$"
  mv -f "$unitdir/$unit.new.$$" "$unitdir/$unit"
done
say "units: $unitdir/tributary-{${roles}}.service"
if [ "$managed" = 1 ]; then
  for r in "${role_list[@]}"; do
    id "tributary-$r" >/dev/null 2>&1 || run useradd --system --home-dir "/var/lib/tributary/$r" --shell /usr/sbin/nologin "tributary-$r"
  done
  run install -d -m 755 /var/lib/tributary "$etc"
  if [ -d /run/systemd/system ]; then run systemctl daemon-reload; fi
  say "next: the configurations in $etc (docs/runbook.md, \"Start a network\"), then systemctl enable --now tributary-ROLE"
else
  say "systemd not managed under --prefix: link the units with systemctl link $unitdir/tributary-ROLE.service"
fi
