//! A zombie cannot step around a scope fence (docs/api.md, *How fencegate decides*): sticky scopes, `[[scopes]]`
//! bindings, and one spelling of a scope in a path and in `X-Fencing-Scope`.
//!
//! The scenario of every bypass: A took lock `billing` and lost it (a zombie with the old
//! token), B took it over and wrote `inv-1` under it. A then tries to write `inv-1` by leaving
//! the scope out, by naming another scope, and by spelling the lock's name another way.

use reqwest::{header::HeaderValue, Method};
use serde_json::{json, Value};

use crate::helpers::{enc, kv, spawn_app, spawn_app_with, unique, TestApp, SCOPE, TOKEN};

/// Acquires the built-in lock `name` (a path segment, percent-encoded as needed); its token.
async fn acquire(app: &TestApp, name: &str) -> String {
    let body = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{name}"))
                .json(&json!({"owner": "w", "ttl_ms": 60_000})),
        )
        .await
        .expect(201);
    body["token"].as_str().unwrap().to_owned()
}

async fn release(app: &TestApp, name: &str, token: &str) {
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{name}"))
            .header(TOKEN, token),
    )
    .await
    .expect(200);
}

/// A lost the lock `name`, B holds it: (A's token, B's token).
async fn zombie_and_holder(app: &TestApp, name: &str) -> (String, String) {
    let a = acquire(app, name).await;
    release(app, name, &a).await; // as good as expired: a new holder may exist
    let b = acquire(app, name).await;
    assert!(b.parse::<i64>().unwrap() > a.parse::<i64>().unwrap());
    (a, b)
}

#[tokio::test]
async fn a_zombie_cannot_leave_the_scope_out_or_name_another() {
    let app = spawn_app().await;
    let lock = unique("billing");
    let (a, b) = zombie_and_holder(&app, &lock).await;
    app.kv_put_scoped("inv-1", &b, &lock, &json!("B"))
        .await
        .expect(201);

    // Put: no scope, another scope, the right scope with the old token.
    app.kv_put("inv-1", &a, &json!("A"))
        .await
        .mismatch("inv-1", Some(&lock), None);
    let other = format!("{lock}X");
    app.kv_put_scoped("inv-1", &a, &other, &json!("A"))
        .await
        .mismatch("inv-1", Some(&lock), Some(&other));
    app.kv_put_scoped("inv-1", &a, &lock, &json!("A"))
        .await
        .stale_scope(&lock, &a, &b);
    // Delete: the same three.
    app.kv_delete("inv-1", &a)
        .await
        .mismatch("inv-1", Some(&lock), None);
    app.kv_delete_scoped("inv-1", &a, &other)
        .await
        .mismatch("inv-1", Some(&lock), Some(&other));
    app.kv_delete_scoped("inv-1", &a, &lock)
        .await
        .stale_scope(&lock, &a, &b);
    // Batch: the same three, with a fresh key beside it that must not be written either.
    let ops = json!({"ops": [{"op": "put", "key": "fresh", "value": "A"}, {"op": "put", "key": "inv-1", "value": "A"}]});
    app.batch(Some(&a), None, &ops)
        .await
        .mismatch("inv-1", Some(&lock), None);
    app.batch(Some(&a), Some(&other), &ops)
        .await
        .mismatch("inv-1", Some(&lock), Some(&other));
    app.batch(Some(&a), Some(&lock), &ops)
        .await
        .stale_scope(&lock, &a, &b);
    let deletes = json!({"ops": [{"op": "delete", "key": "inv-1"}]});
    app.batch(Some(&a), None, &deletes)
        .await
        .mismatch("inv-1", Some(&lock), None);

    // Nothing A sent changed anything: B's value, no fresh key, no fence for the other scope.
    let got = app.kv_get("inv-1").await.expect(200);
    assert_eq!(
        (&got["value"], &got["scope"], &got["fence_token"]),
        (&json!("B"), &json!(lock), &json!(b)),
        "{got}"
    );
    app.assert_absent("fresh").await;
    app.fence(&other).await.problem(404, "not-found");
    // B keeps writing under its scope.
    app.kv_put_scoped("inv-1", &b, &lock, &json!("B2"))
        .await
        .expect(200);
}

