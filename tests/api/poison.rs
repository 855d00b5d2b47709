//! Tokens that would poison a fence (docs/api.md, *How fencegate decides*: a token a built-in lock never
//! issued is refused): a token above what a built-in lock granted, and a jump past `kv.max_token_jump`.
//! Every attempt is checked to have changed nothing: values, fences and the lock's counter.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, unique, Resp, TestApp, TOKEN};

const MAX: &str = "9223372036854775807";

async fn acquire(app: &TestApp, name: &str) -> String {
    let r = app.send(
        app.req(Method::POST, &format!("/v1/locks/{name}"))
            .json(&json!({"owner": "w", "ttl_ms": 60_000})),
    );
    r.await.expect(201)["token"].as_str().unwrap().to_owned()
}

async fn release(app: &TestApp, name: &str, token: &str) {
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{name}"))
            .header(TOKEN, token),
    )
    .await
    .expect(200);
}

#[track_caller]
fn not_issued(r: &Resp, scope: &str, presented: &str, latest: &str) -> Value {
    let body = r.problem(422, "token-not-issued");
    assert_eq!(body["scope"], json!(scope), "{body}");
    assert_eq!(body["presented_token"], json!(presented), "{body}");
    assert_eq!(body["latest_issued"], json!(latest), "{body}");
    body
}

#[track_caller]
fn jump(r: &Resp, presented: &str, current: &str, max: &str) -> Value {
    let body = r.problem(422, "token-jump");
    assert_eq!(body["presented_token"], json!(presented), "{body}");
    assert_eq!(body["current_token"], json!(current), "{body}");
    assert_eq!(body["max_jump"], json!(max), "{body}");
    body
}

