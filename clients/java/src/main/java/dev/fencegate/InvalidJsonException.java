package dev.fencegate;

/** 400 {@code invalid-json}: The body is not JSON fencegate accepts. */
public class InvalidJsonException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidJsonException(Problem problem) {
        super(problem);
    }
}
