//! Operating it (docs/operations.md): every refused write is one log line at the default level
//! with what an operator needs (kind, key or scope, tokens, actor, request id, route), and is
//! kept in the database, where every process serving it (and a restarted one) lists it.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{kv, spawn_app_on, spawn_binary_configured, TestApp, TOKEN};
use crate::pg;

/// Waits until `GET /v1/admin/refusals` lists at least `n` (they are written off the request
/// path, within milliseconds).
async fn refusals(app: &TestApp, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let body = app.get("/v1/admin/refusals?limit=1000").await.expect(200);
        let list = body["refusals"].as_array().unwrap().clone();
        if list.len() >= n {
            return list;
        }
        assert!(Instant::now() < deadline, "{} refusals recorded after 5 s, wanted {n}: {body}", list.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn refused_writes_are_kept_in_the_database_for_every_process_and_across_restarts() {
    let db = pg::fresh_database().await;
    let a = spawn_app_on(db.clone(), |_| {}).await;
    a.get("/readyz").await.expect(200); // migrated before the second starts (one SQLite file)
    let b = spawn_app_on(db.clone(), |_| {}).await;
    a.kv_put("k", "5", &json!(1)).await.expect(201);
    let zombie = a.req(Method::PUT, &kv("k")).header(TOKEN, "4").header("x-request-id", "zombie-write-1").json(&json!(2));
    a.send(zombie).await.problem(412, "stale-token");
    let lock = b.send(b.req(Method::POST, "/v1/locks/nightly").json(&json!({"owner": "w", "ttl_ms": 60000}))).await;
    let token: i64 = lock.expect(201)["token"].as_str().unwrap().parse().unwrap();
    b.kv_put_scoped("n", &(token + 5).to_string(), "nightly", &json!(1)).await.problem(422, "token-not-issued");

    // Both, from either process, newest first.
    let list = refusals(&a, 2).await;
    assert_eq!(list, refusals(&b, 2).await);
    let (newest, stale) = (&list[0], &list[1]);
    assert_eq!((&newest["kind"], &newest["scope"], &newest["current_token"]), (&json!("not_issued"), &json!("nightly"), &json!(token.to_string())), "{newest}");
    assert_eq!(
        (&stale["kind"], &stale["key"], &stale["presented_token"], &stale["current_token"]),
        (&json!("stale"), &json!("k"), &json!("4"), &json!("5")),
        "{stale}"
    );
    assert_eq!((&stale["request_id"], &stale["route"], &stale["op"]), (&json!("zombie-write-1"), &json!("/v1/kv/{key}"), &json!("put")), "{stale}");
    assert!(stale["at"].as_str().unwrap().ends_with('Z') && stale["uid"].is_string(), "{stale}");
    // The console's overview shows every process's too.
    let overview = b.get("/v1/admin/overview").await.expect(200);
    assert!(overview["refusals"].as_array().unwrap().iter().any(|r| r["request_id"] == "zombie-write-1"), "{overview}");
    drop((a, b));

    // A restarted process still lists them; limits are checked.
    let later = spawn_app_on(db, |_| {}).await;
    assert_eq!(refusals(&later, 2).await.len(), 2);
    for bad in ["0", "1001", "x"] {
        later.get(&format!("/v1/admin/refusals?limit={bad}")).await.problem(400, "invalid-request");
    }
    assert_eq!(later.get("/v1/admin/refusals?limit=1").await.expect(200)["refusals"].as_array().unwrap().len(), 1);
}

/// One line per refused write at the default level, with the fields an operator searches for;
/// as JSON with `log.format = "json"`.
#[tokio::test]
async fn a_refused_write_is_one_log_line_at_the_default_level() {
    let db = pg::fresh_database().await;
    let app = spawn_binary_configured(&db, "[log]\nformat = \"json\"\n", None).await;
    let view = app.view();
    view.kv_put("k", "9", &json!(1)).await.expect(201);
    let zombie = view.req(Method::PUT, &kv("k")).header(TOKEN, "3").header("x-request-id", "zombie-7").json(&json!(2));
    view.send(zombie).await.problem(412, "stale-token");
    let deadline = Instant::now() + Duration::from_secs(5);
    let line: Value = loop {
        let found = app.stderr().lines().find(|l| l.contains("write refused")).map(|l| serde_json::from_str(l).expect("a JSON log line"));
        if let Some(line) = found {
            break line;
        }
        assert!(Instant::now() < deadline, "no refusal logged:\n{}", app.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let f = &line["fields"];
    assert_eq!((&line["level"], &f["kind"], &f["key"]), (&json!("INFO"), &json!("stale"), &json!("k")), "{line}");
    assert_eq!((&f["presented_token"], &f["current_token"], &f["request_id"], &f["route"]), (&json!(3), &json!(9), &json!("zombie-7"), &json!("/v1/kv/{key}")), "{line}");
    // Accepted writes are not logged at the default level.
    assert_eq!(app.stderr().lines().filter(|l| l.contains("\"k\"")).count(), 1, "{}", app.stderr());
}
