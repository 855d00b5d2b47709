#!/bin/sh
# redis-lock.sh: take a lock in a single Redis node, then write to fencegate with the lock's
# fencing token.
#
# Usage:
#   examples/redis-lock.sh FENCEGATE_URL LOCK OWNER TTL_MS KEY VALUE WORK_SECONDS
#
#   FENCEGATE_URL  e.g. http://127.0.0.1:8080
#   LOCK           the lock's name. It is also sent as X-Fencing-Scope, so every key written
#                  under this lock is guarded by the same fence.
#   OWNER          who holds the lock. Make it unique per client, e.g. "$(hostname):$$". The
#                  release step checks it before deleting the lock.
#   TTL_MS         how long the lock lives, in milliseconds (SET ... PX)
#   KEY            the fencegate key to write (PUT /v1/kv/KEY)
#   VALUE          the value to write, as JSON text, e.g. '{"n":1}' or '"hello"'
#   WORK_SECONDS   how long to "work" while holding the lock, before writing (passed to sleep)
#
#   Environment: FENCEGATE_API_KEY (sent as Authorization: Bearer, when fencegate has auth on),
#                REDIS_URL (default redis://127.0.0.1:6379),
#                REDIS_LOCK_PREFIX (default "fencegate:lock:").
#   FENCEGATE_SIGN (optional): a command that signs the token for fencegate's [[issuers]]
#                check; called as $FENCEGATE_SIGN --scope LOCK --token N, it prints the proof.
#   Needs: redis-cli (Debian: redis-tools), curl, jq.
#
# Output on stdout, one key=value per line:
#   token=N        right after the lock is taken, before the work
#   ttl_ms=N       the lock's TTL
#   status=NNN     the HTTP status of the write
# Diagnostics and fencegate's error body go to stderr.
#
# Exit status: 0 the write was accepted (2xx); 3 the write was rejected as stale (412: a newer
# holder has written since); 2 the lock is held by someone else (nothing was written);
# 1 any other error (usage, Redis or fencegate unreachable, another HTTP status).
#
# How the lock and its token work:
# A single Lua script runs two commands atomically, because Redis runs a script as one unit:
#     SET <prefix><LOCK> OWNER NX PX TTL_MS     take the lock only if nobody holds it
#     INCR <prefix><LOCK>:fence                 and only then, mint the next token
# The token is the value INCR returns. The :fence counter never expires and is never deleted.
# Each successful acquisition increments it exactly once, in the same atomic step that takes the
# lock, so a later holder of LOCK always has a larger token than every earlier holder. That makes
# the token monotonic per lock, which is all fencegate needs: it accepts a write only if its
# token is >= the highest token it has already accepted for the scope LOCK. Suppose this process
# stalls past its TTL (GC, a VM pause, a partition) and someone else takes the lock and writes.
# When this process wakes up, its write carries a smaller token and gets a 412. The lock alone
# cannot stop that write: the lock has expired, but the stalled process does not know it.
#
# Caveats: this relies on the counter never going backwards. Use one Redis node with persistence
# (appendonly yes). An async replica promoted after a failover, or a restart without the data,
# can lose increments. If that happens, fencegate keeps the higher fence, so writes fail with 412
# rather than overwrite newer data. To recover, raise the counter above fencegate's fence:
# GET /v1/fences/LOCK, then SET <prefix><LOCK>:fence to that value.
set -eu

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  exit 1
}
die() {
  echo "redis-lock: $*" >&2
  exit 1
}

[ "$#" -eq 7 ] || usage
fencegate=${1%/}
lock=$2
owner=$3
ttl_ms=$4
key=$5
value=$6
work=$7

redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
prefix=${REDIS_LOCK_PREFIX-fencegate:lock:}
lock_key=$prefix$lock
fence_key=$prefix$lock:fence

