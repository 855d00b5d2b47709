//! Operational endpoints: liveness, readiness, Prometheus metrics.

use serde_json::json;

use crate::helpers::{enc, spawn_app, unique};

#[tokio::test]
async fn healthz_is_ok() {
    let app = spawn_app().await;
    let body = app.get("/healthz").await.expect(200);
    assert_eq!(body, json!({"status": "ok"}));
}

#[tokio::test]
async fn readyz_is_ready_on_a_migrated_database() {
    let app = spawn_app().await;
    let body = app.get("/readyz").await.expect(200);
    assert_eq!(body, json!({"status": "ready"}));
}

#[tokio::test]
async fn metrics_count_accepted_and_stale_writes_without_leaking_names() {
    let app = spawn_app().await;
    let key = unique("metrickey");
    let scope = unique("metricscope");
    app.kv_put(&key, "10", &json!(1)).await.expect(201);
    app.kv_put(&key, "5", &json!(2))
        .await
        .problem(412, "stale-token");
    app.kv_put_scoped(&format!("{key}-scoped"), "3", &scope, &json!(3))
        .await
        .expect(201);
    app.claim(&enc(&scope), "2")
        .await
        .problem(412, "stale-token");
    app.kv_get(&key).await.expect(200);
    app.get(&format!("/nope/{key}"))
        .await
        .problem(404, "not-found");

    let r = app.get("/metrics").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.header("content-type")
            .is_some_and(|ct| ct.starts_with("text/plain")),
        "metrics content-type: {r:?}"
    );
    let text = &r.text;
    let writes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("fencegate_writes_total{"))
        .collect();
    assert!(
        writes.iter().any(|l| l.contains(r#"outcome="accepted""#)),
        "no accepted fencegate_writes_total sample:\n{text}"
    );
    assert!(
        writes.iter().any(|l| l.contains(r#"outcome="stale""#)),
        "no stale fencegate_writes_total sample:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("fencegate_http_requests_total{")),
        "no fencegate_http_requests_total sample:\n{text}"
    );
    // Labels are bounded: route templates, never request text.
    assert!(
        !text.contains("metrickey"),
        "a key name leaked into /metrics:\n{text}"
    );
    assert!(
        !text.contains("metricscope"),
        "a scope name leaked into /metrics:\n{text}"
    );
}

/// Requests per statement are Prometheus histograms (buckets that add up across processes),
/// not summaries, and each statement counts once: a lone write is a statement of one row.
/// PostgreSQL only: SQLite combines nothing.
#[tokio::test]
async fn requests_per_statement_are_histograms_counting_every_statement() {
    let app = spawn_app().await;
    let count = |text: &str, name: &str| crate::operating::counter(text, &format!("{name}_count"));
    let before = app.get("/metrics").await.text;
    let key = unique("k");
    app.kv_put(&key, "1", &json!(1)).await.expect(201);
    app.kv_get(&enc(&key)).await.expect(200);
    let text = app.get("/metrics").await.text;
    if crate::BACKEND == crate::pg::Backend::Sqlite {
        return; // one writer, no statements combined
    }
    for name in ["fencegate_coalesced_rows", "fencegate_coalesced_reads"] {
        assert!(
            text.lines()
                .any(|l| l == format!("# TYPE {name} histogram")),
            "{name} is not a histogram:\n{text}"
        );
        for le in ["1", "1024", "+Inf"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name}_bucket{{le=\"{le}\"}} "))),
                "no {name} bucket le={le}:\n{text}"
            );
        }
        assert!(!text.contains(&format!("{name}{{quantile")), "{text}");
        // Other tests share the process's recorder: at least this test's statement.
        assert!(
            count(&text, name) > count(&before, name),
            "{name} did not count this test's statement:\n{text}"
        );
    }
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_a_client_id_is_kept() {
    let app = spawn_app().await;
    let first = app.get("/healthz").await;
    let second = app.kv_put(&unique("k"), "1", &json!(1)).await;
    let (a, b) = (
        first.header("x-request-id").expect("an id"),
        second.header("x-request-id").expect("an id"),
    );
    assert!(
        !a.is_empty() && a != b,
        "two requests, two ids: {a:?} {b:?}"
    );
    let absent = app.get("/v1/kv/never-written").await;
    assert!(
        absent.header("x-request-id").is_some(),
        "errors carry an id too"
    );

    let mine = app
        .send(
            app.req(reqwest::Method::GET, "/healthz")
                .header("x-request-id", "trace-42"),
        )
        .await;
    assert_eq!(
        mine.header("x-request-id"),
        Some("trace-42"),
        "the caller's id is kept for its logs"
    );
}

/// Replication on PostgreSQL: `fencegate_replication_replicas` from the start (the test server
/// has none: 0), and `fencegate_replication_synchronous` only where replicas exist (a lone
/// server is not "asynchronous": an alert on 0 must not fire for it; tests/fault's failover run
/// checks 0 and 1 with real standbys). Neither on SQLite, which has no replication.
#[tokio::test]
async fn metrics_say_how_many_replicas_and_only_then_whether_synchronous() {
    let app = spawn_app().await;
    app.get("/readyz").await.expect(200);
    let sample = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map(str::to_owned)
    };
    if crate::BACKEND == crate::pg::Backend::Sqlite {
        let r = app.get("/metrics").await;
        assert_eq!(
            sample(&r.text, "fencegate_replication_replicas"),
            None,
            "SQLite has no replication to report:\n{}",
            r.text
        );
        assert_eq!(
            sample(&r.text, "fencegate_replication_synchronous"),
            None,
            "{}",
            r.text
        );
        return;
    }
    // A process of its own: the metrics recorder is one per process, and this test binary
    // runs other servers at the same time, some with real standbys (tests/api/hosts.rs).
    let db = crate::pg::fresh_database().await;
    let process = crate::helpers::spawn_binary(&db).await;
    let alone = process.view();
    // Checked at start, on the process's own task: give it a moment.
    let mut last = String::new();
    for _ in 0..100 {
        last = alone.get("/metrics").await.text;
        if sample(&last, "fencegate_replication_replicas").is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        sample(&last, "fencegate_replication_replicas").as_deref(),
        Some("fencegate_replication_replicas 0"),
        "{last}"
    );
    assert_eq!(
        sample(&last, "fencegate_replication_synchronous"),
        None,
        "a lone server is not 'asynchronous':\n{last}"
    );
}
