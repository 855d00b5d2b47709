package dev.fencegate;

import java.util.List;
import java.util.Map;

/**
 * An answer other than 2xx as the server sent it: the status, the RFC 9457 fields, the whole
 * decoded problem object ({@code body}; tokens in it are strings) and the response's headers
 * (names in lower case).
 */
public record Problem(int status, String type, String title, String detail, Map<String, Object> body,
        Map<String, List<String>> headers) {

    /** The last segment of the type URI, e.g. {@code "stale-token"} ({@code ""} when none). */
    public String slug() {
        return type == null ? "" : type.substring(type.lastIndexOf('/') + 1);
    }
}
