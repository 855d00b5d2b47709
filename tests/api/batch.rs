//! `POST /v1/batch`: one token for many ops, all or nothing.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with};

fn put(key: &str, value: Value) -> Value {
    json!({"op": "put", "key": key, "value": value})
}

fn del(key: &str) -> Value {
    json!({"op": "delete", "key": key})
}

#[tokio::test]
async fn success_returns_per_op_results_in_request_order() {
    let app = spawn_app().await;
    app.kv_put("existing", "1", &json!("old")).await.expect(201);
    app.kv_put("gone", "1", &json!("old")).await.expect(201);

    let body = app
        .batch(
            Some("42"),
            None,
            &json!({"ops": [put("new", json!(1)), del("gone"), put("existing", json!({"x": 2}))]}),
        )
        .await
        .expect(200);
    assert_eq!(
        body,
        json!({
            "fence_token": "42",
            "scope": null,
            "results": [
                {"op": "put", "key": "new", "status": 201},
                {"op": "delete", "key": "gone", "status": 200},
                {"op": "put", "key": "existing", "status": 200},
            ]
        })
    );
    app.assert_value("new", &json!(1), "42").await;
    app.assert_value("existing", &json!({"x": 2}), "42").await;
    app.assert_absent("gone").await;
}

#[tokio::test]
async fn one_stale_key_rejects_the_whole_batch() {
    let app = spawn_app().await;
    app.kv_put("a", "1", &json!("a-old")).await.expect(201);
    app.kv_put("b", "50", &json!("b-old")).await.expect(201);

    let r = app
        .batch(
            Some("10"),
            None,
            &json!({"ops": [put("a", json!("a-new")), put("b", json!("b-new")), put("c", json!("c-new")), del("d")]}),
        )
        .await;
    let body = r.stale_key("b", "10", "50");
    assert_eq!(
        body["stale_keys"],
        json!([{"key": "b", "current_token": "50"}]),
        "{body}"
    );

    // Nothing applied: not the earlier op, not the later ones, not the delete's tombstone.
    app.assert_value("a", &json!("a-old"), "1").await;
    app.assert_value("b", &json!("b-old"), "50").await;
    app.assert_absent("c").await;
    app.assert_absent("d").await;
    app.kv_put("d", "2", &json!("d")).await.expect(201); // no tombstone at 10 was left
    app.kv_put("a", "2", &json!("a")).await.expect(200); // a's fence was not raised to 10
}

#[tokio::test]
async fn all_stale_keys_are_named() {
    let app = spawn_app().await;
    app.kv_put("a", "30", &json!(1)).await.expect(201);
    app.kv_delete("b", "40").await.expect(200);

    let r = app
        .batch(
            Some("10"),
            None,
            &json!({"ops": [put("ok", json!(1)), put("a", json!(2)), del("b")]}),
        )
        .await;
    // "key"/"current_token" describe the first stale key in request order.
    let body = r.stale_key("a", "10", "30");
    let mut stale = body["stale_keys"].as_array().cloned().unwrap_or_default();
    stale.sort_by_key(|v| v["key"].as_str().unwrap_or_default().to_string());
    assert_eq!(
        stale,
        vec![
            json!({"key": "a", "current_token": "30"}),
            json!({"key": "b", "current_token": "40"})
        ],
        "{body}"
    );
    app.assert_absent("ok").await;
}

#[tokio::test]
async fn delete_ops_leave_tombstones() {
    let app = spawn_app().await;
    app.kv_put("k", "1", &json!(1)).await.expect(201);
    app.batch(Some("50"), None, &json!({"ops": [del("k"), del("never")]}))
        .await
        .expect(200);
    app.assert_absent("k").await;
    app.kv_put("k", "49", &json!(2))
        .await
        .stale_key("k", "49", "50");
    app.kv_put("never", "49", &json!(2))
        .await
        .stale_key("never", "49", "50");
    app.kv_put("k", "50", &json!(3)).await.expect(201);
}

#[tokio::test]
async fn scoped_batch_is_checked_against_the_scope_fence() {
    let app = spawn_app().await;
    app.claim("S", "30").await.expect(201);
    let r = app
        .batch(
            Some("10"),
            Some("S"),
            &json!({"ops": [put("a", json!(1)), put("b", json!(2))]}),
        )
        .await;
    r.stale_scope("S", "10", "30");
    app.assert_absent("a").await;
    app.assert_absent("b").await;

    let body = app
        .batch(
            Some("30"),
            Some("S"),
            &json!({"ops": [put("a", json!(1)), put("b", json!(2))]}),
        )
        .await
        .expect(200);
    assert_eq!(body["scope"], json!("S"), "{body}");
    assert_eq!(body["fence_token"], json!("30"), "{body}");
    let got = app.kv_get("a").await.expect(200);
    assert_eq!(got["scope"], json!("S"), "{got}");
}

#[tokio::test]
async fn a_scoped_batch_raises_the_scope_fence() {
    let app = spawn_app().await;
    app.batch(Some("7"), Some("S"), &json!({"ops": [put("a", json!(1))]}))
        .await
        .expect(200);
    let body = app.fence("S").await.expect(200);
    assert_eq!(body["fence_token"], json!("7"), "{body}");
    app.kv_put_scoped("z", "6", "S", &json!(1))
        .await
        .stale_scope("S", "6", "7");
}

