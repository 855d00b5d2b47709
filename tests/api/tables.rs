//! Legacy tables (`/v1/tables`, docs/tables.md): tables a test creates with plain SQL, as an
//! existing application would have, fenced in place by fencegate. Outcomes are checked over
//! HTTP *and* directly in the tables with SQL, never only through fencegate.

use std::time::{Duration, Instant};

use fencegate::tables::{FenceMode, ResourceSettings};
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::{postgres::PgPoolOptions, PgPool};

use crate::helpers::{enc, spawn_app_on, spawn_binary_with, Resp, TestApp, SCOPE, TOKEN};
use crate::pg;

/// A legacy schema: composite key, enum, numeric, timestamptz, jsonb, arrays, NOT NULL columns
/// with defaults, a CHECK, a UNIQUE, and rows that existed before fencegate.
const LEGACY_SCHEMA: &str = r#"
CREATE SCHEMA legacy;
CREATE TYPE legacy.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE legacy.orders (
    tenant     text          NOT NULL,
    order_no   integer       NOT NULL,
    status     legacy.order_status NOT NULL DEFAULT 'new',
    amount     numeric(12,2) NOT NULL DEFAULT 0 CONSTRAINT amount_not_negative CHECK (amount >= 0),
    currency   char(3)       NOT NULL DEFAULT 'EUR',
    placed_at  timestamptz   NOT NULL DEFAULT now(),
    attrs      jsonb         NOT NULL DEFAULT '{}',
    tags       text[],
    note       varchar(40),
    PRIMARY KEY (tenant, order_no)
);
CREATE TABLE legacy.accounts (
    id          uuid          PRIMARY KEY,
    email       text          NOT NULL CONSTRAINT accounts_email_key UNIQUE,
    balance     numeric(20,2) NOT NULL DEFAULT 0,
    fence_token bigint
);
CREATE TABLE legacy.tickets (id bigint PRIMARY KEY, holder text);
CREATE TABLE legacy.readings (x double precision PRIMARY KEY);
CREATE TABLE legacy.victim (id integer PRIMARY KEY);
INSERT INTO legacy.victim VALUES (1);
INSERT INTO legacy.orders (tenant, order_no, status, amount, placed_at, attrs, tags)
VALUES ('acme', 1, 'paid', 99.95, '2024-01-02T03:04:05Z', '{"legacy": true}', '{a,b}');
"#;

const ACCOUNT: &str = "6f1c2b7e-3f5d-4c1a-9a6e-2d7b8c9d0e1f";

fn orders() -> ResourceSettings {
    ResourceSettings {
        name: "orders".into(),
        table: "legacy.orders".into(),
        key: vec!["tenant".into(), "order_no".into()],
        fence: FenceMode::Ledger,
        fence_column: None,
        strict: false,
        scope: None,
        guard: None,
    }
}

fn accounts() -> ResourceSettings {
    ResourceSettings {
        name: "accounts".into(),
        table: "legacy.accounts".into(),
        key: vec!["id".into()],
        fence: FenceMode::Column,
        fence_column: Some("fence_token".into()),
        strict: false,
        scope: None,
        guard: None,
    }
}

fn tickets_strict() -> ResourceSettings {
    ResourceSettings {
        name: "tickets".into(),
        table: "legacy.tickets".into(),
        key: vec!["id".into()],
        fence: FenceMode::Ledger,
        fence_column: None,
        strict: true,
        scope: None,
        guard: None,
    }
}

const ORDERS_TOML: &str = r#"
[[resources]]
name = "orders"
table = "legacy.orders"
key = ["tenant", "order_no"]
"#;

/// A fresh database holding the legacy schema (created with SQL, not by fencegate), and a
/// direct connection pool to it.
async fn legacy_database() -> (String, PgPool) {
    let url = pg::fresh_database().await;
    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(LEGACY_SCHEMA)
        .execute(&db)
        .await
        .expect("create the legacy schema");
    (url, db)
}

struct Legacy {
    app: TestApp,
    db: PgPool,
}

async fn spawn_legacy() -> Legacy {
    let (url, db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![orders(), accounts(), tickets_strict()];
        // Many tests run at once against one PostgreSQL server: keep each one's pool small.
        s.database.max_connections = 4;
    })
    .await;
    Legacy { app, db }
}

fn path(resource: &str, key: &str) -> String {
    format!("/v1/tables/{resource}/{key}")
}

async fn write(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    scope: Option<&str>,
    body: Option<&Value>,
) -> Resp {
    let mut rb = app.req(method, path).header(TOKEN, token);
    if let Some(scope) = scope {
        rb = rb.header(SCOPE, scope);
    }
    if let Some(body) = body {
        rb = rb.json(body);
    }
    app.send(rb).await
}

async fn put(app: &TestApp, resource: &str, key: &str, token: &str, row: &Value) -> Resp {
    write(
        app,
        Method::PUT,
        &path(resource, key),
        token,
        None,
        Some(row),
    )
    .await
}

async fn patch(app: &TestApp, resource: &str, key: &str, token: &str, row: &Value) -> Resp {
    write(
        app,
        Method::PATCH,
        &path(resource, key),
        token,
        None,
        Some(row),
    )
    .await
}

async fn delete(app: &TestApp, resource: &str, key: &str, token: &str) -> Resp {
    write(app, Method::DELETE, &path(resource, key), token, None, None).await
}

/// An order row read directly from the table (not through fencegate), as JSON.
async fn order(db: &PgPool, tenant: &str, order_no: i32) -> Option<Value> {
    sqlx::query_scalar::<_, sqlx::types::Json<Value>>(
        "SELECT to_jsonb(o) FROM legacy.orders o WHERE tenant = $1 AND order_no = $2",
    )
    .bind(tenant)
    .bind(order_no)
    .fetch_optional(db)
    .await
    .expect("read legacy.orders")
    .map(|j| j.0)
}

async fn sql_text(db: &PgPool, query: &str) -> Option<String> {
    sqlx::query_scalar::<_, Option<String>>(query)
        .fetch_optional(db)
        .await
        .expect(query)
        .flatten()
}

/// Everything the catalog says about schema `legacy`: relations, columns (types, defaults,
/// nullability), constraints, indexes, triggers, rules, policies, privileges, enum labels.
const SCHEMA_DUMP: &str = r#"
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
  SELECT format('rel %s kind=%s acl=%s triggers=%s rules=%s rls=%s replident=%s',
                c.relname, c.relkind, c.relacl, c.relhastriggers, c.relhasrules, c.relrowsecurity, c.relreplident) AS line
  FROM pg_class c WHERE c.relnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('col %s.%s #%s %s notnull=%s default=%s identity=%s generated=%s dropped=%s',
                c.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attisdropped)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  WHERE c.relnamespace = 'legacy'::regnamespace AND a.attnum > 0
  UNION ALL
  SELECT format('con %s on %s: %s deferrable=%s', co.conname, co.conrelid::regclass, pg_get_constraintdef(co.oid), co.condeferrable)
  FROM pg_constraint co WHERE co.connamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('idx %s', pg_get_indexdef(i.indexrelid))
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('trg %s on %s', t.tgname, t.tgrelid::regclass)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('rule %s on %s', r.rulename, r.ev_class::regclass)
  FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('pol %s on %s', p.polname, p.polrelid::regclass)
  FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('type %s %s', t.typname, t.typtype) FROM pg_type t WHERE t.typnamespace = 'legacy'::regnamespace
  UNION ALL
  SELECT format('enum %s %s %s', t.typname, e.enumsortorder, e.enumlabel)
  FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid WHERE t.typnamespace = 'legacy'::regnamespace
) AS dump
"#;

async fn schema_dump(db: &PgPool) -> String {
    let dump = sql_text(db, SCHEMA_DUMP).await.expect("schema dump");
    assert!(
        dump.contains("col orders.amount") && dump.contains("enum order_status"),
        "dump too thin:\n{dump}"
    );
    dump
}

/// A legacy table dropped under a running server: its writes and reads are 503 naming the table
/// and what to do (not "the database is not migrated", not a 500), and the other resources go on.
#[tokio::test]
async fn a_legacy_table_dropped_under_a_running_server_is_503_naming_it() {
    let Legacy { app, db } = spawn_legacy().await;
    put(&app, "tickets", "1", "5", &json!({"holder": "a"}))
        .await
        .expect_any(&[200, 201]);
    sqlx::raw_sql("DROP TABLE legacy.tickets")
        .execute(&db)
        .await
        .expect("drop the legacy table");
    for r in [
        put(&app, "tickets", "1", "6", &json!({"holder": "b"})).await,
        app.get(&path("tickets", "1")).await,
    ] {
        let problem = r.problem(503, "unavailable");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("legacy.tickets") && detail.contains("dropped or renamed"),
            "{detail}"
        );
    }
    patch(&app, "orders", "acme,1", "7", &json!({"status": "shipped"}))
        .await
        .expect(200);
}

/// A column of a legacy table dropped under a running server (or a schema half-way through a
/// migration): 503 naming the table, never a 500.
#[tokio::test]
async fn a_legacy_tables_column_dropped_under_a_running_server_is_503() {
    let Legacy { app, db } = spawn_legacy().await;
    put(&app, "tickets", "1", "5", &json!({"holder": "a"}))
        .await
        .expect_any(&[200, 201]);
    sqlx::raw_sql("ALTER TABLE legacy.tickets DROP COLUMN holder")
        .execute(&db)
        .await
        .expect("drop the column");
    let r = put(&app, "tickets", "1", "6", &json!({"holder": "b"})).await;
    let problem = r.problem(503, "unavailable");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("legacy.tickets"), "{detail}");
    assert!(
        !detail.contains("does not exist\""),
        "database words: {detail}"
    );
}

