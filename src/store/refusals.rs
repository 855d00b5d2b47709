//! Refused writes kept for operators, in the database (`fencegate_refusals`): every process
//! serving it writes its own and reads everyone's, across restarts. Bounded: the newest
//! [`KEPT`], at most [`KEPT_DAYS`] days old.
//!
//! Written off the request path: the refusal is queued (`events::Events::record_to`) and a
//! task of the store writes what is queued in one transaction at a time, so a flood of stale
//! writes costs the database one insert per refusal at most, never a round trip per request.
//!
//! The statements are in `pg/refusals.rs` and `sqlite/refusals.rs`; a record is read back as
//! JSON by `decode::refusal_json`.

use std::{sync::Arc, time::Duration};

use serde_json::Value;

use super::{backend::RefusalStore as _, Store, StoreError};
use crate::events::{Event, What};

/// Refusals kept: the newest this many ...
pub const KEPT: i64 = 10_000;
/// ... and none older than this.
pub const KEPT_DAYS: i64 = 7;
/// Most refusals written in one transaction.
const BATCH: usize = 256;
/// How often the old ones are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

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
            let events = std::mem::take(&mut batch);
            let written = detached!(self, b => b.insert_refusals(&events).await);
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
        detached!(self, b => b.prune_refusals().await)
    }

    /// The newest refusals first, at most `limit`, as `GET /v1/admin/refusals` shows them.
    pub async fn refusals(&self, limit: u32) -> Result<Vec<Value>, StoreError> {
        detached!(self, b => b.refusals(limit).await)
    }
}

/// Binds one queued event to a backend's insert of a refusal record, whose parameters are,
/// in order: `$1` uid, `$2` kind, `$3` op, `$4` route, `$5` key, `$6` resource, `$7` scope,
/// `$8` presented_scope, `$9` presented_token, `$10` current_token, `$11` keys, `$12` actor,
/// `$13` request_id, `$14` detail. `None` for an event that is not a refusal (never queued).
pub(in crate::store) fn bind<'q, DB: sqlx::Database>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    event: &'q Event,
) -> Option<sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>>
where
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let What::Refusal(r) = &event.what else {
        return None;
    };
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
