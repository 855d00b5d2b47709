//! Scoped writes (`X-Fencing-Scope`) and the fences endpoints: one high-water mark per scope.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{enc, kv, spawn_app, spawn_app_with, SCOPE, TOKEN};

#[tokio::test]
async fn zombie_cannot_write_a_key_the_holder_never_touched() {
    let app = spawn_app().await;
    let body = app
        .kv_put_scoped("a", "10", "S", &json!("holder"))
        .await
        .expect(201);
    assert_eq!(body["scope"], json!("S"), "{body}");
    assert_eq!(body["fence_token"], json!("10"), "{body}");

    app.kv_put_scoped("b", "5", "S", &json!("zombie"))
        .await
        .stale_scope("S", "5", "10");
    app.assert_absent("b").await;
    let got = app.kv_get("a").await.expect(200);
    assert_eq!(got["scope"], json!("S"), "{got}");
    assert_eq!(got["value"], json!("holder"), "{got}");
}

#[tokio::test]
async fn a_scoped_write_raises_the_scope_fence() {
    let app = spawn_app().await;
    app.kv_put_scoped("a", "10", "S", &json!(1))
        .await
        .expect(201);
    let body = app.fence("S").await.expect(200);
    assert_eq!(body, json!({"scope": "S", "fence_token": "10"}));
}

#[tokio::test]
async fn claim_creates_then_raises_a_fence() {
    let app = spawn_app().await;
    let body = app.claim("S", "20").await.expect(201);
    assert_eq!(body, json!({"scope": "S", "fence_token": "20"}));
    let body = app.claim("S", "20").await.expect(200);
    assert_eq!(body, json!({"scope": "S", "fence_token": "20"}));
    let body = app.claim("S", "21").await.expect(200);
    assert_eq!(body["fence_token"], json!("21"), "{body}");
    let body = app.fence("S").await.expect(200);
    assert_eq!(body, json!({"scope": "S", "fence_token": "21"}));
}

#[tokio::test]
async fn claim_fences_zombie_writes_to_any_key() {
    let app = spawn_app().await;
    app.kv_put_scoped("a", "10", "S", &json!("old holder"))
        .await
        .expect(201);
    app.claim("S", "20").await.expect(200);
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("20"), "{body}");

    app.kv_put_scoped("a", "15", "S", &json!("zombie"))
        .await
        .stale_scope("S", "15", "20");
    app.kv_put_scoped("new", "15", "S", &json!("zombie"))
        .await
        .stale_scope("S", "15", "20");
    app.kv_delete_scoped("a", "15", "S")
        .await
        .stale_scope("S", "15", "20");
    app.assert_absent("new").await;
    let got = app.kv_get("a").await.expect(200);
    assert_eq!(got["value"], json!("old holder"), "{got}");

    // The new holder writes under the claimed token: equal is accepted.
    app.kv_put_scoped("new", "20", "S", &json!("new holder"))
        .await
        .expect(201);
    app.kv_put_scoped("a", "20", "S", &json!("new holder"))
        .await
        .expect(200);
    app.assert_value("a", &json!("new holder"), "20").await;
}

#[tokio::test]
async fn claim_with_lower_token_is_412() {
    let app = spawn_app().await;
    app.claim("S", "20").await.expect(201);
    app.claim("S", "19").await.stale_scope("S", "19", "20");
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("20"), "{body}");
}

#[tokio::test]
async fn claim_needs_a_token() {
    let app = spawn_app().await;
    let r = app.send(app.req(Method::POST, "/v1/fences/S")).await;
    r.problem(428, "missing-token");
    app.fence("S").await.problem(404, "not-found");
}

#[tokio::test]
async fn claims_use_greater_or_equal_even_in_strict_mode() {
    let app = spawn_app_with(|s| s.kv.strict = true).await;
    app.claim("S", "20").await.expect(201);
    app.claim("S", "20").await.expect(200);
}

#[tokio::test]
async fn unknown_fence_is_404() {
    let app = spawn_app().await;
    app.fence("nobody").await.problem(404, "not-found");
}

