package dev.fencegate;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.Function;

/** Every problem type the server defines, and the exception class of each. */
public final class Problems {
    private Problems() {}

    /** The prefix of every problem type URI. */
    public static final String BASE = "https://fencegate.dev/problems/";

    private static final Map<String, Function<Problem, FencegateException>> BY_SLUG;

    static {
        Map<String, Function<Problem, FencegateException>> m = new LinkedHashMap<>();
        m.put("stale-token", StaleTokenException::new);
        m.put("scope-mismatch", ScopeMismatchException::new);
        m.put("token-not-issued", TokenNotIssuedException::new);
        m.put("token-jump", TokenJumpException::new);
        m.put("missing-token-proof", MissingTokenProofException::new);
        m.put("invalid-token-proof", InvalidTokenProofException::new);
        m.put("lock-lost", LockLostException::new);
        m.put("lock-held", LockHeldException::new);
        m.put("lock-exhausted", LockExhaustedException::new);
        m.put("scope-has-issuer", ScopeHasIssuerException::new);
        m.put("reset-not-below", ResetNotBelowException::new);
        m.put("binding-conflict", BindingConflictException::new);
        m.put("missing-token", MissingTokenException::new);
        m.put("malformed-token", MalformedTokenException::new);
        m.put("invalid-key", InvalidKeyException::new);
        m.put("invalid-scope", InvalidScopeException::new);
        m.put("invalid-json", InvalidJsonException::new);
        m.put("invalid-batch", InvalidBatchException::new);
        m.put("invalid-row", InvalidRowException::new);
        m.put("invalid-value", InvalidValueException::new);
        m.put("idempotency-key-reused", IdempotencyKeyReusedException::new);
        m.put("invalid-request", InvalidRequestException::new);
        m.put("payload-too-large", PayloadTooLargeException::new);
        m.put("unsupported-media-type", UnsupportedMediaTypeException::new);
        m.put("unsupported-transfer-coding", UnsupportedTransferCodingException::new);
        m.put("misdirected-request", MisdirectedRequestException::new);
        m.put("body-timeout", BodyTimeoutException::new);
        m.put("not-found", NotFoundException::new);
        m.put("method-not-allowed", MethodNotAllowedException::new);
        m.put("unauthenticated", UnauthenticatedException::new);
        m.put("forbidden", ForbiddenException::new);
        m.put("unavailable", UnavailableException::new);
        m.put("internal", InternalException::new);
        BY_SLUG = Collections.unmodifiableMap(m);
    }

    /** The problem types (their slugs, e.g. {@code "stale-token"}) this version maps. */
    public static Set<String> slugs() {
        return BY_SLUG.keySet();
    }

    /**
     * The exception of an answer other than 2xx: its problem type's class, else
     * {@link UnknownProblemException}.
     */
    public static FencegateException parse(int status, Map<String, List<String>> headers, String body) {
        Map<String, List<String>> h = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
        if (headers != null) {
            headers.forEach((k, v) -> h.put(k.toLowerCase(java.util.Locale.ROOT), v));
        }
        Map<String, Object> m = Map.of();
        String type = null, title = null, detail = null;
        try {
            m = Json.parseObject(body == null ? "" : body);
            type = m.get("type") instanceof String s ? s : null;
            title = m.get("title") instanceof String s ? s : null;
            detail = m.get("detail") instanceof String s ? s : null;
        } catch (IllegalArgumentException notJson) {
            if (body != null && !body.isEmpty()) detail = Json.abbreviate(body);
        }
        Problem p = new Problem(status, type, title, detail, m, h);
        Function<Problem, FencegateException> make = type != null && type.startsWith(BASE) ? BY_SLUG.get(p.slug()) : null;
        return make != null ? make.apply(p) : new UnknownProblemException(p);
    }
}
