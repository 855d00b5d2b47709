//! Settings: defaults < `config/*.toml` file < environment < command-line flags.
//!
//! Every setting is documented in `config/default.toml`. Unknown keys in a file are an error
//! (a typo must not silently fall back to a default), and [`Settings::validate`] refuses values
//! that would only fail later, with a message that says which setting to fix.
//!
//! This module loads and layers; it owns no part's settings but the database's. Each table of
//! the file is a struct beside the part it configures, which checks it: `[server]` in
//! `server::ServerSettings` (`[server.tls]`: `tls::TlsSettings`), `[kv]` and `[[scopes]]` in
//! `fence`, `[locks]` in `locks`, `[log]` in `telemetry`, `[auth]` in `auth`, `[[issuers]]` in
//! `issuers`, `[[resources]]` in `tables`. What one part asks of another is checked here.

use std::{fmt, net::SocketAddr, path::Path, time::Duration};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::{
    auth::AuthSettings,
    fence::{Bindings, KvSettings, ScopeBinding},
    locks::LockSettings,
    redact::redact_url,
    server::settings::ServerSettings,
    telemetry::LogSettings,
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
    /// while its statement runs. Unset: [`DatabaseSettings::coalesce_workers`] picks.
    pub coalesce_workers: Option<usize>,
    /// Most writes combined into one statement.
    pub coalesce_max_rows: usize,
    /// PostgreSQL: the schema holding every table of fencegate's, its migration history
    /// included (created if missing; nothing is created in `public`).
    pub schema: String,
    /// PostgreSQL: the longest a statement of fencegate's waits for a row lock (a SQL writer's
    /// transaction holding a fence after `fencegate.fence()`), then 503.
    pub lock_timeout_ms: u64,
    /// PostgreSQL: how long a SQL writer's transaction may sit idle after
    /// `fencegate.fence()` (its `idle_in_transaction_session_timeout`), so a frozen client
    /// cannot hold a scope's fence for ever (0: fence() sets no bound).
    pub sql_fence_idle_timeout_ms: u64,
    /// PostgreSQL over TCP: how long data sent to the server may stay unacknowledged before the
    /// connection is given up (`TCP_USER_TIMEOUT`; keepalives are always on), so a partition
    /// that silently drops packets fails statements within seconds instead of TCP's backoff,
    /// and the pool is fresh when the network heals (0: the system's default).
    pub tcp_user_timeout_ms: u64,
    /// PostgreSQL: the connection pooler in front of the server: `none`, `session` or
    /// `transaction` (PgBouncer's `pool_mode`; `FENCEGATE_DATABASE_POOLER`). Behind a pooler
    /// fencegate sends no startup parameter it refuses and sets its settings per transaction;
    /// in transaction mode it also names no prepared statement (docs/operations.md).
    pub pooler: crate::store::Pooler,
    /// PostgreSQL: where the reset listener (`LISTEN`) connects, a direct or session-pool URL
    /// (`FENCEGATE_DATABASE_LISTEN_URL`). Unset: `url`, except with `pooler = "transaction"`,
    /// where resets reach other processes through the audit-log poll (within a second).
    pub listen_url: Option<String>,
    /// Refused writes kept in the database (`GET /v1/admin/refusals`), at most; fair per actor
    /// (`store::refusals`).
    pub refusals_kept: u32,
}

