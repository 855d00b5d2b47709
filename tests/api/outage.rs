//! The database becomes unreachable under a running server, then comes back: readiness and
//! requests say so with 503 + Retry-After (never a 2xx, never a leaked internal error), and the
//! server recovers without a restart. The outage is a TCP proxy between fencegate and
//! PostgreSQL (tests/support/proxy.rs) that the test cuts (open connections reset, new ones
//! closed as soon as they are accepted), then heals.

use std::time::Duration;

use serde_json::json;

use crate::db_url::{host_port, with_host_port};
use crate::helpers::spawn_app_on;
use crate::pg;
use crate::proxy::Proxy;

#[tokio::test]
async fn an_unreachable_database_is_503_and_the_server_recovers() {
    let db = pg::fresh_database().await;
    let server = host_port(&db);
    let upstream = tokio::net::lookup_host(&server)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("the outage test needs a TCP database address, got {server:?}"));
    let proxy = Proxy::start(upstream).await;
    // A short acquire timeout (a documented setting) keeps each failing request quick.
    let proxied = with_host_port(&db, &format!("127.0.0.1:{}", proxy.port));
    let app = spawn_app_on(proxied, |s| s.database.acquire_timeout_ms = 300).await;
    app.kv_put("k", "1", &json!("before")).await.expect(201);
    app.get("/readyz").await.expect(200);

    proxy.cut();

    let ready = app.get("/readyz").await;
    ready.problem(503, "unavailable");
    assert!(ready.header("retry-after").is_some(), "503 without Retry-After: {ready:?}");
    // Several attempts: the first may meet a pooled connection that was just reset, later ones a
    // new connection closed at once. Both are the database being unreachable.
    for _ in 0..2 {
        for r in [app.kv_put("k", "2", &json!("during")).await, app.kv_get("k").await] {
            r.problem(503, "unavailable");
            assert!(r.header("retry-after").is_some(), "503 without Retry-After: {r:?}");
        }
    }
    app.get("/healthz").await.expect(200); // liveness is about the process itself

    // The database comes back on the same address: the server recovers by itself.
    proxy.heal();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/readyz").await;
        if r.status == 200 {
            break;
        }
        r.problem(503, "unavailable");
        assert!(tokio::time::Instant::now() < deadline, "not ready 30s after the database came back: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.assert_value("k", &json!("before"), "1").await;
    app.kv_put("k", "0", &json!("zombie")).await.stale_key("k", "0", "1");
    app.kv_put("k", "2", &json!("after")).await.expect(200);
    drop(proxy);
}
