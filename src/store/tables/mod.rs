//! Fenced writes to legacy PostgreSQL tables (`/v1/tables`), without touching their schema.
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
mod sql;

use std::sync::Arc;

use serde_json::value::RawValue;
use sqlx::{Connection, Row};

use self::{
    explain::check_token_fits,
    rows::{fence_row, write_row},
    sql::Sql,
};
use super::{catalog, postgres::PgStore, run_detached, token_from_db, Backend, Store, StoreError, Write, Written};
use crate::{
    fence::{FencingToken, Guard, Outcome, Rule},
    tables::{Resource, ResourceSettings, Resources, RowError, RowKey, RowWrite, TableOp},
};

/// A canonical key longer than this is refused: it is a btree index key in the ledger.
pub(super) const MAX_CANONICAL_KEY: usize = 2048;

/// What a write did to one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowWritten {
    /// The canonical key (docs/tables.md).
    pub key: String,
    /// The row existed just before this write.
    pub existed: bool,
}

/// A row as read back.
#[derive(Debug)]
pub struct RowEntry {
    pub key: String,
    /// The row as PostgreSQL's `to_jsonb` prints it (numbers keep their precision).
    pub row: Box<RawValue>,
    /// The token of the last write fencegate accepted for the row (column mode: the fence
    /// column), if any.
    pub fence_token: Option<FencingToken>,
    pub scope: Option<String>,
}

/// One op of a batch that writes legacy tables (and maybe kv keys).
#[derive(Debug, Clone)]
pub enum BatchOp {
    Kv(Write),
    Row(TableOp),
}

/// The results of such a batch: the kv part (as for a kv-only batch) and one entry per table
/// op, in request order.
pub type BatchWritten = (Vec<Written>, Vec<RowWritten>);

/// A failed table request: the client's fault (400/404/422) or the store's.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Row(#[from] RowError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Legacy tables are PostgreSQL tables: other backends refuse `[[resources]]` at start-up, so
/// no table request can reach them.
fn not_postgres() -> TableError {
    TableError::Store(StoreError::Corrupt("legacy tables need the PostgreSQL store".into()))
}

impl Store {
    /// Validates `[[resources]]` against the catalog; a bad resource fails start-up.
    pub async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources> {
        if settings.is_empty() {
            return Ok(Resources::default());
        }
        match &self.backend {
            Backend::Postgres(pg) => {
                let resources = catalog::load(&pg.pool, pg.schema(), settings).await?;
                let all: Vec<&Resource> = resources.iter().map(|r| &**r).collect();
                crate::store::postgres::sql_fence::install_guards(&pg.pool, &all).await?;
                if all.iter().any(|r| r.guard.is_some()) {
                    self.guarded.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(resources)
            }
            _ => anyhow::bail!(
                "invalid resource: {}: legacy tables need PostgreSQL; set DATABASE_URL / --database-url",
                settings[0].label(0)
            ),
        }
    }

    pub async fn table_write(&self, op: &TableOp, guard: &Guard) -> Result<Outcome<RowWritten>, TableError> {
        let pg = self.postgres()?;
        let (op, guard) = (op.clone(), guard.clone());
        let written = run_detached(async move { pg.table_write(&op, &guard).await }).await;
        self.pressure.observe(&written);
        written
    }

    /// Applies every kv write and table op or none, under one token. A refused row names
    /// its op as `ops[i]`, `i` counting all ops.
    /// `guard`: the batch's token, its scope if any, and the kv rule (each table op follows its
    /// resource's rule; a scope is claimed under the strictest rule of the ops it guards).
    pub async fn batch_tables(&self, ops: &[BatchOp], guard: &Guard) -> Result<Outcome<BatchWritten>, TableError> {
        let pg = self.postgres()?;
        let (ops, guard) = (ops.to_vec(), guard.clone());
        let written = run_detached(async move { pg.batch_tables(&ops, &guard).await }).await;
        self.pressure.observe(&written);
        written
    }

    pub async fn table_get(&self, resource: &Arc<Resource>, key: &RowKey) -> Result<Option<RowEntry>, TableError> {
        let pg = self.postgres()?;
        let (resource, key) = (resource.clone(), key.clone());
        run_detached(async move { pg.table_get(&resource, &key).await }).await
    }

    fn postgres(&self) -> Result<PgStore, TableError> {
        match &self.backend {
            Backend::Postgres(pg) => Ok(pg.clone()),
            _ => Err(not_postgres()),
        }
    }
}


/// The most demanding rule among those given: a scope shared by several resources is claimed
/// once, so it must satisfy each of them.
fn strictest(rules: impl IntoIterator<Item = Rule>) -> Rule {
    if rules.into_iter().any(|r| r == Rule::Strict) { Rule::Strict } else { Rule::Inclusive }
}

impl PgStore {
    /// One fenced write to a row (PUT, PATCH or DELETE).
    pub async fn table_write(&self, op: &TableOp, guard: &Guard) -> Result<Outcome<RowWritten>, TableError> {
        let resource = &*op.resource;
        check_token_fits(resource, guard.token, guard.scope().is_some())?;
        let key = self.canonical(resource, &op.key, &op.write).await?;
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await.map_err(StoreError::from)?;
        if let Some(scope) = guard.scope() {
            if let Err(refusal) = self.claim_scope(&mut tx, scope, guard.token, guard.rule).await? {
                tx.rollback().await.map_err(StoreError::from)?;
                conn.done();
                return Ok(refusal.outcome());
            }
        }
        let deletes = matches!(op.write, RowWrite::Delete);
        let existed = match fence_row(&mut tx, resource, &key, guard, deletes, self.checks()).await? {
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
        tx.commit().await.map_err(StoreError::from)?;
        conn.done();
        Ok(Outcome::Accepted(RowWritten { key: key.text, existed }))
    }

    /// Reads a row with the token of the last write fencegate accepted for it.
    pub async fn table_get(&self, resource: &Resource, key: &RowKey) -> Result<Option<RowEntry>, TableError> {
        let key = self.canonical(resource, key, &RowWrite::Delete).await?;
        let sql = Sql(resource);
        let fence = sql.fence_column().map_or("NULL::int8".to_owned(), |c| format!("t.{c}::int8"));
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
        let row = RawValue::from_string(text).map_err(|e| StoreError::Corrupt(format!("to_jsonb gave invalid JSON: {e}")))?;
        Ok(Some(RowEntry { key: key.text, row, fence_token, scope }))
    }

}

#[cfg(test)]
mod tests {
    use super::{sql::quote_ident, *};

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("id"), "\"id\"");
        assert_eq!(quote_ident("id\"; DROP TABLE x; --"), "\"id\"\"; DROP TABLE x; --\"");
    }

    #[test]
    fn a_shared_scope_takes_the_strictest_rule() {
        assert_eq!(strictest([Rule::Inclusive, Rule::Inclusive]), Rule::Inclusive);
        assert_eq!(strictest([Rule::Inclusive, Rule::Strict]), Rule::Strict);
        assert_eq!(strictest([]), Rule::Inclusive);
    }
}
