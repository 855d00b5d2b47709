//! HTTP/2: h2c with prior knowledge on the plain listener, `h2` by ALPN on TLS; every HTTP/1
//! protection per stream, and HTTP/2's own against hostile clients written frame by frame.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{tcp::OwnedWriteHalf, TcpStream};

use crate::helpers::*;
use crate::pki::Pki;

fn addr(app: &TestApp) -> String {
    app.address.split("://").nth(1).unwrap().to_owned()
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// An HTTP/2 connection over `io` (hyper's client).
async fn h2<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: I) -> Sender {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

async fn call(
    sender: &mut Sender,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut req = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = sender
        .send_request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .expect("a response");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Over one h2c connection: a write and a read, and the edge's refusals, each per stream.
#[tokio::test]
async fn h2c_with_prior_knowledge_serves_and_keeps_every_protection_per_stream() {
    let app = spawn_app_with(|s| s.server.body_limit_bytes = 1024).await;
    let base = format!("http://{}", addr(&app));
    let mut h2 = h2(TcpStream::connect(addr(&app)).await.unwrap()).await;
    let key = unique("h2");
    let json = [("content-type", "application/json"), (TOKEN, "1")];
    let (status, body) = call(
        &mut h2,
        Method::PUT,
        &format!("{base}/v1/kv/{key}"),
        &json,
        r#"{"v":1}"#,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        &mut h2,
        Method::GET,
        &format!("{base}/v1/kv/{key}"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""fence_token":"1""#), "{body}");
    // 415, 413, a stale token, and the Host (:authority) check of a loopback server without
    // auth: each refuses its stream, the connection serves the next.
    let (status, _) = call(
        &mut h2,
        Method::PUT,
        &format!("{base}/v1/kv/{key}"),
        &[("content-type", "text/plain"), (TOKEN, "2")],
        "1",
    )
    .await;
    assert_eq!(status, 415);
    let (status, _) = call(
        &mut h2,
        Method::PUT,
        &format!("{base}/v1/kv/{key}"),
        &json,
        &format!("\"{}\"", "x".repeat(2000)),
    )
    .await;
    assert_eq!(status, 413);
    let (status, _) = call(
        &mut h2,
        Method::GET,
        &format!("http://evil.example/v1/kv/{key}"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 421);
    let (status, body) = call(
        &mut h2,
        Method::PUT,
        &format!("{base}/v1/kv/{key}"),
        &[("content-type", "application/json"), (TOKEN, "0")],
        "2",
    )
    .await;
    assert_eq!(status, 412, "{body}");
    let (status, _) = call(&mut h2, Method::GET, &format!("{base}/healthz"), &[], "").await;
    assert_eq!(status, 200);
}

/// HTTPS offers h2 by ALPN; a client that asks for it speaks HTTP/2.
#[tokio::test]
async fn https_speaks_h2_by_alpn() {
    let pki = Pki::new();
    let tls = pki.settings(None);
    let app = spawn_app_with(|s| s.server.tls = Some(tls)).await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pki.read("ca.crt")) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr(&app)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut h2 = h2(stream).await;
    let base = format!("https://{}", addr(&app));
    let key = unique("h2tls");
    let (status, body) = call(
        &mut h2,
        Method::PUT,
        &format!("{base}/v1/kv/{key}"),
        &[("content-type", "application/json"), (TOKEN, "3")],
        "7",
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

// Raw frames ---------------------------------------------------------------------------------

use rustls_pki_types::pem::PemObject as _;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK, no Huffman: `:method`, `:scheme http`, `:path`, `:authority 127.0.0.1`.
fn request_block(method_get: bool, path: &str) -> Vec<u8> {
    let mut block = vec![
        if method_get { 0x82 } else { 0x83 },
        0x86,
        0x04,
        path.len() as u8,
    ];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 9]);
    block.extend_from_slice(b"127.0.0.1");
    block
}

/// A literal header field without indexing, new name; `value` up to 127 bytes or longer
/// (HPACK integer with a 7-bit prefix).
fn literal(name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x00, name.len() as u8];
    out.extend_from_slice(name.as_bytes());
    let mut n = value.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128 + 128) as u8);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(value);
    out
}

/// What a raw client saw of the server: frames by type, until it closed.
#[derive(Default, Debug)]
struct Seen {
    frames: Vec<(u8, u8, u32, Vec<u8>)>,
    closed: bool,
}

impl Seen {
    fn goaway(&self) -> Option<u32> {
        self.frames
            .iter()
            .find(|f| f.0 == GOAWAY)
            .map(|f| u32::from_be_bytes(f.3[4..8].try_into().unwrap()))
    }
    fn count(&self, kind: u8) -> usize {
        self.frames.iter().filter(|f| f.0 == kind).count()
    }
}

/// Reads frames until the server closes the connection or `within` passes.
async fn read_frames<R: AsyncRead + Unpin>(reader: &mut R, within: Duration) -> Seen {
    read_until(reader, within, |_| false).await
}

/// Reads frames until the server closes the connection, `within` passes, or what was seen
/// is `enough`.
async fn read_until<R: AsyncRead + Unpin>(
    reader: &mut R,
    within: Duration,
    enough: impl Fn(&Seen) -> bool,
) -> Seen {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Seen::default();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        match tokio::time::timeout_at(deadline, reader.read(&mut chunk)).await {
            Err(_) => return seen,
            Ok(Ok(0)) | Ok(Err(_)) => {
                seen.closed = true;
                return seen;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes(buf[5..9].try_into().unwrap()) & 0x7fff_ffff;
            seen.frames
                .push((buf[3], buf[4], stream, buf[9..9 + len].to_vec()));
            buf.drain(..9 + len);
        }
        if enough(&seen) {
            return seen;
        }
    }
}

async fn raw(app: &TestApp) -> TcpStream {
    let mut stream = TcpStream::connect(addr(app)).await.unwrap();
    stream.write_all(PREFACE).await.unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    stream
}

/// A raw connection whose frames a task of their own reads (until the server closes it,
/// `within` passes, or what was seen is `enough`), and the half to write requests on.
async fn reading(
    app: &TestApp,
    within: Duration,
    enough: impl Fn(&Seen) -> bool + Send + 'static,
) -> (tokio::task::JoinHandle<Seen>, OwnedWriteHalf) {
    let (mut reader, writer) = raw(app).await.into_split();
    let read = tokio::spawn(async move { read_until(&mut reader, within, enough).await });
    (read, writer)
}

/// Rapid reset (CVE-2023-44487): requests cancelled as soon as they are sent. The connection
/// is told to go away (ENHANCE_YOUR_CALM) long before a thousand, and the server still serves.
#[tokio::test]
async fn rapid_reset_is_cut_off() {
    let app = spawn_app().await;
    let (read, mut writer) = reading(&app, Duration::from_secs(10), |_| false).await;
    let mut flood = Vec::new();
    for i in 0..1000u32 {
        let id = 2 * i + 1;
        flood.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &request_block(true, "/v1/kv/reset-flood"),
        ));
        flood.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), writer.write_all(&flood)).await;
    let seen = read.await.unwrap();
    assert_eq!(
        seen.goaway(),
        Some(0xb),
        "GOAWAY ENHANCE_YOUR_CALM: {:?}",
        seen.frames.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert!(
        seen.count(HEADERS) < 100,
        "few of the reset requests were answered: {}",
        seen.count(HEADERS)
    );
    app.get("/healthz").await.expect(200);
}

