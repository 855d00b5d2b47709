package dev.fencegate;

import java.util.LinkedHashMap;
import java.util.Map;

/** One operation of a batch. Values and rows: JSON text ({@code "{\"n\":1}"}) or a Map/List/... */
public final class Op {
    final Map<String, Object> json = new LinkedHashMap<>();

    private Op(String op) {
        json.put("op", op);
    }

    static Object value(Object v) {
        return v instanceof String s ? Json.raw(s) : v;
    }

    /** Writes {@code valueJson} (JSON text) to key. */
    public static Op put(String key, String valueJson) {
        return putValue(key, Json.raw(valueJson));
    }

    /** Writes a value (Map, List, Number, ... encoded by {@link Json}) to key. */
    public static Op putValue(String key, Object value) {
        Op o = new Op("put");
        o.json.put("key", key);
        o.json.put("value", value);
        return o;
    }

    /** Deletes key. */
    public static Op delete(String key) {
        Op o = new Op("delete");
        o.json.put("key", key);
        return o;
    }

    /** Replaces a table row; {@code key} from {@link Fencegate#rowKey}. */
    public static Op tablePut(String resource, String key, Map<String, ?> row) {
        return table("put", resource, key, row);
    }

    /** Updates columns of a table row. */
    public static Op tablePatch(String resource, String key, Map<String, ?> row) {
        return table("patch", resource, key, row);
    }

    /** Deletes a table row. */
    public static Op tableDelete(String resource, String key) {
        return table("delete", resource, key, null);
    }

    private static Op table(String op, String resource, String key, Map<String, ?> row) {
        Op o = new Op(op);
        o.json.put("resource", resource);
        o.json.put("key", key);
        if (row != null) o.json.put("row", row);
        return o;
    }

    /** A raw op, as JSON members (for ops this version does not name). */
    public static Op of(Map<String, ?> members) {
        Op o = new Op("put");
        o.json.clear();
        o.json.putAll(members);
        return o;
    }
}
