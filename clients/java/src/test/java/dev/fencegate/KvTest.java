package dev.fencegate;

import static dev.fencegate.Support.client;
import static dev.fencegate.Support.raises;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fencegate.Results.BatchResult;
import dev.fencegate.Results.Entry;
import dev.fencegate.Results.WriteResult;
import java.math.BigDecimal;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class KvTest {
    final Fencegate c = client();

    @Test
    void writesReadsAndDeletesWithTokensAsStrings() {
        String k = Support.name("kv");
        String big = "9007199254740993"; // 2^53 + 1: a double would send ...992
        WriteResult w = c.put(k, "{\"total\":120}", big);
        assertTrue(w.created());
        assertEquals(big, w.fenceToken());
        assertNull(w.scope());
        assertFalse(c.putValue(k, Map.of("total", 121), big, null).created());
        Entry e = c.get(k);
        assertEquals("{\"total\":121}", e.valueJson());
        assertEquals(new BigDecimal(121), ((Map<?, ?>) e.value()).get("total"));
        assertEquals(big, e.fenceToken());
        assertTrue(c.delete(k, Tokens.MAX, null).deleted());
        raises(NotFoundException.class, () -> c.get(k));
        StaleTokenException st = raises(StaleTokenException.class, () -> c.put(k, "1", big)); // the tombstone keeps the fence
        assertEquals(big, st.presented());
        assertEquals(Tokens.MAX, st.current());
        assertEquals(k, st.key());
        // slashes, spaces, non-ASCII, percent: one path segment
        String odd = k + "/a b/café %+";
        c.put(odd, "\"x\"", "1");
        assertEquals(odd, c.get(odd).key());
    }

    @Test
    void aStaleWriteIsTypedWithBothTokens() {
        String k = Support.name("stale");
        String scope = k + "-lock";
        c.put(k, "\"new\"", "34", scope);
        StaleTokenException st = raises(StaleTokenException.class, () -> c.put(k, "\"zombie\"", "33", scope));
        assertEquals("33", st.presented());
        assertEquals("34", st.current());
        assertEquals(scope, st.scope());
        assertEquals(412, st.status());
        assertEquals(Problems.BASE + "stale-token", st.type());
        assertTrue(st.isFencing());
        assertTrue(st.requestId() != null && !st.requestId().isEmpty());
        assertEquals("\"new\"", c.get(k).valueJson());
    }

    @Test
    void batchesClaimsAndFences() {
        String k = Support.name("batch");
        String scope = k + "-scope";
        BatchResult r = c.batch(List.of(Op.put(k + "/a", "1"), Op.putValue(k + "/b", Map.of("n", 2)), Op.delete(k + "/c")), "5", scope);
        assertEquals("5", r.fenceToken());
        assertEquals(scope, r.scope());
        assertEquals(3, r.results().size());
        assertEquals(201, r.results().get(0).status());
        assertEquals("9", c.claim(scope, "9").fenceToken());
        assertEquals("9", c.fence(scope).fenceToken());
        raises(NotFoundException.class, () -> c.fence(scope + "-never"));
        StaleTokenException st = raises(StaleTokenException.class, () -> c.batch(List.of(Op.put(k + "/a", "\"zombie\"")), "8", scope));
        assertEquals("8", st.presented());
        assertEquals("9", st.current());
        assertEquals("1", c.get(k + "/a").valueJson()); // all or nothing
        c.put(k + "/x", "1", "7");
        c.put(k + "/y", "1", "8");
        StaleTokenException keys = raises(StaleTokenException.class, () -> c.batch(List.of(Op.put(k + "/x", "2"), Op.put(k + "/y", "2")), "6", null));
        assertEquals(2, keys.staleKeys().size());
    }

    @Test
    void tokensAreCheckedBeforeSending() {
        String k = Support.name("tokens");
        for (String bad : List.of("-1", "007", "1e3", "0x10", " 1", "9223372036854775808", "1.0")) {
            raises(IllegalArgumentException.class, () -> c.put(k, "1", bad));
        }
        raises(IllegalArgumentException.class, () -> c.put(k, "{not json", "1"));
        // sent anyway: the server's own refusal, typed
        raises(MalformedTokenException.class, () -> c.send("PUT", "/v1/kv/" + Fencegate.segment(k), "1", Map.of("X-Fencing-Token", "007")));
        raises(MissingTokenException.class, () -> c.put(k, "1", null));
    }

    @Test
    void adapters() {
        assertEquals("42", Tokens.zooKeeperSequence("/locks/job/_c_2f6a-lock-0000000042"));
        assertEquals(Tokens.MAX, Tokens.zooKeeperSequence("lock-9223372036854775807"));
        assertEquals("4294967298", Tokens.zooKeeperZxid(0x100000002L));
        assertEquals("1234567", Tokens.etcdRevision(1234567));
        assertEquals("7", Tokens.redisIncr(7));
        assertEquals("12", Tokens.redisson(12L));
        assertEquals("3", Tokens.hazelcastFence(3));
        raises(IllegalArgumentException.class, () -> Tokens.redisson(null));
        raises(IllegalArgumentException.class, () -> Tokens.zooKeeperSequence("/locks/job/lock-42"));
        raises(IllegalArgumentException.class, () -> Tokens.etcdRevision(0));
        raises(IllegalArgumentException.class, () -> Tokens.of(-1));
    }

    @Test
    void jsonRoundTrips() {
        String text = "{\"a\":[1,-2.5e3,true,false,null,\"\\u00e9\\n\\\"\"],\"b\":{},\"n\":9223372036854775807123}";
        Object v = Json.parse(text);
        assertEquals(Json.parse(Json.encode(v)), v);
        assertEquals(new BigDecimal("9223372036854775807123"), ((Map<?, ?>) v).get("n"));
        raises(IllegalArgumentException.class, () -> Json.parse("{\"a\":1,}"));
        raises(IllegalArgumentException.class, () -> Json.parse("[1] x"));
        raises(IllegalArgumentException.class, () -> Json.encode(Double.NaN));
    }
}
