//! Unscoped key-value writes: each key is its own fence; deletes leave a tombstone.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{enc, kv, spawn_app, spawn_app_with, unique, TOKEN};

#[tokio::test]
async fn put_creates_then_updates_with_a_version_bump() {
    let app = spawn_app().await;
    let created = app.kv_put("k", "7", &json!({"a": 1})).await.expect(201);
    assert_eq!(created["key"], json!("k"), "{created}");
    assert_eq!(created["fence_token"], json!("7"), "{created}");
    assert_eq!(created["scope"], Value::Null, "{created}");
    let v1 = created["version"]
        .as_i64()
        .unwrap_or_else(|| panic!("version not an integer: {created}"));

    let updated = app.kv_put("k", "8", &json!({"a": 2})).await.expect(200);
    assert_eq!(updated["fence_token"], json!("8"), "{updated}");
    let v2 = updated["version"]
        .as_i64()
        .unwrap_or_else(|| panic!("version not an integer: {updated}"));
    assert!(v2 > v1, "version must increase on update: {v1} -> {v2}");
    app.assert_value("k", &json!({"a": 2}), "8").await;
}

#[tokio::test]
async fn get_returns_value_fence_token_and_header() {
    let app = spawn_app().await;
    app.kv_put("k", "42", &json!([1, "two"])).await.expect(201);
    let r = app.kv_get("k").await;
    let body = r.expect(200);
    assert_eq!(body["key"], json!("k"), "{body}");
    assert_eq!(body["value"], json!([1, "two"]), "{body}");
    assert_eq!(body["fence_token"], json!("42"), "{body}");
    assert_eq!(body["scope"], Value::Null, "{body}");
    assert!(body["version"].is_i64(), "{body}");
    let ts = body["updated_at"]
        .as_str()
        .unwrap_or_else(|| panic!("updated_at: {body}"));
    assert!(
        ts.len() >= 20 && ts.as_bytes()[10] == b'T',
        "updated_at is not RFC 3339: {ts}"
    );
    assert_eq!(r.header("x-fencing-token"), Some("42"), "{r:?}");
}

#[tokio::test]
async fn get_absent_key_is_404_problem() {
    let app = spawn_app().await;
    app.kv_get("never").await.problem(404, "not-found");
}

#[tokio::test]
async fn equal_token_is_accepted() {
    let app = spawn_app().await;
    app.kv_put("k", "10", &json!(1)).await.expect(201);
    app.kv_put("k", "10", &json!(2)).await.expect(200);
    app.kv_put("k", "10", &json!(3)).await.expect(200);
    app.assert_value("k", &json!(3), "10").await;
}

#[tokio::test]
async fn lower_token_is_412_and_changes_nothing() {
    let app = spawn_app().await;
    app.kv_put("k", "7", &json!("holder")).await.expect(201);
    app.kv_put("k", "5", &json!("zombie"))
        .await
        .stale_key("k", "5", "7");
    app.assert_value("k", &json!("holder"), "7").await;
}

#[tokio::test]
async fn higher_token_is_accepted_and_raises_the_fence() {
    let app = spawn_app().await;
    app.kv_put("k", "7", &json!(1)).await.expect(201);
    app.kv_put("k", "100", &json!(2)).await.expect(200);
    app.kv_put("k", "99", &json!(3))
        .await
        .stale_key("k", "99", "100");
    app.assert_value("k", &json!(2), "100").await;
}

#[tokio::test]
async fn fences_are_per_key() {
    let app = spawn_app().await;
    app.kv_put("a", "100", &json!(1)).await.expect(201);
    app.kv_put("b", "1", &json!(2)).await.expect(201);
    app.assert_value("b", &json!(2), "1").await;
}

#[tokio::test]
async fn delete_leaves_a_tombstone_that_keeps_the_fence() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("v")).await.expect(201);
    let body = app.kv_delete("k", "9").await.expect(200);
    assert_eq!(body["key"], json!("k"), "{body}");
    assert_eq!(body["fence_token"], json!("9"), "{body}");
    assert_eq!(body["scope"], Value::Null, "{body}");
    assert_eq!(body["deleted"], json!(true), "{body}");
    app.assert_absent("k").await;

    app.kv_put("k", "8", &json!("zombie"))
        .await
        .stale_key("k", "8", "9");
    app.assert_absent("k").await;

    // Re-creating a tombstoned key is a create: 201.
    app.kv_put("k", "9", &json!("back")).await.expect(201);
    app.assert_value("k", &json!("back"), "9").await;
}

