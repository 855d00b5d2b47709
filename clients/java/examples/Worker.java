import dev.fencegate.Fencegate;
import dev.fencegate.LeaseLostException;
import dev.fencegate.StaleTokenException;
import java.time.Duration;

/**
 * A worker that adopts fencing: takes the built-in lock "nightly", writes under it, and stops the
 * moment the lease is lost. Build the library, then:
 *
 * <pre>
 *   javac -d build/classes $(find src/main/java -name '*.java')
 *   java -cp build/classes examples/Worker.java        # FENCEGATE_URL=http://127.0.0.1:8080
 * </pre>
 */
public class Worker {
    public static void main(String[] args) throws Exception {
        var client = Fencegate.fromEnv();
        try (var lease = client.lease("nightly", Duration.ofSeconds(10), "worker-1", Duration.ofMinutes(1))) {
            for (int step = 0; step < 3; step++) {
                lease.put("invoice-7", "{\"total\":120,\"step\":" + step + "}"); // token and scope sent for you
                Thread.sleep(1000);
            }
            System.out.println("done under token " + lease.token());
        } catch (StaleTokenException e) {
            System.err.println("a newer holder exists (our token " + e.presented() + ", the fence " + e.current() + "): stopping");
            System.exit(3);
        } catch (LeaseLostException e) {
            System.err.println(e.getMessage());
            System.exit(3);
        }
    }
}
