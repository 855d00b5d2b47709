package dev.fencegate;

/** 404 {@code not-found}: An absent key, fence, lock, row or resource, or an unknown route. */
public class NotFoundException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public NotFoundException(Problem problem) {
        super(problem);
    }
}
