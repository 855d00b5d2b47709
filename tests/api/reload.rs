//! SIGHUP reloads the credentials and the TLS certificate from the config file, without
//! dropping connections; a bad new file is logged and what was in force kept (the real binary).

use std::time::Duration;

use nix::sys::signal::Signal::SIGHUP;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;
use crate::pki::Pki;

const RELOADED: &str = "SIGHUP: configuration reloaded";
const NOT_RELOADED: &str = "SIGHUP: the configuration was NOT reloaded";

fn key_block(name: &str, key: &str) -> String {
    format!(
        "[[auth.keys]]\nname = \"{name}\"\nsha256 = \"{}\"\nrights = [\"read\", \"write\"]\nprefixes = [\"\"]\n",
        fencegate::auth::digest_hex(key)
    )
}

/// One request on a raw keep-alive connection; returns the status.
async fn request(stream: &mut TcpStream, key: &str) -> u16 {
    let req = format!("GET /v1/kv/reload-probe HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("a response")
            .unwrap();
        assert!(
            n > 0,
            "the connection was closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text[9..12].parse().unwrap();
            }
        }
    }
}

#[tokio::test]
async fn sighup_reloads_api_keys_and_keeps_open_connections() {
    let db = crate::pg::fresh_database().await;
    let (old, new) = (
        "the-old-key-of-the-reload-test",
        "the-new-key-of-the-reload-test",
    );
    let app = spawn_binary_configured(&db, &key_block("old", old), None).await;
    let addr = app.address.strip_prefix("http://").unwrap().to_owned();
    let mut open = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(
        request(&mut open, old).await,
        404,
        "authenticated: the key is not there"
    );

    std::fs::write(app.config_path(), key_block("new", new)).unwrap();
    app.signal(SIGHUP);
    let log = app.wait_for_log(RELOADED, 1).await;
    assert!(log.contains("1 API keys"), "{log}");

    assert_eq!(
        request(&mut open, new).await,
        404,
        "the connection opened before still serves, with the new key"
    );
    let view = app.view();
    let get = |key: &'static str| {
        view.req(reqwest::Method::GET, "/v1/kv/reload-probe")
            .bearer_auth(key)
    };
    view.send(get(new)).await.problem(404, "not-found");
    view.send(get(old)).await.problem(401, "unauthenticated");

    // A broken file: logged, and the keys in force stay.
    std::fs::write(
        app.config_path(),
        "[[auth.keys]]\nname = \"broken\"\nsha256 = \"not hex\"\nrights = []\n",
    )
    .unwrap();
    app.signal(SIGHUP);
    let log = app.wait_for_log(NOT_RELOADED, 1).await;
    assert!(
        log.contains("sha256 must be the 64 hex digits"),
        "says what is wrong: {log}"
    );
    view.send(get(new)).await.problem(404, "not-found");
    assert_eq!(request(&mut open, new).await, 404);
}

fn tls_config(pki: &Pki, key: &str) -> String {
    format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n\n{}",
        pki.path("server.crt"),
        pki.path("server.key"),
        key_block("k", key)
    )
}

#[tokio::test]
async fn sighup_serves_a_new_certificate_to_new_connections_and_keeps_open_ones() {
    let db = crate::pg::fresh_database().await;
    let pki = Pki::new();
    pki.ca("ca2");
    pki.server("server2", "ca2");
    let app =
        spawn_binary_configured(&db, &tls_config(&pki, "key-of-the-tls-reload-test"), None).await;
    let url = format!("{}/healthz", app.address.replace("http://", "https://"));
    let before = pki.client_for("ca", None);
    assert_eq!(before.get(&url).send().await.unwrap().status(), 200);

    // The certificate is replaced in place (as a renewal does), then SIGHUP.
    std::fs::copy(pki.path("server2.crt"), pki.path("server.crt")).unwrap();
    std::fs::copy(pki.path("server2.key"), pki.path("server.key")).unwrap();
    app.signal(SIGHUP);
    app.wait_for_log(RELOADED, 1).await;

    // The pooled connection of `before` is kept (a new one would now fail: its CA is not ca2).
    assert_eq!(
        before
            .get(&url)
            .send()
            .await
            .expect("the open connection still serves")
            .status(),
        200
    );
    let err = pki
        .client_for("ca", None)
        .get(&url)
        .send()
        .await
        .expect_err("a new connection gets the new certificate");
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
    assert_eq!(
        pki.client_for("ca2", None)
            .get(&url)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // A broken certificate file: logged with its name, and the running one kept.
    std::fs::write(
        pki.path("server.crt"),
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    app.signal(SIGHUP);
    let log = app.wait_for_log(NOT_RELOADED, 1).await;
    assert!(log.contains("server.crt"), "names the file: {log}");
    assert_eq!(
        pki.client_for("ca2", None)
            .get(&url)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// SIGHUP with a new server certificate that every handshake would refuse (expired; for client
/// authentication only) is not reloaded, saying why, and the running certificate stays.
#[tokio::test]
async fn sighup_refuses_an_expired_or_client_only_server_certificate_and_keeps_the_old() {
    let db = crate::pg::fresh_database().await;
    let pki = Pki::new();
    let an_hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    pki.server_until("expired", "ca", an_hour_ago);
    pki.client("client-only", "ca", "fencegate", None);
    let app = spawn_binary_configured(
        &db,
        &tls_config(&pki, "key-of-the-bad-certificate-reload-test"),
        None,
    )
    .await;
    let url = format!("{}/healthz", app.address.replace("http://", "https://"));
    assert_eq!(
        pki.client_for("ca", None)
            .get(&url)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    std::fs::copy(pki.path("server.crt"), pki.path("good.crt")).unwrap();
    std::fs::copy(pki.path("server.key"), pki.path("good.key")).unwrap();
    for (n, (bad, says)) in [("expired", "expired at"), ("client-only", "serverAuth")]
        .into_iter()
        .enumerate()
    {
        std::fs::copy(pki.path(&format!("{bad}.crt")), pki.path("server.crt")).unwrap();
        std::fs::copy(pki.path(&format!("{bad}.key")), pki.path("server.key")).unwrap();
        app.signal(SIGHUP);
        let log = app.wait_for_log(NOT_RELOADED, n + 1).await;
        assert!(log.contains(says), "{bad}: says why: {log}");
        // A new connection still gets the running certificate.
        assert_eq!(
            pki.client_for("ca", None)
                .get(&url)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{bad}: the old certificate is kept: {e:?}"))
                .status(),
            200
        );
    }
}
