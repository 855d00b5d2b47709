//! Trust: API keys and JWTs, rights × prefixes × tables on every route, 401/403 that change
//! nothing, leases that belong to the actor that took them, and the start-up refusal of an
//! open server on a reachable address (docs/security.md; docs/wire.md).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use fencegate::auth::{ApiKeySettings, JwtSettings};
use fencegate::config::Settings;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{header::AUTHORIZATION, Method, RequestBuilder};
use serde_json::{json, Value};

use crate::helpers::{enc, spawn_app_with, unique, Resp, TestApp, SCOPE, TOKEN};
use crate::pg;

pub(crate) const RIGHTS: [&str; 5] = ["read", "write", "lock", "fence", "admin"];

/// A key to configure: name, rights, prefixes, tables.
pub(crate) type KeySpec<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

/// An API key (the secret a client sends) and its `[[auth.keys]]` entry.
pub(crate) fn api_key(
    name: &str,
    rights: &[&str],
    prefixes: &[&str],
    tables: &[&str],
) -> (String, ApiKeySettings) {
    let secret = fencegate::auth::new_key().unwrap();
    let settings = ApiKeySettings {
        name: name.into(),
        sha256: fencegate::auth::digest_hex(&secret),
        rights: rights.iter().map(|r| r.to_string()).collect(),
        prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        tables: tables.iter().map(|t| t.to_string()).collect(),
    };
    (secret, settings)
}

/// One key per right (named after it), all on every name (`""`), plus whatever `more` adds.
struct Keys {
    secrets: Vec<(String, String)>,
}

impl Keys {
    fn of(&self, name: &str) -> &str {
        &self
            .secrets
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no key {name}"))
            .1
    }
}

