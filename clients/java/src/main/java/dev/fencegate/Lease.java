package dev.fencegate;

import dev.fencegate.Results.BatchResult;
import dev.fencegate.Results.DeleteResult;
import dev.fencegate.Results.Entry;
import dev.fencegate.Results.Fence;
import dev.fencegate.Results.Grant;
import dev.fencegate.Results.WriteResult;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * A held built-in lock, renewed in the background every ttl/3 until {@link #close()}d or lost.
 * Its writes carry its token and scope.
 *
 * <p>Lost means: a renew was refused (409 lock-lost, 403); no renew succeeded before the
 * lease's expiry (on this process's monotonic clock, from just before the grant or the last
 * renew was sent, less a margin of max(ttl/10, 100 ms), at most ttl/3: a process frozen past
 * its lease knows it when it wakes); or a write under it was refused as stale (412) or as a
 * token its lock no longer vouches for (422 token-not-issued under its scope). Then
 * {@link #lost()} completes and every write under the lease throws {@link LeaseLostException}
 * without sending anything.
 */
public final class Lease implements AutoCloseable {
    private final Fencegate client;
    private final String name;
    private final long ttlNanos, everyNanos, marginNanos;
    private final Duration ttl;
    private final CompletableFuture<Void> lost = new CompletableFuture<>();
    private final ScheduledExecutorService renewer;

    private volatile Grant grant;
    private long deadline; // System.nanoTime()
    private long next;
    private LeaseLostException lostError;
    private boolean released;

    private Lease(Fencegate client, String name, Duration ttl, Duration every, Grant grant, long sentAt) {
        this.client = client;
        this.name = name;
        this.ttl = ttl;
        this.ttlNanos = ttl.toNanos();
        this.everyNanos = every != null && !every.isZero() && !every.isNegative() ? every.toNanos() : ttlNanos / 3;
        this.marginNanos = Math.min(Math.max(ttlNanos / 10, TimeUnit.MILLISECONDS.toNanos(100)), ttlNanos / 3);
        this.grant = grant;
        this.deadline = sentAt + ttlNanos - marginNanos;
        this.next = sentAt + everyNanos;
        this.renewer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "fencegate-lease-" + name);
            t.setDaemon(true);
            return t;
        });
        schedule();
    }

    static Lease acquire(Fencegate c, String name, Duration ttl, String owner, Duration wait, Duration every) {
        if (ttl == null || ttl.toMillis() < 1) throw new IllegalArgumentException("a lease's ttl is at least 1 ms");
        long until = System.nanoTime() + (wait == null ? 0 : wait.toNanos());
        while (true) {
            long sent = System.nanoTime();
            try {
                Grant g = c.acquire(name, ttl, owner);
                return new Lease(c, name, ttl, every, g, sent);
            } catch (LockHeldException | UnavailableException | TransportException e) {
                long left = until - System.nanoTime();
                if (left <= 0) throw e;
                long pause = 250;
                if (e instanceof LockHeldException h) pause = Math.min(Math.max(h.remainingMs(), 20), 1000);
                pause = (long) (pause * (0.8 + 0.4 * ThreadLocalRandom.current().nextDouble()));
                pause = Math.min(pause, TimeUnit.NANOSECONDS.toMillis(left) + 1);
                try {
                    Thread.sleep(pause);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
            }
        }
    }

    /** The lock's name. */
    public String name() {
        return name;
    }

    /** This lease's fencing token: a decimal string. */
    public String token() {
        return grant.token();
    }

    /** The scope its writes go under: the lock's name. */
    public String scope() {
        return grant.scope();
    }

    /** The server's last grant or renew answer. */
    public Grant grant() {
        return grant;
    }

    /** Completed (normally) when the lease is lost; not when it is closed. */
    public CompletableFuture<Void> lost() {
        check0();
        return lost;
    }

    /** Why the lease was lost, or null while it is not. */
    public synchronized LeaseLostException lostReason() {
        check0();
        return lostError;
    }

    /** True while held: neither lost nor closed. */
    public synchronized boolean isHeld() {
        check0();
        return lostError == null && !released;
    }

    /** Throws the {@link LeaseLostException} if the lease is no longer held (between steps of long work). */
    public synchronized void check() {
        check0();
        if (lostError != null) throw lostError;
        if (released) throw new LeaseLostException(name, grant.token(), "it was closed", null);
    }

    private synchronized void check0() {
        if (lostError == null && !released && System.nanoTime() - deadline >= 0) {
            lose(null, "its expiry passed without a successful renew");
        }
    }

    private synchronized void lose(Throwable cause, String why) {
        if (lostError != null || released) return;
        lostError = new LeaseLostException(name, grant.token(), why, cause);
        lost.complete(null);
        renewer.shutdown();
    }

    private synchronized void schedule() {
        if (lostError != null || released) return;
        long wake = Math.min(next - System.nanoTime(), deadline - System.nanoTime());
        try {
            renewer.schedule(this::tick, Math.max(0, wake), TimeUnit.NANOSECONDS);
        } catch (java.util.concurrent.RejectedExecutionException closing) {
            // closed meanwhile
        }
    }

    private void tick() {
        long deadlineNow;
        synchronized (this) {
            check0();
            if (lostError != null || released) return;
            if (System.nanoTime() - next < 0) {
                schedule();
                return;
            }
            deadlineNow = deadline;
        }
        long sent = System.nanoTime();
        try {
            Grant g = client.renew(name, grant.token(), ttl);
            synchronized (this) {
                if (lostError != null || released) return;
                grant = g;
                deadline = sent + ttlNanos - marginNanos;
                next = sent + everyNanos;
            }
        } catch (LockLostException | ForbiddenException refused) {
            lose(refused, "a renew was refused");
            return;
        } catch (RuntimeException unknown) { // no answer, 503, a timeout: again soon, until the deadline
            synchronized (this) {
                if (released) return;
                next = System.nanoTime() + Math.max(ttlNanos / 10, TimeUnit.MILLISECONDS.toNanos(10));
            }
        }
        schedule();
        if (System.nanoTime() - deadlineNow >= 0) check0();
    }

    /**
     * Stops renewing and releases the lock. Closing a lost lease is not an error (the lock is
     * released if the server still counts it as ours); a second close does nothing.
     */
    @Override
    public void close() {
        boolean wasLost;
        synchronized (this) {
            if (released) return;
            check0();
            wasLost = lostError != null;
            released = true;
        }
        renewer.shutdownNow();
        try {
            renewer.awaitTermination(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try {
            client.release(name, grant.token());
        } catch (LockLostException notOurs) {
            // lost already: nothing to release
        } catch (FencegateException e) {
            if (!wasLost) throw e;
        }
    }

    private <T> T write(Supplier<T> w) {
        check();
        try {
            return w.get();
        } catch (StaleTokenException e) {
            lose(e, "a write under it was refused as stale");
            throw e;
        } catch (TokenNotIssuedException e) {
            if (scope().equals(e.scope())) lose(e, "a write under it was refused: its lock no longer vouches for the token");
            throw e;
        }
    }

    /** Writes JSON text to key under the lease. */
    public WriteResult put(String key, String valueJson) {
        return write(() -> client.put(key, valueJson, token(), scope()));
    }

    /** Writes a value (Map, List, ...) under the lease. */
    public WriteResult putValue(String key, Object value) {
        return write(() -> client.putValue(key, value, token(), scope()));
    }

    /** Reads a key (no token needed; works on a lost lease too). */
    public Entry get(String key) {
        return client.get(key);
    }

    /** Deletes key under the lease. */
    public DeleteResult delete(String key) {
        return write(() -> client.delete(key, token(), scope()));
    }

    /** Applies ops all or nothing under the lease. */
    public BatchResult batch(List<Op> ops) {
        return write(() -> client.batch(ops, token(), scope()));
    }

    /** Claims the lease's scope (the grant already did; harmless to repeat). */
    public Fence claim() {
        return write(() -> client.claim(scope(), token()));
    }

    /** Replaces a table row under the lease. */
    public WriteResult tablePut(String resource, String key, Map<String, ?> row) {
        return write(() -> client.tablePut(resource, key, row, token(), scope()));
    }

    /** Updates a table row under the lease. */
    public WriteResult tablePatch(String resource, String key, Map<String, ?> row) {
        return write(() -> client.tablePatch(resource, key, row, token(), scope()));
    }

    /** Deletes a table row under the lease. */
    public DeleteResult tableDelete(String resource, String key) {
        return write(() -> client.tableDelete(resource, key, token(), scope()));
    }

    @Override
    public String toString() {
        return "Lease[" + name + ", token " + grant.token() + (isHeld() ? "" : ", not held") + "]";
    }
}
