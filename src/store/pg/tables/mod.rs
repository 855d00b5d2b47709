//! Fenced writes to legacy PostgreSQL tables (`/v1/tables`), without touching their schema
//! (what a request gets back, and the facade's methods: `store::tables`).
//!
//! One transaction per request (or per batch), in this order:
//! 1. the key is parsed and printed canonically by PostgreSQL (before anything is locked);
//! 2. with a scope, the scope's fence is raised (`fencegate_fences`, as for kv);
//! 3. the row's fence: an upsert of its `fencegate_ledger` row whose `WHERE` is the accept rule
//!    (unscoped), or that records the scoped write; either way also the sticky-scope rule (the
//!    ledger remembers the scope of the row's last accepted write). Its row lock serializes
//!    fencegate's writers of one row, also while the row does not exist; in column mode the
//!    table row is then locked and its fence column checked with the same rule;
//! 4. the row write itself: `INSERT .. ON CONFLICT`, `UPDATE` or `DELETE` on the legacy table.
//!
//! A refusal or an error rolls everything back. JSON values are converted to the column types by
//! PostgreSQL (`jsonb_to_record`, with the catalog's type names); identifiers come only from the
//! catalog-validated [`Resource`] and are quoted; every value is a bound parameter.

mod batch;
mod explain;
mod keys;
mod rows;
pub(super) mod sql;

use serde_json::value::RawValue;
use sqlx::{Connection, Row};

use self::{
    explain::check_token_fits,
    rows::{fence_row, write_row},
    sql::Sql,
};
use super::{catalog, idempotency::keep_in, sql_fence, PgStore};
use crate::{
    fence::{FencingToken, Guard, Outcome, RowRef},
    store::{
        backend::TableStore, token_from_db, BatchOp, BatchWritten, Done, Keep, RowEntry,
        RowWritten, SqlSeen, StoreError, TableError,
    },
    tables::{Resource, ResourceSettings, Resources, RowKey, RowWrite, TableOp},
};

/// A canonical key longer than this is refused: it is a btree index key in the ledger.
pub(super) const MAX_CANONICAL_KEY: usize = 2048;

impl PgStore {
    /// See `Store::guard_ddl`.
    pub(crate) async fn guard_ddl(
        &self,
        settings: &[ResourceSettings],
        only: Option<&str>,
    ) -> anyhow::Result<String> {
        if let Some(name) = only {
            if !settings.iter().any(|r| r.name == name) {
                anyhow::bail!("no resource {name:?} in [[resources]] of the config file");
            }
        }
        let startup = self.startup.open();
        let ddl = self.guard_ddl_on(&startup, settings, only).await;
        startup.close().await;
        ddl
    }

    async fn guard_ddl_on(
        &self,
        startup: &sqlx::PgPool,
        settings: &[ResourceSettings],
        only: Option<&str>,
    ) -> anyhow::Result<String> {
        let resources = catalog::load(startup, self.schema(), settings).await?;
        let mut conn = startup.acquire().await?;
        let mut out = String::new();
        let mut owners = Vec::new();
        for resource in resources.iter() {
            if only.is_some_and(|name| name != resource.name) {
                continue;
            }
            let Some(guard) = resource.guard else {
                if only.is_some() {
                    anyhow::bail!(
                        "resource {:?} has no guard (set guard = \"audit\" or \"enforce\")",
                        resource.name
                    );
                }
                continue;
            };
            let covered = sql_fence::guards::inspect(&mut conn, self.schema(), resource).await?;
            let owner = covered
                .iter()
                .find(|c| c.root)
                .map(|c| c.owner.as_str())
                .unwrap_or("?");
            let ddl = sql_fence::guards::ddl(self.schema(), resource, &covered);
            // Every guarded table's owner keeps EXECUTE (partitions made later need it too).
            owners.extend(covered.iter().map(|c| c.owner.clone()));
            out.push_str(&format!(
                "-- resource {:?} (guard = {:?}) on {}: ",
                resource.name,
                guard.as_str(),
                resource.relation
            ));
            if ddl.is_empty() {
                out.push_str("the trigger is ready; nothing to run\n");
            } else {
                out.push_str(&format!("run once as the table's owner ({owner}):\n"));
                for statement in ddl {
                    out.push_str(&statement);
                    out.push('\n');
                }
            }
        }
        if out.is_empty() {
            out.push_str("-- no [[resources]] entry has a guard\n");
        }
        // The owners must be able to name the guard's function in CREATE TRIGGER (as start-up
        // does while a trigger is missing: `sql_fence::guards::check`).
        if !owners.is_empty() {
            owners.sort();
            owners.dedup();
            // With one resource, the other tables' owners are not known here: keep theirs.
            sql_fence::guards::grant_guard_execute(
                &mut conn,
                self.schema(),
                &owners,
                only.is_none(),
            )
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot grant the tables' owners EXECUTE on the guard's function: {e}"
                )
            })?;
        }
        Ok(out)
    }

    /// `[[resources]]` validated against the catalog, and (serving) the guards checked.
    async fn resources_on(
        &self,
        startup: &sqlx::PgPool,
        settings: &[ResourceSettings],
    ) -> anyhow::Result<Resources> {
        let resources = catalog::load(startup, self.schema(), settings).await?;
        let all: Vec<&Resource> = resources.iter().map(|r| &**r).collect();
        if self.serving {
            let side = self.side_connection().await?;
            sql_fence::guards::check(startup, side, self.schema(), &all).await?;
        }
        Ok(resources)
    }
}

