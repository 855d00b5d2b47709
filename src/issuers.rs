//! External lock services that sign their tokens (`[[issuers]]`): a write, batch or claim under
//! a scope an issuer covers must carry `X-Fencing-Proof`, the issuer's signature over the bytes
//! `fencegate-token-v1\n{scope}\n{token}`, as base64url without padding.
//!
//! Why: a fence only rises, so anyone who can send one absurd token to a scope bricks it. With
//! an issuer, only tokens the lock service really minted (for that very scope) pass. The check
//! needs no database round trip, so it runs before any database work. Verification uses
//! maintained crates (ed25519-dalek's `verify_strict`, hmac's constant-time `verify_slice`);
//! nothing here is hand-written crypto.

use std::{collections::HashMap, fmt, sync::Mutex};

use base64::{engine::general_purpose::STANDARD, engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::fence::{FencingToken, Scope};

/// One `[[issuers]]` entry, as written in the config file.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerSettings {
    /// How the issuer is named in logs and errors.
    pub name: String,
    /// Scope prefixes the issuer signs for (`""`: every scope).
    pub scopes: Vec<String>,
    /// The issuer's Ed25519 public key: standard base64 of the 32 raw bytes.
    #[serde(default)]
    pub ed25519_public_key: Option<String>,
    /// The environment variable holding the HMAC-SHA256 secret (the secret itself is never
    /// written in the file).
    #[serde(default)]
    pub hmac_sha256_secret_env: Option<String>,
}

/// The public key is not secret, but keep `Debug` to what identifies the issuer.
impl fmt::Debug for IssuerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuerSettings")
            .field("name", &self.name)
            .field("scopes", &self.scopes)
            .field("ed25519_public_key", &self.ed25519_public_key)
            .field("hmac_sha256_secret_env", &self.hmac_sha256_secret_env)
            .finish()
    }
}

enum Key {
    Ed25519(VerifyingKey),
    Hmac(Vec<u8>),
}

struct Issuer {
    name: String,
    scopes: Vec<String>,
    key: Key,
}

/// The configured issuers, validated: each has exactly one key, and no scope is covered by two.
#[derive(Default)]
pub struct Issuers {
    issuers: Vec<Issuer>,
    /// The last proof verified per scope: a lock holder writes many times under one token with
    /// one proof, and an Ed25519 verification costs tens of microseconds. Verification is a
    /// pure function of (key, scope, token, proof), so a remembered success for the very same
    /// bytes is the same answer; failures are never remembered. Bounded: cleared when full.
    verified: Mutex<HashMap<String, (FencingToken, Vec<u8>)>>,
}

/// Most scopes whose last verified proof is remembered.
const VERIFIED_CAPACITY: usize = 10_000;

/// Names and scopes only: an HMAC secret must never reach a log.
impl fmt::Debug for Issuers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.issuers.iter().map(|i| (&i.name, &i.scopes)))
            .finish()
    }
}

/// Why a proof was refused (422). The message is shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("scope {scope:?} is signed by issuer {issuer:?}: send X-Fencing-Proof, the issuer's signature over \"fencegate-token-v1\\n{{scope}}\\n{{token}}\" (base64url, no padding)")]
    Missing { scope: String, issuer: String },
    #[error("X-Fencing-Proof is not a valid signature by issuer {issuer:?} of this scope and token: {why}")]
    Invalid { issuer: String, why: &'static str },
}

/// The bytes an issuer signs for `token` in `scope`.
pub fn message(scope: &str, token: FencingToken) -> String {
    format!("fencegate-token-v1\n{scope}\n{token}")
}

