package dev.fencegate;

/** 405 {@code method-not-allowed}: The route does not take this method. */
public class MethodNotAllowedException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public MethodNotAllowedException(Problem problem) {
        super(problem);
    }
}
