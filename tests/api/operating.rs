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
        assert!(
            Instant::now() < deadline,
            "{} refusals recorded after 5 s, wanted {n}: {body}",
            list.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn refused_writes_are_kept_in_the_database_for_every_process_and_across_restarts() {
    let db = pg::fresh_database().await;
    let a = spawn_app_on(db.clone(), |_| {}).await;
    // Two processes on one database: PostgreSQL. A SQLite file has one process
    // (docs/operations.md), which then plays both.
    let second = match crate::BACKEND {
        pg::Backend::Postgres => Some(spawn_app_on(db.clone(), |_| {}).await),
        pg::Backend::Sqlite => None,
    };
    let b = second.as_ref().unwrap_or(&a);
    a.kv_put("k", "5", &json!(1)).await.expect(201);
    let zombie = a
        .req(Method::PUT, &kv("k"))
        .header(TOKEN, "4")
        .header("x-request-id", "zombie-write-1")
        .json(&json!(2));
    a.send(zombie).await.problem(412, "stale-token");
    let lock = b
        .send(
            b.req(Method::POST, "/v1/locks/nightly")
                .json(&json!({"owner": "w", "ttl_ms": 60000})),
        )
        .await;
    let token: i64 = lock.expect(201)["token"].as_str().unwrap().parse().unwrap();
    b.kv_put_scoped("n", &(token + 5).to_string(), "nightly", &json!(1))
        .await
        .problem(422, "token-not-issued");

    // Both, from either process, newest first.
    let list = refusals(&a, 2).await;
    assert_eq!(list, refusals(b, 2).await);
    let (newest, stale) = (&list[0], &list[1]);
    assert_eq!(
        (&newest["kind"], &newest["scope"], &newest["current_token"]),
        (
            &json!("not_issued"),
            &json!("nightly"),
            &json!(token.to_string())
        ),
        "{newest}"
    );
    assert_eq!(
        (
            &stale["kind"],
            &stale["key"],
            &stale["presented_token"],
            &stale["current_token"]
        ),
        (&json!("stale"), &json!("k"), &json!("4"), &json!("5")),
        "{stale}"
    );
    assert_eq!(
        (&stale["request_id"], &stale["route"], &stale["op"]),
        (
            &json!("zombie-write-1"),
            &json!("/v1/kv/{key}"),
            &json!("put")
        ),
        "{stale}"
    );
    assert!(
        stale["at"].as_str().unwrap().ends_with('Z') && stale["uid"].is_string(),
        "{stale}"
    );
    // The console's overview shows every process's too.
    let overview = b.get("/v1/admin/overview").await.expect(200);
    assert!(
        overview["refusals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["request_id"] == "zombie-write-1"),
        "{overview}"
    );
    drop(second);
    drop(a);

    // A restarted process still lists them; limits are checked.
    let later = spawn_app_on(db, |_| {}).await;
    assert_eq!(refusals(&later, 2).await.len(), 2);
    for bad in ["0", "1001", "x"] {
        later
            .get(&format!("/v1/admin/refusals?limit={bad}"))
            .await
            .problem(400, "invalid-request");
    }
    assert_eq!(
        later.get("/v1/admin/refusals?limit=1").await.expect(200)["refusals"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// One line per refused write at the default level, with the fields an operator searches for;
/// as JSON with `log.format = "json"`.
#[tokio::test]
async fn a_refused_write_is_one_log_line_at_the_default_level() {
    let db = pg::fresh_database().await;
    let app = spawn_binary_configured(&db, "[log]\nformat = \"json\"\n", None).await;
    let view = app.view();
    view.kv_put("k", "9", &json!(1)).await.expect(201);
    let zombie = view
        .req(Method::PUT, &kv("k"))
        .header(TOKEN, "3")
        .header("x-request-id", "zombie-7")
        .json(&json!(2));
    view.send(zombie).await.problem(412, "stale-token");
    let deadline = Instant::now() + Duration::from_secs(5);
    let line: Value = loop {
        let found = app
            .stderr()
            .lines()
            .find(|l| l.contains("write refused"))
            .map(|l| serde_json::from_str(l).expect("a JSON log line"));
        if let Some(line) = found {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no refusal logged:\n{}",
            app.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let f = &line["fields"];
    assert_eq!(
        (&line["level"], &f["kind"], &f["key"]),
        (&json!("INFO"), &json!("stale"), &json!("k")),
        "{line}"
    );
    assert_eq!(
        (
            &f["presented_token"],
            &f["current_token"],
            &f["request_id"],
            &f["route"]
        ),
        (
            &json!(3),
            &json!(9),
            &json!("zombie-7"),
            &json!("/v1/kv/{key}")
        ),
        "{line}"
    );
    // Accepted writes are not logged at the default level.
    assert_eq!(
        app.stderr().lines().filter(|l| l.contains("\"k\"")).count(),
        1,
        "{}",
        app.stderr()
    );
}

/// The value of a counter without labels in a Prometheus text (0 when absent).
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A grant over a lease that lapsed without a release is a takeover (the early warning that a
/// zombie may be running); every metric family says what it is (`# HELP`).
#[tokio::test]
async fn takeovers_are_counted_and_every_metric_family_has_help() {
    let app = crate::helpers::spawn_app().await;
    let before = app.get("/metrics").await.text;
    let grant = |ttl: u64| {
        app.req(Method::POST, "/v1/locks/nightly")
            .json(&json!({"owner": "w", "ttl_ms": ttl}))
    };
    let token = app.send(grant(100)).await.expect(201)["token"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(250)).await;
    app.send(grant(60_000)).await.expect(201); // over the lapsed lease: a takeover
    app.send(
        app.req(Method::DELETE, "/v1/locks/nightly")
            .header(TOKEN, (token.parse::<i64>().unwrap() + 1).to_string()),
    )
    .await
    .expect(200);
    app.send(grant(60_000)).await.expect(201); // after a release: not one
    let after = app.get("/metrics").await.text;
    for name in [
        "fencegate_lock_takeovers_total",
        "fencegate_lease_expiries_total",
    ] {
        // Other tests share the process's recorder: at least this test's one.
        assert!(
            counter(&after, name) > counter(&before, name),
            "{name}:\n{after}"
        );
    }
    let families: Vec<&str> = after
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() > 5, "{after}");
    for family in families {
        assert!(
            after
                .lines()
                .any(|l| l.starts_with(&format!("# HELP {family} "))),
            "no # HELP for {family}:\n{after}"
        );
    }
}
