package dev.fencegate;

/** 400 {@code invalid-batch}: The batch is not valid. */
public class InvalidBatchException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public InvalidBatchException(Problem problem) {
        super(problem);
    }
}
