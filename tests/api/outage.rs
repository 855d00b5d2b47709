//! The database becomes unreachable under a running server, then comes back: readiness and
//! requests say so with 503 + Retry-After (never a 2xx, never a leaked internal error), and the
//! server recovers without a restart. The outage is a TCP proxy between fencegate and
//! PostgreSQL (tests/support/proxy.rs) that the test cuts (open connections reset, new ones
//! closed as soon as they are accepted), then heals.

use std::time::{Duration, Instant};

use fencegate::config::Settings;
use reqwest::Method;
use serde_json::json;

use crate::db_url::{host_port, with_host_port};
use crate::helpers::{spawn_app_on, TestApp};
use crate::operating::counter;
use crate::pg;
use crate::proxy::Proxy;

#[tokio::test]
async fn an_unreachable_database_is_503_and_the_server_recovers() {
    let db = pg::fresh_database().await;
    // A short acquire timeout (a documented setting) keeps each failing request quick.
    let (proxy, app) = behind_proxy(&db, |s| s.database.acquire_timeout_ms = 300).await;
    app.kv_put("k", "1", &json!("before")).await.expect(201);
    app.get("/readyz").await.expect(200);

    proxy.cut();

    let ready = app.get("/readyz").await;
    ready.problem(503, "unavailable");
    assert!(
        ready.header("retry-after").is_some(),
        "503 without Retry-After: {ready:?}"
    );
    // Several attempts: the first may meet a pooled connection that was just reset, later ones a
    // new connection closed at once. Both are the database being unreachable.
    for _ in 0..2 {
        for r in [
            app.kv_put("k", "2", &json!("during")).await,
            app.kv_get("k").await,
        ] {
            r.problem(503, "unavailable");
            assert!(
                r.header("retry-after").is_some(),
                "503 without Retry-After: {r:?}"
            );
        }
    }
    app.get("/healthz").await.expect(200); // liveness is about the process itself

    // The database comes back on the same address: the server recovers by itself.
    proxy.heal();
    wait_ready(&app, "the database came back").await;
    app.assert_value("k", &json!("before"), "1").await;
    app.kv_put("k", "0", &json!("zombie"))
        .await
        .stale_key("k", "0", "1");
    app.kv_put("k", "2", &json!("after")).await.expect(200);
    drop(proxy);
}

/// A primary that refuses writes without being a standby: `default_transaction_read_only` on
/// for fencegate's database (a maintenance switch, or a managed service's read-only endpoint).
/// /readyz says so (503, and why), writes are 503 and not applied; once the switch is off the
/// server is ready again and writes go through, without a restart.
#[tokio::test]
async fn a_database_that_refuses_writes_is_not_ready_and_the_server_recovers() {
    use sqlx::{Connection, Executor};
    let db = pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    app.kv_put("k", "1", &json!("before")).await.expect(201);
    app.get("/readyz").await.expect(200);

    // The setting is read when a session starts: end fencegate's sessions, so that its next ones
    // are read-only. (This session stays writable, and turns the switch off again below.)
    let mut admin = sqlx::PgConnection::connect(&db)
        .await
        .expect("connect to the test database");
    let set = |value: &str| {
        format!("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = {value}', current_database()); END $$")
    };
    admin
        .execute(set("on").as_str())
        .await
        .expect("ALTER DATABASE");
    admin
        .execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        .await
        .expect("end fencegate's sessions");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/readyz").await;
        if r.status == 503 && r.text.contains("default_transaction_read_only") {
            r.problem(503, "unavailable");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz never said the database refuses writes: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        let r = app.kv_put("k", "2", &json!("during")).await;
        r.problem(503, "unavailable");
        assert!(
            r.header("retry-after").is_some(),
            "503 without Retry-After: {r:?}"
        );
    }
    app.assert_value("k", &json!("before"), "1").await;

    // Switched off: the read-only sessions are replaced as readiness checks and writes meet
    // them; readiness comes back first, then every write goes through.
    admin
        .execute(set("off").as_str())
        .await
        .expect("ALTER DATABASE");
    wait_ready(&app, "the database took writes again").await;
    let mut applied = false;
    for _ in 0..40 {
        let r = app.kv_put("k", "2", &json!("after")).await;
        if r.status == 200 {
            applied = true;
            break;
        }
        r.problem(503, "unavailable"); // a session opened while read-only, replaced now
    }
    assert!(
        applied,
        "writes still refused after the database took writes again"
    );
    app.assert_value("k", &json!("after"), "2").await;
    // A zombie's old token is still refused by the fence after the outage.
    app.kv_put("k", "1", &json!("zombie"))
        .await
        .stale_key("k", "1", "2");
    app.assert_value("k", &json!("after"), "2").await;
}

/// Polls /readyz until 200, for at most 30 s after `what`; every answer before that must be a
/// 503 problem.
async fn wait_ready(app: &TestApp, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/readyz").await;
        if r.status == 200 {
            return;
        }
        r.problem(503, "unavailable");
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready 30s after {what}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A frozen database (bytes stop flowing; nothing fails): `/readyz` still answers within a
/// probe's usual 1 s, 503 saying why, instead of hanging for the acquire timeout.
#[tokio::test]
async fn readiness_answers_within_a_second_when_the_database_is_frozen() {
    let db = pg::fresh_database().await;
    let (proxy, app) = behind_proxy(&db, |s| s.database.acquire_timeout_ms = 5000).await;
    app.get("/readyz").await.expect(200);
    proxy.stall();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let ready = app.get("/readyz").await;
        let took = started.elapsed();
        let body = ready.problem(503, "unavailable");
        assert!(took < Duration::from_millis(1000), "/readyz took {took:?}");
        assert!(
            body["detail"].as_str().unwrap().contains("did not answer"),
            "{body}"
        );
    }
    proxy.heal();
    wait_ready(&app, "the database thawed").await;
}

