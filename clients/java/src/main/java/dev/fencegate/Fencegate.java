package dev.fencegate;

import dev.fencegate.Results.AdminResult;
import dev.fencegate.Results.BatchResult;
import dev.fencegate.Results.DeleteResult;
import dev.fencegate.Results.Entry;
import dev.fencegate.Results.Fence;
import dev.fencegate.Results.Grant;
import dev.fencegate.Results.Holder;
import dev.fencegate.Results.Row;
import dev.fencegate.Results.WriteResult;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.function.BiFunction;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * A client of one fencegate server: fenced writes, the built-in lock's leases, fences, legacy
 * tables. Thread-safe. Every refusal is an exception of its problem type (a subclass of
 * {@link FencegateException}); tokens are strings of decimals, never floats.
 *
 * <pre>{@code
 * var client = Fencegate.client(URI.create("http://127.0.0.1:8080"));
 * try (var lease = client.lease("nightly", Duration.ofSeconds(10), "worker-1")) {
 *     lease.put("invoice-7", "{\"total\":120}");   // token and scope sent for you
 * }
 * client.put("k", "{...}", "42", "billing");       // bring your own lock: token, scope (null: none)
 * }</pre>
 */
public final class Fencegate {
    /** Version of this library, sent in the User-Agent. */
    public static final String VERSION = "0.1.0";

    /** How many times a write is retried with its Idempotency-Key by default. */
    public static final int DEFAULT_RETRIES = 2;

    private static final SecureRandom RANDOM = new SecureRandom();

    private final URI base;
    private final HttpClient http;
    private final String apiKey;
    private final Map<String, String> headers;
    private final Duration timeout;
    private final BiFunction<String, String, String> signer;
    private final int retries;

    private Fencegate(Builder b, HttpClient http) {
        this.base = b.url;
        this.http = http;
        this.apiKey = b.apiKey;
        this.headers = Map.copyOf(b.headers);
        this.timeout = b.timeout;
        this.signer = b.signer;
        this.retries = b.retries;
    }

    /** A client of the fencegate at url (e.g. {@code http://127.0.0.1:8080}), no credential. */
    public static Fencegate client(URI url) {
        return builder(url).build();
    }

    /** Options: {@code Fencegate.builder(url).apiKey(k).caCertFile(Path.of("ca.pem")).build()}. */
    public static Builder builder(URI url) {
        return new Builder(url);
    }

    /** FENCEGATE_URL (default http://127.0.0.1:8080), FENCEGATE_API_KEY, FENCEGATE_CACERT. */
    public static Fencegate fromEnv() {
        String url = System.getenv().getOrDefault("FENCEGATE_URL", "http://127.0.0.1:8080");
        Builder b = builder(URI.create(url.isEmpty() ? "http://127.0.0.1:8080" : url));
        String key = System.getenv("FENCEGATE_API_KEY");
        if (key != null && !key.isEmpty()) b.apiKey(key);
        String ca = System.getenv("FENCEGATE_CACERT");
        if (ca != null && !ca.isEmpty()) b.caCertFile(Path.of(ca));
        return b.build();
    }

    /** The client's options. */
    public static final class Builder {
        private final URI url;
        private String apiKey;
        private Path caCertFile;
        private SSLContext sslContext;
        private Duration timeout = Duration.ofSeconds(30);
        private final Map<String, String> headers = new LinkedHashMap<>();
        private BiFunction<String, String, String> signer;
        private int retries = DEFAULT_RETRIES;

        private Builder(URI url) {
            String s = Objects.requireNonNull(url, "url").toString().replaceAll("/+$", "");
            URI u = URI.create(s);
            if (!("http".equals(u.getScheme()) || "https".equals(u.getScheme())) || u.getHost() == null) {
                throw new IllegalArgumentException("fencegate: bad URL " + url + ": want http(s)://host:port");
            }
            this.url = u;
        }

        /** Sent as {@code Authorization: Bearer <key>} (an API key or a JWT). */
        public Builder apiKey(String key) {
            this.apiKey = key;
            return this;
        }

        /** A PEM bundle of CA certificates to trust instead of the JDK's (a private CA). */
        public Builder caCertFile(Path pem) {
            this.caCertFile = pem;
            return this;
        }

        /** An SSLContext of your own (client certificates, a keystore); overrides caCertFile. */
        public Builder sslContext(SSLContext ctx) {
            this.sslContext = ctx;
            return this;
        }

        /** Each request's timeout (default 30 s). */
        public Builder timeout(Duration t) {
            this.timeout = t;
            return this;
        }