/// A header block that never ends (CONTINUATION frames without END_HEADERS): the connection
/// is closed once the block passes the header-list limit, after a bounded number of bytes.
#[tokio::test]
async fn a_continuation_flood_is_closed() {
    let app = spawn_app().await;
    let (read, mut writer) = reading(&app, Duration::from_secs(10), |_| false).await;
    let mut sent = 0usize;
    let first = request_block(true, "/healthz");
    writer
        .write_all(&frame(HEADERS, END_STREAM, 1, &first))
        .await
        .unwrap();
    let filler = literal("x-filler", &[b'a'; 16000]);
    let started = Instant::now();
    while sent < 50 << 20 && started.elapsed() < Duration::from_secs(10) && !read.is_finished() {
        match tokio::time::timeout(
            Duration::from_millis(500),
            writer.write_all(&frame(CONTINUATION, 0, 1, &filler)),
        )
        .await
        {
            Ok(Ok(())) => sent += filler.len(),
            Ok(Err(_)) => break,
            Err(_) => {} // the server stopped reading: the reader tells whether it closed
        }
    }
    let seen = read.await.unwrap();
    assert!(seen.closed || seen.goaway().is_some(), "closed: {seen:?}");
    assert!(
        sent < 8 << 20,
        "closed after a bounded header block, not after {sent} bytes"
    );
    app.get("/healthz").await.expect(200);
}

