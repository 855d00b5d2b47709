package dev.fencegate;

/** 401 {@code unauthenticated}: No valid credential. */
public class UnauthenticatedException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public UnauthenticatedException(Problem problem) {
        super(problem);
    }
}
