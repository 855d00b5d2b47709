package dev.fencegate;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A worker using the library, run as its own process by ZombieTest: takes a lease, writes under
 * it past its TTL, waits for a line on stdin (frozen with SIGSTOP meanwhile, past its lease),
 * writes again and reports what happened as JSON lines. Args: URL LOCK KEY TTL_MS.
 */
public final class ZombieWorker {
    private ZombieWorker() {}

    static Map<String, Object> describe(RuntimeException e) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("error", e == null ? null : e.getClass().getSimpleName());
        if (e instanceof StaleTokenException st) {
            m.put("presented", st.presented());
            m.put("current", st.current());
            m.put("scope", st.scope());
        }
        return m;
    }

    public static void main(String[] args) throws Exception {
        String url = args[0], lock = args[1], key = args[2];
        long ttlMs = Long.parseLong(args[3]);
        var client = Fencegate.client(URI.create(url));
        try (var lease = client.lease(lock, Duration.ofMillis(ttlMs), "zombie")) {
            long until = System.nanoTime() + Duration.ofMillis(ttlMs * 3 / 2).toNanos();
            int n = 0;
            while (System.nanoTime() < until) { // held past its TTL by the renewer
                lease.putValue(key, Map.of("by", "zombie", "n", ++n));
                Thread.sleep(ttlMs / 10);
            }
            System.out.println(Json.encode(Map.of("ready", true, "token", lease.token(), "writes", n, "held", lease.isHeld())));
            new BufferedReader(new InputStreamReader(System.in)).readLine(); // frozen here, then resumed
            RuntimeException late = null, raw = null;
            try {
                lease.put(key, "{\"by\":\"zombie\",\"late\":true}");
            } catch (StaleTokenException | LeaseLostException e) {
                late = e;
            }
            try { // whatever the lease knew, the server refuses the old token on its own
                client.put(key, "{\"by\":\"zombie\",\"late\":\"raw\"}", lease.token(), lease.scope());
            } catch (StaleTokenException e) {
                raw = e;
            }
            System.out.println(Json.encode(Map.of("late", describe(late), "raw", describe(raw), "lost", lease.lost().isDone())));
        }
        System.out.println(Json.encode(Map.of("exited", true))); // closing the lost lease threw nothing
    }
}