#[tokio::test]
async fn a_row_that_predates_fencegate_is_read_and_then_fenced() {
    let Legacy { app, db } = spawn_legacy().await;

    // Written by the legacy application, never through fencegate.
    let r = app.get(&path("orders", "acme,1")).await;
    let body = r.expect(200);
    assert_eq!(body["key"], json!("acme,1"), "{body}");
    assert_eq!(
        body["fence_token"],
        Value::Null,
        "no write went through fencegate yet: {body}"
    );
    assert_eq!(
        r.header(TOKEN),
        None,
        "no fence token header for an unfenced row"
    );
    let row = &body["row"];
    assert_eq!(row["tenant"], json!("acme"));
    assert_eq!(row["order_no"], json!(1));
    assert_eq!(row["status"], json!("paid"));
    assert_eq!(row["amount"].to_string(), "99.95");
    assert_eq!(row["currency"], json!("EUR"));
    assert_eq!(row["placed_at"], json!("2024-01-02T03:04:05+00:00"));
    assert_eq!(row["attrs"], json!({"legacy": true}));
    assert_eq!(row["tags"], json!(["a", "b"]));
    assert_eq!(row["note"], Value::Null);

    let w = patch(&app, "orders", "acme,1", "7", &json!({"status": "shipped"}))
        .await
        .expect(200);
    assert_eq!(
        w,
        json!({"resource": "orders", "key": "acme,1", "fence_token": "7", "scope": null})
    );
    let r = app.get(&path("orders", "acme,1")).await;
    let body = r.expect(200);
    assert_eq!(body["fence_token"], json!("7"));
    assert_eq!(r.header(TOKEN), Some("7"));
    assert_eq!(body["row"]["status"], json!("shipped"));

    patch(
        &app,
        "orders",
        "acme,1",
        "6",
        &json!({"status": "cancelled"}),
    )
    .await
    .stale_key("acme,1", "6", "7");
    assert_eq!(
        order(&db, "acme", 1).await.unwrap()["status"],
        json!("shipped"),
        "checked with SQL"
    );
}

#[tokio::test]
async fn put_converts_json_with_the_column_types_and_fills_defaults() {
    let Legacy { app, db } = spawn_legacy().await;
    // Raw JSON text: a serde_json::Value would round 2.50 and 1234567890.12 through f64.
    let row = r#"{"status": "paid", "amount": 1234567890.12, "placed_at": "2025-06-01T12:00:00+02:00",
                  "attrs": {"gift": true, "lines": [1, 2.50]}, "tags": ["x", "y,z"]}"#;
    let rb = app
        .req(Method::PUT, &path("orders", "globex,42"))
        .header(TOKEN, "3")
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(row);
    let w = app.send(rb).await.expect(201);
    assert_eq!(
        w,
        json!({"resource": "orders", "key": "globex,42", "fence_token": "3", "scope": null})
    );

    let typed = sql_text(
        &db,
        "SELECT concat_ws('|', status, amount, currency, placed_at AT TIME ZONE 'UTC', attrs, tags, note IS NULL)
         FROM legacy.orders WHERE tenant = 'globex' AND order_no = 42",
    )
    .await
    .expect("the row is in the table");
    assert_eq!(
        typed,
        r#"paid|1234567890.12|EUR|2025-06-01 10:00:00|{"gift": true, "lines": [1, 2.50]}|{x,"y,z"}|t"#
    );

    // Numbers keep their precision on the way back, too.
    let got = app.get(&path("orders", "globex,42")).await;
    assert!(got.text.contains("1234567890.12"), "{}", got.text);
    assert!(got.text.contains("2.50"), "{}", got.text);

    // A second PUT replaces the row: what it leaves out goes back to the column default.
    put(&app, "orders", "globex,42", "3", &json!({"note": "again"}))
        .await
        .expect(200);
    let replaced = order(&db, "globex", 42).await.unwrap();
    assert_eq!(replaced["status"], json!("new"));
    // numeric(…,2): the exact digits, as PostgreSQL keeps them.
    assert_eq!(replaced["amount"].to_string(), "0.00");
    assert_eq!(replaced["attrs"], json!({}));
    assert_eq!(replaced["tags"], Value::Null);
    assert_eq!(replaced["note"], json!("again"));

    // The body may repeat the key, in any spelling PostgreSQL reads as the same value...
    put(
        &app,
        "orders",
        "globex,42",
        "3",
        &json!({"tenant": "globex", "order_no": "042"}),
    )
    .await
    .expect(200);
    // ...but not move the row.
    let e = put(&app, "orders", "globex,42", "3", &json!({"order_no": 43}))
        .await
        .problem(400, "invalid-row");
    assert_eq!(e["column"], json!("order_no"), "{e}");
    assert!(order(&db, "globex", 43).await.is_none());
}

#[tokio::test]
async fn composite_keys_are_one_segment_of_percent_encoded_values() {
    let Legacy { app, db } = spawn_legacy().await;

    // A comma, a space and a percent sign inside a key value.
    let key = format!("{},5", enc("a,b %"));
    assert_eq!(key, "a%2Cb%20%25,5");
    let w = put(&app, "orders", &key, "1", &json!({"note": "odd tenant"}))
        .await
        .expect(201);
    assert_eq!(
        w["key"],
        json!(key),
        "the canonical key is the URL form: {w}"
    );
    assert_eq!(
        order(&db, "a,b %", 5).await.unwrap()["note"],
        json!("odd tenant")
    );
    assert_eq!(
        app.get(&path("orders", &key)).await.expect(200)["row"]["tenant"],
        json!("a,b %")
    );

    let utf8 = format!("{},6", enc("café ✓"));
    put(&app, "orders", &utf8, "1", &json!({}))
        .await
        .expect(201);
    assert!(order(&db, "café ✓", 6).await.is_some());

    // One row, one fence, however the key is spelled: "007" is 7.
    put(&app, "orders", "acme,7", "5", &json!({"note": "holder"}))
        .await
        .expect(201);
    let r = put(&app, "orders", "acme,007", "4", &json!({"note": "zombie"})).await;
    r.stale_key("acme,7", "4", "5");
    put(
        &app,
        "orders",
        "acme,007",
        "5",
        &json!({"note": "holder again"}),
    )
    .await
    .expect(200);
    assert_eq!(
        order(&db, "acme", 7).await.unwrap()["note"],
        json!("holder again")
    );

    // Wrong number of values, and a value that is not an integer.
    for bad in ["acme", "acme,1,2", "acme,", ",1"] {
        put(&app, "orders", bad, "9", &json!({}))
            .await
            .problem(400, "invalid-key");
    }
    let e = put(&app, "orders", "acme,seven", "9", &json!({}))
        .await
        .problem(400, "invalid-key");
    assert_eq!(e["column"], json!("order_no"), "{e}");
    let e = app
        .get(&path("orders", "acme,1.5"))
        .await
        .problem(400, "invalid-key");
    assert_eq!(e["column"], json!("order_no"), "{e}");
}

#[tokio::test]
async fn patch_changes_only_the_named_columns_of_an_existing_row() {
    let Legacy { app, db } = spawn_legacy().await;
    let before = order(&db, "acme", 1).await.unwrap();
    patch(
        &app,
        "orders",
        "acme,1",
        "2",
        &json!({"note": "gift wrap", "amount": 120}),
    )
    .await
    .expect(200);
    let after = order(&db, "acme", 1).await.unwrap();
    for column in ["status", "currency", "placed_at", "attrs", "tags"] {
        assert_eq!(after[column], before[column], "PATCH changed {column}");
    }
    assert_eq!(after["note"], json!("gift wrap"));
    assert_eq!(after["amount"].to_string(), "120.00");

    // No row: 404, and nothing is created or fenced.
    patch(&app, "orders", "acme,404", "9", &json!({"note": "x"}))
        .await
        .problem(404, "not-found");
    assert!(order(&db, "acme", 404).await.is_none());
    put(&app, "orders", "acme,404", "1", &json!({}))
        .await
        .expect(201); // the fence was not raised to 9

    // Nothing to change.
    patch(&app, "orders", "acme,1", "2", &json!({"tenant": "acme"}))
        .await
        .problem(400, "invalid-row");
    patch(&app, "orders", "acme,1", "2", &json!({}))
        .await
        .problem(400, "invalid-row");
}

#[tokio::test]
async fn delete_leaves_a_tombstone_that_keeps_the_fence() {
    let Legacy { app, db } = spawn_legacy().await;
    let w = delete(&app, "orders", "acme,1", "10").await.expect(200);
    assert_eq!(
        w,
        json!({"resource": "orders", "key": "acme,1", "fence_token": "10", "scope": null, "deleted": true})
    );
    assert!(
        order(&db, "acme", 1).await.is_none(),
        "deleted in the table"
    );
    app.get(&path("orders", "acme,1"))
        .await
        .problem(404, "not-found");

    // A zombie cannot resurrect it with an older token...
    put(&app, "orders", "acme,1", "9", &json!({"note": "zombie"}))
        .await
        .stale_key("acme,1", "9", "10");
    delete(&app, "orders", "acme,1", "9")
        .await
        .stale_key("acme,1", "9", "10");
    assert!(order(&db, "acme", 1).await.is_none());
    // ...the holder can.
    put(&app, "orders", "acme,1", "10", &json!({"note": "back"}))
        .await
        .expect(201);
    assert_eq!(order(&db, "acme", 1).await.unwrap()["note"], json!("back"));

    // Deleting a row that never existed records the fence too.
    delete(&app, "orders", "acme,99", "20").await.expect(200);
    put(&app, "orders", "acme,99", "19", &json!({}))
        .await
        .stale_key("acme,99", "19", "20");
    assert!(order(&db, "acme", 99).await.is_none());
}

