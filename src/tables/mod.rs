//! Legacy tables: existing PostgreSQL tables fenced in place, without changing their schema.
//!
//! This module holds what a resource *is* (its validated description, its URL key form, what a
//! request body may contain) and knows no SQL and no HTTP. The catalog checks and the fenced
//! statements are in `store/pg/catalog.rs` and `store/pg/tables/`; the routes in `http::tables`.
//! See docs/tables.md for the contract.

mod key;
mod resource;
mod row;
mod settings;

pub use key::{canonical_key, RowKey};
pub use resource::{Column, Fence, KeyText, Resource, Resources};
pub use row::{RowBody, RowValues, RowWrite, TableOp};
pub use settings::{validate, FenceMode, GuardMode, ResourceSettings};

/// A table request fencegate refuses (or PostgreSQL refused) because of what the client sent.
/// Messages are shown to clients as-is and name the column when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// The key in the URL (or in a batch op) does not parse as the key columns' types.
    #[error("{detail}")]
    Key {
        column: Option<String>,
        detail: String,
    },
    /// The body is not a row of this table: unknown or unwritable column, key mismatch.
    #[error("{detail}")]
    Row {
        column: Option<String>,
        detail: String,
    },
    /// PostgreSQL refused a value: a type error, NOT NULL, CHECK, foreign or unique key.
    /// `detail` is fencegate's words; `said` is the database's own message, for the request's
    /// log line only (never sent).
    #[error("{detail}")]
    Value {
        column: Option<String>,
        constraint: Option<String>,
        detail: String,
        said: Option<String>,
    },
    /// PATCH of a row that does not exist.
    #[error("{0}")]
    NoRow(String),
    /// The token does not fit the resource's fence column.
    #[error("{0}")]
    Token(String),
}

impl RowError {
    pub fn row(column: &str, detail: impl Into<String>) -> Self {
        RowError::Row {
            column: Some(column.to_owned()),
            detail: detail.into(),
        }
    }

    /// The column the error is about, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            RowError::Key { column, .. }
            | RowError::Row { column, .. }
            | RowError::Value { column, .. } => column.as_deref(),
            RowError::NoRow(_) | RowError::Token(_) => None,
        }
    }

    /// The same error, located at `ops[index]` of a batch.
    pub fn in_op(self, index: usize) -> Self {
        let at = |detail: String| format!("ops[{index}]: {detail}");
        match self {
            RowError::Key { column, detail } => RowError::Key {
                column,
                detail: at(detail),
            },
            RowError::Row { column, detail } => RowError::Row {
                column,
                detail: at(detail),
            },
            RowError::Value {
                column,
                constraint,
                detail,
                said,
            } => RowError::Value {
                column,
                constraint,
                detail: at(detail),
                said,
            },
            RowError::NoRow(detail) => RowError::NoRow(at(detail)),
            RowError::Token(detail) => RowError::Token(at(detail)),
        }
    }
}
