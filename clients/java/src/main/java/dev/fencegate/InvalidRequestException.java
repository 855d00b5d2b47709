package dev.fencegate;

/** 400 {@code invalid-request}: The request is not valid. */
public class InvalidRequestException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidRequestException(Problem problem) {
        super(problem);
    }
}
