package dev.fencegate;

/** 412 {@code stale-token}: A newer holder exists: stop working. {@code presented()} is below the fence {@code current()} of {@code key()} (or {@code scope()}; {@code resource()} and {@code key()} for a table row). For a batch, {@code staleKeys()} lists every stale key. */
public class StaleTokenException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public StaleTokenException(Problem problem) {
        super(problem);
    }

    /** The token the refused request presented. */
    public String presented() {
        return str("presented_token");
    }

    /** The fence it ran into. */
    public String current() {
        return str("current_token");
    }

    /** The key (or the row's key), or null. */
    public String key() {
        return str("key");
    }

    /** The scope, or null. */
    public String scope() {
        return str("scope");
    }

    /** The table resource, or null. */
    public String resource() {
        return str("resource");
    }

    /** Every stale key of a refused batch (empty otherwise). */
    public java.util.List<StaleKey> staleKeys() {
        return staleKeysOf();
    }

    @Override
    public boolean isFencing() {
        return true;
    }

    /** One stale key of a refused batch: the key (and resource, for a row) and its fence. */
    public record StaleKey(String key, String resource, String current) {}

    private java.util.List<StaleKey> staleKeysOf() {
        java.util.List<StaleKey> out = new java.util.ArrayList<>();
        if (body().get("stale_keys") instanceof java.util.List<?> list) {
            for (Object o : list) {
                if (o instanceof java.util.Map<?, ?> m) {
                    out.add(new StaleKey(s(m.get("key")), s(m.get("resource")), s(m.get("current_token"))));
                }
            }
        }
        return out;
    }

    private static String s(Object v) {
        return v instanceof java.math.BigDecimal n ? n.toPlainString() : v instanceof String x ? x : null;
    }
}
