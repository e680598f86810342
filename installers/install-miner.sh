#!/usr/bin/env bash
# Tributary edge miner installer: from nothing to a mining node in one command.
#
#   installers/install-miner.sh --coordinator HOST:PORT (--fingerprint HEX | --ca FILE) [options]
#
# It detects the OS and accelerator (NVIDIA with the CUDA toolkit, Apple
# Metal, Vulkan, otherwise CPU), installs the Rust toolchain and the build
# prerequisites if they are missing, builds and installs `edge-miner` with the
# matching feature, creates the miner key (once: re-running keeps it), writes
# the config (docs/config/miner.toml documents every key), installs a service
# (systemd user unit on Linux, launchd agent on macOS) that runs
# `edge-miner run --config FILE`, and finishes with `edge-miner doctor`.
# Re-running upgrades in place.
#
# Options:
#   --coordinator HOST:PORT  the coordinator's QUIC address (required)
#   --fingerprint HEX        its certificate fingerprint, 64 hex digits, or
#   --ca FILE                the CA certificate (PEM) that signed its certificate
#                            (copied next to the config); one of the two is required
#   --accel auto|cpu|cuda|metal|vulkan   default auto (detected)
#   --prefix DIR             install everything under DIR (bin/, etc/, var/, service
#                            files) and never touch systemctl/launchctl; default: the
#                            user's standard places (~/.local/bin, ~/.config, ~/.local/share)
#   --data DIR               miner data folder (key, models)
#   --src DIR                Tributary source checkout (default: the one holding this script)
#   --from-build DIR         reuse binaries already built in DIR (e.g. target/debug) instead
#                            of `cargo install` (CI: llama.cpp is built only once)
#   --from-release URL|FILE  install the edge-miner of a release archive
#                            (tributary-VERSION-TARGET.tar.gz from scripts/release.sh):
#                            no Rust, no compiler, no source checkout. Its SHA-256 is
#                            checked against the SHA256SUMS beside it (URL/.../SHA256SUMS,
#                            or the file's folder), or against --sha256 HEX; then every
#                            file inside against the archive's own SHA256SUMS
#   --sha256 HEX             the archive's expected SHA-256 (instead of SHA256SUMS)
#   --threads N --gpu-layers N   passed to the miner (default: all cores; 99 with a GPU)
#   --no-service             do not install a service
#   --no-doctor              do not run `edge-miner doctor` at the end
#   --dry-run                print every action instead of doing it
set -euo pipefail

die() { echo "install-miner: error: $*" >&2; exit 1; }
say() { echo "install-miner: $*"; }

coordinator="" fingerprint="" ca="" accel="auto" prefix="" data="" src="" from_build="" from_release="" sha256=""
threads="" gpu_layers="" service=1 doctor=1 dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --coordinator) coordinator="${2:?}"; shift 2 ;;
    --fingerprint) fingerprint="${2:?}"; shift 2 ;;
    --ca) ca="${2:?}"; shift 2 ;;
    --accel) accel="${2:?}"; shift 2 ;;
    --prefix) prefix="${2:?}"; shift 2 ;;
    --data) data="${2:?}"; shift 2 ;;
    --src) src="${2:?}"; shift 2 ;;
    --from-build) from_build="${2:?}"; shift 2 ;;
    --from-release) from_release="${2:?}"; shift 2 ;;
    --sha256) sha256="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --gpu-layers) gpu_layers="${2:?}"; shift 2 ;;
    --no-service) service=0; shift ;;
    --no-doctor) doctor=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ -n "$coordinator" ] || die "--coordinator HOST:PORT is required"
[ -n "$fingerprint" ] || [ -n "$ca" ] || die "--fingerprint HEX or --ca FILE is required"
[ -z "$fingerprint" ] || [ -z "$ca" ] || die "give --fingerprint or --ca, not both"
case "$coordinator" in *:[0-9]*) ;; *) die "--coordinator must be HOST:PORT, got '$coordinator'" ;; esac
[ -z "$fingerprint" ] || [[ "$fingerprint" =~ ^[0-9a-fA-F]{64}$ ]] || die "--fingerprint must be 64 hex digits"
if [ -n "$ca" ]; then
  [ -f "$ca" ] || die "--ca $ca: no such file"
  grep -q -- '-----BEGIN CERTIFICATE-----' "$ca" || die "--ca $ca: not a PEM certificate"
  ca="$(cd "$(dirname "$ca")" && pwd)/$(basename "$ca")"
fi
case "$accel" in auto|cpu|cuda|metal|vulkan) ;; *) die "--accel must be auto, cpu, cuda, metal or vulkan" ;; esac
[[ -z "$threads" || "$threads" =~ ^[0-9]+$ ]] || die "--threads must be a number"
[[ -z "$gpu_layers" || "$gpu_layers" =~ ^[0-9]+$ ]] || die "--gpu-layers must be a number"
[ -z "$from_build" ] || [ -z "$from_release" ] || die "give --from-build or --from-release, not both"
[[ -z "$sha256" || "$sha256" =~ ^[0-9a-fA-F]{64}$ ]] || die "--sha256 must be 64 hex digits"