impl DatabaseSettings {
    /// The database actually used: `url`, else the embedded SQLite file at `sqlite_path`.
    pub fn effective_url(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.sqlite_path),
        }
    }

    /// The coalescing workers: as configured, else one per 4 CPUs (at least 1, at most a
    /// quarter of `max_connections`). Fewer workers make larger batches: fewer statements and commits per
    /// write, and writes to one key in one statement's order. On 2 CPUs one worker carried
    /// 17-72% more writes per second than four on every write step of the load bench, at less
    /// CPU per write on both fencegate's and PostgreSQL's side (bench/RESULTS.md); a larger
    /// machine gets more, so one PostgreSQL backend is not the ceiling.
    pub fn coalesce_workers(&self) -> usize {
        self.coalesce_workers.unwrap_or_else(|| {
            // As many read workers run beside them: together at most half the connections, so
            // claims, table writes and refusal explanations always find one.
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cpus / 4).min(self.max_connections as usize / 4).max(1)
        })
    }

    pub fn is_sqlite(&self) -> bool {
        self.effective_url().starts_with("sqlite:")
    }

    /// Refuses settings that cannot work, naming the one to fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.url.is_none() && self.sqlite_path.trim().is_empty() {
            bail!("database.sqlite_path must not be empty (or set database.url / DATABASE_URL)");
        }
        validate_schema(&self.schema).map_err(|e| anyhow::anyhow!(e))?;
        if self.is_sqlite() && self.pooler != crate::store::Pooler::None {
            bail!("database.pooler applies to PostgreSQL only: remove it, or set database.url to a postgres:// URL");
        }
        if let Some(url) = &self.listen_url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                bail!(
                    "database.listen_url {:?} must be a postgres:// URL (a direct or session-pool connection for LISTEN)",
                    redact_url(url)
                );
            }
        }
        if self.lock_timeout_ms == 0 {
            bail!("database.lock_timeout_ms must be at least 1");
        }
        if self.sql_fence_idle_timeout_ms > i32::MAX as u64 {
            bail!(
                "database.sql_fence_idle_timeout_ms must be at most {} (about 24 days)",
                i32::MAX
            );
        }
        if self.refusals_kept == 0 {
            bail!("database.refusals_kept must be at least 1");
        }
        if self.coalesce_max_rows == 0 {
            bail!("database.coalesce_max_rows must be at least 1");
        }
        if self.max_connections == 0 {
            bail!("database.max_connections must be at least 1");
        }
        if self.coalesce_workers() > self.max_connections as usize {
            bail!("database.coalesce_workers ({}) must not exceed database.max_connections ({}): each needs a connection while it runs",
                self.coalesce_workers(), self.max_connections);
        }
        if self.min_connections > self.max_connections {
            bail!(
                "database.min_connections ({}) exceeds database.max_connections ({})",
                self.min_connections,
                self.max_connections
            );
        }
        if let Some(url) = &self.url {
            if !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite:"))
            {
                bail!("the database URL must start with postgres://, postgresql:// or sqlite: (got {})", redact_url(url));
            }
        }
        Ok(())
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
            coalesce_workers: None,
            coalesce_max_rows: 128,
            schema: "fencegate".into(),
            lock_timeout_ms: 5_000,
            sql_fence_idle_timeout_ms: 30_000,
            tcp_user_timeout_ms: 10_000,
            pooler: crate::store::Pooler::None,
            listen_url: None,
            refusals_kept: 10_000,
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
            .field("sql_fence_idle_timeout_ms", &self.sql_fence_idle_timeout_ms)
            .field("tcp_user_timeout_ms", &self.tcp_user_timeout_ms)
            .field("pooler", &self.pooler)
            .field("listen_url", &self.listen_url.as_deref().map(redact_url))
            .field("refusals_kept", &self.refusals_kept)
            .finish()
    }
}

/// Checks a schema name from the configuration: a plain lower-case identifier (it is written
/// into `search_path` and DDL unquoted), not a system schema.
fn validate_schema(schema: &str) -> Result<(), String> {
    let mut chars = schema.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
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

/// What the command line may override (each flag also has its env variable).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub database_url: Option<String>,
}

