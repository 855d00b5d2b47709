#!/usr/bin/env bash
# Instructions per PUT: fencegate under callgrind, wrk (1 thread) with bench/scripts/put.lua; needs valgrind, wrk, psql.
# usage: callgrind.sh BINARY LABEL [conns] [seconds]: instructions (callgrind) per PUT in fencegate
# env: CONFIG=FILE runs fencegate with --config FILE; BEARER=KEY makes every PUT send
# Authorization: Bearer KEY (both for BENCH_TRUST-like runs: bench/README.md, Performance 2);
# LUA=bench/scripts/scope.lua (with TOKEN, PROOF) writes under one scope instead of put.lua;
# IDEM=1 makes every put.lua PUT carry a fresh Idempotency-Key (what a keyed write costs).
# FOOTPRINT=1 also records instruction addresses and prints the code footprint of the window
# (bench/scripts/footprint.py: distinct 64-byte lines of code executed, per object).
# H2=1 sends the PUTs over h2c instead, as the load bench's h2c step does (h2load, 4 connections
# x 16 streams, random keys out of 10,000, one token, BEARER as above; conns, LUA and IDEM are
# ignored; needs nghttp2-client).
# H2=1 READS=1 measures GETs over h2c instead: the warm-up writes every key 1..10,000 once (h2load
# gives each connection the whole list of URIs, so one connection), and
# the window reads random ones (each answer carries its key's own x-fencing-token).
# MANGLED=1 keeps symbol names as the linker knows them (for bench/scripts/hot-order.py).
set -e
bin=$1; label=$2; conns=${3:-1}; secs=${4:-10}
if [ -n "$READS" ] && [ -z "$H2" ]; then echo "READS=1 needs H2=1 (reads are measured over h2c)" >&2; exit 2; fi
db=fg_cg_$$
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $db" postgres
port=$((40000 + RANDOM % 10000))
while ss -Hltn "sport = :$port" | grep -q .; do port=$((40000 + RANDOM % 10000)); done
out=/tmp/cg.$label.out
instr=no; [ -n "$FOOTPRINT" ] && instr=yes
valgrind --tool=callgrind --callgrind-out-file=$out --dump-instr=$instr ${MANGLED:+--demangle=no} "$bin" serve --listen 127.0.0.1:$port --database-url postgres://postgres@127.0.0.1:5432/$db ${CONFIG:+--config "$CONFIG"} >/tmp/cg.$label.log 2>&1 &
vpid=$!
# Stopped and dropped however the script ends (the normal end below does both first).
trap 'set +e; kill -INT $vpid 2>/dev/null; wait $vpid 2>/dev/null; psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" postgres' EXIT
for i in $(seq 1 120); do curl -s -m 2 -o /dev/null http://127.0.0.1:$port/healthz && break; sleep 0.5; done
export BEARER TOKEN PROOF TOKEN_BASE IDEM
lua=${LUA:-$(dirname "$0")/put.lua}
# load SECONDS: the window's requests, as wrk prints them.
if [ -n "$H2" ]; then
  for i in $(seq 1 5000); do echo "http://127.0.0.1:$port/v1/kv/$((RANDOM % 10000 + 1))"; done > /tmp/cg.$label.uris
  printf '{"n": 42, "by": "bench"}' > /tmp/cg.$label.body
  # h2load's "status codes: N 2xx, 0 3xx, M 4xx, 0 5xx" in wrk's words (every response, and
  # those not 2xx), for the lines below.
  load() {
    if [ -z "$READS" ]; then
      h2load -c4 -m16 -t1 -D "$1" -i /tmp/cg.$label.uris -d /tmp/cg.$label.body -H ":method: PUT" \
        -H "content-type: application/json" -H "x-fencing-token: $(date +%s%N)" \
        ${BEARER:+-H "authorization: Bearer $BEARER"}
    elif [ "$1" = warm ]; then
      seq 1 10000 | sed "s|^|http://127.0.0.1:$port/v1/kv/|" > /tmp/cg.$label.all
      h2load -c1 -m16 -t1 -n 10000 -i /tmp/cg.$label.all -d /tmp/cg.$label.body -H ":method: PUT" \
        -H "content-type: application/json" -H "x-fencing-token: $(date +%s%N)" \
        ${BEARER:+-H "authorization: Bearer $BEARER"}
    else
      h2load -c4 -m16 -t1 -D "$1" -i /tmp/cg.$label.uris ${BEARER:+-H "authorization: Bearer $BEARER"}
    fi | awk '/^status codes:/ {gsub(",", ""); print "  " $3 + $5 + $7 + $9 " requests in"; print "Non-2xx or 3xx responses: " $5 + $7 + $9}'
  }
else
  load() { wrk -t1 -c$conns -d"$1"s -s "$lua" http://127.0.0.1:$port; }
fi
if [ -n "$H2" ] && [ -n "$READS" ]; then
  load warm > /tmp/cg.$label.warm
  grep -q "^Non-2xx or 3xx responses: 0$" /tmp/cg.$label.warm || { echo "the warm-up's writes failed: $(cat /tmp/cg.$label.warm)" >&2; exit 1; }
  # The warm-up gave every key one token; each key's own, as after writes of many holders.
  psql -q -h 127.0.0.1 -U postgres -c "UPDATE fencegate.fencegate_kv SET fence_token = fence_token + key::bigint, key_fence = key_fence + key::bigint" $db
fi
load 3 >/dev/null
callgrind_control -z $vpid >/dev/null
load "$secs" > /tmp/cg.$label.wrk
callgrind_control -d $vpid >/dev/null
sleep 1
kill -INT $vpid; wait $vpid || true
psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE $db WITH (FORCE)" postgres
trap - EXIT
reqs=$(grep -oE "^ *[0-9]+ requests in" /tmp/cg.$label.wrk | awk '{print $1}')
non2xx=$(grep -oE "Non-2xx or 3xx responses: [0-9]+" /tmp/cg.$label.wrk | awk '{print $NF}')
dump=$(ls -t $out* | grep -v "^$out$" | head -1)
ir=$(callgrind_annotate "$dump" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | awk '{gsub(",","",$1); print $1}')
echo "$label: requests $reqs (non-2xx ${non2xx:-0}), Ir $ir, Ir/request $((ir / reqs))  dump $dump"
if [ -n "$FOOTPRINT" ]; then python3 "$(dirname "$0")/footprint.py" "$dump" "$reqs"; fi