/// `/v1/locks/caf%C3%A9` names the scope `café`; the header spells it the same way, so the
/// zombie's write meets B's fence instead of starting a fresh one.
#[tokio::test]
async fn the_scope_header_is_decoded_like_the_lock_path() {
    let app = spawn_app().await;
    let name = format!("{}-café", unique("lock"));
    let (a, b) = zombie_and_holder(&app, &enc(&name)).await;
    let body = app
        .kv_put_scoped("k", &b, &enc(&name), &json!("B"))
        .await
        .expect(201);
    assert_eq!(body["scope"], json!(name), "{body}");
    assert_eq!(
        app.fence(&enc(&name)).await.expect(200)["fence_token"],
        json!(b)
    );

    app.kv_put_scoped("k", &a, &enc(&name), &json!("A"))
        .await
        .stale_scope(&name, &a, &b);
    app.kv_put_scoped("k2", &a, &enc(&name), &json!("A"))
        .await
        .stale_scope(&name, &a, &b);
    // The same name as raw UTF-8 bytes in the header: refused, not a second spelling.
    let raw = app
        .send(
            app.req(Method::PUT, &kv("k"))
                .header(TOKEN, &a)
                .header(SCOPE, HeaderValue::from_bytes(name.as_bytes()).unwrap())
                .json(&json!("A")),
        )
        .await;
    let problem = raw.problem(400, "invalid-scope");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("percent-encode"),
        "{problem}"
    );
    app.assert_absent("k2").await;
    assert_eq!(app.kv_get("k").await.expect(200)["value"], json!("B"));
}

#[tokio::test]
async fn invalid_escapes_are_refused_in_headers_and_paths() {
    let app = spawn_app().await;
    for bad in ["caf%", "%zz", "a%2", "100%"] {
        let r = app.kv_put_scoped("k", "1", bad, &json!(1)).await;
        r.problem(400, "invalid-scope");
        app.assert_absent("k").await;
    }
    // A literal '%' is %25; a lone '%' in a path is not the key "%".
    for bad in ["%", "a%zzb", "%C3", "%FF"] {
        app.kv_put(bad, "1", &json!(1))
            .await
            .problem(400, "invalid-key");
        app.send(app.req(Method::GET, &kv(bad)))
            .await
            .problem(400, "invalid-key");
        app.claim(bad, "1").await.problem(400, "invalid-scope");
    }
    app.kv_put("%25", "1", &json!("percent")).await.expect(201);
    let got = app.kv_get("%25").await.expect(200);
    assert_eq!(got["key"], json!("%"), "{got}");
    // Control characters stay refused after decoding.
    app.kv_put_scoped("k", "1", "a%0Ab", &json!(1))
        .await
        .problem(400, "invalid-scope");
}

#[tokio::test]
async fn an_unscoped_key_refuses_scoped_writes_and_no_fence_is_raised() {
    let app = spawn_app().await;
    app.kv_put("plain", "5", &json!("unscoped"))
        .await
        .expect(201);
    let s = unique("s");
    app.kv_put_scoped("plain", "100", &s, &json!("x"))
        .await
        .mismatch("plain", None, Some(&s));
    app.kv_delete_scoped("plain", "100", &s)
        .await
        .mismatch("plain", None, Some(&s));
    let ops = json!({"ops": [{"op": "put", "key": "plain", "value": "x"}, {"op": "put", "key": "other", "value": "x"}]});
    app.batch(Some("100"), Some(&s), &ops)
        .await
        .mismatch("plain", None, Some(&s));
    // A refused write changes nothing: not the value, not a key beside it, not the scope's fence.
    app.fence(&s).await.problem(404, "not-found");
    app.assert_absent("other").await;
    app.assert_value("plain", &json!("unscoped"), "5").await;
    // Unscoped writes go on under the key's own fence.
    app.kv_put("plain", "4", &json!("zombie"))
        .await
        .stale_key("plain", "4", "5");
    app.kv_put("plain", "6", &json!("next")).await.expect(200);
}

