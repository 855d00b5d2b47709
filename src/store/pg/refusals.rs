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
        refusals::{bind, KEPT, KEPT_DAYS},
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

    async fn prune_refusals(&self) -> Result<(), StoreError> {
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

    async fn refusals(&self, limit: u32) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conns.take().await?;
        let rows = sqlx::query(SELECT)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
        conn.done();
        rows.iter().map(refusal_json).collect()
    }
}
