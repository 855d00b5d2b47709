package dev.fencegate;

/** 409 {@code reset-not-below}: An admin reset only lowers a fence. */
public class ResetNotBelowException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public ResetNotBelowException(Problem problem) {
        super(problem);
    }
}
