//! `[[resources]]`: the legacy tables fencegate fronts, as written in the config file.
//!
//! Only what can be checked without a database is checked here (names, shapes, combinations);
//! whether the table, its key and its fence column really exist is checked against the catalog
//! at start-up (`store/pg/catalog.rs`), and either way a bad resource stops start-up with a message
//! that names it.

use anyhow::bail;
use serde::Deserialize;

/// One `[[resources]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSettings {
    /// The URL name: `/v1/tables/{name}/{key}`.
    pub name: String,
    /// `schema.table` or `table` (then `public`). Names are matched exactly as the catalog
    /// spells them: no SQL quoting, no case folding.
    pub table: String,
    /// Columns of the table's primary key or of one of its unique keys, in URL order.
    pub key: Vec<String>,
    /// Where the fence is kept.
    #[serde(default)]
    pub fence: FenceMode,
    /// With `fence = "column"`: an integer column of the table that holds each row's fence.
    #[serde(default)]
    pub fence_column: Option<String>,
    /// `true`: a write needs a token strictly greater than the fence (one write per token).
    #[serde(default)]
    pub strict: bool,
    /// Every write to the table is under this scope (normally a lock's name), with or without
    /// an `X-Fencing-Scope` header; a different header is 409 `scope-mismatch`.
    #[serde(default)]
    pub scope: Option<String>,
    /// Guard the table against writers that bypass fencegate (a trigger; needs `scope`):
    /// `enforce` refuses a write by another role that did not call `fencegate.fence(scope, t)`
    /// in its transaction (SQLSTATE FG428), `audit` lets it through and counts it.
    #[serde(default)]
    pub guard: Option<GuardMode>,
}

/// What a guarded table does with a write that came without `fencegate.fence()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardMode {
    Enforce,
    Audit,
}

impl GuardMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardMode::Enforce => "enforce",
            GuardMode::Audit => "audit",
        }
    }
}

/// Where a resource keeps its fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FenceMode {
    /// In fencegate's own `fencegate_ledger` table; the legacy schema is untouched.
    #[default]
    Ledger,
    /// In an existing integer column of the table (and in the ledger once a row is deleted).
    Column,
}

/// Longest resource name; it is a URL segment and a metric-free log field.
const MAX_NAME: usize = 63;

impl ResourceSettings {
    /// `(schema, table)`; an unqualified table is in `public`.
    pub fn schema_and_table(&self) -> (&str, &str) {
        match self.table.split_once('.') {
            Some((schema, table)) => (schema, table),
            None => ("public", self.table.as_str()),
        }
    }

    /// The scope every write to the table is under (`scope`), if any.
    pub fn bound_scope(&self, max_key_bytes: usize) -> Result<Option<crate::fence::Scope>, String> {
        self.scope
            .as_deref()
            .map(|name| {
                crate::fence::Scope::parse(name, max_key_bytes)
                    .map_err(|e| format!("scope {name:?} {e}"))
            })
            .transpose()
    }

    /// How the resource is named in start-up errors.
    pub fn label(&self, index: usize) -> String {
        format!(
            "resources[{index}] ({:?}, table {:?})",
            self.name, self.table
        )
    }

    fn check(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(format!("name must be 1..={MAX_NAME} characters"));
        }
        // A plain URL segment: no percent-encoding needed, nothing to confuse a log reader.
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err("name may contain only ASCII letters, digits, '_' and '-'".into());
        }
        let (schema, table) = self.schema_and_table();
        if schema.is_empty() || table.is_empty() || table.contains('.') {
            return Err(
                "table must be \"schema.table\" or \"table\" (names as the catalog spells them)"
                    .into(),
            );
        }
        if self.key.is_empty() {
            return Err("key must name at least one column".into());
        }
        for (i, column) in self.key.iter().enumerate() {
            if column.is_empty() {
                return Err("key contains an empty column name".into());
            }
            if self.key[..i].contains(column) {
                return Err(format!("key names column {column:?} twice"));
            }
        }
        if self.guard.is_some() && self.scope.is_none() {
            return Err("guard needs scope = \"<the lock's name>\": SQL writers fence their transaction with fencegate.fence(scope, token)".into());
        }
        match (self.fence, &self.fence_column) {
            (FenceMode::Column, None) => {
                Err("fence = \"column\" needs fence_column = \"<an integer column of the table>\"".into())
            }
            (FenceMode::Ledger, Some(_)) => Err(
                "fence_column is only used with fence = \"column\"; remove it or set fence = \"column\"".into(),
            ),
            (FenceMode::Column, Some(column)) if self.key.contains(column) => {
                Err(format!("fence_column {column:?} is a key column; the fence needs a column of its own"))
            }
            _ => Ok(()),
        }
    }
}

