package dev.fencegate;

/** 413 {@code payload-too-large}: The body is over the server's limit. */
public class PayloadTooLargeException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public PayloadTooLargeException(Problem problem) {
        super(problem);
    }
}