#[tokio::test]
async fn tokens_of_different_scopes_are_never_compared() {
    let app = spawn_app().await;
    app.claim("S", "20").await.expect(201);
    app.kv_put_scoped("a", "20", "S", &json!(1))
        .await
        .expect(201);
    app.kv_put_scoped("b", "1", "T", &json!(2))
        .await
        .expect(201);
    // A new key under T with token 1, while S is at 20: only T's fence applies.
    app.kv_put_scoped("c", "1", "T", &json!(3))
        .await
        .expect(201);
    app.assert_value("c", &json!(3), "1").await;
    let body = app.fence("T").await.expect(200);
    assert_eq!(body["fence_token"], json!("1"), "{body}");
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("20"), "{body}");
}

#[tokio::test]
async fn scoped_writes_neither_check_nor_change_the_key_fence() {
    // Only visible with sticky scopes off: on, a key refuses writes under another scope (see
    // sticky.rs), so the two fences of one key never meet.
    let app = spawn_app_with(|s| s.kv.sticky_scope = false).await;
    // Scoped write at 10 does not raise a's own fence: an unscoped write at 1 is accepted.
    app.kv_put_scoped("a", "10", "S", &json!("scoped"))
        .await
        .expect(201);
    app.kv_put("a", "1", &json!("unscoped")).await.expect(200);
    app.assert_value("a", &json!("unscoped"), "1").await;

    // Key c's own fence (100) is not checked by a scoped write at 11 (S is at 10).
    app.kv_put("c", "100", &json!("unscoped")).await.expect(201);
    app.kv_put_scoped("c", "11", "S", &json!("scoped"))
        .await
        .expect(200);
    let got = app.kv_get("c").await.expect(200);
    assert_eq!(got["value"], json!("scoped"), "{got}");
    // ...and the unscoped fence of c is still 100.
    app.kv_put("c", "99", &json!("zombie"))
        .await
        .stale_key("c", "99", "100");
}

#[tokio::test]
async fn invalid_scope_header_is_400() {
    let app = spawn_app().await;
    let long = "s".repeat(513);
    let bad: [&[u8]; 4] = [b"", long.as_bytes(), b"a\tb", b"\x7f"];
    for s in bad {
        let value = reqwest::header::HeaderValue::from_bytes(s);
        let Ok(value) = value else { continue }; // not sendable over HTTP at all
        let r = app
            .send(
                app.req(Method::PUT, &kv("k"))
                    .header(TOKEN, "1")
                    .header(SCOPE, value)
                    .json(&json!(1)),
            )
            .await;
        r.problem(400, "invalid-scope");
    }
    app.assert_absent("k").await;
}

#[tokio::test]
async fn two_scope_headers_are_400() {
    let app = spawn_app().await;
    let r = app
        .send(
            app.req(Method::PUT, &kv("k"))
                .header(TOKEN, "1")
                .header(SCOPE, "S")
                .header(SCOPE, "S")
                .json(&json!(1)),
        )
        .await;
    r.problem(400, "invalid-scope");
    app.assert_absent("k").await;
}

#[tokio::test]
async fn utf8_scope_names_work_in_header_and_path() {
    let app = spawn_app().await;
    let scope = "ロック/1";
    let r = app
        .send(
            app.req(Method::PUT, &kv("k"))
                .header(TOKEN, "3")
                // Percent-encoded, exactly as in the path (raw UTF-8 bytes are 400: sticky.rs).
                .header(SCOPE, enc(scope))
                .json(&json!(1)),
        )
        .await;
    let body = r.expect(201);
    assert_eq!(body["scope"], json!(scope), "{body}");
    let body = app.fence(&enc(scope)).await.expect(200);
    assert_eq!(body, json!({"scope": scope, "fence_token": "3"}));
    app.claim(&enc(scope), "2")
        .await
        .stale_scope(scope, "2", "3");
}

#[tokio::test]
async fn invalid_scope_in_the_fences_path_is_400() {
    let app = spawn_app().await;
    let long = "s".repeat(513);
    for seg in ["%00", "a%0Ab", "%FF", long.as_str()] {
        app.claim(seg, "1").await.problem(400, "invalid-scope");
        app.fence(seg).await.problem(400, "invalid-scope");
    }
}

