package dev.fencegate;

/** 422 {@code invalid-token-proof}: The proof does not verify for this scope and token. */
public class InvalidTokenProofException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidTokenProofException(Problem problem) {
        super(problem);
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
