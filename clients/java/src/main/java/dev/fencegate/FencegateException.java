package dev.fencegate;

import java.math.BigDecimal;
import java.util.List;
import java.util.Map;

/**
 * The base of every exception this library throws. An answer of the server is a subclass per
 * problem type ({@link StaleTokenException}, {@link ScopeMismatchException}, ...; one the library
 * does not know is {@link UnknownProblemException}), with {@link #status()}, {@link #type()},
 * {@link #detail()}, {@link #body()}; {@link LeaseLostException} and {@link TransportException}
 * come without an answer ({@code status()} 0).
 */
public class FencegateException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final transient Problem problem;

    /** An answer of the server. */
    protected FencegateException(Problem problem) {
        super(message(problem));
        this.problem = problem;
    }

    /** No answer. */
    protected FencegateException(String message, Throwable cause) {
        super(message, cause);
        this.problem = new Problem(0, null, null, null, Map.of(), Map.of());
    }

    private static String message(Problem p) {
        String head = "fencegate: " + p.status() + (p.slug().isEmpty() ? "" : " " + p.slug());
        String text = p.detail() != null ? p.detail() : p.title();
        return text == null || text.isEmpty() ? head : head + ": " + text;
    }

    /** The problem as sent. */
    public Problem problem() {
        return problem;
    }

    /** The HTTP status (0: no answer). */
    public int status() {
        return problem.status();
    }

    /** The problem type URI, e.g. {@code https://fencegate.dev/problems/stale-token}, or null. */
    public String type() {
        return problem.type();
    }

    /** The type's last segment, e.g. {@code "stale-token"}. */
    public String slug() {
        return problem.slug();
    }

    public String title() {
        return problem.title();
    }

    public String detail() {
        return problem.detail();
    }

    /** The whole problem object. */
    public Map<String, Object> body() {
        return problem.body();
    }

    /** A response header (first value), or null. */
    public String header(String name) {
        List<String> v = problem.headers().get(name.toLowerCase(java.util.Locale.ROOT));
        return v == null || v.isEmpty() ? null : v.get(0);
    }

    /** The X-Request-Id of the refused request (what fencegate logged it under), or null. */
    public String requestId() {
        return header("x-request-id");
    }

    /**
     * True for the refusals that mean "this writer must stop": a stale token, a scope mismatch,
     * a token not issued, a token jump, a missing or invalid proof, a lost lock or lease.
     */
    public boolean isFencing() {
        return false;
    }

    /** A string field of the problem body (tokens are strings; a number keeps its exact text). */
    protected String str(String field) {
        Object v = problem.body().get(field);
        if (v instanceof String s) return s;
        if (v instanceof BigDecimal n) return n.toPlainString();
        return null;
    }

    protected long num(String field) {
        Object v = problem.body().get(field);
        if (v instanceof BigDecimal n) return n.longValue();
        if (v instanceof String s) {
            try {
                return Long.parseLong(s);
            } catch (NumberFormatException e) {
                return 0;
            }
        }
        return 0;
    }
}
