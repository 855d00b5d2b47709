//! HTTPS on the listener, and client certificates as identities (`[server.tls]`,
//! `[[auth.certs]]`), against docs/security.md.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;
use crate::pki::Pki;

/// A server with `[server.tls]` from `pki`, served over https:// by a client trusting `ca`
/// with the client certificate `identity`.
async fn spawn_tls(
    pki: &Pki,
    client_ca: Option<&str>,
    identity: Option<&str>,
    configure: impl FnOnce(&mut fencegate::config::Settings),
) -> TestApp {
    let tls = pki.settings(client_ca);
    let mut app = spawn_app_with(|s| {
        s.server.tls = Some(tls);
        configure(s);
    })
    .await;
    app.address = app.address.replace("http://", "https://");
    app.client = pki.client_for("ca", identity);
    app
}

fn port(app: &TestApp) -> u16 {
    app.address.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn https_put_and_get_work_with_the_ca() {
    let pki = Pki::new();
    let app = spawn_tls(&pki, None, None, |_| {}).await;
    let key = unique("tls");
    app.kv_put(&key, "1", &json!({"over": "tls"}))
        .await
        .expect(201);
    app.assert_value(&key, &json!({"over": "tls"}), "1").await;
    // A client that does not trust the CA refuses the server.
    let untrusting = reqwest::Client::builder().use_rustls_tls().build().unwrap();
    let err = untrusting
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
}

/// A plain-HTTP request to the TLS port is answered in plain HTTP: 400, saying to use https.
#[tokio::test]
async fn plain_http_to_the_tls_port_is_told_to_use_https() {
    let pki = Pki::new();
    let app = spawn_tls(&pki, None, None, |_| {}).await;
    let plain = client()
        .get(format!("http://127.0.0.1:{}/healthz", port(&app)))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    assert!(plain.text().await.unwrap().contains("https://"));
    app.get("/healthz").await.expect(200);
}

/// A client that opens TCP and never completes the handshake (nothing, or half a ClientHello)
/// is closed within the header timeout, and does not keep others out of the connection cap.
#[tokio::test]
async fn a_stalled_handshake_is_closed_within_the_header_timeout() {
    let pki = Pki::new();
    let app = spawn_tls(&pki, None, None, |s| {
        s.server.header_timeout_ms = 500;
        s.server.max_connections = 2;
    })
    .await;
    let addr = format!("127.0.0.1:{}", port(&app));
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // A TLS record header announcing 512 bytes of handshake, and 5 of them.
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
        .await
        .unwrap();
    for stream in [&mut silent, &mut half] {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("closed by the server");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "closed, nothing sent: {read:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "closed at the header timeout: {took:?}"
    );
    // The cap of 2 is free again for a real client; and a stalled one at the cap is closed to
    // make room for it.
    let _stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let _stalled2 = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t = Instant::now();
    app.get("/healthz").await.expect(200);
    assert!(
        t.elapsed() < Duration::from_millis(450),
        "room was made at once: {:?}",
        t.elapsed()
    );
}

/// A bad file at start-up stops it with an error naming the file and the problem.
#[tokio::test]
async fn bad_tls_files_stop_start_up_naming_the_file() {
    let pki = Pki::new();
    pki.ca("other");
    pki.server("stranger", "other");
    std::fs::write(pki.path("garbage.pem"), "not a certificate\n").unwrap();
    let cases: Vec<(fencegate::tls::TlsSettings, &str, &str)> = vec![
        (
            fencegate::tls::TlsSettings {
                cert_file: pki.path("missing.crt"),
                ..pki.settings(None)
            },
            "missing.crt",
            "cannot read",
        ),
        (
            fencegate::tls::TlsSettings {
                cert_file: pki.path("garbage.pem"),
                ..pki.settings(None)
            },
            "garbage.pem",
            "no certificate",
        ),
        (
            fencegate::tls::TlsSettings {
                key_file: pki.path("garbage.pem"),
                ..pki.settings(None)
            },
            "garbage.pem",
            "no usable private key",
        ),
        (
            fencegate::tls::TlsSettings {
                key_file: pki.path("stranger.key"),
                ..pki.settings(None)
            },
            "stranger.key",
            "private key of the chain's first certificate",
        ),
        (
            fencegate::tls::TlsSettings {
                client_ca_file: Some(pki.path("garbage.pem")),
                ..pki.settings(None)
            },
            "garbage.pem",
            "client_ca_file",
        ),
    ];
    for (tls, file, problem) in cases {
        let mut settings = fencegate::config::Settings::default();
        settings.database.url = Some(crate::pg::fresh_database().await);
        settings.server.tls = Some(tls);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = tokio::time::timeout(
            Duration::from_secs(30),
            fencegate::serve(settings, listener, std::future::pending()),
        )
        .await
        .expect("start-up fails at once")
        .expect_err("start-up must fail");
        let err = format!("{err:#}");
        assert!(
            err.contains(file) && err.contains(problem),
            "names {file} and {problem:?}: {err}"
        );
    }
}

// Client certificates -----------------------------------------------------------------------

/// The PKI of the client-certificate tests: the server's CA also issues clients' certificates;
/// `other` is a CA the server does not trust.
fn client_pki() -> Pki {
    let pki = Pki::new();
    pki.client("billing", "ca", "billing-worker", None);
    pki.client(
        "spiffe",
        "ca",
        "workload",
        Some("spiffe://corp/ns/billing/sa/worker"),
    );
    pki.client("nobody", "ca", "nobody", None);
    pki.client("admin", "ca", "ops-admin", None);
    pki.ca("other");
    pki.client("forged", "other", "billing-worker", None);
    pki
}

const KEY: &str = "a-bearer-key-for-the-client-certificate-tests";
const LOCK_KEY: &str = "a-bearer-key-with-the-lock-right-on-every-name";

fn cert_auth(s: &mut fencegate::config::Settings) {
    let entry =
        |name: &str, cn: Option<&str>, uri: Option<&str>, rights: &[&str], prefixes: &[&str]| {
            fencegate::auth::CertSettings {
                name: name.into(),
                subject_cn: cn.map(Into::into),
                uri_san: uri.map(Into::into),
                rights: rights.iter().map(|r| r.to_string()).collect(),
                prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
                tables: vec![],
            }
        };
    s.auth.certs = vec![
        entry(
            "billing",
            Some("billing-worker"),
            None,
            &["read", "write"],
            &["invoice-"],
        ),
        entry(
            "spiffe-worker",
            None,
            Some("spiffe://corp/ns/billing/sa/worker"),
            &["read", "write"],
            &["spiffe-"],
        ),
        entry("ops", Some("ops-admin"), None, &["admin"], &[]),
    ];
    s.auth.keys = vec![fencegate::auth::ApiKeySettings {
        name: "bearer".into(),
        sha256: fencegate::auth::digest_hex(KEY),
        rights: vec!["read".into(), "write".into()],
        prefixes: vec!["".into()],
        tables: vec![],
    }];
}

#[tokio::test]
async fn a_client_certificate_writes_within_its_prefixes_and_is_403_outside() {
    let pki = client_pki();
    let app = spawn_tls(&pki, Some("ca"), Some("billing"), cert_auth).await;
    let key = unique("invoice");
    app.kv_put(&key, "1", &json!(1)).await.expect(201);
    app.assert_value(&key, &json!(1), "1").await;
    let refused = app
        .kv_put(&unique("payroll"), "1", &json!(1))
        .await
        .problem(403, "forbidden");
    assert_eq!(refused["right"], json!("write"), "{refused}");

    // No certificate: bearer auth, as without client certificates.
    let mut plain = spawn_tls(&pki, Some("ca"), None, cert_auth).await;
    plain.get("/v1/kv/x").await.problem(401, "unauthenticated");
    let with_key = plain
        .send(
            plain
                .req(Method::PUT, &kv(&unique("any")))
                .bearer_auth(KEY)
                .header(TOKEN, "1")
                .json(&json!(2)),
        )
        .await;
    with_key.expect(201);

    // A verified certificate no entry names: 401, unless a bearer credential is sent.
    plain.client = pki.client_for("ca", Some("nobody"));
    let refused = plain
        .get(&kv("invoice-1"))
        .await
        .problem(401, "unauthenticated");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("[[auth.certs]]"),
        "{refused}"
    );
    plain
        .send(
            plain
                .req(Method::PUT, &kv(&unique("any")))
                .bearer_auth(KEY)
                .header(TOKEN, "1")
                .json(&json!(3)),
        )
        .await
        .expect(201);
}

