package dev.fencegate;

import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.Test;

class TransportTest {
    /** A private CA and a server certificate for 127.0.0.1 signed by it, made with openssl. */
    static void makeCA(Path dir) throws Exception {
        Support.run(List.of("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", dir.resolve("ca.key").toString(), "-out", dir.resolve("ca.pem").toString(), "-days", "2",
                "-subj", "/CN=fencegate test CA", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign"), Map.of());
        Support.run(List.of("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", dir.resolve("tls.key").toString(), "-out", dir.resolve("tls.csr").toString(), "-subj", "/CN=127.0.0.1"), Map.of());
        Files.writeString(dir.resolve("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                + "keyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n");
        Support.run(List.of("openssl", "x509", "-req", "-in", dir.resolve("tls.csr").toString(), "-CA", dir.resolve("ca.pem").toString(),
                "-CAkey", dir.resolve("ca.key").toString(), "-CAcreateserial", "-out", dir.resolve("tls.crt").toString(), "-days", "2",
                "-extfile", dir.resolve("ext.cnf").toString()), Map.of());
    }

    /** A fencegate serving HTTPS with a private CA's certificate: trusted with the CA option only. */
    @Test
    void caCertFileTrustsAPrivateCA() throws Exception {
        Path dir = Support.tempDir("fg-java-tls-");
        try {
            makeCA(dir);
            String config = "[server.tls]\ncert_file = \"" + dir.resolve("tls.crt") + "\"\nkey_file = \"" + dir.resolve("tls.key") + "\"\n";
            try (Support.Server s = new Support.Server(config, true, Map.of())) {
                URI url = URI.create("https://" + s.address);
                Fencegate c = Fencegate.builder(url).caCertFile(dir.resolve("ca.pem")).build();
                c.health();
                String k = Support.name("tls");
                assertEquals("1", c.put(k, "\"over tls\"", "1").fenceToken());
                raises(StaleTokenException.class, () -> c.put(k, "\"stale\"", "0"));
                TransportException t = raises(TransportException.class, () -> Fencegate.client(url).health());
                assertTrue(String.valueOf(t.getCause()).toLowerCase().contains("cert")
                        || String.valueOf(t.getCause()).toLowerCase().contains("handshake"), t.toString());
                raises(IllegalArgumentException.class, () -> Fencegate.builder(url).caCertFile(dir.resolve("none.pem")).build());
                raises(IllegalArgumentException.class, () -> Fencegate.builder(url).caCertFile(dir.resolve("ext.cnf")).build());
            }
        } finally {
            Support.deleteTree(dir);
        }
    }

    /**
     * A redirect to another origin is never followed: no token, scope, credential or body
     * leaves. One to the same origin is followed with them.
     */
    @Test
    void redirectsToAnotherOriginAreRefused() throws Exception {
        List<String> elsewhere = new CopyOnWriteArrayList<>();
        List<String> seen = new CopyOnWriteArrayList<>();
        HttpServer other = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        other.createContext("/", x -> {
            elsewhere.add(x.getRequestURI().toString());
            x.sendResponseHeaders(200, -1);
            x.close();
        });
        HttpServer origin = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        String otherUrl = "http://127.0.0.1:" + other.getAddress().getPort();
        origin.createContext("/", x -> {
            String body = new String(x.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            seen.add(x.getRequestURI().getPath() + " " + x.getRequestHeaders().getFirst("X-Fencing-Token") + " "
                    + x.getRequestHeaders().getFirst("X-Fencing-Scope") + " " + body);
            switch (x.getRequestURI().getPath()) {
                case "/v1/kv/away" -> {
                    x.getResponseHeaders().add("Location", otherUrl + "/v1/kv/away");
                    x.sendResponseHeaders(307, -1);
                }
                case "/v1/kv/moved" -> {
                    x.getResponseHeaders().add("Location", "/v1/kv/here");
                    x.sendResponseHeaders(308, -1);
                }
                default -> {
                    byte[] b = "{\"key\":\"here\",\"fence_token\":\"7\",\"scope\":\"s\"}".getBytes(StandardCharsets.UTF_8);
                    x.sendResponseHeaders(201, b.length);
                    x.getResponseBody().write(b);
                }
            }
            x.close();
        });
        other.start();
        origin.start();
        try {
            Fencegate c = Fencegate.builder(URI.create("http://127.0.0.1:" + origin.getAddress().getPort())).apiKey("secret").build();
            TransportException t = raises(TransportException.class, () -> c.put("away", "{\"v\":1}", "7", "s"));
            assertTrue(t.getMessage().contains("another origin"), t.getMessage());
            assertEquals(List.of(), elsewhere);
            var w = c.put("moved", "{\"v\":2}", "7", "s");
            assertEquals("here", w.key());
            assertTrue(w.created());
            assertEquals("/v1/kv/here 7 s {\"v\":2}", seen.get(seen.size() - 1));
        } finally {
            origin.stop(0);
            other.stop(0);
        }
    }
}
