package dev.fencegate;

/** 422 {@code missing-token-proof}: The scope belongs to an issuer: send its X-Fencing-Proof. */
public class MissingTokenProofException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public MissingTokenProofException(Problem problem) {
        super(problem);
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
