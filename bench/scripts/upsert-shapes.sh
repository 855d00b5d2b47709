#!/usr/bin/env bash
# What the coalesced upsert's shape costs PostgreSQL per row, against the bare upsert: pgbench, one
# client, synchronous_commit=off (the statement's execution, not the commit's fsync), ROWS
# existing keys per statement, shapes interleaved:
#   rowsonly  only the rows (generated in SQL, jsonb parsed): subtract it from the others;
#   current   fencegate's unscoped coalesced upsert (fence and scope checked in DO UPDATE .. WHERE,
#             ORDER BY key, RETURNING key, version), without the one-row CTE that sets the jump
#             cap's setting (measured apart: bench/scripts/jump-cap-sql.sh);
#   noreturn  the same without RETURNING;   noorder  without ORDER BY;   nowhere  without the WHERE;
#   minimal   ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, nothing else;
#   update    UPDATE .. FROM the rows (existing keys only), for comparison.
# Prints µs of PostgreSQL time per row for each. Needs psql and pgbench.
# usage: upsert-shapes.sh [ROUNDS] [SECONDS] [ROWS]   (defaults: 2 rounds, 5 s, 64 rows); SHAPES="a b" picks
set -euo pipefail
rounds=${1:-2}; secs=${2:-5}; n=${3:-64}
. "$(dirname "$0")/kv-bench-db.sh" fg_shapes
ins="INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope) SELECT w.key, w.value, w.deleted, w.token, w.token, NULL FROM ($rows) w"
printf '\\set s random(0, 9999)\nSELECT count(*) FROM (%s) w;\n' "$rows" > $dir/rowsonly.sql
printf '\\set s random(0, 9999)\n%s ORDER BY w.key %s WHERE %s RETURNING key, version;\n' "$ins" "$set_" "$on_lock" > $dir/current.sql
printf '\\set s random(0, 9999)\n%s ORDER BY w.key %s WHERE %s;\n' "$ins" "$set_" "$on_lock" > $dir/noreturn.sql
printf '\\set s random(0, 9999)\n%s %s WHERE %s RETURNING key, version;\n' "$ins" "$set_" "$on_lock" > $dir/noorder.sql
printf '\\set s random(0, 9999)\n%s ORDER BY w.key %s RETURNING key, version;\n' "$ins" "$set_" > $dir/nowhere.sql
printf '\\set s random(0, 9999)\n%s ORDER BY w.key ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;\n' "$ins" > $dir/minimal.sql
printf '\\set s random(0, 9999)\nUPDATE fencegate_kv AS kv SET value = w.value, fence_token = w.token, key_fence = w.token, version = kv.version + 1, updated_at = now() FROM (%s) w WHERE kv.key = w.key AND kv.key_fence <= w.token RETURNING kv.key, kv.version;\n' "$rows" > $dir/update.sql
tps() { PGOPTIONS='-c synchronous_commit=off' pgbench -M prepared -n -c1 -T "$secs" -f "$dir/$1.sql" "$dburl" 2>/dev/null | awk '/^tps/{print $3}'; }
shapes=${SHAPES:-rowsonly current noreturn noorder nowhere minimal update}
for r in $(seq 1 "$rounds"); do
  line="round $r:"
  for shape in $shapes; do
    t=$(tps $shape)
    line+=$(printf ' %s %.1f µs/row |' $shape "$(echo "1000000 / ($t * $n)" | bc -l)")
  done
  echo "$line"
done
