//! Trust: who is asking (an API key or a JWT, from `Authorization: Bearer`), and what they may
//! touch (rights × name prefixes × legacy-table resources). No HTTP here: `http::auth` turns
//! these answers into 401/403 problems.
//!
//! - API keys are configured only as sha256 digests. A presented key is hashed once and
//!   compared with every configured digest in constant time (`subtle`), all of them, so the
//!   time taken says nothing about which digest came close.
//! - JWTs are verified by `jsonwebtoken` with exactly one algorithm, the one the configured key
//!   is for: a token whose header names another (`none`, or HS256 signed with an RSA public key
//!   as its secret) is refused before any signature check. `exp` is required; `nbf` is checked
//!   when present; `iss`/`aud` when configured.
//! - Actors live in namespaces: `key:NAME` for an API key, `jwt:SUB` for a JWT (`jwt:ISS#SUB`
//!   when `[auth.jwt] issuer` is set), `cert:NAME` for a client certificate (`[[auth.certs]]`),
//!   so a JWT whose subject equals a key's name is another actor, and owns none of that key's
//!   leases.
//! - A client certificate, verified by the TLS handshake (`crate::tls`), is the identity of a
//!   request that sends no `Authorization` header; one that names no `[[auth.certs]]` entry is
//!   refused. A request that sends a bearer credential is authenticated by it alone.
//! - The credentials are replaced whole on SIGHUP ([`Live`]): a request uses the set current
//!   when it is authenticated.
//! - A JWT header with `crit` is refused (RFC 7515 4.1.11: a recipient must reject extensions
//!   it does not understand, and fencegate understands none); `iss` must be a string.
//! - Prefixes match the decoded name (a key, a scope, a lock name); `""` matches every name.
//!   `admin` is every right on every name and every resource.

mod certs;
mod grant;
mod jwt;
mod keys;
mod settings;

pub use certs::ClientCert;
pub use grant::{Actor, Grant, Named, Right};
pub use keys::{digest_hex, key_block, new_key, parse_digest};
pub use settings::{ApiKeySettings, AuthSettings, CertSettings, JwtSettings, RoleSettings};

use std::sync::Arc;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use certs::CertName;
use jwt::JwtVerifier;

/// Why a request was not authenticated. `reason` is the metric label (a closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthenticated {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <credential>`, or the header appears twice.
    Malformed,
    /// Not a configured API key (and not a JWT, or no JWT is accepted).
    UnknownKey,
    Expired,
    NotYetValid,
    /// Bad signature, or an algorithm other than the configured key's (`none` included).
    BadSignature,
    WrongIssuer,
    WrongAudience,
    /// Not a JWT, or its claims are missing (`exp`, `sub`) or malformed.
    InvalidToken,
    /// A verified client certificate that no `[[auth.certs]]` entry names, and no bearer
    /// credential.
    UnknownCert,
    /// A client certificate past its `notAfter` (or before its `notBefore`): on a resumed TLS
    /// session, or a connection opened while it was valid.
    CertExpired,
    /// A client certificate naming several identities: two common names, several URI SANs, or
    /// names that match different `[[auth.certs]]` entries.
    AmbiguousCert,
}

impl Unauthenticated {
    pub fn reason(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "missing",
            Unauthenticated::Malformed => "malformed",
            Unauthenticated::UnknownKey => "unknown_key",
            Unauthenticated::Expired => "expired",
            Unauthenticated::NotYetValid => "not_yet_valid",
            Unauthenticated::BadSignature => "bad_signature",
            Unauthenticated::WrongIssuer => "wrong_issuer",
            Unauthenticated::WrongAudience => "wrong_audience",
            Unauthenticated::InvalidToken => "invalid_token",
            Unauthenticated::UnknownCert => "unknown_cert",
            Unauthenticated::CertExpired => "cert_expired",
            Unauthenticated::AmbiguousCert => "ambiguous_cert",
        }
    }

    /// The problem's `detail`: what to send instead. Never echoes the credential.
    pub fn detail(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "this server needs a credential: send Authorization: Bearer <API key or JWT>",
            Unauthenticated::Malformed => "the Authorization header must be exactly one \"Bearer <credential>\"",
            Unauthenticated::UnknownKey => "the credential is not a configured API key or an acceptable JWT",
            Unauthenticated::Expired => "the JWT has expired (exp)",
            Unauthenticated::NotYetValid => "the JWT is not valid yet (nbf)",
            Unauthenticated::BadSignature => "the JWT's signature or algorithm is not the configured key's",
            Unauthenticated::WrongIssuer => "the JWT's issuer (iss) is not the configured one",
            Unauthenticated::WrongAudience => "the JWT's audience (aud) is not the configured one",
            Unauthenticated::InvalidToken => "the JWT is malformed or lacks a required claim (sub, exp)",
            Unauthenticated::UnknownCert => {
                "the client certificate names no configured identity ([[auth.certs]] subject_cn or uri_san): use a \
                 certificate issued for this service, or send Authorization: Bearer <API key or JWT>"
            }
            Unauthenticated::CertExpired => {
                "the client certificate is not valid now (notBefore/notAfter): reconnect with a valid one"
            }
            Unauthenticated::AmbiguousCert => {
                "the client certificate names several identities (more than one subject CN or URI SAN, or names that \
                 match different [[auth.certs]] entries): use a certificate that names exactly one"
            }
        }
    }
}

/// The configured credentials. Built once at start-up; `None` from [`Authenticator::new`]
/// means auth is off.
pub struct Authenticator {
    keys: Vec<([u8; 32], Arc<Grant>)>,
    certs: Vec<(CertName, Arc<Grant>)>,
    jwt: Option<JwtVerifier>,
    pub protect_metrics: bool,
}

