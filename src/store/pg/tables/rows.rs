//! Steps 3 and 4 of a table write: the row's fence (the ledger, and the fence column in
//! column mode), then the write to the legacy table itself; and a row's reset.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use sqlx::{PgConnection, Row};

use super::{
    explain::{json_text, Failure},
    keys::CanonicalKey,
    sql::{ledger_scoped_sql, ledger_sql, Sql},
    TableError,
};
use crate::{
    fence::{verdict, Fenced, FencingToken, Guard, Held, ScopeHeld, Seen, Target},
    store::{
        pg::PgStore,
        raced,
        sql::{fence_admits, sql_jump_check},
        token_from_db, Checks, Refusal, StoreError,
    },
    tables::{Fence, Resource, RowError, RowWrite},
};

impl PgStore {
    /// Resets a row's fence (the ledger's and, in column mode, the fence column of the row if
    /// it exists) and maybe its binding, inside the caller's transaction.
    pub(in crate::store) async fn reset_row(
        &self,
        tx: &mut PgConnection,
        reset: &crate::store::admin::Reset,
        resource: &Resource,
        key: &str,
    ) -> Result<Result<crate::store::admin::Change, crate::store::admin::ResetRefused>, StoreError>
    {
        use crate::store::admin::{decide, Change, ResetRefused};
        let ledger = sqlx::query(
            "SELECT fence, scope FROM fencegate_ledger WHERE relation = $1 AND key = $2 FOR UPDATE",
        )
        .bind(&resource.relation)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let (mut from, from_scope) = match &ledger {
            Some(row) => (
                Some(token_from_db(row.try_get(0)?)?),
                row.try_get::<Option<String>, _>(1)?,
            ),
            None => (None, None),
        };
        let sql = Sql(resource);
        let key_json = {
            let values: serde_json::Map<String, serde_json::Value> = resource
                .key_columns()
                .zip(
                    key.split(',')
                        .map(|p| crate::percent::decode_strict(p.as_bytes()).unwrap_or_default()),
                )
                .map(|(c, v)| (c.name.clone(), serde_json::Value::from(v)))
                .collect();
            serde_json::Value::Object(values).to_string()
        };
        if let Some(column) = sql.fence_column() {
            let statement = format!(
                "SELECT t.{column}::int8 FROM {table} AS t CROSS JOIN {record} WHERE {matches} FOR UPDATE OF t",
                table = sql.table(),
                record = sql.record("$1", resource.key.iter().copied()),
                matches = sql.key_match(),
            );
            let value: Option<Option<i64>> = sqlx::query_scalar(&statement)
                .bind(&key_json)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(value) = value.flatten() {
                let value = token_from_db(value)?;
                from = Some(from.map_or(value, |f| f.max(value)));
            }
        }
        let Some(from) = from else {
            return Ok(Err(ResetRefused::NotFound(format!(
                "row {key:?} of {:?} has no fence (fencegate never wrote it)",
                resource.name
            ))));
        };
        let (to, to_scope) = match decide(reset, from, from_scope.clone()) {
            Ok(next) => next,
            Err(refused) => return Ok(Err(refused)),
        };
        sqlx::query(
            "INSERT INTO fencegate_ledger AS l (relation, key, fence, token, scope) VALUES ($1, $2, $3, $3, $4)
             ON CONFLICT (relation, key) DO UPDATE SET fence = EXCLUDED.fence, scope = EXCLUDED.scope, updated_at = now()",
        )
        .bind(&resource.relation)
        .bind(key)
        .bind(to.get())
        .bind(&to_scope)
        .execute(&mut *tx)
        .await?;
        if let (Some(column), Some(_)) = (sql.fence_column(), reset.to) {
            let statement = format!(
                "UPDATE {table} AS t SET {column} = $2 FROM {record} WHERE {matches}",
                table = sql.table(),
                record = sql.record("$1", resource.key.iter().copied()),
                matches = sql.key_match(),
            );
            sqlx::query(&statement)
                .bind(&key_json)
                .bind(to.get())
                .execute(&mut *tx)
                .await?;
        }
        Ok(Ok(Change {
            name: key.to_owned(),
            resource: Some(resource.name.clone()),
            from,
            to,
            from_scope,
            to_scope,
        }))
    }
}

