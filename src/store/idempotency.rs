//! Idempotency-Key: the first outcome of a keyed write, kept WITH the write.
//!
//! A write sent with an `Idempotency-Key` runs as a transaction of its own (never through
//! PostgreSQL's coalescer): the fenced write, then the outcome row (`fencegate_idempotency`),
//! then COMMIT. Either both are there or neither: a retry whose first attempt's answer was lost
//! (a 503 during a failover, a cut connection) finds the row exactly when the write landed, and
//! gets that answer back even if a newer holder has fenced the writer out since.
//!
//! Only accepted writes are kept. A refusal (412, 409, 422) changed nothing, so a retry is
//! judged again, as if it were the first attempt: what it says is still true or more current.
//!
//! Two requests with one key at once: the second one's outcome row waits, in the database, for
//! the first one's transaction (a unique key); if the first committed, the second rolls back its
//! own write and answers the first outcome. Nothing about a key lives in fencegate's memory.
//!
//! The statements are in `pg/idempotency.rs` and `sqlite/idempotency.rs`; this module holds
//! what both share and the facade's methods.

use std::{borrow::Cow, sync::Arc};

use super::{
    BatchOp, BatchWritten, Claimed, RowWritten, Store, StoreError, TableError, Write, Written,
};
use crate::{
    fence::{FencingToken, Guard, Outcome, Scope},
    tables::TableOp,
};

/// The largest answer body kept: a write's answer is small (a batch of 1,000 ops with 512-byte
/// keys is about 600 KB); a bigger one is refused rather than kept in part.
pub const MAX_KEPT_BODY: usize = 1 << 20;
/// Expired outcome rows deleted per statement by the sweep (and statements per sweep).
const SWEEP_BATCH: i64 = 1000;
const SWEEP_ROUNDS: usize = 10;

/// Who sent a keyed write, to which route, under which key: the row's primary key. The actor is
/// part of it, so one client can never replay, or learn anything about, another's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemId {
    /// The namespaced actor (`key:NAME`, `jwt:SUB`); empty with auth off.
    pub actor: String,
    /// The method and route template (`PUT /v1/kv/{key}`).
    pub route: String,
    /// The `Idempotency-Key` header's value.
    pub key: String,
}

/// An answer as sent: status, the headers that matter, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// (lower-case name, value), in order; static when fencegate wrote them (no allocation per
    /// request), owned when read back from a kept row.
    pub headers: Vec<(Cow<'static, str>, Cow<'static, str>)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub(super) fn headers_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        serde_json::Value::Object(map).to_string()
    }

    pub(super) fn from_row(status: i64, headers: &str, body: Vec<u8>) -> Result<Self, StoreError> {
        let corrupt =
            || StoreError::Corrupt("an idempotency row's headers are not a JSON object".into());
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(headers).map_err(|_| corrupt())?;
        let headers = map
            .into_iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (Cow::Owned(k), Cow::Owned(v.to_owned())))
                    .ok_or_else(corrupt)
            })
            .collect::<Result<_, _>>()?;
        let status = u16::try_from(status).map_err(|_| {
            StoreError::Corrupt("an idempotency row's status is out of range".into())
        })?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

