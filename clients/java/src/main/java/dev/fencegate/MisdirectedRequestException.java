package dev.fencegate;

/** 421 {@code misdirected-request}: A Host this server does not answer for. */
public class MisdirectedRequestException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public MisdirectedRequestException(Problem problem) {
        super(problem);
    }
}