#[tokio::test]
async fn unscoped_write_reports_null_scope_and_scoped_get_reports_scope() {
    let app = spawn_app().await;
    app.kv_put_scoped("k", "1", "S", &json!(1))
        .await
        .expect(201);
    let body = app.kv_get("k").await.expect(200);
    assert_eq!(body["scope"], json!("S"), "{body}");
    assert_eq!(body["fence_token"], json!("1"), "{body}");
    app.kv_put("j", "2", &json!(2)).await.expect(201);
    let body = app.kv_get("j").await.expect(200);
    assert_eq!(body["scope"], Value::Null, "{body}");
}

#[tokio::test]
async fn strict_mode_applies_to_scoped_writes() {
    let app = spawn_app_with(|s| s.kv.strict = true).await;
    app.kv_put_scoped("a", "10", "S", &json!(1))
        .await
        .expect(201);
    app.kv_put_scoped("b", "10", "S", &json!(2))
        .await
        .stale_scope("S", "10", "10");
    app.assert_absent("b").await;
    app.kv_put_scoped("b", "11", "S", &json!(2))
        .await
        .expect(201);
}

#[tokio::test]
async fn scoped_delete_reports_the_scope_and_leaves_a_tombstone() {
    let app = spawn_app().await;
    app.kv_put_scoped("a", "10", "S", &json!(1))
        .await
        .expect(201);
    let body = app.kv_delete_scoped("a", "12", "S").await.expect(200);
    assert_eq!(
        body,
        json!({"key": "a", "fence_token": "12", "scope": "S", "deleted": true})
    );
    app.assert_absent("a").await;
    app.kv_put_scoped("a", "11", "S", &json!("zombie"))
        .await
        .stale_scope("S", "11", "12");
    app.assert_absent("a").await;
}

/// Starts every request at once and returns the responses in request order. Concurrent
/// scoped writes are what the coalescer combines; the outcomes must be those of some order of
/// applying them one by one.
async fn all_at_once(
    app: &std::sync::Arc<crate::helpers::TestApp>,
    writes: Vec<(String, String, Option<String>, Value)>,
) -> Vec<crate::helpers::Resp> {
    let tasks: Vec<_> = writes
        .into_iter()
        .map(|(key, token, scope, value)| {
            let app = app.clone();
            tokio::spawn(async move {
                match scope {
                    Some(scope) => app.kv_put_scoped(&key, &token, &scope, &value).await,
                    None => app.kv_put(&key, &token, &value).await,
                }
            })
        })
        .collect();
    let mut responses = Vec::new();
    for task in tasks {
        responses.push(task.await.expect("write task"));
    }
    responses
}

#[tokio::test]
async fn concurrent_scoped_writes_under_one_token_all_land() {
    let app = std::sync::Arc::new(spawn_app().await);
    // 40 keys, the first 8 written three times each: a key twice in one batch must wait for
    // the next statement, and every write must still be applied.
    let mut writes = Vec::new();
    for round in 0..3 {
        for i in 0..40 {
            if round == 0 || i < 8 {
                writes.push((
                    format!("k{i}"),
                    "10".to_string(),
                    Some("S".to_string()),
                    json!({"i": i, "round": round}),
                ));
            }
        }
    }
    for resp in all_at_once(&app, writes).await {
        resp.expect_any(&[200, 201]);
    }
    for i in 0..40 {
        let got = app.kv_get(&format!("k{i}")).await.expect(200);
        assert_eq!(got["scope"], json!("S"), "{got}");
        assert_eq!(
            got["value"]["i"],
            json!(i),
            "k{i} holds another key's value: {got}"
        );
        let writes = if i < 8 { 3 } else { 1 };
        assert_eq!(
            got["version"],
            json!(writes),
            "k{i} was written {writes} times: {got}"
        );
    }
    assert_eq!(app.fence("S").await.expect(200)["fence_token"], json!("10"));
}

