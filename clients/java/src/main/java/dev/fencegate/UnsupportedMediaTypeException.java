package dev.fencegate;

/** 415 {@code unsupported-media-type}: The body is not application/json. */
public class UnsupportedMediaTypeException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public UnsupportedMediaTypeException(Problem problem) {
        super(problem);
    }
}
