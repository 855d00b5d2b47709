//! What can go wrong in the store, in fencegate's words, sorted by what the client may do about
//! it: retry later (unavailable, raced, not ready), fix the request (refused), or nothing
//! (internal, corrupt, task: logged, never sent).
//!
//! This module names no database: each backend sorts its own driver's errors into these kinds
//! (`pg/errors.rs`, `sqlite/errors.rs`; `classify.rs` picks the backend). A client is told the
//! kind, in fencegate's words; the database's own text stays in the [`Cause`], which only the
//! log line of the request (with its request id) shows.

use std::{borrow::Cow, sync::Arc};

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached, is overloaded, or cannot take this write right now; the
    /// client may retry. What the client is told depends on the cause's [`DbKind`].
    #[error("database unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// Anything else: a bug or a broken database. Logged, never sent to clients.
    #[error("database error: {0}")]
    Internal(#[source] Cause),
    #[error("the database holds an invalid value: {0}")]
    Corrupt(String),
    /// The database refused a value the request sent (a data exception: e.g. a JSON number
    /// beyond PostgreSQL's numeric range). The client's to fix: 400, told `what`.
    #[error("the database cannot store this value ({what}): {cause}")]
    Refused { what: Unstorable, cause: Cause },
    /// A keyed write whose answer is larger than an Idempotency-Key keeps: refused before
    /// commit, in fencegate's words (400; nothing was written).
    #[error("{0}")]
    Unkeepable(String),
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
    /// A write would create a key with a token above the jump cap: the database refused the
    /// statement (nothing of it was committed), naming the write when it could
    /// (`jumper`). Answered as a jump by whoever ran the statement; never sent as it is.
    #[error("a write would create a key above kv.max_token_jump: {cause}")]
    KeyJump {
        jumper: Option<Jumper>,
        cause: Cause,
    },
}

/// The write a key-jump refusal names: its token and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jumper {
    pub token: i64,
    pub key: String,
}

/// What lies under an unavailable or internal [`StoreError`]: the database driver's error and
/// what it means (shared: a coalesced statement's failure is the failure of every write that
/// waited on it, so each gets the whole error, not a copy of its text), or fencegate's own
/// account of it.
#[derive(Debug, Clone)]
pub enum Cause {
    Database { err: Arc<sqlx::Error>, kind: DbKind },
    Said(Cow<'static, str>),
}

/// What a database error means to fencegate, as the backend that raised it classified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// The connection, the pool or the server went away or could not be reached.
    Connection,
    /// Contention that a retry resolves: a serialization failure, a deadlock, a busy database.
    Contention,
    /// A row lock was not granted in time (`database.lock_timeout_ms`, or `NOWAIT`).
    LockTimeout,
    /// The statement ran past the database's statement timeout, or was cancelled.
    StatementTimeout,
    /// The server takes no writes: a standby, or a read-only database.
    ReadOnly,
    /// The server is shutting down, or the database does not exist (an outage).
    Shutdown,
    /// The server lacks a resource.
    Lacks(Lack),
    /// A table or column the statement names does not exist (not migrated, or dropped under us).
    MissingTable,
    /// The database refused the statement for a reason not listed here.
    Refused,
    /// Not the database's answer: the driver failed (decoding, a protocol error).
    Driver,
}

/// The resource a database ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lack {
    Disk,
    Memory,
    Connections,
    Other,
}

impl Lack {
    pub fn words(self) -> &'static str {
        match self {
            Lack::Disk => "out of disk space",
            Lack::Memory => "out of memory",
            Lack::Connections => "out of connections",
            Lack::Other => "out of a configured resource",
        }
    }
}

