//! The edge under attack (docs/security.md, *The edge*; docs/operations.md, *Limits*): non-JSON bodies, oversized
//! declarations, forged request ids, slow and silent connections, trickled bodies, readers that
//! never read, half-sent requests at shutdown, too many sockets, foreign Host headers, CORS.
//! Slow clients are real sockets (`TcpStream`) against timeouts shortened in the settings.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{kv, spawn_app, spawn_app_with, unique, TestApp, TOKEN};

pub(crate) async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .expect("connect to fencegate")
}

/// Reads until the server closes the connection (EOF or reset) or `limit` passes; returns how
/// long it took, or `None` if the connection was still open at the limit.
pub(crate) async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Reads one response's head and returns its status line's code (the body, if any, is left).
pub(crate) async fn read_status(stream: &mut TcpStream, limit: Duration) -> Option<u16> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let deadline = Instant::now() + limit;
    while !head.ends_with(b"\r\n\r\n") {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => return None,
        }
    }
    String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

// --- Finding 4: cross-site requests -----------------------------------------------------------

#[tokio::test]
async fn a_body_that_is_not_declared_json_is_415_and_changes_nothing() {
    let app = spawn_app().await;
    let lock = unique("lock");
    // What a page on another site can send without a preflight.
    let simple = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{lock}"))
                .header("origin", "http://evil.example")
                .header("content-type", "text/plain")
                .body(r#"{"owner":"evil","ttl_ms":60000}"#),
        )
        .await;
    simple.problem(415, "unsupported-media-type");
    assert!(
        simple.header("access-control-allow-origin").is_none(),
        "{simple:?}"
    );
    let form = app
        .send(
            app.req(Method::PUT, &kv("k"))
                .header(TOKEN, "1")
                .header("content-type", "application/x-www-form-urlencoded")
                .body("a=1"),
        )
        .await;
    form.problem(415, "unsupported-media-type");
    let none = app
        .send(app.req(Method::PUT, &kv("k")).header(TOKEN, "1").body("1"))
        .await;
    none.problem(415, "unsupported-media-type");
    app.assert_absent("k").await;
    // Nothing was granted: the lock is free for a JSON request.
    let granted = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{lock}"))
                .json(&json!({"owner": "me", "ttl_ms": 1000})),
        )
        .await;
    assert_eq!(granted.expect(201)["owner"], json!("me"));

    // JSON with parameters, and +json types, are JSON; a request without a body needs no type.
    for (i, ct) in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
    ]
    .iter()
    .enumerate()
    {
        let r = app
            .send(
                app.req(Method::PUT, &kv(&format!("j{i}")))
                    .header(TOKEN, "1")
                    .header("content-type", *ct)
                    .body("1"),
            )
            .await;
        r.expect(201);
    }
    app.send(app.req(Method::DELETE, &kv("j0")).header(TOKEN, "2"))
        .await
        .expect(200);
    app.claim(&unique("s"), "1").await.expect(201);
}

// --- Finding 7: smaller ----------------------------------------------------------------------

#[tokio::test]
async fn a_declared_content_length_over_the_limit_is_413_at_once() {
    let app = spawn_app().await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"PUT /v1/kv/big HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let status = read_status(&mut stream, Duration::from_secs(3)).await;
    assert_eq!(
        status,
        Some(413),
        "no 413 within 3 s ({:?})",
        started.elapsed()
    );
    app.assert_absent("big").await;
}

#[tokio::test]
async fn a_client_request_id_is_echoed_only_when_short_and_plain() {
    let app = spawn_app().await;
    let plain = app
        .send(
            app.req(Method::GET, "/healthz")
                .header("x-request-id", "trace-1.2:3_a"),
        )
        .await;
    assert_eq!(plain.header("x-request-id"), Some("trace-1.2:3_a"));
    for bad in [
        "x".repeat(60_000),
        "x".repeat(129),
        r#"a" level=ERROR msg="forged"#.to_string(),
        "a b".into(),
    ] {
        let r = app
            .send(
                app.req(Method::GET, "/healthz")
                    .header("x-request-id", bad.as_str()),
            )
            .await;
        r.expect(200);
        let id = r.header("x-request-id").expect("a fresh request id");
        assert_ne!(id, bad, "an unacceptable id was echoed");
        assert!(
            id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b)),
            "{id:?}"
        );
    }
}

