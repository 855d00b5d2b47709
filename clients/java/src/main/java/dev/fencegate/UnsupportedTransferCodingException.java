package dev.fencegate;

/** 501 {@code unsupported-transfer-coding}: A transfer coding the server does not implement. */
public class UnsupportedTransferCodingException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public UnsupportedTransferCodingException(Problem problem) {
        super(problem);
    }
}
