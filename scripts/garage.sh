#!/usr/bin/env bash
# A single-node Garage (S3-compatible object store) for tests and local
# networks: `scripts/garage.sh DIR [BUCKET]` starts `garage server` with its
# state in DIR on free loopback ports, assigns the one-node layout, creates
# BUCKET (default `tributary`) and a key allowed to read and write it, and
# writes DIR/env with what a coordinator needs:
#
#   AWS_ENDPOINT AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
#   AWS_ALLOW_HTTP GARAGE_BUCKET GARAGE_PID
#
# (`archive = "s3://$GARAGE_BUCKET/PREFIX"` with those in the coordinator's
# environment; a build with `--features coordinator/s3`). Stop it with
# `kill "$GARAGE_PID"`. The garage binary: $GARAGE_BIN, else `garage` on
# PATH, else the cache's (scripts/setup.sh with TRIBUTARY_GARAGE=1).
set -euo pipefail

DIR=${1:?usage: scripts/garage.sh DIR [BUCKET]}
BUCKET=${2:-tributary}
CACHE=${TRIBUTARY_CACHE:-$HOME/.cache/tributary}
GARAGE=${GARAGE_BIN:-$(command -v garage || echo "$CACHE/garage/bin/garage")}
[ -x "$GARAGE" ] || { echo "garage.sh: no garage binary ($GARAGE); TRIBUTARY_GARAGE=1 scripts/setup.sh installs it" >&2; exit 2; }

mkdir -p "$DIR/meta" "$DIR/data"
DIR=$(cd "$DIR" && pwd)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPC=$(free_port); S3=$(free_port); ADMIN=$(free_port)
cat > "$DIR/garage.toml" <<EOF
metadata_dir = "$DIR/meta"
data_dir = "$DIR/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$RPC"
rpc_public_addr = "127.0.0.1:$RPC"
rpc_secret = "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$S3"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$ADMIN"
EOF
chmod 600 "$DIR/garage.toml"
g() { "$GARAGE" -c "$DIR/garage.toml" "$@"; }

g server > "$DIR/server.log" 2>&1 &
PID=$!
echo "$PID" > "$DIR/garage.pid"
fail() { echo "garage.sh: $1 (log: $DIR/server.log)" >&2; tail -n 20 "$DIR/server.log" >&2 || true; kill "$PID" 2>/dev/null || true; exit 1; }

NODE=
for _ in $(seq 1 100); do
    kill -0 "$PID" 2>/dev/null || fail "garage server exited"
    NODE=$(g node id -q 2>/dev/null | cut -d@ -f1) && [ -n "$NODE" ] && break
    sleep 0.2
done
[ -n "$NODE" ] || fail "garage did not answer"
g layout assign -z dc1 -c 1G "$NODE" > /dev/null || fail "layout assign"
g layout apply --version 1 > /dev/null || fail "layout apply"
for _ in $(seq 1 50); do
    g bucket create "$BUCKET" > /dev/null 2>&1 && break
    sleep 0.2
done
g bucket info "$BUCKET" > /dev/null || fail "bucket create"
KEYS=$(g key create "$BUCKET-key") || fail "key create"
KEY_ID=$(printf '%s\n' "$KEYS" | sed -n 's/^Key ID: *//p' | head -n 1)
SECRET=$(printf '%s\n' "$KEYS" | sed -n 's/^Secret key: *//p' | head -n 1)
[ -n "$KEY_ID" ] && [ -n "$SECRET" ] || fail "could not read the key from: $KEYS"
g bucket allow --read --write --owner "$BUCKET" --key "$BUCKET-key" > /dev/null || fail "bucket allow"

cat > "$DIR/env" <<EOF
AWS_ENDPOINT=http://127.0.0.1:$S3
AWS_REGION=garage
AWS_ACCESS_KEY_ID=$KEY_ID
AWS_SECRET_ACCESS_KEY=$SECRET
AWS_ALLOW_HTTP=true
GARAGE_BUCKET=$BUCKET
GARAGE_PID=$PID
EOF
chmod 600 "$DIR/env"
cat "$DIR/env"