#[tokio::test]
async fn a_spiffe_uri_san_is_an_identity() {
    let pki = client_pki();
    let app = spawn_tls(&pki, Some("ca"), Some("spiffe"), cert_auth).await;
    app.kv_put(&unique("spiffe"), "1", &json!(1))
        .await
        .expect(201);
    app.kv_put(&unique("invoice"), "1", &json!(1))
        .await
        .problem(403, "forbidden");
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_the_handshake() {
    let pki = client_pki();
    let app = spawn_tls(&pki, Some("ca"), Some("forged"), cert_auth).await;
    let err = app
        .client
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .expect_err("handshake refused");
    assert!(
        format!("{err:?}").contains("UnknownCA"),
        "the server refused the certificate: {err:?}"
    );
}

/// The actor of a certificate is `cert:NAME`: it owns the leases it takes, and the audit log
/// names it.
#[tokio::test]
async fn the_lease_owner_and_the_audit_log_show_the_certificate_actor() {
    let pki = client_pki();
    let mut app = spawn_tls(&pki, Some("ca"), Some("billing"), |s| {
        cert_auth(s);
        s.auth.certs[0].rights.push("lock".into());
        s.auth.keys.push(fencegate::auth::ApiKeySettings {
            name: "locker".into(),
            sha256: fencegate::auth::digest_hex(LOCK_KEY),
            rights: vec!["lock".into()],
            prefixes: vec!["".into()],
            tables: vec![],
        });
    })
    .await;
    let lock = unique("invoice-lock");
    let grant = app
        .req(Method::POST, &format!("/v1/locks/{lock}"))
        .json(&json!({"owner": "w", "ttl_ms": 60000}));
    let granted = app.send(grant).await.expect(201);
    let token = granted["token"].as_str().unwrap().to_owned();
    // The lease is cert:billing's: another actor with the lock right on every name (the bearer
    // key, given it here) may not release it; the certificate may.
    app.client = pki.client_for("ca", None);
    let path = format!("/v1/locks/{lock}");
    let refused = app
        .send(
            app.req(Method::DELETE, &path)
                .header(TOKEN, &token)
                .bearer_auth(LOCK_KEY),
        )
        .await
        .problem(403, "forbidden");
    assert_eq!(refused["lock"], json!(lock), "{refused}");
    app.client = pki.client_for("ca", Some("billing"));
    app.send(app.req(Method::DELETE, &path).header(TOKEN, &token))
        .await
        .expect(200);

    app.client = pki.client_for("ca", Some("admin"));
    let key = unique("audited");
    app.kv_put(&key, "9", &json!(1)).await.expect(201);
    app.send(
        app.req(Method::POST, &format!("/v1/admin/kv/{key}/reset"))
            .json(&json!({"to": "1", "reason": "cert test"})),
    )
    .await
    .expect(200);
    let audit = app.get("/v1/admin/audit?limit=1").await.expect(200);
    assert_eq!(audit["entries"][0]["actor"], json!("cert:ops"), "{audit}");
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A certificate is checked when the TLS handshake verifies it, and not when a client resumes
/// that session or keeps its connection: its validity is checked on every request. An admin
/// certificate that expires during the test: on the connection it opened, and on a resumed
/// session (a client that opens a connection per request, resuming the first one's session),
/// its requests are 401 once it has expired; a fresh handshake is refused.
#[tokio::test]
async fn a_client_certificate_past_its_not_after_is_refused_on_a_resumed_session_too() {
    let pki = client_pki();
    let mut app = spawn_tls(&pki, Some("ca"), None, cert_auth).await;
    app.get("/healthz").await.expect(200); // up and migrated: the certificate's time starts
    let not_after = unix_now() + 8;
    pki.client_until("brief", "ca", "ops-admin", not_after);
    app.client = pki.client_for("ca", Some("brief"));
    let mut pem = pki.read("brief.crt");
    pem.extend(pki.read("brief.key"));
    let resuming = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&pki.read("ca.crt")).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let audit = format!("{}/v1/admin/audit", app.address);
    app.get("/v1/admin/audit").await.expect(200);
    let fresh = resuming.get(&audit).send().await.unwrap();
    assert_eq!(fresh.status(), 200);

    // Wait until the certificate has expired (validity is to the second).
    while unix_now() <= not_after + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resumed = resuming
        .get(&audit)
        .send()
        .await
        .expect("a resumed session is not verified again: the request reaches the server");
    let status = resumed.status();
    let body = resumed.text().await.unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("notAfter"), "{body}");
    // The first client: on its connection if it kept it (401), or on a new one (refused).
    match app.client.get(&audit).send().await {
        Ok(kept) => assert_eq!(kept.status(), 401),
        Err(err) => assert!(format!("{err:?}").contains("CertificateExpired"), "{err:?}"),
    }
    // A new handshake verifies the certificate and fails.
    let refused = pki.client_for("ca", Some("brief")).get(&audit).send().await;
    assert!(
        refused.is_err(),
        "a fresh handshake with an expired certificate: {refused:?}"
    );
}

