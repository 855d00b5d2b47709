package dev.fencegate;

/** 409 {@code scope-mismatch}: The key (or row) is bound to {@code scope()} (null: unscoped) and the write came under {@code presentedScope()} (null: none). */
public class ScopeMismatchException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public ScopeMismatchException(Problem problem) {
        super(problem);
    }

    /** The key (or the row's key), or null. */
    public String key() {
        return str("key");
    }

    /** The table resource, or null. */
    public String resource() {
        return str("resource");
    }

    /** The scope, or null. */
    public String scope() {
        return str("scope");
    }

    /** The scope the write came under, or null. */
    public String presentedScope() {
        return str("presented_scope");
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