        /** A header sent with every request. */
        public Builder header(String name, String value) {
            headers.put(name, value);
            return this;
        }

        /**
         * {@code (scope, token) -> X-Fencing-Proof} for every scoped write, claim and batch that
         * does not pass a proof itself: e.g. {@code (s, t) -> Proofs.hmac(secret, s, t)}.
         */
        public Builder signer(BiFunction<String, String, String> signer) {
            this.signer = signer;
            return this;
        }

        /**
         * How many times a write is sent again, with the same Idempotency-Key, after a lost answer
         * (an I/O error) or a 503 with Retry-After, within the timeout (default 2; 0: never).
         */
        public Builder retries(int n) {
            if (n < 0) throw new IllegalArgumentException("fencegate: retries must be 0 or more");
            this.retries = n;
            return this;
        }

        public Fencegate build() {
            HttpClient.Builder h = HttpClient.newBuilder()
                    .version(HttpClient.Version.HTTP_1_1)
                    .followRedirects(HttpClient.Redirect.NEVER) // see send(): same origin only
                    .connectTimeout(timeout);
            if (sslContext != null) {
                h.sslContext(sslContext);
            } else if (caCertFile != null) {
                h.sslContext(trusting(caCertFile));
            }
            return new Fencegate(this, h.build());
        }
    }