/// `server.http2_max_concurrent_streams` is announced, and a stream beyond it is refused
/// (RST_STREAM REFUSED_STREAM) while the others are in progress.
#[tokio::test]
async fn concurrent_streams_are_capped() {
    let app = spawn_app_with(|s| s.server.http2_max_concurrent_streams = 2).await;
    let stream = raw(&app).await;
    let (mut reader, mut writer) = stream.into_split();
    let mut open = Vec::new();
    for id in [1u32, 3, 5] {
        // PUTs whose bodies never come: each stream stays open.
        let mut block = request_block(false, &format!("/v1/kv/{}", unique("streams")));
        block.extend(literal("content-type", b"application/json"));
        block.extend(literal("x-fencing-token", b"1"));
        open.extend(frame(HEADERS, END_HEADERS, id, &block));
    }
    open.extend(frame(DATA, 0, 1, b"1"));
    writer.write_all(&open).await.unwrap();
    let seen = read_frames(&mut reader, Duration::from_millis(1500)).await;
    let settings = seen
        .frames
        .iter()
        .find(|f| f.0 == SETTINGS && f.1 == 0)
        .expect("the server's SETTINGS");
    let announced = settings
        .3
        .chunks(6)
        .find(|s| s[..2] == [0, 3])
        .map(|s| u32::from_be_bytes(s[2..6].try_into().unwrap()));
    assert_eq!(announced, Some(2), "SETTINGS_MAX_CONCURRENT_STREAMS");
    let refused: Vec<_> = seen
        .frames
        .iter()
        .filter(|f| f.0 == RST_STREAM)
        .map(|f| (f.2, u32::from_be_bytes(f.3[..4].try_into().unwrap())))
        .collect();
    // (1 and 3 are answered, 408, when their bodies fall below the minimum rate.)
    let refused: Vec<u32> = refused
        .into_iter()
        .filter(|(_, code)| *code == 7)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        refused,
        vec![5],
        "stream 5 refused (REFUSED_STREAM), 1 and 3 admitted"
    );
}

/// A connection that sends only PINGs (and reads its PONGs) after its request is idle: closed
/// after the idle timeout, whatever it sends.
#[tokio::test]
async fn pings_do_not_keep_an_idle_connection_open() {
    let app = spawn_app_with(|s| s.server.idle_timeout_ms = 1000).await;
    let stream = raw(&app).await;
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(&frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            1,
            &request_block(true, "/healthz"),
        ))
        .await
        .unwrap();
    let read = tokio::spawn(async move { read_frames(&mut reader, Duration::from_secs(6)).await });
    let started = Instant::now();
    while !read.is_finished() && started.elapsed() < Duration::from_secs(6) {
        if writer.write_all(&frame(PING, 0, 0, &[7; 8])).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = read.await.unwrap();
    assert!(seen.closed, "closed while pinging: {:?}", seen.frames.len());
    assert!(seen.count(PING) > 5, "PONGs were sent meanwhile");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "closed at the idle timeout, not {took:?}"
    );
}

/// A SETTINGS and PING flood that never reads the acknowledgements: the server stops reading
/// once its writes back up, and the write timeout closes the connection.
#[tokio::test]
async fn a_settings_and_ping_flood_that_reads_nothing_is_closed() {
    let app = spawn_app_with(|s| {
        s.server.write_timeout_ms = 1000;
        s.server.header_timeout_ms = 60_000;
    })
    .await;
    let mut stream = raw(&app).await;
    let mut flood = Vec::new();
    for _ in 0..1000 {
        flood.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]));
        flood.extend(frame(PING, 0, 0, &[1; 8]));
    }
    // Flood until our writes block: the server stopped reading, its acknowledgements unread.
    // Blocked for 2 s, not less: a server that is only slow (a loaded machine) blocks us for a
    // moment and then reads on, its send buffer (up to 4 MiB on Linux) not yet full; stopping
    // the flood then leaves it idle with nothing to write, and nothing to time out.
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server kept reading a flood it could not answer"
        );
        match tokio::time::timeout(Duration::from_millis(2000), stream.write_all(&flood)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break, // closed already
            Err(_) => break,     // blocked
        }
    }
    // Read nothing past the write timeout; then the connection must be gone: draining what was
    // sent ends in EOF or a reset, not in the server answering the rest of the flood.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let mut sink = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(
        closed,
        "closed within the write timeout of its acknowledgements backing up"
    );
    app.get("/healthz").await.expect(200);
}

