//! One source of tokens per scope (docs/security.md, *Where a scope's tokens come from*): a
//! scope an issuer signs for takes no built-in lock, `[locks] names` reserves scopes for the
//! built-in locks from before their first grant, and a scope bricked by an old grant is
//! recovered by retiring the lock, audited. Every refusal is checked to have changed nothing.

use fencegate::{
    fence::FencingToken,
    issuers::{sign, IssuerSettings, SigningKey},
};
use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{
    enc, kv, spawn_app, spawn_app_on, spawn_app_with, unique, Resp, TestApp, SCOPE, TOKEN,
};
use crate::pg;

const SECRET: &str = "an-issuer-secret-of-at-least-32-bytes";

fn proof(scope: &str, token: i64) -> String {
    sign(
        scope,
        FencingToken::from_db(token).unwrap(),
        SigningKey::Hmac(SECRET.as_bytes()),
    )
}

/// An HMAC issuer signing for `signed/`.
fn issuer() -> IssuerSettings {
    let var = unique("FENCEGATE_TEST_ISSUER").replace('-', "_");
    std::env::set_var(&var, SECRET);
    IssuerSettings {
        name: "redis".into(),
        scopes: vec!["signed/".into()],
        ed25519_public_key: None,
        hmac_sha256_secret_env: Some(var),
    }
}

async fn put(app: &TestApp, key: &str, token: i64, scope: &str, proof: Option<&str>) -> Resp {
    let mut rb = app
        .req(Method::PUT, &kv(key))
        .header(TOKEN, token.to_string())
        .header(SCOPE, enc(scope))
        .json(&json!(token));
    if let Some(proof) = proof {
        rb = rb.header("X-Fencing-Proof", proof);
    }
    app.send(rb).await
}

async fn claim(app: &TestApp, scope: &str, token: i64, proof: Option<&str>) -> Resp {
    let mut rb = app
        .req(Method::POST, &format!("/v1/fences/{}", enc(scope)))
        .header(TOKEN, token.to_string());
    if let Some(proof) = proof {
        rb = rb.header("X-Fencing-Proof", proof);
    }
    app.send(rb).await
}

async fn acquire(app: &TestApp, name: &str, owner: &str) -> Resp {
    app.send(
        app.req(Method::POST, &format!("/v1/locks/{}", enc(name)))
            .json(&json!({"owner": owner, "ttl_ms": 60_000})),
    )
    .await
}

async fn release(app: &TestApp, name: &str, token: &str) -> Resp {
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{}", enc(name)))
            .header(TOKEN, token),
    )
    .await
}

async fn retire(app: &TestApp, name: &str, body: &Value) -> Resp {
    app.send(
        app.req(
            Method::POST,
            &format!("/v1/admin/locks/{}/retire", enc(name)),
        )
        .json(body),
    )
    .await
}

async fn audit_len(app: &TestApp) -> usize {
    app.get("/v1/admin/audit?limit=1000").await.expect(200)["entries"]
        .as_array()
        .unwrap()
        .len()
}

#[track_caller]
fn not_issued(r: &Resp, scope: &str, presented: &str, latest: &str) {
    let body = r.problem(422, "token-not-issued");
    assert_eq!(
        (
            &body["scope"],
            &body["presented_token"],
            &body["latest_issued"]
        ),
        (&json!(scope), &json!(presented), &json!(latest)),
        "{body}"
    );
}

