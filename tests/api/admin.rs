//! Recovery, audited (docs/security.md): `POST /v1/admin/.../reset` is the only way a fence goes
//! down; every reset is an audit row; every process serving the database honours it at once.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_on, spawn_binary, unique, Resp, TestApp, TOKEN};

async fn reset(app: &TestApp, path: &str, body: &Value) -> Resp {
    app.send(
        app.req(Method::POST, &format!("/v1/admin/{path}/reset"))
            .json(body),
    )
    .await
}

async fn acquire(app: &TestApp, name: &str) -> String {
    let r = app.send(
        app.req(Method::POST, &format!("/v1/locks/{name}"))
            .json(&json!({"owner": "w", "ttl_ms": 60_000})),
    );
    r.await.expect(201)["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_scope_fence_goes_down_only_by_an_audited_reset() {
    let app = spawn_app().await;
    let s = unique("poisoned");
    app.claim(&s, "9223372036854775807").await.expect(201);
    app.claim(&s, "50")
        .await
        .stale_scope(&s, "50", "9223372036854775807");

    let body = reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "10", "reason": "a client sent i64::MAX"}),
    )
    .await
    .expect(200);
    assert_eq!(body["target"], json!("scope"), "{body}");
    assert_eq!(body["name"], json!(s), "{body}");
    assert_eq!(
        (&body["from"], &body["to"]),
        (&json!("9223372036854775807"), &json!("10")),
        "{body}"
    );
    assert!(
        body["audit_id"]
            .as_str()
            .is_some_and(|id| id.parse::<i64>().is_ok()),
        "{body}"
    );
    // The same process forgot its cached fence: 50 is above 10 now.
    app.claim(&s, "50").await.expect(200);
    app.kv_put_scoped("k", "50", &s, &json!(1))
        .await
        .expect(201);

    // Not below the fence (equal, above), no reason, a reason too long, no fence, a bad token.
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "50", "reason": "x"}),
    )
    .await
    .problem(409, "reset-not-below");
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "51", "reason": "x"}),
    )
    .await
    .problem(409, "reset-not-below");
    reset(&app, &format!("fences/{s}"), &json!({"to": "1"}))
        .await
        .problem(400, "invalid-request");
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "1", "reason": ""}),
    )
    .await
    .problem(400, "invalid-request");
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "1", "reason": "x".repeat(1001)}),
    )
    .await
    .problem(400, "invalid-request");
    reset(&app, &format!("fences/{s}"), &json!({"reason": "no to"}))
        .await
        .problem(400, "invalid-request");
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": 1, "reason": "a number"}),
    )
    .await
    .problem(400, "invalid-json");
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "-1", "reason": "x"}),
    )
    .await
    .problem(400, "invalid-request");
    reset(
        &app,
        &format!("fences/{}", unique("nobody")),
        &json!({"to": "1", "reason": "x"}),
    )
    .await
    .problem(404, "not-found");
    assert_eq!(
        app.fence(&s).await.expect(200)["fence_token"],
        json!("50"),
        "refused resets changed nothing"
    );
}

#[tokio::test]
async fn a_lock_never_reissues_a_token_whatever_a_reset_did() {
    let app = spawn_app().await;
    let lock = unique("lock");
    let first = acquire(&app, &lock).await;
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{lock}"))
            .header(TOKEN, &first),
    )
    .await
    .expect(200);
    reset(
        &app,
        &format!("fences/{lock}"),
        &json!({"to": "0", "reason": "test"}),
    )
    .await
    .expect(200);
    let second = acquire(&app, &lock).await;
    assert!(
        second.parse::<i64>().unwrap() > first.parse::<i64>().unwrap(),
        "{first} then {second}"
    );
}

