package dev.fencegate;

/** 400 {@code invalid-key}: The key is not valid; {@code column()} for a table key. */
public class InvalidKeyException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidKeyException(Problem problem) {
        super(problem);
    }

    /** The table column, or null. */
    public String column() {
        return str("column");
    }
}
