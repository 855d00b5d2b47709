//! fencegate behind PgBouncer 1.18 (`database.pooler`, docs/operations.md): started with
//! PgBouncer's defaults (no `ignore_startup_parameters`) in session and in transaction mode, it
//! serves every fenced write path, keeps everything in its schema, keeps its lock timeout, and
//! hears of resets made by another process; without the setting, the error says to set it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencegate::store::Pooler;
use reqwest::Method;
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

use crate::helpers::{
    ledger_table, spawn_app_on, spawn_binary_configured, unique, BinApp, TestApp, TOKEN,
};
use crate::pgbouncer::{PgBouncer, PoolMode};

/// A fresh database, PgBouncer in front of its server, and fencegate through PgBouncer.
async fn behind(mode: PoolMode, pool_size: u32) -> (String, PgBouncer) {
    let db = crate::pg::fresh_database().await;
    let bouncer = PgBouncer::start(&db, mode, pool_size);
    (db, bouncer)
}

fn pooler(mode: PoolMode) -> Pooler {
    match mode {
        PoolMode::Session => Pooler::Session,
        PoolMode::Transaction => Pooler::Transaction,
    }
}

async fn spawn_behind(url: &str, mode: PoolMode) -> TestApp {
    spawn_app_on(url.to_owned(), |s| {
        s.database.pooler = pooler(mode);
        s.database.max_connections = 8;
        s.resources = vec![ledger_table("tickets", "legacy.tickets")];
    })
    .await
}

async fn legacy_table(db: &str) {
    let mut conn = PgConnection::connect(db).await.expect("connect directly");
    conn.execute(
        "CREATE SCHEMA legacy; CREATE TABLE legacy.tickets (id bigint PRIMARY KEY, holder text)",
    )
    .await
    .expect("create the legacy table");
    let _ = conn.close().await;
}

/// Everything of fencegate's: no table, function, sequence or type of it in `public`.
async fn assert_nothing_in_public(db: &str) {
    let mut conn = PgConnection::connect(db).await.expect("connect directly");
    let in_public: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'
         UNION ALL
         SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
         UNION ALL
         SELECT t.typname::text FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = 'public'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        in_public.is_empty(),
        "objects landed in public: {in_public:?}"
    );
    let migrations: bool = sqlx::query_scalar(
        "SELECT to_regclass('fencegate._sqlx_migrations') IS NOT NULL AND to_regclass('fencegate.fencegate_kv') IS NOT NULL",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(migrations, "fencegate's tables are not in its schema");
    let _ = conn.close().await;
}

/// kv writes, reads, batches, claims, leases and legacy-table writes, each fenced, and a
/// zombie refused (412) on each path.
async fn serves_every_fenced_path(app: &TestApp) {
    let key = unique("k");
    app.kv_put(&key, "5", &json!("v5")).await.expect(201);
    app.kv_put(&key, "6", &json!("v6")).await.expect(200);
    app.assert_value(&key, &json!("v6"), "6").await;
    app.kv_put(&key, "5", &json!("zombie"))
        .await
        .stale_key(&key, "5", "6");
    // The same statement text again, many times: cached metadata, re-parsed each time.
    for token in 7..27 {
        app.kv_put(&key, &token.to_string(), &json!(token))
            .await
            .expect(200);
    }

    let scope = unique("s");
    app.claim(&scope, "10").await.expect(201);
    app.claim(&scope, "9").await.stale_scope(&scope, "9", "10");
    app.batch(
        Some("10"),
        Some(&scope),
        &json!({"ops": [{"op": "put", "key": unique("b"), "value": 1}, {"op": "delete", "key": unique("b")}]}),
    )
    .await
    .expect(200);
    app.kv_put_scoped(&unique("z"), "9", &scope, &json!(1))
        .await
        .stale_scope(&scope, "9", "10");

    let lock = unique("lock");
    let lease = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{lock}"))
                .json(&json!({"owner": "w", "ttl_ms": 60_000})),
        )
        .await
        .expect(201);
    let token = lease["token"].as_str().unwrap().to_owned();
    app.kv_put_scoped(&unique("l"), &token, &lock, &json!(1))
        .await
        .expect(201);

    let row = |holder: &str| json!({"holder": holder});
    app.send(
        app.req(Method::PUT, "/v1/tables/tickets/1")
            .header(TOKEN, "5")
            .json(&row("a")),
    )
    .await
    .expect(201);
    let refused = app
        .send(
            app.req(Method::PUT, "/v1/tables/tickets/1")
                .header(TOKEN, "4")
                .json(&row("zombie")),
        )
        .await;
    assert_eq!(refused.status, 412, "{refused:?}");
    let got = app.get("/v1/tables/tickets/1").await.expect(200);
    assert_eq!(got["row"]["holder"], json!("a"), "{got}");
}