#[tokio::test]
async fn a_key_fence_goes_down_and_a_key_can_be_rebound() {
    let app = spawn_app().await;
    app.kv_put("k", "100", &json!("poisoned")).await.expect(201);
    app.kv_put("k", "6", &json!("x"))
        .await
        .stale_key("k", "6", "100");
    let body = reset(
        &app,
        "kv/k",
        &json!({"to": "5", "reason": "timestamp in ns"}),
    )
    .await
    .expect(200);
    assert_eq!(
        (&body["target"], &body["from"], &body["to"]),
        (&json!("key"), &json!("100"), &json!("5")),
        "{body}"
    );
    app.kv_put("k", "6", &json!("after")).await.expect(200);

    // Rebinding: the one way to move a key to another scope (or none).
    let s = unique("s");
    app.kv_put_scoped("b", "1", &s, &json!(1)).await.expect(201);
    app.kv_put("b", "1", &json!(2))
        .await
        .mismatch("b", Some(&s), None);
    let body = reset(
        &app,
        "kv/b",
        &json!({"scope": null, "reason": "the lock is gone"}),
    )
    .await
    .expect(200);
    assert_eq!(body["scope"], Value::Null, "{body}");
    assert_eq!(
        (&body["from"], &body["to"]),
        (&json!("0"), &json!("0")),
        "only the binding changed: {body}"
    );
    app.kv_put("b", "1", &json!(2)).await.expect(200);
    let t = unique("t");
    reset(
        &app,
        "kv/b",
        &json!({"scope": t, "reason": "moved to another lock"}),
    )
    .await
    .expect(200);
    app.kv_put("b", "2", &json!(3))
        .await
        .mismatch("b", Some(&t), None);
    app.kv_put_scoped("b", "1", &t, &json!(3)).await.expect(200);
    reset(&app, "kv/never", &json!({"to": "1", "reason": "x"}))
        .await
        .problem(404, "not-found");
    reset(&app, "kv/b", &json!({"reason": "nothing to do"}))
        .await
        .problem(400, "invalid-request");
}

#[tokio::test]
async fn the_audit_log_lists_every_reset_newest_first() {
    let app = spawn_app().await;
    let s = unique("s");
    app.claim(&s, "30").await.expect(201);
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "20", "reason": "first"}),
    )
    .await
    .expect(200);
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "10", "reason": "second"}),
    )
    .await
    .expect(200);
    app.kv_put("k", "7", &json!(1)).await.expect(201);
    reset(
        &app,
        "kv/k",
        &json!({"to": "3", "scope": "moved", "reason": "third"}),
    )
    .await
    .expect(200);
    reset(
        &app,
        &format!("fences/{s}"),
        &json!({"to": "99", "reason": "refused"}),
    )
    .await
    .problem(409, "reset-not-below");

    let body = app.get("/v1/admin/audit?limit=2").await.expect(200);
    let entries = body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{body}");
    let (third, second) = (&entries[0], &entries[1]);
    assert_eq!(
        (&third["reason"], &third["target"], &third["name"]),
        (&json!("third"), &json!("key"), &json!("k")),
        "{body}"
    );
    assert_eq!(
        (
            &third["from"],
            &third["to"],
            &third["from_scope"],
            &third["to_scope"]
        ),
        (&json!("7"), &json!("3"), &Value::Null, &json!("moved"))
    );
    assert_eq!(
        (&second["reason"], &second["from"], &second["to"]),
        (&json!("second"), &json!("20"), &json!("10")),
        "{body}"
    );
    for entry in entries {
        assert_eq!(
            (&entry["actor"], &entry["action"]),
            (&json!("anonymous"), &json!("reset")),
            "{entry}"
        );
        assert!(
            entry["at"]
                .as_str()
                .is_some_and(|at| at.ends_with('Z') && at.len() >= 20),
            "{entry}"
        );
    }
    assert!(
        third["id"].as_str().unwrap().parse::<i64>().unwrap()
            > second["id"].as_str().unwrap().parse::<i64>().unwrap()
    );
    let all = app.get("/v1/admin/audit").await.expect(200);
    assert_eq!(
        all["entries"].as_array().unwrap().len(),
        3,
        "the refused reset left no row: {all}"
    );
    app.get("/v1/admin/audit?limit=0")
        .await
        .problem(400, "invalid-request");
    app.get("/v1/admin/audit?limit=x")
        .await
        .problem(400, "invalid-request");
}

