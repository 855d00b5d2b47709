//! `GET /openapi.json` and `GET /docs` (docs/api.md; docs/wire.md): an OpenAPI 3.1
//! document that a real validator accepts, open like /healthz, whose every operation the
//! server really serves with a documented status; and a page that loads nothing from elsewhere.

use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Digest as _;

use crate::helpers::{spawn_app, spawn_app_with, TestApp};

/// Checks `doc` with the Python `openapi-spec-validator` (the reference validator of the
/// OpenAPI ecosystem); a missing validator is a failure that says how to install it.
fn validate(doc: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, doc).unwrap();
    let script = "import sys\n\
                  try:\n    from openapi_spec_validator import validate\n    from openapi_spec_validator.readers import read_from_filename\n\
                  except ImportError:\n    sys.exit(97)\n\
                  validate(read_from_filename(sys.argv[1])[0])\n";
    let out = std::process::Command::new("python3").args(["-c", script]).arg(&file).output().unwrap_or_else(|e| {
        panic!("cannot run python3 ({e}): install python3, then: pip install openapi-spec-validator")
    });
    assert_ne!(
        out.status.code(),
        Some(97),
        "install: pip install openapi-spec-validator"
    );
    assert!(
        out.status.success(),
        "openapi-spec-validator refused the document:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn document(app: &TestApp) -> (String, Value) {
    let resp = app.get("/openapi.json").await;
    assert_eq!(resp.status, 200, "{}", resp.text);
    assert!(resp
        .header("content-type")
        .unwrap_or("")
        .starts_with("application/json"));
    let doc = resp.json();
    (resp.text, doc)
}

#[tokio::test]
async fn the_document_is_valid_openapi_3_1() {
    let app = spawn_app().await;
    let (text, doc) = document(&app).await;
    assert!(
        doc["openapi"].as_str().unwrap_or("").starts_with("3.1."),
        "{}",
        doc["openapi"]
    );
    validate(&text);
    // The fencing headers are parameters of the writes.
    let put = &doc["paths"]["/v1/kv/{key}"]["put"];
    let names: Vec<&str> = put["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "key",
            "X-Fencing-Token",
            "X-Fencing-Scope",
            "X-Fencing-Proof",
            "Idempotency-Key"
        ],
        "{put}"
    );
    assert!(
        put["responses"]["412"]
            .to_string()
            .contains("https://fencegate.dev/problems/stale-token"),
        "{put}"
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// Every operation that takes an `Idempotency-Key` declares `Idempotent-Replayed` on each of
/// its 2xx answers, and no other operation does (docs/api.md, Idempotency-Key).
#[tokio::test]
async fn keyed_writes_declare_the_replayed_header() {
    let app = spawn_app().await;
    let (_, doc) = document(&app).await;
    let mut keyed = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let takes_key = op["parameters"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header")
            });
            for (status, response) in op["responses"].as_object().unwrap() {
                let declared = response["headers"].get("Idempotent-Replayed").is_some();
                let want = takes_key && status.starts_with('2');
                assert_eq!(declared, want, "{method} {path} {status}: {response}");
            }
            if takes_key {
                keyed.push(format!("{method} {path}"));
            }
        }
    }
    keyed.sort();
    assert_eq!(
        keyed,
        [
            "delete /v1/kv/{key}",
            "delete /v1/tables/{resource}/{key}",
            "patch /v1/tables/{resource}/{key}",
            "post /v1/batch",
            "post /v1/fences/{scope}",
            "put /v1/kv/{key}",
            "put /v1/tables/{resource}/{key}",
        ],
        "the routes that take an Idempotency-Key (docs/api.md)"
    );
}

/// Every documented operation is routed (not the fallback, not 405) and answers, even to a
/// request with nothing in it, a status its operation documents.
#[tokio::test]
async fn every_documented_operation_is_served_with_a_documented_status() {
    let app = spawn_app().await;
    let (_, doc) = document(&app).await;
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{key}", "k")
            .replace("{scope}", "s")
            .replace("{name}", "n")
            .replace("{resource}", "r");
        for (method, op) in item.as_object().unwrap() {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            operations += 1;
            let documented: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
            if op["responses"]["200"]["content"]
                .get("text/event-stream")
                .is_some()
            {
                // A stream does not end: its status and content type are what can be checked.
                let resp = app
                    .req(method.clone(), &concrete)
                    .send()
                    .await
                    .expect("the stream answers");
                assert_eq!(resp.status(), 200, "{method} {concrete}");
                assert!(
                    resp.headers()[reqwest::header::CONTENT_TYPE]
                        .to_str()
                        .unwrap()
                        .starts_with("text/event-stream"),
                    "{method} {concrete}: {:?}",
                    resp.headers()
                );
                continue;
            }
            let resp = app.send(app.req(method.clone(), &concrete)).await;
            assert!(
                documented.contains(&&resp.status.to_string()),
                "{method} {concrete} answered {} which {path} does not document ({documented:?}): {}",
                resp.status,
                resp.text
            );
            assert!(
                !resp.text.contains("no such endpoint"),
                "{method} {concrete} is not routed: {}",
                resp.text
            );
            assert_ne!(resp.status, 405, "{method} {concrete}");
        }
    }
    assert!(operations >= 20, "only {operations} operations documented");
}