#[tokio::test]
async fn stale_writes_never_reach_the_table() {
    let Legacy { app, db } = spawn_legacy().await;
    put(
        &app,
        "orders",
        "acme,1",
        "50",
        &json!({"status": "paid", "amount": 10}),
    )
    .await
    .expect(200);
    let accepted = order(&db, "acme", 1).await.unwrap();

    let zombie = json!({"status": "cancelled", "amount": 0, "note": "zombie"});
    put(&app, "orders", "acme,1", "49", &zombie)
        .await
        .stale_key("acme,1", "49", "50");
    patch(&app, "orders", "acme,1", "0", &zombie)
        .await
        .stale_key("acme,1", "0", "50");
    delete(&app, "orders", "acme,1", "1")
        .await
        .stale_key("acme,1", "1", "50");
    let batch = json!({"ops": [
        {"op": "put", "resource": "orders", "key": "acme,2", "row": {"note": "zombie"}},
        {"op": "patch", "resource": "orders", "key": "acme,1", "row": {"note": "zombie"}},
    ]});
    let e = app
        .batch(Some("49"), None, &batch)
        .await
        .problem(412, "stale-token");
    assert_eq!(e["key"], json!("acme,1"), "{e}");
    assert_eq!(e["resource"], json!("orders"), "{e}");

    assert_eq!(
        order(&db, "acme", 1).await.unwrap(),
        accepted,
        "checked with SQL: untouched"
    );
    assert!(
        order(&db, "acme", 2).await.is_none(),
        "the batch's other op was not applied either"
    );
    let count = sql_text(&db, "SELECT count(*)::text FROM legacy.orders").await;
    assert_eq!(count.as_deref(), Some("1"));
}

#[tokio::test]
async fn type_and_constraint_errors_name_the_column_and_change_nothing() {
    let Legacy { app, db } = spawn_legacy().await;
    let before = order(&db, "acme", 1).await.unwrap();
    let long_note = "x".repeat(41);
    let cases = [
        (json!({"status": "shipd"}), "status"),
        (json!({"amount": "12,50"}), "amount"),
        (json!({"amount": 1e12}), "amount"),
        (json!({"placed_at": "next tuesday"}), "placed_at"),
        (json!({"note": long_note}), "note"),
        (json!({"tags": "not an array"}), "tags"),
        (json!({"status": null}), "status"),
        (json!({"currency": null, "note": "ok"}), "currency"),
    ];
    for (row, column) in cases {
        let e = put(&app, "orders", "acme,1", "5", &row)
            .await
            .problem(422, "invalid-value");
        assert_eq!(e["column"], json!(column), "{row}: {e}");
        assert!(
            e["detail"].as_str().unwrap().contains(column),
            "{row}: the detail names the column: {e}"
        );
    }
    let e = patch(&app, "orders", "acme,1", "5", &json!({"amount": -1}))
        .await
        .problem(422, "invalid-value");
    assert_eq!(e["constraint"], json!("amount_not_negative"), "{e}");

    for (row, column) in [
        (json!({"colour": "red"}), "colour"),
        (json!({"Status": "paid"}), "Status"),
    ] {
        let e = put(&app, "orders", "acme,1", "5", &row)
            .await
            .problem(400, "invalid-row");
        assert_eq!(e["column"], json!(column), "{e}");
    }
    let r = app
        .send(
            app.req(Method::PUT, &path("orders", "acme,1"))
                .header(TOKEN, "5")
                .json(&json!([1, 2])),
        )
        .await;
    r.problem(400, "invalid-json");

    // A unique key other than the row's own: refused, naming the constraint.
    put(
        &app,
        "accounts",
        ACCOUNT,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .expect(201);
    let other = "00000000-0000-4000-8000-000000000001";
    let e = put(
        &app,
        "accounts",
        other,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .problem(422, "invalid-value");
    assert_eq!(e["constraint"], json!("accounts_email_key"), "{e}");
    let e = app
        .get(&path("accounts", "not-a-uuid"))
        .await
        .problem(400, "invalid-key");
    assert_eq!(e["column"], json!("id"), "{e}");

    assert_eq!(
        order(&db, "acme", 1).await.unwrap(),
        before,
        "no refused write changed the row"
    );
    // Nor raised its fence: a token lower than every refused one is still accepted.
    patch(&app, "orders", "acme,1", "0", &json!({"note": "fine"}))
        .await
        .expect(200);
}

#[tokio::test]
async fn injection_shaped_keys_resources_and_columns_are_refused_and_change_nothing() {
    let Legacy { app, db } = spawn_legacy().await;
    let dump = schema_dump(&db).await;
    let before = order(&db, "acme", 1).await.unwrap();
    let evil = "1\"; DROP TABLE legacy.victim; --";

    let e = put(
        &app,
        "orders",
        &format!("acme,{}", enc(evil)),
        "1",
        &json!({}),
    )
    .await
    .problem(400, "invalid-key");
    assert_eq!(e["column"], json!("order_no"), "{e}");
    put(
        &app,
        "orders",
        &enc(&format!("acme,{evil}")),
        "1",
        &json!({}),
    )
    .await
    .problem(400, "invalid-key");
    let e = put(
        &app,
        "orders",
        "acme,1",
        "1",
        &json!({"id\"; DROP TABLE legacy.victim; --": 1}),
    )
    .await
    .problem(400, "invalid-row");
    assert_eq!(
        e["column"],
        json!("id\"; DROP TABLE legacy.victim; --"),
        "{e}"
    );
    let e = patch(
        &app,
        "orders",
        "acme,1",
        "1",
        &json!({"note\" = 'x'; DELETE FROM legacy.orders; --": "x"}),
    )
    .await;
    e.problem(400, "invalid-row");
    put(
        &app,
        &enc("orders\"; DROP TABLE legacy.victim; --"),
        "1",
        "1",
        &json!({}),
    )
    .await
    .problem(404, "not-found");
    app.get(&path(&enc("legacy.victim"), "1"))
        .await
        .problem(404, "not-found");
    let batch =
        json!({"ops": [{"op": "delete", "resource": "orders", "key": format!("acme,{evil}")}]});
    app.batch(Some("1"), None, &batch)
        .await
        .problem(400, "invalid-key");

    assert_eq!(
        sql_text(&db, "SELECT count(*)::text FROM legacy.victim")
            .await
            .as_deref(),
        Some("1")
    );
    assert_eq!(order(&db, "acme", 1).await.unwrap(), before);
    assert_eq!(schema_dump(&db).await, dump);
}

#[tokio::test]
async fn the_schema_is_byte_for_byte_the_same_after_a_run() {
    let (url, db) = legacy_database().await;
    let before = schema_dump(&db).await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![orders(), accounts(), tickets_strict()]
    })
    .await;

    put(
        &app,
        "orders",
        "acme,2",
        "1",
        &json!({"status": "paid", "amount": 5}),
    )
    .await
    .expect(201);
    patch(&app, "orders", "acme,1", "2", &json!({"note": "n"}))
        .await
        .expect(200);
    delete(&app, "orders", "acme,2", "3").await.expect(200);
    put(&app, "orders", "acme,2", "2", &json!({}))
        .await
        .problem(412, "stale-token");
    put(&app, "orders", "acme,3", "3", &json!({"status": "bogus"}))
        .await
        .problem(422, "invalid-value");
    put(
        &app,
        "accounts",
        ACCOUNT,
        "4",
        &json!({"email": "e@example.com"}),
    )
    .await
    .expect(201);
    delete(&app, "accounts", ACCOUNT, "5").await.expect(200);
    put(&app, "tickets", "1", "1", &json!({"holder": "h"}))
        .await
        .expect(201);
    let batch = json!({"ops": [
        {"op": "put", "key": "kv", "value": 1},
        {"op": "put", "resource": "orders", "key": "acme,4", "row": {}},
    ]});
    app.batch(Some("9"), None, &batch).await.expect(200);
    app.get(&path("orders", "acme,4")).await.expect(200);

    assert_eq!(
        schema_dump(&db).await,
        before,
        "fencegate changed the legacy schema"
    );
}

