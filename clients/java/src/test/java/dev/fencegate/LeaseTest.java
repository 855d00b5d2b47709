package dev.fencegate;

import static dev.fencegate.Support.client;
import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class LeaseTest {
    final Fencegate c = client();

    @Test
    void renewsPastItsTtlAndWritesUnderItsScope() throws Exception {
        String n = Support.name("renews");
        Lease l = c.lease(n, Duration.ofMillis(900), "renewer");
        try (l) {
            assertEquals(n, l.scope());
            Tokens.check(l.token());
            long until = System.nanoTime() + Duration.ofMillis(2700).toNanos(); // three TTLs: only renewals keep it
            while (System.nanoTime() < until) {
                assertEquals("renewer", c.holder(n).orElseThrow().owner(), "lost: " + l.lostReason());
                assertFalse(l.lost().isDone(), () -> "lost: " + l.lostReason());
                Thread.sleep(100);
            }
            var w = l.put(n + "/k", "{\"still\":\"valid\"}");
            assertEquals(l.token(), w.fenceToken());
            assertEquals(n, w.scope());
            assertEquals(n, l.batch(List.of(Op.put(n + "/b", "1"), Op.delete(n + "/k"))).scope());
            assertEquals(l.token(), l.claim().fenceToken());
            assertTrue(l.delete(n + "/b").deleted());
        }
        assertTrue(c.holder(n).isEmpty(), "released on close");
        raises(LeaseLostException.class, () -> l.put(n + "/k", "1"));
        l.close(); // a second close does nothing
    }

    @Test
    void waitsWhileHeld() {
        String n = Support.name("waits");
        Lease first = c.lease(n, Duration.ofSeconds(10), "first");
        assertEquals("first", raises(LockHeldException.class, () -> c.lease(n, Duration.ofSeconds(10), "x")).holder());
        CompletableFuture.runAsync(first::close, CompletableFuture.delayedExecutor(300, TimeUnit.MILLISECONDS));
        try (Lease second = c.lease(n, Duration.ofSeconds(10), "second", Duration.ofSeconds(60))) {
            assertTrue(Long.parseLong(second.token()) > Long.parseLong(first.token()));
            raises(LockHeldException.class, () -> c.lease(n, Duration.ofSeconds(1), "third", Duration.ofMillis(300)));
        }
    }

    @Test
    void lostWhenARenewIsRefused() throws Exception {
        String n = Support.name("refused");
        try (Lease l = c.lease(n, Duration.ofSeconds(3), null)) {
            c.retireLock(n, "the Java client's test ends this lease");
            l.lost().get(30, TimeUnit.SECONDS);
            assertInstanceOf(LockLostException.class, l.lostReason().getCause());
            LeaseLostException e = raises(LeaseLostException.class, () -> l.put(n + "/k", "1")); // not sent
            assertTrue(e.isFencing());
        } // closing a lost lease is not an error
    }

    @Test
    void lostWhenAWriteIsRefusedStale() {
        String n = Support.name("stale");
        // renews rarely, so it has not noticed yet when the new holder writes
        try (Lease old = c.lease(n, Duration.ofSeconds(30), null, Duration.ZERO, Duration.ofHours(1))) {
            old.put(n + "/k", "\"old holder\"");
            c.retireLock(n, "test: hand the lock over");
            try (Lease nw = c.lease(n, Duration.ofSeconds(30), null)) {
                nw.put(n + "/other", "\"new holder\"");
                assertTrue(old.isHeld());
                StaleTokenException st = raises(StaleTokenException.class, () -> old.put(n + "/k", "\"zombie\""));
                assertEquals(old.token(), st.presented());
                assertEquals(nw.token(), st.current());
                assertTrue(old.lost().isDone());
                assertEquals(st, old.lostReason().getCause());
                raises(LeaseLostException.class, () -> old.put(n + "/k", "\"again\""));
            }
        }
        assertEquals("\"old holder\"", c.get(n + "/k").valueJson());
    }

    @Test
    void lostWhenItsExpiryPassesWithoutARenew() throws Exception {
        String n = Support.name("expiry");
        try (Lease l = c.lease(n, Duration.ofMillis(400), null, Duration.ZERO, Duration.ofHours(1))) {
            l.lost().get(30, TimeUnit.SECONDS);
            raises(LeaseLostException.class, () -> l.put(n + "/k", "1"));
        }
    }
}
