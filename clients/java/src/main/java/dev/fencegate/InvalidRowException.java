package dev.fencegate;

/** 400 {@code invalid-row}: A table row names an unknown or unwritable {@code column()}. */
public class InvalidRowException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidRowException(Problem problem) {
        super(problem);
    }

    /** The table column, or null. */
    public String column() {
        return str("column");
    }
}
