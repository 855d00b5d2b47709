//! SQLite's errors in fencegate's kinds: the one place the store reads SQLite's result codes.
//! What a client is told comes from the kind; SQLite's message stays in the error, for the
//! request's log line only.

use std::sync::Arc;

use sqlx::{error::DatabaseError as _, sqlite::SqliteError};

use crate::store::errors::{Cause, DbKind, Lack, StoreError};

/// SQLite's answer as a [`StoreError`]; `Err` gives back an error that is not SQLite's.
pub(in crate::store) fn classify(err: sqlx::Error) -> Result<StoreError, sqlx::Error> {
    let code = match &err {
        sqlx::Error::Database(db) => match db.try_downcast_ref::<SqliteError>() {
            Some(sqlite) => sqlite.code().map(|c| c.into_owned()).unwrap_or_default(),
            None => return Err(err),
        },
        _ => return Err(err),
    };
    let kind = match code.as_str() {
        // SQLITE_BUSY, SQLITE_LOCKED and their extended codes: another connection holds the
        // database; nothing was written and a retry can succeed.
        "5" | "6" | "261" | "517" | "262" => Some(DbKind::Contention),
        // SQLITE_FULL: the disk (or the file's size limit) is full.
        "13" => Some(DbKind::Lacks(Lack::Disk)),
        // SQLITE_READONLY and its extended codes: the file cannot be written now.
        "8" | "264" | "520" | "776" | "1032" => Some(DbKind::ReadOnly),
        _ => None,
    };
    let (kind, transient) = match kind {
        Some(kind) => (kind, true),
        None => (DbKind::Refused, false),
    };
    let cause = Cause::Database {
        err: Arc::new(err),
        kind,
    };
    Ok(if transient {
        StoreError::Unavailable(cause)
    } else {
        StoreError::Internal(cause)
    })
}
