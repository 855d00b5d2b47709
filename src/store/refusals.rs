//! Refused writes kept for operators, in the database (`fencegate_refusals`): every process
//! serving it writes its own and reads everyone's, across restarts. Bounded: the newest
//! [`KEPT`], at most [`KEPT_DAYS`] days old.
//!
//! Written off the request path: the refusal is queued (`events::Events::record_to`) and a
//! task of the store writes what is queued in one transaction at a time, so a flood of stale
//! writes costs the database one insert per refusal at most, never a round trip per request.

use std::{sync::Arc, time::Duration};

use serde_json::{json, Value};

use super::{Store, StoreError};
use crate::events::{Event, What};

/// Refusals kept: the newest this many ...
pub const KEPT: i64 = 10_000;
/// ... and none older than this.
pub const KEPT_DAYS: i64 = 7;
/// Most refusals written in one transaction.
const BATCH: usize = 256;
/// How often the old ones are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

const INSERT: &str = "INSERT INTO fencegate_refusals
    (uid, kind, op, route, key, resource, scope, presented_scope, presented_token, current_token, keys, actor, request_id, detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// `AT_TEXT` and `AT_MS`: the backend's spelling of `at` as RFC 3339 text and as milliseconds.
const SELECT: &str = "SELECT id, AT_TEXT, uid, kind, op, route, key, resource, scope, presented_scope, presented_token,
    current_token, keys, actor, request_id, detail, AT_MS FROM fencegate_refusals ORDER BY id DESC LIMIT $1";

pub(super) fn select_pg() -> String {
    SELECT
        .replace("AT_TEXT", "to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
        .replace("AT_MS", "(extract(epoch FROM at) * 1000)::int8")
}

pub(super) fn select_sqlite() -> String {
    SELECT.replace("AT_TEXT", "at").replace("AT_MS", "CAST(round((julianday(at) - 2440587.5) * 86400000) AS INTEGER)")
}

impl Store {
    /// Writes the refusals `queue` brings, until it closes. Failures are logged and the batch
    /// dropped (the database being away is what 503s already say; refusals are a record, not
    /// a guarantee). Prunes the old ones every minute.
    pub async fn record_refusals(self, mut queue: tokio::sync::mpsc::Receiver<Arc<Event>>) {
        let mut pruned = tokio::time::Instant::now();
        // Written since the last prune: a flood of refusals is pruned as often as it fills the
        // table, not only once a minute.
        let mut since_prune = 0i64;
        let mut batch = Vec::with_capacity(BATCH);
        while queue.recv_many(&mut batch, BATCH).await > 0 {
            since_prune += batch.len() as i64;
            let backend = self.backend.clone();
            let events = std::mem::take(&mut batch);
            let written = super::run_detached(async move {
                match &backend {
                    super::Backend::Postgres(pg) => pg.insert_refusals(&events).await,
                    super::Backend::Sqlite(db) => db.insert_refusals(&events).await,
                }
            })
            .await;
            if let Err(err) = written {
                tracing::warn!(error = %err, "refused writes could not be recorded in the database");
            }
            if pruned.elapsed() >= PRUNE_EVERY || since_prune >= KEPT {
                pruned = tokio::time::Instant::now();
                since_prune = 0;
                if let Err(err) = self.prune_refusals().await {
                    tracing::warn!(error = %err, "old refused writes could not be deleted");
                }
            }
        }
    }

    async fn prune_refusals(&self) -> Result<(), StoreError> {
        let backend = self.backend.clone();
        super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.prune_refusals().await,
                super::Backend::Sqlite(db) => db.prune_refusals().await,
            }
        })
        .await
    }

    /// The newest refusals first, at most `limit`, as `GET /v1/admin/refusals` shows them.
    pub async fn refusals(&self, limit: u32) -> Result<Vec<Value>, StoreError> {
        let backend = self.backend.clone();
        super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.refusals(limit).await,
                super::Backend::Sqlite(db) => db.refusals(limit).await,
            }
        })
        .await
    }
}

