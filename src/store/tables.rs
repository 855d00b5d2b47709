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

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde_json::value::RawValue;
use sqlx::{postgres::PgDatabaseError, Connection, PgConnection, Row};

use super::{
    catalog, postgres::PgStore, sql_fence_op, sql_jump_check, sql_scope_check, token_from_db, Backend, Checks, Refusal,
    Store, StoreError, Write, Written,
};
use crate::{
    fence::{Fenced, FencingToken, Guard, Jump, Outcome, Rule, Scope, ScopeMismatch, Stale, Target},
    tables::{canonical_key, Fence, KeyText, Resource, ResourceSettings, Resources, RowError, RowKey, RowWrite, TableOp},
};

/// A canonical key longer than this is refused: it is a btree index key in the ledger.
const MAX_CANONICAL_KEY: usize = 2048;

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
        match self.backend() {
            Backend::Postgres(pg) => catalog::load(&pg.pool, settings).await,
            _ => anyhow::bail!(
                "invalid resource: {}: legacy tables need PostgreSQL; set DATABASE_URL / --database-url",
                settings[0].label(0)
            ),
        }
    }

    pub async fn table_write(&self, op: &TableOp, guard: &Guard) -> Result<Outcome<RowWritten>, TableError> {
        let pg = self.postgres()?;
        let (op, guard) = (op.clone(), guard.clone());
        detached(async move { pg.table_write(&op, &guard).await }).await
    }

    /// Applies every kv write and table op or none, under one token. A refused row names
    /// its op as `ops[i]`, `i` counting all ops.
    pub async fn batch_tables(
        &self,
        ops: &[BatchOp],
        token: FencingToken,
        scope: Option<&Scope>,
        kv_rule: Rule,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        let pg = self.postgres()?;
        let (ops, scope) = (ops.to_vec(), scope.cloned());
        detached(async move { pg.batch_tables(&ops, token, scope.as_ref(), kv_rule).await }).await
    }

    pub async fn table_get(&self, resource: &Arc<Resource>, key: &RowKey) -> Result<Option<RowEntry>, TableError> {
        let pg = self.postgres()?;
        let (resource, key) = (resource.clone(), key.clone());
        detached(async move { pg.table_get(&resource, &key).await }).await
    }

    fn postgres(&self) -> Result<PgStore, TableError> {
        match self.backend() {
            Backend::Postgres(pg) => Ok(pg.clone()),
            _ => Err(not_postgres()),
        }
    }
}

/// Runs a table request's database work on its own task, to COMMIT or ROLLBACK, even if the
/// request is dropped half-way (timeout, client gone): see `store::run_detached`.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, TableError>> + Send + 'static,
) -> Result<T, TableError> {
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(err) => Err(TableError::Store(StoreError::Task(err.to_string()))),
    }
}

/// `"name"`, with embedded quotes doubled: the only way an identifier enters SQL here.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// SQL text for one resource, built only from its catalog-validated description.
struct Sql<'a>(&'a Resource);

