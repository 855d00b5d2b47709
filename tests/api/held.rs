//! A scope held by a SQL transaction delays only its own writes (docs/operations.md, *A held
//! scope*): a real connection calls `fencegate.fence()` and then stalls with its transaction
//! open; writers under that scope wait (at most `database.lock_timeout_ms`, then 503), and every
//! other write, unscoped or under another scope, goes on at its usual speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinSet;

use crate::helpers::{spawn_app_on, unique, TestApp};
use crate::pg;

/// Waits until `n` of fencegate's connections wait for a lock (the writes under the held scope
/// reached the database and wait on its fence row), or panics at the deadline.
async fn wait_for_lock_waiters(db: &mut PgConnection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'fencegate'
               AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *db)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no write of fencegate's waited on the held fence within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `writers` tasks, each writing `rounds` times in a row: unscoped keys, and keys under scopes of
/// their own. Returns every write's status and latency.
async fn unrelated_writes(
    app: &Arc<TestApp>,
    writers: usize,
    rounds: usize,
) -> Vec<(u16, Duration)> {
    let mut tasks = JoinSet::new();
    for w in 0..writers {
        let app = app.clone();
        tasks.spawn(async move {
            let key = unique("unrelated");
            let scope = (w % 2 == 1).then(|| unique("other-scope"));
            let mut seen = Vec::with_capacity(rounds);
            for n in 1..=rounds {
                let token = n.to_string();
                let started = Instant::now();
                let r = match &scope {
                    Some(scope) => {
                        app.kv_put_scoped(&key, &token, scope, &json!({"n": n}))
                            .await
                    }
                    None => app.kv_put(&key, &token, &json!({"n": n})).await,
                };
                seen.push((r.status, started.elapsed()));
            }
            seen
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap());
    }
    all
}

fn percentile(latencies: &mut [Duration], p: f64) -> Duration {
    latencies.sort();
    let at = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[at]
}

/// A SQL transaction holds `victim`'s fence row for far longer than the test: writers under
/// `victim` wait for it, while unscoped writers and writers under other scopes, in parallel, are
/// all answered, each long before the lock timeout. Once the transaction commits, the waiting
/// writes are applied.
#[tokio::test]
async fn a_scope_held_by_a_sql_transaction_delays_only_its_own_writes() {
    let db = pg::fresh_database().await;
    let app = Arc::new(spawn_app_on(db.clone(), |s| s.database.lock_timeout_ms = 20_000).await);
    // The server is up and migrated (fence() exists) once it answers a write.
    app.kv_put("warm-up", "1", &json!(1)).await.expect(201);

    let mut holder = PgConnection::connect(&db).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT fencegate.fence('victim', 1)")
        .execute(&mut *tx)
        .await
        .unwrap();

    let mut victims = JoinSet::new();
    for v in 0..4 {
        let app = app.clone();
        victims.spawn(async move {
            let started = Instant::now();
            let r = app
                .kv_put_scoped(&format!("victim-{v}"), "2", "victim", &json!({"v": v}))
                .await;
            (r.status, started.elapsed(), r.text)
        });
    }
    let mut watcher = PgConnection::connect(&db).await.unwrap();
    wait_for_lock_waiters(&mut watcher, 1).await;

    // 16 writers x 10 writes while the scope is held; none may wait for the victim's fence.
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(15), unrelated_writes(&app, 16, 10))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "unrelated writes were still waiting after {:?}: they queue behind the held scope",
                started.elapsed()
            )
        });
    let mut latencies: Vec<Duration> = outcome.iter().map(|(_, took)| *took).collect();
    let statuses: Vec<u16> = outcome.iter().map(|(status, _)| *status).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 201),
        "every unrelated write is applied while the scope is held: {statuses:?}"
    );
    let (p50, p99, max) = (
        percentile(&mut latencies, 0.50),
        percentile(&mut latencies, 0.99),
        percentile(&mut latencies, 1.0),
    );
    eprintln!(
        "unrelated writes while a scope is held: {} writes in {:?}, p50 {p50:?}, p99 {p99:?}, max {max:?}",
        outcome.len(),
        started.elapsed()
    );
    assert!(
        max < Duration::from_secs(5),
        "an unrelated write took {max:?} (lock timeout 20 s): it waited behind the held scope"
    );
    // The writes under the held scope are still waiting for it.
    assert!(
        victims.try_join_next().is_none(),
        "a write under the held scope was answered while the fence row was held"
    );

    tx.commit().await.unwrap();
    while let Some(done) = victims.join_next().await {
        let (status, took, text) = done.unwrap();
        assert!(
            status == 200 || status == 201,
            "a write under victim, once the holder committed: {status} after {took:?}: {text}"
        );
    }
    assert_eq!(app.fence("victim").await.expect(200)["fence_token"], "2");
}

