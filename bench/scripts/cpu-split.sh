#!/usr/bin/env bash
# Where a write's CPU time goes, by time: fencegate's CPU per PUT (user + kernel, from /proc),
# split by perf's samples into system calls and the code that ran (bench/scripts/cpu-split.py).
# usage: cpu-split.sh BINARY [conns] [seconds]
# Needs wrk, psql, curl, ss and perf (Debian's linux-perf; run as root, or with
# kernel.perf_event_paranoid <= 1 and kernel.kptr_restrict = 0 for the kernel's names). It uses
# the cpu-clock software event, so it works on VMs without hardware counters. PostgreSQL is the
# one at postgres@127.0.0.1:5432 (a role with CREATEDB), as for the other scripts here.
# H2=1 sends the PUTs over h2c as the load bench's h2c step does (h2load, 4 connections x 16
# streams, needs nghttp2-client); conns is then ignored.
set -e
bin=$1; conns=${2:-64}; secs=${3:-8}
for tool in wrk psql curl ss perf python3; do
  command -v $tool >/dev/null || { echo "cpu-split.sh needs $tool (Debian: wrk, postgresql-client, curl, iproute2, linux-perf, python3)" >&2; exit 2; }
done
if [ -n "$H2" ]; then command -v h2load >/dev/null || { echo "H2=1 needs h2load (Debian: nghttp2-client)" >&2; exit 2; }; fi
here=$(dirname "$0")
db=fg_split_$$
work=$(mktemp -d)
pid=
# Stopped and dropped however the script ends.
trap 'set +e; [ -n "$pid" ] && { kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null; }; psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" postgres; rm -rf "$work"' EXIT
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $db" postgres
port=$((40000 + RANDOM % 10000))
while ss -Hltn "sport = :$port" | grep -q .; do port=$((40000 + RANDOM % 10000)); done
"$bin" serve --listen 127.0.0.1:$port --database-url postgres://postgres@127.0.0.1:5432/$db >"$work/fencegate.log" 2>&1 &
pid=$!
up=
for _ in $(seq 1 100); do curl -s -m 1 -o /dev/null "http://127.0.0.1:$port/healthz" && { up=1; break; }; sleep 0.1; done
[ -n "$up" ] || { echo "fencegate did not answer /healthz within 10 s; its log:" >&2; cat "$work/fencegate.log" >&2; exit 1; }
if [ -n "$H2" ]; then
  for _ in $(seq 1 5000); do echo "http://127.0.0.1:$port/v1/kv/$((RANDOM % 10000 + 1))"; done > "$work/uris"
  printf '{"n": 42, "by": "bench"}' > "$work/body"
  # Requests answered 2xx, in the words of wrk's "requests in" line (which counts every answer).
  load() {
    h2load -c4 -m16 -t1 -D "$1" -i "$work/uris" -d "$work/body" -H ":method: PUT" \
      -H "content-type: application/json" -H "x-fencing-token: $(date +%s%N)" |
      awk '/^status codes:/ {gsub(",", ""); print "  " $3 " requests in"}'
  }
else
  load() { wrk -t1 -c"$conns" -d"$1"s -s "$here/put.lua" "http://127.0.0.1:$port"; }
fi
load 3 >/dev/null
read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
perf record -q -F 999 -e cpu-clock -g -p $pid -o "$work/perf.data" -- sleep $((secs + 1)) 2>"$work/perf.err" &
perfpid=$!
reqs=$(load "$secs" | awk '/requests in/ {print $1}')
read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
wait $perfpid || { echo "perf record failed (run as root, or lower kernel.perf_event_paranoid):" >&2; cat "$work/perf.err" >&2; exit 1; }
[ -n "$reqs" ] || { echo "the load generator answered nothing (fencegate's log: $work/fencegate.log)" >&2; cat "$work/fencegate.log" >&2; exit 1; }
perf script --no-inline -F ip,sym -i "$work/perf.data" 2>/dev/null |
  python3 "$here/cpu-split.py" --requests "$reqs" --ticks $((u1 - u0 + s1 - s0)) \
    --user-ticks $((u1 - u0)) --hz "$(getconf CLK_TCK)" --label "$(basename "$bin") $([ -n "$H2" ] && echo "h2c 4x16" || echo "HTTP/1.1 c$conns")"
