#!/usr/bin/env bash
# A profile-guided build of fencegate. usage: pgo.sh [OUT]   (default: target/pgo/fencegate)
#
# 1. builds fencegate instrumented (RUSTFLAGS=-Cprofile-generate) into target/pgo-generate;
# 2. runs it on a database of its own on DATABASE_URL's server (default
#    postgres://postgres@127.0.0.1:5432/postgres) under the load bench's requests: PUTs of
#    random keys at 1 and 64 connections (wrk, bench/scripts/put.lua), the same over h2c
#    (h2load), stale PUTs (412) and GETs, TRAIN_SECS (default 10) seconds each;
# 3. merges the profile with llvm-profdata of rustc's own LLVM major version;
# 4. builds with -Cprofile-use into target/pgo-use and copies the binary to OUT.
#
# Two release builds: about half an hour on 2 CPUs. Needs wrk, h2load (nghttp2-client), psql,
# curl and llvm-profdata-N for the N that `rustc -vV` names (Debian: llvm-N).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/target/pgo/fencegate}
secs=${TRAIN_SECS:-10}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}

major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=""
for c in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata"; do
  command -v "$c" >/dev/null 2>&1 && { profdata=$c; break; }
done
[ -n "$profdata" ] || { echo "pgo.sh: rustc uses LLVM $major: install llvm-profdata $major (Debian: apt-get install llvm-$major)" >&2; exit 1; }
for tool in wrk h2load psql curl; do
  command -v "$tool" >/dev/null || { echo "pgo.sh: $tool not found (Debian: wrk, nghttp2-client, postgresql-client, curl)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/fencegate-pgo.XXXXXX)
db=fg_pgo_$$
pid=""
cleanup() {
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  psql -q "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cd "$here"
echo "pgo.sh: instrumented build (target/pgo-generate)"
RUSTFLAGS="-Cprofile-generate=$work/raw" cargo build --release --locked --target-dir target/pgo-generate

psql -q "$url" -c "CREATE DATABASE $db"
# DATABASE_URL with its database swapped for ours, its query (?sslmode=...) kept.
path=${url%%\?*}; query=${url#"$path"}; db_url="${path%/*}/$db$query"
port=$((40000 + RANDOM % 10000))
while ss -Hltn "sport = :$port" | grep -q .; do port=$((40000 + RANDOM % 10000)); done
target/pgo-generate/release/fencegate serve --listen 127.0.0.1:$port \
  --database-url "$db_url" > "$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do curl -s -m 1 -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.2; done
base=http://127.0.0.1:$port
lua=$here/bench/scripts/put.lua

echo "pgo.sh: training, ${secs} s a step"
wrk -t1 -c1 -d${secs}s -s "$lua" "$base" | grep -E "requests in|Non-2xx" || true
wrk -t1 -c64 -d${secs}s -s "$lua" "$base" | grep -E "requests in|Non-2xx" || true
# Stale writes: token 1 against keys that hold clock-sized tokens, refused with 412.
cat > "$work/stale.lua" <<'EOF'
request = function()
  return wrk.format("PUT", "/v1/kv/" .. math.random(1, 10000),
    {["X-Fencing-Token"] = "1", ["Content-Type"] = "application/json"}, '{"n": 1}')
end
EOF
wrk -t1 -c16 -d$((secs / 2 + 1))s -s "$work/stale.lua" "$base" | grep -E "requests in|Non-2xx" || true
for i in $(seq 1 2000); do echo "$base/v1/kv/$(( (i * 7919) % 10000 + 1 ))"; done > "$work/uris"
echo '{"n": 42, "by": "bench"}' > "$work/body.json"
h2load -c 4 -m 16 -t 1 -D "$secs" -i "$work/uris" -d "$work/body.json" \
  -H ":method: PUT" -H "content-type: application/json" \
  -H "x-fencing-token: $(date +%s)999999" | grep -E "^requests:" || true
wrk -t1 -c16 -d$((secs / 2 + 1))s "$base/v1/kv/1" | grep -E "requests in|Non-2xx" || true

# A server that died mid-training leaves a profile of part of the path: refuse it.
kill -0 "$pid" 2>/dev/null || { echo "pgo.sh: fencegate exited during training ($work/serve.log):" >&2; tail -5 "$work/serve.log" >&2; exit 1; }
kill -INT "$pid"; wait "$pid" || true; pid=""
ls "$work"/raw/*.profraw >/dev/null 2>&1 || { echo "pgo.sh: training wrote no profile" >&2; exit 1; }
"$profdata" merge -o "$work/fencegate.profdata" "$work/raw"

echo "pgo.sh: profile-guided build (target/pgo-use)"
RUSTFLAGS="-Cprofile-use=$work/fencegate.profdata" cargo build --release --locked --target-dir target/pgo-use
mkdir -p "$(dirname "$out")"
cp target/pgo-use/release/fencegate "$out"
echo "pgo.sh: $out"
