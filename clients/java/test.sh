#!/usr/bin/env bash
# The Java client's tests: compiled with plain javac, run with Debian's JUnit 5 console
# launcher against a running fencegate.
#
#   FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=/path/to/fencegate \
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/somedb bash clients/java/test.sh [launcher args]
#
# FENCEGATE_URL   the fencegate under test (auth off; on PostgreSQL for the real thing)
# FENCEGATE_BIN   its binary: some tests start servers of their own (auth, issuers, TLS, ...)
# DATABASE_URL    the PostgreSQL database those servers use (a legacy table is created in it)
# JUNIT_CONSOLE   the launcher jar (default /usr/share/java/junit-platform-console-standalone.jar,
#                 from Debian's junit5 package)
# Needs a JDK 17 or later (javac), redis-server, psql and openssl on PATH.
# Prints the launcher's tree, then one line: N passed, N failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${FENCEGATE_URL:-}" ]; then
  cat >&2 <<'MSG'
test.sh: FENCEGATE_URL is not set. Start a fencegate and point the tests at it, e.g.:
  psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE fg_javatest'
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/fg_javatest
  fencegate serve --listen 127.0.0.1:8080 &
  FENCEGATE_URL=http://127.0.0.1:8080 FENCEGATE_BIN=$(command -v fencegate) bash clients/java/test.sh
MSG
  exit 2
fi
junit=${JUNIT_CONSOLE:-/usr/share/java/junit-platform-console-standalone.jar}
[ -f "$junit" ] || { echo "test.sh: $junit not found (Debian: apt-get install junit5)" >&2; exit 2; }
command -v javac >/dev/null || { echo "test.sh: javac not found (Debian: apt-get install default-jdk-headless)" >&2; exit 2; }
major=$(javac -version 2>&1 | sed -E 's/^javac ([0-9]+).*/\1/')
[ "${major:-0}" -ge 17 ] 2>/dev/null || { echo "test.sh: $(javac -version 2>&1) is too old: the client needs JDK 17 or later" >&2; exit 2; }
for tool in redis-server psql openssl; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool not found (Debian: apt-get install redis-server postgresql-client openssl)" >&2; exit 2; }
done

out=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-java.XXXXXX")
trap 'rm -rf "$out"' EXIT
cd "$here"
javac -Xlint:all,-try -Werror --release 17 -d "$out/classes" $(find src/main/java -name '*.java')
javac --release 17 -d "$out/examples" -cp "$out/classes" examples/*.java
javac --release 17 -d "$out/test-classes" -cp "$out/classes:$junit" $(find src/test/java -name '*.java')

cp="$out/classes:$out/test-classes"
status=0
# Host is a restricted header in java.net.http; one test sends a foreign Host on purpose.
java -Djdk.httpclient.allowRestrictedHeaders=host -Dfencegate.test.classpath="$cp" \
  -jar "$junit" -cp "$cp" --select-package dev.fencegate --disable-banner --disable-ansi-colors \
  --details=tree --config=junit.jupiter.execution.timeout.default='5 m' "$@" 2>&1 | tee "$out/log" || status=$?
awk '/tests successful/ { p = $2 } /tests failed/ { f += $2 } /containers failed/ { f += $2 }
     END { printf "%d passed, %d failed\n", p, f }' "$out/log"
exit "$status"
