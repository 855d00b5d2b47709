package dev.fencegate;

/** 422 {@code token-jump}: {@code presented()} exceeds the fence {@code current()} by more than {@code maxJump()}. */
public class TokenJumpException extends FencegateException {
    private static final long serialVersionUID = 1L;

    public TokenJumpException(Problem problem) {
        super(problem);
    }

    /** The key (or the row's key), or null. */
    public String key() {
        return str("key");
    }

    /** The scope, or null. */
    public String scope() {
        return str("scope");
    }

    /** The table resource, or null. */
    public String resource() {
        return str("resource");
    }

    /** The token the refused request presented. */
    public String presented() {
        return str("presented_token");
    }

    /** The fence it ran into. */
    public String current() {
        return str("current_token");
    }

    /** The server's kv.max_token_jump. */
    public String maxJump() {
        return str("max_jump");
    }

    @Override
    public boolean isFencing() {
        return true;
    }
}
