//! The console's data over HTTP: `GET /v1/admin/overview` and the event stream
//! `GET /v1/admin/events` (ordering, the per-second ticks, the bound on a client that does not
//! read, disconnects, the admin right), and the page's own headers. The page itself is driven
//! in a real browser by tests/browser.

use std::time::{Duration, Instant};

use fencegate::auth::ApiKeySettings;
use reqwest::{header::AUTHORIZATION, Method};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{enc, spawn_app, spawn_app_with, unique, TestApp, SCOPE, TOKEN};

/// One server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// A `text/event-stream` response read event by event.
struct Stream {
    response: reqwest::Response,
    buffer: String,
    /// Ticks passed over by [`Stream::next_fencing`], kept for tests that count them.
    skipped_ticks: Vec<Sse>,
}

impl Stream {
    async fn open(app: &TestApp, bearer: Option<&str>) -> Stream {
        let mut rb = app.req(Method::GET, "/v1/admin/events");
        if let Some(secret) = bearer {
            rb = rb.header(AUTHORIZATION, format!("Bearer {secret}"));
        }
        let response = rb.send().await.expect("GET /v1/admin/events");
        assert_eq!(response.status(), 200, "GET /v1/admin/events");
        let ct = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(ct.starts_with("text/event-stream"), "content-type {ct}");
        let mut stream = Stream {
            response,
            buffer: String::new(),
            skipped_ticks: Vec::new(),
        };
        // The stream opens with `hello`: from here on, this subscriber gets every event.
        assert_eq!(stream.next().await.event, "hello");
        stream
    }

    /// The next event (of any type); panics after 10 s without one, or at the end of the stream.
    async fn next(&mut self) -> Sse {
        self.try_next(Duration::from_secs(10))
            .await
            .expect("the event stream ended")
    }

    /// The next event, `None` at the end of the stream.
    async fn try_next(&mut self, within: Duration) -> Option<Sse> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line
                        .strip_prefix("event: ")
                        .or_else(|| line.strip_prefix("event:"))
                    {
                        event = v.to_owned();
                    } else if let Some(v) = line
                        .strip_prefix("id: ")
                        .or_else(|| line.strip_prefix("id:"))
                    {
                        id = Some(v.parse().expect("numeric id"));
                    } else if let Some(v) = line
                        .strip_prefix("data: ")
                        .or_else(|| line.strip_prefix("data:"))
                    {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keep-alive)
                }
                let data = serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("data is not JSON ({e}): {data}"));
                return Some(Sse { event, id, data });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .unwrap_or_else(|_| {
                    panic!("no event within {within:?}; buffered: {:?}", self.buffer)
                });
            match chunk.expect("reading the event stream") {
                Some(bytes) => self
                    .buffer
                    .push_str(std::str::from_utf8(&bytes).expect("UTF-8")),
                None => return None,
            }
        }
    }

    /// The next event that is not a tick.
    async fn next_fencing(&mut self) -> Sse {
        loop {
            let e = self.next().await;
            if e.event != "tick" {
                return e;
            }
            self.skipped_ticks.push(e);
        }
    }
}

async fn acquire(app: &TestApp, name: &str, owner: &str, ttl_ms: u64) -> String {
    let body = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{}", enc(name)))
                .json(&json!({"owner": owner, "ttl_ms": ttl_ms})),
        )
        .await
        .expect(201);
    body["token"].as_str().unwrap().to_owned()
}

async fn overview(app: &TestApp) -> Value {
    app.get("/v1/admin/overview").await.expect(200)
}

