//! PostgreSQL's errors in fencegate's kinds: the one place the store reads a SQLSTATE of a
//! statement's failure. What a client is told comes from the kind; PostgreSQL's message stays
//! in the error, for the request's log line only.

use std::sync::Arc;

use sqlx::postgres::PgDatabaseError;

use crate::store::errors::{Cause, DbKind, Jumper, Lack, StoreError, Unstorable};

/// The SQLSTATE of the trigger's refusal: a write would create a key with a token above the
/// jump cap. Nothing of the statement is committed; the write is refused as a jump.
pub(crate) const KEY_JUMP_SQLSTATE: &str = "FGJMP";

/// PostgreSQL's answer as a [`StoreError`]; `Err` gives back an error that is not PostgreSQL's.
pub(in crate::store) fn classify(err: sqlx::Error) -> Result<StoreError, sqlx::Error> {
    let Some(pg) = postgres_error(&err) else {
        return Err(err);
    };
    let code = pg.code().to_owned();
    if code == KEY_JUMP_SQLSTATE {
        let jumper = key_jumper(pg);
        return Ok(StoreError::KeyJump {
            jumper,
            cause: cause(err, DbKind::Refused),
        });
    }
    if let Some(what) = unstorable(&code) {
        return Ok(StoreError::Refused {
            what,
            cause: cause(err, DbKind::Refused),
        });
    }
    Ok(match transient(&code) {
        Some(kind) => StoreError::Unavailable(cause(err, kind)),
        None => StoreError::Internal(cause(err, DbKind::Refused)),
    })
}

fn cause(err: sqlx::Error, kind: DbKind) -> Cause {
    Cause::Database {
        err: Arc::new(err),
        kind,
    }
}

fn postgres_error(err: &sqlx::Error) -> Option<&PgDatabaseError> {
    match err {
        sqlx::Error::Database(db) => db.try_downcast_ref::<PgDatabaseError>(),
        _ => None,
    }
}

/// The write the jump trigger names (migration `kv_jump_typed`): the key in the error's
/// `CONSTRAINT` field and the token in its `COLUMN` field, each as it is, so nothing parses
/// a sentence.
fn key_jumper(pg: &PgDatabaseError) -> Option<Jumper> {
    Some(Jumper {
        token: pg.column()?.parse().ok()?,
        key: pg.constraint()?.to_owned(),
    })
}

/// Class 22, a data exception: a value the request sent that PostgreSQL cannot store.
fn unstorable(code: &str) -> Option<Unstorable> {
    if !code.starts_with("22") {
        return None;
    }
    Some(match code {
        // numeric_value_out_of_range, datetime_field_overflow, interval_field_overflow.
        "22003" | "22008" | "22015" => Unstorable::OutOfRange,
        // string_data_right_truncation.
        "22001" => Unstorable::TooLong,
        // untranslatable_character, character_not_in_repertoire.
        "22P05" | "22021" => Unstorable::Character,
        // null_value_not_allowed.
        "22004" => Unstorable::Null,
        // invalid_text_representation, invalid_datetime_format, invalid_binary_representation,
        // invalid_json_text, array subscript and the like.
        "22P02" | "22007" | "22P03" | "22P06" | "22032" | "2202E" | "22P04" => {
            Unstorable::Malformed
        }
        _ => Unstorable::Other,
    })
}

/// The SQLSTATEs after which the same request can succeed later, as the kind the client is told.
fn transient(code: &str) -> Option<DbKind> {
    Some(match code {
        // 55P03: lock_timeout (database.lock_timeout_ms) passed waiting for a row lock, e.g. a
        // fence held by a SQL writer's open transaction, or NOWAIT; nothing was written.
        "55P03" => DbKind::LockTimeout,
        // 57014: statement_timeout, or the statement was cancelled.
        "57014" => DbKind::StatementTimeout,
        // 25006: read-only transaction: the server is a standby now (a failover is under way,
        // or the URL routes to a standby), or the database is read-only; nothing was applied.
        "25006" => DbKind::ReadOnly,
        // 40001 serialization failure; 40P01 deadlock.
        "40001" | "40P01" => DbKind::Contention,
        // 3D000: the database does not exist (dropped or not yet created: an outage).
        "3D000" => DbKind::Shutdown,
        // 42P01: a table does not exist: one of fencegate's own (the database is not migrated:
        // a standby of an unmigrated primary, before its promotion) or a legacy table of
        // [[resources]] dropped or renamed under a running server. Nothing was written.
        "42P01" => DbKind::MissingTable,
        // 42703: a column does not exist: the same cases, half-way (a migration running on
        // the primary while this process already serves, or a legacy table's column dropped).
        // Answered 503 like a missing table, never 500 (seen in the Patroni run).
        "42703" => DbKind::MissingTable,
        "53100" => DbKind::Lacks(Lack::Disk),
        "53200" => DbKind::Lacks(Lack::Memory),
        "53300" => DbKind::Lacks(Lack::Connections),
        c if c.starts_with("53") => DbKind::Lacks(Lack::Other),
        // 08: connection exception; 57P01-03: admin or crash shutdown, cannot connect now.
        c if c.starts_with("08") => DbKind::Connection,
        c if c.starts_with("57P") => DbKind::Shutdown,
        _ => return None,
    })
}

/// Why PostgreSQL refused a row of a legacy table, in fencegate's kinds.
pub(in crate::store::pg) enum RowRefusal {
    /// A value of the row (class 22): which one is found by trying each on its own.
    Data(Unstorable),
    NotNull,
    ForeignKey,
    Unique,
    Check,
    Exclusion,
    /// The table's own trigger raised an exception (class P0).
    Trigger,
}

/// A refusal of a row by PostgreSQL: its kind, the column and constraint it names (names from
/// the table's own catalog), and PostgreSQL's message (for the log line only).
pub(in crate::store::pg) struct Refused {
    pub kind: RowRefusal,
    pub column: Option<String>,
    pub constraint: Option<String>,
    pub message: String,
}

/// A legacy table's refusal of a row, if `err` is one.
pub(in crate::store::pg) fn row_refusal(err: &sqlx::Error) -> Option<Refused> {
    let pg = postgres_error(err)?;
    let code = pg.code();
    let kind = match code {
        "23502" => RowRefusal::NotNull,
        "23503" => RowRefusal::ForeignKey,
        "23505" => RowRefusal::Unique,
        "23514" => RowRefusal::Check,
        "23P01" => RowRefusal::Exclusion,
        c if c.starts_with("P0") => RowRefusal::Trigger,
        c => RowRefusal::Data(unstorable(c)?),
    };
    Some(Refused {
        kind,
        column: pg.column().map(str::to_owned),
        constraint: pg.constraint().map(str::to_owned),
        message: pg.message().to_owned(),
    })
}