/// A header list over `server.http2_max_header_list_bytes` is refused (431 or a reset), and
/// the server goes on serving.
#[tokio::test]
async fn an_oversized_header_list_is_refused() {
    let app = spawn_app_with(|s| s.server.http2_max_header_list_bytes = 4096).await;
    let stream = raw(&app).await;
    let (mut reader, mut writer) = stream.into_split();
    let mut block = request_block(true, "/healthz");
    block.extend(literal("x-big", &[b'b'; 8000]));
    writer
        .write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await
        .unwrap();
    let seen = read_frames(&mut reader, Duration::from_millis(1500)).await;
    let answered_ok = seen
        .frames
        .iter()
        .any(|f| f.0 == HEADERS && f.2 == 1 && f.3.first() == Some(&0x88));
    assert!(!answered_ok, "not served: {seen:?}");
    let refused = seen
        .frames
        .iter()
        .any(|f| f.2 == 1 && (f.0 == RST_STREAM || f.0 == HEADERS))
        || seen.goaway().is_some();
    assert!(refused, "refused: {seen:?}");
    app.get("/healthz").await.expect(200);
}

/// Opens a raw h2c connection that announces a zero flow-control window for every stream
/// (SETTINGS_INITIAL_WINDOW_SIZE = 0), asks for `path` on `streams` streams at once and never
/// makes room: what the server sent back, until it closed the connection or 20 s passed, and
/// how long that took.
async fn zero_window_reader(app: &TestApp, path: &str, streams: u32) -> (Seen, Duration) {
    let mut stream = TcpStream::connect(addr(app)).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]));
    for i in 0..streams {
        out.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            2 * i + 1,
            &request_block(true, path),
        ));
    }
    stream.write_all(&out).await.unwrap();
    let started = Instant::now();
    let seen = read_frames(&mut stream, Duration::from_secs(20)).await;
    (seen, started.elapsed())
}

/// The streams the server answered (a HEADERS frame) and those it refused (RST_STREAM
/// REFUSED_STREAM).
fn answered_and_refused(seen: &Seen) -> (usize, usize) {
    let answered = seen.frames.iter().filter(|f| f.0 == HEADERS).count();
    let refused = seen
        .frames
        .iter()
        .filter(|f| f.0 == RST_STREAM && f.3[..4] == 7u32.to_be_bytes())
        .count();
    (answered, refused)
}

/// Clients that never read (a zero window) hold responses without ever blocking a write. The
/// bytes they hold are a budget: per connection (about five 200 KB responses in 1 MiB), then
/// in all (a second connection gets what is left of 1.5 MiB); the streams beyond it are
/// refused (REFUSED_STREAM), and each connection is closed once it has made no room for
/// `server.write_timeout_ms`, which frees the budget for the next client.
#[tokio::test]
async fn responses_a_zero_window_client_does_not_read_are_a_budget() {
    let app = spawn_app_with(|s| {
        s.server.http2_max_unread_bytes_per_connection = 1 << 20;
        s.server.http2_max_unread_bytes = 3 << 19;
        s.server.write_timeout_ms = 2_000;
    })
    .await;
    let key = unique("large");
    let value = serde_json::json!({ "blob": "x".repeat(200_000) });
    app.kv_put(&key, "1", &value).await.expect(201);
    let path = format!("/v1/kv/{key}");

    let first = zero_window_reader(&app, &path, 20);
    // The second connection comes once the first holds its share.
    let second = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        zero_window_reader(&app, &path, 20).await
    };
    let ((first, first_took), (second, second_took)) = tokio::join!(first, second);

    let (answered, refused) = answered_and_refused(&first);
    assert!(
        (1..=6).contains(&answered) && refused >= 14,
        "one connection holds at most its budget: {answered} answered, {refused} refused"
    );
    let (answered, refused) = answered_and_refused(&second);
    assert!(
        answered <= 3 && refused >= 17,
        "the second gets what is left of the global budget: {answered} answered, {refused} refused"
    );
    for (seen, took) in [(&first, first_took), (&second, second_took)] {
        assert_eq!(
            seen.count(DATA),
            0,
            "nothing can be sent into a zero window"
        );
        assert!(
            seen.closed && took >= Duration::from_millis(1_900) && took < Duration::from_secs(12),
            "closed after the write timeout (2 s), not after {took:?} (closed: {})",
            seen.closed
        );
    }

    // The budget is free again: a client that reads gets the whole value over HTTP/2.
    let mut h2 = h2(TcpStream::connect(addr(&app)).await.unwrap()).await;
    let (status, body) = call(
        &mut h2,
        Method::GET,
        &format!("http://{}{path}", addr(&app)),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        body.len() > 200_000,
        "the whole value: {} bytes",
        body.len()
    );
}