#[tokio::test]
async fn delete_with_lower_token_is_412_and_keeps_the_value() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("v")).await.expect(201);
    app.kv_delete("k", "4").await.stale_key("k", "4", "5");
    app.assert_value("k", &json!("v"), "5").await;
}

#[tokio::test]
async fn delete_of_a_never_written_key_fences_later_writes() {
    let app = spawn_app().await;
    let body = app.kv_delete("ghost", "20").await.expect(200);
    assert_eq!(body["deleted"], json!(true), "{body}");
    assert_eq!(body["fence_token"], json!("20"), "{body}");
    app.assert_absent("ghost").await;
    app.kv_put("ghost", "19", &json!("zombie"))
        .await
        .stale_key("ghost", "19", "20");
    app.assert_absent("ghost").await;
    app.kv_put("ghost", "20", &json!("holder"))
        .await
        .expect(201);
}

#[tokio::test]
async fn strict_mode_rejects_equal_and_accepts_greater() {
    let app = spawn_app_with(|s| s.kv.strict = true).await;
    app.kv_put("k", "10", &json!(1)).await.expect(201);
    app.kv_put("k", "10", &json!(2))
        .await
        .stale_key("k", "10", "10");
    app.kv_put("k", "9", &json!(3))
        .await
        .stale_key("k", "9", "10");
    app.kv_put("k", "11", &json!(4)).await.expect(200);
    app.assert_value("k", &json!(4), "11").await;
}

#[tokio::test]
async fn strict_mode_applies_to_deletes() {
    let app = spawn_app_with(|s| s.kv.strict = true).await;
    app.kv_put("k", "10", &json!(1)).await.expect(201);
    app.kv_delete("k", "10").await.stale_key("k", "10", "10");
    app.assert_value("k", &json!(1), "10").await;
    app.kv_delete("k", "11").await.expect(200);
    app.assert_absent("k").await;
}

#[tokio::test]
async fn percent_encoded_keys_round_trip_as_distinct_keys() {
    let app = spawn_app().await;
    let japanese = enc("日本語のキー");
    // (path segment as sent, decoded key)
    let keys = [
        ("a%2Fb", "a/b"),
        ("a", "a"),
        ("b", "b"),
        ("%20x", " x"),
        ("x", "x"),
        ("%E2%9C%93", "✓"),
        (japanese.as_str(), "日本語のキー"),
        ("a%3Fb%23c", "a?b#c"),
        ("100%25", "100%"),
    ];
    for (i, (seg, _)) in keys.iter().enumerate() {
        app.kv_put(seg, "1", &json!(i)).await.expect(201);
    }
    for (i, (seg, key)) in keys.iter().enumerate() {
        let body = app.kv_get(seg).await.expect(200);
        assert_eq!(body["key"], json!(key), "GET {seg}: {body}");
        assert_eq!(body["value"], json!(i), "GET {seg}: {body}");
    }
    // The same text, whichever way it is percent-encoded, is the same key.
    let body = app.kv_get("%61%2F%62").await.expect(200);
    assert_eq!(body["key"], json!("a/b"), "{body}");
}

#[tokio::test]
async fn key_of_512_bytes_is_valid_and_513_is_not() {
    let app = spawn_app().await;
    let ok = "k".repeat(512);
    app.kv_put(&ok, "1", &json!(1)).await.expect(201);
    app.assert_value(&ok, &json!(1), "1").await;

    let long = "k".repeat(513);
    app.kv_put(&long, "1", &json!(1))
        .await
        .problem(400, "invalid-key");
    // Bytes, not characters: 171 x "✓" (3 bytes each) is 513 bytes.
    let wide = enc(&"✓".repeat(171));
    app.kv_put(&wide, "1", &json!(1))
        .await
        .problem(400, "invalid-key");
    let wide_ok = enc(&"✓".repeat(170));
    app.kv_put(&wide_ok, "1", &json!(1)).await.expect(201);
}

#[tokio::test]
async fn max_key_bytes_is_configurable() {
    let app = spawn_app_with(|s| s.kv.max_key_bytes = 8).await;
    app.kv_put("12345678", "1", &json!(1)).await.expect(201);
    app.kv_put("123456789", "1", &json!(1))
        .await
        .problem(400, "invalid-key");
}

