package dev.fencegate;

/** 400 {@code malformed-token}: The token is not a canonical decimal in 0..=9223372036854775807. */
public class MalformedTokenException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public MalformedTokenException(Problem problem) {
        super(problem);
    }
}
