//! JWTs: verified with exactly one algorithm, the configured key's, and remembered once
//! verified (see [`JwtVerifier`]).

use std::{path::Path, sync::Arc};

use anyhow::{bail, Context};
use jsonwebtoken::{errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Grant, JwtSettings, Right, Unauthenticated};

pub(super) struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    /// Tokens already verified, by the sha256 of their full text (signature included), with
    /// their grant and `exp`: a client sends one token many times, and an RS256 verification
    /// costs about 0.25 ms of CPU with the pure-Rust backend (bench/auth.rs), more than a whole
    /// lone write. A hit is the very same bytes, so only `exp` needs checking again. Bounded:
    /// cleared when full.
    verified: std::sync::Mutex<std::collections::HashMap<[u8; 32], Verified>>,
}

/// A remembered token's grant and `exp`.
type Verified = (Arc<Grant>, u64);

/// Verified tokens remembered per process (each entry about 100 bytes plus its grant).
const VERIFIED_CAPACITY: usize = 4096;

/// The `"fencegate"` claim: what the token grants.
#[derive(Deserialize, Default)]
#[serde(default)]
struct FencegateClaim {
    rights: Vec<String>,
    prefixes: Vec<String>,
    tables: Vec<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    /// A string when present (RFC 7519 4.1.1); an array, which `jsonwebtoken` would accept,
    /// fails to decode here and the token is refused.
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    fencegate: FencegateClaim,
}

impl JwtVerifier {
    pub(super) fn new(
        settings: &JwtSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<JwtVerifier> {
        let (key, algorithm) = match (&settings.hs256_secret_env, &settings.public_key_pem_file) {
            (Some(var), None) => {
                let secret = env(var).filter(|s| !s.is_empty()).with_context(|| {
                    format!("auth.jwt.hs256_secret_env names {var:?}, but that environment variable is not set or empty")
                })?;
                if secret.len() < 32 {
                    bail!(
                        "the HS256 secret in {var:?} is {} bytes; use at least 32 random bytes",
                        secret.len()
                    );
                }
                (
                    DecodingKey::from_secret(secret.as_bytes()),
                    Algorithm::HS256,
                )
            }
            (None, Some(path)) => public_key(path)?,
            _ => bail!("[auth.jwt] needs exactly one of hs256_secret_env and public_key_pem_file"),
        };
        let mut validation = Validation::new(algorithm);
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        if let Some(issuer) = &settings.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".into());
        }
        match &settings.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        Ok(JwtVerifier {
            key,
            validation,
            verified: Default::default(),
        })
    }

    pub(super) fn verify(&self, token: &str) -> Result<Verified, Unauthenticated> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = jsonwebtoken::get_current_timestamp();
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&digest)
            .cloned();
        if let Some((grant, exp)) = known {
            // The same rule as the first verification: expired once exp + leeway has passed.
            return if now <= exp.saturating_add(self.validation.leeway) {
                Ok((grant, exp.saturating_add(self.validation.leeway)))
            } else {
                Err(Unauthenticated::Expired)
            };
        }
        let (grant, exp) = self.verify_signed(token)?;
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= VERIFIED_CAPACITY {
            verified.clear();
        }
        verified.insert(digest, (grant.clone(), exp));
        Ok((grant, exp.saturating_add(self.validation.leeway)))
    }

    /// The JOSE header's `crit`, which `jsonwebtoken` ignores: a token that names critical
    /// extensions is refused, since fencegate implements none of them.
    fn has_crit(token: &str) -> bool {
        use base64::Engine as _;
        let Some(header) = token.split('.').next() else {
            return false;
        };
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
            return false;
        };
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
            .is_ok_and(|h| h.contains_key("crit"))
    }

    /// The full verification: signature, algorithm, claims.
    fn verify_signed(&self, token: &str) -> Result<(Arc<Grant>, u64), Unauthenticated> {
        if Self::has_crit(token) {
            return Err(Unauthenticated::InvalidToken);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => Unauthenticated::Expired,
                ErrorKind::ImmatureSignature => Unauthenticated::NotYetValid,
                ErrorKind::InvalidIssuer => Unauthenticated::WrongIssuer,
                ErrorKind::InvalidAudience => Unauthenticated::WrongAudience,
                ErrorKind::InvalidSignature
                | ErrorKind::InvalidAlgorithm
                | ErrorKind::InvalidAlgorithmName => Unauthenticated::BadSignature,
                _ => Unauthenticated::InvalidToken,
            },
        )?;
        let Claims {
            sub,
            exp,
            iss,
            fencegate,
        } = data.claims;
        if sub.is_empty() || sub.len() > 256 || sub.chars().any(char::is_control) {
            return Err(Unauthenticated::InvalidToken);
        }
        // The issuer is part of the actor only when one is configured (and so checked): an
        // unchecked `iss` is the token's own say-so.
        let actor = match (&self.validation.iss, iss) {
            (Some(_), Some(iss)) => format!("jwt:{iss}#{sub}"),
            _ => format!("jwt:{sub}"),
        };
        // Unknown right names in a token grant nothing more (the token is still valid).
        let rights: Vec<String> = fencegate
            .rights
            .into_iter()
            .filter(|r| Right::parse(r).is_some())
            .collect();
        let grant = Grant::new(actor, &rights, fencegate.prefixes, fencegate.tables)
            .expect("filtered to known rights");
        Ok((Arc::new(grant), exp))
    }
}

