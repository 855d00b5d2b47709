package dev.fencegate;

/** 403 {@code forbidden}: The credential lacks {@code right()} on {@code name()} (a key, scope, lock or resource). */
public class ForbiddenException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public ForbiddenException(Problem problem) {
        super(problem);
    }

    /** The right that was missing. */
    public String right() {
        return str("right");
    }

    /** The name refused: a key, scope, lock or resource. */
    public String name() {
        return firstOf("key", "scope", "lock", "resource");
    }

    private String firstOf(String... fields) {
        for (String f : fields) {
            String v = str(f);
            if (v != null) return v;
        }
        return null;
    }
}
