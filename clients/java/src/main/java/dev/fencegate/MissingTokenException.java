package dev.fencegate;

/** 428 {@code missing-token}: A write without a token. */
public class MissingTokenException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public MissingTokenException(Problem problem) {
        super(problem);
    }
}
