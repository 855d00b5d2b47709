//! What can go wrong in the store, sorted by what the client may do about it: retry later
//! (unavailable, raced, not ready), fix the request (refused), or nothing (internal, corrupt,
//! task: logged, never sent). Both backends' driver errors are sorted here, in one place.

use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is overloaded right now; the client may retry.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// Anything else: a bug or a broken database. Logged, never sent to clients.
    #[error("database error: {0}")]
    Internal(#[source] Cause),
    #[error("the database holds an invalid value: {0}")]
    Corrupt(String),
    /// The database refused a value the request sent (SQLSTATE class 22, a data exception:
    /// e.g. a JSON number beyond PostgreSQL's numeric range). The client's to fix: 400.
    #[error("the database cannot store this value: {0}")]
    Refused(String),
    /// The task running the database work panicked. Logged, never sent to clients.
    #[error("database task failed: {0}")]
    Task(String),
    /// The database refused a write for a reason that no longer holds when the refusal is
    /// explained: a concurrent change (a lock grant, a fence raised) landed between the
    /// statement's snapshot and the explanation. Nothing was written; a retry with the same
    /// token is safe and may now succeed (503).
    #[error("the write raced a concurrent change: {0}")]
    Raced(String),
    /// The database cannot take writes yet, for a reason fencegate states itself (never a
    /// driver's text): a standby, migrations owed. 503; the detail is sent.
    #[error("not ready: {0}")]
    NotReady(String),
}

/// What lies under an unavailable or internal [`StoreError`]: the database driver's error,
/// shared (a coalesced statement's failure is the failure of every write that waited on it, so
/// each gets the whole error, not a copy of its text), or fencegate's own account of it.
#[derive(Debug, Clone)]
pub enum Cause {
    Database(Arc<sqlx::Error>),
    Said(std::borrow::Cow<'static, str>),
}

impl Cause {
    /// Whether the database itself answered with an error (rather than the connection or the
    /// pool failing): the statement was refused, so nothing of it was committed.
    pub fn is_database_refusal(&self) -> bool {
        matches!(self, Cause::Database(err) if matches!(**err, sqlx::Error::Database(_)))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Database(err) => err.fmt(f),
            Cause::Said(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Cause::Database(err) => Some(&**err),
            Cause::Said(_) => None,
        }
    }
}

impl StoreError {
    /// Whether this is PostgreSQL's refusal of a key that a write would create with a token
    /// above the jump cap (the trigger `fencegate_kv_created`, `pg/sql.rs`): the statement was
    /// aborted, nothing of it was committed, and the write is refused as a jump.
    pub fn is_key_jump(&self) -> bool {
        self.database_error()
            .is_some_and(|db| db.code().as_deref() == Some(super::pg::KEY_JUMP_SQLSTATE))
    }

    /// The token and key a key-jump refusal names (the trigger's DETAIL: the token, a space, the
    /// key), if it can be read.
    pub fn key_jump_detail(&self) -> Option<(i64, String)> {
        if !self.is_key_jump() {
            return None;
        }
        let detail = self
            .database_error()?
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
            .detail()?;
        let (token, key) = detail.split_once(' ')?;
        Some((token.parse().ok()?, key.to_owned()))
    }

    /// Whether PostgreSQL gave up waiting for a lock (SQLSTATE 55P03: `lock_timeout` passed, or
    /// `NOWAIT`): the statement was aborted and nothing of it was written.
    pub fn is_lock_timeout(&self) -> bool {
        match self {
            StoreError::Unavailable(Cause::Database(err)) => match &**err {
                sqlx::Error::Database(db) => db.code().as_deref() == Some("55P03"),
                _ => false,
            },
            _ => false,
        }
    }

    /// The database's own error under an internal one (SQLSTATE, message, detail), if any.
    pub fn database_error(&self) -> Option<&(dyn sqlx::error::DatabaseError + 'static)> {
        match self {
            StoreError::Internal(Cause::Database(err)) => match &**err {
                sqlx::Error::Database(db) => Some(&**db),
                _ => None,
            },
            _ => None,
        }
    }

    /// Unavailable, in fencegate's words (the pool is closed, a worker is gone, ...).
    pub fn unavailable(why: impl Into<std::borrow::Cow<'static, str>>) -> StoreError {
        StoreError::Unavailable(Cause::Said(why.into()))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if is_transient(&err) {
            return StoreError::Unavailable(Cause::Database(Arc::new(err)));
        }
        match &err {
            sqlx::Error::Database(db) if db.code().is_some_and(|code| code.starts_with("22")) => {
                StoreError::Refused(db.message().to_owned())
            }
            // 42P01: a table fencegate needs does not exist. One of its own: the database is not
            // migrated (a standby of an unmigrated primary, before its promotion). A legacy table
            // of [[resources]]: dropped or renamed under a running server. Not a bug of fencegate's
            // and nothing was written: 503, and PostgreSQL's message names the table.
            sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => StoreError::NotReady(format!(
                "{}: if it is one of fencegate's own tables, the database is not migrated yet (`fencegate migrate`, \
                 or wait for the standby to be promoted); if it is a legacy table of [[resources]], it was dropped or \
                 renamed after fencegate started (restore it, or change the configuration and restart)",
                db.message()
            )),
            _ => StoreError::Internal(Cause::Database(Arc::new(err))),
        }
    }
}

/// Errors after which the same request can succeed later: the connection or server went away,
/// the pool is exhausted, or PostgreSQL asked us to retry.
fn is_transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 40001 serialization failure; 40P01 deadlock;
            // 53: insufficient resources; 57P01-03: admin/crash shutdown, cannot connect now;
            // 3D000: the database does not exist (dropped or not yet created: an outage).
            // 25006: read-only transaction: the server is a standby now (a failover is under
            // way, or the URL routes to a standby); the write was not applied.
            code.starts_with("08") || code.starts_with("53") || code.starts_with("57P")
                || code == "40001" || code == "40P01" || code == "3D000" || code == "25006"
                // 55P03: lock_timeout (database.lock_timeout_ms) passed waiting for a row lock,
                // e.g. a fence held by a SQL writer's open transaction; nothing was written.
                || code == "55P03"
                // SQLite: SQLITE_BUSY, SQLITE_LOCKED and their extended codes.
                || matches!(code.as_ref(), "5" | "6" | "261" | "517" | "262")
        }),
        _ => false,
    }
}
