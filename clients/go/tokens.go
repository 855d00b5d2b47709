package fencegate

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxToken is the largest fencing token (PostgreSQL bigint): 9223372036854775807.
const MaxToken = "9223372036854775807"

// ErrInvalidToken is the cause of every token refused before anything is sent.
var ErrInvalidToken = errors.New("a fencing token is a canonical decimal integer in 0..=9223372036854775807")

// CheckToken reports whether t is a token fencegate accepts: canonical decimal (no sign,
// spaces, leading zeros, exponent), at most 9223372036854775807. Tokens are strings in this
// library, never floats (a float64 loses precision above 2^53).
func CheckToken(t string) error {
	if t == "" || len(t) > 19 || (len(t) > 1 && t[0] == '0') {
		return fmt.Errorf("%w: %q", ErrInvalidToken, t)
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return fmt.Errorf("%w: %q", ErrInvalidToken, t)
		}
	}
	if _, err := strconv.ParseInt(t, 10, 64); err != nil {
		return fmt.Errorf("%w: %q", ErrInvalidToken, t)
	}
	return nil
}

// TokenOf formats a non-negative int64 as a token (e.g. a counter your own code keeps).
func TokenOf(n int64) (string, error) {
	if n < 0 {
		return "", fmt.Errorf("%w: %d", ErrInvalidToken, n)
	}
	return strconv.FormatInt(n, 10), nil
}

// ---- adapters: the fencing token of the usual lock services ------------------------------------
//
// Each is a pure function from what the lock client hands you to the token to send. Send it
// with Token(..) under Scope(<the lock's name>), and Claim the scope right after acquiring, so
// every earlier holder is fenced at once, even on keys this holder never writes.

// EtcdRevision is the token of an etcd lock or election: the lock key's create revision
// (concurrency.Mutex: m.Header().Revision right after Lock, or the CreateRevision of m.Key();
// concurrency.Election: e.Rev() after Campaign). Revisions only grow across the cluster, so a
// later holder always has a larger one.
func EtcdRevision(rev int64) (string, error) {
	if rev <= 0 {
		return "", fmt.Errorf("%w: an etcd revision is positive, got %d", ErrInvalidToken, rev)
	}
	return strconv.FormatInt(rev, 10), nil
}

// ZooKeeperSequence is the token of a ZooKeeper lock recipe (Curator's InterProcessMutex, the
// lock recipe of go-zookeeper): the sequence number ZooKeeper appended to the holder's
// ephemeral sequential node, e.g. "/locks/job/_c_2f6a-lock-0000000042" -> "42". The counter is
// per parent node, so use one parent per lock (scope), and never delete and recreate the parent:
// its counter would start again at 0.
func ZooKeeperSequence(nodePath string) (string, error) {
	name := nodePath[strings.LastIndex(nodePath, "/")+1:]
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	digits := name[i:]
	if len(digits) < 10 {
		return "", fmt.Errorf("%w: %q does not end in a ZooKeeper sequence (10 digits)", ErrInvalidToken, nodePath)
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 {
		return "", fmt.Errorf("%w: %q", ErrInvalidToken, nodePath)
	}
	return strconv.FormatInt(n, 10), nil
}

// ZooKeeperZxid is the token of a ZooKeeper lock node by its creation zxid (Stat.Czxid of the
// holder's node): unique and increasing across the whole ensemble, whatever the parent.
func ZooKeeperZxid(czxid int64) (string, error) {
	if czxid <= 0 {
		return "", fmt.Errorf("%w: a zxid is positive, got %d", ErrInvalidToken, czxid)
	}
	return strconv.FormatInt(czxid, 10), nil
}

// RedisIncr is the token of a Redis lock whose acquisition runs INCR <lock>:fence in the same
// Lua script as SET <lock> <owner> NX PX <ttl> (so every acquisition increments once): the
// integer INCR replied (go-redis: Int64(); redigo: redis.Int64). The counter never expires.
func RedisIncr(reply int64) (string, error) {
	if reply <= 0 {
		return "", fmt.Errorf("%w: INCR replies 1 or more, got %d", ErrInvalidToken, reply)
	}
	return strconv.FormatInt(reply, 10), nil
}

// RedisFencedLockScript is the Lua script for RedisIncr: KEYS[1] the lock, KEYS[2] its counter,
// ARGV[1] the owner, ARGV[2] the ttl in ms. It returns the new token, or 0 when the lock is held.
const RedisFencedLockScript = `if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return redis.call("INCR", KEYS[2])
end
return 0`

// ---- issuer proofs --------------------------------------------------------------------------

// ProofMessage is what an [[issuers]] entry verifies: "fencegate-token-v1\n{scope}\n{token}"
// (the scope as the lock's name, not percent-encoded).
func ProofMessage(scope, token string) []byte {
	return []byte("fencegate-token-v1\n" + scope + "\n" + token)
}

// SignHMAC is the X-Fencing-Proof for an issuer configured with hmac_sha256_secret_env.
func SignHMAC(secret []byte, scope, token string) string {
	m := hmac.New(sha256.New, secret)
	m.Write(ProofMessage(scope, token))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// SignEd25519 is the X-Fencing-Proof for an issuer configured with ed25519_public_key.
func SignEd25519(key ed25519.PrivateKey, scope, token string) string {
	return base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, ProofMessage(scope, token)))
}