/// With a short lock timeout, writes under a held scope get 503 (with Retry-After) after waiting
/// about that long, never much longer, however many of them queue; other writes go on meanwhile.
#[tokio::test]
async fn writes_under_a_held_scope_get_503_after_the_lock_timeout_and_no_one_else_waits() {
    let db = pg::fresh_database().await;
    let app = Arc::new(spawn_app_on(db.clone(), |s| s.database.lock_timeout_ms = 1_500).await);
    app.kv_put("warm-up", "1", &json!(1)).await.expect(201);

    let mut holder = PgConnection::connect(&db).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT fencegate.fence('victim', 1)")
        .execute(&mut *tx)
        .await
        .unwrap();

    // More writers under the held scope than fencegate has connections: none may take every one.
    let mut victims = JoinSet::new();
    for v in 0..40 {
        let app = app.clone();
        victims.spawn(async move {
            let started = Instant::now();
            let r = app
                .kv_put_scoped(&format!("victim-{v}"), "2", "victim", &json!({"v": v}))
                .await;
            let retry_after = r.header("retry-after").is_some();
            (r.status, started.elapsed(), r.text, retry_after)
        });
    }
    let mut watcher = PgConnection::connect(&db).await.unwrap();
    wait_for_lock_waiters(&mut watcher, 1).await;

    let outcome = tokio::time::timeout(Duration::from_secs(15), unrelated_writes(&app, 8, 5))
        .await
        .expect("unrelated writes finish while the scope is held");
    assert!(
        outcome.iter().all(|(s, _)| *s == 200 || *s == 201),
        "every unrelated write is applied: {outcome:?}"
    );

    while let Some(done) = victims.join_next().await {
        let (status, took, text, retry_after) = done.unwrap();
        assert_eq!(status, 503, "a write under the held scope: {text}");
        assert!(retry_after, "a 503 says when to retry: {text}");
        assert!(text.contains("\"status\":503"), "problem+json: {text}");
        assert!(
            took < Duration::from_millis(1_500 + 5_000),
            "a write under the held scope waited {took:?}, lock timeout 1.5 s"
        );
    }
    tx.rollback().await.unwrap();
    app.kv_put_scoped("victim-0", "2", "victim", &json!(0))
        .await
        .expect(201);
}

/// More claims of a held scope than fencegate has connections: they wait one at a time (the
/// others without a connection), so writes elsewhere keep theirs and go on; each claim gets 503
/// or, once the holder is gone, its answer.
#[tokio::test]
async fn claims_of_a_held_scope_never_take_every_connection() {
    let db = pg::fresh_database().await;
    let app = Arc::new(spawn_app_on(db.clone(), |s| s.database.lock_timeout_ms = 3_000).await);
    app.kv_put("warm-up", "1", &json!(1)).await.expect(201);

    let mut holder = PgConnection::connect(&db).await.unwrap();
    let mut tx = holder.begin().await.unwrap();
    sqlx::query("SELECT fencegate.fence('victim', 1)")
        .execute(&mut *tx)
        .await
        .unwrap();

    let mut claims = JoinSet::new();
    for _ in 0..40 {
        let app = app.clone();
        claims.spawn(async move {
            let started = Instant::now();
            let r = app.claim("victim", "2").await;
            (r.status, started.elapsed(), r.text)
        });
    }
    let mut watcher = PgConnection::connect(&db).await.unwrap();
    wait_for_lock_waiters(&mut watcher, 1).await;

    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(15), unrelated_writes(&app, 8, 5))
        .await
        .expect("unrelated writes finish while the scope is claimed");
    let mut latencies: Vec<Duration> = outcome.iter().map(|(_, took)| *took).collect();
    assert!(
        outcome.iter().all(|(s, _)| *s == 200 || *s == 201),
        "every unrelated write is applied while 40 claims wait: {outcome:?}"
    );
    let max = percentile(&mut latencies, 1.0);
    assert!(
        max < Duration::from_millis(2_500),
        "an unrelated write took {max:?} (lock timeout 3 s), {:?} in all",
        started.elapsed()
    );
    tx.rollback().await.unwrap();
    while let Some(done) = claims.join_next().await {
        let (status, took, text) = done.unwrap();
        assert!(matches!(status, 200 | 201 | 503), "{status}: {text}");
        assert!(
            took < Duration::from_secs(6 + 5),
            "a claim waited {took:?}: at most the gate's and the row's lock timeout"
        );
    }
}