#[tokio::test]
async fn the_overview_shows_locks_fences_refusals_and_counters() {
    let app = spawn_app().await;
    let lock = unique("console-lock");
    let token = acquire(&app, &lock, "worker-a", 30_000).await;
    app.kv_put_scoped(&enc(&format!("{lock}/job")), &token, &enc(&lock), &json!(1))
        .await
        .expect(201);
    let key = unique("console-key");
    app.kv_put(&key, "5", &json!("new")).await.expect(201);
    app.kv_put(&key, "3", &json!("zombie"))
        .await
        .problem(412, "stale-token");

    let o = overview(&app).await;
    let held = o["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == lock.as_str())
        .expect("the lock is listed");
    assert_eq!(held["holder"], "worker-a");
    assert_eq!(held["token"], token.as_str());
    let remaining = held["remaining_ms"].as_i64().unwrap();
    assert!(
        (1..=30_000).contains(&remaining),
        "remaining_ms {remaining}"
    );
    assert!(held["expires_at"].as_str().unwrap().ends_with('Z'));
    let fence = o["fences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["scope"] == lock.as_str())
        .expect("the scope is listed");
    assert_eq!(fence["fence_token"], token.as_str());

    let latest = &o["refusals"][0];
    assert_eq!(latest["type"], "refusal");
    assert_eq!(latest["kind"], "stale");
    assert_eq!(latest["op"], "put");
    assert_eq!(latest["key"], key.as_str());
    assert_eq!(latest["presented_token"], "3");
    assert_eq!(latest["current_token"], "5");
    assert!(latest["at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(o["counters"]["stale"], 1);
    assert_eq!(o["counters"]["refused"], 1);
    assert_eq!(
        o["counters"]["accepted"], 2,
        "the scoped put and the first unscoped put: {o}"
    );
    assert_eq!(o["rate"].as_array().unwrap().len(), 300);

    // A released lock leaves the list (the lists are at most a second old: their cost is
    // bounded); its fence stays.
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{}", enc(&lock)))
            .header(TOKEN, &token),
    )
    .await
    .expect(200);
    let deadline = Instant::now() + Duration::from_secs(60);
    let o = loop {
        let o = overview(&app).await;
        if o["locks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["name"] != lock.as_str())
        {
            break o;
        }
        assert!(
            Instant::now() < deadline,
            "the released lock is still listed after 60 s: {o}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(o["fences"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["scope"] == lock.as_str()));
}

/// The overview's database part costs at most one query per second per process, however many
/// clients ask: a second answer within the second is the first one again.
#[tokio::test]
async fn the_overview_costs_one_query_per_second_whatever_the_callers() {
    let app = std::sync::Arc::new(spawn_app().await);
    let first = overview(&app).await;
    let read_at = Instant::now();
    let lock = unique("cached");
    acquire(&app, &lock, "w", 30_000).await;
    let mut answers = Vec::new();
    for _ in 0..16 {
        let app = app.clone();
        answers.push(tokio::spawn(async move { overview(&app).await }));
    }
    for answer in answers {
        let o = answer.await.unwrap();
        // Answered within the second of the first read (checked after the answer came).
        if read_at.elapsed() < Duration::from_millis(900) {
            assert_eq!(
                o["locks"], first["locks"],
                "a fresh query within the second"
            );
        }
    }
    tokio::time::sleep(fencegate::store::overview::FRESH_FOR).await;
    let later = overview(&app).await;
    assert!(
        later["locks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["name"] == lock.as_str()),
        "{later}"
    );
}

#[tokio::test]
async fn the_stream_sends_grants_refusals_and_releases_in_order_then_counts_each_second() {
    let app = spawn_app_with(|s| s.kv.max_token_jump = 1000).await;
    let mut stream = Stream::open(&app, None).await;
    let lock = unique("console-stream");
    let token: i64 = acquire(&app, &lock, "worker-a", 30_000)
        .await
        .parse()
        .unwrap();
    let key = enc(&format!("{lock}/k"));
    // accepted, then: stale (key fence), not issued (above the lock's latest grant), jump,
    // scope mismatch (the key is bound to the lock's scope), release.
    app.kv_put_scoped(&key, &token.to_string(), &enc(&lock), &json!(1))
        .await
        .expect(201);
    let plain = unique("console-plain");
    app.kv_put(&plain, "10", &json!(1)).await.expect(201);
    app.kv_put(&plain, "9", &json!(1))
        .await
        .problem(412, "stale-token");
    app.kv_put_scoped(&key, &(token + 1).to_string(), &enc(&lock), &json!(1))
        .await
        .problem(422, "token-not-issued");
    app.kv_put(&plain, "5000", &json!(1))
        .await
        .problem(422, "token-jump");
    app.kv_put(&key, "20", &json!(1))
        .await
        .problem(409, "scope-mismatch");
    app.send(
        app.req(Method::DELETE, &format!("/v1/locks/{}", enc(&lock)))
            .header(TOKEN, token.to_string()),
    )
    .await
    .expect(200);
    let done_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();

    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(stream.next_fencing().await);
    }
    let kinds: Vec<String> = seen
        .iter()
        .map(|e| match e.data["kind"].as_str() {
            Some(kind) => format!("{}:{kind}", e.event),
            None => e.event.clone(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "grant",
            "refusal:stale",
            "refusal:not_issued",
            "refusal:jump",
            "refusal:scope_mismatch",
            "release"
        ],
        "{seen:#?}"
    );
    let ids: Vec<u64> = seen
        .iter()
        .map(|e| e.id.expect("fencing events carry an id"))
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    for e in &seen {
        assert_eq!(
            e.data["type"].as_str(),
            Some(e.event.as_str()),
            "the data names its type: {e:?}"
        );
    }
    let (grant, stale, not_issued, jump, mismatch, release) = (
        &seen[0].data,
        &seen[1].data,
        &seen[2].data,
        &seen[3].data,
        &seen[4].data,
        &seen[5].data,
    );
    assert_eq!(grant["name"], lock.as_str());
    assert_eq!(grant["holder"], "worker-a");
    assert_eq!(grant["token"], token.to_string());
    assert_eq!(grant["ttl_ms"], 30_000);
    assert_eq!(
        (
            stale["key"].as_str(),
            stale["presented_token"].as_str(),
            stale["current_token"].as_str()
        ),
        (Some(plain.as_str()), Some("9"), Some("10"))
    );
    assert_eq!(not_issued["scope"], lock.as_str());
    assert_eq!(not_issued["presented_token"], (token + 1).to_string());
    assert_eq!(
        not_issued["current_token"],
        token.to_string(),
        "the latest token issued"
    );
    assert_eq!(
        (
            jump["presented_token"].as_str(),
            jump["current_token"].as_str()
        ),
        (Some("5000"), Some("10"))
    );
    assert_eq!(mismatch["key"], format!("{lock}/k"));
    assert_eq!(
        mismatch["scope"],
        lock.as_str(),
        "the scope the key is bound to"
    );
    assert_eq!(mismatch["presented_scope"], Value::Null);
    assert_eq!(release["name"], lock.as_str());
    assert_eq!(release["token"], token.to_string());

    // Ticks: one per second, each second once, in order; over the seconds of this test they
    // add up to exactly the writes made (this server served nothing else).
    // Ticks that came between the fencing events count too (the writes may straddle a second).
    let (mut accepted, mut refused, mut last) = (0, 0, 0);
    let mut earlier = std::mem::take(&mut stream.skipped_ticks).into_iter();
    loop {
        let e = match earlier.next() {
            Some(e) => e,
            None => stream.next().await,
        };
        assert_eq!(e.event, "tick", "nothing else happened: {e:?}");
        assert!(e.id.is_none(), "ticks carry no id");
        let second = e.data["second"].as_u64().unwrap();
        assert!(
            last == 0 || second == last + 1,
            "ticks are whole seconds in order: {last} then {second}"
        );
        last = second;
        accepted += e.data["accepted"].as_u64().unwrap();
        refused += e.data["refused"].as_u64().unwrap();
        if second > done_at {
            break;
        }
    }
    assert_eq!((accepted, refused), (2, 4), "writes counted by the ticks");
}

#[tokio::test]
async fn a_stream_that_goes_away_is_forgotten_and_past_the_cap_the_slowest_is_evicted() {
    let app = spawn_app().await;
    let stream = Stream::open(&app, None).await;
    assert_eq!(overview(&app).await["counters"]["subscribers"], 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = overview(&app).await["counters"]["subscribers"]
            .as_u64()
            .unwrap();
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed stream is still counted after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut open = Vec::new();
    for _ in 0..fencegate::events::MAX_SUBSCRIBERS {
        open.push(Stream::open(&app, None).await);
    }
    // One more: it gets in, and the slowest reader (all read alike here: the oldest) is told
    // and closed, so streams that are never read cannot lock the console out.
    let mut newest = Stream::open(&app, None).await;
    let dropped = open[0].next_fencing().await;
    assert_eq!(dropped.event, "dropped", "{dropped:?}");
    assert!(
        open[0].try_next(Duration::from_secs(5)).await.is_none(),
        "the evicted stream did not end"
    );
    assert_eq!(
        overview(&app).await["counters"]["subscribers"],
        fencegate::events::MAX_SUBSCRIBERS
    );
    app.get("/healthz").await.expect(200);
    // The streams open still get events.
    let key = unique("console-cap");
    app.kv_put(&key, "2", &json!(1)).await.expect(201);
    app.kv_put(&key, "1", &json!(1))
        .await
        .problem(412, "stale-token");
    assert_eq!(newest.next_fencing().await.data["key"], key.as_str());
    let last = open.last_mut().unwrap();
    assert_eq!(last.next_fencing().await.data["key"], key.as_str());
}

/// A client that stops reading is cut off (by the write timeout once its socket is full),
/// holds nothing meanwhile, and neither the server nor a client that reads notices.
#[tokio::test]
async fn a_client_that_does_not_read_is_dropped_and_others_go_on() {
    let app = spawn_app_with(|s| s.server.write_timeout_ms = 1000).await;
    let addr = app.address.trim_start_matches("http://").to_owned();
    // A small receive buffer: the window fills after a few KB.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr.parse().unwrap()).await.unwrap();
    stalled
        .write_all(format!("GET /v1/admin/events HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 256];
    let n = stalled.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    let mut reader = Stream::open(&app, None).await;
    assert_eq!(overview(&app).await["counters"]["subscribers"], 2);
    let marker = unique("console-after");
    // The reader reads as it goes: every refusal, in order, up to the marker made at the end.
    let reading = {
        let marker = marker.clone();
        tokio::spawn(async move {
            let (mut last_id, mut refusals) = (0, 0u64);
            loop {
                let e = reader.next_fencing().await;
                let id = e.id.unwrap();
                assert!(id > last_id, "ids increase");
                last_id = id;
                if e.data["key"] == marker.as_str() {
                    return refusals;
                }
                refusals += 1;
            }
        })
    };

    // Refusals with long keys (each event ~600 bytes), refused by the cache, from 4 writers,
    // until the stalled client is dropped.
    let key = "z".repeat(500);
    app.kv_put(&key, "100", &json!(1)).await.expect(201);
    let started = Instant::now();
    let mut made = 0u64;
    let value = json!(1);
    loop {
        let writes = (0..4).map(|_| app.kv_put(&key, "1", &value));
        for r in futures::future::join_all(writes).await {
            r.problem(412, "stale-token");
            made += 1;
        }
        if made % 200 == 0 && overview(&app).await["counters"]["subscribers"] == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stalled client was not dropped after {made} refusals"
        );
    }
    eprintln!(
        "the stalled client was dropped after {made} refusals in {:?}",
        started.elapsed()
    );
    app.get("/healthz").await.expect(200);
    // Its connection is closed: what the kernel buffered, then the end.
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the stalled connection was not closed");

    // The reader got every refusal, in order, and the one made now.
    app.kv_put(&marker, "2", &json!(1)).await.expect(201);
    app.kv_put(&marker, "1", &json!(1))
        .await
        .problem(412, "stale-token");
    let seen = tokio::time::timeout(Duration::from_secs(20), reading)
        .await
        .expect("the reader saw the marker")
        .unwrap();
    assert_eq!(seen, made, "the reader saw every refusal");
}

#[tokio::test]
async fn the_console_data_needs_the_admin_right_and_the_page_does_not() {
    let key = |name: &str, rights: &[&str]| {
        let secret = fencegate::auth::new_key().unwrap();
        let settings = ApiKeySettings {
            name: name.into(),
            sha256: fencegate::auth::digest_hex(&secret),
            rights: rights.iter().map(|r| r.to_string()).collect(),
            prefixes: vec![String::new()],
            tables: vec![],
        };
        (secret, settings)
    };
    let (admin, admin_settings) = key("ops", &["admin"]);
    let (writer, writer_settings) = key("worker", &["read", "write", "lock", "fence"]);
    let app = spawn_app_with(|s| s.auth.keys = vec![admin_settings, writer_settings]).await;
    for path in ["/v1/admin/overview", "/v1/admin/events"] {
        let none = app.get(path).await;
        none.problem(401, "unauthenticated");
        assert_eq!(none.header("www-authenticate"), Some("Bearer"));
        let refused = app
            .send(
                app.req(Method::GET, path)
                    .header(AUTHORIZATION, format!("Bearer {writer}")),
            )
            .await;
        assert_eq!(refused.problem(403, "forbidden")["right"], "admin");
    }
    app.send(
        app.req(Method::GET, "/v1/admin/overview")
            .header(AUTHORIZATION, format!("Bearer {admin}")),
    )
    .await
    .expect(200);
    let mut stream = Stream::open(&app, Some(&admin)).await;
    // A write by the worker shows in the admin's stream.
    let k = unique("console-auth");
    let put = |token: &'static str| {
        app.req(Method::PUT, &format!("/v1/kv/{k}"))
            .header(AUTHORIZATION, format!("Bearer {writer}"))
            .header(TOKEN, token)
            .json(&json!(1))
    };
    app.send(put("4")).await.expect(201);
    app.send(put("3")).await.problem(412, "stale-token");
    assert_eq!(stream.next_fencing().await.data["key"], k.as_str());

    // The page and its assets need no credential: they hold no data.
    for (path, ct) in [
        ("/ui", "text/html"),
        ("/ui/console.js", "text/javascript"),
        ("/ui/console.css", "text/css"),
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert!(r.header("content-type").unwrap().starts_with(ct), "{path}");
        let csp = r.header("content-security-policy").expect("a CSP");
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }
    let page = app.get("/ui").await.text;
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "no inline script or style"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "nothing fetched from elsewhere"
    );
    let _ = SCOPE;
}

/// A stream never ends by itself: shutdown ends it cleanly (the last chunk sent, so a client
/// sees the end of the stream rather than a cut connection), and at once.
#[tokio::test]
async fn shutdown_ends_the_streams_cleanly_and_at_once() {
    let app = spawn_app_with(|s| s.server.shutdown_grace_ms = 30_000).await;
    let mut stream = Stream::open(&app, None).await;
    let started = Instant::now();
    drop(app);
    loop {
        match stream.try_next(Duration::from_secs(10)).await {
            None => break,
            Some(e) => assert_eq!(e.event, "tick", "only ticks until the end: {e:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stream ended {:?} after shutdown",
        started.elapsed()
    );
}

/// A missing or wrong `X-Fencing-Proof` is a refusal too (`bad_proof`), and a batch refused on
/// several keys is one event naming the first and how many.
#[tokio::test]
async fn proofs_and_batches_are_refusals_too() {
    use fencegate::issuers::{ed25519_public_key, IssuerSettings};
    let app = spawn_app_with(|s| {
        s.issuers = vec![IssuerSettings {
            name: "etcd".into(),
            scopes: vec!["jobs/".into()],
            ed25519_public_key: Some(ed25519_public_key(&[7; 32])),
            hmac_sha256_secret_env: None,
        }]
    })
    .await;
    let mut stream = Stream::open(&app, None).await;
    let signed = |proof: Option<&str>| {
        let rb = app
            .req(Method::PUT, "/v1/kv/job-1")
            .header(TOKEN, "3")
            .header(SCOPE, "jobs%2Fa")
            .json(&json!(1));
        match proof {
            Some(p) => rb.header("X-Fencing-Proof", p),
            None => rb,
        }
    };
    app.send(signed(None))
        .await
        .problem(422, "missing-token-proof");
    app.send(signed(Some("bm90LWEtc2lnbmF0dXJl")))
        .await
        .problem(422, "invalid-token-proof");
    let missing = stream.next_fencing().await;
    assert_eq!(
        (
            missing.data["kind"].as_str(),
            missing.data["scope"].as_str()
        ),
        (Some("bad_proof"), Some("jobs/a"))
    );
    assert!(
        missing.data["detail"].as_str().unwrap().contains("etcd"),
        "{missing:?}"
    );
    let invalid = stream.next_fencing().await;
    assert_eq!(invalid.data["kind"], "bad_proof");
    assert!(
        invalid.data["detail"].as_str().unwrap().contains("etcd"),
        "{invalid:?}"
    );

    for key in ["b1", "b2"] {
        app.kv_put(key, "9", &json!(1)).await.expect(201);
    }
    let ops = json!({"ops": [{"op": "put", "key": "b1", "value": 1}, {"op": "put", "key": "b2", "value": 2}]});
    app.batch(Some("4"), None, &ops)
        .await
        .problem(412, "stale-token");
    let batch = stream.next_fencing().await;
    assert_eq!(
        (
            batch.data["kind"].as_str(),
            batch.data["op"].as_str(),
            batch.data["keys"].as_u64()
        ),
        (Some("stale"), Some("batch"), Some(2))
    );
    assert_eq!(
        (
            batch.data["presented_token"].as_str(),
            batch.data["current_token"].as_str()
        ),
        (Some("4"), Some("9"))
    );
    let counters = overview(&app).await["counters"].clone();
    assert_eq!(
        (
            counters["bad_proof"].as_u64(),
            counters["stale"].as_u64(),
            counters["accepted"].as_u64()
        ),
        (Some(2), Some(1), Some(2))
    );
}