impl Sql<'_> {
    fn table(&self) -> String {
        format!("{}.{}", quote_ident(&self.0.schema), quote_ident(&self.0.table))
    }

    fn col(&self, index: usize) -> String {
        quote_ident(&self.0.columns[index].name)
    }

    /// `jsonb_to_record($n::jsonb) AS r("id" integer, ...)`: PostgreSQL converts each JSON
    /// value to the column's type exactly as `jsonb_populate_record` would (strings through the
    /// type's input function, arrays to arrays, objects to jsonb...). Only the listed columns are
    /// converted, so columns the request leaves out keep their defaults.
    fn record(&self, param: &str, columns: impl IntoIterator<Item = usize>) -> String {
        let defs: Vec<String> = columns
            .into_iter()
            .map(|i| format!("{} {}", self.col(i), self.0.columns[i].sql_type))
            .collect();
        format!("jsonb_to_record({param}::jsonb) AS r({})", defs.join(", "))
    }

    /// `t."id" = r."id" AND ...`: the key columns of the table row and of the parsed key.
    fn key_match(&self) -> String {
        let parts: Vec<String> = self.0.key.iter().map(|&i| format!("t.{c} = r.{c}", c = self.col(i))).collect();
        parts.join(" AND ")
    }

    /// The canonical text of key column `index` of record `r`.
    fn key_text(&self, index: usize) -> String {
        match self.0.columns[index].key_text {
            KeyText::Output => format!("r.{}::text", self.col(index)),
            KeyText::TrimScale => format!("trim_scale(r.{})::text", self.col(index)),
        }
    }

    fn fence_column(&self) -> Option<String> {
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
fn ledger_sql(rule: Rule, checks: Checks) -> String {
    format!(
        "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope)
         SELECT $1::text, $2::text, $3::int8, $3::int8, NULL::text WHERE {jump}
         ON CONFLICT (relation, key) DO UPDATE SET
             fence = EXCLUDED.fence, token = EXCLUDED.token, scope = NULL, updated_at = now()
         WHERE l.fence {op} EXCLUDED.fence AND {scope_check} AND {row_jump}
         RETURNING 1",
        op = sql_fence_op(rule),
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
fn ledger_scoped_sql(scopes: crate::fence::ScopeRule) -> String {
    format!(
        "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope) VALUES ($1, $2, 0, $3, $4)
         ON CONFLICT (relation, key) DO UPDATE SET token = EXCLUDED.token, scope = EXCLUDED.scope, updated_at = now()
         WHERE {scope_check}
         RETURNING 1",
        scope_check = sql_scope_check(scopes, "l.scope", "EXCLUDED.scope"),
    )
}

/// A key parsed and printed by PostgreSQL.
struct CanonicalKey {
    /// The URL form (what the ledger stores and responses show).
    text: String,
    /// `{"id": "42", "region": "EU"}`: the key as JSON, for `jsonb_to_record`.
    json: serde_json::Map<String, serde_json::Value>,
}

/// Why a statement on a legacy table failed.
enum Failure {
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
fn classify(err: sqlx::Error) -> Failure {
    let sqlx::Error::Database(db) = &err else { return Failure::Store(err.into()) };
    let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
    let message = db.message().to_owned();
    let column = db.try_downcast_ref::<PgDatabaseError>().and_then(PgDatabaseError::column).map(str::to_owned);
    let constraint = db.constraint().map(str::to_owned);
    match code.as_str() {
        // 22: data exceptions (bad input syntax, out of range, too long, bad enum label...).
        c if c.starts_with("22") => Failure::Data(message),
        // NOT NULL on a column names it; a NOT NULL domain does not.
        "23502" if column.is_none() => Failure::Data(message),
        // Integrity constraints, and exceptions raised by the table's own triggers (class P0).
        "23502" | "23503" | "23505" | "23514" | "23P01" => Failure::Row(RowError::Value { column, constraint, detail: message }),
        c if c.starts_with("P0") => Failure::Row(RowError::Value { column, constraint, detail: message }),
        _ => Failure::Store(err.into()),
    }
}

impl From<Failure> for TableError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Data(detail) => TableError::Row(RowError::Value { column: None, constraint: None, detail }),
            Failure::Row(err) => TableError::Row(err),
            Failure::Store(err) => TableError::Store(err),
        }
    }
}

/// A JSON string holding `text`.
fn json_text(text: &str) -> Box<RawValue> {
    RawValue::from_string(serde_json::Value::from(text).to_string()).expect("a JSON string is JSON")
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

    /// A batch with table ops (and maybe kv writes) under one token: all or nothing.
    ///
    /// Lock order, the same in every batch so batches cannot deadlock each other: the scope,
    /// then kv keys (sorted), then ledger rows sorted by (table, key); row writes then follow in
    /// request order (so a parent row can be inserted before its children).
    pub async fn batch_tables(
        &self,
        batch: &[BatchOp],
        token: FencingToken,
        scope: Option<&Scope>,
        kv_rule: Rule,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        let mut kv = Vec::new();
        // Table ops with their index in the request, for error messages.
        let mut ops: Vec<(usize, &TableOp)> = Vec::new();
        for (i, op) in batch.iter().enumerate() {
            match op {
                BatchOp::Kv(write) => kv.push(write.clone()),
                BatchOp::Row(op) => ops.push((i, op)),
            }
        }
        let in_op = |i: usize| {
            move |err: TableError| match err {
                TableError::Row(err) => TableError::Row(err.in_op(i)),
                other => other,
            }
        };
        let scope_rule = strictest(
            ops.iter().map(|(_, op)| op.resource.rule).chain((!kv.is_empty()).then_some(kv_rule)),
        );
        let guard_for = |rule: Rule| Guard {
            token,
            target: scope.map_or(Target::Key, |s| Target::Scope(s.clone())),
            rule: if scope.is_some() { scope_rule } else { rule },
        };
        let mut keys = Vec::with_capacity(ops.len());
        for &(i, op) in &ops {
            check_token_fits(&op.resource, token, scope.is_some()).map_err(in_op(i))?;
            keys.push(self.canonical(&op.resource, &op.key, &op.write).await.map_err(in_op(i))?);
        }

        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await.map_err(StoreError::from)?;
        let kv_guard = guard_for(kv_rule);
        let mut kv_written = Vec::new();
        let mut kv_refused = Vec::new();
        if !kv.is_empty() {
            // A scoped kv batch claims the scope itself (with `scope_rule`).
            match self.batch_in(&mut tx, &kv, &kv_guard).await? {
                Ok(written) => kv_written = written,
                Err(refused) if scope.is_some() => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    conn.done();
                    return Ok(self.refusal(&refused, &kv_guard).await?.outcome());
                }
                Err(refused) => kv_refused = refused,
            }
        } else if let Some(scope) = scope {
            if let Err(refusal) = self.claim_scope(&mut tx, scope, token, scope_rule).await? {
                tx.rollback().await.map_err(StoreError::from)?;
                conn.done();
                return Ok(refusal.outcome());
            }
        }

        // Each row's fence once, in (table, key) order.
        let mut rows: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for (n, ((_, op), key)) in ops.iter().zip(&keys).enumerate() {
            rows.entry((op.resource.relation.as_str(), key.text.as_str())).or_insert(n);
        }
        let mut live: HashMap<(&str, &str), bool> = HashMap::new();
        let mut stale = Vec::new();
        // Stale refusals are reported first, then the first other refusal (`Refusal::first`).
        let mut other: Option<Refusal> = None;
        for (&row, &first) in &rows {
            let resource = &ops[first].1.resource;
            let deletes = ops.iter().zip(&keys).any(|((_, op), key)| {
                (op.resource.relation.as_str(), key.text.as_str()) == row && matches!(op.write, RowWrite::Delete)
            });
            match fence_row(&mut tx, resource, &keys[first], &guard_for(resource.rule), deletes, self.checks()).await? {
                Ok(existed) => {
                    live.insert(row, existed);
                }
                Err(Refusal::Stale(refused)) => stale.extend(refused),
                Err(refused) => other = Refusal::first(other, refused),
            }
        }
        if !kv_refused.is_empty() || !stale.is_empty() || other.is_some() {
            tx.rollback().await.map_err(StoreError::from)?;
            conn.done();
            let mut all = Vec::new();
            if !kv_refused.is_empty() {
                match self.refusal(&kv_refused, &kv_guard).await? {
                    Refusal::Stale(refused) => all = refused,
                    // The kv keys come first in the lock order, and so win a tie.
                    refused => {
                        other = match other {
                            Some(row) => Refusal::first(Some(refused), row),
                            None => Some(refused),
                        }
                    }
                }
            }
            all.extend(stale);
            return Ok(match other {
                Some(other) if all.is_empty() => other.outcome(),
                _ => Outcome::Stale(all),
            });
        }

        let mut row_written = Vec::with_capacity(ops.len());
        for (&(i, op), key) in ops.iter().zip(&keys) {
            let row = (op.resource.relation.as_str(), key.text.as_str());
            let existed = live[&row];
            let guard = guard_for(op.resource.rule);
            if let Err(failure) = write_row(&mut tx, &op.resource, key, &op.write, &guard, existed).await {
                drop(tx);
                drop(conn); // before explaining, as in `table_write`
                return Err(in_op(i)(self.explain(failure, &op.resource, &op.write).await));
            }
            live.insert(row, !matches!(op.write, RowWrite::Delete));
            row_written.push(RowWritten { key: key.text.clone(), existed });
        }
        tx.commit().await.map_err(StoreError::from)?;
        conn.done();
        Ok(Outcome::Accepted((kv_written, row_written)))
    }

    /// The canonical key of a row, for a reset (`store::admin`); a key that does not parse is
    /// refused.
    pub(super) async fn canonical_text(
        &self,
        resource: &Resource,
        key: &RowKey,
    ) -> Result<Result<String, super::admin::ResetRefused>, StoreError> {
        match self.canonical(resource, key, &RowWrite::Delete).await {
            Ok(key) => Ok(Ok(key.text)),
            Err(TableError::Row(err)) => Ok(Err(super::admin::ResetRefused::Invalid(err.to_string()))),
            Err(TableError::Store(err)) => Err(err),
        }
    }

    /// Resets a row's fence (the ledger's and, in column mode, the fence column of the row if
    /// it exists) and maybe its binding, inside the caller's transaction.
    pub(super) async fn reset_row(
        &self,
        tx: &mut PgConnection,
        reset: &super::admin::Reset,
        resource: &Resource,
        key: &str,
    ) -> Result<Result<super::admin::Change, super::admin::ResetRefused>, StoreError> {
        use super::admin::{decide, Change, ResetRefused};
        let ledger = sqlx::query("SELECT fence, scope FROM fencegate_ledger WHERE relation = $1 AND key = $2 FOR UPDATE")
            .bind(&resource.relation)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
        let (mut from, from_scope) = match &ledger {
            Some(row) => (Some(token_from_db(row.try_get(0)?)?), row.try_get::<Option<String>, _>(1)?),
            None => (None, None),
        };
        let sql = Sql(resource);
        let key_json = {
            let values: serde_json::Map<String, serde_json::Value> = resource
                .key_columns()
                .zip(key.split(',').map(|p| crate::percent::decode_strict(p.as_bytes()).unwrap_or_default()))
                .map(|(c, v)| (c.name.clone(), serde_json::Value::from(v)))
                .collect();
            serde_json::Value::Object(values).to_string()
        };
        if let Some(column) = sql.fence_column() {
            let statement = format!(
                "SELECT t.{column}::int8 FROM {table} AS t CROSS JOIN {record} WHERE {matches} FOR UPDATE OF t",
                table = sql.table(),
                record = sql.record("$1", resource.key.iter().copied()),
                matches = sql.key_match(),
            );
            let value: Option<Option<i64>> = sqlx::query_scalar(&statement).bind(&key_json).fetch_optional(&mut *tx).await?;
            if let Some(value) = value.flatten() {
                let value = token_from_db(value)?;
                from = Some(from.map_or(value, |f| f.max(value)));
            }
        }
        let Some(from) = from else {
            return Ok(Err(ResetRefused::NotFound(format!(
                "row {key:?} of {:?} has no fence (fencegate never wrote it)",
                resource.name
            ))));
        };
        let (to, to_scope) = match decide(reset, from, from_scope.clone()) {
            Ok(next) => next,
            Err(refused) => return Ok(Err(refused)),
        };
        sqlx::query(
            "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope) VALUES ($1, $2, $3, $3, $4)
             ON CONFLICT (relation, key) DO UPDATE SET fence = EXCLUDED.fence, scope = EXCLUDED.scope, updated_at = now()",
        )
        .bind(&resource.relation)
        .bind(key)
        .bind(to.get())
        .bind(&to_scope)
        .execute(&mut *tx)
        .await?;
        if let (Some(column), Some(_)) = (sql.fence_column(), reset.to) {
            let statement = format!(
                "UPDATE {table} AS t SET {column} = $2 FROM {record} WHERE {matches}",
                table = sql.table(),
                record = sql.record("$1", resource.key.iter().copied()),
                matches = sql.key_match(),
            );
            sqlx::query(&statement).bind(&key_json).bind(to.get()).execute(&mut *tx).await?;
        }
        Ok(Ok(Change { name: key.to_owned(), resource: Some(resource.name.clone()), from, to, from_scope, to_scope }))
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

    /// Has PostgreSQL parse the key (and any key columns the body repeats) with the key
    /// columns' types, and prints it canonically. A value that does not parse is a 400 naming
    /// its column; a body naming another row than the URL is refused.
    async fn canonical(&self, resource: &Resource, key: &RowKey, write: &RowWrite) -> Result<CanonicalKey, TableError> {
        let sql = Sql(resource);
        let url: serde_json::Map<String, serde_json::Value> = resource
            .key_columns()
            .zip(key.values())
            .map(|(c, v)| (c.name.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        let echo = match write {
            RowWrite::Put(values) | RowWrite::Patch(values) if !values.key_echo.is_empty() => {
                let mut echo = url.clone();
                for (index, text) in &values.key_echo {
                    echo.insert(resource.columns[*index].name.clone(), text.as_str().into());
                }
                Some(echo)
            }
            _ => None,
        };
        let objects: Vec<serde_json::Value> =
            std::iter::once(&url).chain(echo.as_ref()).cloned().map(serde_json::Value::Object).collect();
        let texts: Vec<String> = resource.key.iter().map(|&i| sql.key_text(i)).collect();
        let statement = format!(
            "SELECT {texts} FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(j, n)
             CROSS JOIN LATERAL {record} ORDER BY e.n",
            texts = texts.join(", "),
            record = sql.record("e.j", resource.key.iter().copied()),
        );
        let mut conn = self.conns.take().await?;
        let rows = match sqlx::query(&statement)
            .bind(serde_json::Value::Array(objects).to_string())
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => {
                conn.done();
                rows
            }
            Err(err) => {
                drop(conn); // before explaining, which needs a connection of its own
                return Err(match classify(err) {
                    Failure::Data(message) | Failure::Row(RowError::Value { detail: message, .. }) => {
                        self.key_culprit(resource, &url, echo.as_ref(), message).await?
                    }
                    Failure::Row(err) => TableError::Row(err),
                    Failure::Store(err) => TableError::Store(err),
                })
            }
        };
        let mut printed = Vec::with_capacity(rows.len());
        for row in rows {
            let mut parts = Vec::with_capacity(resource.key.len());
            for i in 0..resource.key.len() {
                let text: Option<String> = row.try_get(i).map_err(StoreError::from)?;
                parts.push(text.unwrap_or_default());
            }
            printed.push(parts);
        }
        let [parts, rest @ ..] = printed.as_slice() else {
            return Err(StoreError::Corrupt("key canonicalization returned no row".into()).into());
        };
        if let Some(echoed) = rest.first() {
            if let Some((i, _)) = parts.iter().zip(echoed).enumerate().find(|(_, (a, b))| a != b) {
                let column = &resource.columns[resource.key[i]].name;
                return Err(RowError::row(
                    column,
                    format!(
                        "key column {column:?} is {:?} in the body but {:?} in the URL; a write cannot move a row to another key",
                        echoed[i], parts[i]
                    ),
                )
                .into());
            }
        }
        let text = canonical_key(parts);
        if text.len() > MAX_CANONICAL_KEY {
            return Err(RowError::Key {
                column: None,
                detail: format!("the canonical key is {} bytes long; the limit is {MAX_CANONICAL_KEY}", text.len()),
            }
            .into());
        }
        let json = resource
            .key_columns()
            .zip(parts)
            .map(|(c, p)| (c.name.clone(), serde_json::Value::from(p.as_str())))
            .collect();
        Ok(CanonicalKey { text, json })
    }

    /// Finds the key value PostgreSQL refused (URL key first, then the body's key columns).
    async fn key_culprit(
        &self,
        resource: &Resource,
        url: &serde_json::Map<String, serde_json::Value>,
        echo: Option<&serde_json::Map<String, serde_json::Value>>,
        message: String,
    ) -> Result<TableError, StoreError> {
        for (from_url, object) in std::iter::once((true, url)).chain(echo.map(|e| (false, e))) {
            for &index in &resource.key {
                let column = &resource.columns[index];
                let value = json_text(object[&column.name].as_str().unwrap_or_default());
                if let Some(detail) = self.refuses(resource, index, &value).await? {
                    let detail = format!("key column {:?} ({}): {detail}", column.name, column.sql_type);
                    let column = Some(column.name.clone());
                    return Ok(TableError::Row(if from_url {
                        RowError::Key { column, detail }
                    } else {
                        RowError::Row { column, detail }
                    }));
                }
            }
        }
        Ok(TableError::Row(RowError::Key { column: None, detail: message }))
    }

    /// After a failed row write: names the column whose value PostgreSQL refused, by converting
    /// each value of the body on its own.
    async fn explain(&self, failure: Failure, resource: &Resource, write: &RowWrite) -> TableError {
        let Failure::Data(message) = failure else { return failure.into() };
        if let RowWrite::Put(values) | RowWrite::Patch(values) = write {
            for (index, value) in &values.set {
                match self.refuses(resource, *index, value).await {
                    Ok(Some(detail)) => {
                        let column = &resource.columns[*index];
                        return TableError::Row(RowError::Value {
                            column: Some(column.name.clone()),
                            constraint: None,
                            detail: format!("column {:?} ({}): {detail}", column.name, column.sql_type),
                        });
                    }
                    Ok(None) => {}
                    Err(err) => return TableError::Store(err),
                }
            }
        }
        TableError::Row(RowError::Value { column: None, constraint: None, detail: message })
    }

    /// Whether PostgreSQL refuses `value` for column `index` on its own, and why.
    async fn refuses(&self, resource: &Resource, index: usize, value: &RawValue) -> Result<Option<String>, StoreError> {
        let sql = Sql(resource);
        let statement = format!("SELECT r.{c} IS NULL FROM {record}", c = sql.col(index), record = sql.record("$1", [index]));
        let object = format!("{{{}:{}}}", serde_json::Value::from(resource.columns[index].name.as_str()), value.get());
        let mut conn = self.conns.take().await?;
        let result = sqlx::query(&statement).bind(object).fetch_one(&mut *conn).await;
        if result.is_ok() {
            conn.done();
        }
        match result {
            Ok(_) => Ok(None),
            Err(err) => match classify(err) {
                Failure::Data(detail) | Failure::Row(RowError::Value { detail, .. }) => Ok(Some(detail)),
                Failure::Row(_) => Ok(None),
                Failure::Store(err) => Err(err),
            },
        }
    }
}

/// In column mode an unscoped write stores the token in the fence column: it must fit.
fn check_token_fits(resource: &Resource, token: FencingToken, scoped: bool) -> Result<(), TableError> {
    if let (Fence::Column { max, .. }, false) = (resource.fence, scoped) {
        if token.get() > max {
            let column = resource.fence_column().expect("column mode has a fence column");
            return Err(RowError::Token(format!(
                "token {token} does not fit the fence column {:?} of resource {:?} ({}: at most {max})",
                column.name, resource.name, column.sql_type
            ))
            .into());
        }
    }
    Ok(())
}

/// Step 3: the row's fence. Returns whether the row exists, or the refusal. Afterwards this
/// transaction holds the row's ledger lock and, if the row exists, its lock in the table
/// (`FOR UPDATE` if it will be deleted, else the weaker `FOR NO KEY UPDATE`, which does not
/// block other writers inserting rows that reference it).
async fn fence_row(
    conn: &mut PgConnection,
    resource: &Resource,
    key: &CanonicalKey,
    guard: &Guard,
    deletes: bool,
    checks: Checks,
) -> Result<Result<bool, Refusal>, TableError> {
    let fenced = || Fenced::Row { resource: resource.name.clone(), key: key.text.clone() };
    let jump = |current: FencingToken| Jump { fenced: fenced(), presented: guard.token, current, max_jump: checks.jump.0 };
    let admitted: Option<i32> = match &guard.target {
        Target::Key => sqlx::query_scalar(&ledger_sql(guard.rule, checks))
            .bind(&resource.relation)
            .bind(&key.text)
            .bind(guard.token.get())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?,
        Target::Scope(scope) => sqlx::query_scalar(&ledger_scoped_sql(checks.scopes))
            .bind(&resource.relation)
            .bind(&key.text)
            .bind(guard.token.get())
            .bind(scope.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?,
    };
    if admitted.is_none() {
        // Read under the ledger row's lock, which the refused upsert took (if the row exists:
        // a token the jump cap refuses never reached it): exactly what refused.
        let row = sqlx::query("SELECT fence, scope FROM fencegate_ledger WHERE relation = $1 AND key = $2")
            .bind(&resource.relation)
            .bind(&key.text)
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        let Some(row) = row else {
            return Ok(Err(Refusal::Jump(jump(FencingToken::ZERO))));
        };
        // The fence first, then the guards, then the scope, as for kv
        // (`store::explain_refusal`). A scoped write was already admitted by its scope's fence
        // (the claim before this).
        let current = token_from_db(row.try_get(0).map_err(StoreError::from)?)?;
        let remembered: Option<String> = row.try_get(1).map_err(StoreError::from)?;
        let unscoped = guard.scope().is_none();
        if unscoped && guard.rule.accepts(guard.token, current) && !checks.jump.admits(guard.token, Some(current)) {
            return Ok(Err(Refusal::Jump(jump(current))));
        }
        let stale_by_row = unscoped && !guard.rule.accepts(guard.token, current);
        if !stale_by_row && !checks.scopes.admits(Some(remembered.as_deref()), guard.scope().map(Scope::as_str)) {
            return Ok(Err(Refusal::Mismatch(ScopeMismatch {
                fenced: fenced(),
                scope: remembered,
                presented: guard.scope().cloned(),
            })));
        }
        return Ok(Err(Refusal::Stale(vec![Stale::reported(guard.rule, guard.token, current, fenced())])));
    }
    // Lock the table row (if any): from here to commit nobody else changes it. In column mode
    // an unscoped write also needs the row's own fence column to admit the token: another
    // writer may have raised it.
    let sql = Sql(resource);
    let (fence, admits) = match (sql.fence_column(), &guard.target) {
        (Some(c), Target::Key) => (
            format!("t.{c}::int8"),
            format!(
                "(t.{c} IS NULL OR t.{c} {op} $2) AND {jump}",
                op = sql_fence_op(guard.rule),
                jump = sql_jump_check(checks.jump, &format!("t.{c}::int8"), "$2::int8"),
            ),
        ),
        _ => ("NULL::int8".to_owned(), "true".to_owned()),
    };
    let statement = format!(
        "SELECT {fence}, {admits} FROM {table} AS t CROSS JOIN {record} WHERE {matches} FOR {lock} OF t",
        table = sql.table(),
        record = sql.record("$1", resource.key.iter().copied()),
        matches = sql.key_match(),
        lock = if deletes { "UPDATE" } else { "NO KEY UPDATE" },
    );
    let row = sqlx::query(&statement)
        .bind(serde_json::Value::Object(key.json.clone()).to_string())
        .bind(guard.token.get())
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::from)?;
    let Some(row) = row else { return Ok(Ok(false)) };
    let admits: bool = row.try_get(1).map_err(StoreError::from)?;
    if !admits {
        let current = token_from_db(row.try_get(0).map_err(StoreError::from)?)?;
        if guard.rule.accepts(guard.token, current) {
            return Ok(Err(Refusal::Jump(jump(current))));
        }
        return Ok(Err(Refusal::Stale(vec![Stale::reported(guard.rule, guard.token, current, fenced())])));
    }
    Ok(Ok(true))
}

/// Step 4: the write to the legacy table. `existed` comes from [`fence_row`], which holds the
/// row's lock if it exists.
async fn write_row(
    conn: &mut PgConnection,
    resource: &Resource,
    key: &CanonicalKey,
    write: &RowWrite,
    guard: &Guard,
    existed: bool,
) -> Result<(), Failure> {
    let sql = Sql(resource);
    // Unscoped writes in column mode store the token in the fence column ($2); scoped writes
    // leave it alone (tokens of different fences are never compared).
    let fence_column = match (&resource.fence, &guard.target) {
        (Fence::Column { column, .. }, Target::Key) => Some(*column),
        _ => None,
    };
    let mut object: BTreeMap<&str, Box<RawValue>> =
        key.json.iter().map(|(c, v)| (c.as_str(), json_text(v.as_str().unwrap_or_default()))).collect();
    // Whether the statement uses $2 (the token, for the fence column).
    let binds_token = fence_column.is_some() && !matches!(write, RowWrite::Delete);
    let statement = match write {
        RowWrite::Put(values) => {
            let mut columns: Vec<usize> = resource.key.clone();
            columns.extend(values.set.iter().map(|(i, _)| *i));
            for (index, value) in &values.set {
                object.insert(&resource.columns[*index].name, value.clone());
            }
            let mut targets: Vec<String> = columns.iter().map(|&i| sql.col(i)).collect();
            let mut sources: Vec<String> = columns.iter().map(|&i| format!("r.{}", sql.col(i))).collect();
            let mut assign: Vec<String> =
                values.set.iter().map(|(i, _)| format!("{c} = EXCLUDED.{c}", c = sql.col(*i))).collect();
            if let Some(f) = fence_column {
                targets.push(sql.col(f));
                sources.push("$2".into());
                assign.push(format!("{c} = EXCLUDED.{c}", c = sql.col(f)));
            }
            // PUT replaces the row: every other writable column goes back to its default, as if
            // the row had just been inserted. Identity columns keep their number; the fence
            // column is only ever written with a token.
            for (i, column) in resource.columns.iter().enumerate() {
                let named = resource.key.contains(&i) || values.set.iter().any(|(s, _)| *s == i);
                let fence = matches!(resource.fence, Fence::Column { column, .. } if column == i);
                if !named && !fence && column.read_only.is_none() && !column.identity {
                    assign.push(format!("{} = DEFAULT", sql.col(i)));
                }
            }
            if assign.is_empty() {
                // Nothing but the key: ON CONFLICT still needs an assignment (a no-op).
                let k = sql.col(resource.key[0]);
                assign.push(format!("{k} = EXCLUDED.{k}"));
            }
            format!(
                "INSERT INTO {table} AS t ({targets}) SELECT {sources} FROM {record}
                 ON CONFLICT ({keys}) DO UPDATE SET {assign}",
                table = sql.table(),
                targets = targets.join(", "),
                sources = sources.join(", "),
                record = sql.record("$1", columns.iter().copied()),
                keys = resource.key.iter().map(|&i| sql.col(i)).collect::<Vec<_>>().join(", "),
                assign = assign.join(", "),
            )
        }
        RowWrite::Patch(values) => {
            if !existed {
                return Err(Failure::Row(RowError::NoRow(format!(
                    "resource {:?} has no row {:?}; PATCH changes an existing row (PUT creates one)",
                    resource.name, key.text
                ))));
            }
            let mut columns: Vec<usize> = resource.key.clone();
            columns.extend(values.set.iter().map(|(i, _)| *i));
            for (index, value) in &values.set {
                object.insert(&resource.columns[*index].name, value.clone());
            }
            let mut assign: Vec<String> =
                values.set.iter().map(|(i, _)| format!("{c} = r.{c}", c = sql.col(*i))).collect();
            if let Some(f) = fence_column {
                assign.push(format!("{} = $2", sql.col(f)));
            }
            format!(
                "UPDATE {table} AS t SET {assign} FROM {record} WHERE {matches}",
                table = sql.table(),
                assign = assign.join(", "),
                record = sql.record("$1", columns.iter().copied()),
                matches = sql.key_match(),
            )
        }
        RowWrite::Delete => format!(
            "DELETE FROM {table} AS t USING {record} WHERE {matches}",
            table = sql.table(),
            record = sql.record("$1", resource.key.iter().copied()),
            matches = sql.key_match(),
        ),
    };
    let json = serde_json::to_string(&object).map_err(|e| Failure::Store(StoreError::Corrupt(e.to_string())))?;
    let mut query = sqlx::query(&statement).bind(json);
    if binds_token {
        query = query.bind(guard.token.get());
    }
    query.execute(&mut *conn).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
