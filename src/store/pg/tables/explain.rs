//! Why a legacy-table write failed: the client's fault (400/422, naming what to fix) or the
//! store's.

use serde_json::value::RawValue;
use sqlx::postgres::PgDatabaseError;

use super::{sql::Sql, TableError};
use crate::{
    fence::FencingToken,
    store::{pg::PgStore, StoreError},
    tables::{Fence, Resource, RowError, RowWrite},
};

/// Why a statement on a legacy table failed.
pub(super) enum Failure {
    /// PostgreSQL refused a value without saying which column (type errors): find it.
    Data(String),
    Row(RowError),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(err: sqlx::Error) -> Self {
        classify(err)
    }
}

/// Sorts PostgreSQL errors into the client's fault (400/422 naming what to fix) and ours.
pub(super) fn classify(err: sqlx::Error) -> Failure {
    let sqlx::Error::Database(db) = &err else {
        return Failure::Store(err.into());
    };
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    let message = db.message().to_owned();
    let column = db
        .try_downcast_ref::<PgDatabaseError>()
        .and_then(PgDatabaseError::column)
        .map(str::to_owned);
    let constraint = db.constraint().map(str::to_owned);
    match code.as_str() {
        // 22: data exceptions (bad input syntax, out of range, too long, bad enum label...).
        c if c.starts_with("22") => Failure::Data(message),
        // NOT NULL on a column names it; a NOT NULL domain does not.
        "23502" if column.is_none() => Failure::Data(message),
        // Integrity constraints, and exceptions raised by the table's own triggers (class P0).
        "23502" | "23503" | "23505" | "23514" | "23P01" => Failure::Row(RowError::Value {
            column,
            constraint,
            detail: message,
        }),
        c if c.starts_with("P0") => Failure::Row(RowError::Value {
            column,
            constraint,
            detail: message,
        }),
        _ => Failure::Store(err.into()),
    }
}

impl From<Failure> for TableError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Data(detail) => TableError::Row(RowError::Value {
                column: None,
                constraint: None,
                detail,
            }),
            Failure::Row(err) => TableError::Row(err),
            Failure::Store(err) => TableError::Store(err),
        }
    }
}

/// A JSON string holding `text`.
pub(super) fn json_text(text: &str) -> Box<RawValue> {
    RawValue::from_string(serde_json::Value::from(text).to_string()).expect("a JSON string is JSON")
}

impl PgStore {
    /// After a failed row write: names the column whose value PostgreSQL refused, by converting
    /// each value of the body on its own.
    pub(super) async fn explain(
        &self,
        failure: Failure,
        resource: &Resource,
        write: &RowWrite,
    ) -> TableError {
        let Failure::Data(message) = failure else {
            return failure.into();
        };
        if let RowWrite::Put(values) | RowWrite::Patch(values) = write {
            for (index, value) in &values.set {
                match self.refuses(resource, *index, value).await {
                    Ok(Some(detail)) => {
                        let column = &resource.columns[*index];
                        return TableError::Row(RowError::Value {
                            column: Some(column.name.clone()),
                            constraint: None,
                            detail: format!(
                                "column {:?} ({}): {detail}",
                                column.name, column.sql_type
                            ),
                        });
                    }
                    Ok(None) => {}
                    Err(err) => return TableError::Store(err),
                }
            }
        }
        TableError::Row(RowError::Value {
            column: None,
            constraint: None,
            detail: message,
        })
    }

    /// Whether PostgreSQL refuses `value` for column `index` on its own, and why.
    pub(in crate::store) async fn refuses(
        &self,
        resource: &Resource,
        index: usize,
        value: &RawValue,
    ) -> Result<Option<String>, StoreError> {
        let sql = Sql(resource);
        let statement = format!(
            "SELECT r.{c} IS NULL FROM {record}",
            c = sql.col(index),
            record = sql.record("$1", [index])
        );
        let object = format!(
            "{{{}:{}}}",
            serde_json::Value::from(resource.columns[index].name.as_str()),
            value.get()
        );
        let mut conn = self.conns.take().await?;
        let result = sqlx::query(&statement)
            .bind(object)
            .fetch_one(&mut *conn)
            .await;
        if result.is_ok() {
            conn.done();
        }
        match result {
            Ok(_) => Ok(None),
            Err(err) => match classify(err) {
                Failure::Data(detail) | Failure::Row(RowError::Value { detail, .. }) => {
                    Ok(Some(detail))
                }
                Failure::Row(_) => Ok(None),
                Failure::Store(err) => Err(err),
            },
        }
    }
}

/// In column mode an unscoped write stores the token in the fence column: it must fit.
pub(super) fn check_token_fits(
    resource: &Resource,
    token: FencingToken,
    scoped: bool,
) -> Result<(), TableError> {
    if let (Fence::Column { max, .. }, false) = (resource.fence, scoped) {
        if token.get() > max {
            let column = resource
                .fence_column()
                .expect("column mode has a fence column");
            return Err(RowError::Token(format!(
                "token {token} does not fit the fence column {:?} of resource {:?} ({}: at most {max})",
                column.name, resource.name, column.sql_type
            ))
            .into());
        }
    }
    Ok(())
}