/// The public key of `path` and its algorithm, by the key's type: RSA -> RS256, EC (P-256) ->
/// ES256, Ed25519 -> EdDSA.
fn public_key(path: &Path) -> anyhow::Result<(DecodingKey, Algorithm)> {
    let pem = std::fs::read(path).with_context(|| {
        format!(
            "auth.jwt.public_key_pem_file: cannot read {}",
            path.display()
        )
    })?;
    if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
        return Ok((key, Algorithm::RS256));
    }
    if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
        return Ok((key, Algorithm::ES256));
    }
    if let Ok(key) = DecodingKey::from_ed_pem(&pem) {
        return Ok((key, Algorithm::EdDSA));
    }
    bail!(
        "auth.jwt.public_key_pem_file: {} is not a PEM public key of RSA, EC P-256 or Ed25519 (\"-----BEGIN PUBLIC KEY-----\")",
        path.display()
    )
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_token_still_expires() {
        let jwt = JwtSettings {
            hs256_secret_env: Some("S".into()),
            ..Default::default()
        };
        let secret = "0123456789abcdef0123456789abcdef";
        let verifier = JwtVerifier::new(&jwt, |_| Some(secret.into())).unwrap();
        let now = jsonwebtoken::get_current_timestamp();
        let claims =
            serde_json::json!({"sub": "a", "exp": now + 3600, "fencegate": {"rights": ["read"]}});
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        assert_eq!(verifier.verify(&token).unwrap().0.actor, "jwt:a");
        assert_eq!(verifier.verified.lock().unwrap().len(), 1);
        assert_eq!(verifier.verify(&token).unwrap().0.actor, "jwt:a", "a hit");
        // The same bytes, remembered with an exp now past the leeway: refused.
        for entry in verifier.verified.lock().unwrap().values_mut() {
            entry.1 = now - 61;
        }
        assert_eq!(
            verifier.verify(&token).unwrap_err(),
            Unauthenticated::Expired
        );
        // A token that fails verification is never remembered.
        let bad = jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(b"another secret of 32 bytes or more"),
        )
        .unwrap();
        assert_eq!(
            verifier.verify(&bad).unwrap_err(),
            Unauthenticated::BadSignature
        );
        assert_eq!(
            verifier.verify(&bad).unwrap_err(),
            Unauthenticated::BadSignature
        );
        assert_eq!(verifier.verified.lock().unwrap().len(), 1);
    }

    #[test]
    fn crit_headers_and_issuer_arrays_are_refused_and_actors_are_namespaced() {
        use base64::Engine as _;
        let secret = "0123456789abcdef0123456789abcdef";
        let jwt = JwtSettings {
            hs256_secret_env: Some("S".into()),
            issuer: Some("https://idp.test".into()),
            ..Default::default()
        };
        let verifier = JwtVerifier::new(&jwt, |_| Some(secret.into())).unwrap();
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        let exp = jsonwebtoken::get_current_timestamp() + 3600;
        let claims = serde_json::json!({"sub": "locker", "iss": "https://idp.test", "exp": exp});
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        let (grant, until) = verifier.verify(&token).unwrap();
        assert_eq!(
            grant.actor, "jwt:https://idp.test#locker",
            "the issuer is part of the actor when configured"
        );
        assert_eq!(until, exp + 60, "valid until exp plus the leeway");

        // `iss` as an array naming the right issuer: jsonwebtoken would take it; RFC 7519 says a string.
        let array = serde_json::json!({"sub": "locker", "iss": ["https://idp.test"], "exp": exp});
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &array, &key).unwrap();
        assert!(verifier.verify(&token).is_err());

        // A header naming a critical extension, signed with the right key: refused.
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"alg":"HS256","typ":"JWT","crit":["exp"]}"#);
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&claims).unwrap());
        let signed = format!("{header}.{payload}");
        let signature =
            jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).unwrap();
        assert_eq!(
            verifier
                .verify(&format!("{signed}.{signature}"))
                .unwrap_err(),
            Unauthenticated::InvalidToken
        );
    }
}