#[tokio::test]
async fn invalid_batches_are_400_and_apply_nothing() {
    let app = spawn_app().await;
    let too_many: Vec<Value> = (0..1001).map(|i| put(&format!("m{i}"), json!(i))).collect();
    // invalid-json: the body does not parse into the batch shape (serde); invalid-batch: it
    // parses, and the batch rules (op count, op names, a put's value) refuse it.
    let cases = [
        ("empty ops", json!({"ops": []}), "invalid-batch"),
        ("1001 ops", json!({"ops": too_many}), "invalid-batch"),
        (
            "unknown op",
            json!({"ops": [put("a", json!(1)), {"op": "frobnicate", "key": "b"}]}),
            "invalid-batch",
        ),
        (
            "put without value",
            json!({"ops": [put("a", json!(1)), {"op": "put", "key": "b"}]}),
            "invalid-batch",
        ),
        (
            "op without key",
            json!({"ops": [put("a", json!(1)), {"op": "delete"}]}),
            "invalid-json",
        ),
        (
            "ops missing",
            json!({"operations": [put("a", json!(1))]}),
            "invalid-json",
        ),
        (
            "ops not an array",
            json!({"ops": put("a", json!(1))}),
            "invalid-json",
        ),
        (
            "body not an object",
            json!([put("a", json!(1))]),
            "invalid-json",
        ),
    ];
    for (what, body, slug) in cases {
        let r = app.batch(Some("1"), None, &body).await;
        assert_eq!(r.status, 400, "{what}: {r:?}");
        r.problem(400, slug);
    }
    app.assert_absent("a").await;
    app.assert_absent("m0").await;
}

#[tokio::test]
async fn a_bad_key_in_a_batch_is_400_and_applies_nothing() {
    let app = spawn_app().await;
    let long = "k".repeat(513);
    for bad in ["", "a\u{0}b", "line\nbreak", long.as_str()] {
        let r = app
            .batch(
                Some("1"),
                None,
                &json!({"ops": [put("a", json!(1)), put(bad, json!(2))]}),
            )
            .await;
        // A batch names the op in its detail ("ops[1]: ..."): invalid-batch, not invalid-key.
        r.problem(400, "invalid-batch");
    }
    app.assert_absent("a").await;
}

#[tokio::test]
async fn batch_of_exactly_max_ops_is_accepted() {
    let app = spawn_app().await;
    let ops: Vec<Value> = (0..1000).map(|i| put(&format!("m{i}"), json!(i))).collect();
    let body = app
        .batch(Some("1"), None, &json!({"ops": ops}))
        .await
        .expect(200);
    assert_eq!(
        body["results"].as_array().map(Vec::len),
        Some(1000),
        "results length"
    );
    app.assert_value("m999", &json!(999), "1").await;
}

#[tokio::test]
async fn max_batch_ops_is_configurable() {
    let app = spawn_app_with(|s| s.kv.max_batch_ops = 2).await;
    app.batch(
        Some("1"),
        None,
        &json!({"ops": [put("a", json!(1)), put("b", json!(2))]}),
    )
    .await
    .expect(200);
    let r = app
        .batch(
            Some("1"),
            None,
            &json!({"ops": [put("c", json!(1)), put("d", json!(2)), put("e", json!(3))]}),
        )
        .await;
    r.problem(400, "invalid-batch");
    app.assert_absent("c").await;
}

#[tokio::test]
async fn batch_without_token_is_428() {
    let app = spawn_app().await;
    app.batch(None, None, &json!({"ops": [put("a", json!(1))]}))
        .await
        .problem(428, "missing-token");
    app.assert_absent("a").await;
}

#[tokio::test]
async fn the_same_key_twice_last_op_wins() {
    let app = spawn_app().await;
    app.batch(
        Some("5"),
        None,
        &json!({"ops": [put("k", json!("first")), put("k", json!("second"))]}),
    )
    .await
    .expect(200);
    app.assert_value("k", &json!("second"), "5").await;

    app.batch(
        Some("6"),
        None,
        &json!({"ops": [put("k", json!("third")), del("k")]}),
    )
    .await
    .expect(200);
    app.assert_absent("k").await;

    app.batch(
        Some("7"),
        None,
        &json!({"ops": [del("k"), put("k", json!("fourth"))]}),
    )
    .await
    .expect(200);
    app.assert_value("k", &json!("fourth"), "7").await;
}

#[tokio::test]
async fn a_null_value_is_a_value() {
    let app = spawn_app().await;
    app.batch(Some("1"), None, &json!({"ops": [put("n", Value::Null)]}))
        .await
        .expect(200);
    app.assert_value("n", &Value::Null, "1").await;
}

#[tokio::test]
async fn equal_token_batch_is_accepted_and_strict_rejects_it() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!(1)).await.expect(201);
    app.batch(Some("5"), None, &json!({"ops": [put("k", json!(2))]}))
        .await
        .expect(200);

    let strict = spawn_app_with(|s| s.kv.strict = true).await;
    strict.kv_put("k", "5", &json!(1)).await.expect(201);
    strict
        .batch(
            Some("5"),
            None,
            &json!({"ops": [put("k", json!(2)), put("other", json!(3))]}),
        )
        .await
        .stale_key("k", "5", "5");
    strict.assert_value("k", &json!(1), "5").await;
    strict.assert_absent("other").await;
}
