package dev.fencegate;

/**
 * No answer: the connection failed or timed out, or a redirect to another origin was refused.
 * The outcome of a write is unknown; retrying it with the same token is safe.
 */
public class TransportException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public TransportException(String message, Throwable cause) {
        super(message, cause);
    }
}
