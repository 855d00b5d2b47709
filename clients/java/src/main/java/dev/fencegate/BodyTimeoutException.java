package dev.fencegate;

/** 408 {@code body-timeout}: The body arrived too slowly. */
public class BodyTimeoutException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public BodyTimeoutException(Problem problem) {
        super(problem);
    }
}
