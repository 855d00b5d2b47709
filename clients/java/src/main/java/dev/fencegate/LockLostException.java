package dev.fencegate;

/** 409 {@code lock-lost}: A renew or release by someone who no longer holds the lease; {@code holder()} and {@code remainingMs()} name the current holder, if any. */
public class LockLostException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public LockLostException(Problem problem) {
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

    @Override
    public boolean isFencing() {
        return true;
    }
}
