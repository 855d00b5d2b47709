//! Host lists (docs/operations.md, *A host list*): libpq's multi-host URL with
//! `target_session_attrs=read-write`, against a real primary and a streaming standby of this
//! test's own. The standby listed first, a dead host first, only standbys, a failover; and a
//! connection that reaches a server in recovery is never used for a read or a write.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::helpers::{spawn_app_on, TestApp};
use crate::proxy::Proxy;
use crate::support_pg::{self, Cluster};

/// Polls `GET path` until `status`, for at most 60 s; returns the last answer.
async fn wait_status(app: &TestApp, path: &str, status: u16, what: &str) -> crate::helpers::Resp {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = app.get(path).await;
        if r.status == status {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never answered {status} ({what}): {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn run(mut cmd: std::process::Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_host_list_finds_the_primary_skips_dead_hosts_and_standbys_and_follows_a_failover() {
    let bindir = support_pg::bindir(
        None,
        "PostgreSQL server binaries not found: install them (Debian: apt-get install postgresql); \
         the host-list test starts a primary and a standby of its own",
    );
    let root = tempfile::Builder::new()
        .prefix("fencegate-pg-hosts-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    let cleanup = format!("rm -rf {}", support_pg::shell_quote(&root));
    let settings = "-c fsync=off -c wal_level=replica -c max_wal_senders=4 -c hot_standby=on";
    let (dir, b) = (root.join("primary"), bindir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let primary = tokio::task::spawn_blocking({
        let cleanup = cleanup.clone();
        move || Cluster::new(&b, &dir, settings, &cleanup, "")
    })
    .await
    .unwrap();
    let (dir, b, port) = (root.join("standby"), bindir.clone(), primary.port);
    let standby =
        tokio::task::spawn_blocking(move || Cluster::standby_of(&b, &dir, port, settings, "true"))
            .await
            .unwrap();
    let dead = support_pg::free_port(); // nothing listens here: connection refused
    let (p, s) = (primary.port, standby.port);

    // Only a dead host and the standby: the server starts (waiting for a promotion), not ready,
    // and says why; writes are 503.
    let only_standbys = spawn_app_on(
        format!("postgres://postgres@127.0.0.1:{dead},127.0.0.1:{s}/postgres?target_session_attrs=read-write"),
        |_| {},
    )
    .await;
    let r = wait_status(&only_standbys, "/readyz", 503, "only standbys").await;
    let body = r.problem(503, "unavailable");
    assert!(
        body["detail"].as_str().unwrap().contains("in recovery"),
        "{body}"
    );
    drop(only_standbys);

    // The dead host and the standby first: the server comes up on the primary.
    let app = spawn_app_on(
        format!(
            "postgres://postgres@127.0.0.1:{dead},127.0.0.1:{s},127.0.0.1:{p}/postgres?target_session_attrs=read-write"
        ),
        |_| {},
    )
    .await;
    wait_status(&app, "/readyz", 200, "a host list with the primary last").await;
    app.kv_put("k", "1", &json!("one")).await.expect(201);
    app.assert_value("k", &json!("one"), "1").await;

    // A connection that reaches a standby is never used: a server behind a proxy the test
    // switches to the standby answers no read and no write until it leads to a primary again.
    let at = |port: u16| -> SocketAddr { format!("127.0.0.1:{port}").parse().unwrap() };
    let proxy = Proxy::start(at(p)).await;
    let behind = spawn_app_on(
        format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port),
        |_| {},
    )
    .await;
    wait_status(&behind, "/readyz", 200, "through the proxy").await;
    behind.kv_get("k").await.expect(200);
    proxy.switch(at(s));
    // The standby has k by now (it streams): a read answered 200 would come from it.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut answered = 0;
    while tokio::time::Instant::now() < until {
        let read = behind.kv_get("k").await;
        assert_eq!(read.status, 503, "a read answered from a standby: {read:?}");
        let write = behind.kv_put("other", "1", &json!("x")).await;
        assert_eq!(
            write.status, 503,
            "a write answered from a standby: {write:?}"
        );
        answered += 1;
    }
    assert!(answered > 0);
    behind.get("/readyz").await.problem(503, "unavailable");
    proxy.switch(at(p));
    wait_status(
        &behind,
        "/readyz",
        200,
        "the proxy leads to the primary again",
    )
    .await;
    behind.kv_get("k").await.expect(200);
    drop(behind);
    drop(proxy);

    // A failover: the standby is promoted and the old primary stopped. New connections skip the
    // dead host and find the new primary; readiness follows.
    let promote = standby.promote_command();
    tokio::task::spawn_blocking(move || run(promote, "pg_ctl promote"))
        .await
        .unwrap();
    let stop = primary.stop_command("fast");
    tokio::task::spawn_blocking(move || run(stop, "pg_ctl stop (the old primary)"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = app.kv_put("k", "2", &json!("two")).await;
        if matches!(r.status, 200 | 201) {
            break;
        }
        r.problem(503, "unavailable");
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes never came back after the failover: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_status(&app, "/readyz", 200, "after the failover").await;
    app.assert_value("k", &json!("two"), "2").await;
    let mut stop = standby.stop_command("immediate");
    let _ = tokio::task::spawn_blocking(move || stop.output()).await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_bad_target_session_attrs_stops_start_up_naming_the_allowed_values() {
    let db = crate::pg::fresh_database().await;
    let url = crate::db_url::with_host_port(&db, "127.0.0.1:1,127.0.0.1:2");
    for (value, expected) in [("master", "read-write"), ("standby", "cannot write")] {
        let mut settings = fencegate::config::Settings::default();
        settings.database.url = Some(format!("{url}?target_session_attrs={value}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = fencegate::serve(settings, listener, std::future::pending::<()>())
            .await
            .expect_err("start-up with a bad target_session_attrs")
            .to_string();
        assert!(
            err.contains(&format!("target_session_attrs={value}")) && err.contains(expected),
            "{err}"
        );
    }
}