/// Checks every resource on its own and against the others. `postgres` is false when the
/// store is not PostgreSQL: legacy tables are PostgreSQL tables.
pub fn validate(
    resources: &[ResourceSettings],
    postgres: bool,
    max_key_bytes: usize,
) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for (i, resource) in resources.iter().enumerate() {
        if let Err(problem) = resource.check() {
            problems.push(format!("{}: {problem}", resource.label(i)));
        }
        if let Err(problem) = resource.bound_scope(max_key_bytes) {
            problems.push(format!("{}: {problem}", resource.label(i)));
        }
        if let Some(j) = resources[..i].iter().position(|r| r.name == resource.name) {
            problems.push(format!(
                "{}: the name is already used by resources[{j}]",
                resource.label(i)
            ));
        }
        // Fences are kept per table: two resources on one table would be two fences for one row.
        if let Some(j) = resources[..i]
            .iter()
            .position(|r| r.schema_and_table() == resource.schema_and_table())
        {
            problems.push(format!(
                "{}: the table is already configured as resources[{j}] ({:?}); configure each table once",
                resource.label(i),
                resources[j].name
            ));
        }
    }
    if !postgres {
        if let Some(first) = resources.first() {
            problems.push(format!(
                "{}: legacy tables need PostgreSQL, but the store is the embedded SQLite database; \
                 set DATABASE_URL / --database-url / database.url to the PostgreSQL database that holds the table",
                first.label(0)
            ));
        }
    }
    match problems.len() {
        0 => Ok(()),
        1 => bail!("invalid resource: {}", problems[0]),
        n => bail!("{n} invalid resources:\n  {}", problems.join("\n  ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(toml: &str) -> ResourceSettings {
        toml::from_str(toml).unwrap()
    }

    fn err(resources: &[ResourceSettings], postgres: bool) -> String {
        format!("{:#}", validate(resources, postgres, 512).unwrap_err())
    }

    #[test]
    fn a_plain_ledger_resource_is_valid() {
        let r = resource("name = \"orders\"\ntable = \"public.orders\"\nkey = [\"id\"]\n");
        assert_eq!(r.fence, FenceMode::Ledger);
        assert_eq!(r.schema_and_table(), ("public", "orders"));
        validate(&[r], true, 512).unwrap();
        let r = resource("name = \"o\"\ntable = \"orders\"\nkey = [\"id\"]\n");
        assert_eq!(r.schema_and_table(), ("public", "orders"));
    }

    #[test]
    fn mistakes_name_the_resource() {
        let col =
            resource("name = \"orders\"\ntable = \"orders\"\nkey = [\"id\"]\nfence = \"column\"\n");
        assert!(err(&[col], true).contains("\"orders\""));
        let bad = resource("name = \"or ders\"\ntable = \"orders\"\nkey = [\"id\"]\n");
        assert!(err(&[bad], true).contains("name may contain only"));
        let twice = resource("name = \"a\"\ntable = \"t\"\nkey = [\"id\", \"id\"]\n");
        assert!(err(&[twice], true).contains("twice"));
        let a = resource("name = \"a\"\ntable = \"t\"\nkey = [\"id\"]\n");
        let b = resource("name = \"b\"\ntable = \"public.t\"\nkey = [\"id\"]\n");
        let e = err(&[a.clone(), b], true);
        assert!(e.contains("already configured as resources[0]"), "{e}");
        let e = err(&[a], false);
        assert!(e.contains("need PostgreSQL") && e.contains("\"a\""), "{e}");
        assert!(toml::from_str::<ResourceSettings>(
            "name = \"a\"\ntable = \"t\"\nkey = [\"id\"]\nfence = \"row\"\n"
        )
        .is_err());
    }
}
