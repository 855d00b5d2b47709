//! What the store needs to open its database. The store does not read the configuration: its
//! caller (the server, from `[database]`, `[kv]`, `[locks]` and `[[issuers]]`) fills this in,
//! so the store depends on nothing above it.

use super::Checks;

/// How to open the store. Pool and coalescing settings mean what `[database]` documents
/// (config/default.toml); those marked PostgreSQL are ignored by the embedded SQLite backend.
#[derive(Clone)]
pub struct Settings {
    /// `postgres://` or `postgresql://`: the production backend; `sqlite:`: the embedded file.
    /// May carry a password: printed only through [`crate::redact::redact_url`].
    pub url: String,
    pub max_connections: u32,
    pub min_connections: u32,
    /// How long a request waits for a free connection before it is answered 503.
    pub acquire_timeout_ms: u64,
    /// PostgreSQL: connections are recycled after this long (failovers, DNS changes).
    pub max_lifetime_secs: u64,
    /// Run pending migrations while opening.
    pub migrate_on_start: bool,
    /// PostgreSQL: tasks that combine concurrent kv writes and reads (0: none).
    pub coalesce_workers: usize,
    /// PostgreSQL: most writes combined into one statement.
    pub coalesce_max_rows: usize,
    /// PostgreSQL: the schema holding fencegate's own tables (a validated identifier).
    pub schema: String,
    /// PostgreSQL: the longest a statement waits for a row lock, then 503.
    pub lock_timeout_ms: u64,
    /// PostgreSQL over TCP: `TCP_USER_TIMEOUT` of every connection (0: the system's default).
    pub tcp_user_timeout_ms: u64,
    /// PostgreSQL: the connection pooler between fencegate and the server, if any.
    pub pooler: Pooler,
    /// PostgreSQL: where the reset listener (`LISTEN`) connects instead of `url` (a direct or
    /// session-pool URL). May carry a password.
    pub listen_url: Option<String>,
    /// The checks every fenced statement makes besides the accept rule.
    pub checks: Checks,
    /// PostgreSQL: the scopes `[[issuers]]` sign tokens for, which `fencegate.fence()` (SQL
    /// writers) must refuse to raise without a proof.
    pub issuer_scopes: Vec<String>,
    /// PostgreSQL: the longest scope name `fencegate.fence()` accepts (`kv.max_key_bytes`).
    pub max_scope_bytes: usize,
    /// PostgreSQL: who may call `fencegate.fence()`, and under which rule; written to the
    /// database (with the guards' modes) only by a serving process: `None` for a one-off command.
    pub sql_writers: Option<SqlWriters>,
    /// Fences kept in the reject-only cache (0 disables it).
    pub fence_cache_capacity: usize,
    /// Database work with no answer after this long is given up and its connections closed
    /// (`server.request_timeout_ms` plus a margin; 0: never).
    pub give_up_after_ms: u64,
}

/// `database.pooler`: what sits between fencegate and PostgreSQL, and so what a connection may
/// rely on (`store::pg::pooler`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// A direct connection (or a pooler that passes every startup parameter through): session
    /// settings in the startup packet, named prepared statements.
    #[default]
    None,
    /// A pooler in session mode (PgBouncer `pool_mode = session`): no startup parameter a
    /// pooler refuses; settings per transaction.
    Session,
    /// A pooler in transaction mode: as `Session`, and no named prepared statement, no session
    /// advisory lock, no `LISTEN` except on `listen_url`.
    Transaction,
}

impl Pooler {
    /// The configuration's spelling (`none`, `session`, `transaction`).
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }

    /// Parses the configuration's spelling (`FENCEGATE_DATABASE_POOLER`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "none" => Ok(Pooler::None),
            "session" => Ok(Pooler::Session),
            "transaction" => Ok(Pooler::Transaction),
            other => Err(format!(
                "database.pooler {other:?} is not one of \"none\", \"session\", \"transaction\" (PgBouncer's pool_mode)"
            )),
        }
    }
}

/// What `fencegate.fence()` and the guard triggers need from the configuration (PostgreSQL).
#[derive(Debug, Clone, Default)]
pub struct SqlWriters {
    /// `[[auth.roles]]`: (login role, scope prefixes it may fence; `""` = every scope).
    pub roles: Vec<(String, Vec<String>)>,
    /// `kv.strict`: every scope refuses an equal token.
    pub kv_strict: bool,
    /// The scopes of `strict = true` resources: these refuse an equal token.
    pub strict_scopes: Vec<String>,
    /// `database.sql_fence_idle_timeout_ms`: how long a transaction that called `fence()` may
    /// sit idle (0: no bound set by fence()).
    pub idle_timeout_ms: u64,
}

impl Settings {
    /// `give_up_after_ms`, `None` for 0.
    pub fn give_up_after(&self) -> Option<std::time::Duration> {
        (self.give_up_after_ms > 0).then(|| std::time::Duration::from_millis(self.give_up_after_ms))
    }

    /// The embedded backend is chosen by the URL's scheme.
    pub fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite:")
    }
}

/// Debug without the URL's password.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("coalesce_workers", &self.coalesce_workers)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}