#[tokio::test]
async fn control_characters_and_invalid_utf8_are_invalid_keys() {
    let app = spawn_app().await;
    for seg in [
        "%00", "a%00b", "%0A", "a%0Db", "%1F", "%7F", "a%09b", "%FF", "%C3%28",
    ] {
        app.kv_put(seg, "1", &json!(1))
            .await
            .problem(400, "invalid-key");
        app.kv_get(seg).await.problem(400, "invalid-key");
        app.kv_delete(seg, "1").await.problem(400, "invalid-key");
    }
}

#[tokio::test]
async fn any_json_value_is_stored_as_is() {
    let app = spawn_app().await;
    let values = [
        json!({"name": "x", "n": 1}),
        json!([1, 2, 3]),
        json!("just a string"),
        json!(42),
        json!(-1.5),
        json!(true),
        json!(null),
        json!({"deep": {"list": [{"a": [null, {"b": "ü"}]}], "empty": {}, "e": []}}),
    ];
    for (i, v) in values.iter().enumerate() {
        let key = format!("v{i}");
        app.kv_put(&key, "1", v).await.expect(201);
        // A stored JSON null is a present value: 200 with "value": null, not a 404.
        app.assert_value(&key, v, "1").await;
    }
}

#[tokio::test]
async fn large_integers_in_the_value_do_not_break_the_server() {
    let app = spawn_app().await;
    for (i, raw) in [
        r#"{"n":12345678901234567890}"#,
        r#"{"n":123456789012345678901234567890}"#,
        "9223372036854775808",
        "-9223372036854775809",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("big{i}");
        let r = app
            .send(
                app.req(Method::PUT, &kv(&key))
                    .header(TOKEN, "1")
                    .header("content-type", "application/json")
                    .body(raw.to_string()),
            )
            .await;
        assert!(
            r.status < 500,
            "a big integer in the value caused a server error: {r:?}"
        );
        if r.status == 201 {
            let got = app.kv_get(&key).await.expect(200);
            assert!(!got["value"].is_null(), "stored value lost: {got}");
        }
    }
}

#[tokio::test]
async fn strings_with_nul_and_unusual_escapes_are_values_like_any_other() {
    // "\u0000" is valid JSON. Whatever the store's encoding, a client gets its value back
    // (or at worst a 4xx saying why), never a 5xx.
    let app = spawn_app().await;
    let values = [
        json!({"s": "nul\u{0}inside"}),
        json!("\u{0}"),
        json!({"k\u{0}ey": 1}),
        json!("\u{1F600} \u{FEFF} \\ \" \n"),
    ];
    for (i, v) in values.iter().enumerate() {
        let key = format!("esc{i}");
        let r = app.kv_put(&key, "1", v).await;
        assert!(
            r.status < 500,
            "a valid JSON value caused a server error: {r:?}"
        );
        if r.status == 201 {
            app.assert_value(&key, v, "1").await;
        } else {
            r.assert_problem_shape();
            app.assert_absent(&key).await;
        }
    }
}

