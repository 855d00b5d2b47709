//! Refused writes kept for operators, on SQLite (see `store::refusals`: what is kept, and how
//! it is written off the request path). `at` is RFC 3339 text (SQLite has no timestamp type).

use std::sync::Arc;

use serde_json::Value;

use super::SqliteStore;
use crate::{
    events::Event,
    store::{
        backend::RefusalStore,
        decode::refusal_json,
        refusals::{bind, filter_sql, prune_sql, RefusalFilter, KEPT_DAYS},
        StoreError,
    },
};

/// One refusal record; the parameters as `store::refusals::bind` numbers them.
const INSERT: &str = "INSERT INTO fencegate_refusals
    (uid, kind, op, route, key, resource, scope, presented_scope, presented_token, current_token, keys, actor, request_id, detail)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// The newest records, `$1` at most, as `decode::refusal_json` reads them: `at` as stored,
/// and as milliseconds since the epoch (from the Julian day).
pub(super) const SELECT: &str = "SELECT id, at, uid, kind, op, route, key, resource, scope, presented_scope, presented_token,
    current_token, keys, actor, request_id, detail, CAST(round((julianday(at) - 2440587.5) * 86400000) AS INTEGER)
    FROM fencegate_refusals ORDER BY id DESC LIMIT $1";

/// As [`SELECT`], only the records the filter admits (`store::refusals::filter_sql`: `$2` key,
/// `$3` scope, `$4` actor, `$5` kind, `$6` since, in milliseconds).
fn select_filtered() -> String {
    SELECT.replace(
        "FROM fencegate_refusals ORDER BY",
        &format!(
            "FROM fencegate_refusals WHERE {} ORDER BY",
            filter_sql("CAST(round((julianday(at) - 2440587.5) * 86400000) AS INTEGER) >= $6")
        ),
    )
}

impl RefusalStore for SqliteStore {
    async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for event in events {
            if let Some(query) = bind(sqlx::query(INSERT), event) {
                query.execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn prune_refusals(&self, kept: i64) -> Result<(), StoreError> {
        sqlx::query(&prune_sql(
            "at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || $1 || ' days')",
        ))
        .bind(KEPT_DAYS)
        .bind(kept)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn refusals(&self, filter: &RefusalFilter) -> Result<Vec<Value>, StoreError> {
        let rows = sqlx::query(&select_filtered())
            .bind(i64::from(filter.limit))
            .bind(filter.key.as_deref())
            .bind(filter.scope.as_deref())
            .bind(filter.actor.as_deref())
            .bind(filter.kind.as_deref())
            .bind(filter.since_ms)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(refusal_json).collect()
    }
}