/// How each field of an HPACK header block is represented (RFC 7541, section 6), by the
/// pattern of its first byte: 'i' indexed, 'a' a literal added to the table, 'n' a literal not
/// indexed, 'N' a literal never indexed, 's' a table size update. Names and values are skipped
/// by their lengths, so Huffman-coded strings need no decoding.
fn representations(block: &[u8]) -> Vec<char> {
    fn int(block: &[u8], at: &mut usize, prefix: u32) -> usize {
        let max = (1usize << prefix) - 1;
        let mut n = usize::from(block[*at]) & max;
        *at += 1;
        if n == max {
            let mut shift = 0;
            loop {
                let byte = block[*at];
                *at += 1;
                n += usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
        }
        n
    }
    let mut at = 0;
    let mut kinds = Vec::new();
    while at < block.len() {
        let (kind, prefix) = match block[at] {
            0x80..=0xff => ('i', 7),
            0x40..=0x7f => ('a', 6),
            0x20..=0x3f => ('s', 5),
            0x10..=0x1f => ('N', 4),
            _ => ('n', 4),
        };
        let name = int(block, &mut at, prefix);
        if matches!(kind, 'a' | 'n' | 'N') {
            let strings = if name == 0 { 2 } else { 1 };
            for _ in 0..strings {
                let len = int(block, &mut at, 7);
                at += len;
            }
        }
        kinds.push(kind);
    }
    kinds
}

/// Sends each header block as a request of its own on one connection (streams 1, 3, 5, ...),
/// waits for as many response header blocks, and returns what was seen with the
/// representations (`representations`) of every header block the server sent, in order.
async fn answered_representations(app: &TestApp, blocks: &[Vec<u8>]) -> (Seen, Vec<Vec<char>>) {
    let answers = blocks.len();
    let (read, mut writer) = reading(app, Duration::from_secs(10), move |seen| {
        seen.count(HEADERS) == answers
    })
    .await;
    for (stream, block) in (1u32..).step_by(2).zip(blocks) {
        let request = frame(HEADERS, END_STREAM | END_HEADERS, stream, block);
        writer.write_all(&request).await.unwrap();
    }
    let seen = read.await.unwrap();
    let kinds = seen
        .frames
        .iter()
        .filter(|f| f.0 == HEADERS)
        .map(|f| representations(&f.3))
        .collect();
    (seen, kinds)
}

/// A read's `x-fencing-token` differs from key to key, so it too is sent never indexed: two
/// reads of keys with different tokens each carry two never-indexed fields (the id and the
/// token).
#[tokio::test]
async fn read_tokens_are_never_indexed() {
    let app = spawn_app().await;
    app.kv_put("never-indexed-a", "7", &serde_json::json!(1))
        .await
        .expect(201);
    app.kv_put("never-indexed-b", "8", &serde_json::json!(2))
        .await
        .expect(201);
    let reads = ["never-indexed-a", "never-indexed-b"]
        .map(|key| request_block(true, &format!("/v1/kv/{key}")));
    let (seen, blocks) = answered_representations(&app, &reads).await;
    assert_eq!(blocks.len(), 2, "two responses: {:?}", seen.frames);
    for kinds in &blocks {
        assert_eq!(
            kinds.iter().filter(|k| **k == 'N').count(),
            2,
            "each read's id and token are never indexed: {blocks:?}"
        );
    }
}

/// A request id is unique to its response, so HTTP/2's header compression is told never to
/// index it: it neither fills the connection's table nor evicts the fields that repeat. The
/// same holds for an id the client sent, which is echoed (the third request's).
#[tokio::test]
async fn request_ids_are_never_indexed() {
    let app = spawn_app().await;
    let mut requests = [1, 2, 3].map(|_| request_block(true, "/healthz"));
    requests[2].extend(literal("x-request-id", b"trace-42"));
    let (seen, blocks) = answered_representations(&app, &requests).await;
    assert_eq!(blocks.len(), 3, "three responses: {:?}", seen.frames);
    for kinds in &blocks {
        assert_eq!(
            kinds.iter().filter(|k| **k == 'N').count(),
            1,
            "each response's id, and only it, is never indexed: {blocks:?}"
        );
    }
}