#[tokio::test]
async fn column_mode_keeps_the_fence_in_the_table_and_tombstones_in_the_ledger() {
    let Legacy { app, db } = spawn_legacy().await;
    let fence_column = || {
        sql_text(&db, "SELECT fence_token::text FROM legacy.accounts WHERE id = '6f1c2b7e-3f5d-4c1a-9a6e-2d7b8c9d0e1f'")
    };

    let w = put(
        &app,
        "accounts",
        ACCOUNT,
        "7",
        &json!({"email": "a@example.com", "balance": "12345678901234567.89"}),
    )
    .await
    .expect(201);
    assert_eq!(w["key"], json!(ACCOUNT));
    assert_eq!(
        fence_column().await.as_deref(),
        Some("7"),
        "the token is in the table's own column"
    );
    let balance = sql_text(&db, "SELECT balance::text FROM legacy.accounts").await;
    assert_eq!(
        balance.as_deref(),
        Some("12345678901234567.89"),
        "numeric precision survives"
    );
    let got = app.get(&path("accounts", &ACCOUNT.to_uppercase())).await;
    assert!(got.text.contains("12345678901234567.89"), "{}", got.text);
    let got = got.expect(200);
    assert_eq!(got["key"], json!(ACCOUNT), "uuid keys are canonical: {got}");
    assert_eq!(got["fence_token"], json!("7"));

    // The column is fencegate's to write.
    let e = patch(&app, "accounts", ACCOUNT, "8", &json!({"fence_token": 100}))
        .await
        .problem(400, "invalid-row");
    assert_eq!(e["column"], json!("fence_token"));

    // A writer that maintains the column itself raises the fence fencegate checks.
    sqlx::query("UPDATE legacy.accounts SET fence_token = 50")
        .execute(&db)
        .await
        .unwrap();
    patch(&app, "accounts", ACCOUNT, "40", &json!({"balance": 0}))
        .await
        .stale_key(ACCOUNT, "40", "50");
    patch(&app, "accounts", ACCOUNT, "50", &json!({"balance": 1}))
        .await
        .expect(200);
    // One that lowers or clears it does not lower fencegate's fence (the ledger keeps it).
    sqlx::query("UPDATE legacy.accounts SET fence_token = NULL")
        .execute(&db)
        .await
        .unwrap();
    patch(&app, "accounts", ACCOUNT, "49", &json!({"balance": 2}))
        .await
        .stale_key(ACCOUNT, "49", "50");

    // Deleted, the row loses its column; the ledger keeps the tombstone.
    delete(&app, "accounts", ACCOUNT, "60").await.expect(200);
    assert_eq!(fence_column().await, None);
    put(
        &app,
        "accounts",
        ACCOUNT,
        "59",
        &json!({"email": "z@example.com"}),
    )
    .await
    .stale_key(ACCOUNT, "59", "60");
    assert_eq!(
        sql_text(&db, "SELECT count(*)::text FROM legacy.accounts")
            .await
            .as_deref(),
        Some("0")
    );
    put(
        &app,
        "accounts",
        ACCOUNT,
        "61",
        &json!({"email": "b@example.com"}),
    )
    .await
    .expect(201);
    assert_eq!(fence_column().await.as_deref(), Some("61"));
}

#[tokio::test]
async fn scoped_table_writes_are_fenced_by_the_scope() {
    let Legacy { app, db } = spawn_legacy().await;
    app.claim("orders-lock", "100").await.expect(201);
    let zombie = write(
        &app,
        Method::PUT,
        &path("orders", "acme,20"),
        "99",
        Some("orders-lock"),
        Some(&json!({})),
    )
    .await;
    zombie.stale_scope("orders-lock", "99", "100");
    assert!(order(&db, "acme", 20).await.is_none());

    let holder = json!({"note": "holder"});
    let w = write(
        &app,
        Method::PUT,
        &path("orders", "acme,20"),
        "100",
        Some("orders-lock"),
        Some(&holder),
    )
    .await;
    assert_eq!(w.expect(201)["scope"], json!("orders-lock"));
    let got = app.get(&path("orders", "acme,20")).await.expect(200);
    assert_eq!(
        (got["fence_token"].clone(), got["scope"].clone()),
        (json!("100"), json!("orders-lock"))
    );
    // A scoped write raised the scope, not the row's own fence.
    assert_eq!(
        app.fence("orders-lock").await.expect(200)["fence_token"],
        json!("100")
    );
    let d = write(
        &app,
        Method::DELETE,
        &path("orders", "acme,20"),
        "101",
        Some("orders-lock"),
        None,
    )
    .await;
    d.expect(200);
    assert!(order(&db, "acme", 20).await.is_none());
    assert_eq!(
        app.fence("orders-lock").await.expect(200)["fence_token"],
        json!("101")
    );
}

#[tokio::test]
async fn strict_resources_take_one_write_per_token() {
    let Legacy { app, db } = spawn_legacy().await;
    put(&app, "tickets", "1", "5", &json!({"holder": "first"}))
        .await
        .expect(201);
    put(&app, "tickets", "1", "5", &json!({"holder": "again"}))
        .await
        .stale_key("1", "5", "5");
    put(&app, "tickets", "1", "6", &json!({"holder": "next"}))
        .await
        .expect(200);
    assert_eq!(
        sql_text(&db, "SELECT holder FROM legacy.tickets WHERE id = 1")
            .await
            .as_deref(),
        Some("next")
    );
    // The other resources keep the inclusive rule.
    put(&app, "orders", "acme,1", "5", &json!({}))
        .await
        .expect(200);
    put(&app, "orders", "acme,1", "5", &json!({}))
        .await
        .expect(200);
}

#[tokio::test]
async fn unknown_resources_are_404_problems() {
    let Legacy { app, .. } = spawn_legacy().await;
    put(&app, "nope", "1", "1", &json!({}))
        .await
        .problem(404, "not-found");
    app.get(&path("nope", "1")).await.problem(404, "not-found");
    delete(&app, "victim", "1", "1")
        .await
        .problem(404, "not-found"); // a table, but not configured
    let batch = json!({"ops": [{"op": "delete", "resource": "nope", "key": "1"}]});
    app.batch(Some("1"), None, &batch)
        .await
        .problem(404, "not-found");
    // Token rules are those of kv.
    app.send(
        app.req(Method::PUT, &path("orders", "acme,1"))
            .json(&json!({})),
    )
    .await
    .problem(428, "missing-token");
    app.send(
        app.req(Method::DELETE, &path("orders", "acme,1"))
            .header(TOKEN, "007"),
    )
    .await
    .problem(400, "malformed-token");
}

