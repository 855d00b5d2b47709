package dev.fencegate;

/** 422 {@code token-not-issued}: Under a built-in lock's {@code scope()}, {@code presented()} is above {@code latestIssued()}, the latest token that lock granted. */
public class TokenNotIssuedException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public TokenNotIssuedException(Problem problem) {
        super(problem);
    }

    /** The scope, or null. */
    public String scope() {
        return str("scope");
    }

    /** The key (or the row's key), or null. */
    public String key() {
        return str("key");
    }

    /** The token the refused request presented. */
    public String presented() {
        return str("presented_token");
    }

    /** The latest token the lock granted. */
    public String latestIssued() {
        return str("latest_issued");
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
