#!/usr/bin/env bash
# The Go client's tests (`go test ./...`, offline: standard library only), against a running
# fencegate.
#
#   FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=/path/to/fencegate \
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/somedb bash clients/go/test.sh [go test args]
#
# FENCEGATE_URL  the fencegate under test (auth off; on PostgreSQL for the real thing)
# FENCEGATE_BIN  its binary: some tests start servers of their own (auth, issuers, TLS, ...)
# DATABASE_URL   the PostgreSQL database those servers use (a legacy table is created in it)
# Needs go 1.19 or later (Debian: apt-get install golang-go), redis-server and psql on PATH.
# Prints go test's verbose output, then one line: N passed, N failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${FENCEGATE_URL:-}" ]; then
  cat >&2 <<'MSG'
test.sh: FENCEGATE_URL is not set. Start a fencegate and point the tests at it, e.g.:
  psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE fg_gotest'
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/fg_gotest
  fencegate serve --listen 127.0.0.1:8080 &
  FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=$(command -v fencegate) bash clients/go/test.sh
MSG
  exit 2
fi
command -v go >/dev/null || { echo "test.sh: go not found (Debian: apt-get install golang-go)" >&2; exit 2; }
for tool in redis-server psql; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool not found (Debian: apt-get install redis-server postgresql-client)" >&2; exit 2; }
done

# Offline: no module proxy, no checksum database; the build cache in the user's cache dir (or
# a temp dir when there is no home).
export GOPROXY=off GOSUMDB=off GOFLAGS= GOTOOLCHAIN=local
if [ -z "${HOME:-}" ] || [ ! -w "${HOME:-/nonexistent}" ]; then
  export GOCACHE=${GOCACHE:-${TMPDIR:-/tmp}/fencegate-go-cache}
fi

cd "$here"
go vet ./...
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# -p 1, no -parallel: the lease tests measure timings that a loaded 2-core machine would skew.
go test -count=1 -p 1 -timeout 15m -v "$@" ./... 2>&1 | tee "$log" || status=$?
awk '/^--- PASS/ { p++ } /^--- FAIL/ { f++ } END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