#[tokio::test]
async fn a_batch_mixes_kv_and_table_ops_all_or_nothing() {
    let Legacy { app, db } = spawn_legacy().await;
    put(
        &app,
        "accounts",
        ACCOUNT,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .expect(201);

    let ok = json!({"ops": [
        {"op": "put", "key": "invoice-10", "value": {"total": 10}},
        {"op": "put", "resource": "orders", "key": "acme,10", "row": {"status": "paid", "amount": 10}},
        {"op": "patch", "resource": "orders", "key": "acme,1", "row": {"note": "batched"}},
        {"op": "delete", "resource": "accounts", "key": ACCOUNT},
        {"op": "patch", "resource": "orders", "key": "acme,10", "row": {"note": "same row twice"}},
    ]});
    let body = app.batch(Some("20"), None, &ok).await.expect(200);
    assert_eq!(
        body,
        json!({"fence_token": "20", "scope": null, "results": [
            {"op": "put", "key": "invoice-10", "status": 201},
            {"op": "put", "resource": "orders", "key": "acme,10", "status": 201},
            {"op": "patch", "resource": "orders", "key": "acme,1", "status": 200},
            {"op": "delete", "resource": "accounts", "key": ACCOUNT, "status": 200},
            {"op": "patch", "resource": "orders", "key": "acme,10", "status": 200},
        ]})
    );
    app.assert_value("invoice-10", &json!({"total": 10}), "20")
        .await;
    let row = order(&db, "acme", 10).await.unwrap();
    assert_eq!(
        (row["status"].clone(), row["note"].clone()),
        (json!("paid"), json!("same row twice"))
    );
    assert_eq!(
        order(&db, "acme", 1).await.unwrap()["note"],
        json!("batched")
    );
    assert_eq!(
        sql_text(&db, "SELECT count(*)::text FROM legacy.accounts")
            .await
            .as_deref(),
        Some("0")
    );

    // One stale row: nothing at all, kv included.
    let stale = json!({"ops": [
        {"op": "put", "key": "invoice-11", "value": 11},
        {"op": "put", "resource": "orders", "key": "acme,11", "row": {}},
        {"op": "put", "resource": "orders", "key": "acme,10", "row": {"note": "zombie"}},
    ]});
    let e = app
        .batch(Some("19"), None, &stale)
        .await
        .problem(412, "stale-token");
    assert_eq!(
        (e["resource"].clone(), e["key"].clone()),
        (json!("orders"), json!("acme,10")),
        "{e}"
    );
    assert_eq!(
        e["stale_keys"],
        json!([{"resource": "orders", "key": "acme,10", "current_token": "20"}]),
        "{e}"
    );
    // One stale kv key: nothing at all, tables included.
    let stale_kv = json!({"ops": [
        {"op": "put", "resource": "orders", "key": "acme,11", "row": {}},
        {"op": "put", "key": "invoice-10", "value": "zombie"},
    ]});
    app.batch(Some("19"), None, &stale_kv)
        .await
        .stale_key("invoice-10", "19", "20");
    // One refused value: nothing at all, and the op is named.
    let invalid = json!({"ops": [
        {"op": "put", "key": "invoice-11", "value": 11},
        {"op": "put", "resource": "orders", "key": "acme,11", "row": {}},
        {"op": "patch", "resource": "orders", "key": "acme,1", "row": {"status": "lost"}},
    ]});
    let e = app
        .batch(Some("30"), None, &invalid)
        .await
        .problem(422, "invalid-value");
    assert_eq!(e["column"], json!("status"), "{e}");
    assert!(e["detail"].as_str().unwrap().starts_with("ops[2]: "), "{e}");

    app.assert_absent("invoice-11").await;
    app.assert_value("invoice-10", &json!({"total": 10}), "20")
        .await;
    assert!(order(&db, "acme", 11).await.is_none());
    assert_eq!(
        order(&db, "acme", 10).await.unwrap()["note"],
        json!("same row twice")
    );
    assert_eq!(
        order(&db, "acme", 1).await.unwrap()["status"],
        json!("paid")
    );
    // The refused batches raised no fence.
    put(&app, "orders", "acme,11", "1", &json!({}))
        .await
        .expect(201);

    // Shape errors of table ops.
    for (op, slug) in [
        (
            json!({"op": "put", "resource": "orders", "key": "acme,1"}),
            "invalid-batch",
        ),
        (
            json!({"op": "put", "resource": "orders", "key": "acme,1", "value": 1}),
            "invalid-batch",
        ),
        (json!({"op": "put", "key": "k", "row": {}}), "invalid-batch"),
        (
            json!({"op": "upsert", "resource": "orders", "key": "acme,1", "row": {}}),
            "invalid-batch",
        ),
        (
            json!({"op": "put", "resource": "orders", "key": "acme,1", "row": {"nope": 1}}),
            "invalid-row",
        ),
    ] {
        app.batch(Some("40"), None, &json!({"ops": [op]}))
            .await
            .problem(400, slug);
    }
}

#[tokio::test]
async fn scoped_batches_claim_the_scope_once_for_kv_and_tables() {
    let Legacy { app, db } = spawn_legacy().await;
    let ops = json!({"ops": [
        {"op": "put", "key": "k", "value": 1},
        {"op": "put", "resource": "orders", "key": "acme,30", "row": {}},
        {"op": "put", "resource": "tickets", "key": "30", "row": {"holder": "h"}},
    ]});
    // tickets is strict, so the shared scope is claimed with the strict rule, once.
    app.batch(Some("5"), Some("S"), &ops).await.expect(200);
    app.batch(Some("5"), Some("S"), &ops)
        .await
        .stale_scope("S", "5", "5");
    let only_tables = json!({"ops": [{"op": "delete", "resource": "orders", "key": "acme,30"}]});
    app.batch(Some("4"), Some("S"), &only_tables)
        .await
        .stale_scope("S", "4", "5");
    assert!(order(&db, "acme", 30).await.is_some());
    app.batch(Some("6"), Some("S"), &only_tables)
        .await
        .expect(200);
    assert!(order(&db, "acme", 30).await.is_none());
}

#[tokio::test]
async fn writers_that_bypass_fencegate_keep_working() {
    let Legacy { app, db } = spawn_legacy().await;
    put(&app, "orders", "acme,1", "10", &json!({"status": "paid"}))
        .await
        .expect(200);

    // The legacy application keeps writing with plain SQL: nothing stops or changes it.
    sqlx::raw_sql(
        "INSERT INTO legacy.orders (tenant, order_no) VALUES ('direct', 1);
         UPDATE legacy.orders SET note = 'direct write' WHERE tenant = 'acme' AND order_no = 1;",
    )
    .execute(&db)
    .await
    .expect("direct SQL writes still work");
    let got = app.get(&path("orders", "acme,1")).await.expect(200);
    assert_eq!(
        got["row"]["note"],
        json!("direct write"),
        "fencegate reads what is in the table"
    );
    assert_eq!(
        got["fence_token"],
        json!("10"),
        "the token of the last write fencegate accepted"
    );

    // A direct write does not lower fencegate's fence...
    put(&app, "orders", "acme,1", "9", &json!({}))
        .await
        .stale_key("acme,1", "9", "10");
    // ...and a row created directly is fenced from its first write through fencegate on.
    put(
        &app,
        "orders",
        "direct,1",
        "3",
        &json!({"note": "via fencegate"}),
    )
    .await
    .expect(200);
    put(&app, "orders", "direct,1", "2", &json!({}))
        .await
        .stale_key("direct,1", "2", "3");
    sqlx::query("DELETE FROM legacy.orders WHERE tenant = 'direct'")
        .execute(&db)
        .await
        .unwrap();
    put(&app, "orders", "direct,1", "2", &json!({}))
        .await
        .stale_key("direct,1", "2", "3");
}

/// Runs the real binary with `config` and returns (exit code, stdout, stderr); it must exit.
async fn run_binary(args: &[&str], config: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fencegate.toml");
    std::fs::write(&file, config).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("FENCEGATE_LISTEN")
        .env_remove("FENCEGATE_CONFIG")
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .expect("fencegate with a bad resource must exit, not serve")
        .expect("run fencegate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn bad_resources_fail_start_naming_the_resource() {
    let (url, _db) = legacy_database().await;
    let cases = [
        (
            "ghost",
            r#"table = "legacy.nope"
key = ["id"]"#,
            "legacy.nope does not exist",
        ),
        (
            "nokey",
            r#"table = "legacy.orders"
key = ["id"]"#,
            "key column \"id\" does not exist",
        ),
        (
            "halfkey",
            r#"table = "legacy.orders"
key = ["tenant"]"#,
            "not the primary key or a unique key",
        ),
        (
            "textfence",
            r#"table = "legacy.accounts"
key = ["id"]
fence = "column"
fence_column = "email""#,
            "must be an integer type",
        ),
        (
            "nofencecol",
            r#"table = "legacy.accounts"
key = ["id"]
fence = "column""#,
            "needs fence_column",
        ),
        (
            "view",
            r#"table = "pg_catalog.pg_tables"
key = ["tablename"]"#,
            "is a view",
        ),
        (
            "floaty",
            r#"table = "legacy.readings"
key = ["x"]"#,
            "whose text form does not identify a value",
        ),
    ];
    for (name, body, problem) in cases {
        let config = format!("[[resources]]\nname = \"{name}\"\n{body}\n");
        let (code, stdout, stderr) = run_binary(&["--database-url", &url], &config).await;
        assert_eq!(
            code,
            Some(1),
            "{name}: exit code\nstdout: {stdout}\nstderr: {stderr}"
        );
        assert!(
            !stdout.contains("listening on"),
            "{name}: it must not serve\n{stdout}"
        );
        assert!(
            stderr.contains(&format!("\"{name}\"")),
            "{name}: stderr names the resource:\n{stderr}"
        );
        assert!(
            stderr.contains(problem),
            "{name}: stderr says {problem:?}:\n{stderr}"
        );
    }

    // Two bad resources: both are reported.
    let config = "[[resources]]\nname = \"a\"\ntable = \"legacy.nope\"\nkey = [\"id\"]\n\
                  [[resources]]\nname = \"b\"\ntable = \"legacy.orders\"\nkey = [\"note\"]\n";
    let (code, _, stderr) = run_binary(&["--database-url", &url], config).await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("\"a\"") && stderr.contains("\"b\""),
        "{stderr}"
    );

    // Legacy tables are PostgreSQL tables: not on the embedded SQLite store.
    let (code, stdout, stderr) = run_binary(&[], ORDERS_TOML).await;
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("\"orders\"") && stderr.contains("need PostgreSQL"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_zombie_frozen_with_sigstop_cannot_overwrite_a_legacy_row() {
    use nix::{
        sys::signal::{kill, Signal},
        unistd::Pid,
    };
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

    let (url, db) = legacy_database().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fencegate.toml");
    std::fs::write(&config, ORDERS_TOML).unwrap();
    let server = spawn_binary_with(&url, &["--config", config.to_str().unwrap()]).await;
    let base = server.address.clone();
    let lock = "orders-acme-7";
    let go = dir.path().join("go");
    let out = dir.path().join("zombie-response.json");

    // The zombie is a real process: it takes a short lease (its fencing token), reports the
    // token, and writes as soon as it sees the go file. It will be frozen in between.
    let script = r#"
        token=$(curl -sS -X POST -H 'content-type: application/json' \
                     -d '{"owner":"zombie","ttl_ms":300}' "$BASE/v1/locks/$LOCK" \
                | sed -E 's/.*"token":"([0-9]+)".*/\1/')
        echo "$token"
        while [ ! -e "$GO" ]; do sleep 0.02; done
        exec curl -sS -o "$OUT" -w '%{http_code}' -X PUT -H "X-Fencing-Token: $token" \
             -H 'content-type: application/json' -d '{"status":"cancelled","note":"zombie"}' \
             "$BASE/v1/tables/orders/acme,7"
    "#;
    let mut zombie = tokio::process::Command::new("sh")
        .args(["-c", script])
        .env("BASE", &base)
        .env("LOCK", lock)
        .env("GO", &go)
        .env("OUT", &out)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sh and curl are needed for this test (apt-get install curl)");
    let mut stdout = BufReader::new(zombie.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    let zombie_token: i64 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("zombie's token: {line:?}"));

    // Freeze it (a GC pause, a VM stall) right before its write, and tell it to write.
    let pid = Pid::from_raw(zombie.id().unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // Only once the kernel reports it stopped ("T") may it be told to go.
    let stat = format!("/proc/{pid}/stat");
    while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    std::fs::write(&go, "").unwrap();

    // Its lease runs out while it is frozen; a successor gets a newer token and writes.
    let app = server.view();
    let started = Instant::now();
    let successor: i64 = loop {
        let r = app
            .send(
                app.req(Method::POST, &format!("/v1/locks/{lock}"))
                    .json(&json!({"owner": "successor", "ttl_ms": 60000})),
            )
            .await;
        if r.status == 201 {
            break r.json()["token"].as_str().unwrap().parse().unwrap();
        }
        assert_eq!(r.status, 409, "{}", r.text);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the zombie's 300 ms lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(successor > zombie_token);
    let row = json!({"status": "paid", "note": "successor"});
    put(&app, "orders", "acme,7", &successor.to_string(), &row)
        .await
        .expect(201);

    // The zombie wakes up and sends its write, with its old token.
    kill(pid, Signal::SIGCONT).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), zombie.wait())
        .await
        .unwrap()
        .unwrap();
    let mut code = String::new();
    stdout.read_to_string(&mut code).await.unwrap();
    assert!(status.success(), "curl failed: {status:?}");
    assert_eq!(code.trim(), "412", "the zombie's write must be refused");
    let problem: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        problem["presented_token"],
        json!(zombie_token.to_string()),
        "{problem}"
    );
    assert_eq!(
        problem["current_token"],
        json!(successor.to_string()),
        "{problem}"
    );
    assert_eq!(problem["key"], json!("acme,7"), "{problem}");

    // Checked in the table itself: the successor's row, untouched by the zombie.
    let row = order(&db, "acme", 7).await.expect("the successor's row");
    assert_eq!(
        (row["status"].clone(), row["note"].clone()),
        (json!("paid"), json!("successor"))
    );

    let (status, stderr) = server.terminate().await;
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// One concurrent write and what it saw.
#[derive(Debug, Clone)]
struct Attempt {
    token: i64,
    start: Instant,
    end: Instant,
    status: u16,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_of_one_row_obey_the_accept_rule() {
    use rand::{Rng, SeedableRng};

    let seed: u64 = rand::random();
    let Legacy { app, db } = spawn_legacy().await;
    let app = std::sync::Arc::new(app);
    let mut tasks = Vec::new();
    for w in 0..12u64 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ w);
            let mut seen = Vec::new();
            for _ in 0..15 {
                let token: i64 = rng.gen_range(0..300);
                // Even writers use the ledger resource, odd ones the column-mode resource.
                let (resource, key, row) = if w % 2 == 0 {
                    (
                        "orders",
                        "acme,1".to_string(),
                        json!({"note": token.to_string()}),
                    )
                } else {
                    (
                        "accounts",
                        ACCOUNT.to_string(),
                        json!({"email": format!("{token}@example.com")}),
                    )
                };
                let start = Instant::now();
                let r = put(&app, resource, &key, &token.to_string(), &row).await;
                seen.push((
                    w % 2,
                    Attempt {
                        token,
                        start,
                        end: Instant::now(),
                        status: r.status,
                    },
                ));
            }
            seen
        }));
    }
    let mut attempts: [Vec<Attempt>; 2] = [Vec::new(), Vec::new()];
    for task in tasks {
        for (row, attempt) in task.await.unwrap() {
            attempts[row as usize].push(attempt);
        }
    }

    let ctx = format!("(seed {seed})");
    for (row, attempts) in attempts.iter().enumerate() {
        let accepted: Vec<&Attempt> = attempts
            .iter()
            .filter(|a| matches!(a.status, 200 | 201))
            .collect();
        for a in attempts {
            assert!(
                matches!(a.status, 200 | 201 | 412),
                "{ctx} unexpected status {a:?}"
            );
        }
        // Once an accepted write has finished, no write that starts later with a lower token
        // may be accepted: that is the fence.
        for a in &accepted {
            for b in &accepted {
                assert!(
                    !(a.end < b.start && b.token < a.token),
                    "{ctx} row {row}: {b:?} was accepted after {a:?}"
                );
            }
        }
        let max = accepted
            .iter()
            .map(|a| a.token)
            .max()
            .expect("some write was accepted");
        // The table holds the highest accepted write (checked with SQL).
        let stored = if row == 0 {
            sql_text(
                &db,
                "SELECT note FROM legacy.orders WHERE tenant = 'acme' AND order_no = 1",
            )
            .await
        } else {
            sql_text(&db, "SELECT split_part(email, '@', 1) FROM legacy.accounts").await
        };
        assert_eq!(stored, Some(max.to_string()), "{ctx} row {row}");
        if row == 1 {
            let fence = sql_text(&db, "SELECT fence_token::text FROM legacy.accounts").await;
            assert_eq!(
                fence,
                Some(max.to_string()),
                "{ctx} the fence column holds the highest token"
            );
        }
    }
}