/// The value's text goes to the database as sent, so every escape the database would refuse
/// is refused here first, with a 400 that names it: a NUL however it is spelled, and a UTF-16
/// surrogate escape that is not half of a pair. An escaped backslash before `u0000` is just
/// text, and a pair is one character.
#[tokio::test]
async fn escapes_are_checked_in_the_text_as_sent() {
    let app = spawn_app().await;
    for (i, body) in [
        r#"{"s": "a\u0000b"}"#,
        r#"["\u0000"]"#,
        r#"{"\u0000": 1}"#,
        r#""\uD83D""#,
        r#"{"s": "\uDE00 after"}"#,
        r#"{"s": "\ud83d\u0041"}"#,
    ]
    .into_iter()
    .enumerate()
    {
        let key = unique(&format!("refused{i}"));
        let r = app.kv_put_text(&key, "1", body).await;
        assert_eq!(r.status, 400, "{body}: {r:?}");
        let problem = r.assert_problem_shape();
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(r"\u0000") || detail.contains("surrogate"),
            "{body}: the problem does not say what is wrong: {problem}"
        );
        app.assert_absent(&key).await;
    }
    for (i, (body, want)) in [
        (r#"{"s": "\\u0000"}"#, json!({"s": "\\u0000"})),
        (r#""\uD83D\uDE00 \u00E9\/""#, json!("\u{1F600} é/")),
        (r#"  {"s" : [1 ,2] }  "#, json!({"s": [1, 2]})),
    ]
    .into_iter()
    .enumerate()
    {
        let key = unique(&format!("kept{i}"));
        let r = app.kv_put_text(&key, "1", body).await;
        assert_eq!(r.status, 201, "{body}: {r:?}");
        app.assert_value(&key, &want, "1").await;
    }
    // In a batch: refused with the op's index, and nothing of the batch applied.
    batch_refuses_its_second_value(&app, r#""\udc00""#).await;
}

/// A batch whose second put carries `value` (JSON text) is refused naming `ops[1]`, and its
/// first put, a plain `1`, is not applied either.
async fn batch_refuses_its_second_value(app: &crate::helpers::TestApp, value: &str) {
    let (ok, bad) = (unique("batch-ok"), unique("batch-bad"));
    let body = format!(
        r#"{{"ops": [{{"op": "put", "key": "{ok}", "value": 1}}, {{"op": "put", "key": "{bad}", "value": {value}}}]}}"#
    );
    let r = app.batch_raw("1", &body).await;
    assert_eq!(r.status, 400, "{r:?}");
    let problem = r.assert_problem_shape();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("ops[1]"),
        "{problem}"
    );
    app.assert_absent(&ok).await;
    app.assert_absent(&bad).await;
}

/// A value nested deeper than a read can parse is refused before it is stored (it could never
/// be read back), and one at the limit is stored and read back whole; in a batch as alone.
#[tokio::test]
async fn values_nested_deeper_than_a_read_can_parse_are_refused() {
    let app = spawn_app().await;
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let deepest = unique("deepest");
    app.kv_put_text(&deepest, "1", nested(127))
        .await
        .expect(201);
    // Read as text: the answer wraps the value one level deeper than serde_json would parse.
    let got = app.req(Method::GET, &kv(&deepest)).send().await.unwrap();
    assert_eq!(got.status(), 200);
    let got = got.text().await.unwrap();
    assert!(got.contains(&format!("\"value\":{}", nested(127))), "{got}");
    for depth in [128, 100_000] {
        let key = unique("too-deep");
        let r = app.kv_put_text(&key, "1", nested(depth)).await;
        let problem = r.problem(400, "invalid-json");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("127"),
            "{problem}"
        );
        app.assert_absent(&key).await;
    }
    batch_refuses_its_second_value(&app, &nested(128)).await;
}

/// Numbers in values are kept digit for digit, beyond i64/u64/f64: a proxy must not round
/// what it stores (JSON parsers that go through f64 would turn these into approximations).
#[tokio::test]
async fn numbers_in_values_round_trip_exactly() {
    let app = crate::helpers::spawn_app().await;
    let key = crate::helpers::unique("big");
    let body = r#"{"n":123456789012345678901234567890,"u":18446744073709551616,"f":0.1000000000000000055511151231257827,"neg":-9223372036854775809}"#;
    let resp = app
        .send(
            app.req(reqwest::Method::PUT, &crate::helpers::kv(&key))
                .header(crate::helpers::TOKEN, "1")
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
    resp.expect(201);
    let got = app.kv_get(&key).await;
    got.expect(200);
    for digits in [
        "123456789012345678901234567890",
        "18446744073709551616",
        "0.1000000000000000055511151231257827",
        "-9223372036854775809",
    ] {
        assert!(
            got.text.contains(digits),
            "{digits} was not kept exactly: {}",
            got.text
        );
    }
}

/// Many GETs at once. On PostgreSQL, reads that wait together are coalesced into one
/// `SELECT .. WHERE key = ANY(..)`: each must still get exactly its own key's value, a deleted
/// or never-written key a 404, and a key read by many at once the same value for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reads_each_get_their_own_key() {
    let app = std::sync::Arc::new(spawn_app().await);
    let live: Vec<String> = (0..16)
        .map(|i| crate::helpers::unique(&format!("live{i}")))
        .collect();
    for (i, key) in live.iter().enumerate() {
        app.kv_put(key, "1", &json!({"i": i})).await.expect(201);
    }
    let gone = crate::helpers::unique("gone");
    app.kv_put(&gone, "1", &json!("soon deleted"))
        .await
        .expect(201);
    app.kv_delete(&gone, "2").await.expect(200);
    let never = crate::helpers::unique("never");

    let mut reads = Vec::new();
    for _ in 0..8 {
        for (i, key) in live
            .iter()
            .enumerate()
            .chain([(0, &live[0]), (0, &live[0])])
        {
            let (app, key) = (app.clone(), key.clone());
            reads.push(tokio::spawn(async move {
                let body = app.kv_get(&key).await.expect(200);
                assert_eq!(body["key"], json!(key), "{body}");
                assert_eq!(
                    body["value"],
                    json!({"i": i}),
                    "{key} got another key's value: {body}"
                );
            }));
        }
        for key in [&gone, &never] {
            let (app, key) = (app.clone(), key.clone());
            reads.push(tokio::spawn(async move { app.assert_absent(&key).await }));
        }
    }
    for read in reads {
        read.await.expect("read task");
    }
}

/// Finding 5 of issue 14: `1e999999` is valid JSON that PostgreSQL's jsonb cannot store (and
/// that SQLite would store as text, to be printed as a million digits by PostgreSQL after a
/// migration). It is refused at the edge (`kv.max_number_digits`) on every backend, alone or
/// amid 20 concurrent good writes that the coalescer would otherwise have combined with it
/// into one statement (then retried one by one), and in a batch nothing is applied.
#[tokio::test]
async fn a_number_too_long_to_store_is_400_on_every_backend_and_does_not_fail_its_neighbours() {
    let app = std::sync::Arc::new(spawn_app().await);
    let put_raw = |app: std::sync::Arc<crate::helpers::TestApp>, key: String, raw: &'static str| async move {
        app.send(
            app.req(Method::PUT, &kv(&key))
                .header(TOKEN, "1")
                .header("content-type", "application/json")
                .body(raw),
        )
        .await
    };
    let alone = put_raw(app.clone(), "huge".into(), "1e999999").await;
    alone.problem(400, "invalid-json");
    app.assert_absent("huge").await;

    let mut writes = Vec::new();
    for i in 0..21 {
        let raw = if i == 10 {
            r#"{"n": 1e999999}"#
        } else {
            r#"{"n": 1}"#
        };
        writes.push(tokio::spawn(put_raw(app.clone(), format!("k{i}"), raw)));
    }
    for (i, write) in writes.into_iter().enumerate() {
        let resp = write.await.expect("write task");
        if i == 10 {
            let body = resp.problem(400, "invalid-json");
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .contains("max_number_digits"),
                "{body}"
            );
            app.assert_absent("k10").await;
        } else {
            resp.expect(201);
        }
    }

    let batch = app
        .batch(
            Some("2"),
            None,
            &json!({"ops": [{"op": "put", "key": "k0", "value": 2}]}),
        )
        .await;
    batch.expect(200);
    let refused = app
        .batch_raw("3", r#"{"ops":[{"op":"put","key":"k0","value":3},{"op":"put","key":"k1","value":1e999999}]}"#)
        .await;
    refused.problem(400, "invalid-json");
    app.assert_value("k0", &json!(2), "2").await;
}