/// Why the database cannot store a value the request sent, in fencegate's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstorable {
    /// A number or a date beyond what the type holds.
    OutOfRange,
    /// A text longer than its type allows.
    TooLong,
    /// Text that does not read as the type (a bad number, date, enum label, array...).
    Malformed,
    /// A character the database cannot store (`\u0000` in a JSON string, say).
    Character,
    /// A null where the type allows none.
    Null,
    /// Any other data exception.
    Other,
}

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unstorable::OutOfRange => "a number or date beyond the range its type holds",
            Unstorable::TooLong => "a text longer than its type allows",
            Unstorable::Malformed => "a value that does not read as its type",
            Unstorable::Character => "a character the database cannot store (such as \\u0000)",
            Unstorable::Null => "a null where none is allowed",
            Unstorable::Other => "a value the database cannot store",
        })
    }
}

impl Cause {
    /// Whether the database itself answered with an error (rather than the connection or the
    /// pool failing): the statement was refused, so nothing of it was committed.
    pub fn is_database_refusal(&self) -> bool {
        matches!(self, Cause::Database { err, .. } if matches!(**err, sqlx::Error::Database(_)))
    }

    /// The database error's kind, if this is one.
    pub fn kind(&self) -> Option<DbKind> {
        match self {
            Cause::Database { kind, .. } => Some(*kind),
            Cause::Said(_) => None,
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Database { err, .. } => err.fmt(f),
            Cause::Said(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Cause::Database { err, .. } => Some(&**err),
            Cause::Said(_) => None,
        }
    }
}

impl StoreError {
    /// Whether the database refused a key that a write would create with a token above the
    /// jump cap: the statement was aborted, nothing of it was committed, and the write is
    /// refused as a jump.
    pub fn is_key_jump(&self) -> bool {
        matches!(self, StoreError::KeyJump { .. })
    }

    /// The token and key a key-jump refusal names, if it named one.
    pub fn key_jump_detail(&self) -> Option<(i64, String)> {
        match self {
            StoreError::KeyJump {
                jumper: Some(jumper),
                ..
            } => Some((jumper.token, jumper.key.clone())),
            _ => None,
        }
    }

    /// Whether the database gave up waiting for a row lock (`lock_timeout` passed, or
    /// `NOWAIT`): the statement was aborted and nothing of it was written.
    pub fn is_lock_timeout(&self) -> bool {
        self.db_kind() == Some(DbKind::LockTimeout)
    }

    /// The kind of the database error under an unavailable or internal one.
    pub fn db_kind(&self) -> Option<DbKind> {
        match self {
            StoreError::Unavailable(cause) | StoreError::Internal(cause) => cause.kind(),
            _ => None,
        }
    }

    /// Unavailable, in fencegate's words (the pool is closed, a worker is gone, ...).
    pub fn unavailable(why: impl Into<Cow<'static, str>>) -> StoreError {
        StoreError::Unavailable(Cause::Said(why.into()))
    }

    /// What a client is told about an unavailable database: fencegate's words for the kind.
    pub fn unavailable_words(&self) -> &'static str {
        match self.db_kind() {
            Some(DbKind::LockTimeout) => {
                "a row this request needs is locked by another transaction (database.lock_timeout_ms passed); \
                 nothing was written; retry with the same token (a retry is safe)"
            }
            Some(DbKind::StatementTimeout) => {
                "the database did not finish the statement in time and cancelled it; nothing was written; \
                 retry with the same token (a retry is safe)"
            }
            Some(DbKind::ReadOnly) => {
                "the database takes no writes now (a standby, or read-only: a failover may be under way); \
                 nothing was written; retry with the same token (a retry is safe)"
            }
            Some(DbKind::Lacks(Lack::Disk)) => {
                "the database is out of disk space; nothing was written; retry once space is freed"
            }
            Some(DbKind::Lacks(Lack::Memory)) => {
                "the database is out of memory; nothing was written; retry shortly"
            }
            Some(DbKind::MissingTable) => {
                "a table or column this request needs does not exist: the database is not migrated yet (`fencegate migrate`, \
                 or wait for the standby to be promoted), or a legacy table of [[resources]] was dropped or renamed \
                 (the server log names it); retry later"
            }
            _ => "the database is unreachable or overloaded; retry with the same token (a retry is safe)",
        }
    }
}