#[tokio::test]
async fn a_tombstone_remembers_its_scope() {
    let app = spawn_app().await;
    let s = unique("s");
    app.kv_put_scoped("t", "3", &s, &json!(1)).await.expect(201);
    app.kv_delete_scoped("t", "3", &s).await.expect(200);
    app.kv_put("t", "9", &json!("resurrected"))
        .await
        .mismatch("t", Some(&s), None);
    app.assert_absent("t").await;
    let body = app
        .kv_put_scoped("t", "3", &s, &json!("back"))
        .await
        .expect(201);
    assert_eq!(body["scope"], json!(s), "{body}");
}

#[tokio::test]
async fn a_stale_token_is_stale_whatever_its_scope() {
    // The fence is decided first: a token below the fence is 412 even where the scope is also
    // wrong (the reject-only cache answers the same without asking the database).
    let app = spawn_app().await;
    app.kv_put("k", "10", &json!(1)).await.expect(201);
    app.kv_put("k", "9", &json!(2))
        .await
        .stale_key("k", "9", "10");
    let s = unique("s");
    app.claim(&s, "10").await.expect(201);
    app.kv_put_scoped("k", "9", &s, &json!(2))
        .await
        .stale_scope(&s, "9", "10");
    app.kv_put_scoped("k", "11", &s, &json!(2))
        .await
        .mismatch("k", None, Some(&s));
}

async fn spawn_bound(scope: &str) -> TestApp {
    let scope = scope.to_owned();
    spawn_app_with(move |s| {
        s.scopes = vec![fencegate::fence::ScopeBinding {
            name: scope,
            keys: vec!["invoice-".into(), "billing/".into()],
        }];
    })
    .await
}

#[tokio::test]
async fn bound_keys_are_under_their_scope_with_or_without_the_header() {
    let lock = unique("billing");
    let app = spawn_bound(&lock).await;
    let (a, b) = zombie_and_holder(&app, &lock).await;

    // Without the header the binding decides; with it, it must agree.
    let body = app.kv_put("invoice-1", &b, &json!("B")).await.expect(201);
    assert_eq!(body["scope"], json!(lock), "{body}");
    app.kv_put_scoped("invoice-1", &b, &lock, &json!("B2"))
        .await
        .expect(200);
    let other = unique("other");
    app.kv_put_scoped("invoice-1", &b, &other, &json!("x"))
        .await
        .mismatch("invoice-1", Some(&lock), Some(&other));
    app.fence(&other).await.problem(404, "not-found");

    // The zombie meets the lock's fence even on a key B has not touched, header or not.
    app.kv_put("invoice-2", &a, &json!("A"))
        .await
        .stale_scope(&lock, &a, &b);
    app.kv_put(&enc("billing/2"), &a, &json!("A"))
        .await
        .stale_scope(&lock, &a, &b);
    app.kv_delete("invoice-1", &a)
        .await
        .stale_scope(&lock, &a, &b);
    app.assert_absent("invoice-2").await;

    // Unbound keys are unaffected.
    let plain = app.kv_put("note", "1", &json!("free")).await.expect(201);
    assert_eq!(plain["scope"], Value::Null, "{plain}");

    // A batch without the header is under its bound keys' scope, unbound keys included.
    let ops = json!({"ops": [{"op": "put", "key": "invoice-3", "value": 3}, {"op": "put", "key": "extra", "value": 3}]});
    let body = app.batch(Some(&b), None, &ops).await.expect(200);
    assert_eq!(body["scope"], json!(lock), "{body}");
    assert_eq!(app.kv_get("extra").await.expect(200)["scope"], json!(lock));
    app.batch(Some(&a), None, &ops)
        .await
        .stale_scope(&lock, &a, &b);
    // With a header naming another scope, a bound key in it is a mismatch; nothing applied.
    let ops = json!({"ops": [{"op": "put", "key": "loose", "value": 1}, {"op": "put", "key": "invoice-4", "value": 1}]});
    app.batch(Some("1"), Some(&other), &ops)
        .await
        .mismatch("invoice-4", Some(&lock), Some(&other));
    app.assert_absent("loose").await;
    app.assert_absent("invoice-4").await;
}