/// Numbers each within `kv.max_number_digits` that all together read back far larger than they
/// were sent (the third attacker's pass: 1 MiB of `1e999` read back as 174 MB, and eight such
/// reads at once aborted the process): 400 at write time, on every backend, nothing stored.
#[tokio::test]
async fn a_value_that_would_read_back_far_larger_than_it_was_sent_is_400() {
    let app = spawn_app_with(|s| s.server.body_limit_bytes = 64 * 1024).await;
    let put_raw = |key: &str, raw: String| {
        app.req(Method::PUT, &kv(key))
            .header(TOKEN, "1")
            .header("content-type", "application/json")
            .body(raw)
    };
    // 66 × 995 bytes of growth > 64 KiB, from a 400-byte body.
    let numbers = |n: usize| format!("[{}]", vec!["1e999"; n].join(","));
    let body = app
        .send(put_raw("amp", numbers(66)))
        .await
        .problem(400, "invalid-json");
    assert!(
        body["detail"].as_str().unwrap().contains("read back"),
        "{body}"
    );
    app.assert_absent("amp").await;
    let batch = format!(
        r#"{{"ops":[{{"op":"put","key":"amp","value":{}}}]}}"#,
        numbers(66)
    );
    let r = app.send(
        app.req(Method::POST, "/v1/batch")
            .header(TOKEN, "1")
            .header("content-type", "application/json")
            .body(batch),
    );
    r.await.problem(400, "invalid-json");
    app.assert_absent("amp").await;
    // Up to the budget it is stored, and reads back within body limit + growth budget.
    app.send(put_raw("ok", numbers(65))).await.expect(201);
    let got = app.kv_get("ok").await;
    got.expect(200);
    assert!(
        got.text.len() < 2 * 64 * 1024,
        "read back {} bytes",
        got.text.len()
    );
}
