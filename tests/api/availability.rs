//! Availability under hostile clients (docs/operations.md, *Limits*): stalled and trickled bodies must not
//! starve small writes and lease renewals, idle and half-sent sockets at the connection cap must
//! not keep new clients and probes out, a 401 or 403 ends its connection, and a transfer coding
//! fencegate does not decode is refused rather than stored as it came. Every attacker is a real
//! socket against the real server.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::edge::{closed_within, connect, read_status};
use crate::helpers::{kv, spawn_app_with, unique, TestApp, TOKEN};

/// Sends `request` and reads one whole response (head, then a `Content-Length` body); returns
/// the status and the body. The connection stays open for the next request.
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> (u16, String) {
    stream.write_all(request).await.expect("send the request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await;
        match read {
            Ok(Ok(1)) => head.push(byte[0]),
            other => panic!(
                "no whole response head ({other:?}): {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream
        .read_exact(&mut body)
        .await
        .expect("the response body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// A client that opens a new connection for every request (no pool): what a fresh client or a
/// load balancer's probe does.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
}

/// GET `path` on a new connection: its status, and how long it took.
async fn probe(app: &TestApp, path: &str) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let status = fresh_client()
        .get(format!("{}{path}", app.address))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    (status, started.elapsed())
}

/// PUT of `value` on a new connection: its status, and how long it took.
async fn fresh_put(app: &TestApp, key: &str, value: &Value) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let sent = fresh_client()
        .put(format!("{}{}", app.address, kv(key)))
        .header(TOKEN, "1")
        .json(value)
        .send()
        .await;
    (sent.ok().map(|r| r.status().as_u16()), started.elapsed())
}

/// The head of a PUT whose body is `length` bytes (none of it sent).
fn put_head(key: &str, length: usize) -> String {
    format!("PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n")
}

/// Sends a PUT of `body` to `key` under its declared length, in pieces of `piece` bytes with
/// `pause` after each: a slow client, as the edge sees it.
async fn put_in_pieces(
    stream: &mut tokio::net::TcpStream,
    key: &str,
    body: &str,
    piece: usize,
    pause: Duration,
) {
    stream
        .write_all(put_head(key, body.len()).as_bytes())
        .await
        .unwrap();
    for chunk in body.as_bytes().chunks(piece) {
        stream.write_all(chunk).await.unwrap();
        tokio::time::sleep(pause).await;
    }
}
/// Takes lock `name` for a minute; returns its token.
async fn acquire(app: &TestApp, name: &str) -> String {
    let granted = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{name}"))
                .json(&json!({"owner": "holder", "ttl_ms": 60_000})),
        )
        .await;
    granted.expect(201)["token"]
        .as_str()
        .expect("a token")
        .to_owned()
}

async fn renew(app: &TestApp, name: &str, token: &str) -> u16 {
    let renewed = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{name}/renew"))
                .header(TOKEN, token)
                .json(&json!({"ttl_ms": 60_000})),
        )
        .await;
    renewed.status
}

// --- Bodies: charged as they arrive, at a minimum rate, small ones never refused ------------------