/// Step 3: the row's fence. Returns whether the row exists, or the refusal. Afterwards this
/// transaction holds the row's ledger lock and, if the row exists, its lock in the table
/// (`FOR UPDATE` if it will be deleted, else the weaker `FOR NO KEY UPDATE`, which does not
/// block other writers inserting rows that reference it).
pub(super) async fn fence_row(
    conn: &mut PgConnection,
    resource: &Resource,
    key: &CanonicalKey,
    guard: &Guard,
    deletes: bool,
    checks: &Checks,
) -> Result<Result<bool, Refusal>, TableError> {
    let fenced = || Fenced::Row {
        resource: resource.name.clone(),
        key: key.text.clone(),
    };
    let admitted: Option<i32> = match &guard.target {
        Target::Key => sqlx::query_scalar(&ledger_sql(guard.rule, checks))
            .bind(&resource.relation)
            .bind(&key.text)
            .bind(guard.token.get())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?,
        Target::Scope(scope) => sqlx::query_scalar(&ledger_scoped_sql(checks.scopes))
            .bind(&resource.relation)
            .bind(&key.text)
            .bind(guard.token.get())
            .bind(scope.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)?,
    };
    if admitted.is_none() {
        // Read under the ledger row's lock, which the refused upsert took (if the row exists:
        // a token the jump cap refuses never reached it): exactly what refused.
        let row = sqlx::query(
            "SELECT fence, scope FROM fencegate_ledger WHERE relation = $1 AND key = $2",
        )
        .bind(&resource.relation)
        .bind(&key.text)
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::from)?;
        // No ledger row: a token the jump cap refuses never reached one.
        let (fence, remembered): (Option<FencingToken>, Option<Option<String>>) = match &row {
            None => (None, None),
            Some(row) => (
                Some(token_from_db(row.try_get(0).map_err(StoreError::from)?)?),
                Some(row.try_get(1).map_err(StoreError::from)?),
            ),
        };
        let held = Held {
            fenced: fenced(),
            fence,
            remembered: remembered.as_ref().map(Option::as_deref),
        };
        return explain(held, guard, checks);
    }
    // Lock the table row (if any): from here to commit nobody else changes it. In column mode
    // an unscoped write also needs the row's own fence column to admit the token: another
    // writer may have raised it.
    let sql = Sql(resource);
    let (fence, admits) = match (sql.fence_column(), &guard.target) {
        (Some(c), Target::Key) => (
            format!("t.{c}::int8"),
            format!(
                "(t.{c} IS NULL OR {admits}) AND {jump}",
                admits = fence_admits(guard.rule, &format!("t.{c}"), "$2"),
                jump = sql_jump_check(checks.jump, &format!("t.{c}::int8"), "$2::int8"),
            ),
        ),
        _ => ("NULL::int8".to_owned(), "true".to_owned()),
    };
    let statement = format!(
        "SELECT {fence}, {admits} FROM {table} AS t CROSS JOIN {record} WHERE {matches} FOR {lock} OF t",
        table = sql.table(),
        record = sql.record("$1", resource.key.iter().copied()),
        matches = sql.key_match(),
        lock = if deletes { "UPDATE" } else { "NO KEY UPDATE" },
    );
    let row = sqlx::query(&statement)
        .bind(serde_json::Value::Object(key.json.clone()).to_string())
        .bind(guard.token.get())
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::from)?;
    let Some(row) = row else { return Ok(Ok(false)) };
    let admits: bool = row.try_get(1).map_err(StoreError::from)?;
    if !admits {
        // The ledger admitted the row's scope already: only its fence column is in question.
        // NULL: the row has no token yet, and only the jump cap (counted from 0) refused.
        let fence: Option<i64> = row.try_get(0).map_err(StoreError::from)?;
        let fence = fence.map(token_from_db).transpose()?;
        return explain(
            Held {
                fenced: fenced(),
                fence,
                remembered: None,
            },
            guard,
            checks,
        );
    }
    Ok(Ok(true))
}

/// A refused row write, explained by [`crate::fence::verdict`] from what the row holds (read
/// under the lock the refused statement took). A scoped write's scope was admitted by its claim
/// in this transaction, so only the row itself is in question.
fn explain(
    held: Held<'_>,
    guard: &Guard,
    checks: &Checks,
) -> Result<Result<bool, Refusal>, TableError> {
    let seen = Seen {
        held: vec![held],
        scope: ScopeHeld::Admitted,
        binding: None,
    };
    match verdict(&seen, guard, checks) {
        Err(refusal) => Ok(Err(refusal)),
        Ok(()) => Err(TableError::Store(raced(guard.token, guard.scope(), 1))),
    }
}

