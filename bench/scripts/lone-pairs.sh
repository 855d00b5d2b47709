#!/usr/bin/env bash
# CPU per lone request, builds interleaved: usage lone-pairs.sh PAIRS A B [more...]
# Each round runs every binary in turn (the order reversed every other round): fencegate on a
# fresh database, wrk -t1 -c1 for 3 s of warm-up then SECS (default 10) measured with
# bench/scripts/put.lua, and prints its CPU (user + kernel, from /proc) per request in that
# window. Needs wrk and psql; DATABASE_HOST (default 127.0.0.1) runs PostgreSQL as postgres.
set -e
pairs=$1; shift
secs=${SECS:-10}; host=${DATABASE_HOST:-127.0.0.1}
lua=$(dirname "$0")/put.lua
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15, $14}' "/proc/$1/stat"; }
run() {
  local bin=$1 db=fg_lone_$$ port
  port=$((40000 + RANDOM % 10000))
  while ss -Hltn "sport = :$port" | grep -q .; do port=$((40000 + RANDOM % 10000)); done
  psql -q -h "$host" -U postgres -c "CREATE DATABASE $db" postgres
  "$bin" serve --listen 127.0.0.1:$port --database-url "postgres://postgres@$host:5432/$db" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do curl -s -m 1 -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  wrk -t1 -c1 -d3s -s "$lua" "http://127.0.0.1:$port" >/dev/null
  read -r t0 u0 < <(cpu $pid)
  local reqs
  reqs=$(wrk -t1 -c1 -d${secs}s -s "$lua" "http://127.0.0.1:$port" | awk '/requests in/ {print $1}')
  read -r t1 u1 < <(cpu $pid)
  kill -INT $pid; wait $pid || true
  psql -q -h "$host" -U postgres -c "DROP DATABASE $db WITH (FORCE)" postgres
  awk -v t=$((t1 - t0)) -v u=$((u1 - u0)) -v r="$reqs" -v hz="$tck" -v b="$bin" -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN { printf "%-28s %6d req  %6.1f us CPU/request (user %5.1f)  load %s\n", b, r, t / hz / r * 1e6, u / hz / r * 1e6, l }'
}
for round in $(seq 1 "$pairs"); do
  if [ $((round % 2)) -eq 1 ]; then order=("$@"); else order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done; fi
  for bin in "${order[@]}"; do run "$bin"; done
done
