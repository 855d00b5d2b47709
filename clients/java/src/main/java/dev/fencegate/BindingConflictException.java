package dev.fencegate;

/** 409 {@code binding-conflict}: An admin rebind contradicting a configured binding. */
public class BindingConflictException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public BindingConflictException(Problem problem) {
        super(problem);
    }
}