/// Every fenced path through PgBouncer in `mode` (with `pool_size` server connections), and
/// nothing of fencegate's in `public`.
async fn serves_fenced_writes_behind(mode: PoolMode, pool_size: u32) {
    let (db, bouncer) = behind(mode, pool_size).await;
    legacy_table(&db).await;
    let app = spawn_behind(&bouncer.url(&db), mode).await;
    serves_every_fenced_path(&app).await;
    assert_nothing_in_public(&db).await;
}

#[tokio::test]
async fn serves_fenced_writes_behind_pgbouncer_in_transaction_mode() {
    serves_fenced_writes_behind(PoolMode::Transaction, 4).await;
}

#[tokio::test]
async fn serves_fenced_writes_behind_pgbouncer_in_session_mode() {
    serves_fenced_writes_behind(PoolMode::Session, 20).await;
}

/// Without `database.pooler`, start-up fails and the error names the setting.
#[tokio::test]
async fn without_the_setting_the_error_says_to_set_database_pooler() {
    let (db, bouncer) = behind(PoolMode::Transaction, 4).await;
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(bouncer.url(&db));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served = tokio::time::timeout(
        Duration::from_secs(60),
        fencegate::serve(settings, listener, std::future::pending()),
    )
    .await
    .expect("start-up neither failed nor served within 60 s");
    let err = format!(
        "{:#}",
        served.expect_err("started behind PgBouncer without database.pooler")
    );
    assert!(
        err.contains("unsupported startup parameter") && err.contains("set database.pooler"),
        "{err}"
    );
}

/// A pooler that silently drops `options` (PgBouncer with `ignore_startup_parameters`) takes
/// fencegate's `search_path` away: without `database.pooler` it refuses to start rather than
/// create anything in `public`, and says what to set.
#[tokio::test]
async fn a_pooler_that_drops_search_path_is_refused_before_anything_lands_in_public() {
    let db = crate::pg::fresh_database().await;
    let bouncer = PgBouncer::start_with(
        &db,
        PoolMode::Session,
        20,
        "ignore_startup_parameters = extra_float_digits,options\n",
    );
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(bouncer.url(&db));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served = tokio::time::timeout(
        Duration::from_secs(60),
        fencegate::serve(settings, listener, std::future::pending()),
    )
    .await
    .expect("start-up neither failed nor served within 60 s");
    let err = format!("{:#}", served.expect_err("started without its search_path"));
    assert!(
        err.contains("current_schema") || err.contains("not in database.schema"),
        "{err}"
    );
    assert!(err.contains("set database.pooler"), "{err}");
    let mut conn = PgConnection::connect(&db).await.unwrap();
    let in_public: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(in_public, 0, "objects landed in public");
}

/// A row locked by a SQL transaction makes a fencegate write wait at most
/// `database.lock_timeout_ms` (set per transaction behind the pooler), then 503.
#[tokio::test]
async fn the_lock_timeout_is_in_force_in_transaction_mode() {
    let (db, bouncer) = behind(PoolMode::Transaction, 4).await;
    let app = spawn_app_on(bouncer.url(&db), |s| {
        s.database.pooler = Pooler::Transaction;
        s.database.lock_timeout_ms = 500;
    })
    .await;
    let key = unique("k");
    app.kv_put(&key, "1", &json!("before")).await.expect(201);
    let mut holder = PgConnection::connect(&db).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM fencegate.fencegate_kv WHERE key = $1 FOR UPDATE")
        .bind(&key)
        .execute(&mut holder)
        .await
        .unwrap();
    let started = Instant::now();
    let r = app.kv_put(&key, "2", &json!("blocked")).await;
    let waited = started.elapsed();
    assert_eq!(r.status, 503, "{r:?}");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(4),
        "answered after {waited:?}, not after about lock_timeout_ms = 500"
    );
    holder.execute("ROLLBACK").await.unwrap();
    app.kv_put(&key, "2", &json!("after")).await.expect(200);
    assert_nothing_in_public(&db).await;
}

