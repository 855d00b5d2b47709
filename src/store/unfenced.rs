//! The write a service does today, without fencegate: a plain upsert with no token check.
//!
//! Used only by `fencegate demo`, to show side by side the lost update that fencing prevents.
//! It writes its own table (`fencegate_demo_unfenced`), never fencegate's data, and no API
//! route reaches it.

use sqlx::{Connection, PgConnection};

pub struct Unfenced {
    conn: PgConnection,
}

impl Unfenced {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let mut conn = PgConnection::connect(url).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS fencegate_demo_unfenced (key text PRIMARY KEY, value jsonb NOT NULL)")
            .execute(&mut conn)
            .await?;
        Ok(Unfenced { conn })
    }

    pub async fn read(&mut self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let value: Option<sqlx::types::Json<serde_json::Value>> =
            sqlx::query_scalar("SELECT value FROM fencegate_demo_unfenced WHERE key = $1")
                .bind(key)
                .fetch_optional(&mut self.conn)
                .await?;
        Ok(value.map(|v| v.0))
    }

    /// Last writer wins, whoever it is: exactly the bug.
    pub async fn write(&mut self, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO fencegate_demo_unfenced (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(key)
        .bind(sqlx::types::Json(value))
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}
