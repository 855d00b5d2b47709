//! Scoped writes (`X-Fencing-Scope`) and the fences endpoints: one high-water mark per scope.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{enc, kv, spawn_app, spawn_app_with, SCOPE, TOKEN};

#[tokio::test]
async fn zombie_cannot_write_a_key_the_holder_never_touched() {
    let app = spawn_app().await;
    let body = app.kv_put_scoped("a", "10", "S", &json!("holder")).await.expect(201);
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
    app.kv_put_scoped("a", "10", "S", &json!(1)).await.expect(201);
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
    app.kv_put_scoped("a", "10", "S", &json!("old holder")).await.expect(201);
    app.claim("S", "20").await.expect(200);
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("20"), "{body}");

    app.kv_put_scoped("a", "15", "S", &json!("zombie")).await.stale_scope("S", "15", "20");
    app.kv_put_scoped("new", "15", "S", &json!("zombie")).await.stale_scope("S", "15", "20");
    app.kv_delete_scoped("a", "15", "S").await.stale_scope("S", "15", "20");
    app.assert_absent("new").await;
    let got = app.kv_get("a").await.expect(200);
    assert_eq!(got["value"], json!("old holder"), "{got}");

    // The new holder writes under the claimed token: equal is accepted.
    app.kv_put_scoped("new", "20", "S", &json!("new holder")).await.expect(201);
    app.kv_put_scoped("a", "20", "S", &json!("new holder")).await.expect(200);
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
    app.kv_put_scoped("a", "20", "S", &json!(1)).await.expect(201);
    app.kv_put_scoped("b", "1", "T", &json!(2)).await.expect(201);
    // Same key, other scope: only T's fence applies.
    app.kv_put_scoped("a", "1", "T", &json!(3)).await.expect(200);
    app.assert_value("a", &json!(3), "1").await;
    let body = app.fence("T").await.expect(200);
    assert_eq!(body["fence_token"], json!("1"), "{body}");
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("20"), "{body}");
}

#[tokio::test]
async fn scoped_writes_neither_check_nor_change_the_key_fence() {
    let app = spawn_app().await;
    // Scoped write at 10 does not raise a's own fence: an unscoped write at 1 is accepted.
    app.kv_put_scoped("a", "10", "S", &json!("scoped")).await.expect(201);
    app.kv_put("a", "1", &json!("unscoped")).await.expect(200);
    app.assert_value("a", &json!("unscoped"), "1").await;

    // Key c's own fence (100) is not checked by a scoped write at 11 (S is at 10).
    app.kv_put("c", "100", &json!("unscoped")).await.expect(201);
    app.kv_put_scoped("c", "11", "S", &json!("scoped")).await.expect(200);
    let got = app.kv_get("c").await.expect(200);
    assert_eq!(got["value"], json!("scoped"), "{got}");
    // ...and the unscoped fence of c is still 100.
    app.kv_put("c", "99", &json!("zombie")).await.stale_key("c", "99", "100");
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
                .header(SCOPE, reqwest::header::HeaderValue::from_bytes(scope.as_bytes()).unwrap())
                .json(&json!(1)),
        )
        .await;
    let body = r.expect(201);
    assert_eq!(body["scope"], json!(scope), "{body}");
    let body = app.fence(&enc(scope)).await.expect(200);
    assert_eq!(body, json!({"scope": scope, "fence_token": "3"}));
    app.claim(&enc(scope), "2").await.stale_scope(scope, "2", "3");
}

#[tokio::test]
async fn invalid_scope_in_the_fences_path_is_400() {
    let app = spawn_app().await;
    let long = "s".repeat(513);
    for seg in ["%00", "a%0Ab", "%FF", long.as_str()] {
        app.claim(seg, "1").await.problem_any(400, &["invalid-scope", "invalid-key"]);
        app.fence(seg).await.problem_any(400, &["invalid-scope", "invalid-key"]);
    }
}

#[tokio::test]
async fn unscoped_write_reports_null_scope_and_scoped_get_reports_scope() {
    let app = spawn_app().await;
    app.kv_put_scoped("k", "1", "S", &json!(1)).await.expect(201);
    let body = app.kv_get("k").await.expect(200);
    assert_eq!(body["scope"], json!("S"), "{body}");
    assert_eq!(body["fence_token"], json!("1"), "{body}");
    app.kv_put("k", "2", &json!(2)).await.expect(200);
    let body = app.kv_get("k").await.expect(200);
    assert_eq!(body["scope"], Value::Null, "{body}");
}

#[tokio::test]
async fn strict_mode_applies_to_scoped_writes() {
    let app = spawn_app_with(|s| s.kv.strict = true).await;
    app.kv_put_scoped("a", "10", "S", &json!(1)).await.expect(201);
    app.kv_put_scoped("b", "10", "S", &json!(2)).await.stale_scope("S", "10", "10");
    app.assert_absent("b").await;
    app.kv_put_scoped("b", "11", "S", &json!(2)).await.expect(201);
}

#[tokio::test]
async fn scoped_delete_reports_the_scope_and_leaves_a_tombstone() {
    let app = spawn_app().await;
    app.kv_put_scoped("a", "10", "S", &json!(1)).await.expect(201);
    let body = app.kv_delete_scoped("a", "12", "S").await.expect(200);
    assert_eq!(
        body,
        json!({"key": "a", "fence_token": "12", "scope": "S", "deleted": true})
    );
    app.assert_absent("a").await;
    app.kv_put_scoped("a", "11", "S", &json!("zombie")).await.stale_scope("S", "11", "12");
    app.assert_absent("a").await;
}
