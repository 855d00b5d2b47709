package dev.fencegate;

/**
 * Fencing tokens: canonical decimal strings in {@code 0..=9223372036854775807}, never floats
 * (a double loses precision above 2^53). And adapters: the token of the usual lock services,
 * each a pure function from what the lock client hands you to the token to send. Send it with
 * the lock's name as the scope, and {@link Fencegate#claim} the scope right after acquiring, so
 * every earlier holder is fenced at once, even on keys this holder never writes.
 */
public final class Tokens {
    private Tokens() {}

    /** The largest token (PostgreSQL bigint). */
    public static final String MAX = "9223372036854775807";

    /** The token itself, if it is canonical decimal in range; else IllegalArgumentException. */
    public static String check(String token) {
        if (token == null || token.isEmpty() || token.length() > 19 || (token.length() > 1 && token.charAt(0) == '0')) {
            throw invalid(token);
        }
        for (int i = 0; i < token.length(); i++) {
            char c = token.charAt(i);
            if (c < '0' || c > '9') throw invalid(token);
        }
        try {
            Long.parseLong(token);
        } catch (NumberFormatException e) {
            throw invalid(token);
        }
        return token;
    }

    private static IllegalArgumentException invalid(Object t) {
        return new IllegalArgumentException(
                "a fencing token is a canonical decimal integer in 0..=" + MAX + ", got " + (t == null ? "null" : "\"" + t + "\""));
    }

    /** A non-negative long as a token. */
    public static String of(long n) {
        if (n < 0) throw invalid(n);
        return Long.toString(n);
    }

    /**
     * Redisson's {@code RFencedLock}: the token {@code lock.lockAndGetToken()} (or
     * {@code tryLockAndGetToken}) returned. Null (the lock was not taken) is refused.
     */
    public static String redisson(Long lockAndGetToken) {
        if (lockAndGetToken == null || lockAndGetToken <= 0) throw invalid(lockAndGetToken);
        return Long.toString(lockAndGetToken);
    }

    /**
     * A Redis lock whose acquisition runs {@code INCR <lock>:fence} in the same Lua script as
     * {@code SET <lock> <owner> NX PX <ttl>} ({@link #REDIS_FENCED_LOCK_SCRIPT}): the integer INCR
     * replied. The counter never expires.
     */
    public static String redisIncr(long reply) {
        if (reply <= 0) throw invalid(reply);
        return Long.toString(reply);
    }

    /** KEYS[1] the lock, KEYS[2] its counter, ARGV[1] the owner, ARGV[2] the ttl in ms; 0 when held. */
    public static final String REDIS_FENCED_LOCK_SCRIPT = """
            if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
              return redis.call("INCR", KEYS[2])
            end
            return 0""";

    /**
     * ZooKeeper's lock recipe (Curator's {@code InterProcessMutex}): the sequence number ZooKeeper
     * appended to the holder's ephemeral sequential node, e.g.
     * {@code "/locks/job/_c_2f6a-lock-0000000042"} gives {@code "42"}. With Curator, holding the
     * mutex, the holder's node is the first of {@code mutex.getParticipantNodes()}. The counter is
     * per parent node: one parent per lock, never deleted and recreated.
     */
    public static String zooKeeperSequence(String nodePath) {
        String name = nodePath.substring(nodePath.lastIndexOf('/') + 1);
        int i = name.length();
        while (i > 0 && Character.isDigit(name.charAt(i - 1)) && name.charAt(i - 1) < 128) i--;
        String digits = name.substring(i);
        if (digits.length() < 10) {
            throw new IllegalArgumentException("\"" + nodePath + "\" does not end in a ZooKeeper sequence (10 digits)");
        }
        return Long.toString(Long.parseLong(digits));
    }

    /** A ZooKeeper lock node by its creation zxid ({@code Stat.getCzxid()}): increasing across the ensemble. */
    public static String zooKeeperZxid(long czxid) {
        if (czxid <= 0) throw invalid(czxid);
        return Long.toString(czxid);
    }

    /** etcd: the lock key's create revision ({@code LockResponse}'s header revision, or an election's). */
    public static String etcdRevision(long revision) {
        if (revision <= 0) throw invalid(revision);
        return Long.toString(revision);
    }

    /** Hazelcast's {@code FencedLock.lockAndGetFence()}. */
    public static String hazelcastFence(long fence) {
        if (fence <= 0) throw invalid(fence);
        return Long.toString(fence);
    }
}
