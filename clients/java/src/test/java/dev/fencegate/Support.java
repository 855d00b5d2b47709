package dev.fencegate;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.function.Executable;

/**
 * The fencegate under test (FENCEGATE_URL), its binary for servers of our own with other
 * configurations (FENCEGATE_BIN) and the PostgreSQL database those use (DATABASE_URL). Nothing
 * here skips: a missing setting or tool fails the test and says what is missing.
 */
final class Support {
    private Support() {}

    static final String RUN = UUID.randomUUID().toString().substring(0, 10);

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) fail(name + " is not set: run clients/java/test.sh (FENCEGATE_URL, FENCEGATE_BIN, DATABASE_URL)");
        return v;
    }

    static String url() {
        return env("FENCEGATE_URL").replaceAll("/+$", "");
    }

    static Fencegate client() {
        return Fencegate.builder(URI.create(url())).timeout(Duration.ofSeconds(60)).build();
    }

    /** A name unique to this run and test: keys, scopes and locks live for ever in fencegate. */
    static String name(String test) {
        return "java-" + RUN + "-" + test;
    }

    static <T extends Throwable> T raises(Class<T> type, Executable e) {
        return assertThrows(type, e);
    }

    /** Polls cond until it holds or the (generous) deadline passes. */
    static void eventually(String what, Duration within, BooleanSupplier cond) throws InterruptedException {
        long until = System.nanoTime() + within.toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() - until > 0) fail(what + ": not within " + within);
            Thread.sleep(20);
        }
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    static Path tempDir(String prefix) throws IOException {
        return Files.createTempDirectory(prefix);
    }

    static void deleteTree(Path p) {
        try (var walk = Files.walk(p)) {
            walk.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
        } catch (IOException ignored) {
            // best effort
        }
    }

    static String run(List<String> cmd, Map<String, String> env) throws IOException, InterruptedException {
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
        pb.environment().putAll(env);
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(120, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            fail(cmd + " did not finish");
        }
        if (p.exitValue() != 0) fail(cmd + " failed (" + p.exitValue() + "):\n" + out);
        return out;
    }

    static void psql(String sql) throws IOException, InterruptedException {
        String db = env("DATABASE_URL");
        if (!db.startsWith("postgres")) fail("DATABASE_URL must be a PostgreSQL URL, got " + db);
        run(List.of("psql", db, "-v", "ON_ERROR_STOP=1", "-qc", sql), Map.of());
    }

    // ---- servers of our own -------------------------------------------------------------------

    /** A `fencegate serve` on a free port with this config; close() stops it and removes its dir. */
    static final class Server implements AutoCloseable {
        final Process proc;
        final Path dir;
        final String address;

        Server(String config, boolean sqlite, Map<String, String> extraEnv) throws Exception {
            dir = tempDir("fg-java-");
            Path cfg = dir.resolve("fencegate.toml");
            Files.writeString(cfg, config);
            ProcessBuilder pb = new ProcessBuilder(env("FENCEGATE_BIN"), "serve", "--listen", "127.0.0.1:0", "--config", cfg.toString())
                    .directory(dir.toFile())
                    .redirectError(dir.resolve("stderr.log").toFile());
            pb.environment().remove("FENCEGATE_CONFIG");
            pb.environment().remove("FENCEGATE_LISTEN");
            if (sqlite) pb.environment().remove("DATABASE_URL");
            else env("DATABASE_URL");
            pb.environment().putAll(extraEnv);
            proc = pb.start();
            BufferedReader out = new BufferedReader(new InputStreamReader(proc.getInputStream(), StandardCharsets.UTF_8));
            CompletableFuture<String> line = CompletableFuture.supplyAsync(() -> {
                try {
                    String l = out.readLine();
                    Thread drain = new Thread(() -> {
                        try {
                            while (out.readLine() != null) {}
                        } catch (IOException ignored) {
                            // the server stopped
                        }
                    });
                    drain.setDaemon(true);
                    drain.start();
                    return l;
                } catch (IOException e) {
                    return null;
                }
            });
            String l;
            try {
                l = line.get(60, TimeUnit.SECONDS);
            } catch (Exception e) {
                l = null;
            }
            if (l == null || !l.startsWith("listening on ")) {
                close();
                fail("fencegate did not start: " + l + "\n" + log());
            }
            address = l.substring("listening on ".length()).trim();
        }

        String url() {
            return "http://" + address;
        }

        String log() {
            try {
                return Files.readString(dir.resolve("stderr.log"));
            } catch (IOException e) {
                return "";
            }
        }

        @Override
        public void close() throws InterruptedException {
            proc.destroy();
            if (!proc.waitFor(15, TimeUnit.SECONDS)) {
                proc.destroyForcibly();
                proc.waitFor(15, TimeUnit.SECONDS);
            }
            deleteTree(dir);
        }
    }

    // ---- Redis: a server of our own, and a tiny RESP client -----------------------------------

    static final class Redis implements AutoCloseable {
        final Process proc;
        final Path dir;
        Socket socket;
        InputStream in;
        OutputStream out;

        Redis() throws Exception {
            dir = tempDir("fg-java-redis-");
            int port = freePort();
            proc = new ProcessBuilder("redis-server", "--port", String.valueOf(port), "--bind", "127.0.0.1", "--dir", dir.toString(),
                    "--save", "", "--appendonly", "no")
                    .redirectErrorStream(true).redirectOutput(dir.resolve("redis.log").toFile()).start();
            eventually("redis-server accepts connections", Duration.ofSeconds(30), () -> {
                try {
                    socket = new Socket("127.0.0.1", port);
                    socket.setSoTimeout(30_000);
                    in = socket.getInputStream();
                    out = socket.getOutputStream();
                    return "PONG".equals(call("PING"));
                } catch (IOException e) {
                    return false;
                }
            });
        }

        synchronized Object call(String... args) throws IOException {
            StringBuilder b = new StringBuilder("*" + args.length + "\r\n");
            for (String a : args) {
                byte[] bytes = a.getBytes(StandardCharsets.UTF_8);
                b.append('$').append(bytes.length).append("\r\n").append(a).append("\r\n");
            }
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            return read();
        }

        private String line() throws IOException {
            StringBuilder b = new StringBuilder();
            int c;
            while ((c = in.read()) != '\n') {
                if (c < 0) throw new IOException("redis closed the connection");
                if (c != '\r') b.append((char) c);
            }
            return b.toString();
        }

        private Object read() throws IOException {
            String l = line();
            switch (l.charAt(0)) {
                case '+':
                    return l.substring(1);
                case '-':
                    throw new IOException("redis: " + l.substring(1));
                case ':':
                    return Long.parseLong(l.substring(1));
                case '$': {
                    int n = Integer.parseInt(l.substring(1));
                    if (n < 0) return null;
                    byte[] buf = in.readNBytes(n + 2);
                    return new String(buf, 0, n, StandardCharsets.UTF_8);
                }
                case '*': {
                    int n = Integer.parseInt(l.substring(1));
                    List<Object> out = new ArrayList<>();
                    for (int i = 0; i < n; i++) out.add(read());
                    return out;
                }
                default:
                    throw new IOException("unexpected RESP " + l);
            }
        }

        @Override
        public void close() throws Exception {
            if (socket != null) socket.close();
            proc.destroyForcibly();
            proc.waitFor(15, TimeUnit.SECONDS);
            deleteTree(dir);
        }
    }
}
