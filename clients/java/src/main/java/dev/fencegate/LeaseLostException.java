package dev.fencegate;

/**
 * Thrown, without sending anything, by a write through a lease that is known to be lost: a
 * renew was refused, its expiry passed without a successful renew, or a write under it was
 * refused as stale. {@link #getCause()} is what lost it, when there was one.
 */
public class LeaseLostException extends FencegateException {
    private static final long serialVersionUID = 1L;
    private final String name;
    private final String token;

    public LeaseLostException(String name, String token, String reason, Throwable cause) {
        super("fencegate: lease \"" + name + "\" (token " + token + ") is lost: " + reason
                + (cause != null ? ": " + cause.getMessage() : ""), cause);
        this.name = name;
        this.token = token;
    }

    /** The lock's name. */
    public String name() {
        return name;
    }

    /** The lease's token. */
    public String token() {
        return token;
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
