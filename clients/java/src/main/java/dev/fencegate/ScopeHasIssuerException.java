package dev.fencegate;

/** 409 {@code scope-has-issuer}: No built-in lock on a scope an issuer signs for. */
public class ScopeHasIssuerException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public ScopeHasIssuerException(Problem problem) {
        super(problem);
    }

    /** The scope, or null. */
    public String scope() {
        return str("scope");
    }

    /** The issuer that signs for the scope. */
    public String issuer() {
        return str("issuer");
    }
}