/// 64 sockets declare a 1 MiB body each (64 MiB: the whole default `max_buffered_bytes`) and send
/// none of it; 8 more trickle theirs. Small writes and a lease renewal are still served at once,
/// long before `body_timeout_ms`.
#[tokio::test]
async fn stalled_and_trickled_bodies_at_the_buffer_cap_leave_small_writes_and_renewals_served() {
    let app = spawn_app_with(|s| s.server.body_timeout_ms = 30_000).await;
    let lock = unique("lease");
    let token = acquire(&app, &lock).await;
    let mut stalled = Vec::new();
    for i in 0..64 {
        let mut stream = connect(&app).await;
        stream
            .write_all(put_head(&format!("stalled{i}"), 1024 * 1024).as_bytes())
            .await
            .unwrap();
        stalled.push(stream);
    }
    let trickling = (0..8)
        .map(|i| {
            let address = app.address.trim_start_matches("http://").to_owned();
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(address).await.unwrap();
                stream
                    .write_all(put_head(&format!("trickled{i}"), 1024 * 1024).as_bytes())
                    .await
                    .unwrap();
                stream.write_all(b"\"").await.unwrap();
                while stream.write_all(b"a").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    for i in 0..5 {
        app.kv_put(
            &format!("honest{i}"),
            "1",
            &json!({"i": i, "pad": "x".repeat(8000)}),
        )
        .await
        .expect(201);
    }
    assert_eq!(
        renew(&app, &lock, &token).await,
        200,
        "a lease renewal was refused while bodies stalled"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "small requests took {:?}",
        started.elapsed()
    );
    for task in trickling {
        task.abort();
    }
    app.assert_absent("stalled0").await;
}

/// A stalled body and a trickled one are cut with 408 once they fall below
/// `server.min_body_rate_bytes_per_s` after their first second — not at `body_timeout_ms` —
/// while a body arriving a little faster than the minimum is served.
#[tokio::test]
async fn a_body_slower_than_the_minimum_rate_is_408_long_before_the_body_timeout() {
    let app = spawn_app_with(|s| {
        s.server.body_timeout_ms = 30_000;
        s.server.min_body_rate_bytes_per_s = 1000;
    })
    .await;
    let mut stalled = connect(&app).await;
    stalled
        .write_all(put_head("stalled", 100).as_bytes())
        .await
        .unwrap();
    let mut trickled = connect(&app).await;
    trickled
        .write_all(put_head("trickled", 100).as_bytes())
        .await
        .unwrap();
    trickled.write_all(b"[").await.unwrap();
    let started = Instant::now();
    let trickle = async {
        // 10 bytes a second: a hundredth of the minimum.
        while trickled.write_all(b"1,").await.is_ok() && started.elapsed() < Duration::from_secs(6)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        read_status(&mut trickled, Duration::from_secs(1)).await
    };
    let (stalled_status, trickled_status) =
        tokio::join!(read_status(&mut stalled, Duration::from_secs(6)), trickle);
    assert_eq!(
        stalled_status,
        Some(408),
        "a stalled body was not cut within 6 s"
    );
    assert_eq!(
        trickled_status,
        Some(408),
        "a trickled body was not cut within 6 s"
    );
    assert!(
        closed_within(&mut stalled, Duration::from_secs(2))
            .await
            .is_some(),
        "the connection of a cut body stayed open"
    );

    // 3000 bytes at 2000 bytes a second, past the first second: served.
    let mut steady = connect(&app).await;
    let body = format!("\"{}\"", "s".repeat(2998));
    put_in_pieces(
        &mut steady,
        "steady",
        &body,
        500,
        Duration::from_millis(250),
    )
    .await;
    assert_eq!(
        read_status(&mut steady, Duration::from_secs(3)).await,
        Some(201)
    );
    app.assert_absent("stalled").await;
    app.assert_absent("trickled").await;
}

/// Bodies that really arrived fill `max_buffered_bytes`: a large body beyond it is 503, a small
/// one is served, and the budget comes back when the holders are cut (`body_timeout_ms`).
#[tokio::test]
async fn large_bodies_holding_the_buffer_refuse_large_ones_but_never_small_ones() {
    let app = spawn_app_with(|s| {
        s.server.body_limit_bytes = 100_000;
        s.server.max_buffered_bytes = 100_000;
        s.server.body_timeout_ms = 4000;
    })
    .await;
    let mut holder = connect(&app).await;
    holder
        .write_all(put_head("held", 100_000).as_bytes())
        .await
        .unwrap();
    holder
        .write_all(format!("\"{}", "h".repeat(89_999)).as_bytes())
        .await
        .unwrap();

    // The holder's bytes count once the server has read them, which on a loaded machine can
    // take a while. Wait for it with probes that declare a large body and send none of it:
    // refused from their headers once the holder's bytes are in, and holding nothing while
    // they wait for a body (a probe that sent its body could take the budget first, and the
    // holder would be the one refused).
    let started = std::time::Instant::now();
    loop {
        let mut probe = connect(&app).await;
        probe
            .write_all(put_head(&unique("probe"), 50_002).as_bytes())
            .await
            .unwrap();
        let status = read_status(&mut probe, Duration::from_millis(200)).await;
        if status == Some(503) {
            break;
        }
        assert!(
            status.is_none() && started.elapsed() < Duration::from_secs(3),
            "a probe declaring a large body was answered {status:?} (or the holder's bytes were not read within 3 s)"
        );
    }
    let large = json!("l".repeat(50_000));
    let refused = app.kv_put("large", "1", &large).await;
    refused.problem(503, "unavailable");
    assert_eq!(refused.header("retry-after"), Some("1"));
    app.kv_put("small", "1", &json!("s".repeat(10_000)))
        .await
        .expect(201);

    assert_eq!(
        read_status(&mut holder, Duration::from_secs(6)).await,
        Some(408)
    );
    app.kv_put("large", "1", &large).await.expect(201);
    app.assert_absent("held").await;
}

// --- Connections: reaped at the cap, a per-client cap ----------------------------------------

/// `server.max_connections` full of idle keep-alive sockets (each served once) and of sockets
/// that sent half their headers: a probe and a write on new connections get in within a second
/// or two, by closing the connection idle the longest; nothing being handled is touched.
#[tokio::test]
async fn at_the_connection_cap_the_longest_idle_connections_make_room() {
    let app = spawn_app_with(|s| s.server.max_connections = 20).await;
    let mut idle = Vec::new();
    for _ in 0..10 {
        let mut stream = connect(&app).await;
        assert_eq!(exchange(&mut stream, HEALTHZ).await.0, 200);
        idle.push(stream);
    }
    let mut half = Vec::new();
    for _ in 0..10 {
        let mut stream = connect(&app).await;
        stream
            .write_all(b"PUT /v1/kv/half HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fen")
            .await
            .unwrap();
        half.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (status, took) = probe(&app, "/healthz").await;
    assert_eq!(
        status,
        Some(200),
        "/healthz did not answer at the cap (after {took:?})"
    );
    assert!(took < Duration::from_secs(2), "/healthz took {took:?}");
    let (status, took) = fresh_put(&app, "in", &json!(1)).await;
    assert_eq!(
        status,
        Some(201),
        "a PUT did not get in at the cap (after {took:?})"
    );
    assert!(took < Duration::from_secs(2), "the PUT took {took:?}");
    // Oldest first: the two first idle connections made room; the others are still served.
    for stream in &mut idle[..2] {
        assert!(
            closed_within(stream, Duration::from_secs(1))
                .await
                .is_some(),
            "the longest idle connection was not the one closed"
        );
    }
    assert_eq!(
        exchange(&mut idle[9], HEALTHZ).await.0,
        200,
        "a younger idle connection was closed"
    );
    let metrics = app.get("/metrics").await;
    assert!(
        metrics
            .text
            .lines()
            .any(|l| l.starts_with("fencegate_connections_closed_total") && l.contains("reaped")),
        "no reaped connection counted:\n{}",
        metrics.text
    );
    app.assert_absent("half").await;
}

/// A connection handling a request is never closed to make room: at a cap of 2 with both
/// connections waiting on the database, a third waits in the backlog, and all three are
/// answered once the database lets go.
#[tokio::test]
async fn connections_handling_a_request_are_never_reaped() {
    use sqlx::{Connection, Executor, PgConnection};
    let db = crate::pg::fresh_database().await;
    let app = crate::helpers::spawn_app_on(db.clone(), |s| s.server.max_connections = 2).await;
    let key = unique("k");
    // (This leaves the app client's connection idle: the first to make room.)
    app.kv_put(&key, "1", &json!("before")).await.expect(201);
    let mut holder = PgConnection::connect(&db).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    sqlx::query("SELECT 1 FROM fencegate.fencegate_kv WHERE key = $1 FOR UPDATE")
        .bind(&key)
        .execute(&mut holder)
        .await
        .unwrap();
    let stuck: Vec<_> = (2..4)
        .map(|token| {
            let url = format!("{}{}", app.address, kv(&key));
            tokio::spawn(async move {
                let sent = fresh_client()
                    .put(url)
                    .timeout(Duration::from_secs(20))
                    .header(TOKEN, token.to_string())
                    .json(&json!(token))
                    .send()
                    .await;
                sent.map(|r| r.status().as_u16())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = fresh_client()
        .get(format!("{}/healthz", app.address))
        .timeout(Duration::from_millis(700))
        .send()
        .await;
    assert!(
        waiting.is_err(),
        "a third connection got in by closing one handling a request: {waiting:?}"
    );
    holder.execute("COMMIT").await.unwrap();
    for task in stuck {
        let status = task.await.unwrap().expect("a stuck request was cut");
        assert!(status == 200 || status == 412, "{status}");
    }
    assert_eq!(probe(&app, "/healthz").await.0, Some(200));
}

/// `server.max_connections_per_client`: one address's connections beyond it are closed at once;
/// its others are served, and so is a new one once it closes one.
#[tokio::test]
async fn connections_beyond_max_connections_per_client_are_closed_at_once() {
    let app = spawn_app_with(|s| s.server.max_connections_per_client = 3).await;
    let mut kept = Vec::new();
    for _ in 0..3 {
        let mut stream = connect(&app).await;
        assert_eq!(exchange(&mut stream, HEALTHZ).await.0, 200);
        kept.push(stream);
    }
    let mut excess = connect(&app).await;
    let _ = excess.write_all(HEALTHZ).await;
    let closed = closed_within(&mut excess, Duration::from_secs(1)).await;
    assert!(
        closed.is_some(),
        "a connection beyond the per-client cap was kept open"
    );
    assert_eq!(exchange(&mut kept[0], HEALTHZ).await.0, 200);
    drop(kept.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = connect(&app).await;
    assert_eq!(exchange(&mut again, HEALTHZ).await.0, 200);
    drop((kept, again));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let metrics = app.get("/metrics").await;
    assert!(
        metrics.text.lines().any(
            |l| l.starts_with("fencegate_connections_closed_total") && l.contains("per-client")
        ),
        "no connection over the per-client cap counted:\n{}",
        metrics.text
    );
}

/// Slowloris at twice the cap: 40 sockets sending a header byte every 200 ms against a cap of 20,
/// reconnecting whenever they are cut. Probes and writes on new connections keep answering
/// within a second or two.
#[tokio::test]
async fn slowloris_at_twice_the_cap_leaves_probes_and_writes_answering() {
    let app = spawn_app_with(|s| s.server.max_connections = 20).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let attackers: Vec<_> = (0..40)
        .map(|_| {
            let address = address.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(mut stream) = TcpStream::connect(&address).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    if stream
                        .write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
                        .await
                        .is_err()
                    {
                        continue;
                    }
                    while stream.write_all(b"a").await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 0..5 {
        for path in ["/healthz", "/readyz"] {
            let (status, took) = probe(&app, path).await;
            assert_eq!(
                status,
                Some(200),
                "{path} in round {round}: no answer (after {took:?})"
            );
            assert!(
                took < Duration::from_secs(2),
                "{path} in round {round} took {took:?}"
            );
        }
        let (status, took) = fresh_put(&app, &format!("w{round}"), &json!(round)).await;
        assert_eq!(
            status,
            Some(201),
            "a PUT in round {round}: no answer (after {took:?})"
        );
        assert!(
            took < Duration::from_secs(2),
            "a PUT in round {round} took {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for attacker in attackers {
        attacker.abort();
    }
}

// --- 401 and 403 close their connection ----------------------------------------------------------

fn key(name: &str, rights: &[&str]) -> (String, fencegate::auth::ApiKeySettings) {
    let secret = fencegate::auth::new_key().unwrap();
    let settings = fencegate::auth::ApiKeySettings {
        name: name.into(),
        sha256: fencegate::auth::digest_hex(&secret),
        rights: rights.iter().map(|r| r.to_string()).collect(),
        prefixes: vec![String::new()],
        tables: Vec::new(),
    };
    (secret, settings)
}

/// A 401 and a 403 end their connection (`Connection: close`, then EOF), so sockets that were
/// refused never hold the connection cap: with the cap full of them, /healthz answers.
#[tokio::test]
async fn a_401_or_403_closes_its_connection_and_refused_sockets_never_hold_the_cap() {
    let (reader, settings) = key("reader", &["read"]);
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![settings];
        s.server.max_connections = 20;
    })
    .await;
    let unauthenticated = b"GET /v1/kv/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    let mut refused = connect(&app).await;
    assert_eq!(exchange(&mut refused, unauthenticated).await.0, 401);
    assert!(
        closed_within(&mut refused, Duration::from_secs(1))
            .await
            .is_some(),
        "a connection stayed open after its 401"
    );

    let mut forbidden = connect(&app).await;
    let put = format!(
        "PUT /v1/kv/f HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {reader}\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 1\r\n\r\n1"
    );
    let (status, body) = exchange(&mut forbidden, put.as_bytes()).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        closed_within(&mut forbidden, Duration::from_secs(1))
            .await
            .is_some(),
        "a connection stayed open after its 403"
    );

    let mut held = Vec::new();
    for _ in 0..20 {
        let mut stream = connect(&app).await;
        assert_eq!(exchange(&mut stream, unauthenticated).await.0, 401);
        held.push(stream);
    }
    let (status, took) = probe(&app, "/healthz").await;
    assert_eq!(
        status,
        Some(200),
        "/healthz did not answer (after {took:?})"
    );
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
}

// --- Transfer codings -------------------------------------------------------------------------------

/// `Transfer-Encoding: gzip, chunked`: fencegate does not decode gzip, so it must not store the
/// body as it came (compressed, or mislabelled): 501 `unsupported-transfer-coding`, nothing
/// stored, connection closed. Plain `chunked` is served.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_501_and_nothing_is_stored() {
    let app = spawn_app_with(|_| {}).await;
    let gzipped: &[u8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\x53\xaa\xca\x2c\x28\x48\x4d\x51\x02\x00\x6a\xcd\x92\xb1\x08\x00\x00\x00";
    let labelled: &[u8] = b"\"raw\"";
    for (key, codings, body) in [
        ("gz", "Transfer-Encoding: gzip, chunked\r\n", gzipped),
        ("label", "Transfer-Encoding: gzip, chunked\r\n", labelled),
        (
            "split",
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            labelled,
        ),
        (
            "deflate",
            "Transfer-Encoding: deflate,chunked\r\n",
            labelled,
        ),
    ] {
        let mut stream = connect(&app).await;
        let mut request = format!(
            "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\n{codings}\r\n{:x}\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        request.extend_from_slice(b"\r\n0\r\n\r\n");
        let (status, text) = exchange(&mut stream, &request).await;
        assert_eq!(status, 501, "{key}: {text}");
        let problem: Value = serde_json::from_str(&text).expect("a problem+json body");
        assert_eq!(
            problem["type"],
            json!("https://fencegate.dev/problems/unsupported-transfer-coding"),
            "{text}"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains("chunked"),
            "{text}"
        );
        assert!(
            closed_within(&mut stream, Duration::from_secs(1))
                .await
                .is_some(),
            "{key}: the connection stayed open"
        );
        app.assert_absent(key).await;
    }
    let mut stream = connect(&app).await;
    let chunked = b"PUT /v1/kv/plain HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n\"raw\"\r\n0\r\n\r\n";
    assert_eq!(exchange(&mut stream, chunked).await.0, 201);
    app.assert_value("plain", &json!("raw"), "1").await;
}

/// A body that arrives in many pieces (a declared length, then chunked) is stored exactly as
/// sent: the edge keeps a one-piece body as it came and joins the pieces of any other.
#[tokio::test]
async fn a_body_in_many_pieces_is_stored_as_sent() {
    let app = spawn_app_with(|_| {}).await;
    let value = json!({"pieces": "abcdefghij".repeat(30), "n": [1, 2, 3]});
    let body = value.to_string();
    let mut sized = connect(&app).await;
    put_in_pieces(&mut sized, "pieces", &body, 70, Duration::from_millis(30)).await;
    assert_eq!(
        read_status(&mut sized, Duration::from_secs(3)).await,
        Some(201)
    );
    app.assert_value("pieces", &value, "1").await;

    let mut chunked = connect(&app).await;
    chunked
        .write_all(b"PUT /v1/kv/chunks HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for piece in body.as_bytes().chunks(70) {
        chunked
            .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
            .await
            .unwrap();
        chunked.write_all(piece).await.unwrap();
        chunked.write_all(b"\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    chunked.write_all(b"0\r\n\r\n").await.unwrap();
    assert_eq!(
        read_status(&mut chunked, Duration::from_secs(3)).await,
        Some(201)
    );
    app.assert_value("chunks", &value, "1").await;
}

/// Sends `request` on a fresh connection and returns its one answer, after checking that the
/// server then closed the connection without answering anything else (no request smuggled in
/// behind it was served).
async fn answered_once(app: &TestApp, key: &str, request: &str) -> (u16, String) {
    let mut stream = connect(app).await;
    let answer = exchange(&mut stream, request.as_bytes()).await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut rest))
        .await
        .unwrap_or_else(|_| panic!("{key}: the connection stayed open"))
        .ok();
    assert!(
        rest.is_empty(),
        "{key}: a second response came: {:?}",
        String::from_utf8_lossy(&rest)
    );
    answer
}

/// Request smuggling by framing: a request that declares its body two ways (`Content-Length`
/// and `Transfer-Encoding: chunked`, in either order) is read by its chunks, as RFC 9112 6.3
/// has it, and its connection is closed after the answer, so bytes the other framing would
/// have made a second request are never served. Lengths that disagree or are not plain digits
/// are 400 and store nothing; whitespace around a length is allowed.
#[tokio::test]
async fn a_body_framed_two_ways_never_smuggles_a_second_request() {
    let app = spawn_app_with(|_| {}).await;
    let smuggled = "PUT /v1/kv/smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 1\r\n\r\n1";
    for (key, framing) in [
        (
            "cl-then-te",
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
        ),
        (
            "te-then-cl",
            "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
        ),
    ] {
        let request = format!(
            "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\n{framing}\r\n5\r\n\"raw\"\r\n0\r\n\r\n{smuggled}"
        );
        let (status, text) = answered_once(&app, key, &request).await;
        assert_eq!(status, 201, "{key}: {text}");
        app.assert_value(key, &json!("raw"), "1").await;
    }
    app.assert_absent("smuggled").await;

    for (key, lengths) in [
        ("two", "Content-Length: 1\r\nContent-Length: 2\r\n"),
        ("plus", "Content-Length: +1\r\n"),
        ("minus", "Content-Length: -1\r\n"),
        ("list", "Content-Length: 1, 1\r\n"),
        ("inner-space", "Content-Length: 1 1\r\n"),
        ("hex", "Content-Length: 0x1\r\n"),
        ("huge", "Content-Length: 99999999999999999999999\r\n"),
    ] {
        let request = format!(
            "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\n{lengths}\r\n1{smuggled}"
        );
        let (status, text) = answered_once(&app, key, &request).await;
        assert_eq!(status, 400, "{key}: {text}");
        app.assert_absent(key).await;
    }
    app.assert_absent("smuggled").await;

    let mut stream = connect(&app).await;
    let spaced = "PUT /v1/kv/spaced HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length:   1  \r\n\r\n1";
    let (status, text) = exchange(&mut stream, spaced.as_bytes()).await;
    assert_eq!(status, 201, "{text}");
    app.assert_value("spaced", &json!(1), "1").await;
}
