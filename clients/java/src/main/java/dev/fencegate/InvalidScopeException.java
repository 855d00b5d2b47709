package dev.fencegate;

/** 400 {@code invalid-scope}: The scope is not valid. */
public class InvalidScopeException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidScopeException(Problem problem) {
        super(problem);
    }
}
