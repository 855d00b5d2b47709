#!/usr/bin/env bash
# Runs a command against a throwaway PostgreSQL cluster configured for it, then removes the
# cluster: to measure fencegate against a server whose settings you choose (shared_buffers sized
# to the table, say) without touching the machine's own server.
#
#   bench/scripts/cluster.sh [-c name=value]... -- COMMAND [ARGS...]
#   bench/scripts/cluster.sh -c shared_buffers=3GB -c max_wal_size=8GB -- \
#       env BENCH_ONLY=keyspace BENCH_KEYSPACE=10000,10000000 cargo bench --bench load
#
# COMMAND runs with DATABASE_URL pointing at the new cluster (user postgres, trust auth, TCP on
# 127.0.0.1, a free port). Each -c is passed to the server as `-c name=value`; everything else is
# initdb's defaults (no TLS). The cluster lives under $TMPDIR (or /tmp) and is deleted on exit,
# also after a failure or Ctrl-C. Needs the PostgreSQL server binaries (Debian: postgresql).
# initdb refuses to run as root, so as root the cluster is run as the `postgres` user.
set -euo pipefail

settings=()
while [ $# -gt 0 ]; do
  case "$1" in
    -c) settings+=("-c" "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-c name=value]... -- COMMAND [ARGS...]" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-c name=value]... -- COMMAND [ARGS...]" >&2; exit 2; }

bindir=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)}
[ -x "$bindir/initdb" ] || { echo "PostgreSQL server binaries not found (set PG_BINDIR, or apt-get install postgresql)" >&2; exit 1; }

as_owner=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "running as root needs a 'postgres' user to own the cluster" >&2; exit 1; }
  as_owner=(runuser -u postgres --)
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-cluster.XXXXXX")
chmod 755 "$dir"
[ ${#as_owner[@]} -gt 0 ] && chown postgres "$dir"
port=$((20000 + RANDOM % 20000))
while ss -Hltn "sport = :$port" | grep -q .; do port=$((20000 + RANDOM % 20000)); done

cleanup() {
  "${as_owner[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

"${as_owner[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
opts="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir"
for ((i = 1; i < ${#settings[@]}; i += 2)); do opts+=" -c ${settings[$i]}"; done
"${as_owner[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$opts" -w -t 60 start >/dev/null \
  || { cat "$dir/server.log" >&2; exit 1; }

export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
echo "throwaway cluster: $DATABASE_URL ($("$bindir/postgres" --version); settings: ${settings[*]:-defaults})" >&2
"$@"
