package dev.fencegate;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.spec.EdECPrivateKeySpec;
import java.security.spec.NamedParameterSpec;
import java.util.Base64;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/** Issuer proofs: the X-Fencing-Proof an {@code [[issuers]]} entry checks. */
public final class Proofs {
    private Proofs() {}

    /** What an issuer signs: {@code "fencegate-token-v1\n{scope}\n{token}"}. */
    public static byte[] message(String scope, String token) {
        return ("fencegate-token-v1\n" + scope + "\n" + Tokens.check(token)).getBytes(StandardCharsets.UTF_8);
    }

    /** HMAC-SHA256 proof, for an issuer configured with {@code hmac_sha256_secret_env}. */
    public static String hmac(byte[] secret, String scope, String token) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(secret, "HmacSHA256"));
            return Base64.getUrlEncoder().withoutPadding().encodeToString(mac.doFinal(message(scope, token)));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Ed25519 proof from the private key's 32-byte seed ({@code ed25519_public_key} issuers). */
    public static String ed25519(byte[] seed, String scope, String token) {
        try {
            PrivateKey key = KeyFactory.getInstance("Ed25519")
                    .generatePrivate(new EdECPrivateKeySpec(NamedParameterSpec.ED25519, seed));
            return ed25519(key, scope, token);
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException("not an Ed25519 seed: " + e.getMessage(), e);
        }
    }

    /** Ed25519 proof with a JDK private key. */
    public static String ed25519(PrivateKey key, String scope, String token) {
        try {
            Signature s = Signature.getInstance("Ed25519");
            s.initSign(key);
            s.update(message(scope, token));
            return Base64.getUrlEncoder().withoutPadding().encodeToString(s.sign());
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException(e);
        }
    }
}
