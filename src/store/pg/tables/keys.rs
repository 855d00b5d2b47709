//! Step 1: a row key parsed and printed canonically by PostgreSQL, so that one row has one
//! fence whatever spelling of its key a client sends.

use sqlx::Row;

use super::{
    explain::{classify, json_text, Failure},
    sql::Sql,
    TableError, MAX_CANONICAL_KEY,
};
use crate::{
    store::{pg::PgStore, StoreError},
    tables::{canonical_key, Resource, RowError, RowKey, RowWrite},
};

/// A key parsed and printed by PostgreSQL.
pub(super) struct CanonicalKey {
    /// The URL form (what the ledger stores and responses show).
    pub(super) text: String,
    /// `{"id": "42", "region": "EU"}`: the key as JSON, for `jsonb_to_record`.
    pub(super) json: serde_json::Map<String, serde_json::Value>,
}

impl PgStore {
    /// The canonical key of a row, for a reset (`store::admin`); a key that does not parse is
    /// refused.
    pub(in crate::store) async fn canonical_text(
        &self,
        resource: &Resource,
        key: &RowKey,
    ) -> Result<Result<String, crate::store::admin::ResetRefused>, StoreError> {
        match self.canonical(resource, key, &RowWrite::Delete).await {
            Ok(key) => Ok(Ok(key.text)),
            Err(TableError::Row(err)) => Ok(Err(crate::store::admin::ResetRefused::Invalid(
                err.to_string(),
            ))),
            Err(TableError::Store(err)) => Err(err),
        }
    }

    /// Has PostgreSQL parse the key (and any key columns the body repeats) with the key
    /// columns' types, and prints it canonically. A value that does not parse is a 400 naming
    /// its column; a body naming another row than the URL is refused.
    pub(super) async fn canonical(
        &self,
        resource: &Resource,
        key: &RowKey,
        write: &RowWrite,
    ) -> Result<CanonicalKey, TableError> {
        let sql = Sql(resource);
        let url: serde_json::Map<String, serde_json::Value> = resource
            .key_columns()
            .zip(key.values())
            .map(|(c, v)| (c.name.clone(), serde_json::Value::from(v.as_str())))
            .collect();
        let echo = match write {
            RowWrite::Put(values) | RowWrite::Patch(values) if !values.key_echo.is_empty() => {
                let mut echo = url.clone();
                for (index, text) in &values.key_echo {
                    echo.insert(resource.columns[*index].name.clone(), text.as_str().into());
                }
                Some(echo)
            }
            _ => None,
        };
        let objects: Vec<serde_json::Value> = std::iter::once(&url)
            .chain(echo.as_ref())
            .cloned()
            .map(serde_json::Value::Object)
            .collect();
        let texts: Vec<String> = resource.key.iter().map(|&i| sql.key_text(i)).collect();
        let statement = format!(
            "SELECT {texts} FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(j, n)
             CROSS JOIN LATERAL {record} ORDER BY e.n",
            texts = texts.join(", "),
            record = sql.record("e.j", resource.key.iter().copied()),
        );
        let mut conn = self.conns.take().await?;
        let rows = match sqlx::query(&statement)
            .bind(serde_json::Value::Array(objects).to_string())
            .fetch_all(&mut *conn)
            .await
        {
            Ok(rows) => {
                conn.done();
                rows
            }
            Err(err) => {
                drop(conn); // before explaining, which needs a connection of its own
                return Err(match classify(err) {
                    Failure::Data(..) | Failure::Row(RowError::Value { .. }) => {
                        self.key_culprit(resource, &url, echo.as_ref()).await?
                    }
                    Failure::Row(err) => TableError::Row(err),
                    Failure::Store(err) => TableError::Store(err),
                });
            }
        };
        let mut printed = Vec::with_capacity(rows.len());
        for row in rows {
            let mut parts = Vec::with_capacity(resource.key.len());
            for i in 0..resource.key.len() {
                let text: Option<String> = row.try_get(i).map_err(StoreError::from)?;
                parts.push(text.unwrap_or_default());
            }
            printed.push(parts);
        }
        let [parts, rest @ ..] = printed.as_slice() else {
            return Err(StoreError::Corrupt("key canonicalization returned no row".into()).into());
        };
        if let Some(echoed) = rest.first() {
            if let Some((i, _)) = parts
                .iter()
                .zip(echoed)
                .enumerate()
                .find(|(_, (a, b))| a != b)
            {
                let column = &resource.columns[resource.key[i]].name;
                return Err(RowError::row(
                    column,
                    format!(
                        "key column {column:?} is {:?} in the body but {:?} in the URL; a write cannot move a row to another key",
                        echoed[i], parts[i]
                    ),
                )
                .into());
            }
        }
        let text = canonical_key(parts);
        if text.len() > MAX_CANONICAL_KEY {
            return Err(RowError::Key {
                column: None,
                detail: format!(
                    "the canonical key is {} bytes long; the limit is {MAX_CANONICAL_KEY}",
                    text.len()
                ),
            }
            .into());
        }
        let json = resource
            .key_columns()
            .zip(parts)
            .map(|(c, p)| (c.name.clone(), serde_json::Value::from(p.as_str())))
            .collect();
        Ok(CanonicalKey { text, json })
    }

    /// Finds the key value PostgreSQL refused (URL key first, then the body's key columns).
    pub(in crate::store) async fn key_culprit(
        &self,
        resource: &Resource,
        url: &serde_json::Map<String, serde_json::Value>,
        echo: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<TableError, StoreError> {
        for (from_url, object) in std::iter::once((true, url)).chain(echo.map(|e| (false, e))) {
            for &index in &resource.key {
                let column = &resource.columns[index];
                let value = json_text(object[&column.name].as_str().unwrap_or_default());
                if let Some(detail) = self.refuses(resource, index, &value).await? {
                    let detail = format!(
                        "the key's {:?} ({}): {detail}",
                        column.name, column.sql_type
                    );
                    let column = Some(column.name.clone());
                    return Ok(TableError::Row(if from_url {
                        RowError::Key { column, detail }
                    } else {
                        RowError::Row { column, detail }
                    }));
                }
            }
        }
        Ok(TableError::Row(RowError::Key {
            column: None,
            detail: "the key does not read as the key columns' types".into(),
        }))
    }
}