#[tokio::test]
async fn strict_scope_admits_one_of_many_concurrent_writes_with_one_token() {
    // Strict: a token writes once. Thirty writers presenting the same token at once: applied
    // one by one, the first is accepted and every other is refused, whatever the batching.
    let app = std::sync::Arc::new(spawn_app_with(|s| s.kv.strict = true).await);
    let writes = (0..30)
        .map(|i| {
            (
                format!("k{i}"),
                "10".to_string(),
                Some("S".to_string()),
                json!(i),
            )
        })
        .collect();
    let responses = all_at_once(&app, writes).await;
    let accepted: Vec<usize> = responses
        .iter()
        .enumerate()
        .filter(|(_, r)| r.status == 201)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        accepted.len(),
        1,
        "exactly one write of token 10 may land, got {accepted:?}"
    );
    for (i, resp) in responses.iter().enumerate() {
        if i != accepted[0] {
            resp.stale_scope("S", "10", "10");
            app.assert_absent(&format!("k{i}")).await;
        }
    }
}

#[tokio::test]
async fn concurrent_scoped_writes_with_climbing_tokens() {
    // Tokens 1..=30 at once, one key each. Any order is a valid history, but each outcome must
    // agree with the fence: a refused write changed nothing and names a higher fence, and the
    // highest token is never refused.
    let app = std::sync::Arc::new(spawn_app().await);
    let writes = (1..=30)
        .map(|t| {
            (
                format!("k{t}"),
                t.to_string(),
                Some("S".to_string()),
                json!(t),
            )
        })
        .collect();
    let responses = all_at_once(&app, writes).await;
    for (t, resp) in (1..=30).zip(&responses) {
        match resp.status {
            201 => {
                app.assert_value(&format!("k{t}"), &json!(t), &t.to_string())
                    .await
            }
            412 => {
                let current: u64 = resp.json()["current_token"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(current > t, "token {t} refused by a fence of {current}");
                app.assert_absent(&format!("k{t}")).await;
            }
            other => panic!("token {t}: unexpected status {other}: {:?}", resp.json()),
        }
    }
    assert_eq!(
        responses[29].status, 201,
        "the highest token cannot be stale"
    );
    assert_eq!(app.fence("S").await.expect(200)["fence_token"], json!("30"));
}

#[tokio::test]
async fn concurrent_scoped_and_unscoped_writes_to_the_same_keys_all_land() {
    // One key written under a scope and under its own fence in the same instant: the two
    // kinds go in different statements, and both must be applied. With sticky scopes off:
    // on, the first to land binds the key (sticky.rs races the two kinds that way).
    let app = std::sync::Arc::new(spawn_app_with(|s| s.kv.sticky_scope = false).await);
    let mut writes = Vec::new();
    for i in 0..10 {
        writes.push((
            format!("k{i}"),
            "5".to_string(),
            Some("S".to_string()),
            json!("scoped"),
        ));
        writes.push((format!("k{i}"), "5".to_string(), None, json!("unscoped")));
    }
    for resp in all_at_once(&app, writes).await {
        resp.expect_any(&[200, 201]);
    }
    for i in 0..10 {
        let got = app.kv_get(&format!("k{i}")).await.expect(200);
        assert_eq!(
            got["version"],
            json!(2),
            "k{i}: both writes must be applied: {got}"
        );
    }
}

#[tokio::test]
async fn concurrent_zombie_and_holder_of_different_scopes_each_get_their_own_answer() {
    // A zombie of scope Z (fence 10, it presents 5) and the holder of scope H (fresh) write at
    // once, with the same token: combined, the two claims share one statement, and the refused
    // one must refuse exactly its own scope's writes. (No fence cache: it would refuse the
    // zombie before the database sees it.)
    let app = std::sync::Arc::new(spawn_app_with(|s| s.kv.fence_cache_capacity = 0).await);
    app.claim("Z", "10").await.expect(201);
    let mut writes = Vec::new();
    for i in 0..15 {
        writes.push((
            format!("z{i}"),
            "5".to_string(),
            Some("Z".to_string()),
            json!("zombie"),
        ));
        writes.push((
            format!("h{i}"),
            "5".to_string(),
            Some("H".to_string()),
            json!("holder"),
        ));
    }
    let responses = all_at_once(&app, writes).await;
    for (i, pair) in responses.chunks(2).enumerate() {
        pair[0].stale_scope("Z", "5", "10");
        app.assert_absent(&format!("z{i}")).await;
        pair[1].expect(201);
        app.assert_value(&format!("h{i}"), &json!("holder"), "5")
            .await;
    }
}