#[tokio::test]
async fn sticky_scope_can_be_turned_off() {
    let app = spawn_app_with(|s| s.kv.sticky_scope = false).await;
    app.kv_put_scoped("k", "50", "S", &json!("scoped"))
        .await
        .expect(201);
    // Off, the key's own fence (never raised by the scoped write) decides an unscoped write.
    let body = app.kv_put("k", "1", &json!("unscoped")).await.expect(200);
    assert_eq!(body["scope"], Value::Null, "{body}");
    app.kv_put_scoped("k", "50", "T", &json!("other scope"))
        .await
        .expect(200);
}

/// Scoped and unscoped writers race on fresh keys: whichever kind lands first binds the key,
/// and no write of the other kind is ever accepted after it. Concurrent requests, so the
/// PostgreSQL coalescer puts them in the same batches (rounds of mixed kinds).
#[tokio::test]
async fn scoped_and_unscoped_writers_racing_on_one_key_never_both_win() {
    let app = spawn_app().await;
    let scope = unique("race");
    for round in 0..8 {
        let key = format!("race-{round}");
        let mut tasks = Vec::new();
        for i in 0..16u32 {
            let (client, url, scope) = (
                app.client.clone(),
                format!("{}{}", app.address, kv(&key)),
                scope.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let scoped = i % 2 == 0;
                let mut rb = client
                    .put(url)
                    .header(TOKEN, (1000 + round * 100 + i).to_string())
                    .json(&json!({"writer": i}));
                if scoped {
                    rb = rb.header(SCOPE, scope);
                }
                let r = rb.send().await.expect("request");
                (scoped, r.status().as_u16(), r.text().await.unwrap())
            }));
        }
        let mut accepted = [0, 0]; // [unscoped, scoped]
        for task in tasks {
            let (scoped, status, text) = task.await.unwrap();
            match status {
                200 | 201 => accepted[scoped as usize] += 1,
                409 => assert!(text.contains("scope-mismatch"), "{text}"),
                412 => assert!(text.contains("stale-token"), "{text}"),
                other => panic!("unexpected {other}: {text}"),
            }
        }
        assert!(
            accepted[0] == 0 || accepted[1] == 0,
            "round {round}: both kinds accepted: {accepted:?}"
        );
        assert!(
            accepted[0] + accepted[1] > 0,
            "round {round}: nothing accepted"
        );
        let got = app.kv_get(&key).await.expect(200);
        let expected_scope = if accepted[1] > 0 {
            json!(scope)
        } else {
            Value::Null
        };
        assert_eq!(got["scope"], expected_scope, "round {round}: {got}");
    }
}