/// The third attacker's finding: the `lock` right alone took an issuer's scope (a grant skipped
/// the issuer check) and made every later issuer token "not issued".
#[tokio::test]
async fn no_built_in_lock_is_granted_on_a_scope_an_issuer_signs_for() {
    let app = spawn_app_with(|s| s.issuers = vec![issuer()]).await;
    let scope = "signed/job";
    claim(&app, scope, 500, Some(&proof(scope, 500)))
        .await
        .expect(201);
    let r = acquire(&app, scope, "x").await;
    let body = r.problem(409, "scope-has-issuer");
    assert_eq!(
        (&body["scope"], &body["issuer"]),
        (&json!(scope), &json!("redis")),
        "{body}"
    );
    // Nothing changed: no lock row (so nothing is "not issued"), the fence is the issuer's.
    app.get(&format!("/v1/locks/{}", enc(scope)))
        .await
        .problem(404, "not-found");
    assert_eq!(
        app.fence(&enc(scope)).await.expect(200)["fence_token"],
        json!("500")
    );
    put(&app, "job-1", 500, scope, Some(&proof(scope, 500)))
        .await
        .expect(201);
    put(&app, "job-1", 520, scope, Some(&proof(scope, 520)))
        .await
        .expect(200);
    claim(&app, scope, 521, Some(&proof(scope, 521)))
        .await
        .expect(200);

    // A fresh scope: take-and-release would have made every issuer token above 1 unusable.
    let fresh = format!("signed/{}", unique("fresh"));
    acquire(&app, &fresh, "x")
        .await
        .problem(409, "scope-has-issuer");
    put(&app, "fresh-1", 77, &fresh, Some(&proof(&fresh, 77)))
        .await
        .expect(201);
    // Scopes no issuer covers keep their built-in locks.
    acquire(&app, &unique("plain"), "x").await.expect(201);
}

/// A scope bricked before this release (a grant made while no issuer covered it) is recovered
/// by retiring the lock: audited, and the issuer's tokens pass again; a later grant (once the
/// issuer is gone) still never reissues a token.
#[tokio::test]
async fn a_scope_bricked_by_an_old_grant_is_recovered_by_retiring_the_lock() {
    let db = pg::fresh_database().await;
    let scope = "signed/job";
    let before = spawn_app_on(db.clone(), |_| {}).await;
    let token = acquire(&before, scope, "old").await.expect(201)["token"]
        .as_str()
        .unwrap()
        .to_owned();
    release(&before, scope, &token).await.expect(200);
    drop(before);

    let app = spawn_app_on(db.clone(), |s| s.issuers = vec![issuer()]).await;
    not_issued(
        &put(&app, "k", 520, scope, Some(&proof(scope, 520))).await,
        scope,
        "520",
        &token,
    );
    not_issued(
        &claim(&app, scope, 520, Some(&proof(scope, 520))).await,
        scope,
        "520",
        &token,
    );

    // Refused retires change nothing and leave no audit row.
    for bad in [
        json!({}),
        json!({"reason": ""}),
        json!({"reason": "a\nforged line"}),
        json!({"reason": "x", "to": "1"}),
    ] {
        let r = retire(&app, scope, &bad).await;
        assert!(
            r.status == 400 || r.status == 422,
            "{bad}: {} {}",
            r.status,
            r.text
        );
    }
    retire(&app, &unique("never"), &json!({"reason": "typo"}))
        .await
        .problem(404, "not-found");
    assert_eq!(audit_len(&app).await, 0);

    let done = retire(
        &app,
        scope,
        &json!({"reason": "the scope moved to the redis issuer"}),
    )
    .await
    .expect(200);
    assert_eq!(
        (&done["target"], &done["name"], &done["from"], &done["to"]),
        (&json!("lock"), &json!(scope), &json!(token), &json!(token)),
        "{done}"
    );
    let audit = app.get("/v1/admin/audit?limit=1").await.expect(200);
    let entry = &audit["entries"][0];
    assert_eq!(
        (&entry["action"], &entry["target"], &entry["name"]),
        (&json!("retire"), &json!("lock"), &json!(scope)),
        "{entry}"
    );
    assert_eq!(entry["id"], done["audit_id"], "{entry}");
    retire(&app, scope, &json!({"reason": "again"}))
        .await
        .problem(400, "invalid-request");

    put(&app, "k", 520, scope, Some(&proof(scope, 520)))
        .await
        .expect(201);
    drop(app);

    // Without the issuer, the lock may be granted again: above every token it ever issued and
    // above the fence, never a token it gave out before.
    let after = spawn_app_on(db, |_| {}).await;
    let next = acquire(&after, scope, "new").await.expect(201)["token"]
        .as_str()
        .unwrap()
        .parse::<i64>()
        .unwrap();
    assert_eq!(next, 521);
}