async fn spawn_with_keys(
    keys: &[KeySpec<'_>],
    configure: impl FnOnce(&mut Settings),
) -> (TestApp, Keys) {
    let made: Vec<(String, ApiKeySettings)> = keys
        .iter()
        .map(|(name, rights, prefixes, tables)| api_key(name, rights, prefixes, tables))
        .collect();
    let secrets = made
        .iter()
        .map(|(secret, s)| (s.name.clone(), secret.clone()))
        .collect();
    let settings: Vec<ApiKeySettings> = made.into_iter().map(|(_, s)| s).collect();
    let app = spawn_app_with(|s| {
        s.auth.keys = settings;
        s.database.max_connections = 4;
        configure(s);
    })
    .await;
    (app, Keys { secrets })
}

/// Each right on its own, on every name, and `admin`.
async fn spawn_one_key_per_right() -> (TestApp, Keys) {
    let all: &[&str] = &[""];
    let tables: &[&str] = &["orders"];
    let keys: Vec<KeySpec<'_>> = RIGHTS
        .iter()
        .map(|r| (*r, std::slice::from_ref(r), all, tables))
        .collect();
    spawn_with_keys(&keys, |_| {}).await
}

pub(crate) fn bearer(rb: RequestBuilder, secret: &str) -> RequestBuilder {
    rb.header(AUTHORIZATION, format!("Bearer {secret}"))
}

async fn put(app: &TestApp, secret: &str, path_key: &str, token: &str) -> Resp {
    app.send(
        bearer(app.req(Method::PUT, &format!("/v1/kv/{path_key}")), secret)
            .header(TOKEN, token)
            .json(&json!({"v": 1})),
    )
    .await
}

async fn put_scoped(app: &TestApp, secret: &str, path_key: &str, token: &str, scope: &str) -> Resp {
    app.send(
        bearer(app.req(Method::PUT, &format!("/v1/kv/{path_key}")), secret)
            .header(TOKEN, token)
            .header(SCOPE, scope)
            .json(&json!({"v": 1})),
    )
    .await
}

async fn get(app: &TestApp, secret: &str, path: &str) -> Resp {
    app.send(bearer(app.req(Method::GET, path), secret)).await
}

async fn acquire(app: &TestApp, secret: &str, name: &str) -> Resp {
    app.send(
        bearer(app.req(Method::POST, &format!("/v1/locks/{name}")), secret)
            .json(&json!({"owner": "w", "ttl_ms": 30_000})),
    )
    .await
}

async fn renew(app: &TestApp, secret: &str, name: &str, token: &str) -> Resp {
    app.send(
        bearer(
            app.req(Method::POST, &format!("/v1/locks/{name}/renew")),
            secret,
        )
        .header(TOKEN, token)
        .json(&json!({"ttl_ms": 30_000})),
    )
    .await
}

async fn release(app: &TestApp, secret: &str, name: &str, token: &str) -> Resp {
    app.send(
        bearer(
            app.req(Method::DELETE, &format!("/v1/locks/{name}")),
            secret,
        )
        .header(TOKEN, token),
    )
    .await
}

/// A 403 `forbidden` naming `right` and the refused `field` = `name`.
#[track_caller]
pub(crate) fn forbidden(resp: &Resp, right: &str, field: &str, name: &str) {
    let body = resp.problem(403, "forbidden");
    assert_eq!(body["right"], json!(right), "{body}");
    assert_eq!(body[field], json!(name), "{body}");
}

/// A 401 `unauthenticated` with `WWW-Authenticate: Bearer`.
#[track_caller]
fn unauthenticated(resp: &Resp) {
    resp.problem(401, "unauthenticated");
    assert_eq!(
        resp.header("www-authenticate"),
        Some("Bearer"),
        "{}",
        resp.text
    );
}

fn token_of(body: &Value) -> String {
    body["token"]
        .as_str()
        .unwrap_or_else(|| panic!("token: {body}"))
        .to_owned()
}

/// The routes of the rights table: each sends one request as `who`, on fresh names, after the
/// setup it needs (done as `admin`, or for a lease as the `lock` key, its owner).
#[derive(Debug, Clone, Copy)]
enum Route {
    GetKv,
    PutKv,
    DeleteKv,
    Batch,
    Claim,
    GetFence,
    Acquire,
    Renew,
    Release,
    GetLock,
}

impl Route {
    const ALL: [Route; 10] = [
        Route::GetKv,
        Route::PutKv,
        Route::DeleteKv,
        Route::Batch,
        Route::Claim,
        Route::GetFence,
        Route::Acquire,
        Route::Renew,
        Route::Release,
        Route::GetLock,
    ];

    /// The right it needs and the problem field naming the refused name.
    fn needs(self) -> (&'static str, &'static str) {
        match self {
            Route::GetKv => ("read", "key"),
            Route::PutKv | Route::DeleteKv | Route::Batch => ("write", "key"),
            Route::Claim => ("fence", "scope"),
            Route::GetFence => ("read", "scope"),
            Route::Acquire | Route::Renew | Route::Release => ("lock", "lock"),
            Route::GetLock => ("read", "lock"),
        }
    }

    /// Sends the request; returns it, the name it is about, and the success status expected.
    async fn run(self, app: &TestApp, keys: &Keys, who: &str) -> (Resp, String, u16) {
        let name = unique("cell");
        let (admin, secret) = (keys.of("admin"), keys.of(who));
        let resp = match self {
            Route::GetKv => {
                put(app, admin, &name, "1").await.expect(201);
                (get(app, secret, &format!("/v1/kv/{name}")).await, 200)
            }
            Route::PutKv => (put(app, secret, &name, "1").await, 201),
            Route::DeleteKv => {
                put(app, admin, &name, "1").await.expect(201);
                (
                    app.send(
                        bearer(app.req(Method::DELETE, &format!("/v1/kv/{name}")), secret)
                            .header(TOKEN, "1"),
                    )
                    .await,
                    200,
                )
            }
            Route::Batch => {
                let body = json!({"ops": [{"op": "put", "key": name, "value": 1}]});
                (
                    app.send(
                        bearer(app.req(Method::POST, "/v1/batch"), secret)
                            .header(TOKEN, "1")
                            .json(&body),
                    )
                    .await,
                    200,
                )
            }
            Route::Claim => (
                app.send(
                    bearer(app.req(Method::POST, &format!("/v1/fences/{name}")), secret)
                        .header(TOKEN, "5"),
                )
                .await,
                201,
            ),
            Route::GetFence => {
                app.send(
                    bearer(app.req(Method::POST, &format!("/v1/fences/{name}")), admin)
                        .header(TOKEN, "5"),
                )
                .await
                .expect(201);
                (get(app, secret, &format!("/v1/fences/{name}")).await, 200)
            }
            Route::Acquire => (acquire(app, secret, &name).await, 201),
            Route::Renew => {
                let token = token_of(&acquire(app, keys.of("lock"), &name).await.expect(201));
                (renew(app, secret, &name, &token).await, 200)
            }
            Route::Release => {
                let token = token_of(&acquire(app, keys.of("lock"), &name).await.expect(201));
                (release(app, secret, &name, &token).await, 200)
            }
            Route::GetLock => {
                acquire(app, keys.of("lock"), &name).await.expect(201);
                (get(app, secret, &format!("/v1/locks/{name}")).await, 200)
            }
        };
        (resp.0, name, resp.1)
    }

    /// What a refused request must not have changed (checked as admin).
    async fn unchanged(self, app: &TestApp, keys: &Keys, name: &str) {
        let admin = keys.of("admin");
        match self {
            Route::PutKv | Route::Batch => get(app, admin, &format!("/v1/kv/{name}"))
                .await
                .problem(404, "not-found"),
            Route::DeleteKv => get(app, admin, &format!("/v1/kv/{name}")).await.expect(200),
            Route::Claim | Route::Acquire => get(app, admin, &format!("/v1/fences/{name}"))
                .await
                .problem(404, "not-found"),
            // The lease is still held by the lock key: a second grant is refused.
            Route::Renew | Route::Release => {
                acquire(app, admin, name).await.problem(409, "lock-held")
            }
            Route::GetKv | Route::GetFence | Route::GetLock => json!(null),
        };
    }
}

#[tokio::test]
async fn every_cell_of_the_rights_table() {
    let (app, keys) = spawn_one_key_per_right().await;
    for route in Route::ALL {
        let (needed, field) = route.needs();
        for who in RIGHTS {
            let (resp, name, success) = route.run(&app, &keys, who).await;
            if who == needed || who == "admin" {
                resp.expect(success);
            } else {
                forbidden(&resp, needed, field, &name);
                route.unchanged(&app, &keys, &name).await;
            }
        }
    }
}

#[tokio::test]
async fn prefixes_match_the_decoded_name() {
    let rights: &[&str] = &["read", "write", "lock", "fence"];
    let (app, keys) = spawn_with_keys(
        &[
            ("billing", rights, &["billing/"], &[]),
            ("everything", rights, &[""], &[]),
            ("nothing", rights, &[], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |_| {},
    )
    .await;
    let billing = keys.of("billing");
    let run = unique("r");
    // Exact prefix, longer, percent-encoded into the prefix.
    for (path_key, decoded) in [
        ("billing%2F".to_string(), "billing/".to_string()),
        (format!("billing%2F{run}"), format!("billing/{run}")),
        (
            format!("%62illing%2F{run}-enc"),
            format!("billing/{run}-enc"),
        ),
        (
            format!("billing%2F{}", enc(&format!("caf\u{e9}-{run}"))),
            format!("billing/caf\u{e9}-{run}"),
        ),
    ] {
        let body = put(&app, billing, &path_key, "1")
            .await
            .expect_any(&[200, 201]);
        assert_eq!(body["key"], json!(decoded));
    }
    // Shorter, a sibling, and keys that decode out of the prefix.
    for (path_key, decoded) in [
        ("billing".to_string(), "billing".to_string()),
        (format!("billingx{run}"), format!("billingx{run}")),
        (format!("billing%252F{run}"), format!("billing%2F{run}")),
        (format!("billin%67.{run}"), format!("billing.{run}")),
        (format!("%2Fbilling%2F{run}"), format!("/billing/{run}")),
    ] {
        forbidden(
            &put(&app, billing, &path_key, "1").await,
            "write",
            "key",
            &decoded,
        );
        get(&app, keys.of("admin"), &format!("/v1/kv/{path_key}"))
            .await
            .problem(404, "not-found");
    }
    // The empty prefix is every name; no prefix is no name.
    put(&app, keys.of("everything"), &format!("anything-{run}"), "1")
        .await
        .expect(201);
    forbidden(
        &put(&app, keys.of("nothing"), &format!("billing%2F{run}-n"), "1").await,
        "write",
        "key",
        &format!("billing/{run}-n"),
    );
    // Lock names and scopes are names too.
    acquire(&app, billing, &format!("billing%2Flock-{run}"))
        .await
        .expect(201);
    forbidden(
        &acquire(&app, billing, &format!("payroll-{run}")).await,
        "lock",
        "lock",
        &format!("payroll-{run}"),
    );
    forbidden(
        &app.send(
            bearer(
                app.req(Method::POST, &format!("/v1/fences/bill{run}")),
                billing,
            )
            .header(TOKEN, "1"),
        )
        .await,
        "fence",
        "scope",
        &format!("bill{run}"),
    );
    forbidden(
        &get(&app, billing, &format!("/v1/fences/payroll-{run}")).await,
        "read",
        "scope",
        &format!("payroll-{run}"),
    );
}

#[tokio::test]
async fn a_scoped_write_needs_write_on_the_scope_too() {
    let rights: &[&str] = &["read", "write"];
    let (app, keys) = spawn_with_keys(
        &[
            ("billing", rights, &["billing/"], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |s| {
            s.scopes = vec![fencegate::fence::ScopeBinding {
                name: "payroll".into(),
                keys: vec!["billing/bound-".into()],
            }]
        },
    )
    .await;
    let (billing, admin) = (keys.of("billing"), keys.of("admin"));
    let key = unique("k");
    // A foreign scope in the header.
    forbidden(
        &put_scoped(&app, billing, &format!("billing%2F{key}"), "1", "payroll").await,
        "write",
        "scope",
        "payroll",
    );
    get(&app, admin, &format!("/v1/kv/billing%2F{key}"))
        .await
        .problem(404, "not-found");
    get(&app, admin, "/v1/fences/payroll")
        .await
        .problem(404, "not-found");
    // Its own scope is fine.
    put_scoped(
        &app,
        billing,
        &format!("billing%2F{key}"),
        "1",
        "billing%2Fjob",
    )
    .await
    .expect(201);
    // A [[scopes]] binding puts the key under "payroll" without the header: still refused.
    forbidden(
        &put(&app, billing, &format!("billing%2Fbound-{key}"), "1").await,
        "write",
        "scope",
        "payroll",
    );
    get(&app, admin, &format!("/v1/kv/billing%2Fbound-{key}"))
        .await
        .problem(404, "not-found");
    // A batch that would be bound to payroll, or names it.
    let body = json!({"ops": [{"op": "put", "key": format!("billing/bound-{key}-b"), "value": 1}]});
    let resp = app
        .send(
            bearer(app.req(Method::POST, "/v1/batch"), billing)
                .header(TOKEN, "1")
                .json(&body),
        )
        .await;
    forbidden(&resp, "write", "scope", "payroll");
    let body = json!({"ops": [{"op": "put", "key": format!("billing/{key}-c"), "value": 1}]});
    let resp = app
        .send(
            bearer(app.req(Method::POST, "/v1/batch"), billing)
                .header(TOKEN, "1")
                .header(SCOPE, "payroll")
                .json(&body),
        )
        .await;
    forbidden(&resp, "write", "scope", "payroll");
    get(&app, admin, &format!("/v1/kv/billing%2F{key}-c"))
        .await
        .problem(404, "not-found");
    get(&app, admin, "/v1/fences/payroll")
        .await
        .problem(404, "not-found");
}

/// A header that contradicts a binding is answered from the presented scope's fence (412 for a
/// stale token), so that fence is read only for an actor with `write` on that scope: one
/// without it hears 403 and learns nothing of the fence; one with it hears what a plain write
/// under that scope would tell it.
#[tokio::test]
async fn a_contradicting_header_reveals_no_fence_the_actor_may_not_write() {
    let rights: &[&str] = &["read", "write"];
    let (app, keys) = spawn_with_keys(
        &[
            ("billing", rights, &["billing/"], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |s| {
            s.scopes = vec![fencegate::fence::ScopeBinding {
                name: "billing/lock".into(),
                keys: vec!["billing/bound-".into()],
            }]
        },
    )
    .await;
    let (billing, admin) = (keys.of("billing"), keys.of("admin"));
    let claim = |scope: &'static str| {
        let app = &app;
        async move {
            app.send(
                bearer(app.req(Method::POST, &format!("/v1/fences/{scope}")), admin)
                    .header(TOKEN, "10"),
            )
            .await
            .expect(201)
        }
    };
    claim("payroll").await;
    claim("billing%2Fother").await;
    let key = unique("bound-");
    // Stale against payroll's fence, but billing may not write payroll: 403, no current_token.
    let refused = put_scoped(&app, billing, &format!("billing%2F{key}"), "5", "payroll").await;
    forbidden(&refused, "write", "scope", "payroll");
    let body = refused.problem(403, "forbidden");
    assert!(body.get("current_token").is_none(), "{body}");
    // Under a scope it may write: the 412 it would get from any write there.
    let stale = put_scoped(
        &app,
        billing,
        &format!("billing%2F{key}"),
        "5",
        "billing%2Fother",
    )
    .await;
    stale.stale_scope("billing/other", "5", "10");
    // Admitted by that fence: the binding's 409. Nothing written.
    put_scoped(
        &app,
        billing,
        &format!("billing%2F{key}"),
        "10",
        "billing%2Fother",
    )
    .await
    .mismatch(
        &format!("billing/{key}"),
        Some("billing/lock"),
        Some("billing/other"),
    );
    get(&app, admin, &format!("/v1/kv/billing%2F{key}"))
        .await
        .problem(404, "not-found");
}

#[tokio::test]
async fn a_batch_with_one_foreign_key_applies_nothing() {
    let (app, keys) = spawn_with_keys(
        &[
            ("billing", &["read", "write"], &["billing/"], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |_| {},
    )
    .await;
    let key = unique("k");
    let body = json!({"ops": [
        {"op": "put", "key": format!("billing/{key}-1"), "value": 1},
        {"op": "put", "key": format!("payroll/{key}"), "value": 2},
        {"op": "delete", "key": format!("billing/{key}-2")},
    ]});
    let resp = app
        .send(
            bearer(app.req(Method::POST, "/v1/batch"), keys.of("billing"))
                .header(TOKEN, "1")
                .json(&body),
        )
        .await;
    forbidden(&resp, "write", "key", &format!("payroll/{key}"));
    for k in [format!("billing%2F{key}-1"), format!("payroll%2F{key}")] {
        get(&app, keys.of("admin"), &format!("/v1/kv/{k}"))
            .await
            .problem(404, "not-found");
    }
}

#[tokio::test]
async fn a_lease_belongs_to_the_actor_that_took_it() {
    let lock: &[&str] = &["lock", "read", "write"];
    let (app, keys) = spawn_with_keys(
        &[
            ("a", lock, &[""], &[]),
            ("b", lock, &[""], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |_| {},
    )
    .await;
    let name = unique("lease");
    let token = token_of(&acquire(&app, keys.of("a"), &name).await.expect(201));
    // B knows the token (anyone who reads the scope's fence does) but did not take the lease.
    forbidden(
        &renew(&app, keys.of("b"), &name, &token).await,
        "lock",
        "lock",
        &name,
    );
    forbidden(
        &release(&app, keys.of("b"), &name, &token).await,
        "lock",
        "lock",
        &name,
    );
    // Still A's: a grant to B is refused, A renews.
    acquire(&app, keys.of("b"), &name)
        .await
        .problem(409, "lock-held");
    renew(&app, keys.of("a"), &name, &token).await.expect(200);
    // A stale token is still 409 for B, not 403: only the live lease is owned.
    renew(&app, keys.of("b"), &name, "999999")
        .await
        .problem(409, "lock-lost");
    // Admin may renew and release anyone's lease.
    renew(&app, keys.of("admin"), &name, &token)
        .await
        .expect(200);
    release(&app, keys.of("admin"), &name, &token)
        .await
        .expect(200);
    // Free again: B takes it, and A cannot release B's lease.
    let token_b = token_of(&acquire(&app, keys.of("b"), &name).await.expect(201));
    forbidden(
        &release(&app, keys.of("a"), &name, &token_b).await,
        "lock",
        "lock",
        &name,
    );
    release(&app, keys.of("b"), &name, &token_b)
        .await
        .expect(200);
}

#[tokio::test]
async fn missing_and_malformed_authorization_is_401() {
    let (app, keys) = spawn_with_keys(&[("w", &["read", "write"], &[""], &[])], |_| {}).await;
    let secret = keys.of("w");
    let key = unique("k");
    let path = format!("/v1/kv/{key}");
    let write = || {
        app.req(Method::PUT, &path)
            .header(TOKEN, "1")
            .json(&json!(1))
    };
    unauthenticated(&app.send(write()).await);
    for value in [
        format!("Basic {secret}"),
        "Bearer".to_string(),
        format!("Bearer  {secret}"),
        format!("Bearer {secret} x"),
        format!("Token {secret}"),
        secret.to_string(),
        "Bearer not-a-configured-key".to_string(),
        format!("Bearer {}x", secret),
        "Bearer a.b.c".to_string(),
    ] {
        unauthenticated(&app.send(write().header(AUTHORIZATION, value)).await);
    }
    // Two Authorization headers, even both valid: which one would count?
    let twice = write()
        .header(AUTHORIZATION, format!("Bearer {secret}"))
        .header(AUTHORIZATION, format!("Bearer {secret}"));
    unauthenticated(&app.send(twice).await);
    // Every route needs one, unknown routes included; 401 comes before any other check.
    unauthenticated(&app.get(&path).await);
    unauthenticated(&app.get("/v1/nope").await);
    unauthenticated(&app.send(app.req(Method::PUT, "/v1/kv/%ZZ")).await);
    app.assert_absent_as(secret, &key).await;
    // The scheme is case-insensitive.
    app.send(write().header(AUTHORIZATION, format!("bearer {secret}")))
        .await
        .expect(201);
}

#[tokio::test]
async fn health_readiness_and_metrics_stay_open() {
    let (app, keys) = spawn_with_keys(&[("w", &["read"], &[""], &[])], |_| {}).await;
    app.get("/healthz").await.expect(200);
    app.get("/readyz").await.expect(200);
    unauthenticated(&app.get("/v1/kv/x").await);
    let metrics = app.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .text
            .contains("fencegate_auth_failures_total{reason=\"missing\"}"),
        "{}",
        metrics.text
    );
    drop(keys);

    let (app, keys) = spawn_with_keys(
        &[
            ("w", &["read"], &[""], &[]),
            ("admin", &["admin"], &[], &[]),
        ],
        |s| s.auth.protect_metrics = true,
    )
    .await;
    app.get("/healthz").await.expect(200);
    app.get("/readyz").await.expect(200);
    unauthenticated(&app.get("/metrics").await);
    let resp = get(&app, keys.of("w"), "/metrics").await;
    assert_eq!(resp.problem(403, "forbidden")["right"], json!("admin"));
    assert_eq!(get(&app, keys.of("admin"), "/metrics").await.status, 200);
}

#[tokio::test]
async fn an_open_server_on_a_reachable_address_refuses_to_start() {
    let mut settings = Settings::default();
    settings.database.url = Some(pg::fresh_database().await);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind 0.0.0.0:0");
    let err = fencegate::serve(settings.clone(), listener, async {})
        .await
        .expect_err("must refuse to start");
    let msg = format!("{err:#}");
    assert!(msg.contains("fencegate auth new-key"), "{msg}");
    assert!(msg.contains("allow_unauthenticated"), "{msg}");
    // The same check, as the settings see it.
    assert!(settings
        .check_exposure("10.1.2.3:8080".parse().unwrap())
        .is_err());
    assert!(settings
        .check_exposure("[::]:8080".parse().unwrap())
        .is_err());
    assert!(settings
        .check_exposure("127.0.0.1:8080".parse().unwrap())
        .is_ok());
    assert!(settings
        .check_exposure("[::1]:8080".parse().unwrap())
        .is_ok());
    assert!(!settings.auth_enabled());
    // Opting out, or configuring a credential, lets it start.
    let mut open = settings.clone();
    open.auth.allow_unauthenticated = true;
    assert!(open
        .check_exposure("10.1.2.3:8080".parse().unwrap())
        .is_ok());
    let mut keyed = settings.clone();
    keyed.auth.keys = vec![api_key("svc", &["read"], &[""], &[]).1];
    assert!(keyed.auth_enabled());
    assert!(keyed
        .check_exposure("10.1.2.3:8080".parse().unwrap())
        .is_ok());
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(fencegate::serve(keyed, listener, async move {
        let _ = rx.await;
    }));
    let resp = crate::helpers::client()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _ = tx.send(());
    server.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// JWTs

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jwt")
        .join(name)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims: write+read on `jobs/`, valid for an hour, from the test issuer to fencegate.
fn claims(sub: &str) -> Value {
    json!({
        "sub": sub,
        "iss": "https://idp.test",
        "aud": "fencegate",
        "iat": now(),
        "exp": now() + 3600,
        "fencegate": {"rights": ["read", "write"], "prefixes": ["jobs/"], "tables": []},
    })
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("sign a test JWT")
}

fn rsa_key() -> EncodingKey {
    EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa_private.pem")).unwrap()).unwrap()
}

async fn spawn_jwt(jwt: JwtSettings) -> TestApp {
    spawn_app_with(|s| {
        s.auth.jwt = Some(jwt);
        s.database.max_connections = 4;
    })
    .await
}

fn public_key(file: &str) -> JwtSettings {
    JwtSettings {
        public_key_pem_file: Some(fixture(file)),
        issuer: Some("https://idp.test".into()),
        audience: Some("fencegate".into()),
        ..Default::default()
    }
}

async fn put_jwt(app: &TestApp, jwt: &str) -> Resp {
    put(app, jwt, &format!("jobs%2F{}", unique("j")), "1").await
}

#[tokio::test]
async fn rs256_tokens_are_verified_and_bad_ones_are_401() {
    let app = spawn_jwt(public_key("rsa_public.pem")).await;
    let key = rsa_key();
    // Valid: the claims' rights and prefixes apply.
    put_jwt(&app, &sign(Algorithm::RS256, &key, &claims("scheduler")))
        .await
        .expect(201);
    let resp = put(
        &app,
        &sign(Algorithm::RS256, &key, &claims("scheduler")),
        "payroll%2Fx",
        "1",
    )
    .await;
    forbidden(&resp, "write", "key", "payroll/x");
    let mut no_rights = claims("nobody");
    no_rights.as_object_mut().unwrap().remove("fencegate");
    forbidden(
        &put(
            &app,
            &sign(Algorithm::RS256, &key, &no_rights),
            "jobs%2Fx",
            "1",
        )
        .await,
        "write",
        "key",
        "jobs/x",
    );

    let with = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims("scheduler");
        edit(&mut c);
        sign(Algorithm::RS256, &key, &c)
    };
    let bad = [
        ("expired", with(&|c| c["exp"] = json!(now() - 3600))),
        ("not yet valid", with(&|c| c["nbf"] = json!(now() + 3600))),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!("someone-else")),
        ),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://evil.test")),
        ),
        (
            "no exp",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
        ),
        (
            "no audience",
            with(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
        ),
        (
            "no sub",
            with(&|c| {
                c.as_object_mut().unwrap().remove("sub");
            }),
        ),
    ];
    for (what, jwt) in &bad {
        let resp = put_jwt(&app, jwt).await;
        assert_eq!(resp.status, 401, "{what}: {}", resp.text);
        unauthenticated(&resp);
    }
    // A wrong signature: the token's own, altered; and one by another key.
    let good = sign(Algorithm::RS256, &key, &claims("scheduler"));
    let (head, sig) = good.rsplit_once('.').unwrap();
    let flipped = match sig.strip_prefix('A') {
        Some(rest) => format!("B{rest}"),
        None => format!("A{}", &sig[1..]),
    };
    unauthenticated(&put_jwt(&app, &format!("{head}.{flipped}")).await);
    let ec = EncodingKey::from_ec_pem(&std::fs::read(fixture("ec_private.pem")).unwrap()).unwrap();
    unauthenticated(&put_jwt(&app, &sign(Algorithm::ES256, &ec, &claims("scheduler"))).await);
    // alg "none": the claims with no signature at all.
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims("scheduler"))
    );
    unauthenticated(&put_jwt(&app, &none).await);
    let none_sig = format!(
        "{}.{}.{}",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims("scheduler")),
        sig
    );
    unauthenticated(&put_jwt(&app, &none_sig).await);
    // HS256 signed with the RSA public key (PEM bytes) as the HMAC secret: algorithm confusion.
    let public_pem = std::fs::read(fixture("rsa_public.pem")).unwrap();
    let confused = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public_pem),
        &claims("scheduler"),
    );
    unauthenticated(&put_jwt(&app, &confused).await);
    // An API key is not accepted where none is configured.
    unauthenticated(&put_jwt(&app, &fencegate::auth::new_key().unwrap()).await);
}

#[tokio::test]
async fn es256_and_eddsa_keys_are_chosen_by_their_type() {
    let app = spawn_jwt(public_key("ec_public.pem")).await;
    let ec = EncodingKey::from_ec_pem(&std::fs::read(fixture("ec_private.pem")).unwrap()).unwrap();
    put_jwt(&app, &sign(Algorithm::ES256, &ec, &claims("ec-client")))
        .await
        .expect(201);
    unauthenticated(
        &put_jwt(
            &app,
            &sign(Algorithm::RS256, &rsa_key(), &claims("rsa-client")),
        )
        .await,
    );

    let app = spawn_jwt(public_key("ed25519_public.pem")).await;
    let ed =
        EncodingKey::from_ed_pem(&std::fs::read(fixture("ed25519_private.pem")).unwrap()).unwrap();
    put_jwt(&app, &sign(Algorithm::EdDSA, &ed, &claims("ed-client")))
        .await
        .expect(201);
    unauthenticated(&put_jwt(&app, &sign(Algorithm::ES256, &ec, &claims("ec-client"))).await);
}

/// The HS256 secret comes from the environment variable the config names.
#[tokio::test]
async fn hs256_tokens_use_the_secret_from_the_environment() {
    let var = hs256_secret_var();
    let secret = std::env::var(&var).unwrap();
    let app = spawn_jwt(JwtSettings {
        hs256_secret_env: Some(var.clone()),
        ..Default::default()
    })
    .await;
    let key = EncodingKey::from_secret(secret.as_bytes());
    let mut c = claims("hs-client");
    c.as_object_mut().unwrap().remove("aud"); // no audience configured: not checked
    put_jwt(&app, &sign(Algorithm::HS256, &key, &c))
        .await
        .expect(201);
    unauthenticated(
        &put_jwt(
            &app,
            &sign(Algorithm::HS256, &EncodingKey::from_secret(&[b'x'; 40]), &c),
        )
        .await,
    );
    unauthenticated(&put_jwt(&app, &sign(Algorithm::HS384, &key, &c)).await);
    // An unset variable fails start-up, naming it.
    let mut settings = Settings::default();
    settings.database.url = Some(pg::fresh_database().await);
    settings.auth.jwt = Some(JwtSettings {
        hs256_secret_env: Some("FENCEGATE_TEST_UNSET_SECRET".into()),
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = format!(
        "{:#}",
        fencegate::serve(settings, listener, async {})
            .await
            .unwrap_err()
    );
    assert!(err.contains("FENCEGATE_TEST_UNSET_SECRET"), "{err}");
}

/// A JWT actor owns its leases like a key does; its `sub` is the actor.
#[tokio::test]
async fn jwt_leases_belong_to_their_subject() {
    let app = spawn_jwt(public_key("rsa_public.pem")).await;
    let key = rsa_key();
    let as_sub = |sub: &str| {
        let mut c = claims(sub);
        c["fencegate"]["rights"] = json!(["lock"]);
        sign(Algorithm::RS256, &key, &c)
    };
    let name = format!("jobs%2F{}", unique("lease"));
    let token = token_of(&acquire(&app, &as_sub("one"), &name).await.expect(201));
    renew(&app, &as_sub("two"), &name, &token)
        .await
        .problem(403, "forbidden");
    renew(&app, &as_sub("one"), &name, &token).await.expect(200);
    release(&app, &as_sub("one"), &name, &token)
        .await
        .expect(200);
}

/// Actors live in namespaces: a JWT whose `sub` is an API key's name is another actor, and
/// owns none of that key's leases (found by the third attacker's pass: it renewed and released
/// them). The audit log names the namespaced actor.
#[tokio::test]
async fn a_jwt_subject_named_like_an_api_key_is_another_actor() {
    let lock: &[&str] = &["lock", "read"];
    let (app, keys) = spawn_with_keys(&[("locker", lock, &[""], &[])], |s| {
        s.auth.jwt = Some(public_key("rsa_public.pem"))
    })
    .await;
    let mut c = claims("locker");
    c["fencegate"]["rights"] = json!(["lock"]);
    let jwt = sign(Algorithm::RS256, &rsa_key(), &c);
    let plain = format!("jobs/{}", unique("lease"));
    let name = enc(&plain);
    let token = token_of(&acquire(&app, keys.of("locker"), &name).await.expect(201));
    forbidden(
        &renew(&app, &jwt, &name, &token).await,
        "lock",
        "lock",
        &plain,
    );
    forbidden(
        &release(&app, &jwt, &name, &token).await,
        "lock",
        "lock",
        &plain,
    );
    renew(&app, keys.of("locker"), &name, &token)
        .await
        .expect(200);
    release(&app, keys.of("locker"), &name, &token)
        .await
        .expect(200);
    // And the other way round: the key does not own the JWT subject's lease.
    let token = token_of(&acquire(&app, &jwt, &name).await.expect(201));
    forbidden(
        &release(&app, keys.of("locker"), &name, &token).await,
        "lock",
        "lock",
        &plain,
    );
    release(&app, &jwt, &name, &token).await.expect(200);
}

/// An event stream outlives the request that opened it; it ends when its credential expires
/// (the third attacker's pass saw grants streamed 20 s after the JWT was refused elsewhere).
#[tokio::test]
async fn an_event_stream_ends_when_its_credential_expires() {
    let app = spawn_jwt(public_key("rsa_public.pem")).await;
    let mut c = claims("watcher");
    c["fencegate"]["rights"] = json!(["admin"]);
    // `exp` is past, but within the 60 s leeway: valid for about 3 s more.
    c["exp"] = json!(now() - 57);
    let jwt = sign(Algorithm::RS256, &rsa_key(), &c);
    let started = std::time::Instant::now();
    let mut response = bearer(app.req(Method::GET, "/v1/admin/events"), &jwt)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    loop {
        let chunk =
            tokio::time::timeout(std::time::Duration::from_secs(10), response.chunk()).await;
        match chunk
            .expect("the stream was still open 10 s after its credential expired")
            .expect("read the stream")
        {
            Some(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
            None => break,
        }
    }
    assert!(text.contains("event: expired"), "{text}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(9),
        "ended after {:?}",
        started.elapsed()
    );
    unauthenticated(&get(&app, &jwt, "/v1/admin/overview").await);
}

/// Set once per process, before any server reads it (tests run on threads of one process).
fn hs256_secret_var() -> String {
    static VAR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VAR.get_or_init(|| {
        let var = format!("FENCEGATE_TEST_JWT_SECRET_{}", std::process::id());
        std::env::set_var(
            &var,
            format!(
                "{}{}",
                fencegate::auth::new_key().unwrap(),
                fencegate::auth::new_key().unwrap()
            ),
        );
        var
    })
    .clone()
}

// ---------------------------------------------------------------------------------------------

impl TestApp {
    async fn assert_absent_as(&self, secret: &str, key: &str) {
        get(self, secret, &format!("/v1/kv/{key}"))
            .await
            .problem(404, "not-found");
    }
}

/// `/v1/admin/*` needs the `admin` right; the audit log records the actor's name.
#[tokio::test]
async fn admin_routes_need_the_admin_right_and_audit_the_actor() {
    let (app, keys) = spawn_one_key_per_right().await;
    let (admin, writer) = (keys.of("admin"), keys.of("write"));
    put(&app, writer, "k", "100").await.expect(201);
    let reset = |secret: &str| {
        bearer(app.req(Method::POST, "/v1/admin/kv/k/reset"), secret)
            .json(&json!({"to": "5", "reason": "audit test"}))
    };
    for who in ["read", "write", "lock", "fence"] {
        let r = app.send(reset(keys.of(who))).await;
        assert_eq!(
            r.problem(403, "forbidden")["right"],
            json!("admin"),
            "{}",
            r.text
        );
        app.send(bearer(
            app.req(Method::GET, "/v1/admin/audit"),
            keys.of(who),
        ))
        .await
        .problem(403, "forbidden");
    }
    unauthenticated(
        &app.send(
            app.req(Method::POST, "/v1/admin/kv/k/reset")
                .json(&json!({"to": "5", "reason": "x"})),
        )
        .await,
    );
    app.send(reset(admin)).await.expect(200);
    let audit = app
        .send(bearer(app.req(Method::GET, "/v1/admin/audit"), admin))
        .await
        .expect(200);
    assert_eq!(
        audit["entries"].as_array().unwrap().len(),
        1,
        "only the admin's reset happened: {audit}"
    );
    assert_eq!(audit["entries"][0]["actor"], json!("key:admin"), "{audit}");
    put(&app, writer, "k", "6").await.expect(200);
}
