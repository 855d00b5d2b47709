package dev.fencegate;

import static dev.fencegate.Support.client;
import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fencegate.Results.BatchResult;
import dev.fencegate.Results.WriteResult;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * Idempotency-Key: every write carries one, its retry carries the same, and a write that landed
 * is answered with its first outcome even after a newer holder fenced the writer out. The lost
 * answer is real: a TCP relay passes the request to the fencegate under test and drops its answer.
 */
class IdempotencyTest {
    final Fencegate c = client();

    /** A TCP relay to the server under test that records Idempotency-Keys and can drop one answer. */
    static final class Relay implements AutoCloseable {
        private static final Pattern KEY = Pattern.compile("(?i)\r\nidempotency-key: *([^\r\n]*)\r\n");
        final ServerSocket listener;
        final List<String> keys = new ArrayList<>();
        final List<Socket> sockets = new ArrayList<>();
        final AtomicBoolean lose;
        final Runnable between;

        Relay(boolean loseFirst, Runnable between) throws IOException {
            this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
            this.lose = new AtomicBoolean(loseFirst);
            this.between = between;
            URI up = URI.create(Support.url());
            Thread t = new Thread(() -> {
                while (!listener.isClosed()) {
                    try {
                        Socket down = listener.accept();
                        Socket upstream = new Socket(up.getHost(), up.getPort());
                        synchronized (sockets) {
                            sockets.add(down);
                            sockets.add(upstream);
                        }
                        pump(down, upstream, true);
                        pump(upstream, down, false);
                    } catch (IOException closed) {
                        return;
                    }
                }
            });
            t.setDaemon(true);
            t.start();
        }

        String url() {
            return "http://127.0.0.1:" + listener.getLocalPort();
        }

        private void pump(Socket from, Socket to, boolean request) {
            Thread t = new Thread(() -> {
                StringBuilder seen = new StringBuilder();
                int scanned = 0;
                byte[] buf = new byte[16384];
                try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                    for (int n; (n = in.read(buf)) > 0; ) {
                        if (request) {
                            seen.append(new String(buf, 0, n, StandardCharsets.ISO_8859_1));
                            Matcher m = KEY.matcher(seen);
                            while (m.find(scanned)) {
                                synchronized (keys) {
                                    keys.add(m.group(1).trim());
                                }
                                scanned = m.end() - 2;
                            }
                        } else if (lose.compareAndSet(true, false)) {
                            // The server answered (the write is committed): drop the answer.
                            between.run();
                            from.close();
                            to.close();
                            return;
                        }
                        out.write(buf, 0, n);
                        out.flush();
                    }
                } catch (IOException closed) {
                    // either side went away
                }
            });
            t.setDaemon(true);
            t.start();
        }

        List<String> keys() {
            synchronized (keys) {
                return List.copyOf(keys);
            }
        }

        @Override
        public void close() throws IOException {
            listener.close();
            synchronized (sockets) {
                for (Socket s : sockets) s.close();
            }
        }
    }

    @Test
    void theSameKeyAfterANewerHolderGetsTheFirstAnswerReplayed() {
        String k = Support.name("idem");
        String scope = k + "-s";
        String ik = Fencegate.newIdempotencyKey();
        WriteResult first = c.put(k, "{\"n\":1}", "5", scope, null, ik);
        assertTrue(first.created());
        assertFalse(first.replayed());
        c.claim(scope, "6"); // a newer holder
        WriteResult again = c.put(k, "{\"n\":1}", "5", scope, null, ik);
        assertTrue(again.replayed());
        assertEquals(first.fenceToken(), again.fenceToken());
        assertEquals(first.version(), again.version());
        assertEquals(first.raw(), again.raw());
        assertTrue(again.created());
        // without the key the write is judged again: fenced out
        raises(StaleTokenException.class, () -> c.put(k, "{\"n\":1}", "5", scope));
        // the same key with another write: 422, nothing changed
        raises(IdempotencyKeyReusedException.class, () -> c.put(k, "{\"n\":2}", "7", scope, null, ik));
        assertEquals("{\"n\":1}", c.get(k).valueJson());
    }

    @Test
    void everyWriteSendsItsOwnKey() throws IOException {
        String k = Support.name("idem-each");
        try (Relay relay = new Relay(false, () -> {})) {
            Fencegate rc = Fencegate.builder(URI.create(relay.url())).timeout(Duration.ofSeconds(60)).build();
            rc.put(k, "1", "1");
            rc.put(k, "2", "1");
            rc.delete(k, "2", null);
            rc.batch(List.of(Op.put(k, "3")), "3", null);
            rc.claim(k + "-s", "4");
            rc.get(k);
            rc.acquire(k + "-lock", Duration.ofSeconds(1), "idem-test");
            List<String> keys = relay.keys();
            assertEquals(5, keys.size(), "only the five writes carry a key: " + keys);
            for (String key : keys) assertTrue(key.matches("[0-9a-f]{32}"), key);
            assertEquals(5, new HashSet<>(keys).size(), "two writes without an explicit key sent the same key: " + keys);
        }
    }

    @Test
    void aLostAnswerIsRetriedWithTheSameKeyAndReplayed() throws IOException {
        String k = Support.name("idem-lost");
        String scope = k + "-s";
        try (Relay relay = new Relay(true, () -> c.claim(scope, "9"))) {
            Fencegate rc = Fencegate.builder(URI.create(relay.url())).timeout(Duration.ofSeconds(60)).build();
            BatchResult b = rc.batch(List.of(Op.put(k, "\"landed\"")), "8", scope);
            assertTrue(b.replayed(), "the retried batch was not a replay: " + b);
            assertEquals("8", b.fenceToken());
            List<String> keys = relay.keys();
            assertEquals(2, keys.size(), keys.toString());
            assertEquals(keys.get(0), keys.get(1));
        }
        assertEquals("\"landed\"", c.get(k).valueJson());
    }

    @Test
    void withoutRetriesALostAnswerIsATransportException() throws IOException {
        String k = Support.name("idem-noretry");
        try (Relay relay = new Relay(true, () -> {})) {
            Fencegate rc = Fencegate.builder(URI.create(relay.url())).retries(0).build();
            raises(TransportException.class, () -> rc.put(k, "1", "1"));
            assertEquals(1, relay.keys().size());
        }
    }

    @Test
    void aBadKeyIsRefusedBeforeSending() {
        String k = Support.name("idem-bad");
        for (String bad : List.of("", "a b", "é", "x".repeat(256))) {
            raises(IllegalArgumentException.class, () -> c.put(k, "1", "1", null, null, bad));
        }
    }
}
