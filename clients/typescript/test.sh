#!/usr/bin/env bash
# The TypeScript client's tests: installs the dev dependencies (npm) when missing, checks the
# type declarations, then runs `node --test` against a real fencegate server.
#
#   FENCEGATE_URL=http://127.0.0.1:8080 bash clients/typescript/test.sh
#
# Environment:
#   FENCEGATE_URL  (required) a running fencegate (PostgreSQL backend, auth off, on loopback)
#   DATABASE_URL   (required by the tests that start servers of their own: auth, issuers,
#                  jump cap, a hung database) a PostgreSQL database fencegate may use
#   FENCEGATE_BIN  the fencegate binary for those servers (default: target/release/fencegate,
#                  else target/debug/fencegate of this repository)
#   Needs: node >= 20.3 and npm; redis-server (Debian: apt-get install redis-server).
# Prints node's TAP summary (# pass N / # fail N); exits non-zero when anything failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

if [ -z "${FENCEGATE_URL:-}" ]; then
  cat >&2 <<'USAGE'
test.sh: FENCEGATE_URL is not set. Start a server and point the tests at it, e.g.:
  psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE fencegate_ts'
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/fencegate_ts
  target/release/fencegate serve --listen 127.0.0.1:8080 &
  FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=target/release/fencegate bash clients/typescript/test.sh
USAGE
  exit 2
fi
command -v node >/dev/null || { echo "test.sh: node not found: install Node.js 20.3 or later" >&2; exit 1; }
command -v npm >/dev/null || { echo "test.sh: npm not found: install npm (Debian: apt-get install npm)" >&2; exit 1; }
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=3)?0:1)' ||
  { echo "test.sh: node $(node --version) is too old: the client needs Node.js 20.3 or later" >&2; exit 1; }
[ -n "${DATABASE_URL:-}" ] || echo "test.sh: warning: DATABASE_URL is not set; the tests that start servers of their own will fail" >&2

if [ ! -d node_modules ] || [ ! -x node_modules/.bin/tsc ]; then
  echo "test.sh: installing dev dependencies (npm ci)" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2
fi

echo "test.sh: type check (tsc: index.d.ts as test/types.ts uses it; lib/*.js against index.d.ts)" >&2
node_modules/.bin/tsc -p tsconfig.json

# One file at a time: the lease tests measure timings that a loaded 2-core machine would skew.
exec node --test --test-reporter=tap --test-concurrency=1 test/*.test.js