/// Step 4: the write to the legacy table. `existed` comes from [`fence_row`], which holds the
/// row's lock if it exists.
pub(super) async fn write_row(
    conn: &mut PgConnection,
    resource: &Resource,
    key: &CanonicalKey,
    write: &RowWrite,
    guard: &Guard,
    existed: bool,
) -> Result<(), Failure> {
    let sql = Sql(resource);
    // Unscoped writes in column mode store the token in the fence column ($2); scoped writes
    // leave it alone (tokens of different fences are never compared).
    let fence_column = match (&resource.fence, &guard.target) {
        (Fence::Column { column, .. }, Target::Key) => Some(*column),
        _ => None,
    };
    let mut object: BTreeMap<&str, Box<RawValue>> = key
        .json
        .iter()
        .map(|(c, v)| (c.as_str(), json_text(v.as_str().unwrap_or_default())))
        .collect();
    // Whether the statement uses $2 (the token, for the fence column).
    let binds_token = fence_column.is_some() && !matches!(write, RowWrite::Delete);
    let statement = match write {
        RowWrite::Put(values) => {
            let mut columns: Vec<usize> = resource.key.clone();
            columns.extend(values.set.iter().map(|(i, _)| *i));
            for (index, value) in &values.set {
                object.insert(&resource.columns[*index].name, value.clone());
            }
            let mut targets: Vec<String> = columns.iter().map(|&i| sql.col(i)).collect();
            let mut sources: Vec<String> = columns
                .iter()
                .map(|&i| format!("r.{}", sql.col(i)))
                .collect();
            let mut assign: Vec<String> = values
                .set
                .iter()
                .map(|(i, _)| format!("{c} = EXCLUDED.{c}", c = sql.col(*i)))
                .collect();
            if let Some(f) = fence_column {
                targets.push(sql.col(f));
                sources.push("$2".into());
                assign.push(format!("{c} = EXCLUDED.{c}", c = sql.col(f)));
            }
            // PUT replaces the row: every other writable column goes back to its default, as if
            // the row had just been inserted. Identity columns keep their number; the fence
            // column is only ever written with a token.
            for (i, column) in resource.columns.iter().enumerate() {
                let named = resource.key.contains(&i) || values.set.iter().any(|(s, _)| *s == i);
                let fence = matches!(resource.fence, Fence::Column { column, .. } if column == i);
                if !named && !fence && column.read_only.is_none() && !column.identity {
                    assign.push(format!("{} = DEFAULT", sql.col(i)));
                }
            }
            if assign.is_empty() {
                // Nothing but the key: ON CONFLICT still needs an assignment (a no-op).
                let k = sql.col(resource.key[0]);
                assign.push(format!("{k} = EXCLUDED.{k}"));
            }
            format!(
                "INSERT INTO {table} AS t ({targets}) SELECT {sources} FROM {record}
                 ON CONFLICT ({keys}) DO UPDATE SET {assign}",
                table = sql.table(),
                targets = targets.join(", "),
                sources = sources.join(", "),
                record = sql.record("$1", columns.iter().copied()),
                keys = resource
                    .key
                    .iter()
                    .map(|&i| sql.col(i))
                    .collect::<Vec<_>>()
                    .join(", "),
                assign = assign.join(", "),
            )
        }
        RowWrite::Patch(values) => {
            if !existed {
                return Err(Failure::Row(RowError::NoRow(format!(
                    "resource {:?} has no row {:?}; PATCH changes an existing row (PUT creates one)",
                    resource.name, key.text
                ))));
            }
            let mut columns: Vec<usize> = resource.key.clone();
            columns.extend(values.set.iter().map(|(i, _)| *i));
            for (index, value) in &values.set {
                object.insert(&resource.columns[*index].name, value.clone());
            }
            let mut assign: Vec<String> = values
                .set
                .iter()
                .map(|(i, _)| format!("{c} = r.{c}", c = sql.col(*i)))
                .collect();
            if let Some(f) = fence_column {
                assign.push(format!("{} = $2", sql.col(f)));
            }
            format!(
                "UPDATE {table} AS t SET {assign} FROM {record} WHERE {matches}",
                table = sql.table(),
                assign = assign.join(", "),
                record = sql.record("$1", columns.iter().copied()),
                matches = sql.key_match(),
            )
        }
        RowWrite::Delete => format!(
            "DELETE FROM {table} AS t USING {record} WHERE {matches}",
            table = sql.table(),
            record = sql.record("$1", resource.key.iter().copied()),
            matches = sql.key_match(),
        ),
    };
    let json = serde_json::to_string(&object)
        .map_err(|e| Failure::Store(StoreError::Corrupt(e.to_string())))?;
    let mut query = sqlx::query(&statement).bind(json);
    if binds_token {
        query = query.bind(guard.token.get());
    }
    query.execute(&mut *conn).await?;
    Ok(())
}
