# Sourced by the PostgreSQL-only microbenchmarks (jump-cap-sql.sh, upsert-shapes.sh): a throwaway
# database named "$1_$$" beside DATABASE_URL's, dropped on exit, with a table shaped as fencegate's
# kv table (fillfactor 90) holding 10,000 keys 'bench-key-0' .. 'bench-key-9999' whose fences lie
# a minute behind the clock in µs. Sets url, db, dburl and dir (a temporary directory, removed on exit),
# and the parts of fencegate's unscoped coalesced upsert: rows ($n distinct existing keys from pgbench's
# :s, each value parsed as jsonb, tokens from the clock), set_ (its ON CONFLICT .. DO UPDATE SET) and
# on_lock (its fence and scope checks on the row as locked).
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=$1_$$
dir=$(mktemp -d)
cleanup() { psql -q "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true; rm -rf "$dir"; }
trap cleanup EXIT
psql -q "$url" -c "CREATE DATABASE $db"
dburl=${url%/*}/$db
psql -q "$dburl" <<'EOF'
CREATE TABLE fencegate_kv (key text PRIMARY KEY, value jsonb, deleted boolean NOT NULL DEFAULT false,
    key_fence bigint NOT NULL DEFAULT 0 CHECK (key_fence >= 0), fence_token bigint NOT NULL CHECK (fence_token >= 0),
    scope text, version bigint NOT NULL DEFAULT 1, updated_at timestamptz NOT NULL DEFAULT now()) WITH (fillfactor = 90);
INSERT INTO fencegate_kv (key, value, key_fence, fence_token)
    SELECT 'bench-key-' || g, '{}', (extract(epoch FROM clock_timestamp()) * 1e6)::int8 - 60000000, 0 FROM generate_series(0, 9999) g;
VACUUM ANALYZE fencegate_kv;
EOF
rows="SELECT 'bench-key-' || ((:s + g * 137) % 10000) AS key, ('{\"n\": ' || g || ', \"by\": \"bench\"}')::jsonb AS value,
    false AS deleted, (extract(epoch FROM clock_timestamp()) * 1e6)::int8 + g AS token FROM generate_series(1, $n) g"
set_="ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, deleted = EXCLUDED.deleted, fence_token = EXCLUDED.fence_token,
    scope = EXCLUDED.scope, key_fence = GREATEST(kv.key_fence, EXCLUDED.key_fence),
    version = CASE WHEN kv.deleted THEN 1 ELSE kv.version + 1 END, updated_at = now()"
on_lock="kv.key_fence <= EXCLUDED.key_fence AND kv.scope IS NOT DISTINCT FROM EXCLUDED.scope"
