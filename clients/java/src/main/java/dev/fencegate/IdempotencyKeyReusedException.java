package dev.fencegate;

/**
 * 422 {@code idempotency-key-reused}: the Idempotency-Key was already used for another request;
 * nothing was done. Send a new key for a new write.
 */
public class IdempotencyKeyReusedException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public IdempotencyKeyReusedException(Problem problem) {
        super(problem);
    }
}
