//! `Idempotency-Key` on a legacy table's writes (docs/tables.md), alone and in a batch: replayed
//! like kv writes, the row written once. PostgreSQL only: SQLite has no legacy tables.

use fencegate::tables::{FenceMode, ResourceSettings};
use reqwest::Method;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;

use crate::{
    helpers::{spawn_app_on, unique, TOKEN},
    idempotency::{KEY, REPLAYED},
    pg,
};

/// A legacy table's write, alone and in a batch, replays too; the row is written once.
#[tokio::test]
async fn table_writes_are_replayed() {
    let url = pg::fresh_database().await;
    let db = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(
        "CREATE SCHEMA legacy; CREATE TABLE legacy.notes (id bigint PRIMARY KEY, body text, n int NOT NULL DEFAULT 0);",
    )
    .execute(&db)
    .await
    .expect("create the legacy table");
    let app = spawn_app_on(url, |s| {
        s.resources = vec![ResourceSettings {
            name: "notes".into(),
            table: "legacy.notes".into(),
            key: vec!["id".into()],
            fence: FenceMode::Ledger,
            fence_column: None,
            strict: false,
            scope: None,
            guard: None,
        }];
        s.database.max_connections = 4;
    })
    .await;
    let idem = unique("k");
    let put = |token: &str, body: &str| {
        app.req(Method::PUT, "/v1/tables/notes/1")
            .header(TOKEN, token)
            .header(KEY, &idem)
            .json(&json!({"id": 1, "body": body}))
    };
    let first = app.send(put("5", "first")).await.expect(201);
    app.send(
        app.req(Method::PATCH, "/v1/tables/notes/1")
            .header(TOKEN, "6")
            .json(&json!({"body": "newer"})),
    )
    .await
    .expect(200);
    let again = app.send(put("5", "first")).await;
    assert_eq!(again.expect(201), first);
    assert_eq!(again.header(REPLAYED), Some("true"));
    app.send(put("5", "other"))
        .await
        .problem(422, "idempotency-key-reused");
    let body: String = sqlx::query_scalar("SELECT body FROM legacy.notes WHERE id = 1")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(body, "newer");

    let batch_key = unique("k");
    let ops = json!({"ops": [
        {"op": "put", "resource": "notes", "key": "2", "row": {"id": 2, "body": "two"}},
        {"op": "put", "key": unique("mixed"), "value": 1},
    ]});
    let batch = || {
        app.req(Method::POST, "/v1/batch")
            .header(TOKEN, "9")
            .header(KEY, &batch_key)
            .json(&ops)
    };
    let first = app.send(batch()).await.expect(200);
    sqlx::query("DELETE FROM legacy.notes WHERE id = 2")
        .execute(&db)
        .await
        .unwrap();
    let again = app.send(batch()).await;
    assert_eq!(again.expect(200), first);
    assert_eq!(again.header(REPLAYED), Some("true"));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM legacy.notes WHERE id = 2")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the replay wrote nothing");
}
