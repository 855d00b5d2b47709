//! `Idempotency-Key` (docs/api.md): a retried write gets its first outcome back, even after a
//! newer holder fenced the writer out; the same key with another request is 422; keys are the
//! actor's own; outcomes expire. Run on both backends (tests/sqlite includes this file); the
//! legacy tables' case, PostgreSQL only, is in `idempotency_tables.rs`.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::{
    auth::api_key,
    helpers::{kv, spawn_app, spawn_app_with, unique, Resp, TestApp, SCOPE, TOKEN},
};

pub const KEY: &str = "Idempotency-Key";
pub const REPLAYED: &str = "idempotent-replayed";

pub async fn put_keyed(app: &TestApp, key: &str, token: &str, idem: &str, value: &Value) -> Resp {
    app.send(
        app.req(Method::PUT, &kv(key))
            .header(TOKEN, token)
            .header(KEY, idem)
            .json(value),
    )
    .await
}

/// The same keyed write again: same status and body, marked replayed, and written once.
#[tokio::test]
async fn a_retry_gets_the_first_answer_and_writes_nothing() {
    let app = spawn_app().await;
    let (key, idem) = (unique("idem"), unique("k"));
    let first = put_keyed(&app, &key, "5", &idem, &json!({"n": 1})).await;
    let body = first.expect(201);
    assert_eq!(first.header(REPLAYED), None);
    assert_eq!(body["version"], json!(1), "{body}");

    let again = put_keyed(&app, &key, "5", &idem, &json!({"n": 1})).await;
    assert_eq!(again.expect(201), body, "the first answer, byte for byte");
    assert_eq!(again.header(REPLAYED), Some("true"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    // Written once: the version did not move, the fence is the first write's.
    let read = app.kv_get(&key).await.expect(200);
    assert_eq!(read["version"], json!(1), "{read}");
    assert_eq!(read["fence_token"], json!("5"));

    // Without a key the same request is a new write.
    app.kv_put(&key, "5", &json!({"n": 1})).await.expect(200);
    assert_eq!(app.kv_get(&key).await.expect(200)["version"], json!(2));
}

/// The failover case: token 5's write landed but its answer was lost; a newer holder wrote
/// with 6; the retry of the first write learns it landed (2xx, replayed), not 412.
#[tokio::test]
async fn a_retry_after_a_newer_holder_wrote_is_the_first_outcome_not_412() {
    let app = spawn_app().await;
    let (key, idem) = (unique("failover"), unique("k"));
    let first = put_keyed(&app, &key, "5", &idem, &json!("from 5"))
        .await
        .expect(201);
    app.kv_put(&key, "6", &json!("from 6")).await.expect(200);

    let retry = put_keyed(&app, &key, "5", &idem, &json!("from 5")).await;
    assert_eq!(retry.expect(201), first);
    assert_eq!(retry.header(REPLAYED), Some("true"));
    // The newer holder's value stands.
    app.assert_value(&key, &json!("from 6"), "6").await;

    // A new key with the old token is judged now: stale, and not kept (a retry is judged again).
    let fresh = unique("k");
    put_keyed(&app, &key, "5", &fresh, &json!("from 5"))
        .await
        .stale_key(&key, "5", "6");
    put_keyed(&app, &key, "5", &fresh, &json!("from 5"))
        .await
        .stale_key(&key, "5", "6");
    // The same for a delete.
    let del = unique("k");
    let deleted = app
        .send(
            app.req(Method::DELETE, &kv(&key))
                .header(TOKEN, "7")
                .header(KEY, &del),
        )
        .await
        .expect(200);
    app.kv_put(&key, "8", &json!("from 8")).await.expect(201);
    let again = app
        .send(
            app.req(Method::DELETE, &kv(&key))
                .header(TOKEN, "7")
                .header(KEY, &del),
        )
        .await;
    assert_eq!(again.expect(200), deleted);
    assert_eq!(again.header(REPLAYED), Some("true"));
    app.assert_value(&key, &json!("from 8"), "8").await;
}

/// The same key with another body, token, scope or key path: 422, and nothing written.
#[tokio::test]
async fn the_same_key_with_another_request_is_422_and_changes_nothing() {
    let app = spawn_app().await;
    let (key, other, idem) = (unique("reuse"), unique("reuse-other"), unique("k"));
    put_keyed(&app, &key, "5", &idem, &json!(1))
        .await
        .expect(201);
    put_keyed(&app, &key, "5", &idem, &json!(2))
        .await
        .problem(422, "idempotency-key-reused");
    put_keyed(&app, &key, "6", &idem, &json!(1))
        .await
        .problem(422, "idempotency-key-reused");
    put_keyed(&app, &other, "5", &idem, &json!(1))
        .await
        .problem(422, "idempotency-key-reused");
    app.send(
        app.req(Method::PUT, &kv(&key))
            .header(TOKEN, "5")
            .header(SCOPE, "s")
            .header(KEY, &idem)
            .json(&json!(1)),
    )
    .await
    .problem(422, "idempotency-key-reused");
    app.assert_value(&key, &json!(1), "5").await;
    app.assert_absent(&other).await;
    assert_eq!(app.kv_get(&key).await.expect(200)["version"], json!(1));
    // Another route (DELETE) is another namespace: the key is free there.
    app.send(
        app.req(Method::DELETE, &kv(&key))
            .header(TOKEN, "5")
            .header(KEY, &idem),
    )
    .await
    .expect(200);
}

/// A malformed key is 400 problem+json, and nothing is written.
#[tokio::test]
async fn a_bad_key_is_400_and_changes_nothing() {
    let app = spawn_app().await;
    let key = unique("badkey");
    for bad in ["", "has space", &"x".repeat(256), "tab\there"] {
        let r = app
            .send(
                app.req(Method::PUT, &kv(&key))
                    .header(TOKEN, "5")
                    .header(KEY, bad)
                    .json(&json!(1)),
            )
            .await;
        let body = r.problem(400, "invalid-request");
        assert!(
            body["detail"].as_str().unwrap().contains("Idempotency-Key"),
            "{body}"
        );
    }
    let twice = app
        .send(
            app.req(Method::PUT, &kv(&key))
                .header(TOKEN, "5")
                .header(KEY, "a")
                .header(KEY, "b")
                .json(&json!(1)),
        )
        .await;
    twice.problem(400, "invalid-request");
    app.assert_absent(&key).await;
    // 255 visible ASCII bytes is fine.
    put_keyed(&app, &key, "5", &"~".repeat(255), &json!(1))
        .await
        .expect(201);
}

/// Keys are the actor's own: another actor's request with the same key is its own write,
/// never the first actor's answer.
#[tokio::test]
async fn keys_are_namespaced_by_actor() {
    let (a_secret, a) = api_key("alice", &["write", "read"], &[""], &[]);
    let (b_secret, b) = api_key("bob", &["write", "read"], &[""], &[]);
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![a, b];
        s.database.max_connections = 4;
    })
    .await;
    let (key, idem) = (unique("actors"), unique("k"));
    let send = |secret: &str, value: Value| {
        app.req(Method::PUT, &kv(&key))
            .bearer_auth(secret)
            .header(TOKEN, "5")
            .header(KEY, &idem)
            .json(&value)
    };
    let first = app.send(send(&a_secret, json!("alice"))).await;
    assert_eq!(first.expect(201)["version"], json!(1));
    // Bob's same key and another body: not 422 (he cannot probe Alice's keys), a write of his.
    let bob = app.send(send(&b_secret, json!("bob"))).await;
    assert_eq!(bob.expect(200)["version"], json!(2));
    assert_eq!(bob.header(REPLAYED), None);
    // Each one's retry replays their own answer.
    let alice_again = app.send(send(&a_secret, json!("alice"))).await;
    assert_eq!(alice_again.expect(201)["version"], json!(1));
    assert_eq!(alice_again.header(REPLAYED), Some("true"));
    let bob_again = app.send(send(&b_secret, json!("bob"))).await;
    assert_eq!(bob_again.expect(200)["version"], json!(2));
    assert_eq!(bob_again.header(REPLAYED), Some("true"));
}