#[tokio::test]
async fn the_example_config_starts_against_its_schema() {
    // The schema config/tables.example.toml describes, created by "the application".
    let url = pg::fresh_database().await;
    let db = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA shop;
         CREATE TYPE shop.order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
         CREATE TABLE shop.orders (
             tenant text NOT NULL, order_no integer NOT NULL,
             status shop.order_status NOT NULL DEFAULT 'new',
             amount numeric(12,2) NOT NULL DEFAULT 0 CHECK (amount >= 0),
             placed_at timestamptz NOT NULL DEFAULT now(), attrs jsonb NOT NULL DEFAULT '{}',
             PRIMARY KEY (tenant, order_no));
         CREATE SCHEMA billing;
         CREATE TABLE billing.accounts (id uuid PRIMARY KEY, email text NOT NULL UNIQUE,
             balance numeric(20,2) NOT NULL DEFAULT 0, fence_token bigint);
         CREATE TABLE public.job_runs (id bigserial PRIMARY KEY, job text NOT NULL UNIQUE,
             state text NOT NULL, finished_at timestamptz);",
    )
    .execute(&db)
    .await
    .unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tables.example.toml");
    let server = spawn_binary_with(&url, &["--config", example]).await;
    let app = server.view();
    put(&app, "orders", "acme,1042", "1", &json!({"status": "paid"}))
        .await
        .expect(201);
    put(
        &app,
        "accounts",
        ACCOUNT,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .expect(201);
    put(
        &app,
        "job-runs",
        "nightly",
        "1",
        &json!({"state": "running"}),
    )
    .await
    .expect(201);
    put(&app, "job-runs", "nightly", "1", &json!({"state": "done"}))
        .await
        .stale_key("nightly", "1", "1");
    let state = sql_text(
        &db,
        "SELECT state FROM public.job_runs WHERE job = 'nightly'",
    )
    .await;
    assert_eq!(state.as_deref(), Some("running"));
    let (status, stderr) = server.terminate().await;
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// Sticky scope on a table row (docs/api.md, *How fencegate decides*): B holds `orders-lock` and wrote the row
/// under it; zombie A, with the old token, tries to leave the scope out or name another one,
/// on every write path. The row in the table is checked with SQL.
#[tokio::test]
async fn a_zombie_cannot_step_around_the_scope_of_a_table_row() {
    let Legacy { app, db } = spawn_legacy().await;
    app.claim("orders-lock", "20").await.expect(201);
    let row = path("orders", "acme,30");
    write(
        &app,
        Method::PUT,
        &row,
        "20",
        Some("orders-lock"),
        Some(&json!({"note": "B"})),
    )
    .await
    .expect(201);

    let mismatch = |r: Resp, presented: Option<&str>| {
        let body = r.mismatch("acme,30", Some("orders-lock"), presented);
        assert_eq!(body["resource"], json!("orders"), "{body}");
    };
    let zombie = json!({"note": "A"});
    for method in [Method::PUT, Method::PATCH] {
        mismatch(
            write(&app, method.clone(), &row, "10", None, Some(&zombie)).await,
            None,
        );
        mismatch(
            write(
                &app,
                method.clone(),
                &row,
                "10",
                Some("orders-lockX"),
                Some(&zombie),
            )
            .await,
            Some("orders-lockX"),
        );
        write(&app, method, &row, "10", Some("orders-lock"), Some(&zombie))
            .await
            .stale_scope("orders-lock", "10", "20");
    }
    mismatch(
        write(&app, Method::DELETE, &row, "10", None, None).await,
        None,
    );
    mismatch(
        write(&app, Method::DELETE, &row, "10", Some("orders-lockX"), None).await,
        Some("orders-lockX"),
    );
    let ops = json!({"ops": [
        {"op": "put", "key": "beside", "value": 1},
        {"op": "patch", "resource": "orders", "key": "acme,30", "row": {"note": "A"}},
    ]});
    mismatch(app.batch(Some("10"), None, &ops).await, None);
    mismatch(
        app.batch(Some("10"), Some("orders-lockX"), &ops).await,
        Some("orders-lockX"),
    );
    app.batch(Some("10"), Some("orders-lock"), &ops)
        .await
        .stale_scope("orders-lock", "10", "20");

    assert_eq!(order(&db, "acme", 30).await.unwrap()["note"], json!("B"));
    app.assert_absent("beside").await;
    app.fence("orders-lockX").await.problem(404, "not-found");
    assert_eq!(
        sql_text(
            &db,
            "SELECT scope || ':' || token FROM fencegate.fencegate_ledger WHERE key = 'acme,30'"
        )
        .await
        .as_deref(),
        Some("orders-lock:20")
    );
}

#[tokio::test]
async fn an_unscoped_table_row_refuses_a_scoped_write_and_raises_no_fence() {
    let Legacy { app, db } = spawn_legacy().await;
    put(
        &app,
        "orders",
        "acme,31",
        "5",
        &json!({"note": "own fence"}),
    )
    .await
    .expect(201);
    let r = write(
        &app,
        Method::PUT,
        &path("orders", "acme,31"),
        "100",
        Some("S31"),
        Some(&json!({"note": "x"})),
    )
    .await;
    r.mismatch("acme,31", None, Some("S31"));
    // The claim ran in the same transaction and was rolled back with it.
    app.fence("S31").await.problem(404, "not-found");
    assert_eq!(
        order(&db, "acme", 31).await.unwrap()["note"],
        json!("own fence")
    );
    put(&app, "orders", "acme,31", "4", &json!({}))
        .await
        .stale_key("acme,31", "4", "5");
}

#[tokio::test]
async fn a_table_bound_to_a_scope_is_written_under_it() {
    let (url, db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![ResourceSettings {
            scope: Some("orders-lock".into()),
            ..orders()
        }];
        s.database.max_connections = 4;
    })
    .await;
    let body = put(&app, "orders", "acme,40", "7", &json!({"note": "holder"}))
        .await
        .expect(201);
    assert_eq!(body["scope"], json!("orders-lock"), "{body}");
    assert_eq!(
        app.fence("orders-lock").await.expect(200)["fence_token"],
        json!("7")
    );
    write(
        &app,
        Method::PUT,
        &path("orders", "acme,40"),
        "7",
        Some("orders-lock"),
        Some(&json!({})),
    )
    .await
    .expect(200);
    let r = write(
        &app,
        Method::PUT,
        &path("orders", "acme,40"),
        "8",
        Some("elsewhere"),
        Some(&json!({})),
    )
    .await;
    assert_eq!(
        r.mismatch("acme,40", Some("orders-lock"), Some("elsewhere"))["resource"],
        json!("orders")
    );
    app.fence("elsewhere").await.problem(404, "not-found");
    // A zombie is fenced by the table's scope even on a row nobody has written yet, and even
    // on the rows that were there before fencegate.
    put(&app, "orders", "acme,41", "6", &json!({}))
        .await
        .stale_scope("orders-lock", "6", "7");
    write(
        &app,
        Method::DELETE,
        &path("orders", "acme,1"),
        "6",
        None,
        None,
    )
    .await
    .stale_scope("orders-lock", "6", "7");
    assert!(order(&db, "acme", 41).await.is_none());
    assert!(order(&db, "acme", 1).await.is_some());
}

