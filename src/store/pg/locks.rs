//! The built-in lease service on PostgreSQL: grants that claim their scope in the same
//! transaction, renewals and releases by the current token.
//!
//! Differences from SQLite (`sqlite/locks.rs`), and why: an acquire locks the scope's fence
//! row before it decides, and may try the grant twice, because other connections and processes
//! acquire, release and claim concurrently; SQLite's one connection and one writer leave
//! nothing to lock against. Leases are `timestamptz` on the database's clock (SQLite keeps
//! milliseconds from this machine's), and a release is one statement (a CTE reads the owner
//! before the update clears it; SQLite's is a transaction of two).

use sqlx::{Connection, Row};

use super::{
    sql::{ACQUIRE, ENSURE_FENCE, FENCE_FOR_UPDATE, HOLDER, LOCK_TOKEN_AND_CLOCK, RELEASE, RENEW},
    PgStore,
};
use crate::{
    fence::{FencingToken, Scope},
    locks::{Acquired, Holder, Lease, Ttl},
    store::{backend::LockStore, holder_from, token_from_db, StoreError},
};

impl LockStore for PgStore {
    /// Grants the lock `name` if it is free or expired, and claims its scope, in one
    /// transaction whose every step reads the same instant, under the locks it needs, so there
    /// is nothing to race: the fence row is locked first (created at 0 if the scope has none,
    /// undone unless the grant commits), then the clock is read once, then the grant decides
    /// on the lock row, which it locks whether or not it grants. Not granted means the lock is
    /// held at that instant, and the holder is read under the same lock at the same instant.
    async fn acquire(
        &self,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        let _gate = self.gates.pass(name).await?;
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let acquired = self.acquire_in(&mut tx, name, owner, ttl, actor).await?;
        match acquired {
            Acquired::Granted(_) => tx.commit().await?,
            Acquired::Held(_) | Acquired::Exhausted => tx.rollback().await?,
        }
        conn.done();
        Ok(acquired)
    }

    /// `None` if `token` does not hold the lease (expired, released, taken over), or `actor`
    /// is given and another actor took it.
    async fn renew(
        &self,
        name: &Scope,
        token: FencingToken,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(RENEW)
            .bind(name.as_str())
            .bind(token.get())
            .bind(ttl.ms())
            .bind(actor)
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        lease_from(name, token, row)
    }

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    async fn release(
        &self,
        name: &Scope,
        token: FencingToken,
        actor: Option<&str>,
    ) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(RELEASE)
            .bind(name.as_str())
            .bind(token.get())
            .bind(actor)
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        lease_from(name, token, row)
    }

    async fn holder(&self, name: &Scope) -> Result<Option<Holder>, StoreError> {
        let mut conn = self.conns.take().await?;
        let holder = holder_on(&mut conn, name, None).await?;
        conn.done();
        Ok(holder)
    }
}

impl PgStore {
    async fn acquire_in(
        &self,
        tx: &mut sqlx::PgConnection,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        sqlx::query(ENSURE_FENCE)
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
        // Claims of this scope now wait for our grant: the fence stays as read.
        let fence: i64 = sqlx::query_scalar(FENCE_FOR_UPDATE)
            .bind(name.as_str())
            .fetch_one(&mut *tx)
            .await?;
        // Now that the fence row is ours: the lock's latest grant (stable: every acquire of
        // this name takes the fence row first) and one reading of the clock, at which the grant
        // and, if it refuses, the holder are judged (so waiting for the row does not shorten
        // the lease). The next token exceeds both the fence and every earlier grant (which an
        // admin reset may have left above the fence): none is left when either is the maximum.
        let (latest, at, owned): (Option<i64>, i64, bool) = sqlx::query_as(LOCK_TOKEN_AND_CLOCK)
            .bind(name.as_str())
            .fetch_one(&mut *tx)
            .await?;
        if fence.max(latest.unwrap_or(0)) == i64::MAX {
            return Ok(Acquired::Exhausted);
        }
        // Twice at most: a release that committed between the grant's refusal and the holder
        // read (were the row not locked by the refusal) makes the lock free for the second.
        for _ in 0..2 {
            let granted = sqlx::query(ACQUIRE)
                .bind(name.as_str())
                .bind(owner)
                .bind(ttl.ms())
                .bind(fence)
                .bind(actor)
                .bind(at)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = granted else {
                match holder_on(&mut *tx, name, Some(at)).await? {
                    Some(holder) => return Ok(Acquired::Held(holder)),
                    None => continue,
                }
            };
            let token = token_from_db(row.try_get(0)?)?;
            // The grant claims the scope through the same statement as POST /v1/fences; the
            // fence row is locked and the token exceeds it, so the claim cannot be refused.
            let claimed: Option<i64> = sqlx::query_scalar(&self.sql.inclusive.grant_claim)
                .bind(name.as_str())
                .bind(token.get())
                .fetch_optional(&mut *tx)
                .await?;
            if claimed.is_none() {
                return Err(StoreError::Corrupt(format!(
                    "the grant of lock {name} could not claim its scope"
                )));
            }
            let expires_at = row.try_get(1)?;
            if owned {
                crate::store::count_takeover();
            }
            return Ok(Acquired::Granted(Lease {
                name: name.clone(),
                owner: owner.to_owned(),
                token,
                expires_at,
            }));
        }
        Err(StoreError::Corrupt(format!(
            "lock {name} is neither free nor held under its row lock"
        )))
    }
}

/// Who holds the lock `name` at `at` (microseconds of [`LOCK_TOKEN_AND_CLOCK`]; `None`: `now()`), if anyone.
async fn holder_on(
    conn: &mut sqlx::PgConnection,
    name: &Scope,
    at: Option<i64>,
) -> Result<Option<Holder>, StoreError> {
    let row = sqlx::query(HOLDER)
        .bind(name.as_str())
        .bind(at)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(holder_from).transpose()
}

/// A lease from a RENEW/RELEASE row (owner, expires_at).
fn lease_from(
    name: &Scope,
    token: FencingToken,
    row: Option<sqlx::postgres::PgRow>,
) -> Result<Option<Lease>, StoreError> {
    row.map(|row| {
        Ok(Lease {
            name: name.clone(),
            owner: row.try_get(0)?,
            token,
            expires_at: row.try_get(1)?,
        })
    })
    .transpose()
}