/// Batches and claims replay like single writes.
#[tokio::test]
async fn batches_and_claims_are_replayed() {
    let app = spawn_app().await;
    let (a, b, scope) = (unique("ba"), unique("bb"), unique("claim"));
    let ops = json!({"ops": [
        {"op": "put", "key": a, "value": 1},
        {"op": "delete", "key": b},
    ]});
    let idem = unique("k");
    let batch = |token: &str| {
        app.req(Method::POST, "/v1/batch")
            .header(TOKEN, token)
            .header(KEY, &idem)
            .json(&ops)
    };
    let first = app.send(batch("5")).await.expect(200);
    app.kv_put(&a, "6", &json!("newer")).await.expect(200);
    let again = app.send(batch("5")).await;
    assert_eq!(again.expect(200), first);
    assert_eq!(again.header(REPLAYED), Some("true"));
    app.assert_value(&a, &json!("newer"), "6").await;
    app.send(batch("7"))
        .await
        .problem(422, "idempotency-key-reused");

    let claim_key = unique("k");
    let claim = |token: &str| {
        app.req(Method::POST, &format!("/v1/fences/{scope}"))
            .header(TOKEN, token)
            .header(KEY, &claim_key)
    };
    let first = app.send(claim("10")).await.expect(201);
    app.claim(&scope, "11").await.expect(200);
    let again = app.send(claim("10")).await;
    assert_eq!(again.expect(201), first);
    assert_eq!(again.header(REPLAYED), Some("true"));
    assert_eq!(
        app.fence(&scope).await.expect(200)["fence_token"],
        json!("11")
    );
}

