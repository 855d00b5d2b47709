//! fencegate's own schema (`[database] schema`, default `fencegate`): every table of its own,
//! its migration history included, lives there, so it shares a database with an application
//! without touching `public` (where the application's own `_sqlx_migrations` may be, which
//! fencegate must never read or write).
//!
//! The name is a plain identifier (`config`, `validate_schema`). Every connection gets
//! `search_path` = the schema alone: fencegate's statements name their
//! tables unqualified, and legacy tables are always named schema-qualified from the catalog.
//!
//! An install from before lived in `public`; [`prepare`] moves it, in one transaction, before
//! the migrations run.

use sqlx::{Connection, PgPool, Row};

use super::MIGRATOR;

/// fencegate's tables from before the schema setting (the migration history apart): what an
/// install in `public` can hold.
const OWN_TABLES: [&str; 5] = [
    "fencegate_kv",
    "fencegate_fences",
    "fencegate_locks",
    "fencegate_ledger",
    "fencegate_audit",
];

/// The last migration released before the schema setting: an install in `public` has applied
/// at most this far. One that went further was made with `database.schema = "public"` on
/// purpose (its functions are bound to `public`), and is not moved.
const LAST_BEFORE_SCHEMAS: i64 = 20261123000001;

/// Makes the schema ready for the migrations: creates it if missing, and moves an install that
/// predates it out of `public`.
pub async fn prepare(pool: &PgPool, schema: &str) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *conn)
            .await?;
    if !exists {
        create_schema(&mut conn, schema).await.map_err(|e| {
            // Only a refusal by the database is about the role; anything else (the connection)
            // is said as it is.
            if !matches!(&e, sqlx::Error::Database(_)) {
                return anyhow::anyhow!("cannot create fencegate's schema {schema:?}: {e}");
            }
            anyhow::anyhow!(
                "fencegate keeps its tables in the schema {schema:?}, which does not exist and cannot be created by \
                 this role ({e}). Create it for fencegate's role: CREATE SCHEMA {schema} AUTHORIZATION <role>; \
                 or set database.schema to a schema the role owns"
            )
        })?;
    }
    let usable: bool = sqlx::query_scalar(
        "SELECT has_schema_privilege($1, 'CREATE') AND has_schema_privilege($1, 'USAGE')",
    )
    .bind(schema)
    .fetch_one(&mut *conn)
    .await?;
    if !usable {
        anyhow::bail!(
            "fencegate's role cannot create tables in the schema {schema:?}: GRANT USAGE, CREATE ON SCHEMA {schema} TO <role> \
             (or make the role its owner)"
        );
    }
    if schema != "public" {
        move_from_public(&mut conn, schema).await?;
    }
    Ok(())
}

/// Creates the schema, under an advisory lock: `CREATE SCHEMA IF NOT EXISTS` is not safe against
/// itself (two processes starting at once on a fresh database both pass the check, and the
/// second fails on pg_namespace's unique index), so the check is made again under the lock.
async fn create_schema(conn: &mut sqlx::PgConnection, schema: &str) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin().await?;
    // READ COMMITTED whatever default_transaction_isolation says: the re-check below must see a
    // schema another process committed while this one waited for the lock.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fencegate: create schema'))")
        .execute(&mut *tx)
        .await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *tx)
            .await?;
    if !exists {
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    if !exists {
        tracing::info!(schema, "created fencegate's schema");
    }
    Ok(())
}

/// An install from before the schema setting: its tables and its rows of the migration history
/// in `public`. Moved in one transaction (under an advisory lock: several processes may start
/// at once): the tables whole, and of `public._sqlx_migrations` only fencegate's own rows (the
/// table itself is dropped only if nothing else was in it).
async fn move_from_public(conn: &mut sqlx::PgConnection, schema: &str) -> anyhow::Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fencegate: move out of public'))")
        .execute(&mut *tx)
        .await?;
    let mut found = Vec::new();
    for table in OWN_TABLES {
        let row = sqlx::query("SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL")
            .bind(format!("public.{table}"))
            .bind(format!("{schema}.{table}"))
            .fetch_one(&mut *tx)
            .await?;
        let (in_public, in_schema): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
        if in_public && in_schema {
            tracing::warn!(table, schema, "fencegate's table is in both public and its schema; the one in public is left alone");
        } else if in_public {
            found.push(table);
        }
    }
    if found.is_empty() {
        return Ok(tx.rollback().await?);
    }
    for table in &found {
        // Table names from the constant above, schema from the validated configuration.
        sqlx::query(&format!("ALTER TABLE public.{table} SET SCHEMA {schema}"))
            .execute(&mut *tx)
            .await?;
    }
    let versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let history: bool =
        sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations') IS NOT NULL")
            .fetch_one(&mut *tx)
            .await?;
    if history {
        let newest: Option<i64> = sqlx::query_scalar(
            "SELECT max(version) FROM public._sqlx_migrations WHERE version = ANY($1)",
        )
        .bind(&versions)
        .fetch_one(&mut *tx)
        .await?;
        if newest.is_some_and(|v| v > LAST_BEFORE_SCHEMAS) {
            anyhow::bail!(
                "fencegate's tables in public were made with database.schema = \"public\" (migration {} is applied there): \
                 keep that setting, or move them by hand; nothing was changed",
                newest.unwrap_or_default()
            );
        }
    }
    let mut moved = 0;
    if history {
        sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {schema}._sqlx_migrations (LIKE public._sqlx_migrations INCLUDING ALL)"))
            .execute(&mut *tx)
            .await?;
        moved = sqlx::query(&format!(
            "INSERT INTO {schema}._sqlx_migrations SELECT * FROM public._sqlx_migrations WHERE version = ANY($1) \
             ON CONFLICT DO NOTHING"
        ))
        .bind(&versions)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM public._sqlx_migrations WHERE version = ANY($1)")
            .bind(&versions)
            .execute(&mut *tx)
            .await?;
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM public._sqlx_migrations")
            .fetch_one(&mut *tx)
            .await?;
        if left == 0 {
            sqlx::query("DROP TABLE public._sqlx_migrations")
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    tracing::warn!(
        schema,
        tables = ?found,
        migrations = moved,
        "moved fencegate's tables and migration history out of public into its own schema"
    );
    Ok(())
}