/// One precedence on every path (docs/wire.md, *Fences*): stale (412), not issued (422), jump
/// (422), then the scope (409: the binding, then what the key remembers). A header that
/// contradicts a `[[scopes]]` binding is found from configuration alone, but it is answered
/// after the fence and the guards of the scope it names: a zombie hears 412 here too.
#[tokio::test]
async fn a_header_that_contradicts_a_binding_is_answered_in_the_one_precedence() {
    let lock = unique("billing");
    let bound = lock.clone();
    let app = spawn_app_with(move |s| {
        s.scopes = vec![fencegate::fence::ScopeBinding {
            name: bound,
            keys: vec!["invoice-".into()],
        }];
        s.kv.max_token_jump = 100;
    })
    .await;
    let other = unique("other");
    app.claim(&other, "10").await.expect(201);
    let ops = |key: &str| json!({"ops": [{"op": "put", "key": "loose", "value": 1}, {"op": "put", "key": key, "value": 1}]});

    // 1. Stale against the presented scope's fence: single write, delete, batch.
    app.kv_put_scoped("invoice-1", "9", &other, &json!(1))
        .await
        .stale_scope(&other, "9", "10");
    app.kv_delete_scoped("invoice-1", "9", &other)
        .await
        .stale_scope(&other, "9", "10");
    app.batch(Some("9"), Some(&other), &ops("invoice-1"))
        .await
        .stale_scope(&other, "9", "10");
    // 2. Not issued: a built-in lock of the presented scope granted only its first token.
    let granted = unique("granted");
    assert_eq!(acquire(&app, &granted).await, "1");
    app.kv_put_scoped("invoice-1", "5", &granted, &json!(1))
        .await
        .problem(422, "token-not-issued");
    app.batch(Some("5"), Some(&granted), &ops("invoice-1"))
        .await
        .problem(422, "token-not-issued");
    // 3. A jump past the cap from the presented scope's fence.
    let jump = app
        .kv_put_scoped("invoice-1", "500", &other, &json!(1))
        .await
        .problem(422, "token-jump");
    assert_eq!(
        (jump["scope"].clone(), jump["current_token"].clone()),
        (json!(other), json!("10")),
        "{jump}"
    );
    app.batch(Some("500"), Some(&other), &ops("invoice-1"))
        .await
        .problem(422, "token-jump");
    // 4. A token the presented scope's fence admits: the binding.
    app.kv_put_scoped("invoice-1", "10", &other, &json!(1))
        .await
        .mismatch("invoice-1", Some(&lock), Some(&other));
    app.batch(Some("10"), Some(&other), &ops("invoice-1"))
        .await
        .mismatch("invoice-1", Some(&lock), Some(&other));
    // Nothing was written and no fence moved by any of it.
    app.assert_absent("invoice-1").await;
    app.assert_absent("loose").await;
    assert_eq!(
        app.fence(&other).await.expect(200)["fence_token"],
        json!("10")
    );
    app.fence(&lock).await.problem(404, "not-found");
}

/// The same precedence against what a key remembers (sticky scope), single write and batch:
/// stale before not issued before the jump before the remembered scope.
#[tokio::test]
async fn a_key_that_remembers_another_scope_is_answered_in_the_one_precedence() {
    let app = spawn_app_with(|s| s.kv.max_token_jump = 100).await;
    let key = unique("remembers");
    app.kv_put(&key, "10", &json!("unscoped")).await.expect(201);
    let s = unique("s");
    app.claim(&s, "20").await.expect(201);
    let ops = json!({"ops": [{"op": "put", "key": key, "value": 2}]});
    app.kv_put_scoped(&key, "15", &s, &json!(2))
        .await
        .stale_scope(&s, "15", "20");
    app.batch(Some("15"), Some(&s), &ops)
        .await
        .stale_scope(&s, "15", "20");
    app.kv_put_scoped(&key, "500", &s, &json!(2))
        .await
        .problem(422, "token-jump");
    app.batch(Some("500"), Some(&s), &ops)
        .await
        .problem(422, "token-jump");
    app.kv_put_scoped(&key, "25", &s, &json!(2))
        .await
        .mismatch(&key, None, Some(&s));
    app.batch(Some("25"), Some(&s), &ops)
        .await
        .mismatch(&key, None, Some(&s));
    // A scope a built-in lock granted only token 1: not issued comes before the mismatch.
    let granted = unique("granted");
    assert_eq!(acquire(&app, &granted).await, "1");
    app.kv_put_scoped(&key, "5", &granted, &json!(2))
        .await
        .problem(422, "token-not-issued");
    app.kv_put_scoped(&key, "1", &granted, &json!(2))
        .await
        .mismatch(&key, None, Some(&granted));
    app.assert_value(&key, &json!("unscoped"), "10").await;
}
