//! A resource as validated against the catalog at start-up: the only source of the identifiers
//! fencegate ever puts into SQL for it.

use std::{collections::HashMap, sync::Arc};

use crate::fence::Rule;

/// A legacy table behind `/v1/tables/{name}/{key}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    /// The table as PostgreSQL prints a qualified name (`public.orders`, `"Sales"."Order"`):
    /// how the ledger refers to it, and how messages name it.
    pub relation: String,
    /// Schema and table names exactly as in the catalog.
    pub schema: String,
    pub table: String,
    /// Every column of the table, in catalog order.
    pub columns: Vec<Column>,
    /// The key columns (indexes into `columns`), in URL order.
    pub key: Vec<usize>,
    pub fence: Fence,
    pub rule: Rule,
    /// `scope = "..."`: the scope every write to the table is under (a binding).
    pub scope: Option<crate::fence::Scope>,
    /// `guard`: a trigger on the table checks writers that bypass fencegate.
    pub guard: Option<super::settings::GuardMode>,
}

/// A column of a legacy table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The name exactly as in the catalog.
    pub name: String,
    /// The type as the catalog prints it (`numeric(10,2)`, `shop.order_status`, `text[]`),
    /// schema-qualified unless built in: the type a JSON value is converted to.
    pub sql_type: String,
    /// Why the column cannot be written (generated, or `GENERATED ALWAYS AS IDENTITY`).
    pub read_only: Option<&'static str>,
    /// An identity column: never reset to its default by a PUT (that would draw a new number).
    pub identity: bool,
    /// How a key value of this column is printed canonically.
    pub key_text: KeyText,
}

/// How the canonical text of a key value is obtained. Two spellings of one value ("042" and
/// "42", "1.50" and "1.5") must be one key, or they would be two fences for one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyText {
    /// The type's output function is canonical (integers, text, uuid, dates, enums...).
    Output,
    /// numeric: equal values may differ in trailing zeros; they are trimmed.
    TrimScale,
}

/// Where a resource keeps its fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// In `fencegate_ledger` only.
    Ledger,
    /// In the table's column `columns[column]` (whose type holds at most `max`), and in the
    /// ledger, which also keeps the fence of deleted rows.
    Column { column: usize, max: i64 },
}

impl Resource {
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    pub fn key_columns(&self) -> impl Iterator<Item = &Column> {
        self.key.iter().map(|&i| &self.columns[i])
    }

    pub fn fence_column(&self) -> Option<&Column> {
        match self.fence {
            Fence::Ledger => None,
            Fence::Column { column, .. } => Some(&self.columns[column]),
        }
    }

    /// "id, region" — for messages.
    pub fn key_names(&self) -> String {
        self.key_columns()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The configured resources by name. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Resources(Arc<HashMap<String, Arc<Resource>>>);

impl Resources {
    pub fn new(resources: impl IntoIterator<Item = Resource>) -> Self {
        Resources(Arc::new(
            resources
                .into_iter()
                .map(|r| (r.name.clone(), Arc::new(r)))
                .collect(),
        ))
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Resource>> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.0.values()
    }
}
