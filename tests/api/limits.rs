//! Bounded everything: a request stuck behind a database lock times out with 503 + Retry-After,
//! and requests beyond `server.max_in_flight` are shed at once with 503, never queued without
//! bound. The stuck request is real: another connection holds the row lock it needs.

use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

use crate::helpers::{spawn_app_on, unique};

/// Opens a transaction that holds the row lock of `key` until the returned connection is dropped
/// or committed.
async fn lock_row(db: &str, key: &str) -> PgConnection {
    let mut conn = PgConnection::connect(db)
        .await
        .expect("connect for the row lock");
    conn.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM fencegate.fencegate_kv WHERE key = $1 FOR UPDATE")
        .bind(key)
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test]
async fn a_request_stuck_on_the_database_times_out_with_503() {
    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |s| s.server.request_timeout_ms = 500).await;
    let key = unique("k");
    app.kv_put(&key, "1", &json!("before")).await.expect(201);

    let mut holder = lock_row(&db, &key).await;
    let started = Instant::now();
    let stuck = app.kv_put(&key, "2", &json!("after")).await;
    let body = stuck.problem(503, "unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(stuck.header("retry-after"), Some("1"), "{body}");

    holder.execute("COMMIT").await.unwrap();
    // The outcome of a timed-out write is unknown; a retry with the same token is safe.
    app.kv_put(&key, "2", &json!("after")).await.expect(200);
    app.assert_value(&key, &json!("after"), "2").await;
}

#[tokio::test]
async fn requests_beyond_max_in_flight_are_shed_with_503() {
    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |s| {
        s.server.max_in_flight = 1;
        s.server.request_timeout_ms = 30_000;
    })
    .await;
    let key = unique("k");
    app.kv_put(&key, "1", &json!("before")).await.expect(201);

    let mut holder = lock_row(&db, &key).await;
    let client = app.client.clone();
    let url = format!("{}/v1/kv/{key}", app.address);
    let stuck = tokio::spawn(async move {
        client
            .put(url)
            .header("X-Fencing-Token", "2")
            .json(&json!("after"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // Until the stuck write holds the only slot, a request may still get through: poll, bounded.
    // (A request that never touches the database, so that it cannot hold the slot when the
    // write arrives.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let shed = loop {
        let probe = app.get("/metrics").await;
        if probe.status == 503 {
            break probe;
        }
        assert!(
            Instant::now() < deadline,
            "never shed: the slot was never taken ({probe:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shed.problem(503, "unavailable");
    assert_eq!(shed.header("retry-after"), Some("1"));
    app.get("/v1/fences/none").await.problem(503, "unavailable");
    // The probes are never shed (issue 14, finding 3): a load balancer must not restart a
    // process for being busy.
    app.get("/healthz").await.expect(200);
    app.get("/readyz").await.expect(200);

    holder.execute("COMMIT").await.unwrap();
    assert_eq!(stuck.await.unwrap().unwrap(), 200);
    app.get("/healthz").await.expect(200);
}

/// A request that times out while its transaction is starting must not leave the connection
/// inside that transaction: every later 2xx must be committed. Reproduced by freezing
/// fencegate's own PostgreSQL backend with SIGSTOP while a lock request is in `BEGIN`.
#[tokio::test]
async fn a_timed_out_transaction_never_leaks_into_later_writes() {
    use nix::{
        sys::signal::{kill, Signal},
        unistd::Pid,
    };

    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |s| {
        s.server.request_timeout_ms = 1000;
        s.database.max_connections = 1;
        s.database.min_connections = 1;
        s.database.coalesce_workers = Some(0);
        s.kv.fence_cache_capacity = 0;
    })
    .await;
    app.kv_put(&unique("warm"), "1", &json!(1))
        .await
        .expect(201);

    let mut admin = PgConnection::connect(&db).await.unwrap();
    let backend: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'fencegate' AND datname = current_database()",
    )
    .fetch_one(&mut admin)
    .await
    .expect("fencegate's one backend");
    let backend = Pid::from_raw(backend);

    kill(backend, Signal::SIGSTOP).unwrap();
    let lock = unique("lock");
    let timed_out = app
        .send(
            app.req(reqwest::Method::POST, &format!("/v1/locks/{lock}"))
                .json(&json!({"owner": "a", "ttl_ms": 1000})),
        )
        .await;
    kill(backend, Signal::SIGCONT).unwrap();
    timed_out.problem(503, "unavailable");

    let key = unique("k");
    app.kv_put(&key, "7", &json!("must be committed"))
        .await
        .expect(201);
    let stored: Option<String> =
        sqlx::query_scalar("SELECT value::text FROM fencegate.fencegate_kv WHERE key = $1")
            .bind(&key)
            .fetch_optional(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        stored.as_deref(),
        Some("\"must be committed\""),
        "a 201 was sent for a write that is not committed"
    );
    let stuck: i64 = sqlx::query_scalar(
        // This test's database only: other tests (and other runs on a shared DATABASE_URL
        // server) have fencegate sessions between the statements of a transaction too.
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fencegate' AND state = 'idle in transaction' AND datname = current_database()",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        stuck, 0,
        "a fencegate session was left idle in a transaction"
    );
}

/// fencegate keeps its PostgreSQL connections between statements (store/connections.rs). With
/// far more concurrent requests than connections, of every kind that takes one (coalesced and
/// scoped writes, reads, claims, batches), every request must still succeed — a caller waits for
/// a connection coming back, it is not refused — and fencegate must never hold more backends
/// than `database.max_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_requests_than_connections_all_succeed_on_at_most_max_connections_backends() {
    const MAX_CONNECTIONS: i64 = 3;
    let db = crate::pg::fresh_database().await;
    let app = std::sync::Arc::new(
        spawn_app_on(db.clone(), |s| {
            s.database.max_connections = MAX_CONNECTIONS as u32;
            s.database.min_connections = 1;
            s.database.coalesce_workers = Some(1);
        })
        .await,
    );
    let mut admin = PgConnection::connect(&db).await.unwrap();
    let backends = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fencegate' AND datname = current_database()";

    let mut tasks = Vec::new();
    for i in 0..48u32 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let key = unique(&format!("k{i}"));
            let mut statuses = Vec::new();
            for round in 1..=5u32 {
                let token = (round * 10).to_string();
                let status = match i % 4 {
                    0 => app.kv_put(&key, &token, &json!(round)).await.status,
                    1 => {
                        app.kv_put_scoped(&key, &token, &format!("s{i}"), &json!(round))
                            .await
                            .status
                    }
                    2 => app.claim(&format!("c{i}"), &token).await.status,
                    _ => {
                        app.batch(
                            Some(&token),
                            None,
                            &json!({"ops": [{"op": "put", "key": key, "value": round}]}),
                        )
                        .await
                        .status
                    }
                };
                statuses.push(status);
                statuses.push(app.kv_get(&key).await.status);
            }
            statuses
        }));
    }
    let mut peak = 0;
    for task in tasks {
        let seen: i64 = sqlx::query_scalar(backends)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        peak = peak.max(seen);
        let statuses = task.await.unwrap();
        for status in statuses {
            assert!(
                (200..300).contains(&status) || status == 404,
                "a request got {status}: waiting for a connection must not fail it"
            );
        }
    }
    let after: i64 = sqlx::query_scalar(backends)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(
        peak.max(after) <= MAX_CONNECTIONS,
        "fencegate held {} backends; the limit is {MAX_CONNECTIONS}",
        peak.max(after)
    );
}

