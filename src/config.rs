//! Settings: defaults < `config/*.toml` file < environment < command-line flags.
//!
//! Every setting is documented in `config/default.toml`. Unknown keys in a file are an error
//! (a typo must not silently fall back to a default), and [`Settings::validate`] refuses values
//! that would only fail later, with a message that says which setting to fix.

use std::{fmt, net::SocketAddr, path::Path, time::Duration};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::{
    fence::{Bindings, Rule, Scope, ScopeRule},
    redact::redact_url,
};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub kv: KvSettings,
    pub locks: LockSettings,
    pub log: LogSettings,
    /// `[[resources]]`: legacy PostgreSQL tables served under `/v1/tables/{name}/{key}`
    /// (see config/tables.example.toml and docs/tables.md).
    pub resources: Vec<crate::tables::ResourceSettings>,
    /// `[[scopes]]`: key prefixes whose writes are always under a given scope, whatever the
    /// client sends (see [`ScopeBinding`]).
    pub scopes: Vec<ScopeBinding>,
    /// `[[issuers]]`: external lock services that sign their tokens; writes and claims under
    /// their scopes need `X-Fencing-Proof` (see `crate::issuers`).
    pub issuers: Vec<crate::issuers::IssuerSettings>,
    /// `[auth]`: API keys and JWTs (see [`AuthSettings`]); none configured = auth off.
    pub auth: AuthSettings,
}

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

/// `[server.tls]`: HTTPS on the listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: std::path::PathBuf,
    /// PEM private key of that certificate (unencrypted).
    pub key_file: std::path::PathBuf,
    /// PEM CA certificates: ask clients for a certificate and verify it against these.
    pub client_ca_file: Option<std::path::PathBuf>,
}

impl AuthSettings {
    /// Any credential configured: every request but `/healthz`, `/readyz` (and `/metrics`
    /// unless protected) needs one.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty() || self.jwt.is_some() || !self.certs.is_empty()
    }
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

/// One `[[scopes]]` entry: every key starting with one of `keys` is written under the scope
/// `name` (normally a lock's name), with or without an `X-Fencing-Scope` header; a different
/// header is 409 `scope-mismatch`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeBinding {
    pub name: String,
    /// Key prefixes (`""` binds every key). Prefixes of two different scopes must not overlap.
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockSettings {
    /// Longest lease a client may ask for (`ttl_ms`), in milliseconds.
    pub max_ttl_ms: u64,
    /// Scope prefixes reserved for the built-in lock service (`""`: every scope): under them a
    /// write or claim needs a token a grant issued, from before the first grant on.
    pub names: Vec<String>,
}

impl Default for LockSettings {
    fn default() -> Self {
        LockSettings { max_ttl_ms: 3_600_000, names: Vec::new() }
    }
}