    /** An SSLContext that trusts exactly the certificates of a PEM file. */
    public static SSLContext trusting(Path pemFile) {
        try (InputStream in = Files.newInputStream(pemFile)) {
            KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
            ks.load(null, null);
            int n = 0;
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                ks.setCertificateEntry("ca-" + n++, c);
            }
            if (n == 0) throw new IllegalArgumentException("fencegate: " + pemFile + " holds no PEM certificate");
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(ks);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), null);
            return ctx;
        } catch (IOException | GeneralSecurityException e) {
            throw new IllegalArgumentException("fencegate: CA file " + pemFile + ": " + e.getMessage(), e);
        }
    }

    /** The server's URL. */
    public URI url() {
        return base;
    }

    // ---- plumbing -----------------------------------------------------------------------------

    /** A key, scope or lock name as one path segment (and as X-Fencing-Scope): UTF-8, percent-encoded. */
    public static String segment(String name) {
        if (name == null || name.isEmpty()) throw new IllegalArgumentException("a key, scope or lock name must not be empty");
        StringBuilder b = new StringBuilder();
        for (byte x : name.getBytes(StandardCharsets.UTF_8)) {
            int c = x & 0xff;
            if (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
                b.append((char) c);
            } else {
                b.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
                        .append(Character.toUpperCase(Character.forDigit(c & 15, 16)));
            }
        }
        return b.toString();
    }

    /** A table row's key: the key columns' values, each percent-encoded, joined by ",". */
    public static String rowKey(Object... values) {
        List<String> parts = new ArrayList<>();
        for (Object v : values) parts.add(segment(String.valueOf(v)));
        return String.join(",", parts);
    }

    /** A 2xx answer of {@link #send}. */
    public record Response(int status, Map<String, List<String>> headers, String body) {
        public Map<String, Object> json() {
            return Json.parseObject(body);
        }
    }

    /**
     * Sends any request (path like {@code /v1/kv/k}, already encoded; bodyJson null for none),
     * with the client's credential: the 2xx answer, or the exception of any other. Headers are
     * sent as given (not checked).
     */
    public Response send(String method, String path, String bodyJson, Map<String, String> extra) {
        URI uri = URI.create(base + path);
        byte[] body = bodyJson == null ? null : bodyJson.getBytes(StandardCharsets.UTF_8);
        for (int hops = 0; ; hops++) {
            HttpRequest.Builder r = HttpRequest.newBuilder(uri).timeout(timeout)
                    .method(method, body == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(body))
                    .header("Accept", "application/json")
                    .header("User-Agent", "fencegate-java/" + VERSION);
            if (body != null) r.header("Content-Type", "application/json");
            if (apiKey != null) r.header("Authorization", "Bearer " + apiKey);
            headers.forEach(r::setHeader);
            if (extra != null) extra.forEach(r::setHeader);
            HttpResponse<String> resp;
            try {
                resp = http.send(r.build(), HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            } catch (IOException e) {
                throw new TransportException("fencegate: " + method + " " + uri + ": " + e, e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new TransportException("fencegate: " + method + " " + uri + ": interrupted", e);
            }
            int status = resp.statusCode();
            if (status >= 300 && status < 400 && resp.headers().firstValue("location").isPresent()) {
                URI next = uri.resolve(resp.headers().firstValue("location").get());
                if (!sameOrigin(uri, next)) {
                    throw new TransportException("fencegate: refused a redirect to another origin: " + next
                            + " (a token, a scope, a credential or a body never leaves " + base + ")", null);
                }
                if (hops >= 10) throw new TransportException("fencegate: stopped after 10 redirects", null);
                uri = next;
                if (status == 303) {
                    method = "GET";
                    body = null;
                }
                continue;
            }
            if (status < 200 || status > 299) {
                throw Problems.parse(status, resp.headers().map(), resp.body());
            }
            return new Response(status, resp.headers().map(), resp.body());
        }
    }

    private static boolean sameOrigin(URI a, URI b) {
        return Objects.equals(a.getScheme(), b.getScheme()) && Objects.equals(a.getHost(), b.getHost())
                && port(a) == port(b);
    }

    private static int port(URI u) {
        return u.getPort() != -1 ? u.getPort() : "https".equals(u.getScheme()) ? 443 : 80;
    }

    /** A fresh Idempotency-Key: 128 random bits from {@link SecureRandom}, as 32 hex digits. */
    public static String newIdempotencyKey() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        return HexFormat.of().formatHex(b);
    }

    private static String checkIdempotencyKey(String k) {
        if (k.isEmpty() || k.length() > 255 || !k.chars().allMatch(ch -> ch >= 0x21 && ch <= 0x7e)) {
            throw new IllegalArgumentException("fencegate: an idempotency key is 1..=255 visible ASCII characters");
        }
        return k;
    }

    /** A write's headers: the fencing ones and its Idempotency-Key (the caller's, else a new one). */
    private Map<String, String> write(String token, String scope, String proof, String idempotencyKey) {
        Map<String, String> h = fencing(token, scope, proof);
        h.put("Idempotency-Key", idempotencyKey == null ? newIdempotencyKey() : checkIdempotencyKey(idempotencyKey));
        return h;
    }

    private static boolean replayed(Response r) {
        List<String> v = r.headers().get("idempotent-replayed");
        return v != null && v.stream().anyMatch("true"::equalsIgnoreCase);
    }

    /**
     * Sends a write that carries an Idempotency-Key and, when its answer is lost (an I/O error) or
     * it gets a 503 with Retry-After, sends it again with the same key: at most {@code retries}
     * times within the timeout. Safe because the server answers the retry of a write that landed
     * with its first outcome (Idempotent-Replayed), never a second write.
     */
    private Response sendKeyed(String method, String path, String bodyJson, Map<String, String> h) {
        long deadline = System.nanoTime() + timeout.toNanos();
        for (int attempt = 0; ; attempt++) {
            try {
                return send(method, path, bodyJson, h);
            } catch (TransportException | UnavailableException e) {
                long pauseMs;
                if (e instanceof UnavailableException u) {
                    Double secs = parseSeconds(u.retryAfter());
                    if (secs == null) throw e;
                    pauseMs = (long) (secs * 1000);
                } else if (e.getCause() instanceof IOException) {
                    pauseMs = (long) ((100L << attempt) * (0.8 + 0.4 * RANDOM.nextDouble()));
                } else {
                    throw e; // a refused redirect, an interrupt: not a lost answer
                }
                if (attempt >= retries || System.nanoTime() + pauseMs * 1_000_000 >= deadline) throw e;
                try {
                    Thread.sleep(pauseMs);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
            }
        }
    }

    private static Double parseSeconds(String v) {
        if (v == null) return null;
        try {
            double d = Double.parseDouble(v.trim());
            return d >= 0 ? d : null;
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private Map<String, String> fencing(String token, String scope, String proof) {
        Map<String, String> h = new LinkedHashMap<>();
        if (token != null) h.put("X-Fencing-Token", Tokens.check(token));
        if (scope != null) {
            h.put("X-Fencing-Scope", segment(scope));
            if (proof == null && signer != null && token != null) proof = signer.apply(scope, token);
        }
        if (proof != null) h.put("X-Fencing-Proof", proof);
        return h;
    }

    // ---- kv -----------------------------------------------------------------------------------

    /** Writes JSON text to key under token and scope (the lock's name; null: none). */
    public WriteResult put(String key, String valueJson, String token, String scope) {
        return put(key, valueJson, token, scope, null);
    }

    /** Writes JSON text to key under token, unscoped. */
    public WriteResult put(String key, String valueJson, String token) {
        return put(key, valueJson, token, null, null);
    }

    /** Writes JSON text with an issuer's proof (see {@link Proofs}). */
    public WriteResult put(String key, String valueJson, String token, String scope, String proof) {
        return put(key, valueJson, token, scope, proof, null);
    }

    /**
     * Writes JSON text with this Idempotency-Key (null: a new one, as every other write gets):
     * sent again with the same key, it is answered with its first outcome ({@code replayed()}).
     */
    public WriteResult put(String key, String valueJson, String token, String scope, String proof, String idempotencyKey) {
        Response r = sendKeyed("PUT", "/v1/kv/" + segment(key), Json.raw(valueJson).text(),
                write(token, scope, proof, idempotencyKey));
        return WriteResult.of(r.status(), r.json(), replayed(r));
    }

    /** Writes a value (Map, List, Number, String, ... encoded by {@link Json}). */
    public WriteResult putValue(String key, Object value, String token, String scope) {
        Response r = sendKeyed("PUT", "/v1/kv/" + segment(key), Json.encode(value), write(token, scope, null, null));
        return WriteResult.of(r.status(), r.json(), replayed(r));
    }

    /** A key's value and fence; {@link NotFoundException} if absent or deleted. */
    public Entry get(String key) {
        return Entry.of(send("GET", "/v1/kv/" + segment(key), null, null).json());
    }

    /** Deletes key; its tombstone keeps the fence. */
    public DeleteResult delete(String key, String token, String scope) {
        return delete(key, token, scope, null);
    }

    /** Deletes key with this Idempotency-Key (null: a new one). */
    public DeleteResult delete(String key, String token, String scope, String idempotencyKey) {
        Response r = sendKeyed("DELETE", "/v1/kv/" + segment(key), null, write(token, scope, null, idempotencyKey));
        return DeleteResult.of(r.json(), replayed(r));
    }

    /** Applies ops all or nothing under one token (and scope). */
    public BatchResult batch(List<Op> ops, String token, String scope) {
        return batch(ops, token, scope, null);
    }

    /** Applies ops with this Idempotency-Key (null: a new one). */
    public BatchResult batch(List<Op> ops, String token, String scope, String idempotencyKey) {
        List<Object> list = new ArrayList<>();
        for (Op o : ops) list.add(o.json);
        Response r = sendKeyed("POST", "/v1/batch", Json.encode(Map.of("ops", list)), write(token, scope, null, idempotencyKey));
        return BatchResult.of(r.json(), replayed(r));
    }

    // ---- fences -------------------------------------------------------------------------------

    /** Raises scope's fence to token without writing: every older holder is fenced from now on. */
    public Fence claim(String scope, String token) {
        return claim(scope, token, null);
    }

    /** Claims with this Idempotency-Key (null: a new one). */
    public Fence claim(String scope, String token, String idempotencyKey) {
        Map<String, String> h = write(token, scope, null, idempotencyKey);
        h.remove("X-Fencing-Scope");
        Response r = sendKeyed("POST", "/v1/fences/" + segment(scope), null, h);
        return Fence.of(r.status(), r.json(), replayed(r));
    }

    /** A scope's fence; {@link NotFoundException} if it has none. */
    public Fence fence(String scope) {
        Response r = send("GET", "/v1/fences/" + segment(scope), null, null);
        return Fence.of(r.status(), r.json());
    }

    // ---- the built-in lock service ------------------------------------------------------------

    /**
     * A lease on the built-in lock {@code name}: renewed every ttl/3 in the background until
     * {@link Lease#close()}; {@link Lease#lost()} completes when it is lost. Throws
     * {@link LockHeldException} at once if the lock is held.
     */
    public Lease lease(String name, Duration ttl, String owner) {
        return Lease.acquire(this, name, ttl, owner, Duration.ZERO, null);
    }

    /** The same, retrying for up to {@code wait} while the lock is held. */
    public Lease lease(String name, Duration ttl, String owner, Duration wait) {
        return Lease.acquire(this, name, ttl, owner, wait, null);
    }

    /** The same, renewing every {@code renewEvery} instead of ttl/3. */
    public Lease lease(String name, Duration ttl, String owner, Duration wait, Duration renewEvery) {
        return Lease.acquire(this, name, ttl, owner, wait, renewEvery);
    }

    /** Takes the built-in lock once (prefer {@link #lease}). */
    public Grant acquire(String name, Duration ttl, String owner) {
        Map<String, Object> b = new LinkedHashMap<>();
        b.put("owner", owner == null ? defaultOwner() : owner);
        b.put("ttl_ms", ttl.toMillis());
        return Grant.of(send("POST", "/v1/locks/" + segment(name), Json.encode(b), null).json());
    }

    /** Renews a lease; {@link LockLostException} if it is no longer yours. */
    public Grant renew(String name, String token, Duration ttl) {
        return Grant.of(send("POST", "/v1/locks/" + segment(name) + "/renew", Json.encode(Map.of("ttl_ms", ttl.toMillis())),
                Map.of("X-Fencing-Token", Tokens.check(token))).json());
    }

    /** Releases a lease; {@link LockLostException} if it was not yours. */
    public void release(String name, String token) {
        send("DELETE", "/v1/locks/" + segment(name), null, Map.of("X-Fencing-Token", Tokens.check(token)));
    }

    /** Who holds the lock, or empty when it is free. */
    public Optional<Holder> holder(String name) {
        try {
            return Optional.of(Holder.of(send("GET", "/v1/locks/" + segment(name), null, null).json()));
        } catch (NotFoundException free) {
            return Optional.empty();
        }
    }

    static String defaultOwner() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            host = "java";
        }
        return host + ":" + ProcessHandle.current().pid();
    }

    // ---- legacy tables ------------------------------------------------------------------------

    private static String tablePath(String resource, String key) {
        return "/v1/tables/" + segment(resource) + "/" + key;
    }

    /** A row of a configured table; key from {@link #rowKey}. */
    public Row tableGet(String resource, String key) {
        return Row.of(send("GET", tablePath(resource, key), null, null).json());
    }

    /** Replaces a row (columns not given get their defaults). */
    public WriteResult tablePut(String resource, String key, Map<String, ?> row, String token, String scope) {
        return tablePut(resource, key, row, token, scope, null);
    }

    /** Replaces a row with this Idempotency-Key (null: a new one). */
    public WriteResult tablePut(String resource, String key, Map<String, ?> row, String token, String scope,
            String idempotencyKey) {
        Response r = sendKeyed("PUT", tablePath(resource, key), Json.encode(row), write(token, scope, null, idempotencyKey));
        return WriteResult.of(r.status(), r.json(), replayed(r));
    }

    /** Updates the given columns of an existing row. */
    public WriteResult tablePatch(String resource, String key, Map<String, ?> row, String token, String scope) {
        return tablePatch(resource, key, row, token, scope, null);
    }

    /** Updates columns with this Idempotency-Key (null: a new one). */
    public WriteResult tablePatch(String resource, String key, Map<String, ?> row, String token, String scope,
            String idempotencyKey) {
        Response r = sendKeyed("PATCH", tablePath(resource, key), Json.encode(row), write(token, scope, null, idempotencyKey));
        return WriteResult.of(r.status(), r.json(), replayed(r));
    }

    /** Deletes a row; its tombstone keeps the fence. */
    public DeleteResult tableDelete(String resource, String key, String token, String scope) {
        return tableDelete(resource, key, token, scope, null);
    }

    /** Deletes a row with this Idempotency-Key (null: a new one). */
    public DeleteResult tableDelete(String resource, String key, String token, String scope, String idempotencyKey) {
        Response r = sendKeyed("DELETE", tablePath(resource, key), null, write(token, scope, null, idempotencyKey));
        return DeleteResult.of(r.json(), replayed(r));
    }

    // ---- admin (the admin right) --------------------------------------------------------------

    private AdminResult admin(String path, Map<String, Object> body) {
        return AdminResult.of(send("POST", path, Json.encode(body), null).json());
    }

    /** Lowers a scope's fence to {@code to} (audited). */
    public AdminResult resetFence(String scope, String to, String reason) {
        Map<String, Object> b = new LinkedHashMap<>();
        b.put("to", Tokens.check(to));
        b.put("reason", reason);
        return admin("/v1/admin/fences/" + segment(scope) + "/reset", b);
    }

    /** Ends a built-in lock's lease; its grants stop speaking for the scope (audited). */
    public AdminResult retireLock(String name, String reason) {
        return admin("/v1/admin/locks/" + segment(name) + "/retire", Map.of("reason", reason));
    }

    /** Binds every key under prefix to scope (null: unscoped); audited. */
    public AdminResult rebindKeys(String prefix, String scope, String reason) {
        Map<String, Object> b = new LinkedHashMap<>();
        b.put("prefix", prefix);
        b.put("scope", scope);
        b.put("reason", reason);
        return admin("/v1/admin/kv/rebind", b);
    }

    // ---- probes -------------------------------------------------------------------------------

    /** GET /healthz. */
    public void health() {
        send("GET", "/healthz", null, null);
    }

    /** GET /readyz: returns when ready, else {@link UnavailableException} saying why. */
    public void ready() {
        send("GET", "/readyz", null, null);
    }
}
