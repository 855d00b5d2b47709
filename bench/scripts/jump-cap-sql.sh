#!/usr/bin/env bash
# What kv.max_token_jump costs PostgreSQL per coalesced row, by how a statement checks it.
# pgbench, one client, synchronous_commit=off (so the figure is the statement's execution, not
# the commit's fsync), running a ROWS-row fenced upsert of existing keys in three shapes,
# interleaved:
#   off     no jump cap;
#   lookup  the cap checked on the row as locked, and every key looked up once more before the
#           insert (how a key created above the cap used to be caught);
#   trigger the cap checked on the row as locked, and a key created above it refused by an
#           AFTER INSERT trigger that fires only for rows actually inserted (what fencegate does).
# Prints statements/s and µs of PostgreSQL time per row for each. The trigger and the function
# that sets the cap are fencegate's own migration. Needs psql and pgbench.
# usage: jump-cap-sql.sh [ROUNDS] [SECONDS] [ROWS]   (defaults: 4 rounds, 8 s, 64 rows per statement)
set -euo pipefail
rounds=${1:-4}; secs=${2:-8}; n=${3:-64}
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/kv-bench-db.sh" fg_jump
psql -q "$dburl" -f "$here/migrations/postgres/20261125000004_kv_jump_on_insert.sql"
cap=3600000000
jump_on_lock="EXCLUDED.key_fence - COALESCE(kv.key_fence, 0) <= $cap"
printf '\\set s random(0, 9999)\nINSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope) SELECT w.key, w.value, w.deleted, w.token, w.token, NULL FROM (%s) w ORDER BY w.key %s WHERE %s RETURNING key, version;\n' \
  "$rows" "$set_" "$on_lock" > "$dir/off.sql"
printf '\\set s random(0, 9999)\nINSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope) SELECT w.key, w.value, w.deleted, w.token, w.token, NULL FROM (%s) w WHERE w.token - COALESCE((SELECT key_fence FROM fencegate_kv AS jf WHERE jf.key = w.key), 0) <= %s ORDER BY w.key %s WHERE %s AND %s RETURNING key, version;\n' \
  "$rows" "$cap" "$set_" "$on_lock" "$jump_on_lock" > "$dir/lookup.sql"
printf '\\set s random(0, 9999)\nWITH cap AS MATERIALIZED (SELECT pg_catalog.set_config('"'"'fencegate.kv_jump_cap'"'"', '"'"'%s'"'"', true) FROM pg_catalog.pg_trigger WHERE tgrelid = '"'"'fencegate_kv'"'"'::regclass AND tgname = '"'"'fencegate_kv_created'"'"' AND tgenabled = '"'"'A'"'"') INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope) SELECT w.key, w.value, w.deleted, w.token, w.token, NULL FROM (%s) w, cap ORDER BY w.key %s WHERE %s AND %s RETURNING key, version;\n' \
  "$cap" "$rows" "$set_" "$on_lock" "$jump_on_lock" > "$dir/trigger.sql"
tps() { PGOPTIONS='-c synchronous_commit=off' pgbench -M prepared -n -c1 -T "$secs" -f "$dir/$1.sql" "$dburl" 2>/dev/null | awk '/^tps/{print $3}'; }
echo "| round | off: statements/s (µs/row) | lookup | trigger |"
echo "|--:|--:|--:|--:|"
for r in $(seq 1 "$rounds"); do
  line="| $r |"
  for shape in off lookup trigger; do
    t=$(tps $shape)
    line+=$(printf ' %.0f (%.1f) |' "$t" "$(echo "1000000 / ($t * $n)" | bc -l)")
  done
  echo "$line"
done