/// Past `kv.idempotency_ttl_ms` the key is forgotten: the same request is a new write.
#[tokio::test]
async fn an_outcome_expires_after_the_ttl() {
    let app = spawn_app_with(|s| s.kv.idempotency_ttl_ms = 300).await;
    let (key, idem) = (unique("ttl"), unique("k"));
    put_keyed(&app, &key, "5", &idem, &json!(1))
        .await
        .expect(201);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = put_keyed(&app, &key, "5", &idem, &json!(1)).await;
        if r.header(REPLAYED).is_none() {
            assert_eq!(
                r.expect(200)["version"],
                json!(2),
                "applied again once expired"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the outcome never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The expired row was replaced: the retry of this second write replays it.
    let r = put_keyed(&app, &key, "5", &idem, &json!(1)).await;
    if r.header(REPLAYED).is_some() {
        assert_eq!(r.expect(200)["version"], json!(2));
    }
}

/// Many concurrent requests: each keyed write is applied exactly once, whether its copies
/// race each other or the coalesced writes without a key around them.
#[tokio::test]
async fn concurrent_copies_of_a_keyed_write_apply_it_once() {
    let app = std::sync::Arc::new(spawn_app_with(|s| s.database.max_connections = 8).await);
    let key = unique("race");
    let counter = unique("counter");
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (app, key, counter) = (app.clone(), key.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            // Four copies of the same keyed write, and plain writes in between.
            let idem = format!("same-{}", i % 5);
            let keyed = put_keyed(&app, &key, "5", &idem, &json!(i % 5)).await;
            let plain = app.kv_put(&counter, "1", &json!(i)).await;
            (i % 5, keyed, plain)
        }));
    }
    let mut first: std::collections::HashMap<usize, Value> = Default::default();
    let mut replayed = 0;
    for task in tasks {
        let (n, keyed, plain) = task.await.unwrap();
        plain.expect_any(&[200, 201]);
        let body = keyed.expect_any(&[200, 201]);
        if keyed.header(REPLAYED).is_some() {
            replayed += 1;
        }
        match first.get(&n) {
            Some(seen) => assert_eq!(&body, seen, "copies of one write answer alike"),
            None => {
                first.insert(n, body);
            }
        }
    }
    assert_eq!(
        replayed, 15,
        "each of 5 writes applied once, its 3 other copies replayed"
    );
    // 5 keyed writes applied: versions 1..=5, each once; 20 plain ones.
    let mut versions: Vec<i64> = first
        .values()
        .map(|b| b["version"].as_i64().unwrap())
        .collect();
    versions.sort();
    assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    assert_eq!(app.kv_get(&key).await.expect(200)["version"], json!(5));
    assert_eq!(app.kv_get(&counter).await.expect(200)["version"], json!(20));
}
