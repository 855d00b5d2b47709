//! The built-in lease service on SQLite: grants that claim their scope in the same
//! transaction, renewals and releases by the current token. Leases are kept in milliseconds
//! on this machine's clock (SQLite's `now`), where PostgreSQL keeps timestamps on its own.
//!
//! No row locks and no retry, where PostgreSQL (`pg/locks.rs`) locks the fence row first and
//! tries a grant twice: the store's one connection runs one transaction at a time, and SQLite's
//! write lock keeps out other processes, so nothing can change between a refused grant and the
//! read of its holder.

use sqlx::{Row, SqliteConnection};

use super::{ms_to_text, SqliteStore, NOW_MS, NOW_TEXT};
use crate::{
    fence::{FencingToken, Scope},
    locks::{Acquired, Holder, Lease, Ttl},
    store::{backend::LockStore, holder_from, token_from_db, StoreError},
};

impl LockStore for SqliteStore {
    /// Grants the lock `name` if it is free or expired, and claims its scope, in one
    /// transaction that reads the clock once: the grant and, if it refuses, the holder are
    /// judged at the same instant, so "not granted" always finds the holder. (The single
    /// connection serializes transactions: nothing else runs in between.)
    async fn acquire(
        &self,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        let mut tx = self.pool.begin().await?;
        let acquired = self.acquire_in(&mut tx, name, owner, ttl, actor).await?;
        match acquired {
            Acquired::Granted(_) => tx.commit().await?,
            Acquired::Held(_) | Acquired::Exhausted => tx.rollback().await?,
        }
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
        let sql = format!(
            "UPDATE fencegate_locks SET expires_at_ms = {NOW_MS} + ?3
             WHERE name = ?1 AND token = ?2 AND owner IS NOT NULL AND expires_at_ms > {NOW_MS}
                 AND (?4 IS NULL OR actor IS NULL OR actor = ?4)
             RETURNING owner, {}",
            ms_to_text("expires_at_ms")
        );
        let row = sqlx::query(&sql)
            .bind(name.as_str())
            .bind(token.get())
            .bind(ttl.ms())
            .bind(actor)
            .fetch_optional(&self.pool)
            .await?;
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

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    async fn release(
        &self,
        name: &Scope,
        token: FencingToken,
        actor: Option<&str>,
    ) -> Result<Option<Lease>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "SELECT owner FROM fencegate_locks WHERE name = ?1 AND token = ?2 AND owner IS NOT NULL AND expires_at_ms > {NOW_MS}
                 AND (?3 IS NULL OR actor IS NULL OR actor = ?3)"
        );
        let owner: Option<String> = sqlx::query_scalar(&sql)
            .bind(name.as_str())
            .bind(token.get())
            .bind(actor)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(owner) = owner else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query("UPDATE fencegate_locks SET owner = NULL, expires_at_ms = NULL, actor = NULL WHERE name = ?1")
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
        let now: String = sqlx::query_scalar(&format!("SELECT {NOW_TEXT}"))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(Lease {
            name: name.clone(),
            owner,
            token,
            expires_at: now,
        }))
    }

    async fn holder(&self, name: &Scope) -> Result<Option<Holder>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&mut *conn)
            .await?;
        holder_at(&mut conn, name, now).await
    }
}

impl SqliteStore {
    async fn acquire_in(
        &self,
        tx: &mut SqliteConnection,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        let fence: Option<i64> =
            sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = ?1")
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let (latest, owned): (Option<i64>, bool) =
            sqlx::query_as("SELECT token, owner IS NOT NULL FROM fencegate_locks WHERE name = ?1")
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .map_or((None, false), |(token, owned)| (Some(token), owned));
        // The next token is `max(l.token, fence) + 1`. Checked here, not left to SQLite, which
        // would turn the overflow into a float; the lock's own token counts too (an admin
        // reset may have lowered the fence below it).
        if fence.unwrap_or(0).max(latest.unwrap_or(0)) == i64::MAX {
            return Ok(Acquired::Exhausted);
        }
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&mut *tx)
            .await?;
        let acquire = format!(
            "INSERT INTO fencegate_locks AS l (name, owner, token, expires_at_ms, granted_at, actor)
             VALUES (?1, ?2, ?4 + 1, ?6 + ?3, {NOW_TEXT}, ?5)
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, actor = excluded.actor, token = max(l.token, ?4) + 1,
                 expires_at_ms = excluded.expires_at_ms, granted_at = {NOW_TEXT}, retired = 0
             WHERE l.owner IS NULL OR l.expires_at_ms <= ?6
             RETURNING token, {}",
            ms_to_text("expires_at_ms")
        );
        let granted = sqlx::query(&acquire)
            .bind(name.as_str())
            .bind(owner)
            .bind(ttl.ms())
            .bind(fence.unwrap_or(0))
            .bind(actor)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = granted else {
            // Refused at `now`: held at `now`, by the row as it is (nothing else ran since).
            return match holder_at(&mut *tx, name, now).await? {
                Some(holder) => Ok(Acquired::Held(holder)),
                None => Err(StoreError::Corrupt(format!(
                    "lock {name} is neither free nor held"
                ))),
            };
        };
        let token = token_from_db(row.try_get(0)?)?;
        if !Self::claim_in(&mut *tx, &self.sql.inclusive.grant_claim, name, token).await? {
            return Err(StoreError::Corrupt(format!(
                "the grant of lock {name} could not claim its scope"
            )));
        }
        if owned {
            crate::store::count_takeover();
        }
        Ok(Acquired::Granted(Lease {
            name: name.clone(),
            owner: owner.to_owned(),
            token,
            expires_at: row.try_get(1)?,
        }))
    }
}

/// Who holds the lock `name` at `now_ms`, if anyone.
async fn holder_at(
    conn: &mut SqliteConnection,
    name: &Scope,
    now_ms: i64,
) -> Result<Option<Holder>, StoreError> {
    let row = sqlx::query(
        "SELECT owner, max(0, expires_at_ms - ?2), token, actor FROM fencegate_locks
         WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2",
    )
    .bind(name.as_str())
    .bind(now_ms)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(holder_from).transpose()
}
