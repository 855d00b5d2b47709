package dev.fencegate;

import static dev.fencegate.Support.client;
import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.math.BigDecimal;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ErrorsTest {
    final Fencegate c = client();

    /** The type URIs in the running server's /openapi.json: every string starting with the base. */
    static TreeSet<String> problemTypes() throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(
                HttpRequest.newBuilder(URI.create(Support.url() + "/openapi.json")).build(), HttpResponse.BodyHandlers.ofString());
        assertEquals(200, r.statusCode());
        TreeSet<String> out = new TreeSet<>();
        List<Object> stack = new ArrayList<>(List.of(Json.parse(r.body())));
        while (!stack.isEmpty()) {
            Object v = stack.remove(stack.size() - 1);
            if (v instanceof Map<?, ?> m) stack.addAll(m.values());
            else if (v instanceof List<?> l) stack.addAll(l);
            else if (v instanceof String s && s.startsWith(Problems.BASE)) out.add(s);
        }
        return out;
    }

    /**
     * Every problem type the server defines has an exception class of its own, named after it
     * (stale-token: StaleTokenException). A type the server adds that this library does not map
     * fails here.
     */
    @Test
    void everyProblemTypeOfTheServerHasItsException() throws Exception {
        TreeSet<String> types = problemTypes();
        assertTrue(types.size() >= 30, "only " + types.size() + " problem types in /openapi.json: " + types);
        List<String> wrong = new ArrayList<>();
        for (String uri : types) {
            String slug = uri.substring(Problems.BASE.length());
            FencegateException e = Problems.parse(409, Map.of(),
                    "{\"type\":\"" + uri + "\",\"title\":\"t\",\"status\":409,\"detail\":\"d\"}");
            StringBuilder want = new StringBuilder();
            for (String part : slug.split("-")) want.append(Character.toUpperCase(part.charAt(0))).append(part.substring(1));
            want.append("Exception");
            if (e instanceof UnknownProblemException || !e.getClass().getSimpleName().equalsIgnoreCase(want.toString())) {
                wrong.add(uri + " -> " + e.getClass().getSimpleName() + " (want " + want + ")");
            }
            assertEquals(uri, e.type());
            assertEquals(slug, e.slug());
            assertEquals("d", e.detail());
        }
        assertTrue(wrong.isEmpty(), "problem types without their exception: " + wrong);
        assertEquals(types.size(), Problems.slugs().size(), "the library maps other types than the server defines");
        FencegateException unknown = Problems.parse(418, Map.of(), "{\"type\":\"" + Problems.BASE + "brand-new\",\"x\":\"1\"}");
        assertInstanceOf(UnknownProblemException.class, unknown);
        assertEquals("1", unknown.body().get("x"));
        assertEquals(418, unknown.status());
    }

    @Test
    void refusalsOfTheServerUnderTest() {
        String k = Support.name("refusals");
        raises(InvalidKeyException.class, () -> c.put(k + "\u0001", "1", "1"));
        raises(InvalidKeyException.class, () -> c.put("x".repeat(600), "1", "1"));
        raises(InvalidScopeException.class, () -> c.put(k, "1", "1", "bad\u0002scope"));
        raises(InvalidJsonException.class, () -> c.put(k, "\"nul \\u0000 inside\"", "1"));
        raises(InvalidBatchException.class, () -> c.batch(List.of(Op.of(Map.of("op", "frobnicate", "key", k))), "1", null));
        raises(InvalidRequestException.class, () -> c.acquire(k, Duration.ZERO, "x"));
        assertEquals(404, raises(NotFoundException.class, () -> c.send("GET", "/v1/nothing-here", null, null)).status());
        raises(MethodNotAllowedException.class, () -> c.send("PATCH", "/v1/kv/" + k, "1", Map.of("X-Fencing-Token", "1")));
        payloadTooLarge(k);
        raises(UnsupportedMediaTypeException.class,
                () -> c.send("PUT", "/v1/kv/" + k, "1", Map.of("X-Fencing-Token", "1", "Content-Type", "text/plain")));
        raises(MisdirectedRequestException.class, () -> c.send("GET", "/v1/kv/" + k, null, Map.of("Host", "rebound.example")));

        c.put(k, "1", "5", k + "-a");
        ScopeMismatchException sm = raises(ScopeMismatchException.class, () -> c.put(k, "1", "5", k + "-b"));
        assertEquals(List.of(409, k, k + "-a", k + "-b"), List.of(sm.status(), sm.key(), sm.scope(), sm.presentedScope()));
        assertTrue(sm.isFencing());

        var g = c.acquire(k, Duration.ofSeconds(5), "holder-1");
        LockHeldException held = raises(LockHeldException.class, () -> c.acquire(k, Duration.ofSeconds(5), "holder-2"));
        assertEquals("holder-1", held.holder());
        assertTrue(held.remainingMs() > 0);
        String wrong = g.token().equals("1") ? "2" : "1";
        assertEquals("holder-1", raises(LockLostException.class, () -> c.renew(k, wrong, Duration.ofSeconds(5))).holder());
        String next = Tokens.of(Long.parseLong(g.token()) + 1);
        TokenNotIssuedException ni = raises(TokenNotIssuedException.class, () -> c.put(k + "/k", "1", next, k));
        assertEquals(List.of(next, g.token(), k), List.of(ni.presented(), ni.latestIssued(), ni.scope()));
        c.release(k, g.token());
        c.claim(k + "-max", Tokens.MAX);
        raises(LockExhaustedException.class, () -> c.acquire(k + "-max", Duration.ofSeconds(1), null));
        c.claim(k + "-reset", "10");
        raises(ResetNotBelowException.class, () -> c.resetFence(k + "-reset", "10", "not below"));
    }

    /**
     * The server answers 413 on the declared length and closes the connection without reading
     * the body; the JDK may see that close (a reset) before it reads the answer, and then has no
     * answer (a TransportException). So: a few tries, and the typed 413 must come.
     */
    void payloadTooLarge(String k) {
        String big = "x".repeat(2 << 20);
        for (int i = 0; i < 10; i++) {
            try {
                c.putValue(k, big, "1", null);
                fail("a body over the limit was accepted");
            } catch (PayloadTooLargeException expected) {
                assertEquals(413, expected.status());
                return;
            } catch (TransportException resetFirst) {
                // the race above; try again
            }
        }
        fail("no 413 in 10 tries");
    }

    @Test
    void noAnswerIsATransportError() throws Exception {
        Fencegate nobody = Fencegate.builder(URI.create("http://127.0.0.1:" + Support.freePort())).timeout(Duration.ofSeconds(10)).build();
        TransportException t = raises(TransportException.class, () -> nobody.get("x"));
        assertEquals(0, t.status());
        raises(IllegalArgumentException.class, () -> Fencegate.client(URI.create("ftp://x")));
    }

    // ---- on a server of our own: auth, issuers, reserved names, the jump cap, a binding, a table ----

    static final String ADMIN_KEY = "fgk_admin_java_client_test_0123456789";
    static final String LIMITED_KEY = "fgk_limited_java_client_test_0123456789";
    static final String HMAC = "a-secret-of-at-least-thirty-two-bytes-for-the-java-tests";
    static final String TABLE = "javaclient_orders_" + Support.RUN.replace("-", "");
    KeyPair ed;
    byte[] edSeed;
    Support.Server strict;
    Fencegate admin;

    static String sha(String k) throws Exception {
        return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(k.getBytes(StandardCharsets.UTF_8)));
    }

    @BeforeAll
    void startStrict() throws Exception {
        ed = KeyPairGenerator.getInstance("Ed25519").generateKeyPair();
        byte[] pk8 = ed.getPrivate().getEncoded();
        edSeed = Arrays.copyOfRange(pk8, pk8.length - 32, pk8.length);
        byte[] x509 = ed.getPublic().getEncoded();
        String pub = Base64.getEncoder().encodeToString(Arrays.copyOfRange(x509, x509.length - 32, x509.length));
        Support.psql("CREATE TABLE IF NOT EXISTS public." + TABLE + " (tenant text NOT NULL, order_no integer NOT NULL, "
                + "amount integer NOT NULL DEFAULT 0 CHECK (amount >= 0), note text, PRIMARY KEY (tenant, order_no))");
        String config = """
                [kv]
                max_token_jump = 1000

                [locks]
                names = ["reserved/"]

                [[scopes]]
                name = "bound"
                keys = ["bound/"]

                [[issuers]]
                name = "hm"
                scopes = ["hm/"]
                hmac_sha256_secret_env = "JAVATEST_FG_HMAC"

                [[issuers]]
                name = "ed"
                scopes = ["ed/"]
                ed25519_public_key = "%s"

                [[resources]]
                name = "orders"
                table = "public.%s"
                key = ["tenant", "order_no"]
                fence = "ledger"

                [[auth.keys]]
                name = "admin"
                sha256 = "%s"
                rights = ["admin"]
                prefixes = [""]
                tables = ["orders"]

                [[auth.keys]]
                name = "limited"
                sha256 = "%s"
                rights = ["read", "write"]
                prefixes = ["mine/"]
                """.formatted(pub, TABLE, sha(ADMIN_KEY), sha(LIMITED_KEY));
        strict = new Support.Server(config, false, Map.of("JAVATEST_FG_HMAC", HMAC));
        admin = Fencegate.builder(URI.create(strict.url())).apiKey(ADMIN_KEY).build();
    }

    @AfterAll
    void stopStrict() throws Exception {
        if (strict != null) strict.close();
        Support.psql("DROP TABLE IF EXISTS public." + TABLE);
    }

    @Test
    void unauthenticatedAndForbidden() {
        String k = Support.RUN;
        for (Fencegate x : List.of(Fencegate.client(URI.create(strict.url())),
                Fencegate.builder(URI.create(strict.url())).apiKey("fgk_nope").build())) {
            UnauthenticatedException e = raises(UnauthenticatedException.class, () -> x.get("mine/" + k));
            assertEquals(401, e.status());
            assertTrue(e.header("WWW-Authenticate").toLowerCase().startsWith("bearer"));
        }
        Fencegate lim = Fencegate.builder(URI.create(strict.url())).apiKey(LIMITED_KEY).build();
        lim.put("mine/" + k, "1", "1");
        ForbiddenException f = raises(ForbiddenException.class, () -> lim.put("theirs/" + k, "1", "1"));
        assertEquals(List.of(403, "write", "theirs/" + k), List.of(f.status(), f.right(), f.name()));
    }

    @Test
    void tokenJumpAndReservedScopes() {
        String k = Support.RUN;
        admin.put("jump/" + k, "1", "500");
        TokenJumpException j = raises(TokenJumpException.class, () -> admin.put("jump/" + k, "1", "5000"));
        assertEquals(List.of("5000", "500", "1000", "jump/" + k), List.of(j.presented(), j.current(), j.maxJump(), j.key()));
        String scope = "reserved/" + k;
        TokenNotIssuedException ni = raises(TokenNotIssuedException.class, () -> admin.claim(scope, "1"));
        assertEquals("0", ni.latestIssued());
        try (Lease l = admin.lease(scope, Duration.ofSeconds(5), "reserved")) {
            assertEquals(l.token(), l.put(scope + "/k", "\"fine\"").fenceToken());
        }
    }

    @Test
    void issuerProofs() {
        String k = Support.RUN;
        String scope = "hm/" + k;
        byte[] secret = HMAC.getBytes(StandardCharsets.UTF_8);
        raises(MissingTokenProofException.class, () -> admin.put(scope + "/k", "1", "3", scope));
        InvalidTokenProofException ip = raises(InvalidTokenProofException.class,
                () -> admin.put(scope + "/k", "1", "3", scope, Proofs.hmac(secret, scope, "4")));
        assertTrue(ip.isFencing());
        assertEquals("3", admin.put(scope + "/k", "1", "3", scope, Proofs.hmac(secret, scope, "3")).fenceToken());
        Fencegate signed = Fencegate.builder(URI.create(strict.url())).apiKey(ADMIN_KEY).signer((s, t) -> Proofs.hmac(secret, s, t)).build();
        assertEquals("7", signed.claim(scope, "7").fenceToken());
        signed.batch(List.of(Op.put(scope + "/b", "2")), "7", scope);
        String escope = "ed/" + k + " café";
        raises(InvalidTokenProofException.class, () -> admin.put(k + "/ed", "1", "9", escope, Proofs.hmac(secret, escope, "9")));
        assertEquals(escope, admin.put(k + "/ed", "1", "9", escope, Proofs.ed25519(edSeed, escope, "9")).scope());
        assertEquals(escope, admin.put(k + "/ed", "1", "9", escope, Proofs.ed25519(ed.getPrivate(), escope, "9")).scope());
        ScopeHasIssuerException sh = raises(ScopeHasIssuerException.class, () -> admin.acquire(scope, Duration.ofSeconds(1), null));
        assertEquals(List.of(scope, "hm"), List.of(sh.scope(), sh.issuer()));
    }

    @Test
    void bindingConflict() {
        raises(ScopeMismatchException.class, () -> admin.put("bound/" + Support.RUN, "1", "1", "elsewhere"));
        raises(BindingConflictException.class, () -> admin.rebindKeys("bound/", null, "contradicts [[scopes]]"));
    }

    @Test
    void tables() {
        String key = Fencegate.rowKey("acme," + Support.RUN, 42); // a comma inside a value is encoded for you
        var w = admin.tablePut("orders", key, Map.of("amount", 10, "note", "first"), "3", null);
        assertTrue(w.created());
        assertEquals("orders", w.resource());
        var row = admin.tableGet("orders", key);
        assertEquals(new BigDecimal(10), row.row().get("amount"));
        assertEquals("acme," + Support.RUN, row.row().get("tenant"));
        assertEquals("3", row.fenceToken());
        admin.tablePatch("orders", key, Map.of("note", "patched"), "3", null);
        StaleTokenException st = raises(StaleTokenException.class, () -> admin.tablePut("orders", key, Map.of("amount", 1), "2", null));
        assertEquals(List.of("orders", "3", "2"), List.of(st.resource(), st.current(), st.presented()));
        assertEquals(422, raises(InvalidValueException.class, () -> admin.tablePut("orders", key, Map.of("amount", -1), "3", null)).status());
        assertEquals("no_such_column",
                raises(InvalidRowException.class, () -> admin.tablePut("orders", key, Map.of("no_such_column", 1), "3", null)).column());
        assertEquals("order_no", raises(InvalidKeyException.class, () -> admin.tableGet("orders", Fencegate.rowKey("acme", "nan"))).column());
        var b = admin.batch(List.of(Op.tablePatch("orders", key, Map.of("amount", 11)), Op.put("tables/" + Support.RUN, "1")), "4", null);
        assertEquals(List.of(200, 201), List.of(b.results().get(0).status(), b.results().get(1).status()));
        assertTrue(admin.tableDelete("orders", key, "4", null).deleted());
        raises(NotFoundException.class, () -> admin.tableGet("orders", key));
        raises(NotFoundException.class, () -> admin.tableGet("no-such-resource", "1"));
    }

    @Test
    void unavailableWhenNotMigrated() throws Exception {
        try (Support.Server s = new Support.Server("[database]\nmigrate_on_start = false\n", true, Map.of())) {
            UnavailableException u = raises(UnavailableException.class, () -> Fencegate.client(URI.create(s.url())).ready());
            assertEquals(503, u.status());
            assertEquals("1", u.retryAfter());
        }
    }

    /** The proofs this library signs are the ones `fencegate sign` prints. */
    @Test
    void proofsMatchFencegateSign() throws Exception {
        Path dir = Support.tempDir("fg-java-sign-");
        try {
            Path keyFile = dir.resolve("ed.key");
            Files.writeString(keyFile, Base64.getEncoder().encodeToString(edSeed));
            byte[] secret = HMAC.getBytes(StandardCharsets.UTF_8);
            for (String[] c : new String[][] {{"jobs/a", "1"}, {"caf\u00e9 \u202e", Tokens.MAX}, {"x", "9007199254740993"}}) {
                String bin = Support.env("FENCEGATE_BIN");
                String hm = Support.run(List.of(bin, "sign", "--scope", c[0], "--token", c[1], "--hmac-secret-env", "JAVATEST_FG_HMAC"),
                        Map.of("JAVATEST_FG_HMAC", HMAC)).trim();
                assertEquals(hm, Proofs.hmac(secret, c[0], c[1]));
                String e = Support.run(List.of(bin, "sign", "--scope", c[0], "--token", c[1], "--ed25519-key-file", keyFile.toString()),
                        Map.of()).trim();
                assertEquals(e, Proofs.ed25519(edSeed, c[0], c[1]));
            }
        } finally {
            Support.deleteTree(dir);
        }
    }

    @Test
    void noRefusalIsSilent() {
        assertFalse(new NotFoundException(new Problem(404, null, null, null, Map.of(), Map.of())).isFencing());
        if (Problems.slugs().contains("")) fail("an empty slug");
    }
}
