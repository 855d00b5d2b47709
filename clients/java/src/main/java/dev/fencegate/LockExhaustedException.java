package dev.fencegate;

/** 409 {@code lock-exhausted}: The lock's scope is at the largest token: no grant can exceed it. */
public class LockExhaustedException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public LockExhaustedException(Problem problem) {
        super(problem);
    }
}