/// What a keyed write did, for the handler's renderer to turn into its answer.
pub enum Done<'a> {
    Kv(&'a [Written]),
    Mixed(&'a BatchWritten),
    Row(&'a RowWritten),
    Claim(&'a Claimed),
}

/// Turns what a write did into the answer the client gets (the handler's own rendering).
pub type Render = Arc<dyn Fn(Done<'_>) -> Answer + Send + Sync>;

/// A keyed write's key, its request's fingerprint, how long to keep it, and how to render its
/// answer inside the write's transaction.
#[derive(Clone)]
pub struct Keep {
    pub id: IdemId,
    /// Hex SHA-256 of the request (`http::idempotency`).
    pub fingerprint: String,
    pub ttl_ms: i64,
    pub render: Render,
}

impl Keep {
    /// The answer to keep for `done`, if it fits ([`MAX_KEPT_BODY`]).
    pub(super) fn answer(&self, done: Done<'_>) -> Result<Answer, StoreError> {
        let answer = (self.render)(done);
        if answer.body.len() > MAX_KEPT_BODY {
            return Err(StoreError::Unkeepable(format!(
                "its answer ({} bytes) is larger than an Idempotency-Key can keep ({MAX_KEPT_BODY} bytes): send fewer \
                 ops per request, or send it without the key",
                answer.body.len()
            )));
        }
        Ok(answer)
    }
}

/// A kept outcome, as looked up.
pub(super) struct Kept {
    pub fingerprint: String,
    pub answer: Answer,
}

impl Kept {
    /// A kept outcome from either backend's row: fingerprint, status, headers (a JSON object
    /// of strings), body.
    pub(super) fn from_row<'r, R: sqlx::Row>(row: &'r R) -> Result<Kept, StoreError>
    where
        usize: sqlx::ColumnIndex<R>,
        String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        &'r str: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Kept {
            fingerprint: row.try_get(0)?,
            answer: Answer::from_row(row.try_get(1)?, row.try_get(2)?, row.try_get(3)?)?,
        })
    }
}

/// How a keyed write ended.
pub enum Keyed<T> {
    /// Not seen before (or expired): the write was judged now (and, if accepted, kept).
    Fresh(Outcome<T>),
    /// The same key and the same request were accepted before: the first answer.
    Replayed(Answer),
    /// The same key came with another request: nothing was done.
    Reused,
}

impl Store {
    /// The kept outcome under `keep.id`, if any, judged against this request.
    async fn prior<T>(&self, keep: &Keep) -> Result<Option<Keyed<T>>, StoreError> {
        let id = keep.id.clone();
        let kept = detached!(self, b => b.kept(&id).await)?;
        Ok(kept.map(|kept| {
            if kept.fingerprint == keep.fingerprint {
                metrics::counter!("fencegate_idempotent_replays_total").increment(1);
                Keyed::Replayed(kept.answer)
            } else {
                Keyed::Reused
            }
        }))
    }

    /// Runs a keyed write: the kept outcome if there is one, else `run` (which keeps its
    /// outcome in its transaction). If `run` lost the race to a concurrent request with the same
    /// key (its outcome row found one committed: `Raced`), that request's outcome.
    async fn keyed<T, E>(
        &self,
        keep: &Keep,
        run: impl std::future::Future<Output = Result<Outcome<T>, E>>,
    ) -> Result<Keyed<T>, E>
    where
        E: From<StoreError> + AsRaced,
    {
        if let Some(prior) = self.prior(keep).await? {
            return Ok(prior);
        }
        match run.await {
            Ok(outcome) => Ok(Keyed::Fresh(outcome)),
            Err(err) if err.is_raced() => match self.prior(keep).await? {
                Some(prior) => Ok(prior),
                None => Err(err),
            },
            Err(err) => Err(err),
        }
    }

