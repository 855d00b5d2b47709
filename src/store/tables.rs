//! Fenced writes to legacy tables (`/v1/tables`, `[[resources]]`): what a request gets back,
//! and the facade's methods. Legacy tables are PostgreSQL tables: the statements are in
//! `pg/tables/`; the SQLite backend refuses `[[resources]]` at start-up (`sqlite/mod.rs`).

use std::sync::Arc;

use serde_json::value::RawValue;

use super::{SqlSeen, Store, StoreError, Write, Written};
use crate::{
    fence::{FencingToken, Guard, Outcome},
    tables::{Resource, ResourceSettings, Resources, RowError, RowKey, TableOp},
};

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

impl Store {
    /// Validates `[[resources]]` against the catalog; a bad resource fails start-up.
    pub async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources> {
        if settings.is_empty() {
            return Ok(Resources::default());
        }
        on_backend!(&self.backend, b => b.resources(settings).await)
    }

    /// The DDL that makes the guard triggers of `settings` (only `resource`'s, if given) ready,
    /// for the tables' owners to run once: what start-up prints when a trigger is not ready.
    pub async fn guard_ddl(
        &self,
        settings: &[ResourceSettings],
        resource: Option<&str>,
    ) -> anyhow::Result<String> {
        match &self.backend {
            super::AnyBackend::Postgres(pg) => pg.guard_ddl(settings, resource).await,
            super::AnyBackend::Sqlite(_) => {
                anyhow::bail!(
                    "guarded tables need the PostgreSQL store: set DATABASE_URL or --database-url"
                )
            }
        }
    }

    pub async fn table_write(
        &self,
        op: &TableOp,
        guard: &Guard,
    ) -> Result<Outcome<RowWritten>, TableError> {
        let resource = op.resource.clone();
        let (op, guard) = (op.clone(), guard.clone());
        let written = detached!(self, b => b.table_write(&op, &guard).await);
        self.pressure.observe(&written);
        written.map_err(|err| missing_table(err, [&*resource]))
    }

    /// Applies every kv write and table op or none, under one token. A refused row names
    /// its op as `ops[i]`, `i` counting all ops.
    /// `guard`: the batch's token, its scope if any, and the kv rule (each table op follows its
    /// resource's rule; a scope is claimed under the strictest rule of the ops it guards).
    pub async fn batch_tables(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        let all = ops;
        let (ops, guard) = (ops.to_vec(), guard.clone());
        let written = detached!(self, b => b.batch_tables(&ops, &guard).await);
        self.pressure.observe(&written);
        written.map_err(|err| {
            missing_table(
                err,
                all.iter().filter_map(|op| match op {
                    BatchOp::Row(op) => Some(&*op.resource),
                    _ => None,
                }),
            )
        })
    }

    pub async fn table_get(
        &self,
        resource: &Arc<Resource>,
        key: &RowKey,
    ) -> Result<Option<RowEntry>, TableError> {
        let named = resource.clone();
        let (resource, key) = (resource.clone(), key.clone());
        detached!(self, b => b.table_get(&resource, &key).await)
            .map_err(|err| missing_table(err, [&*named]))
    }
}

/// A table the statement needed does not exist: with legacy tables in it, name them (their
/// names come from the configuration, never from the database's message) and what to do.
fn missing_table<'a>(
    err: TableError,
    resources: impl IntoIterator<Item = &'a Resource>,
) -> TableError {
    let TableError::Store(store) = &err else {
        return err;
    };
    if store.db_kind() != Some(super::DbKind::MissingTable) {
        return err;
    }
    let mut names: Vec<&str> = resources.into_iter().map(|r| r.relation.as_str()).collect();
    names.dedup();
    if names.is_empty() {
        return err;
    }
    TableError::Store(StoreError::NotReady(format!(
        "a table this request needs does not exist: the legacy table {} (or a column of it, or one of fencegate's \
         own tables) was dropped or renamed after fencegate started: restore it, or change the configuration and restart (if fencegate's own \
         tables are missing, the database is not migrated yet: `fencegate migrate`)",
        names.join(" or ")
    )))
}

/// Legacy tables fenced in place (`[[resources]]`: `pg/tables/`).
pub(in crate::store) trait TableStore {
    /// Validates `[[resources]]` against the database; a bad resource fails start-up.
    async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources>;

    async fn table_write(
        &self,
        op: &TableOp,
        guard: &Guard,
    ) -> Result<Outcome<RowWritten>, TableError>;

    /// Every kv write and table op or none, under one token.
    async fn batch_tables(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
    ) -> Result<Outcome<BatchWritten>, TableError>;

    async fn table_get(
        &self,
        resource: &Resource,
        key: &RowKey,
    ) -> Result<Option<RowEntry>, TableError>;

    /// What SQL writers ran into: refusals by `fencegate.fence()` and the guards, and writes
    /// guards in audit mode let through without a fence.
    async fn sql_writers(&self) -> Result<SqlSeen, StoreError>;
}