impl Authenticator {
    /// `env` reads the HS256 secret's variable. Errors name the setting to fix.
    pub fn new(
        settings: &AuthSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<Authenticator>> {
        if !settings.enabled() {
            return Ok(None);
        }
        // Settings::validate has checked these; settings built in code (tests, embedders) may not
        // have been through it, so a mistake is an error here too, never a panic.
        let keys = settings
            .keys
            .iter()
            .map(|key| {
                let digest = parse_digest(&key.sha256).with_context(|| {
                    format!("auth.keys ({:?}): sha256 must be 64 hex digits", key.name)
                })?;
                let grant = Grant::new(
                    format!("key:{}", key.name),
                    &key.rights,
                    key.prefixes.clone(),
                    key.tables.clone(),
                )
                .map_err(|e| anyhow::anyhow!("auth.keys ({:?}): {e}", key.name))?;
                Ok((digest, Arc::new(grant)))
            })
            .collect::<anyhow::Result<_>>()?;
        let certs = settings
            .certs
            .iter()
            .map(|cert| {
                let name = match (&cert.subject_cn, &cert.uri_san) {
                    (Some(cn), None) => CertName::CommonName(cn.clone()),
                    (None, Some(uri)) => CertName::Uri(uri.clone()),
                    _ => bail!(
                        "auth.certs ({:?}): give exactly one of subject_cn and uri_san",
                        cert.name
                    ),
                };
                let grant = Grant::new(
                    format!("cert:{}", cert.name),
                    &cert.rights,
                    cert.prefixes.clone(),
                    cert.tables.clone(),
                )
                .map_err(|e| anyhow::anyhow!("auth.certs ({:?}): {e}", cert.name))?;
                Ok((name, Arc::new(grant)))
            })
            .collect::<anyhow::Result<_>>()?;
        let jwt = settings
            .jwt
            .as_ref()
            .map(|jwt| JwtVerifier::new(jwt, env))
            .transpose()?;
        Ok(Some(Authenticator {
            keys,
            certs,
            jwt,
            protect_metrics: settings.protect_metrics,
        }))
    }

    /// The actor of an `Authorization` header's value (`None`: no header), else of the
    /// connection's verified client certificate.
    pub fn authenticate(
        &self,
        header: Option<&[u8]>,
        cert: Option<&ClientCert>,
    ) -> Result<Actor, Unauthenticated> {
        let header = match (header, cert) {
            (Some(header), _) => header,
            (None, Some(cert)) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                if cert.not_after.is_some_and(|t| now > t)
                    || cert.not_before.is_some_and(|t| now < t)
                {
                    return Err(Unauthenticated::CertExpired);
                }
                let grant = self.cert(cert)?;
                return Ok(match cert.not_after {
                    Some(not_after) => Actor::expiring(grant, not_after),
                    None => Actor::authenticated(grant),
                });
            }
            (None, None) => return Err(Unauthenticated::Missing),
        };
        let credential = bearer(header).ok_or(Unauthenticated::Malformed)?;
        if let Some(jwt) = &self.jwt {
            if credential.bytes().filter(|b| *b == b'.').count() == 2 {
                return jwt
                    .verify(credential)
                    .map(|(grant, exp)| Actor::expiring(grant, exp));
            }
        }
        self.key(credential)
            .map(Actor::authenticated)
            .ok_or(Unauthenticated::UnknownKey)
    }

    /// The `[[auth.certs]]` entry the certificate names. A certificate that names several
    /// identities is refused, never resolved by the order of the configuration.
    fn cert(&self, cert: &ClientCert) -> Result<Arc<Grant>, Unauthenticated> {
        if cert.common_names.len() > 1 || cert.uris.len() > 1 {
            return Err(Unauthenticated::AmbiguousCert);
        }
        let mut named = self.certs.iter().filter(|(name, _)| cert.names(name));
        match (named.next(), named.next()) {
            (Some((_, grant)), None) => Ok(grant.clone()),
            (Some(_), Some(_)) => Err(Unauthenticated::AmbiguousCert),
            (None, _) => Err(Unauthenticated::UnknownCert),
        }
    }

    fn key(&self, credential: &str) -> Option<Arc<Grant>> {
        let digest: [u8; 32] = Sha256::digest(credential.as_bytes()).into();
        // Every digest is compared (no early exit), each in constant time.
        let mut found = None;
        for (configured, grant) in &self.keys {
            if bool::from(configured.ct_eq(&digest)) {
                found = Some(grant.clone());
            }
        }
        found
    }
}
/// The credentials in force, replaced whole when the configuration is reloaded (SIGHUP).
pub struct Live(std::sync::RwLock<Arc<Authenticator>>);

impl Live {
    pub fn new(auth: Authenticator) -> Live {
        Live(std::sync::RwLock::new(Arc::new(auth)))
    }

    pub fn current(&self) -> Arc<Authenticator> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn replace(&self, auth: Authenticator) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
    }
}

/// `Bearer <credential>` (scheme case-insensitive, one space, a non-empty token68-ish
/// credential with no spaces).
fn bearer(header: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(header).ok()?;
    let (scheme, credential) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") || credential.is_empty() {
        return None;
    }
    credential
        .bytes()
        .all(|b| b.is_ascii_graphic())
        .then_some(credential)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header() {
        assert_eq!(bearer(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer(b"bearer abc"), Some("abc"));
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer  abc"), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer a b"), None);
    }
}
