//! Writes sent with an `Idempotency-Key`, on PostgreSQL: the outcome row's statements, and the
//! keyed paths (`store::idempotency` says what is kept and why). A keyed write never goes
//! through the coalescer: it is a transaction of its own, the fenced write and then its outcome
//! row, so the two commit together or not at all.

use sqlx::Connection;

use super::PgStore;
use crate::{
    fence::{FencingToken, Guard, Outcome, Scope},
    store::{
        backend::IdempotencyStore,
        idempotency::{lost_race, Done, IdemId, Keep, Kept},
        BatchOp, BatchWritten, Claimed, RowWritten, StoreError, TableError, Write, Written,
    },
    tables::TableOp,
};

/// The unexpired outcome under (actor, route, key).
const KEPT: &str = "SELECT fingerprint, status::int8, headers, body FROM fencegate_idempotency
    WHERE actor = $1 AND route = $2 AND key = $3 AND expires_at > now()";

/// The outcome row, inside the write's transaction. An expired row with the same key is
/// replaced; a live one (another request's, committed meanwhile: the insert waited for it)
/// returns no row, and the caller rolls its write back.
const KEEP: &str = "INSERT INTO fencegate_idempotency AS i
        (actor, route, key, fingerprint, status, headers, body, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 millisecond')
    ON CONFLICT (actor, route, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
        status = EXCLUDED.status, headers = EXCLUDED.headers, body = EXCLUDED.body,
        expires_at = EXCLUDED.expires_at
    WHERE i.expires_at <= now()
    RETURNING true";

/// At most `$1` expired rows (the sweep repeats it, see `store::idempotency`).
const SWEEP: &str = "DELETE FROM fencegate_idempotency WHERE (actor, route, key) IN (
    SELECT actor, route, key FROM fencegate_idempotency WHERE expires_at <= now() LIMIT $1)";

/// Writes `done`'s outcome row in the caller's transaction; `Raced` if another request with the
/// same key committed first (then the caller must not commit).
pub(super) async fn keep_in(
    tx: &mut sqlx::PgConnection,
    keep: &Keep,
    done: Done<'_>,
) -> Result<(), StoreError> {
    let answer = keep.answer(done)?;
    let kept: Option<bool> = sqlx::query_scalar(KEEP)
        .bind(&keep.id.actor)
        .bind(&keep.id.route)
        .bind(&keep.id.key)
        .bind(&keep.fingerprint)
        .bind(i16::try_from(answer.status).unwrap_or(500))
        .bind(answer.headers_json())
        .bind(&answer.body)
        .bind(keep.ttl_ms)
        .fetch_optional(&mut *tx)
        .await?;
    match kept {
        Some(_) => Ok(()),
        None => Err(lost_race()),
    }
}

impl IdempotencyStore for PgStore {
    async fn kept(&self, id: &IdemId) -> Result<Option<Kept>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(KEPT)
            .bind(&id.actor)
            .bind(&id.route)
            .bind(&id.key)
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        row.as_ref().map(Kept::from_row).transpose()
    }

    async fn batch_kept(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<Vec<Written>>, StoreError> {
        self.batch_with(writes, guard, Some(keep)).await
    }

    async fn claim_kept(
        &self,
        scope: &Scope,
        token: FencingToken,
        keep: &Keep,
    ) -> Result<Outcome<Claimed>, StoreError> {
        let gate = self.gates.pass(scope).await?;
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let claimed = self
            .claim_scope(&mut tx, scope, token, crate::fence::Rule::Inclusive)
            .await?;
        let outcome = match claimed {
            Ok(version) => {
                let claimed = Claimed {
                    created: version == 1,
                };
                keep_in(&mut tx, keep, Done::Claim(&claimed)).await?;
                tx.commit().await?;
                Outcome::Accepted(claimed)
            }
            Err(refusal) => {
                tx.rollback().await?;
                refusal.outcome()
            }
        };
        conn.done();
        drop(gate);
        Ok(outcome)
    }

    async fn table_write_kept(
        &self,
        op: &TableOp,
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<RowWritten>, TableError> {
        self.table_write_with(op, guard, Some(keep)).await
    }

    async fn batch_tables_kept(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        self.apply_batch(ops, guard, Some(keep)).await
    }

    async fn sweep_idempotency(&self, limit: i64) -> Result<u64, StoreError> {
        let mut conn = self.conns.take().await?;
        let deleted = sqlx::query(SWEEP)
            .bind(limit)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        conn.done();
        Ok(deleted)
    }
}
