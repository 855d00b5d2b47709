#!/usr/bin/env bash
# What fencegate.fence() costs a SQL writer: pgbench, one client, a transaction per run of
#   plain:  BEGIN; UPDATE jobs SET n = n + 1 WHERE id = :id; COMMIT;
#   fenced: BEGIN; SELECT fencegate.fence('job-' || :id, 1); UPDATE ...; COMMIT;
# on a guarded table (the trigger checks fence()'s record on every row) and on the same table
# unguarded, against a throwaway database beside DATABASE_URL's that fencegate migrates and
# configures itself (the fence() and trigger bodies are the ones its start writes).
#
#   FENCEGATE_BIN=target/release/fencegate DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
#     bash bench/scripts/sql-fence.sh [seconds]
#
# BEFORE_SQL=FILE: a SQL file run (psql, as DATABASE_URL's user, with the variable fg set to
# fencegate's role) after fencegate's start, e.g. to put back an older fence() and guard, to
# compare like with like. Prints one line per shape: transactions/s and the mean latency. Needs pgbench and psql; runs
# fencegate as a role of its own (created here, dropped on exit), as a guard requires.
set -euo pipefail
seconds=${1:-10}
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
bin=${FENCEGATE_BIN:-target/release/fencegate}
db=sqlfence_$$
fg=sqlfence_fg_$$
app=sqlfence_app_$$
dir=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  psql -q "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  psql -q "$url" -c "DROP ROLE IF EXISTS $fg" -c "DROP ROLE IF EXISTS $app" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
psql -q "$url" -c "CREATE DATABASE $db" -c "CREATE ROLE $fg LOGIN" -c "CREATE ROLE $app LOGIN"
dburl=${url%/*}/$db
as() { local u=${dburl#*://}; u=${u#*@}; echo "postgres://$1@$u"; }
psql -q "$dburl" <<EOF
CREATE SCHEMA fencegate AUTHORIZATION $fg;
CREATE TABLE jobs (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE TABLE free (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
INSERT INTO jobs SELECT g FROM generate_series(1, 1000) g;
INSERT INTO free SELECT g FROM generate_series(1, 1000) g;
ALTER TABLE jobs OWNER TO $app; ALTER TABLE free OWNER TO $app;
GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO $fg;
VACUUM ANALYZE jobs; VACUUM ANALYZE free;
EOF
cat > "$dir/fencegate.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[[resources]]
name = "jobs"
table = "public.jobs"
key = ["id"]
scope = "job"
guard = "enforce"
[[auth.roles]]
name = "$app"
prefixes = ["job"]
EOF
# The first start stops with the owner's DDL; the owner runs it; the second start migrates,
# writes fence() and checks the trigger.
DATABASE_URL=$(as "$fg") "$bin" guard sql --config "$dir/fencegate.toml" | grep -v '^--' | psql -q "$(as "$app")"
DATABASE_URL=$(as "$fg") "$bin" serve --config "$dir/fencegate.toml" >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q 'listening' "$dir/log" && break; sleep 0.1; done
grep -q 'listening' "$dir/log" || { cat "$dir/log"; exit 1; }
if [ -n "${BEFORE_SQL:-}" ]; then
  psql -q -v ON_ERROR_STOP=1 -v fg="$fg" "$dburl" -f "$BEFORE_SQL"
  psql -q "$dburl" -c "ALTER FUNCTION fencegate.fence(text, bigint) OWNER TO $fg" -c "GRANT EXECUTE ON FUNCTION fencegate.fence(text, bigint) TO $app"
fi
# A guarded table's fences are all under the scope "job": one scope, one row lock per
# transaction, as a single writer has it.
cat > "$dir/plain.sql" <<'EOF'
\set id random(1, 1000)
BEGIN;
UPDATE free SET n = n + 1 WHERE id = :id;
COMMIT;
EOF
cat > "$dir/fenced-free.sql" <<'EOF'
\set id random(1, 1000)
BEGIN;
SELECT fencegate.fence('job', 1);
UPDATE free SET n = n + 1 WHERE id = :id;
COMMIT;
EOF
cat > "$dir/fenced-guarded.sql" <<'EOF'
\set id random(1, 1000)
BEGIN;
SELECT fencegate.fence('job', 1);
UPDATE jobs SET n = n + 1 WHERE id = :id;
COMMIT;
EOF
run() {
  local out
  out=$(pgbench -n -c 1 -T "$seconds" -f "$dir/$1.sql" "$(as "$app")" 2>&1)
  printf '%-40s %10s tps  %8s ms/tx\n' "$2" \
    "$(awk '/^tps/ {print int($3)}' <<<"$out")" "$(awk '/latency average/ {print $4}' <<<"$out")"
}
run plain "plain UPDATE (unguarded table)"
run fenced-free "fence() + UPDATE (unguarded table)"
run fenced-guarded "fence() + UPDATE (guarded table)"
