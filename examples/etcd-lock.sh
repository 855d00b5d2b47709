#!/bin/sh
# etcd-lock.sh: take a lock in etcd, then write to fencegate with the lock's fencing token.
# Uses etcd's v3 JSON gateway over HTTP (etcd >= 3.4), so it needs only curl and jq.
#
# Usage:
#   examples/etcd-lock.sh FENCEGATE_URL LOCK OWNER TTL_MS KEY VALUE WORK_SECONDS
#
#   FENCEGATE_URL  e.g. http://127.0.0.1:8080
#   LOCK           the lock's name. It is also sent as X-Fencing-Scope, so every key written
#                  under this lock is guarded by the same fence.
#   OWNER          who holds the lock (stored as the lock key's value, for diagnostics)
#   TTL_MS         the lease TTL, in milliseconds. etcd leases are whole seconds, so this is
#                  rounded up. etcd also has a minimum TTL: with the default election timeout it
#                  is 2s, and it grants at least that. The TTL etcd actually granted is printed.
#   KEY            the fencegate key to write (PUT /v1/kv/KEY)
#   VALUE          the value to write, as JSON text, e.g. '{"n":1}' or '"hello"'
#   WORK_SECONDS   how long to "work" while holding the lock, before writing (passed to sleep)
#
#   Environment: FENCEGATE_API_KEY (sent as Authorization: Bearer, when fencegate has auth on),
#                ETCD_ENDPOINT (default http://127.0.0.1:2379),
#                ETCD_LOCK_PREFIX (default "fencegate/locks/").
#   FENCEGATE_SIGN (optional): a command that signs the token for fencegate's [[issuers]]
#                check; called as $FENCEGATE_SIGN --scope LOCK --token N, it prints the proof.
#   Needs: curl, jq.
#
# Output on stdout, one key=value per line:
#   token=N        right after the lock is taken, before the work
#   ttl_ms=N       the lease TTL etcd granted
#   status=NNN     the HTTP status of the write
# Diagnostics and fencegate's error body go to stderr.
#
# Exit status: 0 the write was accepted (2xx); 3 the write was rejected as stale (412: a newer
# holder has written since); 2 the lock is held by someone else (nothing was written);
# 1 any other error (usage, etcd or fencegate unreachable, another HTTP status).
#
# How the lock and its token work:
#   POST /v3/lease/grant {"TTL": s}    a lease that etcd revokes s seconds from now
#   POST /v3/kv/txn                    if create_revision(<prefix><LOCK>) == 0, that is, the key
#                                      does not exist: put the key with the lease, and read it back
# The token is the lock key's create_revision. etcd has one revision counter for the whole
# cluster. Every write raises it, raft replicates it, and it never goes down. The next holder can
# create the key only after this holder's key is gone (the lease expired or was revoked). Deleting
# the key is itself a write, so the next holder's create_revision is strictly larger. That makes
# the token monotonic per lock, which is all fencegate needs: it accepts a write only if its
# token is >= the highest token it has already accepted for the scope LOCK. Suppose this process
# stalls past its lease (GC, a VM pause, a partition), etcd deletes the key, someone else takes
# the lock and writes. When this process wakes up, its write carries a smaller token and gets a
# 412. etcd's own lock (concurrency.Mutex, `etcdctl lock`) orders waiters by the same revision.
#
# A long-running client would keep the lease alive in the background (POST /v3/lease/keepalive)
# while it works. Renewing does not change the token. Fencing protects the data when renewals stop
# because the client stalls. Caveat: the token relies on revisions never going back. Restoring
# an old snapshot rewinds them, so bump the revision on restore (etcdutl snapshot restore
# --bump-revision). Otherwise fencegate keeps the higher fence and writes fail with 412 rather
# than overwrite newer data.
set -eu

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  exit 1
}
die() {
  echo "etcd-lock: $*" >&2
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

endpoint=${ETCD_ENDPOINT:-http://127.0.0.1:2379}
endpoint=${endpoint%/}
lock_key=${ETCD_LOCK_PREFIX-fencegate/locks/}$lock

for tool in curl jq; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (Debian: apt-get install curl jq)"
done
case $ttl_ms in
  '' | *[!0-9]* | 0) die "TTL_MS must be a positive integer of milliseconds, got '$ttl_ms'" ;;
esac
[ -n "$lock" ] || die "LOCK must not be empty"
[ -n "$key" ] || die "KEY must not be empty"
# Check the value before taking the lock.
if [ -z "$value" ] || ! printf '%s' "$value" | jq -e -s 'length == 1' >/dev/null 2>&1; then
  die "VALUE must be one JSON value, e.g. '\"hello\"' or '{\"n\":1}', got '$value'"
fi

# etcd_post PATH JSON: POST to the gateway and print the reply. Fails if the reply is an error.
etcd_post() {
  _out=$(curl -sS --max-time 10 -X POST -H 'Content-Type: application/json' \
    --data-binary "$2" "$endpoint$1") || die "cannot reach etcd at $endpoint"
  if ! printf '%s' "$_out" | jq -e 'type == "object" and (has("error") | not)' >/dev/null 2>&1; then
    echo "etcd-lock: etcd $1 failed: $_out" >&2
    return 1
  fi
  printf '%s\n' "$_out"
}
# Revoking the lease deletes the lock key only if it is still attached to our lease. After a
# stall, the lease has expired already and the key may belong to the next holder, which is safe.
release() {
  etcd_post /v3/lease/revoke "$(jq -cn --arg id "$lease" '{ID: $id}')" >/dev/null 2>&1 || true
}

ttl_s=$(((ttl_ms + 999) / 1000))
grant=$(etcd_post /v3/lease/grant "$(jq -cn --argjson ttl "$ttl_s" '{TTL: $ttl}')") || exit 1
lease=$(printf '%s' "$grant" | jq -r '.ID')
granted_s=$(printf '%s' "$grant" | jq -r '.TTL')
case $lease$granted_s in
  '' | *[!0-9]*) die "unexpected lease grant reply: $grant" ;;
