//! The demo's unfenced writer on PostgreSQL (see `store::unfenced`): a plain upsert on a
//! connection of its own, in the demo's scratch schema.

use sqlx::{types::Json, Connection, PgConnection};

pub struct Writer(PgConnection);

/// Removes the demo's scratch schema and everything in it (the demo's own tables, and
/// fencegate's when the demo started it there).
pub async fn drop_scratch_schema(url: &str, schema: &str) -> anyhow::Result<()> {
    let (options, mut tls) = super::tls::options(url)?;
    let options = tls.resolve_allow(options).await;
    let mut conn = PgConnection::connect_with(&options).await?;
    let schema = super::tables::sql::quote_ident(schema);
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut conn)
        .await?;
    Ok(())
}

impl Writer {
    /// `schema`: the demo's scratch schema (a name the demo made, never input).
    pub async fn connect(url: &str, schema: Option<&str>) -> anyhow::Result<Self> {
        // The same TLS settings and checks as fencegate's own connections.
        let (options, mut tls) = super::tls::options(url)?;
        let options = tls.resolve_allow(options).await;
        let mut conn = PgConnection::connect_with(&options).await.map_err(|e| {
            let shown = crate::redact::redact_url(url);
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {shown}: {}",
                tls.describe(&e, || e.to_string())
            )
        })?;
        if let Some(schema) = schema {
            sqlx::raw_sql(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path = {schema}"
            ))
            .execute(&mut conn)
            .await?;
        }
        sqlx::query("CREATE TABLE IF NOT EXISTS fencegate_demo_unfenced (key text PRIMARY KEY, value jsonb NOT NULL)")
            .execute(&mut conn)
            .await?;
        Ok(Writer(conn))
    }

    pub async fn read(&mut self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let value: Option<Json<serde_json::Value>> =
            sqlx::query_scalar("SELECT value FROM fencegate_demo_unfenced WHERE key = $1")
                .bind(key)
                .fetch_optional(&mut self.0)
                .await?;
        Ok(value.map(|v| v.0))
    }

    /// Last writer wins.
    pub async fn write(&mut self, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO fencegate_demo_unfenced (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(key)
        .bind(Json(value))
        .execute(&mut self.0)
        .await?;
        Ok(())
    }
}
