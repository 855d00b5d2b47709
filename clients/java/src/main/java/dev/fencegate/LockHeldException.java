package dev.fencegate;

/** 409 {@code lock-held}: {@code holder()} holds the lock for {@code remainingMs()} more. */
public class LockHeldException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public LockHeldException(Problem problem) {
        super(problem);
    }

    /** The current holder, or null. */
    public String holder() {
        return str("holder");
    }

    /** How long the holder's lease has left, in ms. */
    public long remainingMs() {
        return num("remaining_ms");
    }
}