#[tokio::test]
async fn reserved_lock_scopes_refuse_unissued_tokens_before_the_first_grant() {
    let app = spawn_app_with(|s| s.locks.names = vec!["jobs/".into()]).await;
    let lock = format!("jobs/{}", unique("nightly"));
    // Before any grant: nothing is issued, not even 0, and nobody can exhaust the lock.
    for bad in [0, 1, 5, i64::MAX] {
        let shown = bad.to_string();
        not_issued(&put(&app, "a", bad, &lock, None).await, &lock, &shown, "0");
        not_issued(&claim(&app, &lock, bad, None).await, &lock, &shown, "0");
        let ops = json!({"ops": [{"op": "put", "key": "a", "value": 1}]});
        let r = app
            .send(
                app.req(Method::POST, "/v1/batch")
                    .header(TOKEN, &shown)
                    .header(SCOPE, enc(&lock))
                    .json(&ops),
            )
            .await;
        not_issued(&r, &lock, &shown, "0");
    }
    app.assert_absent("a").await;
    app.fence(&enc(&lock)).await.problem(404, "not-found");

    let token = acquire(&app, &lock, "w").await.expect(201)["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        token, "1",
        "the lock's first grant: no token was pushed ahead of it"
    );
    put(&app, "a", 1, &lock, None).await.expect(201);
    not_issued(&put(&app, "a", 2, &lock, None).await, &lock, "2", "1");
    not_issued(&claim(&app, &lock, 2, None).await, &lock, "2", "1");

    // A scope outside the reserved prefixes takes any token (docs/security.md says what guards it).
    let open = unique("open");
    claim(&app, &open, i64::MAX, None).await.expect(201);
    acquire(&app, &open, "w")
        .await
        .problem(409, "lock-exhausted");
}

#[tokio::test]
async fn reserved_names_and_issuers_may_not_share_a_scope() {
    let mut settings = fencegate::config::Settings {
        issuers: vec![issuer()],
        locks: fencegate::locks::LockSettings {
            names: vec!["signed/nightly".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let err = settings.validate().unwrap_err().to_string();
    assert!(
        err.contains("locks.names") && err.contains("redis"),
        "{err}"
    );
    settings.locks.names = vec!["jobs/".into()];
    settings.validate().unwrap();
    settings.locks.names = vec!["it's".into()];
    assert!(settings
        .validate()
        .unwrap_err()
        .to_string()
        .contains("locks.names"));
}

/// An admin rebind that contradicts a `[[scopes]]` binding would leave the key unwritable
/// under both scopes: 409, nothing changed, no audit row.
#[tokio::test]
async fn an_admin_rebind_that_contradicts_the_configuration_is_refused() {
    let app = spawn_app_with(|s| {
        s.scopes = vec![fencegate::fence::ScopeBinding {
            name: "billing".into(),
            keys: vec!["invoice-".into()],
        }]
    })
    .await;
    app.kv_put("invoice-1", "5", &json!("v")).await.expect(201);
    let rebind = |scope: Value| {
        app.req(Method::POST, "/v1/admin/kv/invoice-1/reset")
            .json(&json!({"scope": scope, "reason": "move it"}))
    };
    for wrong in [json!("other"), Value::Null] {
        let body = app
            .send(rebind(wrong.clone()))
            .await
            .problem(409, "binding-conflict");
        assert!(
            body["detail"].as_str().unwrap().contains("billing"),
            "{body}"
        );
    }
    assert_eq!(audit_len(&app).await, 0);
    app.kv_put("invoice-1", "6", &json!("still writable"))
        .await
        .expect(200);
    // The configured scope itself is no contradiction.
    app.send(rebind(json!("billing"))).await.expect(200);
}

/// Free text a person reads in a terminal or on the console (lease owners, audit reasons)
/// refuses control characters: a newline could forge a log line, an escape repaint a screen.
#[tokio::test]
async fn owners_and_reasons_refuse_control_characters() {
    let app = spawn_app().await;
    for owner in ["a\nb", "\u{1b}[2Jx", "tab\there", "nul\u{0}"] {
        acquire(&app, &unique("l"), owner)
            .await
            .problem(400, "invalid-request");
    }
    app.kv_put("k", "5", &json!(1)).await.expect(201);
    let r = app.send(
        app.req(Method::POST, "/v1/admin/kv/k/reset")
            .json(&json!({"to": "1", "reason": "ok\r\nforged: yes"})),
    );
    r.await.problem(400, "invalid-request");
    assert_eq!(audit_len(&app).await, 0);
    app.kv_put("k", "4", &json!(1))
        .await
        .problem(412, "stale-token");
}
