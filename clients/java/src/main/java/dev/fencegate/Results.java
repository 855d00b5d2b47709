package dev.fencegate;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * What the server answers. Tokens are strings of decimals, exactly as sent; a scope of null
 * means none; {@code raw} is the whole decoded answer (numbers as BigDecimal).
 */
public final class Results {
    private Results() {}

    static String s(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof String x) return x;
        if (v instanceof BigDecimal n) return n.toPlainString();
        return null;
    }

    static long n(Map<String, Object> m, String k) {
        Object v = m.get(k);
        if (v instanceof BigDecimal n) return n.longValue();
        if (v instanceof String x) return Long.parseLong(x);
        return 0;
    }

    /**
     * A kv or table PUT/PATCH; {@code created} for a 201; {@code replayed} when the server answered
     * a retry with the write's first outcome (it had landed: Idempotent-Replayed).
     */
    public record WriteResult(String key, String fenceToken, String scope, String resource, boolean created, long version,
            Map<String, Object> raw, boolean replayed) {
        public WriteResult(String key, String fenceToken, String scope, String resource, boolean created, long version,
                Map<String, Object> raw) {
            this(key, fenceToken, scope, resource, created, version, raw, false);
        }

        static WriteResult of(int status, Map<String, Object> m, boolean replayed) {
            return new WriteResult(s(m, "key"), s(m, "fence_token"), s(m, "scope"), s(m, "resource"), status == 201,
                    n(m, "version"), m, replayed);
        }
    }

    /** A key's value (as JSON text and decoded) and fence. */
    public record Entry(String key, String valueJson, Object value, String fenceToken, String scope, long version,
            String updatedAt, Map<String, Object> raw) {
        static Entry of(Map<String, Object> m) {
            Object v = m.get("value");
            return new Entry(s(m, "key"), Json.encode(v), v, s(m, "fence_token"), s(m, "scope"), n(m, "version"),
                    s(m, "updated_at"), m);
        }
    }

    /** A delete: the tombstone keeps the fence. */
    public record DeleteResult(String key, String fenceToken, String scope, String resource, boolean deleted,
            Map<String, Object> raw, boolean replayed) {
        public DeleteResult(String key, String fenceToken, String scope, String resource, boolean deleted,
                Map<String, Object> raw) {
            this(key, fenceToken, scope, resource, deleted, raw, false);
        }

        static DeleteResult of(Map<String, Object> m, boolean replayed) {
            return new DeleteResult(s(m, "key"), s(m, "fence_token"), s(m, "scope"), s(m, "resource"),
                    !Boolean.FALSE.equals(m.get("deleted")), m, replayed);
        }
    }

    /** One op of a batch. */
    public record OpResult(String op, String key, String resource, int status) {}

    /** An all-or-nothing batch. */
    public record BatchResult(String fenceToken, String scope, List<OpResult> results, Map<String, Object> raw,
            boolean replayed) {
        public BatchResult(String fenceToken, String scope, List<OpResult> results, Map<String, Object> raw) {
            this(fenceToken, scope, results, raw, false);
        }

        static BatchResult of(Map<String, Object> m, boolean replayed) {
            List<OpResult> out = new ArrayList<>();
            if (m.get("results") instanceof List<?> l) {
                for (Object o : l) {
                    if (o instanceof Map<?, ?> x) {
                        @SuppressWarnings("unchecked")
                        Map<String, Object> r = (Map<String, Object>) x;
                        out.add(new OpResult(s(r, "op"), s(r, "key"), s(r, "resource"), (int) n(r, "status")));
                    }
                }
            }
            return new BatchResult(s(m, "fence_token"), s(m, "scope"), List.copyOf(out), m, replayed);
        }
    }

    /** A scope's fence; {@code created} for a 201 claim. */
    public record Fence(String scope, String fenceToken, boolean created, Map<String, Object> raw, boolean replayed) {
        public Fence(String scope, String fenceToken, boolean created, Map<String, Object> raw) {
            this(scope, fenceToken, created, raw, false);
        }

        static Fence of(int status, Map<String, Object> m) {
            return new Fence(s(m, "scope"), s(m, "fence_token"), status == 201, m, false);
        }

        static Fence of(int status, Map<String, Object> m, boolean replayed) {
            return new Fence(s(m, "scope"), s(m, "fence_token"), status == 201, m, replayed);
        }
    }

    /** A grant or renew of the built-in lock service. */
    public record Grant(String name, String token, String owner, String expiresAt, long ttlMs, String scope,
            Map<String, Object> raw) {
        static Grant of(Map<String, Object> m) {
            String scope = s(m, "scope");
            return new Grant(s(m, "name"), s(m, "token"), s(m, "owner"), s(m, "expires_at"), n(m, "ttl_ms"),
                    scope != null ? scope : s(m, "name"), m);
        }
    }

    /** Who holds a built-in lock (its token is never shown). */
    public record Holder(String name, String owner, long remainingMs, Map<String, Object> raw) {
        static Holder of(Map<String, Object> m) {
            return new Holder(s(m, "name"), s(m, "owner"), n(m, "remaining_ms"), m);
        }
    }

    /** A row of a legacy table. */
    public record Row(String resource, String key, Map<String, Object> row, String fenceToken, String scope,
            Map<String, Object> raw) {
        @SuppressWarnings("unchecked")
        static Row of(Map<String, Object> m) {
            Object r = m.get("row");
            return new Row(s(m, "resource"), s(m, "key"), r instanceof Map ? (Map<String, Object>) r : Map.of(),
                    s(m, "fence_token"), s(m, "scope"), m);
        }
    }

    /** A reset, retire or rebind (audited). */
    public record AdminResult(String target, String name, String resource, String from, String to, String auditId,
            Map<String, Object> raw) {
        static AdminResult of(Map<String, Object> m) {
            String name = s(m, "name");
            return new AdminResult(s(m, "target"), name != null ? name : s(m, "prefix"), s(m, "resource"), s(m, "from"),
                    s(m, "to"), s(m, "audit_id"), m);
        }
    }
}
