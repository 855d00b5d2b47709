//! The database becomes unreachable under a running server, then comes back: readiness and
//! requests say so with 503 + Retry-After (never a 2xx, never a leaked internal error), and the
//! server recovers without a restart. The outage is a TCP proxy between fencegate and
//! PostgreSQL that the test switches off (refusing new connections, closing open ones).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::helpers::spawn_app_on;
use crate::pg;

struct Proxy {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(listen: SocketAddr, upstream: SocketAddr) -> (Proxy, SocketAddr) {
        let listener = TcpListener::bind(listen).await.expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut rx => break,
                    accepted = listener.accept() => {
                        let Ok((mut client, _)) = accepted else { continue };
                        conns.spawn(async move {
                            if let Ok(mut server) = TcpStream::connect(upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                }
            }
            // Dropping the listener refuses new connections; aborting closes the open ones.
            conns.shutdown().await;
        });
        (Proxy { stop: Some(tx), task }, addr)
    }

    async fn cut(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.task.await;
    }
}

/// `postgres://user@host:port/db?q` -> (host:port resolved, "postgres://user@", "/db?q")
async fn split_url(url: &str) -> (SocketAddr, String, String) {
    let scheme_end = url.find("://").expect("URL with a scheme") + 3;
    let path_start = url[scheme_end..].find('/').map(|i| scheme_end + i).expect("URL with a database");
    let authority = &url[scheme_end..path_start];
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let hostport = if hostport.contains(':') { hostport.to_string() } else { format!("{hostport}:5432") };
    let addr = tokio::net::lookup_host(&hostport)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("the outage test needs a TCP database address, got {hostport:?}"));
    (addr, format!("{}{userinfo}", &url[..scheme_end]), url[path_start..].to_string())
}

#[tokio::test]
async fn an_unreachable_database_is_503_and_the_server_recovers() {
    let db = pg::fresh_database().await;
    let (upstream, head, tail) = split_url(&db).await;
    let (proxy, addr) = Proxy::start("127.0.0.1:0".parse().unwrap(), upstream).await;
    // A short acquire timeout (a documented setting) keeps each failing request quick.
    let app = spawn_app_on(format!("{head}{addr}{tail}"), |s| s.database.acquire_timeout_ms = 300).await;
    app.kv_put("k", "1", &json!("before")).await.expect(201);
    app.get("/readyz").await.expect(200);

    proxy.cut().await;

    let ready = app.get("/readyz").await;
    ready.problem(503, "unavailable");
    assert!(ready.header("retry-after").is_some(), "503 without Retry-After: {ready:?}");
    // Several attempts: the first may meet a pooled connection that just died, later ones a
    // refused connect. Both are the database being unreachable.
    for _ in 0..2 {
        for r in [app.kv_put("k", "2", &json!("during")).await, app.kv_get("k").await] {
            r.problem(503, "unavailable");
            assert!(r.header("retry-after").is_some(), "503 without Retry-After: {r:?}");
        }
    }
    app.get("/healthz").await.expect(200); // liveness is about the process itself

    // The database comes back on the same address: the server recovers by itself.
    let (proxy, _) = Proxy::start(addr, upstream).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = app.get("/readyz").await;
        if r.status == 200 {
            break;
        }
        r.problem(503, "unavailable");
        assert!(tokio::time::Instant::now() < deadline, "not ready 30s after the database came back: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.assert_value("k", &json!("before"), "1").await;
    app.kv_put("k", "0", &json!("zombie")).await.stale_key("k", "0", "1");
    app.kv_put("k", "2", &json!("after")).await.expect(200);
    drop(proxy);
}