/// Poisoning guards on legacy tables (docs/api.md, *How fencegate decides*): a token the built-in lock never
/// granted, and a jump past `kv.max_token_jump`, in ledger mode and in column mode. The tables
/// are checked with SQL afterwards: nothing changed.
#[tokio::test]
async fn table_writes_refuse_unissued_tokens_and_jumps() {
    let (url, db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![orders(), accounts()];
        s.database.max_connections = 4;
        s.kv.max_token_jump = 1000;
    })
    .await;
    let lock = app
        .send(
            app.req(Method::POST, "/v1/locks/orders-lock")
                .json(&json!({"owner": "w", "ttl_ms": 60000})),
        )
        .await
        .expect(201);
    let token = lock["token"].as_str().unwrap().to_owned();
    let next = (token.parse::<i64>().unwrap() + 1).to_string();
    let r = write(
        &app,
        Method::PUT,
        &path("orders", "acme,50"),
        &next,
        Some("orders-lock"),
        Some(&json!({})),
    )
    .await;
    let body = r.problem(422, "token-not-issued");
    assert_eq!(
        (&body["presented_token"], &body["latest_issued"]),
        (&json!(next), &json!(token)),
        "{body}"
    );
    let ops = json!({"ops": [{"op": "delete", "resource": "orders", "key": "acme,1"}]});
    app.batch(Some(&next), Some("orders-lock"), &ops)
        .await
        .problem(422, "token-not-issued");
    assert!(order(&db, "acme", 50).await.is_none());
    assert!(order(&db, "acme", 1).await.is_some());
    write(
        &app,
        Method::PUT,
        &path("orders", "acme,50"),
        &token,
        Some("orders-lock"),
        Some(&json!({})),
    )
    .await
    .expect(201);

    // Jump cap, ledger mode: from no fence (0), then from the row's fence.
    let r = put(&app, "orders", "acme,51", "1001", &json!({})).await;
    let body = r.problem(422, "token-jump");
    assert_eq!(
        (&body["resource"], &body["key"], &body["current_token"]),
        (&json!("orders"), &json!("acme,51"), &json!("0")),
        "{body}"
    );
    put(&app, "orders", "acme,51", "1000", &json!({}))
        .await
        .expect(201);
    put(&app, "orders", "acme,51", "2001", &json!({}))
        .await
        .problem(422, "token-jump");
    assert!(order(&db, "acme", 51).await.is_some());
    // Column mode: the fence column is the row's fence.
    put(
        &app,
        "accounts",
        ACCOUNT,
        "500",
        &json!({"email": "j@example.com"}),
    )
    .await
    .expect(201);
    let r = put(
        &app,
        "accounts",
        ACCOUNT,
        "1501",
        &json!({"email": "k@example.com"}),
    )
    .await;
    assert_eq!(r.problem(422, "token-jump")["current_token"], json!("500"));
    assert_eq!(
        sql_text(
            &db,
            "SELECT email || ':' || fence_token FROM legacy.accounts"
        )
        .await
        .as_deref(),
        Some("j@example.com:500")
    );
}

/// The audited reset of a table row's fence (ledger and fence column) and of its binding.
#[tokio::test]
async fn a_table_row_fence_is_reset_through_the_admin_api() {
    let Legacy { app, db } = spawn_legacy().await;
    put(
        &app,
        "orders",
        "acme,60",
        "100",
        &json!({"note": "poisoned"}),
    )
    .await
    .expect(201);
    let reset = |path: String, body: Value| {
        let app = &app;
        async move {
            app.send(
                app.req(Method::POST, &format!("/v1/admin/tables/{path}/reset"))
                    .json(&body),
            )
            .await
        }
    };
    let body = reset(
        "orders/acme,60".into(),
        json!({"to": "5", "reason": "bad token"}),
    )
    .await
    .expect(200);
    assert_eq!(
        (&body["target"], &body["resource"], &body["name"]),
        (&json!("table"), &json!("orders"), &json!("acme,60")),
        "{body}"
    );
    put(&app, "orders", "acme,60", "6", &json!({"note": "after"}))
        .await
        .expect(200);
    assert_eq!(
        order(&db, "acme", 60).await.unwrap()["note"],
        json!("after")
    );

    // Column mode: the fence column goes down with the ledger.
    put(
        &app,
        "accounts",
        ACCOUNT,
        "900",
        &json!({"email": "p@example.com"}),
    )
    .await
    .expect(201);
    reset(
        format!("accounts/{ACCOUNT}"),
        json!({"to": "7", "reason": "bad token"}),
    )
    .await
    .expect(200);
    assert_eq!(
        sql_text(&db, "SELECT fence_token::text FROM legacy.accounts")
            .await
            .as_deref(),
        Some("7")
    );
    put(
        &app,
        "accounts",
        ACCOUNT,
        "8",
        &json!({"email": "q@example.com"}),
    )
    .await
    .expect(200);

    // Rebinding a row, and what is refused.
    write(
        &app,
        Method::PUT,
        &path("orders", "acme,61"),
        "1",
        Some("S61"),
        Some(&json!({})),
    )
    .await
    .expect(201);
    reset(
        "orders/acme,61".into(),
        json!({"scope": null, "reason": "lock retired"}),
    )
    .await
    .expect(200);
    put(
        &app,
        "orders",
        "acme,61",
        "1",
        &json!({"note": "unscoped now"}),
    )
    .await
    .expect(200);
    reset("orders/acme,61".into(), json!({"to": "9", "reason": "up"}))
        .await
        .problem(409, "reset-not-below");
    reset("orders/acme,999".into(), json!({"to": "1", "reason": "x"}))
        .await
        .problem(404, "not-found");
    reset("nope/acme,1".into(), json!({"to": "1", "reason": "x"}))
        .await
        .problem(404, "not-found");
}

/// A `scope` added to a resource whose rows fencegate already fenced without one: each row
/// refuses the lock holder (409, saying how out) until one audited rebind moves the whole table.
#[tokio::test]
async fn a_table_whose_scope_was_added_later_is_rebound_in_one_call() {
    let (url, _db) = legacy_database().await;
    let before = spawn_app_on(url.clone(), |s| s.resources = vec![orders()]).await;
    put(&before, "orders", "acme,60", "5", &json!({"note": "a"}))
        .await
        .expect(201);
    put(&before, "orders", "acme,61", "5", &json!({"note": "b"}))
        .await
        .expect(201);
    drop(before);
    let app = spawn_app_on(url, |s| {
        s.resources = vec![ResourceSettings {
            scope: Some("orders-lock".into()),
            ..orders()
        }]
    })
    .await;
    let lock = app
        .send(
            app.req(Method::POST, "/v1/locks/orders-lock")
                .json(&json!({"owner": "w", "ttl_ms": 60000})),
        )
        .await;
    let token = lock.expect(201)["token"].as_str().unwrap().to_owned();
    let r = put(
        &app,
        "orders",
        "acme,60",
        &token,
        &json!({"note": "holder"}),
    )
    .await;
    let body = r.mismatch("acme,60", None, Some("orders-lock"));
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("/v1/admin/tables/orders/rebind"),
        "{body}"
    );

    let rebind = |body: Value| {
        app.req(Method::POST, "/v1/admin/tables/orders/rebind")
            .json(&body)
    };
    app.send(rebind(json!({"scope": "elsewhere", "reason": "x"})))
        .await
        .problem(409, "binding-conflict");
    app.send(rebind(json!({"scope": null, "reason": "x"})))
        .await
        .problem(409, "binding-conflict");
    app.send(
        app.req(Method::POST, "/v1/admin/tables/nope/rebind")
            .json(&json!({"scope": "s", "reason": "x"})),
    )
    .await
    .problem(404, "not-found");
    let done = app
        .send(rebind(
            json!({"scope": "orders-lock", "reason": "scope added to the resource"}),
        ))
        .await
        .expect(200);
    assert_eq!(
        (&done["target"], &done["resource"], &done["rebound"]),
        (&json!("table"), &json!("orders"), &json!(2)),
        "{done}"
    );
    put(
        &app,
        "orders",
        "acme,60",
        &token,
        &json!({"note": "holder"}),
    )
    .await
    .expect(200);
    put(
        &app,
        "orders",
        "acme,61",
        &token,
        &json!({"note": "holder"}),
    )
    .await
    .expect(200);
}