    /// A keyed kv write. Skips the reject-only cache: a retry of an accepted write must find
    /// its outcome although the cache knows a newer fence by now.
    pub async fn write_keyed(
        &self,
        write: Write,
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Keyed<Written>, StoreError> {
        let keyed = self
            .batch_keyed(std::slice::from_ref(&write), guard, keep)
            .await?;
        Ok(match keyed {
            Keyed::Fresh(outcome) => Keyed::Fresh(only(outcome)),
            Keyed::Replayed(answer) => Keyed::Replayed(answer),
            Keyed::Reused => Keyed::Reused,
        })
    }

    /// A keyed kv batch: every write or none, and the outcome with them.
    pub async fn batch_keyed(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Keyed<Vec<Written>>, StoreError> {
        let (owned_writes, owned_guard, owned_keep) =
            (writes.to_vec(), guard.clone(), keep.clone());
        let run = async {
            let outcome =
                detached!(self, b => b.batch_kept(&owned_writes, &owned_guard, &owned_keep).await);
            self.pressure.observe(&outcome);
            outcome
        };
        self.keyed(keep, run).await
    }

    /// A keyed claim (`POST /v1/fences/{scope}`).
    pub async fn claim_keyed(
        &self,
        scope: &Scope,
        token: FencingToken,
        keep: &Keep,
    ) -> Result<Keyed<Claimed>, StoreError> {
        let (owned_scope, owned_keep) = (scope.clone(), keep.clone());
        let run = async {
            let outcome =
                detached!(self, b => b.claim_kept(&owned_scope, token, &owned_keep).await);
            self.pressure.observe(&outcome);
            outcome
        };
        self.keyed(keep, run).await
    }

    /// A keyed write to a legacy table's row.
    pub async fn table_write_keyed(
        &self,
        op: &TableOp,
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Keyed<RowWritten>, TableError> {
        let (op, owned_guard, owned_keep) = (op.clone(), guard.clone(), keep.clone());
        let run = async {
            let outcome =
                detached!(self, b => b.table_write_kept(&op, &owned_guard, &owned_keep).await);
            self.pressure.observe(&outcome);
            outcome
        };
        self.keyed(keep, run).await
    }

    /// A keyed batch with table ops.
    pub async fn batch_tables_keyed(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Keyed<BatchWritten>, TableError> {
        let (ops, owned_guard, owned_keep) = (ops.to_vec(), guard.clone(), keep.clone());
        let run = async {
            let outcome =
                detached!(self, b => b.batch_tables_kept(&ops, &owned_guard, &owned_keep).await);
            self.pressure.observe(&outcome);
            outcome
        };
        self.keyed(keep, run).await
    }

    /// Deletes expired outcome rows, in bounded batches (the server's tick calls this): at most
    /// `SWEEP_ROUNDS` statements of `SWEEP_BATCH` rows each, so a backlog is worked off over a
    /// few ticks without a long statement. Returns the rows deleted.
    pub async fn sweep_idempotency(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for _ in 0..SWEEP_ROUNDS {
            let n = detached!(self, b => b.sweep_idempotency(SWEEP_BATCH).await)?;
            deleted += n;
            if n < SWEEP_BATCH as u64 {
                break;
            }
        }
        Ok(deleted)
    }
}

/// The one write of a batch of one.
fn only(outcome: Outcome<Vec<Written>>) -> Outcome<Written> {
    match outcome {
        Outcome::Accepted(mut written) => Outcome::Accepted(written.remove(0)),
        Outcome::Stale(stale) => Outcome::Stale(stale),
        Outcome::Mismatch(refused) => Outcome::Mismatch(refused),
        Outcome::NotIssued(refused) => Outcome::NotIssued(refused),
        Outcome::Jump(refused) => Outcome::Jump(refused),
    }
}

/// Whether an error says a keyed write lost the race to a concurrent request with its key.
pub trait AsRaced {
    fn is_raced(&self) -> bool;
}

impl AsRaced for StoreError {
    fn is_raced(&self) -> bool {
        matches!(self, StoreError::Raced(_))
    }
}

impl AsRaced for TableError {
    fn is_raced(&self) -> bool {
        matches!(self, TableError::Store(StoreError::Raced(_)))
    }
}

/// The error a keyed write's transaction returns (and so rolls back) when its outcome row
/// found another request's, committed meanwhile with the same key.
pub(super) fn lost_race() -> StoreError {
    StoreError::Raced(
        "another request with the same Idempotency-Key was being applied at the same time".into(),
    )
}

/// Writes sent with an `Idempotency-Key`: each a transaction with its outcome row
/// (`idempotency.rs`; `store::idempotency` says how).
pub(in crate::store) trait IdempotencyStore {
    /// The unexpired outcome kept under `id`, if any.
    async fn kept(&self, id: &IdemId) -> Result<Option<Kept>, StoreError>;

    /// A kv batch (or a single write: a batch of one) and, if accepted, its outcome.
    async fn batch_kept(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<Vec<Written>>, StoreError>;

    async fn claim_kept(
        &self,
        scope: &Scope,
        token: FencingToken,
        keep: &Keep,
    ) -> Result<Outcome<Claimed>, StoreError>;

    async fn table_write_kept(
        &self,
        op: &TableOp,
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<RowWritten>, TableError>;

    async fn batch_tables_kept(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<BatchWritten>, TableError>;

    /// Deletes at most `limit` expired outcome rows; how many it deleted.
    async fn sweep_idempotency(&self, limit: i64) -> Result<u64, StoreError>;
}