impl LockSettings {
    /// `names`, validated (see [`crate::fence::Reserved`]).
    pub fn reserved(&self) -> anyhow::Result<crate::fence::Reserved> {
        crate::fence::Reserved::new(&self.names).map_err(|e| anyhow::anyhow!("locks.names: {e}"))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on (`FENCEGATE_LISTEN`, `--listen`).
    pub listen: String,
    /// Largest accepted request body; larger bodies get 413.
    pub body_limit_bytes: usize,
    /// A request that takes longer is answered 503 (its write may still commit: retry with the
    /// same token, which is safe because fenced writes are idempotent under one token).
    pub request_timeout_ms: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish before the process exits.
    pub shutdown_grace_ms: u64,
    /// Requests handled at once; more are shed with 503 + Retry-After (bounded memory and
    /// latency under overload instead of an unbounded queue).
    pub max_in_flight: usize,
    /// Threads running the HTTP server and database I/O. 0 = automatic: half the CPUs, at
    /// least one (see [`ServerSettings::threads`]).
    pub worker_threads: usize,
    /// A connection that has started a request but not finished sending its headers within
    /// this long is closed.
    pub header_timeout_ms: u64,
    /// A request body not fully received within this long (from the end of its headers) is
    /// answered 408 and its connection closed.
    pub body_timeout_ms: u64,
    /// After a body's first second, it must keep arriving at this many bytes a second on
    /// average, else 408 and the connection closed: a stalled or trickled body is cut in
    /// seconds, not at `body_timeout_ms`. 0: no minimum rate.
    pub min_body_rate_bytes_per_s: u64,
    /// A keep-alive connection with no request in progress is closed after this long.
    pub idle_timeout_ms: u64,
    /// A response the client does not read (no byte written for this long) closes the
    /// connection, freeing what the response held.
    pub write_timeout_ms: u64,
    /// Open client connections at most. At the cap, a new connection closes the one that has
    /// made no progress the longest among those not handling a request; if every connection is
    /// handling one, it waits in the listen backlog.
    pub max_connections: usize,
    /// Open connections from one peer IP address at most; a connection beyond it is closed at
    /// once. 0: no per-client cap.
    pub max_connections_per_client: usize,
    /// Request body bytes buffered at once across all requests; a body that would exceed it is
    /// answered 503 + Retry-After.
    pub max_buffered_bytes: usize,
    /// Origins (`https://app.example`) allowed to call fencegate from a browser (CORS). Empty:
    /// no CORS headers at all, so browsers refuse cross-origin reads and preflighted requests.
    pub cors_origins: Vec<String>,
    /// HTTP/2: streams (requests) open at once on one connection; more are refused by the
    /// protocol (the client waits or retries). Each still takes an in-flight slot.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list of a request (decoded names and values, plus 32 bytes per
    /// field); larger requests are refused.
    pub http2_max_header_list_bytes: u32,
    /// `[server.tls]`: HTTPS (absent: plain HTTP).
    pub tls: Option<TlsSettings>,
}

impl ServerSettings {
    /// The runtime's worker threads. Automatic is half the CPUs because fencegate's work per
    /// request is small next to the database's, which usually shares the host, and every extra
    /// idle thread costs cross-thread wake-ups: on 2 CPUs, one thread instead of two cut CPU
    /// per lone write from about 160 µs to 110 µs and raised 1-connection writes/s from about
    /// 0.56x to 0.78x pgbench's, with 64-connection throughput unchanged (see bench/RESULTS.md).
    /// One thread is run by tokio's current-thread scheduler (`main.rs`).
    pub fn threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            listen: "127.0.0.1:8080".into(),
            body_limit_bytes: 1024 * 1024,
            request_timeout_ms: 10_000,
            shutdown_grace_ms: 10_000,
            max_in_flight: 1024,
            worker_threads: 0,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            min_body_rate_bytes_per_s: 1024,
            idle_timeout_ms: 60_000,
            write_timeout_ms: 10_000,
            max_connections: 10_000,
            max_connections_per_client: 0,
            max_buffered_bytes: 64 * 1024 * 1024,
            cors_origins: Vec::new(),
            http2_max_concurrent_streams: 100,
            http2_max_header_list_bytes: 16 * 1024,
            tls: None,
        }
    }
}

#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `postgres://user:pass@host:port/db` (`DATABASE_URL`, `--database-url`). A `sqlite:` URL
    /// selects the embedded backend explicitly.
    pub url: Option<String>,
    /// With no `url`: the embedded SQLite database file (created if missing).
    pub sqlite_path: String,
    pub max_connections: u32,
    pub min_connections: u32,
    /// How long a request waits for a free connection before it is answered 503.
    pub acquire_timeout_ms: u64,
    /// Connections are recycled after this long, so a pool follows failovers and DNS changes.
    pub max_lifetime_secs: u64,
    /// Run pending migrations at start-up (`fencegate migrate` runs them on demand).
    pub migrate_on_start: bool,
    /// PostgreSQL: tasks that combine concurrent kv writes (unscoped and scoped), and GETs,
    /// into multi-row statements (0: one statement per request). Each holds a connection only
    /// while its statement runs.
    pub coalesce_workers: usize,
    /// Most writes combined into one statement.
    pub coalesce_max_rows: usize,
    /// PostgreSQL: the schema holding every table of fencegate's, its migration history
    /// included (created if missing; nothing is created in `public`).
    pub schema: String,
    /// PostgreSQL: the longest a statement of fencegate's waits for a row lock (a SQL writer's
    /// transaction holding a fence after `fencegate.fence()`), then 503.
    pub lock_timeout_ms: u64,
}