/// One precedence on the tables path too (docs/wire.md, *Fences*): a header that contradicts
/// the resource's `scope` is answered after the presented scope's fence and guards; a row that
/// remembers another scope after the scope's fence.
#[tokio::test]
async fn table_writes_are_refused_in_the_one_precedence() {
    let (url, db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![
            ResourceSettings {
                scope: Some("orders-lock".into()),
                ..orders()
            },
            accounts(),
        ];
        s.kv.max_token_jump = 100;
        s.database.max_connections = 4;
    })
    .await;
    app.claim("other", "10").await.expect(201);
    let row = json!({"status": "new"});
    let put_under = |key: &'static str, token: &'static str, scope: &'static str| {
        let (app, row) = (&app, &row);
        async move {
            write(
                app,
                Method::PUT,
                &path("orders", key),
                token,
                Some(scope),
                Some(row),
            )
            .await
        }
    };
    put_under("acme,40", "9", "other")
        .await
        .stale_scope("other", "9", "10");
    let jump = put_under("acme,40", "500", "other")
        .await
        .problem(422, "token-jump");
    assert_eq!(jump["current_token"], json!("10"), "{jump}");
    let mismatch = put_under("acme,40", "10", "other")
        .await
        .problem(409, "scope-mismatch");
    assert_eq!(
        (
            mismatch["scope"].clone(),
            mismatch["presented_scope"].clone()
        ),
        (json!("orders-lock"), json!("other"))
    );
    let batch = json!({"ops": [{"op": "put", "resource": "orders", "key": "acme,40", "row": row}]});
    app.batch(Some("9"), Some("other"), &batch)
        .await
        .stale_scope("other", "9", "10");
    app.batch(Some("10"), Some("other"), &batch)
        .await
        .problem(409, "scope-mismatch");
    assert!(order(&db, "acme", 40).await.is_none());

    // A row written unscoped remembers it: under a scope, the scope's fence first.
    let account = json!({"email": "precedence@example.com", "balance": 1});
    put(&app, "accounts", ACCOUNT, "10", &account)
        .await
        .expect(201);
    app.claim("s", "20").await.expect(201);
    let under_s = |token: &'static str| {
        let (app, account) = (&app, &account);
        async move {
            write(
                app,
                Method::PUT,
                &path("accounts", ACCOUNT),
                token,
                Some("s"),
                Some(account),
            )
            .await
        }
    };
    under_s("15").await.stale_scope("s", "15", "20");
    under_s("500").await.problem(422, "token-jump");
    let mismatch = under_s("25").await.problem(409, "scope-mismatch");
    assert_eq!(
        (
            mismatch["scope"].clone(),
            mismatch["presented_scope"].clone()
        ),
        (Value::Null, json!("s"))
    );
    assert_eq!(
        app.fence("s").await.expect(200)["fence_token"],
        json!("20"),
        "a refused write moves no fence"
    );
}

/// A batch of table ops only, under `kv.strict`, is claimed under its resources' rules (kv's
/// does not count without kv ops), and a contradicting header is judged under that same rule:
/// a token equal to the presented scope's fence is admitted by it, so the answer is the 409.
#[tokio::test]
async fn a_table_batch_is_judged_under_the_rule_it_would_be_claimed_with() {
    let (url, _db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![ResourceSettings {
            scope: Some("orders-lock".into()),
            ..orders()
        }];
        s.kv.strict = true;
        s.database.max_connections = 4;
    })
    .await;
    app.claim("other", "10").await.expect(201);
    let batch = json!({"ops": [{"op": "put", "resource": "orders", "key": "acme,41", "row": {"status": "new"}}]});
    let body = app
        .batch(Some("10"), Some("other"), &batch)
        .await
        .problem(409, "scope-mismatch");
    assert_eq!(body["presented_scope"], json!("other"), "{body}");
    app.batch(Some("9"), Some("other"), &batch)
        .await
        .stale_scope("other", "9", "10");
}

/// A row that predates fencegate in column mode has no token (NULL): a token past the jump cap
/// is 422 token-jump counted from 0, not a 500.
#[tokio::test]
async fn a_jump_over_a_row_without_a_token_is_422() {
    let (url, db) = legacy_database().await;
    let app = spawn_app_on(url, |s| {
        s.resources = vec![accounts()];
        s.kv.max_token_jump = 100;
        s.database.max_connections = 4;
    })
    .await;
    sqlx::query("INSERT INTO legacy.accounts (id, email) VALUES ($1::uuid, 'old@example.com')")
        .bind(ACCOUNT)
        .execute(&db)
        .await
        .unwrap();
    let body = put(
        &app,
        "accounts",
        ACCOUNT,
        "500",
        &json!({"email": "new@example.com"}),
    )
    .await
    .problem(422, "token-jump");
    assert_eq!(body["current_token"], json!("0"), "{body}");
    put(
        &app,
        "accounts",
        ACCOUNT,
        "50",
        &json!({"email": "new@example.com"}),
    )
    .await
    .expect(200);
}

/// Every refusal PostgreSQL makes of a request is answered in fencegate's words: what happened
/// and what to do, the column or constraint in fields of their own, and none of PostgreSQL's
/// text (its message goes to the request's log line). Each case is provoked for real: a value
/// too large for its column, a NULL where none is allowed, a CHECK, a UNIQUE key of a legacy
/// table, a number beyond PostgreSQL's numeric range, a table trigger's own exception, a
/// read-only transaction, and a row lock held past `database.lock_timeout_ms`.
#[tokio::test]
async fn database_refusals_are_answered_in_fencegates_words_only() {
    let (url, db) = legacy_database().await;
    sqlx::raw_sql(
        "CREATE FUNCTION legacy.no_bob() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
             IF NEW.holder = 'bob' THEN
                 RAISE EXCEPTION 'new row for relation \"tickets\" violates policy: secret internals';
             END IF;
             IF NEW.holder = 'standby' THEN
                 RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER no_bob BEFORE INSERT OR UPDATE ON legacy.tickets
             FOR EACH ROW EXECUTE FUNCTION legacy.no_bob();",
    )
    .execute(&db)
    .await
    .unwrap();
    let app = spawn_app_on(url, |s| {
        s.resources = vec![orders(), accounts(), tickets_strict()];
        s.database.max_connections = 4;
        s.database.lock_timeout_ms = 300;
        // Past the edge's own bound, so that PostgreSQL's numeric range is what refuses.
        s.kv.max_number_digits = 200_000;
    })
    .await;
    // PostgreSQL's words and codes that must not reach a client (the codes of the refusals
    // provoked here, and the phrases of their messages).
    let forbidden = [
        "violates",
        "relation",
        "duplicate key",
        "null value",
        "value too long",
        "overflow",
        "invalid input",
        "read-only transaction",
        "lock timeout",
        "canceling",
        "SQLSTATE",
        "ERROR",
        "DETAIL",
        "secret internals",
        "22001",
        "22003",
        "23502",
        "23505",
        "23514",
        "P0001",
        "25006",
        "55P03",
    ];
    let check = |what: &str, body: &Value| {
        let text = body.to_string();
        for word in forbidden {
            assert!(
                !text.contains(word),
                "{what}: {word:?} reached the client: {body}"
            );
        }
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(!detail.contains("column"), "{what}: {body}");
        assert!(
            detail.len() > 20,
            "{what}: the detail says what happened: {body}"
        );
    };

    let cases = [
        (
            "a value too long",
            json!({"note": "x".repeat(41)}),
            Some("note"),
            None,
        ),
        (
            "a null where none is allowed",
            json!({"status": null}),
            Some("status"),
            None,
        ),
        (
            "a check",
            json!({"amount": -1}),
            None,
            Some("amount_not_negative"),
        ),
        (
            "a number beyond the column",
            json!({"amount": 1e12}),
            Some("amount"),
            None,
        ),
    ];
    for (what, row, column, constraint) in cases {
        let body = put(&app, "orders", "acme,7", "5", &row)
            .await
            .problem(422, "invalid-value");
        check(what, &body);
        if let Some(column) = column {
            assert_eq!(body["column"], json!(column), "{what}: {body}");
        }
        if let Some(constraint) = constraint {
            assert_eq!(body["constraint"], json!(constraint), "{what}: {body}");
        }
    }

    // A UNIQUE key of a legacy table, taken by another row.
    let other = "0b1c2b7e-3f5d-4c1a-9a6e-2d7b8c9d0e1f";
    put(
        &app,
        "accounts",
        ACCOUNT,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .expect(201);
    let body = put(
        &app,
        "accounts",
        other,
        "1",
        &json!({"email": "a@example.com"}),
    )
    .await
    .problem(422, "invalid-value");
    check("a unique key", &body);
    assert_eq!(body["constraint"], json!("accounts_email_key"), "{body}");

    // The table's own trigger: its message is the application's, and stays in the log.
    let body = put(&app, "tickets", "1", "1", &json!({"holder": "bob"}))
        .await
        .problem(422, "invalid-value");
    check("a trigger's exception", &body);

    // A read-only transaction (what a standby answers): 503, retry.
    let body = put(&app, "tickets", "2", "1", &json!({"holder": "standby"}))
        .await
        .problem(503, "unavailable");
    check("a read-only transaction", &body);
    assert!(
        body["detail"].as_str().unwrap().contains("takes no writes"),
        "{body}"
    );

    // A row lock held by another transaction past database.lock_timeout_ms: 503, retry.
    put(&app, "tickets", "3", "1", &json!({"holder": "a"}))
        .await
        .expect(201);
    let mut holder = db.begin().await.unwrap();
    sqlx::query("SELECT * FROM legacy.tickets WHERE id = 3 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let body = put(&app, "tickets", "3", "2", &json!({"holder": "b"}))
        .await
        .problem(503, "unavailable");
    check("a lock timeout", &body);
    assert!(
        body["detail"].as_str().unwrap().contains("locked"),
        "{body}"
    );
    holder.rollback().await.unwrap();

    // A number beyond PostgreSQL's numeric range in a kv value: 400, nothing written.
    let body = app
        .send(
            app.req(Method::PUT, "/v1/kv/huge")
                .header(TOKEN, "1")
                .header("content-type", "application/json")
                .body("1e140000"),
        )
        .await
        .problem(400, "invalid-json");
    check("a number beyond the numeric range", &body);
    app.assert_absent("huge").await;
}