# Print a command (dry run) or run it.
run() {
  if [ "$dry" = 1 ]; then printf 'would run:'; printf ' %q' "$@"; echo; else "$@"; fi
}
# Write stdin to a file (dry run: show it).
write_file() {
  local path="$1" mode="$2" tmp
  if [ "$dry" = 1 ]; then
    echo "would write $path:"; sed 's/^/    | /'
    return
  fi
  mkdir -p "$(dirname "$path")"
  tmp="$(mktemp "$path.XXXXXX")"
  cat > "$tmp"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$path"
}

# ---- platform ---------------------------------------------------------------
os="$(uname -s)"
arch="$(uname -m)"
case "$os" in
  Linux) platform=linux ;;
  Darwin) platform=macos ;;
  *) die "unsupported OS $os (Linux and macOS are supported)" ;;
esac

detect_accel() {
  if [ "$platform" = macos ]; then
    if [ "$arch" = arm64 ]; then echo metal; else echo cpu; fi
    return
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
     && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    echo cuda; return
  fi
  if command -v vulkaninfo >/dev/null 2>&1 && vulkaninfo --summary >/dev/null 2>&1 \
     && command -v glslc >/dev/null 2>&1; then
    echo vulkan; return
  fi
  echo cpu
}
detected="$(detect_accel)"
if [ "$accel" = auto ]; then accel="$detected"; fi
say "platform $platform/$arch, accelerator: $accel (detected: $detected)"
features=""
[ "$accel" = cpu ] || features="$accel"
if [ -z "$gpu_layers" ]; then
  if [ "$accel" = cpu ]; then gpu_layers=0; else gpu_layers=99; fi
fi

# ---- where things go --------------------------------------------------------
if [ -n "$prefix" ]; then
  managed=0  # a private prefix: write service files, never call systemctl/launchctl
  [ "$dry" = 1 ] || mkdir -p "$prefix" || die "cannot create $prefix"
  prefix="$(cd "$prefix" 2>/dev/null && pwd || echo "$prefix")"
  bindir="$prefix/bin"
  confdir="$prefix/etc/tributary"
  : "${data:=$prefix/var/lib/tributary-miner}"
  unitdir="$prefix/lib/systemd/user"
  agentdir="$prefix/Library/LaunchAgents"
else
  managed=1
  bindir="$HOME/.local/bin"
  confdir="${XDG_CONFIG_HOME:-$HOME/.config}/tributary"
  : "${data:=${XDG_DATA_HOME:-$HOME/.local/share}/tributary-miner}"
  unitdir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
  agentdir="$HOME/Library/LaunchAgents"
