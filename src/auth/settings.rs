//! `[auth]` as written in the config file, and the checks that need nothing but it. Whether
//! `[[auth.certs]]` can work at all depends on `[server.tls]`: that check is the config's.

use std::{collections::HashSet, fmt};

use anyhow::bail;
use serde::Deserialize;

use super::{parse_digest, Grant};

/// `[auth]`: who may do what (docs/security.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// With no credentials configured, `serve` refuses a non-loopback listen address unless
    /// this is true.
    pub allow_unauthenticated: bool,
    /// `true`: `GET /metrics` needs the `admin` right (else it stays open, as do `/healthz`
    /// and `/readyz`).
    pub protect_metrics: bool,
    /// `[[auth.keys]]`: API keys, by their sha256 digest.
    pub keys: Vec<ApiKeySettings>,
    /// `[auth.jwt]`: accept JWTs signed by this key.
    pub jwt: Option<JwtSettings>,
    /// `[[auth.certs]]`: client certificates (verified against `server.tls.client_ca_file`) as
    /// identities, by subject CN or URI SAN.
    pub certs: Vec<CertSettings>,
    /// `[[auth.roles]]`: PostgreSQL login roles that may call `fencegate.fence()` (SQL
    /// writers), each on the scopes its prefixes cover. Not HTTP credentials.
    pub roles: Vec<RoleSettings>,
}

/// One `[[auth.roles]]` entry: the PostgreSQL login role `name` (its `session_user`) is the
/// actor `role:NAME`, with the `fence` right on the scopes its prefixes cover. EXECUTE on
/// `fencegate.fence()` is granted to exactly these roles at start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSettings {
    pub name: String,
    /// The scopes it may fence (`""` = all; none: no scope).
    #[serde(default)]
    pub prefixes: Vec<String>,
}

/// One `[[auth.certs]]` entry: a verified client certificate naming `subject_cn` or `uri_san`
/// is the actor `cert:NAME`, with these rights.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertSettings {
    pub name: String,
    /// A common name of the certificate's subject (exactly one of this and `uri_san`).
    pub subject_cn: Option<String>,
    /// A URI subject alternative name, e.g. a SPIFFE ID `spiffe://corp/ns/billing/sa/worker`.
    pub uri_san: Option<String>,
    /// Among `read`, `write`, `lock`, `fence`, `admin`.
    pub rights: Vec<String>,
    #[serde(default)]
    pub prefixes: Vec<String>,
    #[serde(default)]
    pub tables: Vec<String>,
}

/// One `[[auth.keys]]` entry. Only the key's digest is configured, never the key.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySettings {
    /// The actor: in logs, and the owner of the leases it takes.
    pub name: String,
    /// Lower-case or upper-case hex sha256 of the key (`fencegate auth new-key` prints it).
    pub sha256: String,
    /// Among `read`, `write`, `lock`, `fence`, `admin`.
    pub rights: Vec<String>,
    /// The keys, scopes and lock names it may touch (`""` = all).
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// The legacy-table resources it may touch.
    #[serde(default)]
    pub tables: Vec<String>,
}

/// A digest is not a secret, but it need not be in every log line either.
impl fmt::Debug for ApiKeySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeySettings")
            .field("name", &self.name)
            .field("rights", &self.rights)
            .field("prefixes", &self.prefixes)
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

/// `[auth.jwt]`: exactly one key source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    /// The environment variable holding the HS256 secret (the secret is never in a file).
    pub hs256_secret_env: Option<String>,
    /// A PEM public key; RS256, ES256 or EdDSA by the key's type.
    pub public_key_pem_file: Option<std::path::PathBuf>,
    /// Checked against `iss` when set.
    pub issuer: Option<String>,
    /// Checked against `aud` when set.
    pub audience: Option<String>,
}

impl AuthSettings {
    /// Any credential configured: every request but `/healthz`, `/readyz` (and `/metrics`
    /// unless protected) needs one.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty() || self.jwt.is_some() || !self.certs.is_empty()
    }

    /// Refuses entries that cannot work, naming the one to fix. Files and secrets are read
    /// later, by [`super::Authenticator::new`].
    pub fn validate(&self) -> anyhow::Result<()> {
        let mut names = HashSet::new();
        for (i, key) in self.keys.iter().enumerate() {
            let what = format!("auth.keys[{i}] ({:?})", key.name);
            if !printable_name(&key.name) {
                bail!("{what}: name must be 1 to 256 printable bytes");
            }
            if !names.insert(key.name.as_str()) {
                bail!("{what}: two keys have this name; each key names one actor");
            }
            if parse_digest(&key.sha256).is_none() {
                bail!("{what}: sha256 must be the 64 hex digits of the key's sha256 (`fencegate auth new-key` prints it)");
            }
            Grant::new(key.name.clone(), &key.rights, vec![], vec![])
                .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        }
        let mut digests = HashSet::new();
        for key in &self.keys {
            if !digests.insert(key.sha256.to_ascii_lowercase()) {
                bail!(
                    "auth.keys: the key {:?} has the digest of another key",
                    key.name
                );
            }
        }
        let mut names = HashSet::new();
        for (i, cert) in self.certs.iter().enumerate() {
            let what = format!("auth.certs[{i}] ({:?})", cert.name);
            if !printable_name(&cert.name) {
                bail!("{what}: name must be 1 to 256 printable bytes");
            }
            if !names.insert(cert.name.as_str()) {
                bail!("{what}: two [[auth.certs]] entries have this name; each names one actor");
            }
            match (&cert.subject_cn, &cert.uri_san) {
                (Some(value), None) | (None, Some(value)) if !value.is_empty() => {}
                _ => bail!("{what}: give exactly one of subject_cn and uri_san, not empty"),
            }
            Grant::new(cert.name.clone(), &cert.rights, vec![], vec![])
                .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        }
        let mut names = HashSet::new();
        for (i, role) in self.roles.iter().enumerate() {
            let what = format!("auth.roles[{i}] ({:?})", role.name);
            // PostgreSQL truncates identifiers to 63 bytes: a longer name would name another role.
            if role.name.is_empty()
                || role.name.len() > 63
                || role.name.chars().any(char::is_control)
            {
                bail!("{what}: name must be a PostgreSQL role name, 1 to 63 bytes without control characters");
            }
            if !names.insert(role.name.as_str()) {
                bail!("{what}: two [[auth.roles]] entries name this role");
            }
            if role.prefixes.is_empty() {
                bail!("{what}: prefixes must name the scopes it may fence (\"\" for every scope)");
            }
        }
        if let Some(jwt) = &self.jwt {
            if jwt.hs256_secret_env.is_some() == jwt.public_key_pem_file.is_some() {
                bail!("[auth.jwt] needs exactly one of hs256_secret_env and public_key_pem_file");
            }
        }
        Ok(())
    }
}

/// An actor's name goes into logs and lease owners: short, and no control characters.
fn printable_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 256 && !name.chars().any(char::is_control)
}
