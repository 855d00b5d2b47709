//! The write a service does today, without fencegate: a plain upsert with no token check.
//!
//! Used only by `fencegate demo`, to show side by side the lost update that fencing prevents.
//! It writes its own table (`fencegate_demo_unfenced`) in the demo's scratch place (a schema of
//! its own on PostgreSQL, a scratch file on SQLite, both removed when the demo ends), never
//! fencegate's data or the user's, and no API route reaches it.

use std::{str::FromStr, time::Duration};

use sqlx::{sqlite::SqliteConnectOptions, types::Json, ConnectOptions, Connection, PgConnection, SqliteConnection};

pub enum Unfenced {
    Pg(PgConnection),
    Sqlite(SqliteConnection),
}

impl Unfenced {
    /// `schema`: PostgreSQL only, the demo's scratch schema (a name the demo made, never input).
    pub async fn connect(url: &str, schema: Option<&str>) -> anyhow::Result<Self> {
        if url.starts_with("sqlite:") {
            // The fencegate process has the same file open: wait for its write lock.
            let mut conn = SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(5)).connect().await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS fencegate_demo_unfenced (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                .execute(&mut conn)
                .await?;
            Ok(Unfenced::Sqlite(conn))
        } else {
            // The same TLS settings and checks as fencegate's own connections.
            let (options, mut tls) = super::pg_tls::options(url)?;
            let options = tls.resolve_allow(options).await;
            let mut conn = PgConnection::connect_with(&options).await.map_err(|e| {
                let shown = crate::redact::redact_url(url);
                anyhow::anyhow!("cannot connect to PostgreSQL at {shown}: {}", tls.describe(&e, || e.to_string()))
            })?;
            if let Some(schema) = schema {
                sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path = {schema}")).execute(&mut conn).await?;
            }
            sqlx::query("CREATE TABLE IF NOT EXISTS fencegate_demo_unfenced (key text PRIMARY KEY, value jsonb NOT NULL)")
                .execute(&mut conn)
                .await?;
            Ok(Unfenced::Pg(conn))
        }
    }

    pub async fn read(&mut self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(match self {
            Unfenced::Pg(conn) => {
                let value: Option<Json<serde_json::Value>> =
                    sqlx::query_scalar("SELECT value FROM fencegate_demo_unfenced WHERE key = $1")
                        .bind(key)
                        .fetch_optional(conn)
                        .await?;
                value.map(|v| v.0)
            }
            Unfenced::Sqlite(conn) => {
                let value: Option<String> = sqlx::query_scalar("SELECT value FROM fencegate_demo_unfenced WHERE key = ?1")
                    .bind(key)
                    .fetch_optional(conn)
                    .await?;
                value.map(|v| serde_json::from_str(&v)).transpose()?
            }
        })
    }

    /// Last writer wins, whoever it is: exactly the bug.
    pub async fn write(&mut self, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        match self {
            Unfenced::Pg(conn) => {
                sqlx::query(
                    "INSERT INTO fencegate_demo_unfenced (key, value) VALUES ($1, $2)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                )
                .bind(key)
                .bind(Json(value))
                .execute(conn)
                .await?;
            }
            Unfenced::Sqlite(conn) => {
                sqlx::query(
                    "INSERT INTO fencegate_demo_unfenced (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                )
                .bind(key)
                .bind(value.to_string())
                .execute(conn)
                .await?;
            }
        }
        Ok(())
    }
}