fi
case "$data" in /*) ;; *) data="$PWD/$data" ;; esac
config="$confdir/miner.toml"
bin="$bindir/edge-miner"
logdir="$data/logs"

if [ -z "$src" ]; then
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
# Only a build from source needs the checkout.
if [ -z "$from_build" ] && [ -z "$from_release" ]; then
  [ -f "$src/edge-miner/Cargo.toml" ] || die "no Tributary checkout at $src (give --src DIR: git clone the Tributary repository first, or install a release with --from-release URL|FILE)"
fi
if [ -f "$src/docs/runbook.md" ]; then doc_line="Documentation=file://$src/docs/runbook.md"; else doc_line="Documentation=https://github.com/tributary/tributary/blob/main/docs/runbook.md"; fi

sha_of() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1"; else shasum -a 256 "$1"; fi | cut -d' ' -f1; }

# A release archive (URL or file), checked and unpacked: sets from_build to its bin/.
fetch_release() {
  local what="$1" work archive sums expected name
  work="$(mktemp -d "${TMPDIR:-/tmp}/tributary-release.XXXXXX")"
  release_work="$work"
  trap 'rm -rf "$release_work"' EXIT
  name="$(basename "$what")"
  case "$name" in *.tar.gz) ;; *) die "--from-release $what: expected a tributary-VERSION-TARGET.tar.gz" ;; esac
  case "$what" in
    http://*|https://*)
      command -v curl >/dev/null 2>&1 || die "curl is needed to download $what"
      archive="$work/$name"
      say "downloading $what"
      curl -fsSL --proto '=https,http' -o "$archive" "$what" || die "downloading $what failed"
      sums="$work/SHA256SUMS"
      [ -n "$sha256" ] || curl -fsSL -o "$sums" "${what%/*}/SHA256SUMS" || die "no SHA256SUMS beside $what (or give --sha256 HEX)"
      ;;
    *)
      [ -f "$what" ] || die "--from-release $what: no such file"
      archive="$what"
      sums="$(dirname "$what")/SHA256SUMS"
      [ -n "$sha256" ] || [ -f "$sums" ] || die "no SHA256SUMS beside $what (or give --sha256 HEX)"
      ;;
  esac
  if [ -z "$sha256" ]; then
    expected="$(awk -v n="$name" '$2 == n || $2 == "*" n {print $1}' "$sums")"
    [ -n "$expected" ] || die "SHA256SUMS has no line for $name"
  else
    expected="$sha256"
  fi
  local actual
  actual="$(sha_of "$archive" | tr 'A-F' 'a-f')"
  [ "$actual" = "$(echo "$expected" | tr 'A-F' 'a-f')" ] \
    || die "$name: SHA-256 mismatch (expected $expected, the file has $actual): refusing to install it"
  say "$name: SHA-256 ok"
  tar -C "$work" -xzf "$archive" || die "unpacking $name failed"
  local stage="$work/${name%.tar.gz}"
  [ -f "$stage/SHA256SUMS" ] || die "$name holds no SHA256SUMS"
  (cd "$stage" && while read -r sum file; do
     [ "$(sha_of "$file")" = "$sum" ] || { echo "install-miner: error: $name: $file does not match its SHA-256" >&2; exit 1; }
   done < SHA256SUMS) || exit 1
  [ ! -f "$stage/edge-miner.features" ] || say "the release's miner was built with: $(cat "$stage/edge-miner.features")"
  from_build="$stage/bin"
}
if [ -n "$from_release" ]; then
  if [ "$dry" = 1 ]; then
    echo "would download/check/unpack $from_release and install its bin/edge-miner"
    from_build="(release)"
  else
    fetch_release "$from_release"
  fi
fi

# ---- prerequisites ----------------------------------------------------------
sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi

install_prereqs() {
  local missing=()
  for t in cmake clang git pkg-config; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing+=(cc)
  if [ ${#missing[@]} -eq 0 ]; then say "build prerequisites present"; return; fi
  say "missing build tools: ${missing[*]}"
  if [ "$platform" = macos ]; then
    xcode-select -p >/dev/null 2>&1 || run xcode-select --install
    if command -v brew >/dev/null 2>&1; then run brew install cmake pkg-config; else die "install Homebrew (https://brew.sh), then re-run"; fi
  elif command -v apt-get >/dev/null 2>&1; then
    run "${sudo_cmd[@]}" apt-get update
    run "${sudo_cmd[@]}" apt-get install -y build-essential cmake clang libclang-dev git pkg-config
  elif command -v dnf >/dev/null 2>&1; then
    run "${sudo_cmd[@]}" dnf install -y gcc gcc-c++ make cmake clang clang-devel git pkgconf-pkg-config
  elif command -v pacman >/dev/null 2>&1; then
    run "${sudo_cmd[@]}" pacman -S --needed --noconfirm base-devel cmake clang git pkgconf
  else
    die "install a C/C++ compiler, cmake, clang and pkg-config, then re-run"
  fi
}

install_rust() {
  if command -v cargo >/dev/null 2>&1; then say "Rust toolchain present ($(cargo --version))"; return; fi
  if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; say "Rust toolchain in ~/.cargo/bin"; return; fi
  say "installing the Rust toolchain with rustup (https://rustup.rs)"
  command -v curl >/dev/null 2>&1 || die "curl is needed to install Rust"
  if [ "$dry" = 1 ]; then
    echo "would run: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal"
  else
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
}

check_accel_toolchain() {
  case "$accel" in
    cuda) command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || die "--accel cuda needs the CUDA toolkit (nvcc)"
          command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH" ;;
    vulkan) command -v glslc >/dev/null 2>&1 || die "--accel vulkan needs the Vulkan SDK (glslc, headers)" ;;
    metal) [ "$platform" = macos ] || die "--accel metal is macOS only" ;;
  esac
}

# ---- build and install the binary ------------------------------------------
if [ "$from_build" = "(release)" ]; then
  run install -m 755 "(release)/edge-miner" "$bin"
elif [ -n "$from_build" ]; then
  [ -x "$from_build/edge-miner" ] || die "no edge-miner binary in $from_build (build it first: cargo build -p edge-miner)"
  say "reusing the binary built in $from_build (its features are the ones it was built with)"
  run mkdir -p "$bindir"
  tmpbin="$bin.new.$$"
  run cp "$from_build/edge-miner" "$tmpbin"
  run chmod 755 "$tmpbin"
  run mv -f "$tmpbin" "$bin"
else
  install_prereqs
  install_rust
  check_accel_toolchain
  cargo_args=(install --path "$src/edge-miner" --locked --root "$(dirname "$bindir")" --bin edge-miner --force)
  [ -z "$features" ] || cargo_args+=(--features "$features")
  say "building edge-miner (release${features:+, features $features}); the first build compiles llama.cpp and takes a while"
  run cargo "${cargo_args[@]}"
fi

# ---- key, config, service --------------------------------------------------
run mkdir -p "$data" "$logdir"
if [ -f "$data/miner.key" ]; then
  say "keeping the existing key $data/miner.key"
fi
# `init` creates the key only when it is missing and prints the public key.
run "$bin" init --data "$data"

threads_line="# threads = 4            # default: every core"
[ -z "$threads" ] || threads_line="threads = $threads"
if [ -n "$ca" ]; then
  ca_path="$confdir/coordinator-ca.pem"
  run mkdir -p "$confdir"
  run install -m 644 "$ca" "$ca_path"
  pin_lines="ca = \"$ca_path\""
else
  pin_lines="fingerprint = \"$fingerprint\"
# ca = \"coordinator-ca.pem\"   # a CA certificate (PEM) instead of the fingerprint"
fi
write_file "$config" 644 <<EOF
# Tributary edge miner configuration, written by installers/install-miner.sh.
# Every key: docs/config/miner.toml. Re-running the installer rewrites this
# file (the key in \`data\` is kept). The service runs
# \`edge-miner run --config $config\`; check it with
# \`edge-miner doctor --config $config\`.

# The coordinator's QUIC address (HOST:PORT) and how its certificate is pinned.
coordinator = "$coordinator"
$pin_lines
# Key (miner.key) and models (models/): keep this folder, it is the miner's identity.
data = "$data"
# Inference engine: llama (llama.cpp) or wgpu.
backend = "llama"
# Layers offloaded to the GPU (0: CPU only; 99: the whole model). Accelerator: $accel.
gpu_layers = $gpu_layers
$threads_line
# GSM8K JSONL file, needed only if the network's environment is gsm8k.
# gsm8k = "/path/to/gsm8k/train.jsonl"
EOF

run_args=(run --config "$config")
exec_line="$bin"
for a in "${run_args[@]}"; do exec_line+=" $(printf '%q' "$a")"; done

if [ "$service" = 1 ]; then
  if [ "$platform" = linux ]; then
    unit="$unitdir/tributary-miner.service"
    write_file "$unit" 644 <<EOF
# Tributary edge miner (systemd user unit), written by installers/install-miner.sh.
[Unit]
Description=Tributary edge miner
$doc_line
Wants=network-online.target
After=network-online.target

[Service]
# The miner tells systemd when it runs (sd_notify READY=1).
Type=notify
ExecStartPre=$bin doctor --config $config
ExecStart=$exec_line
Restart=on-failure
RestartSec=30
Nice=10
Environment=RUST_LOG=info

[Install]
WantedBy=default.target
EOF
    if [ "$managed" = 1 ] && [ -d /run/systemd/system ] && systemctl --user show-environment >/dev/null 2>&1; then
      run systemctl --user daemon-reload
      run systemctl --user enable tributary-miner.service
      run systemctl --user restart tributary-miner.service
      say "service: systemctl --user status tributary-miner; logs: journalctl --user -u tributary-miner -f"
      say "to keep mining while logged out: loginctl enable-linger $USER"
    else
      say "service unit written to $unit; systemd not managed here, to start it run:"
      say "  systemctl --user link $unit && systemctl --user enable --now tributary-miner.service"
    fi
  else
    agent="$agentdir/org.tributary.miner.plist"
    args_xml="        <string>$bin</string>"
    for a in "${run_args[@]}"; do args_xml+=$'\n'"        <string>$a</string>"; done
    write_file "$agent" 644 <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Tributary edge miner (launchd agent), written by installers/install-miner.sh. -->
<plist version="1.0">
<dict>
    <key>Label</key><string>org.tributary.miner</string>
    <key>ProgramArguments</key>
    <array>
$args_xml
    </array>
    <key>RunAtLoad</key><true/>
    <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>
    <key>ThrottleInterval</key><integer>30</integer>
    <key>ProcessType</key><string>Background</string>
    <key>StandardOutPath</key><string>$logdir/miner.log</string>
    <key>StandardErrorPath</key><string>$logdir/miner.log</string>
</dict>
</plist>
EOF
    if [ "$managed" = 1 ]; then
      run launchctl bootout "gui/$(id -u)/org.tributary.miner" 2>/dev/null || true
      run launchctl bootstrap "gui/$(id -u)" "$agent"
      say "agent loaded; logs in $logdir/miner.log"
    else
      say "launchd agent written to $agent; to load it run: launchctl bootstrap gui/\$(id -u) $agent"
    fi
  fi
fi

say "installed: binary $bin, config $config, data $data"
if [ "$doctor" = 1 ]; then
  say "checking with edge-miner doctor"
  run "$bin" doctor --config "$config"
fi
