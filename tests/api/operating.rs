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
pub(crate) fn counter(text: &str, name: &str) -> u64 {
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

/// An API key's secret and its `[[auth.keys]]` entry (every prefix).
fn api_key(name: &str, rights: &[&str]) -> (String, fencegate::auth::ApiKeySettings) {
    let secret = fencegate::auth::new_key().unwrap();
    let settings = fencegate::auth::ApiKeySettings {
        name: name.into(),
        sha256: fencegate::auth::digest_hex(&secret),
        rights: rights.iter().map(|r| r.to_string()).collect(),
        prefixes: vec![String::new()],
        tables: Vec::new(),
    };
    (secret, settings)
}

/// `GET /v1/admin/refusals?QUERY` as `admin`: the records, or the response for a refusal.
async fn listed(app: &TestApp, admin: &str, query: &str) -> Vec<Value> {
    let r = app
        .send(
            app.req(Method::GET, &format!("/v1/admin/refusals?{query}"))
                .bearer_auth(admin),
        )
        .await;
    r.expect(200)["refusals"].as_array().unwrap().clone()
}

/// One actor floods refused writes (four times as many as the database keeps) after another
/// actor's two refusals: the record is pruned to its bound, fairly, so the other actor's
/// refusals are still there (the newest-N rule alone would have deleted them first); and the
/// record filters by key, scope, actor, kind and time.
#[tokio::test]
async fn one_actors_flood_of_refusals_never_evicts_anothers_record_which_filters() {
    let (admin, admin_key) = api_key("ops", &["admin", "read"]);
    let (flood, flood_key) = api_key("flood", &["write"]);
    let (victim, victim_key) = api_key("victim", &["write"]);
    let db = pg::fresh_database().await;
    let app = std::sync::Arc::new(
        spawn_app_on(db, |s| {
            s.auth.keys = vec![admin_key, flood_key, victim_key];
            s.database.refusals_kept = 100;
        })
        .await,
    );
    let put = |who: &str, key: &str, token: &str, scope: Option<&str>| {
        let mut rb = app
            .req(Method::PUT, &kv(key))
            .bearer_auth(who)
            .header(TOKEN, token)
            .json(&json!(1));
        if let Some(scope) = scope {
            rb = rb.header("x-fencing-scope", scope);
        }
        rb
    };
    app.send(put(&victim, "v", "5", None)).await.expect(201);
    app.send(put(&victim, "v", "4", None))
        .await
        .problem(412, "stale-token");
    app.send(put(&victim, "vk", "5", Some("vs")))
        .await
        .expect(201);
    app.send(put(&victim, "vk", "3", Some("vs")))
        .await
        .problem(412, "stale-token");
    let victims = wait_listed(&app, &admin, "actor=key:victim", 2).await;

    app.send(put(&flood, "f", "10", None)).await.expect(201);
    let mut flooders = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (app, flood) = (app.clone(), flood.clone());
        flooders.spawn(async move {
            for _ in 0..50 {
                let r = app
                    .send(
                        app.req(Method::PUT, &kv("f"))
                            .bearer_auth(&flood)
                            .header(TOKEN, "1")
                            .json(&json!(1)),
                    )
                    .await;
                assert_eq!(r.status, 412, "{}", r.text);
            }
        });
    }
    while let Some(done) = flooders.join_next().await {
        done.unwrap();
    }
    // Pruned at least once after the flood's first 100 were written: fewer than 400 kept.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flooded = listed(&app, &admin, "actor=key:flood&limit=1000")
            .await
            .len();
        if (1..400).contains(&flooded) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flood's 400 refusals were never pruned to 100: {flooded} kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        listed(&app, &admin, "actor=key:victim").await,
        victims,
        "the other actor's refusals survive the flood"
    );

    // Filters, each alone and together.
    let by_key = listed(&app, &admin, "key=v").await;
    assert_eq!(by_key.len(), 1, "{by_key:?}");
    assert_eq!(
        (&by_key[0]["key"], &by_key[0]["presented_token"]),
        (&json!("v"), &json!("4"))
    );
    let by_scope = listed(&app, &admin, "scope=vs").await;
    assert_eq!(by_scope.len(), 1, "{by_scope:?}");
    assert_eq!(by_scope[0]["presented_token"], json!("3"));
    assert_eq!(
        listed(&app, &admin, "kind=stale&actor=key:victim")
            .await
            .len(),
        2
    );
    assert!(listed(&app, &admin, "kind=jump").await.is_empty());
    let newest_ms = victims[0]["at_ms"].as_i64().unwrap();
    let oldest_ms = victims[1]["at_ms"].as_i64().unwrap();
    assert_eq!(
        listed(
            &app,
            &admin,
            &format!("actor=key:victim&since={}", oldest_ms - 1)
        )
        .await
        .len(),
        2
    );
    assert!(
        listed(&app, &admin, &format!("key=v&since={}", newest_ms + 60_000))
            .await
            .is_empty()
    );
    assert_eq!(
        listed(&app, &admin, "actor=key:victim&since=2000-01-01T00:00:00Z")
            .await
            .len(),
        2
    );
    for bad in [
        "kind=nope",
        "since=yesterday",
        "since=2026-11-27T10:00:00",
        "limit=0",
        "colour=red",
    ] {
        app.send(
            app.req(Method::GET, &format!("/v1/admin/refusals?{bad}"))
                .bearer_auth(&admin),
        )
        .await
        .problem(400, "invalid-request");
    }
}

/// Waits until `GET /v1/admin/refusals?QUERY` lists `n` records (written off the request path).
async fn wait_listed(app: &TestApp, admin: &str, query: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = listed(app, admin, query).await;
        if list.len() >= n {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} refusals listed after 10 s ({query})",
            list.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
