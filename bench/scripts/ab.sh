#!/usr/bin/env bash
# usage: ab.sh OUT ROUNDS A B [more...]; env: BENCH_ONLY, BENCH_SECONDS
# Runs the load bench interleaved (A, B, A, B, ...) and appends each run's figures to OUT.
# Each of A, B, ... is either a fencegate binary (measured by this tree's bench harness, through
# BENCH_FENCEGATE: one harness, one pgbench statement, only the server differs), or a worktree
# (its own bench, built there; append +jemalloc to build it with that feature).
# An argument VAR=VALUE:BINARY sets VAR for that side only (BENCH_TRUST=on:target/release/fencegate).
out=$1; rounds=$2; shift 2
here=$(cd "$(dirname "$0")/../.." && pwd)
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
export BENCH_ONLY=${BENCH_ONLY:-random1,random64} BENCH_SECONDS=${BENCH_SECONDS:-8}
: > "$out"
for r in $(seq 1 "$rounds"); do
  for side in "$@"; do
    env_set=(); d=$side
    case "$d" in *=*:*) env_set=("${d%%:*}"); d=${d#*:};; esac
    feat=""; case "$d" in *+jemalloc) feat="--features jemalloc"; d=${d%+jemalloc};; esac
    echo "=== round $r: $side (load $(cut -d' ' -f1-3 /proc/loadavg))" >> "$out"
    if [ -f "$d" ]; then
      bin=$(cd "$(dirname "$d")" && pwd)/$(basename "$d")
      (cd "$here" && env "${env_set[@]}" BENCH_FENCEGATE="$bin" cargo bench --bench load --locked 2>&1)
    else
      (cd "$d" && env "${env_set[@]}" cargo bench --bench load --locked $feat 2>&1)
    fi | grep -E "^  (fencegate|pgbench|ratio|floor)|CPU .* per ok|system CPU|^\| random|^\| one hot|^\| hot|^- " >> "$out"
  done
done
echo "=== done" >> "$out"
