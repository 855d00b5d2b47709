package dev.fencegate;

import static dev.fencegate.Support.client;
import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class ZombieTest {
    final Fencegate c = client();

    static void signal(Process p, String sig) throws Exception {
        Process k = new ProcessBuilder("kill", "-" + sig, String.valueOf(p.pid())).inheritIO().start();
        assertTrue(k.waitFor(30, TimeUnit.SECONDS) && k.exitValue() == 0, "kill -" + sig);
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> next(BufferedReader out, Path stderr, String what) throws Exception {
        String line;
        try {
            line = CompletableFuture.supplyAsync(() -> {
                try {
                    return out.readLine();
                } catch (Exception e) {
                    return null;
                }
            }).get(60, TimeUnit.SECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            line = null;
        }
        if (line == null) fail("the zombie sent no " + what + "; its stderr:\n" + Files.readString(stderr));
        return (Map<String, Object>) Json.parse(line);
    }

    /** A real zombie: a process using the library, frozen with SIGSTOP past its lease. */
    @Test
    void aZombieFrozenPastItsLeaseIsFenced() throws Exception {
        String lock = Support.name("zombie"), key = lock + "/invoice";
        String java = ProcessHandle.current().info().command().orElse(System.getProperty("java.home") + "/bin/java");
        String cp = System.getProperty("fencegate.test.classpath", "build/classes:build/test-classes");
        Path dir = Support.tempDir("fg-java-zombie-");
        Path stderr = dir.resolve("stderr.log");
        Process child = new ProcessBuilder(java, "-cp", cp, "dev.fencegate.ZombieWorker", Support.url(), lock, key, "2000")
                .redirectError(stderr.toFile()).start();
        try {
            BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
            Writer in = new OutputStreamWriter(child.getOutputStream(), StandardCharsets.UTF_8);
            Map<String, Object> ready = next(out, stderr, "ready line");
            assertEquals(true, ready.get("ready"));
            assertEquals(true, ready.get("held"), "the worker renewed past its TTL");
            String oldToken = (String) ready.get("token");

            signal(child, "STOP"); // a GC pause, a VM stall: until its lease is over on the server
            Support.eventually("the frozen zombie's lease expires", Duration.ofSeconds(60), () -> c.holder(lock).isEmpty());
            try (Lease nw = c.lease(lock, Duration.ofSeconds(30), "new-holder", Duration.ofSeconds(30))) {
                assertTrue(Long.parseLong(nw.token()) > Long.parseLong(oldToken));
                nw.put(key, "{\"by\":\"new holder\"}");

                signal(child, "CONT");
                in.write("go\n");
                in.flush();
                Map<String, Object> report = next(out, stderr, "report");
                @SuppressWarnings("unchecked")
                Map<String, Object> late = (Map<String, Object>) report.get("late");
                // refused by the server (StaleToken) or, the lease having noticed first, before sending
                switch (String.valueOf(late.get("error"))) {
                    case "StaleTokenException" -> {
                        assertEquals(oldToken, late.get("presented"));
                        assertEquals(nw.token(), late.get("current"));
                    }
                    case "LeaseLostException" -> {}
                    default -> fail("the zombie's late write under its lease: " + late);
                }
                assertEquals(Map.of("error", "StaleTokenException", "presented", oldToken, "current", nw.token(), "scope", lock),
                        report.get("raw"), "a write with the old token, past the lease's checks");
                assertEquals(true, report.get("lost"), "the zombie's lease knows it is lost");
                assertEquals(Map.of("exited", true), next(out, stderr, "exit line"));
                assertTrue(child.waitFor(60, TimeUnit.SECONDS), "the zombie did not exit");
                assertEquals(0, child.exitValue(), Files.readString(stderr));
                var e = c.get(key);
                assertEquals("{\"by\":\"new holder\"}", e.valueJson());
                assertEquals(nw.token(), e.fenceToken());
                assertTrue(nw.isHeld());
            }
        } finally { // whatever happened: never leave it frozen or running
            if (child.isAlive()) {
                new ProcessBuilder("kill", "-CONT", String.valueOf(child.pid())).start().waitFor(10, TimeUnit.SECONDS);
                child.destroyForcibly();
                child.waitFor(30, TimeUnit.SECONDS);
            }
            Support.deleteTree(dir);
        }
    }

    /**
     * Bring your own lock: a Redis lock (SET NX PX) whose token comes from INCR in the same script,
     * the scope claimed after each acquisition. The first holder's lock expires while it pauses;
     * the second takes it; the first one's late writes are refused, typed, with both tokens.
     */
    @Test
    void aBringYourOwnLockZombieIsFenced() throws Exception {
        String n = Support.name("byol");
        try (Support.Redis r = new Support.Redis()) {
            java.util.function.BiFunction<String, Integer, String> acquire = (owner, ttlMs) -> {
                try {
                    long v = (Long) r.call("EVAL", Tokens.REDIS_FENCED_LOCK_SCRIPT, "2", "lock:" + n, "lock:" + n + ":fence", owner,
                            String.valueOf(ttlMs));
                    if (v == 0) return null;
                    String token = Tokens.redisIncr(v);
                    c.claim(n, token); // older holders are fenced now
                    return token;
                } catch (java.io.IOException e) {
                    throw new RuntimeException(e);
                }
            };
            String a = acquire.apply("worker-a", 300);
            assertTrue(a != null, "worker-a did not get the free lock");
            c.put(n + "/invoice", "\"a\"", a, n);
            assertEquals(null, acquire.apply("worker-b", 30_000), "worker-b got a held lock");
            Support.eventually("worker-a's Redis lock expires", Duration.ofSeconds(60), () -> {
                try {
                    return Long.valueOf(0).equals(r.call("EXISTS", "lock:" + n));
                } catch (java.io.IOException e) {
                    return false;
                }
            });
            String b = acquire.apply("worker-b", 30_000);
            assertTrue(b != null, "worker-b did not get the expired lock");
            c.put(n + "/invoice", "\"b\"", b, n);
            for (String key : List.of(n + "/invoice", n + "/untouched")) {
                StaleTokenException st = raises(StaleTokenException.class, () -> c.put(key, "\"a, late\"", a, n));
                assertEquals(List.of(a, b, n), List.of(st.presented(), st.current(), st.scope()));
            }
            assertEquals("\"b\"", c.get(n + "/invoice").valueJson());
            raises(NotFoundException.class, () -> c.get(n + "/untouched"));
        }
    }
}