/// The second process of the two-process tests: the real executable, configured by file.
const TRANSACTION_MODE_TOML: &str = "[database]\npooler = \"transaction\"\nmax_connections = 8\n";

/// Two fencegate processes started at once (they migrate once) share a 4-connection
/// transaction pool and serve fenced load from many clients with no 5xx.
#[tokio::test]
async fn two_fencegates_share_a_four_connection_transaction_pool_with_no_5xx() {
    let (db, bouncer) = behind(PoolMode::Transaction, 4).await;
    let url = bouncer.url(&db);
    let (a, b_process) = tokio::join!(
        spawn_app_on(url.clone(), |s| {
            s.database.pooler = Pooler::Transaction;
            s.database.max_connections = 8;
        }),
        spawn_binary_configured(&url, TRANSACTION_MODE_TOML, None)
    );
    let apps = Arc::new([a, b_process.view()]);
    let prefix = unique("load");
    let tasks: Vec<_> = (0..16)
        .map(|client| {
            let apps = apps.clone();
            let prefix = prefix.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for round in 1..=25u32 {
                    let app = &apps[(client + round as usize) % 2];
                    // Eight keys, each written by two clients with interleaved tokens: some
                    // writes are zombies (412), none may fail.
                    let key = format!("{prefix}-{}", client % 8);
                    let token = round * 2 + (client as u32 / 8);
                    let r = app.kv_put(&key, &token.to_string(), &json!(round)).await;
                    statuses.push(r.status);
                    if round % 5 == 0 {
                        statuses.push(app.kv_get(&key).await.status);
                    }
                }
                statuses
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        for status in task.await.unwrap() {
            assert!(
                [200, 201, 412].contains(&status),
                "a fenced write or read answered {status} behind a shared transaction pool"
            );
            ok += usize::from(status != 412);
        }
    }
    assert!(ok > 100, "only {ok} writes and reads succeeded");
    let mut conn = PgConnection::connect(&db).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM fencegate._sqlx_migrations")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let known = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sql")
        })
        .count();
    assert_eq!(applied as usize, known, "each migration applied once");
    assert_nothing_in_public(&db).await;
}

/// Two processes behind PgBouncer in transaction mode, with no `database.listen_url`: no LISTEN,
/// so resets reach each from the other only through the audit-log poll. `one` runs in this
/// process; `two` is the binary. The database's direct URL, and the pooler (stopped on drop).
async fn two_without_listen() -> (String, PgBouncer, TestApp, BinApp) {
    let (db, bouncer) = behind(PoolMode::Transaction, 4).await;
    let url = bouncer.url(&db);
    let one = spawn_app_on(url.clone(), |s| {
        s.database.pooler = Pooler::Transaction;
        s.database.max_connections = 4;
    })
    .await;
    one.get("/readyz").await.expect(200);
    let two = spawn_binary_configured(&url, TRANSACTION_MODE_TOML, None).await;
    (db, bouncer, one, two)
}

/// `POST /v1/admin/kv/{key}/reset` to `to` through `app`.
async fn reset_key(app: &TestApp, key: &str, to: &str, reason: &str) {
    app.send(
        app.req(Method::POST, &format!("/v1/admin/kv/{key}/reset"))
            .json(&json!({"to": to, "reason": reason})),
    )
    .await
    .expect(200);
}

/// In transaction mode without `database.listen_url` there is no LISTEN: a reset made through
/// one process reaches the other through the audit-log poll, within a second or so.
#[tokio::test]
async fn a_reset_reaches_the_other_process_by_the_audit_poll_in_transaction_mode() {
    let (_db, _bouncer, one, two_process) = two_without_listen().await;
    let two = two_process.view();
    let key = unique("k");
    two.kv_put(&key, "50", &json!(1)).await.expect(201);
    // Process two now holds the fence 50 in its cache: 10 is refused without a statement.
    two.kv_put(&key, "10", &json!(2))
        .await
        .stale_key(&key, "10", "50");
    reset_key(&one, &key, "5", "pooler test").await;
    let took = two
        .put_until_admitted(
            &key,
            "10",
            "50",
            Duration::from_secs(10),
            "process two still refuses 10 after the reset to 5",
        )
        .await;
    // The poll runs every 500 ms; on a loaded machine allow some margin.
    assert!(
        took < Duration::from_secs(3),
        "the reset took {took:?} to reach process two"
    );
    // What the reset did not allow is still refused, by the database now.
    two.kv_put(&key, "4", &json!(4))
        .await
        .stale_key(&key, "4", "10");
}