/// Two processes on one database, each with its reject-only cache: a reset made through one
/// must not leave the other refusing what the fence now admits.
#[tokio::test]
async fn a_reset_holds_in_every_process_at_once() {
    let db = crate::pg::fresh_database().await;
    let a = spawn_app_on(db.clone(), |_| {}).await;
    // A has migrated before B starts: SQLite has no advisory lock for two migrators at once.
    a.get("/readyz").await.expect(200);
    let b_process = spawn_binary(&db).await;
    let b = b_process.view();
    b.kv_put("k", "100", &json!("poisoned")).await.expect(201);
    b.kv_put("k", "50", &json!("x"))
        .await
        .stale_key("k", "50", "100"); // B's cache: k >= 100
                                      // On one SQLite file, B's own writes (the refusal just recorded) may make A's transaction
                                      // meet SQLITE_BUSY: a 503 that says to retry, which is what a client does.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = reset(&a, "kv/k", &json!({"to": "10", "reason": "two processes"})).await;
        if r.status != 503 || Instant::now() > deadline {
            r.expect(200);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = b
        .put_until_admitted(
            "k",
            "50",
            "100",
            Duration::from_secs(3),
            "process B still refuses",
        )
        .await;
    println!("process B honoured the reset after {took:?}");
}

/// `fencegate admin reset` does the same against the database itself, audited as `cli:$USER`,
/// and a running server honours it.
#[tokio::test]
async fn the_command_line_resets_against_the_database() {
    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    app.kv_put("k", "100", &json!("poisoned")).await.expect(201);
    app.kv_put("k", "50", &json!("x"))
        .await
        .stale_key("k", "50", "100");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args([
            "admin",
            "reset",
            "--key",
            "k",
            "--to",
            "10",
            "--reason",
            "from the shell",
            "--database-url",
            &db,
        ])
        .env("USER", "ops")
        .env_remove("FENCEGATE_CONFIG")
        .output()
        .await
        .expect("run fencegate admin reset");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        (&done["from"], &done["to"]),
        (&json!("100"), &json!("10")),
        "{done}"
    );
    app.put_until_admitted(
        "k",
        "50",
        "100",
        Duration::from_secs(3),
        "the server still refuses",
    )
    .await;
    let audit = app.get("/v1/admin/audit?limit=1").await.expect(200);
    assert_eq!(audit["entries"][0]["actor"], json!("cli:ops"), "{audit}");
    assert_eq!(
        audit["entries"][0]["reason"],
        json!("from the shell"),
        "{audit}"
    );

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .args([
            "admin",
            "reset",
            "--key",
            "k",
            "--to",
            "99",
            "--reason",
            "up?",
            "--database-url",
            &db,
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("below the current fence"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `[[scopes]]` binding added after keys were written: every write of the binding's lock
/// holder to them is 409 (they remember no scope), and the 409 says how out; one audited bulk
/// rebind moves them all, instead of a reset per key. A rebind against the configuration is 409.
#[tokio::test]
async fn keys_written_before_a_binding_are_rebound_in_bulk() {
    let db = crate::pg::fresh_database().await;
    let before = spawn_app_on(db.clone(), |_| {}).await;
    for key in ["invoice-1", "invoice-2", "other-1"] {
        before.kv_put(key, "5", &json!("old")).await.expect(201);
    }
    drop(before);
    let app = spawn_app_on(db, |s| {
        s.scopes = vec![fencegate::fence::ScopeBinding {
            name: "billing".into(),
            keys: vec!["invoice-".into()],
        }]
    })
    .await;
    let token = acquire(&app, "billing").await;
    let refused = app.kv_put("invoice-1", &token, &json!("new")).await;
    let body = refused.mismatch("invoice-1", None, Some("billing"));
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("/v1/admin/kv/rebind"),
        "{body}"
    );

    let rebind = |body: Value| app.req(Method::POST, "/v1/admin/kv/rebind").json(&body);
    for bad in [
        json!({"prefix": "invoice-", "reason": "no scope given"}),
        json!({"scope": "billing", "reason": "no prefix"}),
        json!({"prefix": "invoice-", "scope": "billing", "reason": "a\nb"}),
    ] {
        app.send(rebind(bad)).await.problem(400, "invalid-request");
    }
    for wrong in [json!("other"), Value::Null] {
        app.send(rebind(
            json!({"prefix": "invoice-", "scope": wrong, "reason": "x"}),
        ))
        .await
        .problem(409, "binding-conflict");
    }
    // "" covers the bound keys too: a rebind of everything to another scope contradicts them.
    app.send(rebind(
        json!({"prefix": "", "scope": "other", "reason": "x"}),
    ))
    .await
    .problem(409, "binding-conflict");

    let done = app
        .send(rebind(
            json!({"prefix": "invoice-", "scope": "billing", "reason": "binding added"}),
        ))
        .await
        .expect(200);
    assert_eq!(
        (
            &done["target"],
            &done["prefix"],
            &done["scope"],
            &done["rebound"]
        ),
        (
            &json!("kv"),
            &json!("invoice-"),
            &json!("billing"),
            &json!(2)
        ),
        "{done}"
    );
    let audit = app.get("/v1/admin/audit?limit=1").await.expect(200);
    assert_eq!(
        (
            &audit["entries"][0]["action"],
            &audit["entries"][0]["to_scope"]
        ),
        (&json!("rebind"), &json!("billing")),
        "{audit}"
    );
    app.kv_put("invoice-1", &token, &json!("new"))
        .await
        .expect(200);
    app.kv_put("invoice-2", &token, &json!("new"))
        .await
        .expect(200);
    // Untouched: a key outside the prefix still remembers no scope.
    app.kv_put("other-1", "6", &json!("unscoped"))
        .await
        .expect(200);
    // Again: nothing left to rebind.
    let again = app
        .send(rebind(
            json!({"prefix": "invoice-", "scope": "billing", "reason": "again"}),
        ))
        .await
        .expect(200);
    assert_eq!(again["rebound"], json!(0));
}

/// `fencegate admin rebind` does the bulk rebind against the database itself, audited.
#[tokio::test]
async fn the_command_line_rebinds_a_prefix() {
    let db = crate::pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    app.kv_put("job-1", "3", &json!(1)).await.expect(201);
    let run = |args: &[&str]| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["admin", "rebind"])
            .args(args)
            .args(["--database-url", &db])
            .env("USER", "ops")
            .env_remove("FENCEGATE_CONFIG")
            .output()
    };
    let out = run(&[
        "--prefix",
        "job-",
        "--bind",
        "jobs",
        "--reason",
        "moved under the jobs lock",
    ])
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(
        (&done["rebound"], &done["scope"]),
        (&json!(1), &json!("jobs")),
        "{done}"
    );
    app.kv_put("job-1", "4", &json!(2))
        .await
        .mismatch("job-1", Some("jobs"), None);
    app.kv_put_scoped("job-1", "4", "jobs", &json!(2))
        .await
        .expect(200);
    let out = run(&["--prefix", "job-", "--reason", "where to?"])
        .await
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--unbind"));
}

/// Commands that work on a database refuse to run with none configured (they would create an
/// empty SQLite file wherever they run and report on it); client commands show only their own
/// flags; a malformed token is bad usage (exit 2).
#[tokio::test]
async fn database_commands_need_a_database_and_client_commands_show_only_their_flags() {
    let dir = tempfile::tempdir().unwrap();
    let fencegate = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .env_remove("FENCEGATE_CONFIG")
            .output()
            .unwrap()
    };
    for args in [
        &["admin", "reset", "--key", "k", "--to", "1", "--reason", "x"][..],
        &[
            "admin", "rebind", "--prefix", "", "--unbind", "--reason", "x",
        ],
        &["migrate"],
    ] {
        let out = fencegate(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("no database configured"),
            "{args:?}: {stderr}"
        );
    }
    let out = fencegate(&[
        "admin",
        "reset",
        "--key",
        "k",
        "--to",
        "1",
        "--reason",
        "x",
        "--database-url",
        "sqlite:missing.sqlite",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no SQLite database"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a database file was created"
    );

    for args in [
        &["kv", "get", "--help"][..],
        &["fence", "claim", "--help"],
        &["lock-info", "--help"],
        &["sign", "--help"],
        &["lock", "--help"],
    ] {
        let help = String::from_utf8_lossy(&fencegate(args).stdout).into_owned();
        assert!(
            !help.contains("--database-url") && !help.contains("--config"),
            "{args:?} shows server flags:\n{help}"
        );
    }
    for args in [
        &["serve", "--help"][..],
        &["migrate", "--help"],
        &["admin", "reset", "--help"],
    ] {
        assert!(
            String::from_utf8_lossy(&fencegate(args).stdout).contains("--database-url"),
            "{args:?}"
        );
    }
    let out = fencegate(&[
        "sign",
        "--scope",
        "s",
        "--token",
        "01",
        "--hmac-secret-env",
        "X",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
