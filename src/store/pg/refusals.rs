//! Refused writes kept for operators, on PostgreSQL (see `store::refusals`: what is kept, and
//! how it is written off the request path).

use std::sync::Arc;

use serde_json::Value;
use sqlx::Connection;

use super::PgStore;
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

/// The newest records, `$1` at most, as `decode::refusal_json` reads them: `at` as RFC 3339
/// text and as milliseconds.
pub(super) const SELECT: &str = "SELECT id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), uid, kind,
    op, route, key, resource, scope, presented_scope, presented_token, current_token, keys, actor, request_id, detail,
    (extract(epoch FROM at) * 1000)::int8 FROM fencegate_refusals ORDER BY id DESC LIMIT $1";

/// As [`SELECT`], only the records the filter admits (`store::refusals::filter_sql`: `$2` key,
/// `$3` scope, `$4` actor, `$5` kind, `$6` since, in milliseconds).
fn select_filtered() -> String {
    SELECT.replace(
        "FROM fencegate_refusals ORDER BY",
        &format!(
            "FROM fencegate_refusals WHERE {} ORDER BY",
            filter_sql("at >= to_timestamp($6 / 1000.0)")
        ),
    )
}

impl RefusalStore for PgStore {
    async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError> {
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

    async fn prune_refusals(&self, kept: i64) -> Result<(), StoreError> {
        let mut conn = self.conns.take().await?;
        sqlx::query(&prune_sql("at < now() - $1 * interval '1 day'"))
            .bind(KEPT_DAYS)
            .bind(kept)
            .execute(&mut *conn)
            .await?;
        conn.done();
        Ok(())
    }

    async fn refusals(&self, filter: &RefusalFilter) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conns.take().await?;
        let rows = sqlx::query(&select_filtered())
            .bind(i64::from(filter.limit))
            .bind(filter.key.as_deref())
            .bind(filter.scope.as_deref())
            .bind(filter.actor.as_deref())
            .bind(filter.kind.as_deref())
            .bind(filter.since_ms)
            .fetch_all(&mut *conn)
            .await?;
        conn.done();
        rows.iter().map(refusal_json).collect()
    }
}