impl TableStore for PgStore {
    async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources> {
        let startup = self.startup.open();
        let checked = self.resources_on(&startup, settings).await;
        startup.close().await;
        checked
    }

    /// One fenced write to a row (PUT, PATCH or DELETE).
    async fn table_write(
        &self,
        op: &TableOp,
        guard: &Guard,
    ) -> Result<Outcome<RowWritten>, TableError> {
        self.table_write_with(op, guard, None).await
    }

    /// See `batch.rs`.
    async fn batch_tables(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        self.apply_batch(ops, guard, None).await
    }

    /// Reads a row with the token of the last write fencegate accepted for it.
    async fn table_get(
        &self,
        resource: &Resource,
        key: &RowKey,
    ) -> Result<Option<RowEntry>, TableError> {
        let key = self.canonical(resource, key, &RowWrite::Delete).await?;
        let sql = Sql(resource);
        let fence = sql
            .fence_column()
            .map_or("NULL::int8".to_owned(), |c| format!("t.{c}::int8"));
        let statement = format!(
            "SELECT to_jsonb(t)::text, l.token, l.scope, {fence}
             FROM {table} AS t CROSS JOIN {record}
             LEFT JOIN fencegate_ledger AS l ON l.relation = $2 AND l.key = $3
             WHERE {matches}",
            table = sql.table(),
            record = sql.record("$1", resource.key.iter().copied()),
            matches = sql.key_match(),
        );
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(&statement)
            .bind(serde_json::Value::Object(key.json).to_string())
            .bind(&resource.relation)
            .bind(&key.text)
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        conn.done();
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get(0).map_err(StoreError::from)?;
        let ledger: Option<i64> = row.try_get(1).map_err(StoreError::from)?;
        let scope: Option<String> = row.try_get(2).map_err(StoreError::from)?;
        let column: Option<i64> = row.try_get(3).map_err(StoreError::from)?;
        // Column mode: the column is the row's fence, also when another writer set it.
        let (fence_token, scope) = match (column.and_then(FencingToken::from_db), ledger) {
            (Some(column), Some(ledger)) if ledger == column.get() => (Some(column), scope),
            (Some(column), _) => (Some(column), None),
            (None, Some(ledger)) => (Some(token_from_db(ledger)?), scope),
            (None, None) => (None, None),
        };
        let row = RawValue::from_string(text)
            .map_err(|e| StoreError::Corrupt(format!("to_jsonb gave invalid JSON: {e}")))?;
        Ok(Some(RowEntry {
            key: key.text,
            row,
            fence_token,
            scope,
        }))
    }

    async fn sql_writers(&self) -> Result<SqlSeen, StoreError> {
        let mut conn = self.conns.take().await?;
        let seen = sql_fence::seen(&mut conn).await?;
        // Marks of ended transactions: a primary's work, skipped (harmlessly) elsewhere.
        if let Err(e) = sql_fence::forget_finished(&mut conn).await {
            tracing::debug!(error = %e, "cannot delete the marks of ended transactions");
        }
        conn.done();
        Ok(SqlSeen {
            refusals: seen.refusals,
            unfenced: seen.unfenced,
        })
    }
}

impl PgStore {
    /// One fenced write to a row; with `keep` (an `Idempotency-Key`), its outcome row is written
    /// in the same transaction before the commit.
    pub(in crate::store::pg) async fn table_write_with(
        &self,
        op: &TableOp,
        guard: &Guard,
        keep: Option<&Keep>,
    ) -> Result<Outcome<RowWritten>, TableError> {
        let resource = &*op.resource;
        check_token_fits(resource, guard.token, guard.scope().is_some())?;
        let key = self.canonical(resource, &op.key, &op.write).await?;
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await.map_err(StoreError::from)?;
        if let Some(scope) = guard.scope() {
            if let Err(refusal) = self
                .claim_scope(&mut tx, scope, guard.token, guard.rule)
                .await?
            {
                tx.rollback().await.map_err(StoreError::from)?;
                conn.done();
                let row = RowRef {
                    resource: resource.name.clone(),
                    key: key.text.clone(),
                };
                return Ok(refusal.outcome().for_row(&row));
            }
        }
        let deletes = matches!(op.write, RowWrite::Delete);
        let existed =
            match fence_row(&mut tx, resource, &key, guard, deletes, self.checks()).await? {
                Ok(existed) => existed,
                Err(refusal) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    conn.done();
                    return Ok(refusal.outcome());
                }
            };
        if let Err(failure) = write_row(&mut tx, resource, &key, &op.write, guard, existed).await {
            drop(tx); // rolls back
                      // Give the connection back before explaining, which takes one of its own: holding
                      // both could exhaust max_connections under concurrent failing writes.
            drop(conn);
            return Err(self.explain(failure, resource, &op.write).await);
        }
        let written = RowWritten {
            key: key.text,
            existed,
        };
        if let Some(keep) = keep {
            keep_in(&mut tx, keep, Done::Row(&written)).await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        conn.done();
        Ok(Outcome::Accepted(written))
    }
}

#[cfg(test)]
mod tests {
    use super::sql::quote_ident;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("id"), "\"id\"");
        assert_eq!(
            quote_ident("id\"; DROP TABLE x; --"),
            "\"id\"\"; DROP TABLE x; --\""
        );
    }
}
