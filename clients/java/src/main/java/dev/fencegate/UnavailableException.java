package dev.fencegate;

/** 503 {@code unavailable}: The database is unreachable, read-only or overloaded, or load was shed; {@code retryAfter()} is the server's Retry-After. The outcome of a write is unknown: retry it with the same token. */
public class UnavailableException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public UnavailableException(Problem problem) {
        super(problem);
    }

    /** The server's Retry-After (seconds), or null. */
    public String retryAfter() {
        return header("retry-after");
    }
}
