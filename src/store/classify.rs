//! A driver error as a [`StoreError`]: the connection and the pool are sorted here, the
//! database's own answers by the backend that gave them (`pg/errors.rs`, `sqlite/errors.rs`).

use std::sync::Arc;

use super::errors::{Cause, DbKind, StoreError};

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        let kind = match &err {
            // The connection or the pool failed: the same request can succeed later.
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => {
                return StoreError::Unavailable(Cause::Database {
                    err: Arc::new(err),
                    kind: DbKind::Connection,
                })
            }
            sqlx::Error::Database(_) => DbKind::Refused,
            _ => DbKind::Driver,
        };
        let err = match super::pg::errors::classify(err).or_else(super::sqlite::errors::classify) {
            Ok(classified) => return classified,
            Err(err) => err,
        };
        StoreError::Internal(Cause::Database {
            err: Arc::new(err),
            kind,
        })
    }
}