#[tokio::test]
async fn a_server_error_is_logged_with_its_request_id_method_and_route() {
    // The detail of a 5xx goes to the log, never to the client: the log line must be findable
    // by the id the client got.
    let db = crate::pg::fresh_database().await;
    let bin =
        crate::helpers::spawn_binary_configured(&db, "[server]\nrequest_timeout_ms = 300\n", None)
            .await;
    let app = bin.view();
    let key = unique("k");
    app.kv_put(&key, "1", &json!("before")).await.expect(201);

    let holder = lock_row(&db, &key).await;
    let stuck = app.kv_put(&key, "2", &json!("after")).await;
    stuck.problem(503, "unavailable");
    let id = stuck
        .header("x-request-id")
        .expect("a request id")
        .to_owned();
    drop(holder);
    let (_, stderr) = bin.terminate().await;
    let line = stderr
        .lines()
        .find(|l| l.contains("request failed") && l.contains(&id))
        .unwrap_or_else(|| panic!("no `request failed` line with request id {id}:\n{stderr}"));
    assert!(
        line.contains("PUT") && line.contains("/v1/kv/{key}"),
        "method and route: {line}"
    );
}

/// An acquire that waited for its scope's fence row (held here by another transaction, as a
/// long scoped batch would) still gets its whole lease: the lease starts when the grant is
/// decided, not when its transaction began (found in review: after a 1.5 s wait, a 1 s lease
/// was granted already expired, and the next acquirer got the lock at once).
#[tokio::test]
async fn an_acquire_that_waited_for_its_fence_gets_its_whole_lease() {
    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    let name = unique("waited");
    app.claim(&name, "1").await.expect(201);
    let acquire = |owner: &'static str| {
        app.send(
            app.req(reqwest::Method::POST, &format!("/v1/locks/{name}"))
                .json(&json!({"owner": owner, "ttl_ms": 1000})),
        )
    };

    let mut fence_holder = PgConnection::connect(&db)
        .await
        .expect("connect for the fence row");
    fence_holder.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM fencegate.fencegate_fences WHERE scope = $1 FOR UPDATE")
        .bind(&name)
        .execute(&mut fence_holder)
        .await
        .unwrap();
    let (granted, ()) = tokio::join!(acquire("waited"), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        fence_holder.execute("COMMIT").await.unwrap();
    });
    granted.expect(201);
    let held = acquire("next").await.problem(409, "lock-held");
    let remaining = held["remaining_ms"].as_i64().unwrap();
    assert!(
        remaining > 500,
        "the lease granted after the wait has {remaining} ms left of 1000: {held}"
    );
}