// --- Finding 1 (and 5): amplification through numbers -------------------------------------------

#[tokio::test]
async fn a_number_whose_expansion_exceeds_max_number_digits_is_400_before_any_database_work() {
    let app = spawn_app_with(|s| s.kv.max_number_digits = 1000).await;
    let put_raw = |key: &str, raw: &'static str| {
        app.req(Method::PUT, &kv(key))
            .header(TOKEN, "1")
            .header("content-type", "application/json")
            .body(raw)
    };
    for raw in [
        "1e131071",
        r#"{"a": [1, 1e1000]}"#,
        "-1E+999999",
        "1e-1000",
        "0.0e-1000",
    ] {
        let r = app.send(put_raw("amp", raw)).await;
        let body = r.problem(400, "invalid-json");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("kv.max_number_digits"),
            "{body}"
        );
    }
    app.assert_absent("amp").await;
    // 1000 digits is the limit, not over it; numbers inside strings are text.
    app.send(put_raw("ok", r#"{"n": 1e999, "s": "1e131071"}"#))
        .await
        .expect(201);
    let got = app.kv_get("ok").await;
    got.expect(200);
    assert!(got.text.len() < 2000, "{} bytes", got.text.len());
    // Batches too: nothing of them is applied.
    let batch = app
        .batch_raw("2", r#"{"ops":[{"op":"put","key":"ok","value":2},{"op":"put","key":"b","value":1e131071}]}"#)
        .await;
    batch.problem(400, "invalid-json");
    assert_eq!(
        app.kv_get("ok").await.expect(200)["fence_token"],
        json!("1"),
        "the batch was applied"
    );
    app.assert_absent("b").await;
}

// --- Finding 2: slow and idle connections ----------------------------------------------------------

#[tokio::test]
async fn a_client_sending_its_headers_slowly_is_cut_off() {
    let app = spawn_app_with(|s| s.server.header_timeout_ms = 300).await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // One header byte every 100 ms: each arrives well within any per-read timeout.
    let trickle = async {
        for b in
            b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                .iter()
        {
            if stream.write_all(&[*b]).await.is_err() {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        started.elapsed()
    };
    let cut = tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .expect("still open after 5 s");
    assert!(cut < Duration::from_secs(3), "cut off after {cut:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_idle_timeout_not_header_timeout() {
    let app = spawn_app_with(|s| {
        s.server.header_timeout_ms = 200;
        s.server.idle_timeout_ms = 1500;
    })
    .await;
    let mut stream = connect(&app).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    stream.write_all(request).await.unwrap();
    assert_eq!(
        read_status(&mut stream, Duration::from_secs(2)).await,
        Some(200)
    );
    let mut body = [0u8; 15];
    stream.read_exact(&mut body).await.unwrap(); // {"status":"ok"}
                                                 // Idle longer than the header timeout: still served.
    tokio::time::sleep(Duration::from_millis(600)).await;
    stream.write_all(request).await.unwrap();
    assert_eq!(
        read_status(&mut stream, Duration::from_secs(2)).await,
        Some(200),
        "closed before idle_timeout_ms"
    );
    stream.read_exact(&mut body).await.unwrap();
    let closed = closed_within(&mut stream, Duration::from_secs(5))
        .await
        .expect("an idle connection lived for ever");
    assert!(
        closed >= Duration::from_millis(1000),
        "closed after {closed:?}, before the idle timeout"
    );
}

// `server.max_connections` (idle connections closed to make room, a new one waits only while
// every connection is handling a request): tests/api/availability.rs.

/// Under `ulimit -n 64`, more silent connections than file descriptors: accept fails with
/// EMFILE. The server must neither die nor spin on it, and must serve again once the silent
/// connections are cut (header timeout).
#[tokio::test]
async fn running_out_of_file_descriptors_backs_off_and_recovers() {
    let db = crate::pg::fresh_database().await;
    let config = "[server]\nidle_timeout_ms = 1500\n[database]\nmax_connections = 4\n";
    let bin = crate::helpers::spawn_binary_configured(&db, config, Some(64)).await;
    let addr = bin.address.trim_start_matches("http://").to_owned();
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(
            TcpStream::connect(&addr)
                .await
                .expect("connect (the backlog takes what accept cannot)"),
        );
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(15);
    loop {
        let probe = bin
            .client
            .get(format!("{}/healthz", bin.address))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if probe.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz never answered again\nstderr:\n{}",
            bin.stderr()
        );
    }
    drop(silent);
    let (status, stderr) = bin.terminate().await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    let failures = stderr.lines().filter(|l| l.contains("accept")).count();
    assert!(
        failures >= 1,
        "accept never failed: the test did not reach the file limit\n{stderr}"
    );
    assert!(
        failures <= 40,
        "{failures} accept errors logged: accept spun\n{stderr}"
    );
}

// --- Finding 3: trickled bodies, probes, buffered bytes ---------------------------------------------

#[tokio::test]
async fn a_trickled_body_takes_no_in_flight_slot_and_is_408_after_body_timeout() {
    let app = spawn_app_with(|s| {
        s.server.max_in_flight = 1;
        s.server.body_timeout_ms = 1000;
    })
    .await;
    let mut tricklers = Vec::new();
    for i in 0..3 {
        let mut stream = connect(&app).await;
        let head = format!("PUT /v1/kv/t{i} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[1,");
        stream.write_all(head.as_bytes()).await.unwrap();
        tricklers.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Well-behaved clients are served while the bodies trickle.
    for i in 0..5 {
        app.kv_put(&format!("ok{i}"), "1", &json!(i))
            .await
            .expect(201);
    }
    app.get("/healthz").await.expect(200);
    for mut stream in tricklers {
        let _ = stream.write_all(b"1,").await;
        assert_eq!(
            read_status(&mut stream, Duration::from_secs(3)).await,
            Some(408)
        );
    }
    app.assert_absent("t0").await;
}

// `server.max_buffered_bytes` (charged as bytes arrive) and the minimum body rate:
// tests/api/availability.rs.

// --- Finding 6: readers that never read ------------------------------------------------------

#[tokio::test]
async fn a_reader_that_never_reads_is_disconnected_after_write_timeout() {
    let app = spawn_app_with(|s| {
        s.server.write_timeout_ms = 500;
        s.server.body_limit_bytes = 2 * 1024 * 1024;
        s.server.max_buffered_bytes = 4 * 1024 * 1024;
    })
    .await;
    app.kv_put("big", "1", &json!("x".repeat(1024 * 1024)))
        .await
        .expect(201);
    let mut stream = connect(&app).await;
    // 64 pipelined GETs of 1 MiB: far more than the socket buffers hold.
    let requests = "GET /v1/kv/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(64);
    stream.write_all(requests.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let closed = closed_within(&mut stream, Duration::from_secs(10)).await;
    assert!(
        closed.is_some(),
        "the connection of a reader that stopped reading stayed open"
    );
    app.get("/healthz").await.expect(200);
}

// --- Finding 7: half-sent requests at shutdown --------------------------------------------------

#[tokio::test]
async fn half_sent_requests_do_not_hold_up_shutdown() {
    let db = crate::pg::fresh_database().await;
    let bin =
        crate::helpers::spawn_binary_configured(&db, "[server]\nshutdown_grace_ms = 8000\n", None)
            .await;
    let app = bin.view();
    app.kv_put("k", "1", &json!(1)).await.expect(201);
    let mut half = Vec::new();
    for i in 0..5 {
        let mut headers = connect(&app).await;
        headers
            .write_all(b"PUT /v1/kv/h HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fen")
            .await
            .unwrap();
        half.push(headers);
        let mut body = connect(&app).await;
        let head = format!("PUT /v1/kv/b{i} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n[1,");
        body.write_all(head.as_bytes()).await.unwrap();
        half.push(body);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (status, stderr) = bin.terminate().await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "SIGTERM took {:?}\n{stderr}",
        started.elapsed()
    );
    assert!(
        !stderr.contains("did not finish"),
        "a misleading drain warning:\n{stderr}"
    );
}

// --- Finding 4: Host and CORS ------------------------------------------------------------------

#[tokio::test]
async fn on_loopback_without_auth_only_loopback_host_headers_are_served() {
    let app = spawn_app().await;
    let port = app.address.rsplit(':').next().unwrap().to_owned();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "10.0.0.1",
        "localhost.evil.example",
    ] {
        let r = app
            .send(app.req(Method::GET, "/healthz").header("host", host))
            .await;
        let body = r.problem(421, "misdirected-request");
        assert!(
            body["detail"].as_str().unwrap().contains("DNS rebinding"),
            "{body}"
        );
        let w = app
            .send(
                app.req(Method::PUT, &kv("rebound"))
                    .header("host", host)
                    .header(TOKEN, "1")
                    .json(&json!(1)),
            )
            .await;
        w.problem(421, "misdirected-request");
    }
    app.assert_absent("rebound").await;
    for host in [
        "localhost",
        &format!("localhost:{port}"),
        &format!("127.0.0.1:{port}"),
        "127.1.2.3",
        "[::1]:9",
    ] {
        app.send(app.req(Method::GET, "/healthz").header("host", host))
            .await
            .expect(200);
    }
}

/// Two `Host` headers (RFC 9112 3.2: 400): the rebinding check must not read only the first,
/// with or without auth, and nothing is written.
#[tokio::test]
async fn a_request_with_two_host_headers_is_400() {
    let app = spawn_app().await;
    for order in [
        ["localhost", "evil.example"],
        ["evil.example", "localhost"],
        ["localhost", "localhost"],
    ] {
        let mut stream = connect(&app).await;
        let body = "1";
        let request = format!(
            "PUT /v1/kv/two-hosts HTTP/1.1\r\nHost: {}\r\nHost: {}\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            order[0], order[1], body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        assert_eq!(
            read_status(&mut stream, Duration::from_secs(5)).await,
            Some(400),
            "{order:?}"
        );
    }
    app.assert_absent("two-hosts").await;
}

#[tokio::test]
async fn cors_headers_only_for_listed_origins() {
    let preflight = |app: &TestApp, origin: &str| {
        app.req(Method::OPTIONS, &kv("c"))
            .header("origin", origin)
            .header("access-control-request-method", "PUT")
            .header(
                "access-control-request-headers",
                "content-type,x-fencing-token,x-fencing-scope",
            )
    };
    let closed = spawn_app().await;
    for r in [
        closed.send(preflight(&closed, "http://app.example")).await,
        closed
            .send(
                closed
                    .req(Method::GET, "/healthz")
                    .header("origin", "http://app.example"),
            )
            .await,
    ] {
        assert!(
            !r.headers
                .keys()
                .any(|h| h.as_str().starts_with("access-control-")),
            "CORS headers with no origin configured: {r:?}"
        );
    }

    let open = spawn_app_with(|s| s.server.cors_origins = vec!["http://app.example".into()]).await;
    let ok = open.send(preflight(&open, "http://app.example")).await;
    assert!(ok.status < 300, "{ok:?}");
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://app.example"),
        "{ok:?}"
    );
    let allowed = ok
        .header("access-control-allow-headers")
        .unwrap_or("")
        .to_ascii_lowercase();
    for h in ["content-type", "x-fencing-token", "x-fencing-scope"] {
        assert!(allowed.contains(h), "{h} not allowed: {ok:?}");
    }
    let put = open
        .send(
            open.req(Method::PUT, &kv("c"))
                .header("origin", "http://app.example")
                .header(TOKEN, "1")
                .json(&json!(1)),
        )
        .await;
    put.expect(201);
    assert_eq!(
        put.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    let evil = open.send(preflight(&open, "http://evil.example")).await;
    assert!(
        evil.header("access-control-allow-origin").is_none(),
        "{evil:?}"
    );
}
