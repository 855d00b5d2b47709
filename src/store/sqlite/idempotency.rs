//! Writes sent with an `Idempotency-Key`, on SQLite: the outcome row's statements and the
//! keyed claim (`store::idempotency` says what is kept and why; the keyed kv writes are
//! `kv.rs`'s batch with its outcome row). The one connection serializes transactions, so a
//! second request with a key in flight simply runs after the first and finds its outcome.

use sqlx::SqliteConnection;

use super::{SqliteStore, NOW_MS};
use crate::{
    fence::{FencingToken, Guard, Outcome, Rule, Scope, Target},
    store::{
        backend::{IdempotencyStore, TableStore as _},
        idempotency::{lost_race, Done, IdemId, Keep, Kept},
        BatchOp, BatchWritten, Claimed, RowWritten, StoreError, TableError, Write, Written,
    },
    tables::TableOp,
};

/// The outcome row, inside the write's transaction; an expired row with the same key is
/// replaced, a live one returns no row (and the caller rolls its write back).
fn keep_sql() -> String {
    format!(
        "INSERT INTO fencegate_idempotency
             (actor, route, key, fingerprint, status, headers, body, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW_MS} + ?8)
         ON CONFLICT (actor, route, key) DO UPDATE SET fingerprint = excluded.fingerprint,
             status = excluded.status, headers = excluded.headers, body = excluded.body,
             expires_at = excluded.expires_at
         WHERE fencegate_idempotency.expires_at <= {NOW_MS}
         RETURNING 1"
    )
}

/// Writes `done`'s outcome row in the caller's transaction; `Raced` if a live row has the key.
pub(super) async fn keep_in(
    tx: &mut SqliteConnection,
    keep: &Keep,
    done: Done<'_>,
) -> Result<(), StoreError> {
    let answer = keep.answer(done)?;
    let kept: Option<i64> = sqlx::query_scalar(&keep_sql())
        .bind(&keep.id.actor)
        .bind(&keep.id.route)
        .bind(&keep.id.key)
        .bind(&keep.fingerprint)
        .bind(i64::from(answer.status))
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

impl IdempotencyStore for SqliteStore {
    async fn kept(&self, id: &IdemId) -> Result<Option<Kept>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT fingerprint, status, headers, body FROM fencegate_idempotency
             WHERE actor = ?1 AND route = ?2 AND key = ?3 AND expires_at > {NOW_MS}"
        ))
        .bind(&id.actor)
        .bind(&id.route)
        .bind(&id.key)
        .fetch_optional(&self.pool)
        .await?;
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

    /// The claim and its outcome row in one transaction (an unkeyed claim is one statement).
    async fn claim_kept(
        &self,
        scope: &Scope,
        token: FencingToken,
        keep: &Keep,
    ) -> Result<Outcome<Claimed>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let version: Option<i64> = sqlx::query_scalar(&self.sql.inclusive.claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(version) = version {
            let claimed = Claimed {
                created: version == 1,
            };
            keep_in(&mut tx, keep, Done::Claim(&claimed)).await?;
            tx.commit().await?;
            return Ok(Outcome::Accepted(claimed));
        }
        tx.rollback().await?;
        let guard = Guard {
            token,
            target: Target::Scope(scope.clone()),
            rule: Rule::Inclusive,
        };
        Ok(self.refusal(&[], &guard).await?.outcome())
    }

    /// No legacy tables on SQLite: refused as without a key.
    async fn table_write_kept(
        &self,
        op: &TableOp,
        guard: &Guard,
        _keep: &Keep,
    ) -> Result<Outcome<RowWritten>, TableError> {
        self.table_write(op, guard).await
    }

    async fn batch_tables_kept(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
        _keep: &Keep,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        self.batch_tables(ops, guard).await
    }

    async fn sweep_idempotency(&self, limit: i64) -> Result<u64, StoreError> {
        let deleted = sqlx::query(&format!(
            "DELETE FROM fencegate_idempotency WHERE rowid IN (
                 SELECT rowid FROM fencegate_idempotency WHERE expires_at <= {NOW_MS} LIMIT ?1)"
        ))
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(deleted)
    }
}