/// A database that refuses writes for lack of resources (here a legacy table's trigger answers
/// SQLSTATE 53100 disk_full, as PostgreSQL does when it cannot extend a file): writes are 503,
/// and `/readyz` says so for a while, naming the refusal, until a write is taken again.
#[tokio::test]
async fn a_database_refusing_writes_for_lack_of_space_is_not_ready() {
    use sqlx::Connection;
    let db = pg::fresh_database().await;
    let mut conn = sqlx::PgConnection::connect(&db).await.unwrap();
    for sql in [
        "CREATE TABLE notes (id int PRIMARY KEY, body text)",
        "CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           RAISE EXCEPTION 'could not extend file \"base/1/2\": No space left on device' USING ERRCODE = 'disk_full'; END $$",
        "CREATE TRIGGER full_disk BEFORE INSERT OR UPDATE ON notes FOR EACH ROW EXECUTE FUNCTION full_disk()",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    let app = spawn_app_on(db.clone(), |s| {
        s.resources = vec![crate::helpers::ledger_table("notes", "notes")]
    })
    .await;
    app.get("/readyz").await.expect(200);
    let put = || {
        app.req(reqwest::Method::PUT, "/v1/tables/notes/1")
            .header(crate::helpers::TOKEN, "1")
            .json(&json!({"body": "x"}))
    };
    let refused = app.send(put()).await;
    refused.problem(503, "unavailable");
    let ready = app.get("/readyz").await;
    let body = ready.problem(503, "unavailable");
    // In fencegate's words: no SQLSTATE and none of PostgreSQL's text.
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("out of disk space") && !detail.contains("53100"),
        "{body}"
    );
    // Space is back: the next write is taken, and readiness follows at once.
    sqlx::query("DROP TRIGGER full_disk ON notes")
        .execute(&mut conn)
        .await
        .unwrap();
    app.send(put()).await.expect(201);
    app.get("/readyz").await.expect(200);
}

/// A process cut off from the database cannot hear of a reset made through another one (the
/// notification and the audit-log poll both need the database). Its reject-only cache must not
/// go on answering 412 "stale" to the token the reset admits, telling that token's holder it
/// lost the lock: within about 1.5 s of the cut it answers 503 (retry), and once the database
/// answers again the write is admitted.
#[tokio::test]
async fn a_process_that_cannot_hear_of_a_reset_stops_refusing_from_its_cache() {
    let db = pg::fresh_database().await;
    let (proxy, cut_off) = behind_proxy(&db, |s| {
        s.database.acquire_timeout_ms = 300;
        s.server.request_timeout_ms = 1500;
    })
    .await;
    let admin = spawn_app_on(db.clone(), |_| {}).await;
    cut_off
        .kv_put("k", "100", &json!("poisoned"))
        .await
        .expect(201);
    cut_off
        .kv_put("k", "50", &json!("x"))
        .await
        .stale_key("k", "50", "100");
    let unheard = "fencegate_cache_clears_total{reason=\"unheard\"}";
    let before = counter(&cut_off.get("/metrics").await.text, unheard);
    // Now in its cache. Then a partition that drops packets: nothing fails, every statement
    // just waits.
    proxy.stall();
    admin
        .send(
            admin
                .req(Method::POST, "/v1/admin/kv/k/reset")
                .json(&json!({"to": "10", "reason": "outage test"})),
        )
        .await
        .expect(200);
    let stalled = Instant::now();
    loop {
        let r = cut_off.kv_put("k", "50", &json!("during")).await;
        if r.status != 412 {
            r.problem(503, "unavailable");
            break;
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(10),
            "the cut-off process still answers 412 from its cache {:?} into the stall",
            stalled.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "the cache stopped refusing {:?} into the stall",
        stalled.elapsed()
    );
    let after = counter(&cut_off.get("/metrics").await.text, unheard);
    assert!(
        after > before,
        "{unheard}: {before} before the stall, {after} during it"
    );
    proxy.heal();
    let healed = Instant::now();
    loop {
        let r = cut_off.kv_put("k", "50", &json!("after")).await;
        if r.status == 200 {
            break;
        }
        assert_ne!(r.status, 412, "refused after the heal: {r:?}");
        assert!(
            healed.elapsed() < Duration::from_secs(20),
            "not admitted 20 s after the heal: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Forgetting the cache admitted nothing the fence does not: a zombie below it is refused.
    cut_off
        .kv_put("k", "20", &json!("zombie"))
        .await
        .stale_key("k", "20", "50");
}

/// fencegate, in this process, reaching `db` through a TCP proxy the test can cut or stall.
async fn behind_proxy(db: &str, configure: impl FnOnce(&mut Settings)) -> (Proxy, TestApp) {
    let server = host_port(db);
    let upstream = tokio::net::lookup_host(&server)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("the outage tests need a TCP database address, got {server:?}"));
    let proxy = Proxy::start(upstream).await;
    let proxied = with_host_port(db, &format!("127.0.0.1:{}", proxy.port));
    let app = spawn_app_on(proxied, configure).await;
    (proxy, app)
}
