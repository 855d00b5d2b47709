//! Error responses: every failure is an RFC 9457 problem with the documented type.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{kv, spawn_app, spawn_app_with, TOKEN};

#[tokio::test]
async fn unknown_route_is_404_problem() {
    let app = spawn_app().await;
    for path in [
        "/",
        "/nope",
        "/v2/kv/x",
        "/v1/kv",
        "/v1/kv/a/b",
        "/v1/fences",
    ] {
        app.get(path).await.problem(404, "not-found");
    }
}

#[tokio::test]
async fn wrong_method_is_405_problem() {
    let app = spawn_app().await;
    let cases = [
        (Method::PATCH, "/v1/kv/x"),
        (Method::POST, "/v1/kv/x"),
        (Method::GET, "/v1/batch"),
        (Method::PUT, "/v1/fences/S"),
        (Method::DELETE, "/v1/fences/S"),
        (Method::POST, "/healthz"),
    ];
    for (method, path) in cases {
        let r = app
            .send(app.req(method, path).header(TOKEN, "1").json(&json!(1)))
            .await;
        r.problem(405, "method-not-allowed");
    }
    app.assert_absent("x").await;
}

#[tokio::test]
async fn invalid_json_is_400_and_stores_nothing() {
    let app = spawn_app().await;
    for raw in [r#"{"a":"#, "", "{'a': 1}", "nul", "[1,]", "1 2"] {
        let r = app
            .send(
                app.req(Method::PUT, &kv("k"))
                    .header(TOKEN, "1")
                    .header("content-type", "application/json")
                    .body(raw),
            )
            .await;
        r.problem(400, "invalid-json");
    }
    let r = app
        .batch_raw("1", r#"{"ops":[{"op":"put","key":"k","value":1}"#)
        .await;
    r.problem(400, "invalid-json");
    app.assert_absent("k").await;
}

#[tokio::test]
async fn body_over_the_limit_is_413_and_stores_nothing() {
    let app = spawn_app_with(|s| s.server.body_limit_bytes = 1024).await;
    let big = json!("x".repeat(2048));
    app.kv_put("big", "1", &big)
        .await
        .problem(413, "payload-too-large");
    app.assert_absent("big").await;

    let batch = json!({"ops": [{"op": "put", "key": "b", "value": "y".repeat(2048)}]});
    app.batch(Some("1"), None, &batch)
        .await
        .problem(413, "payload-too-large");
    app.assert_absent("b").await;

    // Under the limit still works.
    app.kv_put("small", "1", &json!("x".repeat(512)))
        .await
        .expect(201);
}

#[tokio::test]
async fn default_body_limit_is_one_mebibyte() {
    let app = spawn_app().await;
    // A JSON string of 1 MiB plus quotes: over 1048576 bytes.
    let big = json!("x".repeat(1_048_576));
    app.kv_put("big", "1", &big)
        .await
        .problem(413, "payload-too-large");
    app.assert_absent("big").await;
    let fits = json!("x".repeat(1_000_000));
    app.kv_put("fits", "1", &fits).await.expect(201);
}

#[tokio::test]
async fn problems_carry_the_documented_shape() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!(1)).await.expect(201);
    // Each call below asserts content type, type URI, title, numeric status and detail.
    app.kv_put("k", "4", &json!(1))
        .await
        .problem(412, "stale-token");
    app.send(app.req(Method::PUT, "/v1/kv/k").json(&json!(1)))
        .await
        .problem(428, "missing-token");
    app.kv_put("k", "x", &json!(1))
        .await
        .problem(400, "malformed-token");
    app.kv_put("%00", "5", &json!(1))
        .await
        .problem(400, "invalid-key");
    app.kv_put_scoped("k", "5", "", &json!(1))
        .await
        .problem(400, "invalid-scope");
    app.batch(Some("5"), None, &json!({"ops": []}))
        .await
        .problem(400, "invalid-batch");
    app.kv_get("absent").await.problem(404, "not-found");
}