/// One queued event's insert (events that are not refusals are never queued).
fn bind<'q, DB: sqlx::Database>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    event: &'q Event,
) -> Option<sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>>
where
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let What::Refusal(r) = &event.what else { return None };
    let presented_scope = r.presented_scope.as_ref().and_then(|s| s.as_deref());
    Some(
        query
            .bind(r.uid.as_str())
            .bind(r.kind)
            .bind(r.op)
            .bind(r.route)
            .bind(r.key.as_deref())
            .bind(r.resource.as_deref())
            .bind(r.scope.as_deref())
            .bind(presented_scope)
            .bind(r.presented_token.map(|t| t.get()))
            .bind(r.current_token.map(|t| t.get()))
            .bind(r.keys as i64)
            .bind(r.actor.as_deref())
            .bind(r.request_id.as_str())
            .bind(r.detail.as_deref()),
    )
}

/// A row of [`SELECT`] as JSON: the live event's fields, plus `at` (the database's clock) and
/// the record's `id`. Tokens as strings, as everywhere.
pub(super) fn refusal_json<'r, R: sqlx::Row>(row: &'r R) -> Result<Value, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let token = |v: Option<i64>| v.map(|t| t.to_string());
    let kind: String = row.try_get(3)?;
    let mut value = json!({
        "type": "refusal",
        "id": row.try_get::<i64, _>(0)?,
        "at": row.try_get::<String, _>(1)?,
        "uid": row.try_get::<String, _>(2)?,
        "kind": kind,
        "op": row.try_get::<String, _>(4)?,
        "route": row.try_get::<Option<String>, _>(5)?,
        "key": row.try_get::<Option<String>, _>(6)?,
        "resource": row.try_get::<Option<String>, _>(7)?,
        "scope": row.try_get::<Option<String>, _>(8)?,
        "presented_token": token(row.try_get(10)?),
        "current_token": token(row.try_get(11)?),
        "keys": row.try_get::<i64, _>(12)?,
        "actor": row.try_get::<Option<String>, _>(13)?,
        "request_id": row.try_get::<Option<String>, _>(14)?,
        "detail": row.try_get::<Option<String>, _>(15)?,
        "at_ms": row.try_get::<i64, _>(16)?,
    });
    if kind == "scope_mismatch" {
        value["presented_scope"] = json!(row.try_get::<Option<String>, _>(9)?);
    }
    Ok(value)
}

mod pg {
    use sqlx::Connection;

    use super::*;
    use crate::store::postgres::PgStore;

    impl PgStore {
        pub(crate) async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError> {
            let mut conn = self.conns.take().await?;
            let mut tx = conn.begin().await?;
            for event in events {
                if let Some(query) = bind(sqlx::query(INSERT), event) {
                    query.execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            conn.done();
            Ok(())
        }

        pub(crate) async fn prune_refusals(&self) -> Result<(), StoreError> {
            let mut conn = self.conns.take().await?;
            sqlx::query(
                "DELETE FROM fencegate_refusals
                 WHERE at < now() - $1 * interval '1 day' OR id <= (SELECT max(id) FROM fencegate_refusals) - $2",
            )
            .bind(KEPT_DAYS)
            .bind(KEPT)
            .execute(&mut *conn)
            .await?;
            conn.done();
            Ok(())
        }

        pub(crate) async fn refusals(&self, limit: u32) -> Result<Vec<Value>, StoreError> {
            let mut conn = self.conns.take().await?;
            let rows = sqlx::query(&select_pg()).bind(i64::from(limit)).fetch_all(&mut *conn).await?;
            conn.done();
            rows.iter().map(refusal_json).collect()
        }
    }
}

mod sqlite {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    impl SqliteStore {
        pub(crate) async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError> {
            let mut tx = self.pool.begin().await?;
            for event in events {
                if let Some(query) = bind(sqlx::query(INSERT), event) {
                    query.execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            Ok(())
        }

        pub(crate) async fn prune_refusals(&self) -> Result<(), StoreError> {
            sqlx::query(
                "DELETE FROM fencegate_refusals
                 WHERE at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || $1 || ' days')
                    OR id <= (SELECT max(id) FROM fencegate_refusals) - $2",
            )
            .bind(KEPT_DAYS)
            .bind(KEPT)
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        pub(crate) async fn refusals(&self, limit: u32) -> Result<Vec<Value>, StoreError> {
            let rows = sqlx::query(&select_sqlite()).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter().map(refusal_json).collect()
        }
    }
}