/// A reset's audit id is taken when its row is inserted, not when it commits: a reset whose
/// transaction commits after a newer one was already seen must still reach the other process
/// through the poll (which therefore watches the row count, not only the newest id).
#[tokio::test]
async fn a_reset_committed_after_a_newer_one_still_reaches_the_other_process() {
    let (db, _bouncer, one, two_process) = two_without_listen().await;
    let two = two_process.view();
    let (early, late) = (unique("early"), unique("late"));
    for key in [&early, &late] {
        two.kv_put(key, "50", &json!(1)).await.expect(201);
    }
    // A reset of `early` in the making, as fencegate's own is (the fence and its audit row in
    // one transaction): it takes its audit id now and commits last.
    let mut held = PgConnection::connect(&db).await.expect("connect directly");
    held.execute("BEGIN").await.unwrap();
    sqlx::query(
        "INSERT INTO fencegate.fencegate_audit (actor, action, target, name, from_token, to_token, reason)
         VALUES ('test', 'reset', 'key', $1, 50, 5, 'committed last')",
    )
    .bind(&early)
    .execute(&mut held)
    .await
    .unwrap();
    // A newer reset commits first, and process two hears of it.
    reset_key(&one, &late, "5", "committed first").await;
    let limit = Duration::from_secs(10);
    two.put_until_admitted(
        &late,
        "10",
        "50",
        limit,
        "process two never heard of the first reset",
    )
    .await;
    // Process two caches `early` at 50 again; then the older reset commits.
    two.kv_put(&early, "10", &json!(2))
        .await
        .stale_key(&early, "10", "50");
    sqlx::query("UPDATE fencegate.fencegate_kv SET key_fence = 5 WHERE key = $1")
        .bind(&early)
        .execute(&mut held)
        .await
        .unwrap();
    held.execute("COMMIT").await.unwrap();
    let took = two
        .put_until_admitted(
            &early,
            "10",
            "50",
            limit,
            "process two still refuses 10 after the reset committed last",
        )
        .await;
    println!("the reset committed last reached process two after {took:?}");
    // A zombie below the lowered fence is still refused.
    two.kv_put(&early, "4", &json!(4))
        .await
        .stale_key(&early, "4", "10");
}

/// The reset listener (`LISTEN`) connects to `database.listen_url` when set, directly; in
/// transaction mode without it there is none at all (the audit-log poll carries resets).
#[tokio::test]
async fn the_reset_listener_uses_listen_url_and_is_absent_without_it_in_transaction_mode() {
    let (db, bouncer) = behind(PoolMode::Transaction, 4).await;
    let name = db.rsplit('/').next().unwrap().to_owned();
    let listeners = || async {
        let mut conn = PgConnection::connect(&db).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'fencegate-listener'",
        )
        .bind(&name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let _ = conn.close().await;
        n
    };
    let with = spawn_app_on(bouncer.url(&db), |s| {
        s.database.pooler = Pooler::Transaction;
        s.database.listen_url = Some(db.clone());
    })
    .await;
    with.get("/readyz").await.expect(200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while listeners().await != 1 {
        assert!(
            Instant::now() < deadline,
            "no reset listener on database.listen_url after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(with);
    let deadline = Instant::now() + Duration::from_secs(20);
    while listeners().await != 0 {
        assert!(
            Instant::now() < deadline,
            "the listener outlived its server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let without = spawn_app_on(bouncer.url(&db), |s| {
        s.database.pooler = Pooler::Transaction
    })
    .await;
    without.get("/readyz").await.expect(200);
    // Long enough for a listener to have connected (it does within a poll period).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        listeners().await,
        0,
        "a listener connected through the transaction pool"
    );
}
