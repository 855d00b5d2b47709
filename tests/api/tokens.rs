//! `X-Fencing-Token` parsing: canonical decimals in 0..=i64::MAX only; missing is 428.

use reqwest::Method;
use serde_json::json;

use crate::helpers::{kv, spawn_app, TestApp, TOKEN};

/// PUT with raw token header values (each value is one header line).
async fn put_with_tokens(app: &TestApp, key: &str, tokens: &[&[u8]]) -> crate::helpers::Resp {
    let mut rb = app.req(Method::PUT, &kv(key)).json(&json!("new"));
    for t in tokens {
        rb = rb.header(TOKEN, reqwest::header::HeaderValue::from_bytes(t).unwrap());
    }
    app.send(rb).await
}

#[tokio::test]
async fn malformed_tokens_are_400_and_change_nothing() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("old")).await.expect(201);

    let malformed: &[&str] = &[
        "-1",
        "+1",
        "007",
        "00",
        "1 2",
        "1\t2",
        "0x10",
        "1e3",
        "1.0",
        "",
        "9223372036854775808",
        "18446744073709551616",
        "99999999999999999999999999",
        "abc",
        "5a",
        "１", // fullwidth digit one
        "٥",  // Arabic-Indic five
    ];
    for t in malformed {
        let r = put_with_tokens(&app, "k", &[t.as_bytes()]).await;
        r.problem(400, "malformed-token");
        // A brand-new key is not created by a malformed write either.
        put_with_tokens(&app, "fresh", &[t.as_bytes()])
            .await
            .problem(400, "malformed-token");
    }
    app.assert_value("k", &json!("old"), "5").await;
    app.assert_absent("fresh").await;
}

#[tokio::test]
async fn two_token_headers_are_malformed() {
    let app = spawn_app().await;
    put_with_tokens(&app, "k", &[b"5", b"5"])
        .await
        .problem(400, "malformed-token");
    put_with_tokens(&app, "k", &[b"5", b"6"])
        .await
        .problem(400, "malformed-token");
    app.assert_absent("k").await;
}

/// Every header a write reads once is refused when sent twice, whatever stands between the
/// two (here another header, so the values are not adjacent in the request), and the write
/// changes nothing.
#[tokio::test]
async fn every_fencing_header_sent_twice_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("old")).await.expect(201);
    let cases: [(&str, &str, u16, &str); 4] = [
        (TOKEN, "6", 400, "malformed-token"),
        ("X-Fencing-Scope", "s", 400, "invalid-scope"),
        ("X-Fencing-Proof", "c2ln", 422, "invalid-token-proof"),
        ("Idempotency-Key", "once", 400, "invalid-request"),
    ];
    for (name, value, status, slug) in cases {
        let mut rb = app.req(Method::PUT, &kv("k")).json(&json!("new"));
        if name != TOKEN {
            rb = rb.header(TOKEN, "6");
        }
        // The second copy in other letter case: header names are case-insensitive.
        rb = rb
            .header(name, value)
            .header("X-Between", "1")
            .header(name.to_ascii_lowercase(), value);
        let body = app.send(rb).await.problem(status, slug);
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("more than once"),
            "{name} twice: the problem says why: {detail}"
        );
    }
    app.assert_value("k", &json!("old"), "5").await;
}

#[tokio::test]
async fn missing_token_is_428_and_changes_nothing() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("old")).await.expect(201);

    let r = app
        .send(app.req(Method::PUT, "/v1/kv/k").json(&json!("new")))
        .await;
    r.problem(428, "missing-token");
    let r = app
        .send(app.req(Method::PUT, "/v1/kv/fresh").json(&json!("new")))
        .await;
    r.problem(428, "missing-token");
    let r = app.send(app.req(Method::DELETE, "/v1/kv/k")).await;
    r.problem(428, "missing-token");

    app.assert_value("k", &json!("old"), "5").await;
    app.assert_absent("fresh").await;
}

/// A token under a misspelled or look-alike name is no token: 428, as if it were missing, for a
/// key that exists and one that does not; nothing is written.
#[tokio::test]
async fn a_token_under_a_misspelled_header_is_missing_and_changes_nothing() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("old")).await.expect(201);
    for name in [
        "X-Fencing-Tokn",
        "Fencing-Token",
        "X-Fencing_Token",
        "X-Fence-Token",
    ] {
        for key in ["k", "never-written"] {
            let r = app
                .send(
                    app.req(Method::PUT, &kv(key))
                        .header(name, "9")
                        .json(&json!("new")),
                )
                .await;
            r.problem(428, "missing-token");
        }
    }
    app.assert_value("k", &json!("old"), "5").await;
    app.assert_absent("never-written").await;
}

#[tokio::test]
async fn zero_and_i64_max_are_accepted() {
    let app = spawn_app().await;
    let body = app.kv_put("zero", "0", &json!(0)).await.expect(201);
    assert_eq!(body["fence_token"], json!("0"), "{body}");

    let max = "9223372036854775807";
    let body = app.kv_put("max", max, &json!(1)).await.expect(201);
    assert_eq!(body["fence_token"], json!(max), "{body}");
    // Equal to the fence: accepted.
    app.kv_put("max", max, &json!(2)).await.expect(200);
    app.assert_value("max", &json!(2), max).await;
    let r = app.kv_get("max").await;
    assert_eq!(r.header("x-fencing-token"), Some(max), "{r:?}");
}

#[tokio::test]
async fn surrounding_whitespace_is_http_ows_not_part_of_the_token() {
    // RFC 9110 §5.5: whitespace around a field value is not part of it, and HTTP parsers strip
    // it before the application sees the header. So " 1" and "1 " either reach fencegate as
    // "1" (accepted, fence 1) or are refused as malformed; anything else (5xx, another token)
    // is wrong.
    let app = spawn_app().await;
    for (i, t) in [" 1", "1 ", "\t1"].iter().enumerate() {
        let key = format!("ws{i}");
        let r = put_with_tokens(&app, &key, &[t.as_bytes()]).await;
        if r.status == 400 {
            r.problem(400, "malformed-token");
            app.assert_absent(&key).await;
        } else {
            let body = r.expect(201);
            assert_eq!(body["fence_token"], json!("1"), "{body}");
        }
    }
}

#[tokio::test]
async fn malformed_token_on_delete_claim_and_batch_is_400() {
    let app = spawn_app().await;
    app.kv_put("k", "5", &json!("old")).await.expect(201);

    app.kv_delete("k", "-5")
        .await
        .problem(400, "malformed-token");
    app.claim("S", "0x1").await.problem(400, "malformed-token");
    app.batch(
        Some("1.5"),
        None,
        &json!({"ops":[{"op":"put","key":"b","value":1}]}),
    )
    .await
    .problem(400, "malformed-token");

    app.assert_value("k", &json!("old"), "5").await;
    app.fence("S").await.problem(404, "not-found");
    app.assert_absent("b").await;
}
