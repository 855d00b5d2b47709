//! Why a legacy-table write failed: the client's fault (400/422, naming what to fix) or the
//! store's.

use serde_json::value::RawValue;

use super::{sql::Sql, TableError};
use crate::{
    fence::FencingToken,
    store::{
        pg::{
            errors::{row_refusal, Refused, RowRefusal},
            PgStore,
        },
        StoreError, Unstorable,
    },
    tables::{Fence, Resource, RowError, RowWrite},
};

/// Why a statement on a legacy table failed.
pub(super) enum Failure {
    /// PostgreSQL refused a value without saying which column (type errors): find it. The
    /// database's message is kept for the log line.
    Data(Unstorable, String),
    Row(RowError),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(err: sqlx::Error) -> Self {
        classify(err)
    }
}

/// Sorts PostgreSQL's errors into the client's fault (400/422 naming what to fix, in
/// fencegate's words: `errors::row_refusal`) and ours.
pub(super) fn classify(err: sqlx::Error) -> Failure {
    let Some(refused) = row_refusal(&err) else {
        return Failure::Store(err.into());
    };
    let Refused {
        kind,
        column,
        constraint,
        message,
    } = refused;
    let named = |what: &str| match &constraint {
        Some(name) => format!("{what} {name:?}"),
        None => what.to_owned(),
    };
    let detail = match (&kind, &column) {
        (RowRefusal::Data(what), _) => return Failure::Data(*what, message),
        // NOT NULL on a column names it; a NOT NULL domain does not: find the value.
        (RowRefusal::NotNull, None) => return Failure::Data(Unstorable::Null, message),
        (RowRefusal::NotNull, Some(column)) => {
            format!("{column:?} needs a value: the table allows no null there")
        }
        (RowRefusal::ForeignKey, _) => format!(
            "the row refers to a row that does not exist, or rows refer to it ({})",
            named("foreign key")
        ),
        (RowRefusal::Unique, _) => format!(
            "another row already has this value ({})",
            named("unique key")
        ),
        (RowRefusal::Check, _) => format!("the row fails the table's {}", named("check")),
        (RowRefusal::Exclusion, _) => format!(
            "the row conflicts with another row ({})",
            named("exclusion constraint")
        ),
        (RowRefusal::Trigger, _) => {
            "a trigger of the table refused the row (the server log has its message)".to_owned()
        }
    };
    Failure::Row(RowError::Value {
        column,
        constraint,
        detail,
        said: Some(message),
    })
}

impl From<Failure> for TableError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Data(what, said) => TableError::Row(RowError::Value {
                column: None,
                constraint: None,
                detail: format!("the row holds {what}"),
                said: Some(said),
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
        let Failure::Data(_, said) = &failure else {
            return failure.into();
        };
        if let RowWrite::Put(values) | RowWrite::Patch(values) = write {
            for (index, value) in &values.set {
                match self.refuses(resource, *index, value).await {
                    Ok(Some(what)) => {
                        let column = &resource.columns[*index];
                        return TableError::Row(RowError::Value {
                            column: Some(column.name.clone()),
                            constraint: None,
                            detail: format!("{:?} ({}): {what}", column.name, column.sql_type),
                            said: Some(said.clone()),
                        });
                    }
                    Ok(None) => {}
                    Err(err) => return TableError::Store(err),
                }
            }
        }
        failure.into()
    }

    /// Whether PostgreSQL refuses `value` for column `index` on its own, and why (in
    /// fencegate's words).
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
                Failure::Data(what, _) => Ok(Some(what.to_string())),
                Failure::Row(RowError::Value { detail, .. }) => Ok(Some(detail)),
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
