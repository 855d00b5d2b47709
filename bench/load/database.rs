//! The bench's own connections to PostgreSQL: the admin connection, and the table every step
//! starts from.

use std::time::Duration;

use anyhow::{bail, Result};
use fencegate::redact::redact_url;
use sqlx::{Connection, PgConnection};

use crate::KEYS;

pub async fn connect_admin(url: &str) -> Result<PgConnection> {
    let shown = redact_url(url);
    match tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(url)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => bail!(
            "PostgreSQL is not reachable at {shown}: {e}.\n  The load bench needs a running PostgreSQL server and a role that may CREATE DATABASE.\n  \
             Start one (Debian/Ubuntu: apt-get install postgresql && pg_ctlcluster <version> main start; \
             or: docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16)\n  \
             or point DATABASE_URL at an admin URL, e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
        ),
        Err(_) => bail!("PostgreSQL at {shown} did not answer within 10 s; is the server up (and the address right)?"),
    }
}

/// Puts the table in the same state before every step: `KEYS` live keys, version 1, each fence
/// at the clock (microseconds, the scale of every token of the run: a jump cap measures from it),
/// vacuumed and analyzed, then a checkpoint, so no step pays for the previous one's dirt.
/// This lowers fences behind fencegate's back, which is harmless here only because every token
/// of the run (TokenClock, pgbench's clock) is higher than any token presented before it.
pub async fn reset_table(db: &mut PgConnection, admin: &mut PgConnection) -> Result<()> {
    sqlx::raw_sql("TRUNCATE fencegate.fencegate_kv")
        .execute(&mut *db)
        .await?;
    sqlx::query(
        "INSERT INTO fencegate.fencegate_kv (key, value, deleted, key_fence, fence_token, scope)
         SELECT g::text, '{\"n\": 0}'::jsonb, false, now_us, now_us, NULL
         FROM generate_series(1, $1::bigint) AS g,
              (SELECT (extract(epoch from clock_timestamp()) * 1000000)::bigint AS now_us) AS clock",
    )
    .bind(KEYS as i64)
    .execute(&mut *db)
    .await?;
    // The hot scope's fence a minute behind the clock, so that its first write is no jump
    // either (the step draws its one token just before this reset).
    sqlx::query(
        "INSERT INTO fencegate.fencegate_fences (scope, fence_token)
         VALUES ($1, (extract(epoch from clock_timestamp()) * 1000000)::bigint - 60000000)
         ON CONFLICT (scope) DO UPDATE SET fence_token = EXCLUDED.fence_token",
    )
    .bind(crate::HOT_SCOPE)
    .execute(&mut *db)
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE fencegate.fencegate_kv")
        .execute(&mut *db)
        .await?;
    // Superuser (or pg_checkpoint) only; without it the step just starts with pending writes.
    let _ = sqlx::raw_sql("CHECKPOINT").execute(&mut *admin).await;
    Ok(())
}

/// Sum of `version` over the table: every accepted write adds exactly 1 (no deletes here), a
/// refused (stale) one adds 0. The difference across a step = writes the database applied.
pub async fn version_sum(db: &mut PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(sum(version), 0)::bigint FROM fencegate.fencegate_kv")
            .fetch_one(&mut *db)
            .await?,
    )
}
