package dev.fencegate;

/** 422 {@code invalid-value}: PostgreSQL refused a value of a table row. */
public class InvalidValueException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidValueException(Problem problem) {
        super(problem);
    }

    /** The table column, or null. */
    public String column() {
        return str("column");
    }

    /** The table constraint, or null. */
    public String constraint() {
        return str("constraint");
    }
}
