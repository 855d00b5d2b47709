//! The write a service does today, without fencegate: a plain upsert with no token check.
//!
//! Used only by `fencegate demo`, to show side by side the lost update that fencing prevents.
//! It writes its own table (`fencegate_demo_unfenced`) in the demo's scratch place (a schema of
//! its own on PostgreSQL, a scratch file on SQLite, both removed when the demo ends), never
//! fencegate's data or the user's, and no API route reaches it. The statements are in
//! `pg/unfenced.rs` and `sqlite/unfenced.rs`.

use super::{pg, sqlite};

pub enum Unfenced {
    Pg(pg::unfenced::Writer),
    Sqlite(sqlite::unfenced::Writer),
}

impl Unfenced {
    /// `schema`: PostgreSQL only, the demo's scratch schema (a name the demo made, never input).
    pub async fn connect(url: &str, schema: Option<&str>) -> anyhow::Result<Self> {
        if url.starts_with("sqlite:") {
            Ok(Unfenced::Sqlite(
                sqlite::unfenced::Writer::connect(url).await?,
            ))
        } else {
            Ok(Unfenced::Pg(
                pg::unfenced::Writer::connect(url, schema).await?,
            ))
        }
    }

    pub async fn read(&mut self, key: &str) -> anyhow::Result<Option<serde_json::Value>> {
        match self {
            Unfenced::Pg(writer) => writer.read(key).await,
            Unfenced::Sqlite(writer) => writer.read(key).await,
        }
    }

    /// Last writer wins, whoever it is: exactly the bug.
    pub async fn write(&mut self, key: &str, value: &serde_json::Value) -> anyhow::Result<()> {
        match self {
            Unfenced::Pg(writer) => writer.write(key, value).await,
            Unfenced::Sqlite(writer) => writer.write(key, value).await,
        }
    }
}

/// Removes the demo's scratch schema on PostgreSQL (a name the demo made, never input).
pub async fn drop_scratch_schema(url: &str, schema: &str) -> anyhow::Result<()> {
    pg::unfenced::drop_scratch_schema(url, schema).await
}
