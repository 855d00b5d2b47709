#!/usr/bin/env bash
# The Python client's tests, against a running fencegate.
#
#   FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=/path/to/fencegate \
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/somedb bash clients/python/test.sh [pytest args]
#
# FENCEGATE_URL  the fencegate under test (auth off; on PostgreSQL for the real thing)
# FENCEGATE_BIN  its binary: some tests start servers of their own (auth, issuers, tables, ...)
# DATABASE_URL   the PostgreSQL database those servers use (a legacy table is created in it)
# PYTHON         the interpreter for the venv (default python3; 3.9 or newer)
# Needs redis-server and psql on PATH. Creates (or reuses) clients/python/.venv and installs
# the package with its ed25519 extra, pytest and redis into it from PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${FENCEGATE_URL:-}" ]; then
  cat >&2 <<'MSG'
test.sh: FENCEGATE_URL is not set. Start a fencegate and point the tests at it, e.g.:
  psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE fg_pytest'
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/fg_pytest
  fencegate serve --listen 127.0.0.1:8080 &
  FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=$(command -v fencegate) bash clients/python/test.sh
MSG
  exit 2
fi

py=${PYTHON:-python3}
venv=$here/.venv
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" || { echo "test.sh: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 2; }
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here[ed25519]" pytest redis ||
  { echo "test.sh: pip install failed (PyPI must be reachable)" >&2; exit 2; }

cd "$here"
# -p no:cacheprovider: leave no .pytest_cache behind; -rfE: the summary names every failure
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfE --tb=short "$@"
