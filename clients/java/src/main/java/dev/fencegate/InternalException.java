package dev.fencegate;

/** 500 {@code internal}: An internal error. */
public class InternalException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InternalException(Problem problem) {
        super(problem);
    }
}
