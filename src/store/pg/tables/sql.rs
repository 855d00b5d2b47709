//! The SQL of legacy-table writes, built only from catalog-validated descriptions of the
//! tables (identifiers quoted here and nowhere else) and the shared spelling of the fence rules.

use crate::{
    fence::Rule,
    store::{
        sql::{fence_admits, sql_jump_check, sql_scope_check},
        Checks,
    },
    tables::{Fence, KeyText, Resource},
};

/// `"name"`, with embedded quotes doubled: the only way an identifier enters SQL here.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// SQL text for one resource, built only from its catalog-validated description.
pub(super) struct Sql<'a>(pub(super) &'a Resource);

impl Sql<'_> {
    pub(in crate::store) fn table(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(&self.0.schema),
            quote_ident(&self.0.table)
        )
    }

    pub(in crate::store) fn col(&self, index: usize) -> String {
        quote_ident(&self.0.columns[index].name)
    }

    /// `jsonb_to_record($n::jsonb) AS r("id" integer, ...)`: PostgreSQL converts each JSON
    /// value to the column's type exactly as `jsonb_populate_record` would (strings through the
    /// type's input function, arrays to arrays, objects to jsonb...). Only the listed columns are
    /// converted, so columns the request leaves out keep their defaults.
    pub(in crate::store) fn record(
        &self,
        param: &str,
        columns: impl IntoIterator<Item = usize>,
    ) -> String {
        let defs: Vec<String> = columns
            .into_iter()
            .map(|i| format!("{} {}", self.col(i), self.0.columns[i].sql_type))
            .collect();
        format!("jsonb_to_record({param}::jsonb) AS r({})", defs.join(", "))
    }

    /// `t."id" = r."id" AND ...`: the key columns of the table row and of the parsed key.
    pub(in crate::store) fn key_match(&self) -> String {
        let parts: Vec<String> = self
            .0
            .key
            .iter()
            .map(|&i| format!("t.{c} = r.{c}", c = self.col(i)))
            .collect();
        parts.join(" AND ")
    }

    /// The canonical text of key column `index` of record `r`.
    pub(in crate::store) fn key_text(&self, index: usize) -> String {
        match self.0.columns[index].key_text {
            KeyText::Output => format!("r.{}::text", self.col(index)),
            KeyText::TrimScale => format!("trim_scale(r.{})::text", self.col(index)),
        }
    }

    pub(in crate::store) fn fence_column(&self) -> Option<String> {
        match self.0.fence {
            Fence::Ledger => None,
            Fence::Column { column, .. } => Some(self.col(column)),
        }
    }
}

/// The row's own fence: raised to the token iff the rule admits it and the row is not bound
/// to a scope (sticky scope); no row back = refused. On conflict the ledger row is locked
/// whether or not the `WHERE` admits the write.
/// The row to insert exists only if the jump cap admits the token against the row's fence.
pub(super) fn ledger_sql(rule: Rule, checks: &Checks) -> String {
    format!(
        "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope)
         SELECT $1::text, $2::text, $3::int8, $3::int8, NULL::text WHERE {jump}
         ON CONFLICT (relation, key) DO UPDATE SET
             fence = EXCLUDED.fence, token = EXCLUDED.token, scope = NULL, updated_at = now()
         WHERE {admits} AND {scope_check} AND {row_jump}
         RETURNING 1",
        admits = fence_admits(rule, "l.fence", "EXCLUDED.fence"),
        // Again on the ledger row as locked: a reset may have lowered it since the snapshot.
        row_jump = sql_jump_check(checks.jump, "l.fence", "EXCLUDED.fence"),
        scope_check = sql_scope_check(checks.scopes, "l.scope", "EXCLUDED.scope"),
        jump = sql_jump_check(
            checks.jump,
            "(SELECT fence FROM fencegate_ledger AS jl WHERE jl.relation = $1::text AND jl.key = $2::text)",
            "$3::int8"
        ),
    )
}

/// A scoped write leaves the row's own fence alone and records who wrote (and locks the row),
/// if the row is not bound to another scope; no row back = refused for its scope.
pub(super) fn ledger_scoped_sql(scopes: crate::fence::ScopeRule) -> String {
    format!(
        "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope) VALUES ($1, $2, 0, $3, $4)
         ON CONFLICT (relation, key) DO UPDATE SET token = EXCLUDED.token, scope = EXCLUDED.scope, updated_at = now()
         WHERE {scope_check}
         RETURNING 1",
        scope_check = sql_scope_check(scopes, "l.scope", "EXCLUDED.scope"),
    )
}