#[tokio::test]
async fn a_token_the_built_in_lock_never_granted_is_refused_on_every_path() {
    let app = spawn_app().await;
    let lock = unique("lock");
    let t = acquire(&app, &lock).await;
    app.kv_put_scoped("held", &t, &lock, &json!("holder"))
        .await
        .expect(201);
    let next = (t.parse::<i64>().unwrap() + 1).to_string();
    for bad in [next.as_str(), MAX] {
        not_issued(
            &app.kv_put_scoped("k", bad, &lock, &json!("poison")).await,
            &lock,
            bad,
            &t,
        );
        not_issued(
            &app.kv_put_scoped("held", bad, &lock, &json!("poison"))
                .await,
            &lock,
            bad,
            &t,
        );
        not_issued(
            &app.kv_delete_scoped("held", bad, &lock).await,
            &lock,
            bad,
            &t,
        );
        let ops = json!({"ops": [{"op": "put", "key": "k", "value": 1}, {"op": "delete", "key": "held"}]});
        not_issued(
            &app.batch(Some(bad), Some(&lock), &ops).await,
            &lock,
            bad,
            &t,
        );
        not_issued(&app.claim(&lock, bad).await, &lock, bad, &t);
    }
    // Nothing moved: the value, the fence, and the next grant is the next token.
    app.assert_absent("k").await;
    app.assert_value("held", &json!("holder"), &t).await;
    assert_eq!(app.fence(&lock).await.expect(200)["fence_token"], json!(t));
    release(&app, &lock, &t).await;
    assert_eq!(
        acquire(&app, &lock).await,
        next,
        "the lock's counter was not pushed ahead"
    );
    app.kv_put_scoped("k", &next, &lock, &json!("new holder"))
        .await
        .expect(201);

    let text = app.get("/metrics").await.text;
    assert!(
        text.lines()
            .any(|l| l.starts_with("fencegate_writes_total{")
                && l.contains(r#"outcome="not_issued""#)),
        "no not_issued sample:\n{text}"
    );
}

#[tokio::test]
async fn scopes_that_are_no_built_in_lock_take_any_token() {
    let app = spawn_app().await;
    let scope = unique("external");
    app.kv_put_scoped("k", "1000000", &scope, &json!(1))
        .await
        .expect(201);
    app.claim(&scope, MAX).await.expect(200);
}

/// A grant and a write carrying the token the grant is about to issue, at once: the write may
/// be accepted only if the grant committed first, so the grant never finds the fence ahead of
/// its counter (it would then issue a token one higher than the next).
#[tokio::test]
async fn grants_racing_writes_with_the_next_token_never_skip_a_token() {
    let app = std::sync::Arc::new(spawn_app().await);
    let lock = unique("race");
    let mut token = acquire(&app, &lock).await.parse::<i64>().unwrap();
    let mut accepted = 0;
    for round in 0..20 {
        release(&app, &lock, &token.to_string()).await;
        let next = (token + 1).to_string();
        let (a, b, l, n) = (app.clone(), app.clone(), lock.clone(), next.clone());
        let write = tokio::spawn(async move {
            a.kv_put_scoped(&format!("k{round}"), &n, &l, &json!(round))
                .await
        });
        let (l2,) = (lock.clone(),);
        let grant = tokio::spawn(async move { acquire(&b, &l2).await });
        let (write, granted) = (write.await.unwrap(), grant.await.unwrap());
        assert_eq!(
            granted, next,
            "round {round}: the grant skipped a token: a write raised the fence first"
        );
        match write.status {
            200 | 201 => accepted += 1,
            422 => {
                not_issued(&write, &lock, &next, &token.to_string());
            }
            // Checked before the grant committed, explained after: refused, "retry".
            503 => {
                write.problem(503, "unavailable");
                assert!(write.header("retry-after").is_some(), "{}", write.text);
                app.kv_put_scoped(&format!("k{round}"), &next, &lock, &json!(round))
                    .await
                    .expect(201);
            }
            other => panic!("round {round}: unexpected {other}: {}", write.text),
        }
        token += 1;
    }
    // Not asserted: how the races fell (timing). Printed for the curious.
    println!("{accepted} of 20 racing writes came after their grant");
}

#[tokio::test]
async fn the_jump_cap_refuses_tokens_that_leap_past_the_fence() {
    let app = spawn_app_with(|s| s.kv.max_token_jump = 100).await;
    // Unscoped: from nothing (0), exactly the cap and one past it.
    app.kv_put("a", "100", &json!(1)).await.expect(201);
    jump(&app.kv_put("b", "101", &json!(1)).await, "101", "0", "100");
    app.kv_put("a", "200", &json!(2)).await.expect(200);
    let body = jump(
        &app.kv_put("a", "301", &json!(3)).await,
        "301",
        "200",
        "100",
    );
    assert_eq!(body["key"], json!("a"), "{body}");
    jump(&app.kv_delete("a", MAX).await, MAX, "200", "100");
    let ops = json!({"ops": [{"op": "put", "key": "a", "value": 9}, {"op": "put", "key": "c", "value": 9}]});
    jump(&app.batch(Some("250"), None, &ops).await, "250", "0", "100"); // c starts at 0
    app.assert_absent("b").await;
    app.assert_absent("c").await;
    app.assert_value("a", &json!(2), "200").await;
    // A stale token is stale, not a jump.
    app.kv_put("a", "5", &json!(1))
        .await
        .stale_key("a", "5", "200");

    // Scoped writes and claims: against the scope's fence.
    let s = unique("s");
    jump(&app.claim(&s, "101").await, "101", "0", "100");
    app.claim(&s, "50").await.expect(201);
    let body = jump(
        &app.kv_put_scoped("k", "151", &s, &json!(1)).await,
        "151",
        "50",
        "100",
    );
    assert_eq!(body["scope"], json!(s), "{body}");
    app.fence(&s).await.expect(200);
    assert_eq!(app.fence(&s).await.expect(200)["fence_token"], json!("50"));
    app.kv_put_scoped("k", "150", &s, &json!(1))
        .await
        .expect(201);
    jump(
        &app.batch(Some("251"), Some(&s), &ops).await,
        "251",
        "150",
        "100",
    );

    let text = app.get("/metrics").await.text;
    assert!(
        text.contains(r#"outcome="jump""#),
        "no jump sample:\n{text}"
    );
}

#[tokio::test]
async fn lock_grants_are_exempt_from_the_jump_cap() {
    let app = spawn_app_with(|s| s.kv.max_token_jump = 10).await;
    let lock = unique("lock");
    // A lock service of its own raised the fence in steps; the built-in grant steps by one.
    for t in ["10", "20", "30"] {
        app.claim(&lock, t).await.expect_any(&[200, 201]);
    }
    assert_eq!(acquire(&app, &lock).await, "31");
}

/// `[[issuers]]`: writes and claims under a signed scope need the issuer's signature of the
/// token for that scope (`X-Fencing-Proof`), checked before any database work.
mod proofs {
    use fencegate::{
        fence::FencingToken,
        issuers::{ed25519_public_key, sign, IssuerSettings, SigningKey},
    };
    use reqwest::Method;
    use serde_json::json;

    use crate::helpers::{kv, spawn_app_with, unique, Resp, TestApp, SCOPE, TOKEN};

    const SEED: [u8; 32] = [42; 32];
    const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

    fn proof(scope: &str, token: i64) -> String {
        sign(
            scope,
            FencingToken::from_db(token).unwrap(),
            SigningKey::Ed25519(&SEED),
        )
    }

    async fn spawn() -> TestApp {
        let var = unique("FENCEGATE_TEST_HMAC").replace('-', "_");
        std::env::set_var(&var, SECRET);
        spawn_app_with(move |s| {
            s.issuers = vec![
                IssuerSettings {
                    name: "etcd".into(),
                    scopes: vec!["jobs/".into()],
                    ed25519_public_key: Some(ed25519_public_key(&SEED)),
                    hmac_sha256_secret_env: None,
                },
                IssuerSettings {
                    name: "redis".into(),
                    scopes: vec!["billing".into()],
                    ed25519_public_key: None,
                    hmac_sha256_secret_env: Some(var),
                },
            ];
            s.scopes = vec![fencegate::fence::ScopeBinding {
                name: "jobs/bound".into(),
                keys: vec!["bound-".into()],
            }];
        })
        .await
    }

    async fn put(
        app: &TestApp,
        key: &str,
        token: i64,
        scope: Option<&str>,
        proof: Option<&str>,
    ) -> Resp {
        let mut rb = app
            .req(Method::PUT, &kv(key))
            .header(TOKEN, token.to_string())
            .json(&json!(token));
        if let Some(scope) = scope {
            rb = rb.header(SCOPE, crate::helpers::enc(scope));
        }
        if let Some(proof) = proof {
            rb = rb.header("X-Fencing-Proof", proof);
        }
        app.send(rb).await
    }

    #[tokio::test]
    async fn only_the_issuers_signature_of_this_scope_and_token_passes() {
        let app = spawn().await;
        let good = proof("jobs/a", 5);
        put(&app, "k", 5, Some("jobs/a"), Some(&good))
            .await
            .expect(201);

        put(&app, "k2", 5, Some("jobs/a"), None)
            .await
            .problem(422, "missing-token-proof");
        let bad = [
            proof("jobs/a", 6), // another token
            proof("jobs/b", 5), // another scope
            sign(
                "jobs/a",
                FencingToken::from_db(5).unwrap(),
                SigningKey::Ed25519(&[1; 32]),
            ), // another key
            sign(
                "jobs/a",
                FencingToken::from_db(5).unwrap(),
                SigningKey::Hmac(SECRET.as_bytes()),
            ), // another issuer's
            good[..good.len() - 4].to_owned(), // truncated
            format!("{good}=="), // padded
            "not*base64".to_owned(),
        ];
        for proof in &bad {
            put(&app, "k2", 5, Some("jobs/a"), Some(proof))
                .await
                .problem(422, "invalid-token-proof");
        }
        app.assert_absent("k2").await;
        assert_eq!(
            app.fence("jobs%2Fa").await.expect(200)["fence_token"],
            json!("5")
        );

        // HMAC issuer; the same proof of the same token is good again (a holder writes many times).
        let hmac = sign(
            "billing",
            FencingToken::from_db(9).unwrap(),
            SigningKey::Hmac(SECRET.as_bytes()),
        );
        put(&app, "inv", 9, Some("billing"), Some(&hmac))
            .await
            .expect(201);
        put(&app, "inv", 9, Some("billing"), Some(&hmac))
            .await
            .expect(200);
        put(&app, "inv", 10, Some("billing"), Some(&hmac))
            .await
            .problem(422, "invalid-token-proof");

        // A scope no issuer covers, and unscoped writes, need no proof.
        put(&app, "free", 1, Some(&unique("other")), None)
            .await
            .expect(201);
        put(&app, "plain", 1, None, None).await.expect(201);
    }

    #[tokio::test]
    async fn batches_claims_and_bound_keys_are_checked_too() {
        let app = spawn().await;
        let ops = json!({"ops": [{"op": "put", "key": "b1", "value": 1}]});
        app.batch(Some("3"), Some("jobs%2Fx"), &ops)
            .await
            .problem(422, "missing-token-proof");
        let r = app.send(
            app.req(Method::POST, "/v1/batch")
                .header(TOKEN, "3")
                .header(SCOPE, "jobs%2Fx")
                .header("X-Fencing-Proof", proof("jobs/x", 3))
                .json(&ops),
        );
        r.await.expect(200);

        app.claim("jobs%2Fy", "7")
            .await
            .problem(422, "missing-token-proof");
        let r = app.send(
            app.req(Method::POST, "/v1/fences/jobs%2Fy")
                .header(TOKEN, "7")
                .header("X-Fencing-Proof", proof("jobs/y", 7)),
        );
        r.await.expect(201);

        // A key bound to a signed scope needs its proof even without the header.
        put(&app, "bound-1", 4, None, None)
            .await
            .problem(422, "missing-token-proof");
        put(&app, "bound-1", 4, None, Some(&proof("jobs/bound", 4)))
            .await
            .expect(201);
        let text = app.get("/metrics").await.text;
        assert!(
            text.contains(r#"outcome="bad_proof""#),
            "no bad_proof sample:\n{text}"
        );
    }
}

/// A scope whose fence reached the largest token (claimed before any lock existed): a grant
/// cannot exceed it. A clear 409, not a database overflow (once 400 on PostgreSQL, 500 on
/// SQLite); an audited reset frees the name.
#[tokio::test]
async fn a_lock_whose_fence_is_at_the_maximum_answers_409() {
    let app = spawn_app().await;
    let lock = unique("maxed");
    app.claim(&lock, MAX).await.expect(201);
    let r = app.send(
        app.req(Method::POST, &format!("/v1/locks/{lock}"))
            .json(&json!({"owner": "w", "ttl_ms": 1000})),
    );
    r.await.problem(409, "lock-exhausted");
    let reset = app
        .req(Method::POST, &format!("/v1/admin/fences/{lock}/reset"))
        .json(&json!({"to": "5", "reason": "maxed out"}));
    app.send(reset).await.expect(200);
    assert_eq!(acquire(&app, &lock).await, "6");

    // A grant that issued the largest token: the lock's own counter is at the maximum, also
    // after a reset lowers the fence (found in review: 400 on PostgreSQL, 500 on SQLite).
    let granted = unique("maxed-grant");
    app.claim(&granted, "9223372036854775806").await.expect(201);
    let token = acquire(&app, &granted).await;
    assert_eq!(token, MAX);
    release(&app, &granted, &token).await;
    let reset = app
        .req(Method::POST, &format!("/v1/admin/fences/{granted}/reset"))
        .json(&json!({"to": "5", "reason": "maxed out"}));
    app.send(reset).await.expect(200);
    let r = app.send(
        app.req(Method::POST, &format!("/v1/locks/{granted}"))
            .json(&json!({"owner": "w", "ttl_ms": 1000})),
    );
    r.await.problem(409, "lock-exhausted");
}

/// Concurrent scoped writes with issued and unissued tokens: on PostgreSQL they share
/// coalesced statements (one claim per scope and token); each gets its own answer.
#[tokio::test]
async fn concurrent_issued_and_unissued_writes_each_get_their_own_answer() {
    let app = std::sync::Arc::new(spawn_app().await);
    let lock = unique("lock");
    let t = acquire(&app, &lock).await.parse::<i64>().unwrap();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let (app, lock) = (app.clone(), lock.clone());
        let token = if i % 2 == 0 { t } else { t + 1 + i };
        tasks.push(tokio::spawn(async move {
            (
                i,
                token,
                app.kv_put_scoped(&format!("c{i}"), &token.to_string(), &lock, &json!(i))
                    .await,
            )
        }));
    }
    for task in tasks {
        let (i, token, r) = task.await.unwrap();
        if token == t {
            r.expect(201);
        } else {
            not_issued(&r, &lock, &token.to_string(), &t.to_string());
            app.assert_absent(&format!("c{i}")).await;
        }
    }
    assert_eq!(
        app.fence(&lock).await.expect(200)["fence_token"],
        json!(t.to_string())
    );
}

#[tokio::test]
async fn a_new_key_past_the_cap_is_refused_alone_among_coalesced_writes() {
    // Writes that wait together share one statement; a key created above the cap aborts that
    // statement in the database, and its writes are tried again one by one: the jumper alone
    // is refused, every other write is applied, and nothing of the jumper is stored. With one
    // coalescing worker and 40 writes in flight, most share a statement with the jumper.
    for workers in [1, 0] {
        let app = spawn_app_with(|s| {
            s.kv.max_token_jump = 1000;
            s.database.coalesce_workers = Some(workers);
        })
        .await;
        app.kv_put("old", "900", &json!(0)).await.expect(201);
        let app = &app;
        let writes = (0..40).map(|n| {
            async move {
                let (key, token) = match n {
                    13 => ("jumper".to_owned(), "1001".to_owned()),
                    31 => ("jumper-2".to_owned(), "5000".to_owned()),
                    // The refusal names token and key, split at the first space: a key may hold spaces.
                    7 => ("3000 jumper 3".to_owned(), "3000".to_owned()),
                    // An existing key's jump is measured from its fence (900), not from 0.
                    27 => ("old".to_owned(), "1800".to_owned()),
                    _ => (format!("fresh-{n}"), (500 + n).to_string()),
                };
                (
                    key.clone(),
                    token.clone(),
                    app.kv_put(&crate::helpers::enc(&key), &token, &json!(n))
                        .await,
                )
            }
        });
        for (key, token, r) in futures::future::join_all(writes).await {
            match key.as_str() {
                "jumper" => {
                    let body = jump(&r, "1001", "0", "1000");
                    assert_eq!(body["key"], json!("jumper"), "{body}");
                }
                "jumper-2" => {
                    jump(&r, "5000", "0", "1000");
                }
                "3000 jumper 3" => {
                    let body = jump(&r, "3000", "0", "1000");
                    assert_eq!(body["key"], json!("3000 jumper 3"), "{body}");
                }
                "old" => assert_eq!(r.status, 200, "workers {workers}: {}", r.text),
                _ => assert_eq!(
                    r.status, 201,
                    "workers {workers}, {key} with {token}: {}",
                    r.text
                ),
            }
        }
        app.assert_absent("jumper").await;
        app.assert_absent("jumper-2").await;
        app.assert_absent(&crate::helpers::enc("3000 jumper 3"))
            .await;
        app.assert_value("old", &json!(27), "1800").await;
        app.assert_value("fresh-0", &json!(0), "500").await;
        app.assert_value("fresh-39", &json!(39), "539").await;
        // The refusal leaves the key free for a token within the cap.
        app.kv_put("jumper", "1000", &json!("ok")).await.expect(201);
    }
}

#[tokio::test]
async fn with_the_new_key_trigger_disabled_writes_are_refused_not_let_through() {
    // The check of new keys against the jump cap lives in a trigger; a write must not go out
    // unchecked because someone disabled or dropped it (or set session_replication_role).
    use sqlx::Connection;
    if crate::BACKEND == crate::pg::Backend::Sqlite {
        // SQLite checks a new key in the row to insert, under its one write lock: there is no
        // trigger to disable, and the cap holds.
        let app = crate::helpers::spawn_app_with(|s| s.kv.max_token_jump = 1000).await;
        jump(
            &app.kv_put("poison", "999999", &json!("x")).await,
            "999999",
            "0",
            "1000",
        );
        app.kv_put("fine", "500", &json!("x")).await.expect(201);
        app.assert_absent("poison").await;
        return;
    }
    let db = crate::pg::fresh_database().await;
    let app = crate::helpers::spawn_app_on(db.clone(), |s| s.kv.max_token_jump = 1000).await;
    app.kv_put("there", "10", &json!(1)).await.expect(201);
    let mut sql = sqlx::PgConnection::connect(&db).await.unwrap();
    for off in [
        "DISABLE TRIGGER fencegate_kv_created",
        "ENABLE TRIGGER fencegate_kv_created",
    ] {
        sqlx::query(&format!("ALTER TABLE fencegate.fencegate_kv {off}"))
            .execute(&mut sql)
            .await
            .unwrap();
        // A new key far above the cap, one within it, and a write of an existing key: none is
        // written. The first is explained as the jump it is; the others are 503, naming the
        // trigger to enable.
        jump(
            &app.kv_put("poison", "999999", &json!("x")).await,
            "999999",
            "0",
            "1000",
        );
        for (key, token) in [("fine", "500"), ("there", "20")] {
            let r = app.kv_put(key, token, &json!("x")).await;
            assert_eq!(r.status, 503, "{off}: {key} with {token}: {}", r.text);
            assert!(
                r.text.contains("fencegate_kv_created"),
                "the answer names the trigger: {}",
                r.text
            );
        }
        // A batch within the cap is not written either, and says the same.
        let ops = json!({"ops": [{"op": "put", "key": "fine", "value": 1}, {"op": "put", "key": "there", "value": 1}]});
        let r = app.batch(Some("30"), None, &ops).await;
        assert_eq!(r.status, 503, "{off}: batch: {}", r.text);
        assert!(
            r.text.contains("fencegate_kv_created"),
            "the answer names the trigger: {}",
            r.text
        );
        app.assert_absent("poison").await;
        app.assert_absent("fine").await;
        app.assert_value("there", &json!(1), "10").await;
    }
    sqlx::query("ALTER TABLE fencegate.fencegate_kv ENABLE ALWAYS TRIGGER fencegate_kv_created")
        .execute(&mut sql)
        .await
        .unwrap();
    jump(
        &app.kv_put("poison", "999999", &json!("x")).await,
        "999999",
        "0",
        "1000",
    );
    app.kv_put("fine", "500", &json!("x")).await.expect(201);
    app.kv_put("there", "20", &json!("x")).await.expect(200);
}

/// Waits until some backend is blocked by the session `holder` (its transaction holds a lock
/// another statement waits for): the statement under test is waiting on it.
async fn until_blocked_by(sql: &mut sqlx::PgConnection, holder: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder)
        .fetch_one(&mut *sql)
        .await
        .unwrap();
        if blocked > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never waited for the deleted row's lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_batch_cannot_recreate_above_the_cap_a_key_deleted_while_it_waits() {
    // A batch checks the keys it would create against the jump cap on its statement's snapshot.
    // If an operator's DELETE of such a key commits while the batch waits for that row, the
    // batch creates the key afresh: its fence then counts from 0, and a token far above the cap
    // must still be refused (the new-key trigger), with the whole batch, kv keys and table rows.
    use sqlx::Connection;
    if crate::BACKEND == crate::pg::Backend::Sqlite {
        // One writer at a time: a batch's snapshot is the rows as locked. The plain case holds.
        let app = spawn_app_with(|s| s.kv.max_token_jump = 1000).await;
        app.kv_put("k", "1000", &json!("before")).await.expect(201);
        let ops = json!({"ops": [{"op": "put", "key": "k", "value": 1}, {"op": "put", "key": "new", "value": 1}]});
        jump(
            &app.batch(Some("1900"), None, &ops).await,
            "1900",
            "0",
            "1000",
        );
        app.assert_value("k", &json!("before"), "1000").await;
        return;
    }
    let db = crate::pg::fresh_database().await;
    let mut sql = sqlx::PgConnection::connect(&db).await.unwrap();
    sqlx::query("CREATE TABLE public.jobs (id integer PRIMARY KEY, state text)")
        .execute(&mut sql)
        .await
        .unwrap();
    let jobs = crate::helpers::ledger_table("jobs", "public.jobs");
    let app = crate::helpers::spawn_app_on(db.clone(), |s| {
        s.kv.max_token_jump = 1000;
        s.resources = vec![jobs];
    })
    .await;
    let kv_only = json!({"ops": [{"op": "put", "key": "k", "value": "batch"}, {"op": "put", "key": "also", "value": "batch"}]});
    let mixed = json!({"ops": [
        {"op": "put", "key": "k", "value": "batch"},
        {"op": "put", "resource": "jobs", "key": "1", "row": {"state": "batch"}},
    ]});
    for (round, ops) in [kv_only, mixed].iter().enumerate() {
        app.kv_put("k", "1000", &json!("before")).await.expect(201);
        app.kv_put("also", "1000", &json!("before")).await;
        let mut dba = sqlx::PgConnection::connect(&db).await.unwrap();
        let holder: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut dba)
            .await
            .unwrap();
        sqlx::query("BEGIN").execute(&mut dba).await.unwrap();
        sqlx::query("DELETE FROM fencegate.fencegate_kv WHERE key = 'k'")
            .execute(&mut dba)
            .await
            .unwrap();
        // 1900 is within the cap of k's fence (1000) as the batch's snapshot shows it, and far
        // above it from 0, which is what k's fence is once the delete commits.
        let batch = app.batch(Some("1900"), None, ops);
        let commit = async {
            until_blocked_by(&mut sql, holder).await;
            sqlx::query("COMMIT").execute(&mut dba).await.unwrap();
        };
        let (r, ()) = tokio::join!(batch, commit);
        let body = jump(&r, "1900", "0", "1000");
        assert_eq!(body["key"], json!("k"), "round {round}: {body}");
        app.assert_absent("k").await;
        app.assert_value("also", &json!("before"), "1000").await;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.jobs")
            .fetch_one(&mut sql)
            .await
            .unwrap();
        assert_eq!(
            rows, 0,
            "round {round}: the batch's table row was not written either"
        );
    }
    // Within the cap, the same batch goes through.
    app.batch(
        Some("1000"),
        None,
        &json!({"ops": [{"op": "put", "key": "k", "value": "ok"}]}),
    )
    .await
    .expect(200);
}

#[tokio::test]
async fn a_value_of_the_cap_setting_left_on_the_database_does_not_apply_to_fencegates_writes() {
    // fencegate tells the new-key trigger the cap in each unscoped statement, through the setting
    // `fencegate.kv_jump_cap`. A value an operator leaves on the database or role (a number, or
    // something the trigger cannot read) must not judge fencegate's writes: every one of its
    // statements sets the setting itself, to nothing without a cap.
    use sqlx::Connection;
    if crate::BACKEND == crate::pg::Backend::Sqlite {
        // No such setting, no trigger: SQLite checks new keys in the statement itself.
        let app = spawn_app().await;
        app.kv_put("k", "999999", &json!(1)).await.expect(201);
        return;
    }
    let db = crate::pg::fresh_database().await;
    let mut sql = sqlx::PgConnection::connect(&db).await.unwrap();
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut sql)
        .await
        .unwrap();
    // Migrate first (the first app), then set the value: new connections get it.
    drop(
        crate::helpers::spawn_app_on(db.clone(), |_| {})
            .await
            .get("/readyz")
            .await,
    );
    for (n, stray) in ["5", "off"].into_iter().enumerate() {
        sqlx::query(&format!(
            "ALTER DATABASE {name} SET fencegate.kv_jump_cap = '{stray}'"
        ))
        .execute(&mut sql)
        .await
        .unwrap();
        // The value is live on new connections: a writer that sets none is judged by it.
        let mut other = sqlx::PgConnection::connect(&db).await.unwrap();
        let direct = sqlx::query("INSERT INTO fencegate.fencegate_kv (key, value, key_fence, fence_token) VALUES ('direct', '1', 6, 6)")
            .execute(&mut other)
            .await;
        assert!(
            direct.is_err(),
            "{stray}: the trigger applies the stray value to a writer that sets none"
        );

        // No cap configured: new keys far above 5, alone, concurrently (coalesced), in a batch.
        let app = crate::helpers::spawn_app_on(db.clone(), |_| {}).await;
        app.kv_put(&format!("alone-{n}"), "999", &json!(1))
            .await
            .expect(201);
        let app = &app;
        let writes = (0..20).map(|i| async move {
            app.kv_put(&format!("many-{n}-{i}"), "1000", &json!(i))
                .await
        });
        for r in futures::future::join_all(writes).await {
            r.expect(201);
        }
        let ops = json!({"ops": [{"op": "put", "key": format!("batch-{n}"), "value": 1}]});
        app.batch(Some("1001"), None, &ops).await.expect(200);

        // A cap configured: fencegate's own value is the one applied.
        let app = crate::helpers::spawn_app_on(db.clone(), |s| s.kv.max_token_jump = 1000).await;
        app.kv_put(&format!("capped-{n}"), "900", &json!(1))
            .await
            .expect(201);
        let ops = json!({"ops": [{"op": "put", "key": format!("capped-batch-{n}"), "value": 1}]});
        app.batch(Some("950"), None, &ops).await.expect(200);
        jump(
            &app.kv_put(&format!("higher-{n}"), "1001", &json!(1)).await,
            "1001",
            "0",
            "1000",
        );
    }
}
