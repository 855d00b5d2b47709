package dev.fencegate;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A tiny JSON encoder and decoder, so the library needs nothing but the JDK.
 *
 * <p>Decoding gives {@code Map<String,Object>} (insertion ordered), {@code List<Object>},
 * {@code String}, {@code BigDecimal} (numbers, exactly), {@code Boolean} and {@code null}.
 * Encoding takes those, any {@code Number}, {@code Collection}, arrays of objects, and
 * {@link Raw} (JSON text sent as it is).
 */
public final class Json {
    private Json() {}

    /** JSON text to be sent as it is (checked to be one valid JSON value). */
    public record Raw(String text) {
        public Raw {
            parse(text); // refuse invalid JSON before anything is sent
        }

        @Override
        public String toString() {
            return text;
        }
    }

    /** JSON text, as it is: {@code Json.raw("{\"total\":120}")}. */
    public static Raw raw(String text) {
        return new Raw(text);
    }

    // ---- encoding ----------------------------------------------------------------------------

    /** The JSON text of a value (see the class comment for the types taken). */
    public static String encode(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof Raw r) {
            b.append(r.text());
        } else if (v instanceof String s) {
            quote(b, s);
        } else if (v instanceof Boolean bool) {
            b.append(bool);
        } else if (v instanceof Double d && (d.isNaN() || d.isInfinite())
                || v instanceof Float f && (f.isNaN() || f.isInfinite())) {
            throw new IllegalArgumentException("JSON has no NaN or infinity: " + v);
        } else if (v instanceof BigDecimal d) {
            b.append(d.toString());
        } else if (v instanceof Number n) {
            b.append(n.toString());
        } else if (v instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!(e.getKey() instanceof String k)) {
                    throw new IllegalArgumentException("JSON object keys are strings, got " + e.getKey());
                }
                if (!first) b.append(',');
                first = false;
                quote(b, k);
                b.append(':');
                write(b, e.getValue());
            }
            b.append('}');
        } else if (v instanceof Collection<?> c) {
            b.append('[');
            boolean first = true;
            for (Object x : c) {
                if (!first) b.append(',');
                first = false;
                write(b, x);
            }
            b.append(']');
        } else if (v instanceof Object[] a) {
            write(b, List.of(a));
        } else if (v instanceof Character ch) {
            quote(b, ch.toString());
        } else {
            throw new IllegalArgumentException("cannot encode " + v.getClass().getName()
                    + " as JSON: pass a Map, List, String, Number, Boolean, null or Json.raw(text)");
        }
    }

    private static void quote(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                default -> {
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        b.append('"');
    }

    // ---- decoding ----------------------------------------------------------------------------

    /** Parses one JSON value; {@code IllegalArgumentException} if the text is not exactly that. */
    public static Object parse(String text) {
        Parser p = new Parser(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.i != text.length()) throw p.error("trailing characters");
        return v;
    }

    /** Parses a JSON object. */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) {
        Object v = parse(text);
        if (!(v instanceof Map)) throw new IllegalArgumentException("not a JSON object: " + abbreviate(text));
        return (Map<String, Object>) v;
    }

    static String abbreviate(String s) {
        return s.length() > 200 ? s.substring(0, 200) + "..." : s;
    }

    private static final class Parser {
        final String s;
        int i;

        Parser(String s) {
            this.s = s;
        }

        IllegalArgumentException error(String why) {
            return new IllegalArgumentException("invalid JSON at " + i + ": " + why);
        }

        void ws() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        Object value(int depth) {
            if (depth > 512) throw error("nested too deeply");
            if (i >= s.length()) throw error("unexpected end");
            char c = s.charAt(i);
            switch (c) {
                case '{': {
                    i++;
                    Map<String, Object> m = new LinkedHashMap<>();
                    ws();
                    if (peek('}')) return m;
                    while (true) {
                        ws();
                        if (i >= s.length() || s.charAt(i) != '"') throw error("expected a string key");
                        String k = string();
                        ws();
                        expect(':');
                        ws();
                        m.put(k, value(depth + 1));
                        ws();
                        if (peek('}')) return m;
                        expect(',');
                    }
                }
                case '[': {
                    i++;
                    List<Object> l = new ArrayList<>();
                    ws();
                    if (peek(']')) return l;
                    while (true) {
                        ws();
                        l.add(value(depth + 1));
                        ws();
                        if (peek(']')) return l;
                        expect(',');
                    }
                }
                case '"':
                    return string();
                case 't':
                    word("true");
                    return Boolean.TRUE;
                case 'f':
                    word("false");
                    return Boolean.FALSE;
                case 'n':
                    word("null");
                    return null;
                default:
                    return number();
            }
        }

        boolean peek(char c) {
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        void expect(char c) {
            if (!peek(c)) throw error("expected '" + c + "'");
        }

        void word(String w) {
            if (!s.startsWith(w, i)) throw error("expected " + w);
            i += w.length();
        }

        String string() {
            i++; // the opening quote
            StringBuilder b = new StringBuilder();
            while (true) {
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c < 0x20) throw error("control character in a string");
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) throw error("unterminated escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> b.append(e);
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) throw error("short \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException x) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape \\" + e);
                }
            }
        }

        Object number() {
            int start = i;
            if (peek('-')) {}
            if (i < s.length() && s.charAt(i) == '0') i++;
            else digits(true);
            if (peek('.')) digits(true);
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                i++;
                if (!peek('+')) peek('-');
                digits(true);
            }
            if (i == start) throw error("unexpected character");
            return new BigDecimal(s.substring(start, i));
        }

        void digits(boolean required) {
            int start = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            if (required && i == start) throw error("expected a digit");
        }
    }
}