esac
if [ "$granted_s" -ne "$ttl_s" ]; then
  echo "etcd-lock: asked for a ${ttl_s}s lease, etcd granted ${granted_s}s" >&2
fi

# Numbers that do not fit in a double (lease IDs, revisions) stay strings in etcd's JSON.
txn=$(jq -cn --arg k "$lock_key" --arg v "$owner" --arg lease "$lease" '
  ($k | @base64) as $key
  | {
      compare: [{target: "CREATE", result: "EQUAL", key: $key, create_revision: "0"}],
      success: [
        {request_put: {key: $key, value: ($v | @base64), lease: $lease}},
        {request_range: {key: $key}}
      ],
      failure: [{request_range: {key: $key}}]
    }')
reply=$(etcd_post /v3/kv/txn "$txn") || {
  release
  exit 1
}
if [ "$(printf '%s' "$reply" | jq -r '.succeeded == true')" != true ]; then
  holder=$(printf '%s' "$reply" | jq -r '.responses[0].response_range.kvs[0].value // "" | @base64d')
  release
  echo "etcd-lock: lock '$lock' is held by '$holder'" >&2
  exit 2
fi
token=$(printf '%s' "$reply" | jq -r --arg lease "$lease" '
  .responses[1].response_range.kvs[0]
  | if .lease == $lease then .create_revision else empty end')
case $token in
  '' | *[!0-9]*)
    release
    die "unexpected txn reply: $reply"
    ;;
esac
echo "token=$token"
echo "ttl_ms=$((granted_s * 1000))"

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
  release
  die "request to $fencegate failed"
}
status=$(printf '%s\n' "$resp" | tail -n 1)
body=$(printf '%s\n' "$resp" | sed '$d')
echo "status=$status"

release

case $status in
  2??) exit 0 ;;
  412)
    echo "etcd-lock: fencegate rejected token $token as stale (412); a newer holder of '$lock' has written:" >&2
    printf '%s\n' "$body" >&2
    exit 3
    ;;
  *)
    echo "etcd-lock: fencegate answered $status:" >&2
    printf '%s\n' "$body" >&2
    exit 1
    ;;
esac
