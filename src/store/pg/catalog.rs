//! Start-up validation of `[[resources]]` against the PostgreSQL catalog.
//!
//! Every identifier fencegate later puts into SQL for a legacy table comes from here: the
//! table's and columns' names and types as the catalog spells them. A resource whose table,
//! key or fence column is not what the configuration says stops start-up with a message that
//! names the resource and the problem (all bad resources are reported at once).

use std::collections::BTreeSet;

use sqlx::{PgConnection, PgPool, Row};

use crate::{
    fence::Rule,
    tables::{Column, Fence, FenceMode, KeyText, Resource, ResourceSettings, Resources},
};

/// fencegate's own tables (and anything in its schema): writing them through `/v1/tables`
/// would forge fences.
const OWN_TABLES: [&str; 5] = [
    "fencegate_kv",
    "fencegate_fences",
    "fencegate_ledger",
    "fencegate_locks",
    "_sqlx_migrations",
];

/// Key types whose output function is canonical (equal values print the same), so the printed
/// key can identify the row's fence. Floats (-0 = 0), citext and friends are not.
const CANONICAL_KEY_TYPES: [&str; 12] = [
    "int2",
    "int4",
    "int8",
    "text",
    "varchar",
    "bpchar",
    "uuid",
    "date",
    "timestamp",
    "timestamptz",
    "bool",
    "numeric",
];

pub async fn load(
    pool: &PgPool,
    own_schema: &str,
    settings: &[ResourceSettings],
) -> anyhow::Result<Resources> {
    let mut conn = pool.acquire().await?;
    let ledger: bool = sqlx::query_scalar("SELECT to_regclass('fencegate_ledger') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !ledger {
        anyhow::bail!("[[resources]] need the table fencegate_ledger: run `fencegate migrate` (or set database.migrate_on_start)");
    }
    let mut resources = Vec::with_capacity(settings.len());
    let mut problems = Vec::new();
    for (i, resource) in settings.iter().enumerate() {
        match inspect(&mut conn, own_schema, resource).await? {
            Ok(resource) => resources.push(resource),
            Err(problem) => problems.push(format!("{}: {problem}", resource.label(i))),
        }
    }
    match problems.len() {
        0 => Ok(Resources::new(resources)),
        1 => anyhow::bail!("invalid resource: {}", problems[0]),
        n => anyhow::bail!("{n} invalid resources:\n  {}", problems.join("\n  ")),
    }
}

struct CatalogColumn {
    attnum: i16,
    column: Column,
    base_type: String,
    base_kind: String,
    deterministic: bool,
}

