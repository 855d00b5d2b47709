#!/usr/bin/env bash
# The floor of "one more hop": pgbench straight to PostgreSQL against pgbench through a TCP relay
# that does nothing but copy bytes (haproxy, mode tcp, one thread), interleaved. Whatever a proxy
# does, fencegate included, it pays at least this hop: two more wake-ups and two more sleeps per
# request on the loopback. Needs psql, pgbench, haproxy (apt-get install haproxy).
# usage: relay-floor.sh [ROUNDS] [SECONDS] [CONNS...]   (defaults: 2 rounds, 8 s, 1 and 64)
set -euo pipefail
rounds=${1:-2}; secs=${2:-8}; conns=("${@:3}")
[ ${#conns[@]} -eq 0 ] && conns=(1 64)
for tool in psql pgbench haproxy; do
  command -v $tool >/dev/null || { echo "needs $tool (apt-get install postgresql-client haproxy)" >&2; exit 1; }
done
db=fg_floor_$$
port=$((40000 + RANDOM % 10000))
while ss -Hltn "sport = :$port" | grep -q .; do port=$((40000 + RANDOM % 10000)); done
dir=$(mktemp -d)
cleanup() {
  [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" postgres || true
  rm -rf "$dir"
}
trap cleanup EXIT
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $db" postgres
psql -q -h 127.0.0.1 -U postgres $db -c "CREATE TABLE t (k int PRIMARY KEY, fence bigint NOT NULL, v jsonb NOT NULL)" \
  -c "INSERT INTO t SELECT g, 0, '{}' FROM generate_series(1, 10000) g" -c "VACUUM ANALYZE t" -c "CHECKPOINT"
# A fenced upsert of a random key with a rising token, as the load bench's pgbench side runs.
cat > "$dir/put.sql" <<'EOF'
\set k random(1, 10000)
INSERT INTO t AS kv (k, fence, v) VALUES (:k, (extract(epoch from statement_timestamp()) * 1000000)::bigint, '{"n": 42, "by": "bench"}')
  ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v, fence = EXCLUDED.fence WHERE kv.fence <= EXCLUDED.fence RETURNING fence;
EOF
cat > "$dir/haproxy.cfg" <<EOF
global
  maxconn 2000
  nbthread 1
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
listen pg
  bind 127.0.0.1:$port
  server pg 127.0.0.1:5432
EOF
haproxy -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid"
sleep 0.5
tps() { pgbench -h 127.0.0.1 -p "$1" -U postgres -M prepared -n -c "$2" -j "$(( $2 < 2 ? $2 : 2 ))" -T "$secs" -f "$dir/put.sql" $db 2>/dev/null | awk '/^tps/{print $3}'; }
echo "| conns | round | direct tps | through the relay tps | relay ÷ direct |"
echo "|--:|--:|--:|--:|--:|"
for c in "${conns[@]}"; do
  for r in $(seq 1 "$rounds"); do
    direct=$(tps 5432 "$c"); relayed=$(tps "$port" "$c")
    printf '| %s | %s | %.0f | %.0f | %.2f× |\n' "$c" "$r" "$direct" "$relayed" "$(echo "$relayed / $direct" | bc -l)"
  done
done