/// A certificate naming several identities (two CNs; two URI SANs; a CN and a URI SAN that
/// match different `[[auth.certs]]` entries) is refused, never resolved by the order of the
/// configuration; a CN with a URI SAN that matches nothing is one identity.
#[tokio::test]
async fn a_client_certificate_naming_several_identities_is_refused() {
    let pki = client_pki();
    pki.client_naming("two-cns", "ca", "/CN=billing-worker/CN=ops-admin", None);
    pki.client_naming(
        "two-uris",
        "ca",
        "/CN=no-entry",
        Some("URI:spiffe://corp/ns/billing/sa/worker,URI:spiffe://corp/ns/other/sa/x"),
    );
    pki.client_naming(
        "cn-and-uri",
        "ca",
        "/CN=billing-worker",
        Some("URI:spiffe://corp/ns/billing/sa/worker"),
    );
    pki.client_naming(
        "cn-and-other-uri",
        "ca",
        "/CN=billing-worker",
        Some("URI:spiffe://corp/ns/unconfigured/sa/x"),
    );
    for identity in ["two-cns", "two-uris", "cn-and-uri"] {
        let app = spawn_tls(&pki, Some("ca"), Some(identity), cert_auth).await;
        let refused = app
            .get(&kv("invoice-1"))
            .await
            .problem(401, "unauthenticated");
        assert!(
            refused["detail"]
                .as_str()
                .unwrap()
                .contains("several identities"),
            "{identity}: {refused}"
        );
    }
    let app = spawn_tls(&pki, Some("ca"), Some("cn-and-other-uri"), cert_auth).await;
    let key = unique("invoice");
    app.kv_put(&key, "1", &json!(1)).await.expect(201);
}
