//! What a request may write into a row: the body's columns checked against the catalog.
//!
//! Values stay raw JSON text (`RawValue`) all the way to PostgreSQL, which converts them to the
//! column types: parsing them here into `serde_json::Value` would round numbers through `f64`
//! and corrupt a `numeric(20,2)`.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::value::RawValue;

use super::{Fence, Resource, RowError, RowKey};

/// A request body for PUT or PATCH: a JSON object of column name -> value.
pub type RowBody = BTreeMap<String, Box<RawValue>>;

/// A body checked against the resource.
#[derive(Debug, Clone)]
pub struct RowValues {
    /// Non-key columns to write (indexes into `Resource::columns`) and their JSON values.
    pub set: Vec<(usize, Box<RawValue>)>,
    /// Key columns the body repeats, with the text PostgreSQL will parse: they must name the
    /// same row as the URL key (checked once PostgreSQL has parsed both).
    pub key_echo: Vec<(usize, String)>,
}

/// One write to a row.
#[derive(Debug, Clone)]
pub enum RowWrite {
    /// Replace the whole row (create it if absent): columns not in the body get their default.
    Put(RowValues),
    /// Update the named columns of an existing row.
    Patch(RowValues),
    /// Delete the row; its fence stays in the ledger.
    Delete,
}

impl RowWrite {
    pub fn op(&self) -> &'static str {
        match self {
            RowWrite::Put(_) => "put",
            RowWrite::Patch(_) => "patch",
            RowWrite::Delete => "delete",
        }
    }
}

/// A write to one row of one resource, as a single request or one op of a batch.
#[derive(Debug, Clone)]
pub struct TableOp {
    pub resource: Arc<Resource>,
    pub key: RowKey,
    pub write: RowWrite,
}

impl Resource {
    /// Checks a body: every name must be a writable column; the fence column is fencegate's
    /// to write; key columns may be repeated only with the URL's values. A PATCH must name at
    /// least one column to change.
    pub fn check_row(&self, body: RowBody, patch: bool) -> Result<RowValues, RowError> {
        let mut set = Vec::with_capacity(body.len());
        let mut key_echo = Vec::new();
        for (name, value) in body {
            let Some(index) = self.column(&name) else {
                return Err(RowError::row(
                    &name,
                    format!("table {} has no column {name:?}", self.relation),
                ));
            };
            let column = &self.columns[index];
            if let Some(why) = column.read_only {
                return Err(RowError::row(
                    &name,
                    format!("column {name:?} is {why} and cannot be written"),
                ));
            }
            if matches!(self.fence, Fence::Column { column, .. } if column == index) {
                return Err(RowError::row(
                    &name,
                    format!("column {name:?} is the fence column: fencegate sets it from X-Fencing-Token; leave it out"),
                ));
            }
            if self.key.contains(&index) {
                key_echo.push((index, key_text(&name, &value)?));
            } else {
                set.push((index, value));
            }
        }
        if patch && set.is_empty() {
            return Err(RowError::Row {
                column: None,
                detail: "a PATCH must name at least one non-key column to change".into(),
            });
        }
        Ok(RowValues { set, key_echo })
    }
}

/// The text a key column's JSON value stands for (what PostgreSQL parses), to compare with the
/// URL key. Only scalars can be key values.
fn key_text(column: &str, value: &RawValue) -> Result<String, RowError> {
    let mismatch = || {
        RowError::row(column, format!("key column {column:?} must be a string, number or boolean equal to the key in the URL"))
    };
    match serde_json::from_str::<serde_json::Value>(value.get()).map_err(|_| mismatch())? {
        serde_json::Value::String(text) => Ok(text),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        // The raw text, not the f64: "12345678901234567890" must stay as written.
        serde_json::Value::Number(_) => Ok(value.get().trim().to_owned()),
        _ => Err(mismatch()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        fence::Rule,
        tables::{Column, KeyText},
    };

    fn column(name: &str) -> Column {
        Column {
            name: name.into(),
            sql_type: "text".into(),
            read_only: None,
            identity: false,
            key_text: KeyText::Output,
        }
    }

    fn resource() -> Resource {
        let mut generated = column("total");
        generated.read_only = Some("a generated column");
        Resource {
            name: "orders".into(),
            relation: "public.orders".into(),
            schema: "public".into(),
            table: "orders".into(),
            columns: vec![column("id"), column("note"), generated, column("fence")],
            key: vec![0],
            fence: Fence::Column {
                column: 3,
                max: i64::MAX,
            },
            rule: Rule::Inclusive,
            scope: None,
            guard: None,
        }
    }

    fn body(json: &str) -> RowBody {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn splits_key_echo_from_values() {
        let v = resource()
            .check_row(body(r#"{"id": 42, "note": {"a": 1.10}}"#), false)
            .unwrap();
        assert_eq!(v.key_echo, vec![(0, "42".to_string())]);
        assert_eq!(v.set.len(), 1);
        assert_eq!(v.set[0].1.get(), r#"{"a": 1.10}"#);
    }

    #[test]
    fn names_the_offending_column() {
        let r = resource();
        for (json, column) in [
            (r#"{"id\"; DROP TABLE x; --": 1}"#, "id\"; DROP TABLE x; --"),
            (r#"{"total": 1}"#, "total"),
            (r#"{"fence": 1}"#, "fence"),
            (r#"{"id": [1]}"#, "id"),
        ] {
            let err = r.check_row(body(json), false).unwrap_err();
            assert_eq!(err.column(), Some(column), "{json}: {err}");
        }
        assert!(
            r.check_row(body(r#"{"id": "1"}"#), true).is_err(),
            "a PATCH with nothing to change"
        );
        assert!(
            r.check_row(body(r#"{}"#), false).is_ok(),
            "a PUT of defaults only"
        );
    }
}