impl DatabaseSettings {
    /// The database actually used: `url`, else the embedded SQLite file at `sqlite_path`.
    pub fn effective_url(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.sqlite_path),
        }
    }

    pub fn is_sqlite(&self) -> bool {
        self.effective_url().starts_with("sqlite:")
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        DatabaseSettings {
            url: None,
            sqlite_path: "fencegate.sqlite".into(),
            max_connections: 16,
            min_connections: 1,
            acquire_timeout_ms: 2_000,
            max_lifetime_secs: 1_800,
            migrate_on_start: true,
            coalesce_workers: 4,
            coalesce_max_rows: 128,
            schema: "fencegate".into(),
            lock_timeout_ms: 5_000,
        }
    }
}

/// The URL may carry a password: never print it.
impl fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("sqlite_path", &self.sqlite_path)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("max_lifetime_secs", &self.max_lifetime_secs)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("coalesce_workers", &self.coalesce_workers)
            .field("coalesce_max_rows", &self.coalesce_max_rows)
            .field("schema", &self.schema)
            .field("lock_timeout_ms", &self.lock_timeout_ms)
            .finish()
    }
}

/// Checks a schema name from the configuration: a plain lower-case identifier (it is written
/// into `search_path` and DDL unquoted), not a system schema.
fn validate_schema(schema: &str) -> Result<(), String> {
    let mut chars = schema.chars();
    let plain = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && schema.len() <= 63;
    if !plain {
        return Err(format!("database.schema {schema:?} must be a lower-case identifier: a-z, 0-9 and _, at most 63 bytes"));
    }
    if schema.starts_with("pg_") || schema == "information_schema" {
        return Err(format!("database.schema {schema:?} is a system schema"));
    }
    Ok(())
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvSettings {
    /// `true`: a write needs a token strictly greater than the fence (one write per token).
    pub strict: bool,
    /// Longest key or scope name, in UTF-8 bytes (it is a btree index key: at most 2048).
    pub max_key_bytes: usize,
    /// Most operations in one `POST /v1/batch`.
    pub max_batch_ops: usize,
    /// Fences kept in each process's reject-only cache (0 disables it). The cache only ever
    /// refuses tokens below a fence it has seen; it never accepts, so it is safe with any number
    /// of fencegate processes.
    pub fence_cache_capacity: usize,
    /// `true` (the default): a key, and a legacy-table row, stays bound to the scope of its
    /// last accepted write (none for unscoped); a write under another scope, or without the one
    /// it is bound to, is 409 `scope-mismatch`. `false`: any scope may write any key (then a
    /// zombie can step around a scope fence by leaving the scope out).
    pub sticky_scope: bool,
    /// The largest step one write or claim may raise a fence by (a fence not yet written
    /// counts as 0); a bigger jump is 422 `token-jump`. 0 = no cap. Lock grants are exempt.
    pub max_token_jump: u64,
    /// Longest decimal expansion of a JSON number in a request body (digits PostgreSQL would
    /// print): `1e131071` is 9 bytes sent but 131,072 digits on every read. Longer: 400.
    pub max_number_digits: usize,
}

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            strict: false,
            max_key_bytes: 512,
            max_batch_ops: 1000,
            fence_cache_capacity: 100_000,
            sticky_scope: true,
            max_token_jump: 0,
            max_number_digits: 1000,
        }
    }
}

impl KvSettings {
    pub fn rule(&self) -> Rule {
        Rule::from_strict(self.strict)
    }

    pub fn scope_rule(&self) -> ScopeRule {
        ScopeRule::from_sticky(self.sticky_scope)
    }

    /// The checks every fenced statement makes besides the accept rule.
    pub fn checks(&self) -> crate::store::Checks {
        crate::store::Checks { scopes: self.scope_rule(), jump: crate::fence::JumpCap(self.max_token_jump), reserved: Default::default() }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A `tracing` filter, e.g. `info` or `fencegate=debug,tower_http=info` (`RUST_LOG` wins).
    pub filter: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings { filter: "info".into(), format: "text".into() }
    }
}

/// What the command line may override (each flag also has its env variable).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub database_url: Option<String>,
}

