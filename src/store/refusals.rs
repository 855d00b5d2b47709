//! Refused writes kept for operators, in the database (`fencegate_refusals`): every process
//! serving it writes its own and reads everyone's, across restarts. Bounded: at most
//! `database.refusals_kept` records, none older than [`KEPT_DAYS`] days, and fair per actor:
//! one actor's flood of refusals cannot evict another actor's. When there are more, each
//! actor keeps its newest `n`, for the largest `n` within the bound (an actor with fewer keeps
//! them all); `None` (auth off) is one actor.
//!
//! Written off the request path: the refusal is queued (`events::RefusalQueue`, fair per actor
//! too) and a task of the store writes what is queued in one transaction at a time, so a flood
//! of stale writes costs the database one insert per refusal at most, never a round trip per
//! request.
//!
//! The statements are in `pg/refusals.rs` and `sqlite/refusals.rs`; a record is read back as
//! JSON by `decode::refusal_json`.

use std::{sync::Arc, time::Duration};

use serde_json::Value;

use super::{Store, StoreError};
use crate::events::{Event, RefusalQueue, What};

/// Refusals kept: none older than this.
pub const KEPT_DAYS: i64 = 7;
/// Most refusals written in one transaction.
const BATCH: usize = 256;
/// How often the old ones are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl Store {
    /// Writes the refusals `queue` brings, for as long as the server runs. Failures are logged
    /// and the batch dropped (the database being away is what 503s already say; refusals are a
    /// record, not a guarantee). Prunes to `kept` (`database.refusals_kept`) every minute.
    pub async fn record_refusals(self, queue: Arc<RefusalQueue>, kept: u32) {
        let kept = i64::from(kept);
        let mut pruned = tokio::time::Instant::now();
        // Written since the last prune: a flood of refusals is pruned as often as it fills the
        // table, not only once a minute.
        let mut since_prune = 0i64;
        loop {
            let events = queue.take(BATCH).await;
            since_prune += events.len() as i64;
            let written = detached!(self, b => b.insert_refusals(&events).await);
            if let Err(err) = written {
                tracing::warn!(error = %err, "refused writes could not be recorded in the database");
            }
            if pruned.elapsed() >= PRUNE_EVERY || since_prune >= kept {
                pruned = tokio::time::Instant::now();
                since_prune = 0;
                if let Err(err) = detached!(self, b => b.prune_refusals(kept).await) {
                    tracing::warn!(error = %err, "old refused writes could not be deleted");
                }
            }
        }
    }

    /// The newest refusals first that `filter` admits, at most its `limit`, as
    /// `GET /v1/admin/refusals` shows them.
    pub async fn refusals(&self, filter: RefusalFilter) -> Result<Vec<Value>, StoreError> {
        detached!(self, b => b.refusals(&filter).await)
    }
}

/// Which refusal records `GET /v1/admin/refusals` lists: each field that is set must match.
#[derive(Debug, Clone, Default)]
pub struct RefusalFilter {
    pub limit: u32,
    pub key: Option<String>,
    pub scope: Option<String>,
    /// The namespaced actor (`key:NAME`, `jwt:SUB`, ...).
    pub actor: Option<String>,
    /// `stale`, `not_issued`, `jump`, `scope_mismatch` or `bad_proof`.
    pub kind: Option<String>,
    /// Recorded at or after this instant, in milliseconds since the Unix epoch.
    pub since_ms: Option<i64>,
}

/// The fair prune (module docs), spelt once for both backends: rows past `$1` days old, and
/// the rows past the bound `$2` when each actor's rows are ranked newest first and every
/// actor's first rows are kept before anyone's second.
pub(in crate::store) fn prune_sql(older_than_days: &str) -> String {
    format!(
        "DELETE FROM fencegate_refusals WHERE {older_than_days} OR id IN (
             SELECT id FROM (
                 SELECT id, row_number() OVER (ORDER BY n, id DESC) AS k FROM (
                     SELECT id, row_number() OVER (PARTITION BY actor ORDER BY id DESC) AS n
                     FROM fencegate_refusals
                 ) AS per_actor
             ) AS ranked WHERE k > $2
         )"
    )
}

/// The `WHERE` of a filtered listing, for both backends: `$2` key, `$3` scope, `$4` actor,
/// `$5` kind, each NULL or to match; `since` the condition on `$6` (NULL: any time).
pub(in crate::store) fn filter_sql(since: &str) -> String {
    format!(
        "($2 IS NULL OR key = $2) AND ($3 IS NULL OR scope = $3) AND ($4 IS NULL OR actor = $4)
         AND ($5 IS NULL OR kind = $5) AND ($6 IS NULL OR {since})"
    )
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

/// Refused writes kept for operators (`refusals.rs`).
pub(in crate::store) trait RefusalStore {
    /// Records the queued refusals, in one transaction.
    async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError>;

    /// Deletes any older than `refusals::KEPT_DAYS`, and all but `kept`, fairly per actor
    /// (`refusals::prune_sql`).
    async fn prune_refusals(&self, kept: i64) -> Result<(), StoreError>;

    /// The newest refusals first that `filter` admits, at most its `limit`.
    async fn refusals(&self, filter: &RefusalFilter) -> Result<Vec<Value>, StoreError>;
}