#[tokio::test]
async fn the_document_and_the_page_are_open_like_healthz() {
    let secret = fencegate::auth::new_key().unwrap();
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![fencegate::auth::ApiKeySettings {
            name: "reader".into(),
            sha256: fencegate::auth::digest_hex(&secret),
            rights: vec!["read".into()],
            prefixes: vec![],
            tables: vec![],
        }];
    })
    .await;
    assert_eq!(app.get("/v1/kv/k").await.status, 401, "auth is on");
    document(&app).await;
    assert_eq!(app.get("/docs").await.status, 200);
}

#[tokio::test]
async fn the_page_loads_nothing_from_elsewhere() {
    let app = spawn_app().await;
    let resp = app.get("/docs").await;
    assert_eq!(resp.status, 200);
    assert!(resp
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/html"));
    let page = &resp.text;
    for external in ["http://", "https://", "src=\"//", "href=\"//", "@import"] {
        assert!(!page.contains(external), "the page refers to {external}...");
    }
    assert!(
        page.contains("openapi.json"),
        "the page renders /openapi.json"
    );
    // The policy forbids everything but the page's own inline script and style (by hash) and
    // fetching from this server; the hashes must be those of what the page holds, or a browser
    // would run nothing.
    let csp = resp
        .header("content-security-policy")
        .expect("a Content-Security-Policy")
        .to_owned();
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    let inline = |open: &str, close: &str| {
        let start = page.find(open).unwrap_or_else(|| panic!("no {open}")) + open.len();
        let end = start + page[start..].find(close).unwrap();
        base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(&page.as_bytes()[start..end]))
    };
    assert!(
        csp.contains(&format!(
            "script-src 'sha256-{}'",
            inline("<script>", "</script>")
        )),
        "{csp}"
    );
    assert!(
        csp.contains(&format!(
            "style-src 'sha256-{}'",
            inline("<style>", "</style>")
        )),
        "{csp}"
    );
    assert_eq!(page.matches("<script").count(), 1, "one script, inline");
}

/// Which of `samples` Python's `re` (what schemathesis generates from) finds matching `pattern`.
fn python_matches(pattern: &str, samples: &[String]) -> Vec<bool> {
    let input = serde_json::to_string(&json!({"pattern": pattern, "samples": samples})).unwrap();
    let script = "import json, re, sys\n\
                  d = json.load(sys.stdin)\n\
                  print(json.dumps([re.search(d['pattern'], s) is not None for s in d['samples']]))\n";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (install python3)");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 failed on {pattern}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The patterns the document states are the server's validators, sample by sample: what a
/// pattern allows, the validator takes, and what it forbids, the validator refuses.
#[tokio::test]
async fn the_documents_patterns_are_the_validators() {
    let app = spawn_app().await;
    let (_, doc) = document(&app).await;
    let put = &doc["paths"]["/v1/kv/{key}"]["put"]["parameters"];
    let param = |name: &str| {
        put.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no parameter {name}: {put}"))["schema"]["pattern"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let check = |what: &str, pattern: &str, samples: &[&str], valid: &dyn Fn(&str) -> bool| {
        let samples: Vec<String> = samples.iter().map(|s| s.to_string()).collect();
        for (sample, matched) in samples.iter().zip(python_matches(pattern, &samples)) {
            assert_eq!(
                matched,
                valid(sample),
                "{what}: {sample:?} matches the document's pattern: {matched}"
            );
        }
    };
    check(
        "a token",
        &param("X-Fencing-Token"),
        &[
            "0",
            "1",
            "9",
            "10",
            "01",
            "00",
            "",
            "-1",
            "+1",
            "1 ",
            "999999999999999999",
            "1000000000000000000",
            "8999999999999999999",
            "9223372036854765807",
            "9223372036854775799",
            "9223372036854775806",
            "9223372036854775807",
            "9223372036854775808",
            "9223372036854775810",
            "9300000000000000000",
            "9999999999999999999",
            "10000000000000000000",
        ],
        &|s| fencegate::fence::FencingToken::parse(s.as_bytes()).is_ok(),
    );
    check(
        "a key",
        &param("key"),
        &[
            "a",
            "a/b ✓ 日本",
            " ",
            "a\u{a0}b",
            "",
            "a\0b",
            "a\nb",
            "a\u{7f}",
            "a\u{85}",
            "\u{9f}",
        ],
        &|s| fencegate::fence::Key::parse(s, 512).is_ok(),
    );
    check(
        "a scope header",
        &param("X-Fencing-Scope"),
        &[
            "a",
            "a b",
            "caf%C3%A9",
            "%20a",
            "%e2%9c%93",
            "%F0%9F%98%80",
            "x%7e",
            "",
            " a",
            "a ",
            "%",
            "%2",
            "%zz",
            "%00",
            "%7F",
            "%C2%85",
            "%C3",
            "%ED%A0%80",
            "é",
            "a%0A",
        ],
        // As sent: HTTP trims white space at the ends, then the value is percent-decoded.
        &|s| {
            s.trim() == s
                && s.is_ascii()
                && fencegate::percent::decode_strict(s.as_bytes())
                    .is_ok_and(|text| fencegate::fence::Scope::parse(&text, 512).is_ok())
        },
    );
    let reason = doc["components"]["schemas"]["RetireRequest"]["properties"]["reason"]["pattern"]
        .as_str()
        .unwrap()
        .to_owned();
    check(
        "a reason",
        &reason,
        &[
            "why",
            " why ",
            "a b",
            "\u{3000}x",
            "\u{feff}",
            " ",
            "\u{3000}",
            "\u{2003} ",
            "",
            "a\tb",
            "a\u{85}",
        ],
        &|s| fencegate::store::admin::validate_reason(s).is_ok(),
    );
}