impl Settings {
    /// Builds settings in precedence order: defaults, then the file (if any), then environment
    /// (`DATABASE_URL`, `FENCEGATE_LISTEN`, `FENCEGATE_LOG`, `FENCEGATE_LOG_FORMAT`,
    /// `FENCEGATE_DATABASE_SCHEMA`), then
    /// command-line flags.
    pub fn load(file: Option<&Path>, env: impl Fn(&str) -> Option<String>, cli: Overrides) -> anyhow::Result<Self> {
        let mut settings = match file {
            Some(path) => Self::from_file(path)?,
            None => Settings::default(),
        };
        if let Some(url) = env("DATABASE_URL").filter(|v| !v.is_empty()) {
            settings.database.url = Some(url);
        }
        if let Some(listen) = env("FENCEGATE_LISTEN").filter(|v| !v.is_empty()) {
            settings.server.listen = listen;
        }
        if let Some(filter) = env("FENCEGATE_LOG").filter(|v| !v.is_empty()) {
            settings.log.filter = filter;
        }
        if let Some(format) = env("FENCEGATE_LOG_FORMAT").filter(|v| !v.is_empty()) {
            settings.log.format = format;
        }
        if let Some(schema) = env("FENCEGATE_DATABASE_SCHEMA").filter(|v| !v.is_empty()) {
            settings.database.schema = schema;
        }
        if let Some(url) = cli.database_url {
            settings.database.url = Some(url);
        }
        if let Some(listen) = cli.listen {
            settings.server.listen = listen;
        }
        settings.validate()?;
        Ok(settings)
    }

    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Refuses settings that cannot work, naming the setting to fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        if self.server.body_limit_bytes == 0 {
            bail!("server.body_limit_bytes must be at least 1");
        }
        if self.server.worker_threads > 1024 {
            bail!("server.worker_threads must be at most 1024 (0 = automatic), got {}", self.server.worker_threads);
        }
        if self.server.max_in_flight == 0 {
            bail!("server.max_in_flight must be at least 1");
        }
        if self.server.request_timeout_ms == 0 {
            bail!("server.request_timeout_ms must be at least 1");
        }
        for (name, ms) in [
            ("header_timeout_ms", self.server.header_timeout_ms),
            ("body_timeout_ms", self.server.body_timeout_ms),
            ("idle_timeout_ms", self.server.idle_timeout_ms),
            ("write_timeout_ms", self.server.write_timeout_ms),
        ] {
            if ms == 0 {
                bail!("server.{name} must be at least 1");
            }
        }
        if self.server.max_connections == 0 {
            bail!("server.max_connections must be at least 1");
        }
        if self.server.http2_max_concurrent_streams == 0 {
            bail!("server.http2_max_concurrent_streams must be at least 1");
        }
        if self.server.http2_max_header_list_bytes < 1024 {
            bail!("server.http2_max_header_list_bytes must be at least 1024");
        }
        if self.server.max_buffered_bytes < self.server.body_limit_bytes {
            bail!("server.max_buffered_bytes ({}) must be at least server.body_limit_bytes ({}): one largest body must fit",
                self.server.max_buffered_bytes, self.server.body_limit_bytes);
        }
        for origin in &self.server.cors_origins {
            if axum::http::HeaderValue::from_str(origin).is_err() || !origin.contains("://") || origin.ends_with('/') {
                bail!("server.cors_origins: {origin:?} is not an origin (scheme://host[:port], no path)");
            }
        }
        if self.kv.max_number_digits == 0 {
            bail!("kv.max_number_digits must be at least 1");
        }
        if !(1..=2048).contains(&self.kv.max_key_bytes) {
            bail!("kv.max_key_bytes must be between 1 and 2048 (it is a btree index key), got {}", self.kv.max_key_bytes);
        }
        if self.kv.max_token_jump > i64::MAX as u64 {
            bail!("kv.max_token_jump must be at most {} (0 = no cap), got {}", i64::MAX, self.kv.max_token_jump);
        }
        if !(1..=100_000).contains(&self.kv.max_batch_ops) {
            bail!("kv.max_batch_ops must be between 1 and 100000, got {}", self.kv.max_batch_ops);
        }
        if self.database.url.is_none() && self.database.sqlite_path.trim().is_empty() {
            bail!("database.sqlite_path must not be empty (or set database.url / DATABASE_URL)");
        }
        if self.locks.max_ttl_ms == 0 {
            bail!("locks.max_ttl_ms must be at least 1");
        }
        self.locks.reserved()?;
        // One source of tokens per scope: a scope an issuer signs for is never the built-in
        // lock service's too.
        for name in &self.locks.names {
            for issuer in &self.issuers {
                if let Some(prefix) = issuer.scopes.iter().find(|p| p.starts_with(name.as_str()) || name.starts_with(p.as_str())) {
                    bail!(
                        "locks.names {name:?} overlaps the scopes {prefix:?} of issuer {:?}: a scope has one source of tokens, \
                         the built-in locks or that issuer; remove one of the two",
                        issuer.name
                    );
                }
            }
        }
        if self.database.coalesce_workers > self.database.max_connections as usize {
            bail!("database.coalesce_workers ({}) must not exceed database.max_connections ({}): each needs a connection while it runs",
                self.database.coalesce_workers, self.database.max_connections);
        }
        validate_schema(&self.database.schema).map_err(|e| anyhow::anyhow!(e))?;
        if self.database.lock_timeout_ms == 0 {
            bail!("database.lock_timeout_ms must be at least 1");
        }
        if self.database.coalesce_max_rows == 0 {
            bail!("database.coalesce_max_rows must be at least 1");
        }
        if self.database.max_connections == 0 {
            bail!("database.max_connections must be at least 1");
        }
        if self.database.min_connections > self.database.max_connections {
            bail!("database.min_connections ({}) exceeds database.max_connections ({})",
                self.database.min_connections, self.database.max_connections);
        }
        if let Some(url) = &self.database.url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://") || url.starts_with("sqlite:")) {
                bail!("the database URL must start with postgres://, postgresql:// or sqlite: (got {})", redact_url(url));
            }
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            bail!("log.format must be \"text\" or \"json\", got {:?}", self.log.format);
        }
        crate::tables::validate(&self.resources, !self.database.is_sqlite(), self.kv.max_key_bytes)?;
        self.bindings()?;
        self.validate_auth()?;
        Ok(())
    }

    /// Any credential configured (API key or JWT): then every request needs one. The edge
    /// uses it too (the Host check applies only with auth off).
    pub fn auth_enabled(&self) -> bool {
        self.auth.enabled()
    }

    /// The safe default: with no credentials, only a loopback address may be served, unless
    /// `auth.allow_unauthenticated = true`.
    pub fn check_exposure(&self, addr: SocketAddr) -> anyhow::Result<()> {
        if self.auth_enabled() || self.auth.allow_unauthenticated || addr.ip().is_loopback() {
            return Ok(());
        }
        bail!(
            "refusing to serve {addr} without authentication: anyone who can reach it could write every key and take \
             every lock. Add a key: run `fencegate auth new-key --name my-service` and put the [[auth.keys]] block it \
             prints in the config file (or configure [auth.jwt]); or listen on a loopback address (127.0.0.1:8080); or, \
             if a trusted network really is enough, set auth.allow_unauthenticated = true"
        )
    }

    fn validate_auth(&self) -> anyhow::Result<()> {
        let mut names = std::collections::HashSet::new();
        for (i, key) in self.auth.keys.iter().enumerate() {
            let what = format!("auth.keys[{i}] ({:?})", key.name);
            if key.name.is_empty() || key.name.len() > 256 || key.name.chars().any(char::is_control) {
                bail!("{what}: name must be 1 to 256 printable bytes");
            }
            if !names.insert(key.name.as_str()) {
                bail!("{what}: two keys have this name; each key names one actor");
            }
            if crate::auth::parse_digest(&key.sha256).is_none() {
                bail!("{what}: sha256 must be the 64 hex digits of the key's sha256 (`fencegate auth new-key` prints it)");
            }
            crate::auth::Grant::new(key.name.clone(), &key.rights, vec![], vec![]).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        }
        let mut digests = std::collections::HashSet::new();
        for key in &self.auth.keys {
            if !digests.insert(key.sha256.to_ascii_lowercase()) {
                bail!("auth.keys: the key {:?} has the digest of another key", key.name);
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, cert) in self.auth.certs.iter().enumerate() {
            let what = format!("auth.certs[{i}] ({:?})", cert.name);
            if cert.name.is_empty() || cert.name.len() > 256 || cert.name.chars().any(char::is_control) {
                bail!("{what}: name must be 1 to 256 printable bytes");
            }
            if !names.insert(cert.name.as_str()) {
                bail!("{what}: two [[auth.certs]] entries have this name; each names one actor");
            }
            match (&cert.subject_cn, &cert.uri_san) {
                (Some(value), None) | (None, Some(value)) if !value.is_empty() => {}
                _ => bail!("{what}: give exactly one of subject_cn and uri_san, not empty"),
            }
            crate::auth::Grant::new(cert.name.clone(), &cert.rights, vec![], vec![]).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        }
        if !self.auth.certs.is_empty() && self.server.tls.as_ref().is_none_or(|tls| tls.client_ca_file.is_none()) {
            bail!(
                "[[auth.certs]] needs client certificates: set server.tls.cert_file, key_file and client_ca_file (the CA \
                 that issues the clients' certificates)"
            );
        }
        if let Some(jwt) = &self.auth.jwt {
            if jwt.hs256_secret_env.is_some() == jwt.public_key_pem_file.is_some() {
                bail!("[auth.jwt] needs exactly one of hs256_secret_env and public_key_pem_file");
            }
        }
        Ok(())
    }

    /// The `[[scopes]]` bindings, validated: each name is a valid scope, each prefix fits a key,
    /// and no key is bound to two scopes.
    pub fn bindings(&self) -> anyhow::Result<Bindings> {
        let mut parsed = Vec::with_capacity(self.scopes.len());
        for (i, binding) in self.scopes.iter().enumerate() {
            let scope = Scope::parse(&binding.name, self.kv.max_key_bytes)
                .map_err(|e| anyhow::anyhow!("scopes[{i}]: the name {:?} {e}", binding.name))?;
            for prefix in &binding.keys {
                if prefix.len() > self.kv.max_key_bytes || prefix.chars().any(char::is_control) {
                    bail!(
                        "scopes[{i}] ({:?}): key prefix {prefix:?} is longer than kv.max_key_bytes or holds a control character",
                        binding.name
                    );
                }
            }
            parsed.push((scope, binding.keys.clone()));
        }
        Bindings::new(parsed).map_err(|e| anyhow::anyhow!("[[scopes]]: {e}"))
    }

    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.server.listen.parse().with_context(|| {
            format!("server.listen / FENCEGATE_LISTEN / --listen must be IP:PORT, e.g. 127.0.0.1:8080 (got {:?})", self.server.listen)
        })
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.server.request_timeout_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.server.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for ok in ["fencegate", "fg_2", "_x", "public"] {
            assert!(validate_schema(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Fencegate", "fence-gate", "a;drop", "pg_catalog", "information_schema", "1x", &"x".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_toml_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
        let file = Settings::from_file(&path).unwrap();
        let defaults = Settings::default();
        assert_eq!(format!("{file:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn precedence_is_file_then_env_then_cli() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"postgres://file/db\"\n").unwrap();
        let env = |k: &str| (k == "FENCEGATE_LISTEN").then(|| "127.0.0.1:2".to_string());
        let s = Settings::load(Some(&path), env, Overrides::default()).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:2");
        assert_eq!(s.database.url.as_deref(), Some("postgres://file/db"));
        let cli = Overrides { listen: Some("127.0.0.1:3".into()), database_url: Some("postgres://cli/db".into()) };
        let s = Settings::load(Some(&path), env, cli).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:3");
        assert_eq!(s.database.url.as_deref(), Some("postgres://cli/db"));
    }

    #[test]
    fn bad_settings_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[kv]\nstirct = true\n").unwrap();
        let err = format!("{:#}", Settings::load(Some(&path), no_env, Overrides::default()).unwrap_err());
        assert!(err.contains("stirct"), "{err}");
        let cli = Overrides { listen: Some("nonsense".into()), ..Default::default() };
        let err = format!("{:#}", Settings::load(None, no_env, cli).unwrap_err());
        assert!(err.contains("--listen"), "{err}");
    }

    #[test]
    fn scope_bindings_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Settings::load(Some(&path), no_env, Overrides::default())
        };
        let ok = load("[[scopes]]\nname = \"billing\"\nkeys = [\"invoice-\", \"billing/\"]\n").unwrap();
        let bound = ok.bindings().unwrap();
        assert_eq!(bound.of("invoice-7").map(|s| s.as_str()), Some("billing"));
        let overlap = "[[scopes]]\nname = \"a\"\nkeys = [\"inv\"]\n[[scopes]]\nname = \"b\"\nkeys = [\"invoice\"]\n";
        let err = format!("{:#}", load(overlap).unwrap_err());
        assert!(err.contains("overlaps"), "{err}");
        let err = format!("{:#}", load("[[scopes]]\nname = \"\"\nkeys = [\"x\"]\n").unwrap_err());
        assert!(err.contains("scopes[0]"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        let mut s = Settings::default();
        s.database.url = Some("postgres://u:secret@h/db".into());
        assert!(!format!("{s:?}").contains("secret"));
    }
}