impl Issuers {
    /// Builds the issuers from settings; `env` reads environment variables (for HMAC secrets).
    pub fn new(
        settings: &[IssuerSettings],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let mut issuers: Vec<Issuer> = Vec::with_capacity(settings.len());
        for (i, s) in settings.iter().enumerate() {
            let at = format!("issuers[{i}] ({:?})", s.name);
            if s.name.is_empty() {
                return Err(format!("{at}: name must not be empty"));
            }
            if s.scopes.is_empty() {
                return Err(format!(
                    "{at}: list the scope prefixes it signs for in `scopes` (\"\" for all)"
                ));
            }
            let key = match (&s.ed25519_public_key, &s.hmac_sha256_secret_env) {
                (Some(b64), None) => {
                    let bytes = STANDARD
                        .decode(b64.trim())
                        .map_err(|e| format!("{at}: ed25519_public_key is not base64: {e}"))?;
                    let bytes: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
                        format!(
                            "{at}: ed25519_public_key must be the 32 raw bytes of the key, got {}",
                            b.len()
                        )
                    })?;
                    Key::Ed25519(
                        VerifyingKey::from_bytes(&bytes).map_err(|e| {
                            format!("{at}: ed25519_public_key is not a valid key: {e}")
                        })?,
                    )
                }
                (None, Some(var)) => {
                    let secret = env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        format!("{at}: hmac_sha256_secret_env names {var:?}, which is not set (or empty)")
                    })?;
                    if secret.len() < 32 {
                        return Err(format!(
                            "{at}: the HMAC secret in {var:?} is {} bytes; use at least 32",
                            secret.len()
                        ));
                    }
                    Key::Hmac(secret.into_bytes())
                }
                _ => {
                    return Err(format!(
                        "{at}: set exactly one of ed25519_public_key and hmac_sha256_secret_env"
                    ))
                }
            };
            for prefix in &s.scopes {
                if let Some(other) = issuers.iter().find(|o| {
                    o.scopes
                        .iter()
                        .any(|p| p.starts_with(prefix.as_str()) || prefix.starts_with(p.as_str()))
                }) {
                    return Err(format!(
                        "{at}: scope prefix {prefix:?} overlaps issuer {:?}: a scope would have two issuers",
                        other.name
                    ));
                }
            }
            issuers.push(Issuer {
                name: s.name.clone(),
                scopes: s.scopes.clone(),
                key,
            });
        }
        Ok(Issuers {
            issuers,
            verified: Mutex::default(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// The issuer that signs for `scope`, if any.
    fn issuer_of(&self, scope: &Scope) -> Option<&Issuer> {
        self.issuers.iter().find(|i| {
            i.scopes
                .iter()
                .any(|p| scope.as_str().starts_with(p.as_str()))
        })
    }

    /// The name of the issuer that signs for `scope`, if any: the scope's one source of tokens.
    pub fn covering(&self, scope: &Scope) -> Option<&str> {
        self.issuer_of(scope).map(|i| i.name.as_str())
    }

    /// Checks the proof of a write or claim under `scope` with `token`: `Ok` if no issuer covers
    /// the scope, or if `proof` is that issuer's signature.
    pub fn check(
        &self,
        scope: &Scope,
        token: FencingToken,
        proof: Option<&[u8]>,
    ) -> Result<(), ProofError> {
        let Some(issuer) = self.issuer_of(scope) else {
            return Ok(());
        };
        let Some(proof) = proof else {
            return Err(ProofError::Missing {
                scope: scope.as_str().to_owned(),
                issuer: issuer.name.clone(),
            });
        };
        let remembered = |verified: &HashMap<String, (FencingToken, Vec<u8>)>| {
            verified
                .get(scope.as_str())
                .is_some_and(|(t, p)| *t == token && p.as_slice() == proof)
        };
        if remembered(&self.verified.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(());
        }
        issuer.verify(scope, token, proof)?;
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= VERIFIED_CAPACITY {
            verified.clear();
        }
        verified.insert(scope.as_str().to_owned(), (token, proof.to_vec()));
        Ok(())
    }
}

impl Issuer {
    fn verify(&self, scope: &Scope, token: FencingToken, proof: &[u8]) -> Result<(), ProofError> {
        let issuer = self;
        let invalid = |why| ProofError::Invalid {
            issuer: issuer.name.clone(),
            why,
        };
        // Strict: the URL-safe alphabet, no padding, no whitespace.
        let signature = URL_SAFE_NO_PAD
            .decode(proof)
            .map_err(|_| invalid("not base64url without padding"))?;
        let message = message(scope.as_str(), token);
        match &issuer.key {
            Key::Ed25519(key) => {
                let signature = Signature::from_slice(&signature)
                    .map_err(|_| invalid("not a 64-byte Ed25519 signature"))?;
                key.verify_strict(message.as_bytes(), &signature)
                    .map_err(|_| invalid("the signature does not match"))
            }
            Key::Hmac(secret) => {
                let mut mac =
                    Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
                mac.update(message.as_bytes());
                mac.verify_slice(&signature)
                    .map_err(|_| invalid("the signature does not match"))
            }
        }
    }
}

/// Signs `token` for `scope` the way an issuer does: what `fencegate sign` prints, and what a
/// lock service's own signer must produce. `key`: an Ed25519 signing key (32 raw bytes) or an
/// HMAC secret.
pub fn sign(scope: &str, token: FencingToken, key: SigningKey<'_>) -> String {
    let message = message(scope, token);
    let signature = match key {
        SigningKey::Ed25519(seed) => {
            use ed25519_dalek::Signer;
            ed25519_dalek::SigningKey::from_bytes(seed)
                .sign(message.as_bytes())
                .to_bytes()
                .to_vec()
        }
        SigningKey::Hmac(secret) => {
            let mut mac =
                Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
            mac.update(message.as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
    };
    URL_SAFE_NO_PAD.encode(signature)
}

/// A key to sign with (see [`sign`]).
pub enum SigningKey<'a> {
    Ed25519(&'a [u8; 32]),
    Hmac(&'a [u8]),
}

/// The public key of an Ed25519 signing key, as `ed25519_public_key` expects it.
pub fn ed25519_public_key(seed: &[u8; 32]) -> String {
    STANDARD.encode(
        ed25519_dalek::SigningKey::from_bytes(seed)
            .verifying_key()
            .to_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef-secret";
    const SEED: [u8; 32] = [7; 32];

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    fn scope(s: &str) -> Scope {
        Scope::parse(s, 64).unwrap()
    }

    fn issuers() -> Issuers {
        let settings = [
            IssuerSettings {
                name: "etcd".into(),
                scopes: vec!["jobs/".into()],
                ed25519_public_key: Some(ed25519_public_key(&SEED)),
                hmac_sha256_secret_env: None,
            },
            IssuerSettings {
                name: "redis".into(),
                scopes: vec!["billing".into()],
                ed25519_public_key: None,
                hmac_sha256_secret_env: Some("SECRET".into()),
            },
        ];
        Issuers::new(&settings, |v| (v == "SECRET").then(|| SECRET.to_owned())).unwrap()
    }

    #[test]
    fn proofs_verify_only_for_their_scope_token_and_key() {
        let issuers = issuers();
        let ok = sign("jobs/a", t(5), SigningKey::Ed25519(&SEED));
        assert_eq!(
            issuers.check(&scope("jobs/a"), t(5), Some(ok.as_bytes())),
            Ok(())
        );
        let hmac = sign("billing", t(9), SigningKey::Hmac(SECRET.as_bytes()));
        assert_eq!(
            issuers.check(&scope("billing"), t(9), Some(hmac.as_bytes())),
            Ok(())
        );
        // Wrong token, wrong scope, another issuer's key.
        assert!(issuers
            .check(&scope("jobs/a"), t(6), Some(ok.as_bytes()))
            .is_err());
        assert!(issuers
            .check(&scope("jobs/b"), t(5), Some(ok.as_bytes()))
            .is_err());
        let other = sign("jobs/a", t(5), SigningKey::Ed25519(&[8; 32]));
        assert!(issuers
            .check(&scope("jobs/a"), t(5), Some(other.as_bytes()))
            .is_err());
        let hmac_for_jobs = sign("jobs/a", t(5), SigningKey::Hmac(SECRET.as_bytes()));
        assert!(issuers
            .check(&scope("jobs/a"), t(5), Some(hmac_for_jobs.as_bytes()))
            .is_err());
        // Truncated, padded, not base64url.
        assert!(issuers
            .check(&scope("jobs/a"), t(5), Some(&ok.as_bytes()[..ok.len() - 2]))
            .is_err());
        assert!(issuers
            .check(&scope("jobs/a"), t(5), Some(format!("{ok}==").as_bytes()))
            .is_err());
        let standard_alphabet = ok.replace('-', "+").replace('_', "/");
        if standard_alphabet != ok {
            assert!(issuers
                .check(&scope("jobs/a"), t(5), Some(standard_alphabet.as_bytes()))
                .is_err());
        }
        assert!(issuers
            .check(&scope("jobs/a"), t(5), Some(b"not base64!"))
            .is_err());
        // Missing, and scopes no issuer covers.
        assert!(matches!(
            issuers.check(&scope("jobs/a"), t(5), None),
            Err(ProofError::Missing { .. })
        ));
        assert_eq!(issuers.check(&scope("other"), t(5), None), Ok(()));
    }

    #[test]
    fn bad_settings_are_refused() {
        let base = IssuerSettings {
            name: "x".into(),
            scopes: vec!["a".into()],
            ed25519_public_key: Some(ed25519_public_key(&SEED)),
            hmac_sha256_secret_env: None,
        };
        let no_env = |_: &str| None;
        assert!(Issuers::new(std::slice::from_ref(&base), no_env).is_ok());
        let both = IssuerSettings {
            hmac_sha256_secret_env: Some("S".into()),
            ..base.clone()
        };
        assert!(Issuers::new(&[both], no_env)
            .unwrap_err()
            .contains("exactly one"));
        let short = IssuerSettings {
            ed25519_public_key: Some(STANDARD.encode([1u8; 31])),
            ..base.clone()
        };
        assert!(Issuers::new(&[short], no_env)
            .unwrap_err()
            .contains("32 raw bytes"));
        let unset = IssuerSettings {
            ed25519_public_key: None,
            hmac_sha256_secret_env: Some("NOPE".into()),
            ..base.clone()
        };
        assert!(Issuers::new(&[unset], no_env)
            .unwrap_err()
            .contains("not set"));
        let overlap = IssuerSettings {
            name: "y".into(),
            scopes: vec!["ab".into()],
            ..base.clone()
        };
        assert!(Issuers::new(&[base, overlap], no_env)
            .unwrap_err()
            .contains("overlaps"));
    }
}
