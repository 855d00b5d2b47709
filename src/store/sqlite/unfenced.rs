//! The demo's unfenced writer on SQLite (see `store::unfenced`): a plain upsert on a
//! connection of its own to the demo's scratch file. Values are JSON text (SQLite has no
//! `jsonb`).

use std::{str::FromStr, time::Duration};

use sqlx::{sqlite::SqliteConnectOptions, ConnectOptions, SqliteConnection};

pub struct Writer(SqliteConnection);

impl Writer {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        // The fencegate process has the same file open: wait for its write lock.
        let mut conn = SqliteConnectOptions::from_str(url)?
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS fencegate_demo_unfenced (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            .execute(&mut conn)
            .await?;
        Ok(Writer(conn))
    }

    pub async fn read(&mut self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let value: Option<String> =
            sqlx::query_scalar("SELECT value FROM fencegate_demo_unfenced WHERE key = ?1")
                .bind(key)
                .fetch_optional(&mut self.0)
                .await?;
        Ok(value.map(|v| serde_json::from_str(&v)).transpose()?)
    }

    /// Last writer wins.
    pub async fn write(&mut self, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO fencegate_demo_unfenced (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value.to_string())
        .execute(&mut self.0)
        .await?;
        Ok(())
    }
}