for tool in redis-cli curl jq; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (Debian: apt-get install redis-tools curl jq)"
done
case $ttl_ms in
  '' | *[!0-9]* | 0) die "TTL_MS must be a positive integer of milliseconds, got '$ttl_ms'" ;;
esac
[ -n "$lock" ] || die "LOCK must not be empty"
[ -n "$owner" ] || die "OWNER must not be empty"
[ -n "$key" ] || die "KEY must not be empty"
# Check the value before taking the lock.
if [ -z "$value" ] || ! printf '%s' "$value" | jq -e -s 'length == 1' >/dev/null 2>&1; then
  die "VALUE must be one JSON value, e.g. '\"hello\"' or '{\"n\":1}', got '$value'"
fi

redis() {
  redis-cli --no-auth-warning -u "$redis_url" "$@"
}

# Take the lock and mint a token in one atomic step. The script returns 0 when the lock is held:
# INCR never returns 0, so 0 cannot be a token.
acquire='
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return redis.call("INCR", KEYS[2])
end
return 0'
# Release only our own lock. After a stall, the key may belong to the next holder.
release='
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0'

reply=$(redis EVAL "$acquire" 2 "$lock_key" "$fence_key" "$owner" "$ttl_ms") ||
  die "cannot reach Redis at $redis_url"
case $reply in
  '' | *[!0-9]*) die "unexpected reply from Redis: $reply" ;;
  0)
    holder=$(redis GET "$lock_key" || true)
    left=$(redis PTTL "$lock_key" || true)
    echo "redis-lock: lock '$lock' is held by '$holder' for another ${left}ms" >&2
    exit 2
    ;;
esac
token=$reply
echo "token=$token"
echo "ttl_ms=$ttl_ms"

sleep "$work"

# The key is one path segment: percent-encode it.
path=$(jq -rn --arg k "$key" '$k | @uri')
# The last line of curl's output is the status; everything above it is the body.
# The scope is spelled like a path segment: percent-encoded, as /v1/locks/{name} would be.
scope=$(jq -rn --arg k "$lock" '$k | @uri')
set -- -H "X-Fencing-Token: $token" -H "X-Fencing-Scope: $scope"
# With authentication on, the key of this service (FENCEGATE_API_KEY) is the bearer.
if [ -n "${FENCEGATE_API_KEY:-}" ]; then
  set -- "$@" -H "Authorization: Bearer $FENCEGATE_API_KEY"
fi
# A fencegate with an [[issuers]] entry for this scope wants the token signed: FENCEGATE_SIGN
# is the signer, called with --scope LOCK --token N, printing X-Fencing-Proof (e.g.
# "fencegate sign --hmac-secret-env LOCK_SIGNING_SECRET", run where the secret lives).
if [ -n "${FENCEGATE_SIGN:-}" ]; then
  proof=$($FENCEGATE_SIGN --scope "$lock" --token "$token") || die "the signer failed: $FENCEGATE_SIGN"
  set -- "$@" -H "X-Fencing-Proof: $proof"
fi
resp=$(curl -sS --max-time 30 -X PUT "$@" \
  -H 'Content-Type: application/json' \
  --data-binary "$value" \
  -w '\n%{http_code}' \
  "$fencegate/v1/kv/$path") || {
  redis EVAL "$release" 1 "$lock_key" "$owner" >/dev/null 2>&1 || true
  die "request to $fencegate failed"
}
status=$(printf '%s\n' "$resp" | tail -n 1)
body=$(printf '%s\n' "$resp" | sed '$d')
echo "status=$status"

redis EVAL "$release" 1 "$lock_key" "$owner" >/dev/null 2>&1 || true

case $status in
  2??) exit 0 ;;
  412)
    echo "redis-lock: fencegate rejected token $token as stale (412); a newer holder of '$lock' has written:" >&2
    printf '%s\n' "$body" >&2
    exit 3
    ;;
  *)
    echo "redis-lock: fencegate answered $status:" >&2
    printf '%s\n' "$body" >&2
    exit 1
    ;;
esac