/// With the digit cap raised past what PostgreSQL's numeric type takes, `1e999999` reaches the
/// coalescer, and the database refuses the statement (SQLSTATE 22: a data exception). A lone
/// write gets its 400 at once (it is not retried: it is already alone), and amid 20 concurrent
/// good writes only it is refused: the combined statement is retried one write at a time, once.
/// SQLite stores such a number as text, and does not coalesce: PostgreSQL's (this file is not in
/// the SQLite suite).
#[tokio::test]
async fn a_value_the_database_refuses_is_400_alone_and_amid_coalesced_neighbours() {
    use crate::helpers::{kv, spawn_app_with, TOKEN};
    use reqwest::Method;
    let app = std::sync::Arc::new(spawn_app_with(|s| s.kv.max_number_digits = 10_000_000).await);
    let put_raw = |app: std::sync::Arc<crate::helpers::TestApp>, key: String, raw: &'static str| async move {
        let request = app
            .req(Method::PUT, &kv(&key))
            .header(TOKEN, "1")
            .header("content-type", "application/json")
            .body(raw);
        tokio::time::timeout(std::time::Duration::from_secs(20), app.send(request))
            .await
            .unwrap_or_else(|_| panic!("PUT {key} got no answer within 20 s"))
    };
    put_raw(app.clone(), "huge".into(), "1e999999")
        .await
        .problem(400, "invalid-json");
    app.assert_absent("huge").await;
    for round in 0..3 {
        let mut writes = Vec::new();
        for i in 0..21 {
            let raw = if i == 10 {
                r#"{"n": 1e999999}"#
            } else {
                r#"{"n": 1}"#
            };
            writes.push(tokio::spawn(put_raw(
                app.clone(),
                format!("r{round}-k{i}"),
                raw,
            )));
        }
        for (i, write) in writes.into_iter().enumerate() {
            let resp = write.await.expect("write task");
            if i == 10 {
                resp.problem(400, "invalid-json");
                app.assert_absent(&format!("r{round}-k10")).await;
            } else {
                resp.expect(201);
            }
        }
    }
}

/// A lone write goes out from its own request, not through a coalescing worker; writes that
/// arrive while it runs must still queue behind it and go out together, not each on its own.
/// The lone write is held on a row lock, so the others provably arrive while it runs; each
/// statement is its own transaction, so the rows one statement wrote share one `xmin`.
#[tokio::test]
async fn writes_arriving_while_a_lone_write_runs_still_go_out_together() {
    let db = crate::pg::fresh_database().await;
    let app = std::sync::Arc::new(
        spawn_app_on(db.clone(), |s| {
            s.database.coalesce_workers = Some(1);
            s.database.lock_timeout_ms = 30_000;
            s.server.request_timeout_ms = 30_000;
        })
        .await,
    );
    let held = unique("held");
    app.kv_put(&held, "1", &json!("before")).await.expect(201);
    let mut holder = lock_row(&db, &held).await;
    let lone = {
        let (app, held) = (app.clone(), held.clone());
        tokio::spawn(async move { app.kv_put(&held, "2", &json!("after")).await.status })
    };
    // The lone write is in the database, waiting for the row lock.
    let mut watch = PgConnection::connect(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watch)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lone write never reached the row lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let prefix = unique("b");
    let writes: Vec<_> = (0..20)
        .map(|i| {
            let (app, key) = (app.clone(), format!("{prefix}-{i}"));
            tokio::spawn(async move { app.kv_put(&key, "1", &json!(i)).await.status })
        })
        .collect();
    // Give the twenty time to queue (they cannot go out while the lone write holds the only
    // worker's turn); however long this takes, they must not have been sent one by one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.execute("COMMIT").await.unwrap();
    assert_eq!(lone.await.unwrap(), 200);
    for write in writes {
        assert_eq!(write.await.unwrap(), 201);
    }
    let statements: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM fencegate.fencegate_kv WHERE key LIKE $1",
    )
    .bind(format!("{prefix}-%"))
    .fetch_one(&mut watch)
    .await
    .unwrap();
    assert!(
        statements <= 3,
        "20 writes that waited together went out in {statements} statements"
    );
}
