#!/usr/bin/env bash
# usage: ab.sh OUT ROUNDS dirA dirB [more dirs...]; env: BENCH_ONLY, BENCH_SECONDS, FEATURES_<i>
# Runs the load bench interleaved over the given worktrees; prints each run's table rows.
out=$1; rounds=$2; shift 2
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
export BENCH_ONLY=${BENCH_ONLY:-random1,random64} BENCH_SECONDS=${BENCH_SECONDS:-8}
: > "$out"
for r in $(seq 1 "$rounds"); do
  for d in "$@"; do
    feat=""; case "$d" in *+jemalloc) feat="--features jemalloc"; d=${d%+jemalloc};; esac
    echo "=== round $r: $d $feat (load $(cut -d' ' -f1-3 /proc/loadavg))" >> "$out"
    (cd "$d" && cargo bench --bench load --locked $feat 2>&1) | grep -E "^  (fencegate|pgbench|ratio)|CPU .* per ok|^\| random|^\| one hot|^\| hot" >> "$out"
  done
done
echo "=== done" >> "$out"
