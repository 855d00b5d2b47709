package dev.fencegate;

/**
 * An answer whose problem type this version does not know (or a non-2xx answer without a
 * problem body): {@link #status()} tells what kind of refusal it is.
 */
public class UnknownProblemException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public UnknownProblemException(Problem problem) {
        super(problem);
    }
}