impl Settings {
    /// Builds settings in precedence order: defaults, then the file (if any), then environment
    /// (`DATABASE_URL`, `FENCEGATE_LISTEN`, `FENCEGATE_LOG`, `FENCEGATE_LOG_FORMAT`,
    /// `FENCEGATE_DATABASE_SCHEMA`, `FENCEGATE_DATABASE_POOLER`, `FENCEGATE_DATABASE_LISTEN_URL`,
    /// `FENCEGATE_KV_IDEMPOTENCY_TTL_MS`), then
    /// command-line flags.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        cli: Overrides,
    ) -> anyhow::Result<Self> {
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
        if let Some(pooler) = env("FENCEGATE_DATABASE_POOLER").filter(|v| !v.is_empty()) {
            settings.database.pooler = crate::store::Pooler::parse(&pooler)
                .map_err(|e| anyhow::anyhow!("FENCEGATE_DATABASE_POOLER: {e}"))?;
        }
        if let Some(url) = env("FENCEGATE_DATABASE_LISTEN_URL").filter(|v| !v.is_empty()) {
            settings.database.listen_url = Some(url);
        }
        if let Some(ttl) = env("FENCEGATE_KV_IDEMPOTENCY_TTL_MS").filter(|v| !v.is_empty()) {
            settings.kv.idempotency_ttl_ms = ttl.trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "FENCEGATE_KV_IDEMPOTENCY_TTL_MS must be a whole number of milliseconds, got {ttl:?}"
                )
            })?;
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

    /// Refuses settings that cannot work, naming the setting to fix: each part's own first,
    /// then what one part asks of another.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.server.validate()?;
        self.kv.validate().map_err(anyhow::Error::msg)?;
        self.database.validate()?;
        self.locks.validate()?;
        self.log.validate()?;
        self.auth.validate()?;
        // One source of tokens per scope: a scope an issuer signs for is never the built-in
        // lock service's too.
        for name in &self.locks.names {
            for issuer in &self.issuers {
                if let Some(prefix) = issuer
                    .scopes
                    .iter()
                    .find(|p| p.starts_with(name.as_str()) || name.starts_with(p.as_str()))
                {
                    bail!(
                        "locks.names {name:?} overlaps the scopes {prefix:?} of issuer {:?}: a scope has one source of tokens, \
                         the built-in locks or that issuer; remove one of the two",
                        issuer.name
                    );
                }
            }
        }
        crate::tables::validate(
            &self.resources,
            !self.database.is_sqlite(),
            self.kv.max_key_bytes,
        )?;
        self.bindings()?;
        if !self.auth.certs.is_empty()
            && self
                .server
                .tls
                .as_ref()
                .is_none_or(|tls| tls.client_ca_file.is_none())
        {
            bail!(
                "[[auth.certs]] needs client certificates: set server.tls.cert_file, key_file and client_ca_file (the CA \
                 that issues the clients' certificates)"
            );
        }
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

    /// The `[[scopes]]` bindings, validated against `kv.max_key_bytes`.
    pub fn bindings(&self) -> anyhow::Result<Bindings> {
        crate::fence::bindings(&self.scopes, self.kv.max_key_bytes).map_err(anyhow::Error::msg)
    }

    /// The router's deadline for one request (`server.request_timeout_ms`).
    pub fn request_timeout(&self) -> Duration {
        self.server.request_timeout()
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
        for bad in [
            "",
            "Fencegate",
            "fence-gate",
            "a;drop",
            "pg_catalog",
            "information_schema",
            "1x",
            &"x".repeat(64),
        ] {
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
    fn the_tables_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tables.example.toml");
        let settings = Settings::from_file(&path).unwrap();
        assert_eq!(settings.resources.len(), 3);
        crate::tables::validate(&settings.resources, true, 512).unwrap();
    }

    #[test]
    fn the_pgbouncer_example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/pgbouncer.example.toml");
        let settings = Settings::from_file(&path).unwrap();
        settings.validate().unwrap();
        assert_eq!(settings.database.pooler, crate::store::Pooler::Transaction);
        assert!(settings.database.listen_url.is_some());
    }

    #[test]
    fn the_pooler_comes_from_the_environment_and_is_validated() {
        let env = |k: &str| match k {
            "FENCEGATE_DATABASE_POOLER" => Some("session".to_string()),
            "FENCEGATE_DATABASE_LISTEN_URL" => Some("postgres://direct/db".to_string()),
            "DATABASE_URL" => Some("postgres://pooler/db".to_string()),
            _ => None,
        };
        let s = Settings::load(None, env, Overrides::default()).unwrap();
        assert_eq!(s.database.pooler, crate::store::Pooler::Session);
        assert_eq!(
            s.database.listen_url.as_deref(),
            Some("postgres://direct/db")
        );

        let bad = |k: &str| (k == "FENCEGATE_DATABASE_POOLER").then(|| "statement".to_string());
        let err = Settings::load(None, bad, Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("\"transaction\""), "{err}");
        // SQLite has no pooler: refused, not ignored.
        let sqlite =
            |k: &str| (k == "FENCEGATE_DATABASE_POOLER").then(|| "transaction".to_string());
        let err = Settings::load(None, sqlite, Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("PostgreSQL only"), "{err}");
    }

    #[test]
    fn precedence_is_file_then_env_then_cli() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"postgres://file/db\"\n",
        )
        .unwrap();
        let env = |k: &str| (k == "FENCEGATE_LISTEN").then(|| "127.0.0.1:2".to_string());
        let s = Settings::load(Some(&path), env, Overrides::default()).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:2");
        assert_eq!(s.database.url.as_deref(), Some("postgres://file/db"));
        let cli = Overrides {
            listen: Some("127.0.0.1:3".into()),
            database_url: Some("postgres://cli/db".into()),
        };
        let s = Settings::load(Some(&path), env, cli).unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:3");
        assert_eq!(s.database.url.as_deref(), Some("postgres://cli/db"));
    }

    #[test]
    fn bad_settings_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[kv]\nstirct = true\n").unwrap();
        let err = format!(
            "{:#}",
            Settings::load(Some(&path), no_env, Overrides::default()).unwrap_err()
        );
        assert!(err.contains("stirct"), "{err}");
        let cli = Overrides {
            listen: Some("nonsense".into()),
            ..Default::default()
        };
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
        let ok =
            load("[[scopes]]\nname = \"billing\"\nkeys = [\"invoice-\", \"billing/\"]\n").unwrap();
        let bound = ok.bindings().unwrap();
        assert_eq!(bound.of("invoice-7").map(|s| s.as_str()), Some("billing"));
        let overlap = "[[scopes]]\nname = \"a\"\nkeys = [\"inv\"]\n[[scopes]]\nname = \"b\"\nkeys = [\"invoice\"]\n";
        let err = format!("{:#}", load(overlap).unwrap_err());
        assert!(err.contains("overlaps"), "{err}");
        let err = format!(
            "{:#}",
            load("[[scopes]]\nname = \"\"\nkeys = [\"x\"]\n").unwrap_err()
        );
        assert!(err.contains("scopes[0]"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        let mut s = Settings::default();
        s.database.url = Some("postgres://u:secret@h/db".into());
        assert!(!format!("{s:?}").contains("secret"));
    }
}