/// `Ok(Err(problem))` is a bad resource; `Err` is a database failure.
async fn inspect(
    conn: &mut PgConnection,
    own_schema: &str,
    settings: &ResourceSettings,
) -> anyhow::Result<Result<Resource, String>> {
    let (schema, table) = settings.schema_and_table();
    let relation = sqlx::query(
        "SELECT c.oid::int8, c.relkind::text, quote_ident(n.nspname) || '.' || quote_ident(c.relname),
                has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
                has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE')
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(schema)
    .bind(table)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(relation) = relation else {
        return Ok(Err(format!(
            "table {schema}.{table} does not exist (or fencegate's database role cannot see it); \
             names are matched exactly, without case folding"
        )));
    };
    let oid: i64 = relation.try_get(0)?;
    let kind: String = relation.try_get(1)?;
    let qualified: String = relation.try_get(2)?;
    if !matches!(kind.as_str(), "r" | "p") {
        let what = match kind.as_str() {
            "v" => "a view",
            "m" => "a materialized view",
            "f" => "a foreign table",
            "S" => "a sequence",
            _ => "not a table",
        };
        return Ok(Err(format!(
            "{qualified} is {what}; only ordinary and partitioned tables can be fenced"
        )));
    }
    if OWN_TABLES.contains(&table) || schema == own_schema {
        return Ok(Err(format!(
            "{qualified} is one of fencegate's own tables (in its schema {own_schema:?})"
        )));
    }
    // Inheritance children: a write through the parent's key finds only the parent's rows
    // (`ON CONFLICT` sees no child's), so an HTTP write could create a second row for a key a
    // child holds, and a guard on the parent does not fire for writes to a child. Partitions
    // are covered: their primary key is the partitioned table's, and the guard's trigger is
    // cloned onto each (checked with it).
    if kind == "r" {
        let children: Vec<String> = sqlx::query_scalar(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
             FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE i.inhparent = $1::oid ORDER BY 1 LIMIT 6",
        )
        .bind(oid)
        .fetch_all(&mut *conn)
        .await?;
        if !children.is_empty() {
            return Ok(Err(format!(
                "{qualified} has inheritance children ({}): fencegate's writes to it would not see their rows (a key \
                 could get a second row) and a guard on it does not cover writes to them. Fence each child as a \
                 resource of its own, or make it a partitioned table",
                children.join(", ")
            )));
        }
    }
    let missing: Vec<&str> = ["SELECT", "INSERT", "UPDATE", "DELETE"]
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match relation.try_get::<bool, _>(i + 3) {
            Ok(true) => None,
            _ => Some(*p),
        })
        .collect();
    if !missing.is_empty() {
        return Ok(Err(format!(
            "fencegate's database role lacks {} on {qualified}",
            missing.join(", ")
        )));
    }

    let columns = columns(conn, oid).await?;
    let names = || {
        columns
            .iter()
            .map(|c| c.column.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let find = |name: &str| columns.iter().position(|c| c.column.name == name);

    let mut key = Vec::with_capacity(settings.key.len());
    for name in &settings.key {
        let Some(index) = find(name) else {
            return Ok(Err(format!(
                "key column {name:?} does not exist in {qualified} (its columns: {})",
                names()
            )));
        };
        let c = &columns[index];
        if !(CANONICAL_KEY_TYPES.contains(&c.base_type.as_str()) || c.base_kind == "e") {
            return Ok(Err(format!(
                "key column {name:?} has type {}, whose text form does not identify a value; key columns must be \
                 integers, numeric, text/varchar/char, uuid, date, timestamp(tz), boolean or an enum",
                c.column.sql_type
            )));
        }
        if !c.deterministic {
            return Ok(Err(format!(
                "key column {name:?} has a nondeterministic collation: different texts can be one key"
            )));
        }
        key.push(index);
    }

    // ON CONFLICT needs a unique index on exactly the key columns: not partial, not on
    // expressions, not deferrable.
    let unique: Vec<Vec<i32>> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT k::int4 FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS u(k, n)
                      WHERE n <= i.indnkeyatts ORDER BY k)
         FROM pg_catalog.pg_index i
         WHERE i.indrelid = $1::oid AND i.indisunique AND i.indimmediate AND i.indisvalid
           AND i.indpred IS NULL AND i.indexprs IS NULL",
    )
    .bind(oid)
    .fetch_all(&mut *conn)
    .await?;
    let wanted: BTreeSet<i32> = key.iter().map(|&i| i32::from(columns[i].attnum)).collect();
    if !unique
        .iter()
        .any(|cols| cols.iter().copied().collect::<BTreeSet<_>>() == wanted)
    {
        let by_num = |n: i32| {
            columns
                .iter()
                .find(|c| i32::from(c.attnum) == n)
                .map_or("?", |c| c.column.name.as_str())
        };
        let keys: Vec<String> = unique
            .iter()
            .map(|cols| {
                format!(
                    "({})",
                    cols.iter()
                        .map(|&n| by_num(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
            .collect();
        return Ok(Err(format!(
            "key ({}) is not the primary key or a unique key of {qualified} (unique, non-partial, not deferrable); \
             its unique keys are: {}",
            settings.key.join(", "),
            if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
        )));
    }

    let fence = match (settings.fence, &settings.fence_column) {
        (FenceMode::Ledger, _) => Fence::Ledger,
        (FenceMode::Column, None) => {
            return Ok(Err("fence = \"column\" needs fence_column".into()))
        }
        (FenceMode::Column, Some(name)) => {
            let Some(index) = find(name) else {
                return Ok(Err(format!(
                    "fence column {name:?} does not exist in {qualified} (its columns: {})",
                    names()
                )));
            };
            let c = &columns[index];
            let max = match c.base_type.as_str() {
                "int8" => i64::MAX,
                "int4" => i64::from(i32::MAX),
                "int2" => i64::from(i16::MAX),
                _ => {
                    return Ok(Err(format!(
                        "fence column {name:?} has type {}; it must be an integer type (bigint holds every token)",
                        c.column.sql_type
                    )))
                }
            };
            if let Some(why) = c.column.read_only {
                return Ok(Err(format!(
                    "fence column {name:?} is {why}; fencegate must be able to write it"
                )));
            }
            Fence::Column { column: index, max }
        }
    };

    Ok(Ok(Resource {
        name: settings.name.clone(),
        relation: qualified,
        schema: schema.to_owned(),
        table: table.to_owned(),
        columns: columns.into_iter().map(|c| c.column).collect(),
        key,
        fence,
        rule: Rule::from_strict(settings.strict),
        // Its length was checked against kv.max_key_bytes by `tables::validate`.
        scope: settings
            .bound_scope(usize::MAX)
            .map_err(|e| anyhow::anyhow!(e))?,
        guard: settings.guard,
    }))
}

async fn columns(conn: &mut PgConnection, oid: i64) -> anyhow::Result<Vec<CatalogColumn>> {
    // format_type qualifies every type that is not visible on the search path: with only
    // pg_catalog on it, user types come out schema-qualified and mean the same on every
    // connection, whatever its search_path.
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query("SET LOCAL search_path = pg_catalog")
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query(
        "SELECT a.attnum, a.attname::text, format_type(a.atttypid, a.atttypmod),
                bt.typname::text, bt.typtype::text, a.attidentity::text, a.attgenerated::text,
                COALESCE(co.collisdeterministic, true)
         FROM pg_attribute a
         JOIN pg_type t ON t.oid = a.atttypid
         JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
         LEFT JOIN pg_collation co ON co.oid = a.attcollation
         WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum",
    )
    .bind(oid)
    .fetch_all(&mut *tx)
    .await?;
    tx.rollback().await?;
    rows.into_iter()
        .map(|row| {
            let base_type: String = row.try_get(3)?;
            let identity: String = row.try_get(5)?;
            let generated: String = row.try_get(6)?;
            let read_only = if !generated.is_empty() {
                Some("a generated column")
            } else if identity == "a" {
                Some("an identity column GENERATED ALWAYS")
            } else {
                None
            };
            Ok(CatalogColumn {
                attnum: row.try_get(0)?,
                column: Column {
                    name: row.try_get(1)?,
                    sql_type: row.try_get(2)?,
                    read_only,
                    identity: !identity.is_empty(),
                    key_text: if base_type == "numeric" {
                        KeyText::TrimScale
                    } else {
                        KeyText::Output
                    },
                },
                base_type,
                base_kind: row.try_get(4)?,
                deterministic: row.try_get(7)?,
            })
        })
        .collect()
}
