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

use std::{fmt, path::Path, sync::Arc};

use anyhow::{bail, Context};
use jsonwebtoken::{errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::AuthSettings;

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    Read,
    Write,
    Lock,
    Fence,
    Admin,
}

impl Right {
    pub const ALL: [Right; 5] = [Right::Read, Right::Write, Right::Lock, Right::Fence, Right::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Lock => "lock",
            Right::Fence => "fence",
            Right::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Right> {
        Right::ALL.into_iter().find(|r| r.as_str() == text)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one actor was granted: rights, on names starting with one of `prefixes`, and on the
/// legacy-table resources in `tables`.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The namespaced actor (`key:NAME`, `jwt:SUB`): recorded in logs, the audit log, and as
    /// the actor a lease belongs to.
    pub actor: String,
    rights: u8,
    prefixes: Vec<String>,
    tables: Vec<String>,
}

impl Grant {
    /// Unknown right names are refused (a typo must not silently grant less, or more).
    pub fn new(actor: String, rights: &[String], prefixes: Vec<String>, tables: Vec<String>) -> Result<Grant, String> {
        let mut bits = 0;
        for right in rights {
            let Some(right) = Right::parse(right) else {
                return Err(format!("unknown right {right:?}; use read, write, lock, fence or admin"));
            };
            bits |= right.bit();
        }
        Ok(Grant { actor, rights: bits, prefixes, tables })
    }

    pub fn is_admin(&self) -> bool {
        self.rights & Right::Admin.bit() != 0
    }

    /// `right` on the (decoded) `name` of a key, scope or lock.
    pub fn allows(&self, right: Right, name: &str) -> bool {
        self.is_admin() || (self.rights & right.bit() != 0 && self.prefixes.iter().any(|p| name.starts_with(p.as_str())))
    }

    /// `right` on the legacy-table `resource`.
    pub fn allows_table(&self, right: Right, resource: &str) -> bool {
        self.is_admin() || (self.rights & right.bit() != 0 && self.tables.iter().any(|t| t == resource))
    }
}

/// Who is asking. With auth off there is no actor, and every request has every right.
#[derive(Debug, Clone)]
pub struct Actor(Option<Arc<Grant>>, Option<u64>);

impl Actor {
    /// The actor of a server with no credentials configured: every right, no name.
    pub fn open() -> Actor {
        Actor(None, None)
    }

    /// An actor whose credential never expires (an API key).
    pub fn authenticated(grant: Arc<Grant>) -> Actor {
        Actor(Some(grant), None)
    }

    /// An actor whose credential expires at `exp` (seconds since the epoch: a JWT's `exp`).
    pub fn expiring(grant: Arc<Grant>, exp: u64) -> Actor {
        Actor(Some(grant), Some(exp))
    }

    /// When the credential stops being valid (seconds since the epoch); `None`: never. What a
    /// long-lived response (an event stream) must end at.
    pub fn expires_at(&self) -> Option<u64> {
        self.1
    }

    /// The namespaced actor (`key:NAME`, `jwt:SUB`); `None` with auth off.
    pub fn name(&self) -> Option<&str> {
        self.0.as_ref().map(|g| g.actor.as_str())
    }

    pub fn allows(&self, right: Right, name: &str) -> bool {
        self.0.as_ref().is_none_or(|g| g.allows(right, name))
    }

    pub fn allows_table(&self, right: Right, resource: &str) -> bool {
        self.0.as_ref().is_none_or(|g| g.allows_table(right, resource))
    }

    pub fn is_admin(&self) -> bool {
        self.0.as_ref().is_none_or(|g| g.is_admin())
    }

    /// The actor a renew or release must come from to touch a lease: `None` (anyone with the
    /// `lock` right on the name) with auth off, and for an admin.
    pub fn lease_must_match(&self) -> Option<&str> {
        match &self.0 {
            Some(grant) if !grant.is_admin() => Some(grant.actor.as_str()),
            _ => None,
        }
    }
}

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
    pub fn new(settings: &AuthSettings, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Authenticator>> {
        if !settings.enabled() {
            return Ok(None);
        }
        // Settings::validate has checked these; settings built in code (tests, embedders) may not
        // have been through it, so a mistake is an error here too, never a panic.
        let keys = settings
            .keys
            .iter()
            .map(|key| {
                let digest = parse_digest(&key.sha256)
                    .with_context(|| format!("auth.keys ({:?}): sha256 must be 64 hex digits", key.name))?;
                let grant = Grant::new(format!("key:{}", key.name), &key.rights, key.prefixes.clone(), key.tables.clone())
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
                    _ => bail!("auth.certs ({:?}): give exactly one of subject_cn and uri_san", cert.name),
                };
                let grant = Grant::new(format!("cert:{}", cert.name), &cert.rights, cert.prefixes.clone(), cert.tables.clone())
                    .map_err(|e| anyhow::anyhow!("auth.certs ({:?}): {e}", cert.name))?;
                Ok((name, Arc::new(grant)))
            })
            .collect::<anyhow::Result<_>>()?;
        let jwt = settings.jwt.as_ref().map(|jwt| JwtVerifier::new(jwt, env)).transpose()?;
        Ok(Some(Authenticator { keys, certs, jwt, protect_metrics: settings.protect_metrics }))
    }

    /// The actor of an `Authorization` header's value (`None`: no header), else of the
    /// connection's verified client certificate.
    pub fn authenticate(&self, header: Option<&[u8]>, cert: Option<&ClientCert>) -> Result<Actor, Unauthenticated> {
        let header = match (header, cert) {
            (Some(header), _) => header,
            (None, Some(cert)) => return self.cert(cert).map(Actor::authenticated).ok_or(Unauthenticated::UnknownCert),
            (None, None) => return Err(Unauthenticated::Missing),
        };
        let credential = bearer(header).ok_or(Unauthenticated::Malformed)?;
        if let Some(jwt) = &self.jwt {
            if credential.bytes().filter(|b| *b == b'.').count() == 2 {
                return jwt.verify(credential).map(|(grant, exp)| Actor::expiring(grant, exp));
            }
        }
        self.key(credential).map(Actor::authenticated).ok_or(Unauthenticated::UnknownKey)
    }

    /// The first `[[auth.certs]]` entry the certificate names.
    fn cert(&self, cert: &ClientCert) -> Option<Arc<Grant>> {
        self.certs.iter().find(|(name, _)| cert.names(name)).map(|(_, grant)| grant.clone())
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

/// What an `[[auth.certs]]` entry matches.
#[derive(Debug, Clone)]
enum CertName {
    CommonName(String),
    Uri(String),
}

/// What a verified client certificate names (`crate::tls::client_cert`): its subject's common
/// names and its URI subject alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCert {
    pub common_names: Vec<String>,
    pub uris: Vec<String>,
}

impl ClientCert {
    fn names(&self, name: &CertName) -> bool {
        match name {
            CertName::CommonName(cn) => self.common_names.iter().any(|c| c == cn),
            CertName::Uri(uri) => self.uris.iter().any(|u| u == uri),
        }
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
    credential.bytes().all(|b| b.is_ascii_graphic()).then_some(credential)
}

/// 64 hex digits -> 32 bytes.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The sha256 of `key`, in lower-case hex: what `[[auth.keys]] sha256` holds.
pub fn digest_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh API key: 32 bytes from the OS, URL-safe base64 without padding (43 characters).
pub fn new_key() -> anyhow::Result<String> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| anyhow::anyhow!("the OS random number generator failed: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The `[[auth.keys]]` block for a key (what `fencegate auth new-key` prints).
pub fn key_block(name: &str, key: &str) -> String {
    format!(
        "[[auth.keys]]\nname = {name:?}\nsha256 = \"{}\"\nrights = [\"read\", \"write\", \"lock\"]   # least rights: read, write, lock, fence, admin\nprefixes = [\"{name}/\"]   # the keys, scopes and lock names it may touch (\"\" = all)\ntables = []\n",
        digest_hex(key)
    )
}

struct JwtVerifier {
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
    fn new(settings: &crate::config::JwtSettings, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<JwtVerifier> {
        let (key, algorithm) = match (&settings.hs256_secret_env, &settings.public_key_pem_file) {
            (Some(var), None) => {
                let secret = env(var).filter(|s| !s.is_empty()).with_context(|| {
                    format!("auth.jwt.hs256_secret_env names {var:?}, but that environment variable is not set or empty")
                })?;
                if secret.len() < 32 {
                    bail!("the HS256 secret in {var:?} is {} bytes; use at least 32 random bytes", secret.len());
                }
                (DecodingKey::from_secret(secret.as_bytes()), Algorithm::HS256)
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
        Ok(JwtVerifier { key, validation, verified: Default::default() })
    }

    fn verify(&self, token: &str) -> Result<Verified, Unauthenticated> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = jsonwebtoken::get_current_timestamp();
        let known = self.verified.lock().unwrap_or_else(|e| e.into_inner()).get(&digest).cloned();
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
        let Some(header) = token.split('.').next() else { return false };
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else { return false };
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).is_ok_and(|h| h.contains_key("crit"))
    }

    /// The full verification: signature, algorithm, claims.
    fn verify_signed(&self, token: &str) -> Result<(Arc<Grant>, u64), Unauthenticated> {
        if Self::has_crit(token) {
            return Err(Unauthenticated::InvalidToken);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| match e.kind() {
            ErrorKind::ExpiredSignature => Unauthenticated::Expired,
            ErrorKind::ImmatureSignature => Unauthenticated::NotYetValid,
            ErrorKind::InvalidIssuer => Unauthenticated::WrongIssuer,
            ErrorKind::InvalidAudience => Unauthenticated::WrongAudience,
            ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                Unauthenticated::BadSignature
            }
            _ => Unauthenticated::InvalidToken,
        })?;
        let Claims { sub, exp, iss, fencegate } = data.claims;
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
        let rights: Vec<String> = fencegate.rights.into_iter().filter(|r| Right::parse(r).is_some()).collect();
        let grant = Grant::new(actor, &rights, fencegate.prefixes, fencegate.tables).expect("filtered to known rights");
        Ok((Arc::new(grant), exp))
    }
}

/// The public key of `path` and its algorithm, by the key's type: RSA -> RS256, EC (P-256) ->
/// ES256, Ed25519 -> EdDSA.
fn public_key(path: &Path) -> anyhow::Result<(DecodingKey, Algorithm)> {
    let pem = std::fs::read(path).with_context(|| format!("auth.jwt.public_key_pem_file: cannot read {}", path.display()))?;
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

    fn grant(rights: &[&str], prefixes: &[&str]) -> Grant {
        let rights: Vec<String> = rights.iter().map(|r| r.to_string()).collect();
        Grant::new("t".into(), &rights, prefixes.iter().map(|p| p.to_string()).collect(), vec!["orders".into()]).unwrap()
    }

    #[test]
    fn prefixes_and_rights() {
        let g = grant(&["read"], &["billing/"]);
        assert!(g.allows(Right::Read, "billing/"));
        assert!(g.allows(Right::Read, "billing/x"));
        assert!(!g.allows(Right::Read, "billing"));
        assert!(!g.allows(Right::Write, "billing/x"));
        assert!(g.allows_table(Right::Read, "orders"));
        assert!(!g.allows_table(Right::Write, "orders"));
        assert!(grant(&["write"], &[""]).allows(Right::Write, "anything"));
        assert!(!grant(&["write"], &[]).allows(Right::Write, "anything"));
        let admin = grant(&["admin"], &[]);
        assert!(admin.allows(Right::Fence, "x") && admin.allows_table(Right::Write, "other"));
        assert!(Grant::new("t".into(), &["raed".into()], vec![], vec![]).is_err());
    }

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

    #[test]
    fn a_remembered_token_still_expires() {
        let jwt = crate::config::JwtSettings { hs256_secret_env: Some("S".into()), ..Default::default() };
        let secret = "0123456789abcdef0123456789abcdef";
        let verifier = JwtVerifier::new(&jwt, |_| Some(secret.into())).unwrap();
        let now = jsonwebtoken::get_current_timestamp();
        let claims = serde_json::json!({"sub": "a", "exp": now + 3600, "fencegate": {"rights": ["read"]}});
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        assert_eq!(verifier.verify(&token).unwrap().0.actor, "jwt:a");
        assert_eq!(verifier.verified.lock().unwrap().len(), 1);
        assert_eq!(verifier.verify(&token).unwrap().0.actor, "jwt:a", "a hit");
        // The same bytes, remembered with an exp now past the leeway: refused.
        for entry in verifier.verified.lock().unwrap().values_mut() {
            entry.1 = now - 61;
        }
        assert_eq!(verifier.verify(&token).unwrap_err(), Unauthenticated::Expired);
        // A token that fails verification is never remembered.
        let bad = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(b"another secret of 32 bytes or more")).unwrap();
        assert_eq!(verifier.verify(&bad).unwrap_err(), Unauthenticated::BadSignature);
        assert_eq!(verifier.verify(&bad).unwrap_err(), Unauthenticated::BadSignature);
        assert_eq!(verifier.verified.lock().unwrap().len(), 1);
    }

    #[test]
    fn crit_headers_and_issuer_arrays_are_refused_and_actors_are_namespaced() {
        use base64::Engine as _;
        let secret = "0123456789abcdef0123456789abcdef";
        let jwt = crate::config::JwtSettings {
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
        assert_eq!(grant.actor, "jwt:https://idp.test#locker", "the issuer is part of the actor when configured");
        assert_eq!(until, exp + 60, "valid until exp plus the leeway");

        // `iss` as an array naming the right issuer: jsonwebtoken would take it; RFC 7519 says a string.
        let array = serde_json::json!({"sub": "locker", "iss": ["https://idp.test"], "exp": exp});
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &array, &key).unwrap();
        assert!(verifier.verify(&token).is_err());

        // A header naming a critical extension, signed with the right key: refused.
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT","crit":["exp"]}"#);
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
        let signed = format!("{header}.{payload}");
        let signature = jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).unwrap();
        assert_eq!(verifier.verify(&format!("{signed}.{signature}")).unwrap_err(), Unauthenticated::InvalidToken);
    }

    #[test]
    fn new_keys_are_long_and_url_safe() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_eq!(parse_digest(&digest_hex(&a)).map(|d| d.len()), Some(32));
        assert!(key_block("svc", &a).contains(&digest_hex(&a)));
    }
}
