//! Test harness: start fencegate on its own database and talk to it over HTTP.
//!
//! `spawn_app()` runs the library's `serve` in-process on a listener bound to port 0;
//! `spawn_binary()` runs the real executable (for restart tests). Responses are captured
//! in full as `Resp`, whose assertion methods print method, path, status and body on failure.

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fencegate::config::Settings;
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

use crate::drain::Drain;
use crate::pg;

pub const TOKEN: &str = "X-Fencing-Token";
pub const SCOPE: &str = "X-Fencing-Scope";
pub const PROBLEM_BASE: &str = "https://fencegate.dev/problems/";

/// A fencegate served in-process on its own fresh database.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`
    pub address: String,
    pub client: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Mutex<Option<JoinHandle<anyhow::Result<()>>>>,
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("reqwest client")
}

/// Default settings, on a fresh database.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Settings adjusted by `configure`, on a fresh database.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    let db_url = pg::fresh_database().await;
    spawn_app_on(db_url, configure).await
}

/// A server on an existing database (several servers may share one).
pub async fn spawn_app_on(db_url: String, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = Settings::default();
    settings.database.url = Some(db_url);
    configure(&mut settings);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // The listener is already bound: requests queue in the backlog until serve() accepts,
    // so no waiting is needed here. If serve() fails (bad database, migrations), the listener
    // is dropped, requests are refused, and `send` reports the server's error.
    let server = tokio::spawn(fencegate::serve(settings, listener, async move {
        let _ = rx.await;
    }));
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        client: client(),
        shutdown: Some(tx),
        server: Mutex::new(Some(server)),
    }
}

impl TestApp {
    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.address, path))
    }

    /// Sends a request and captures the whole response.
    pub async fn send(&self, rb: RequestBuilder) -> Resp {
        match send(rb).await {
            Ok(resp) => resp,
            Err(msg) => {
                let server = self.server.lock().unwrap().take();
                match server {
                    Some(handle) if handle.is_finished() => {
                        panic!(
                            "{msg}\nthe in-process server had exited: {:?}",
                            handle.await
                        )
                    }
                    other => {
                        *self.server.lock().unwrap() = other;
                        panic!("{msg}")
                    }
                }
            }
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.req(Method::GET, path)).await
    }

    /// PUTs `token` to `key` until it is admitted (200), every answer before that a 412 stale
    /// against `fence` (a process that has not yet heard of a reset refusing from its cache);
    /// panics with `what` once `limit` has passed. How long it took.
    pub async fn put_until_admitted(
        &self,
        key: &str,
        token: &str,
        fence: &str,
        limit: Duration,
        what: &str,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let r = self
                .kv_put(key, token, &Value::from("after the reset"))
                .await;
            if r.status == 200 {
                return started.elapsed();
            }
            r.stale_key(key, token, fence);
            assert!(started.elapsed() < limit, "{what} (after {limit:?})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `key` goes into the path verbatim: pass it percent-encoded (see `enc`) when it is not plain.
    pub async fn kv_put(&self, key: &str, token: &str, value: &Value) -> Resp {
        self.send(
            self.req(Method::PUT, &kv(key))
                .header(TOKEN, token)
                .json(value),
        )
        .await
    }

    /// A PUT of `body` as it is written (not re-encoded), as `application/json`.
    pub async fn kv_put_text(&self, key: &str, token: &str, body: impl Into<String>) -> Resp {
        self.send(
            self.req(Method::PUT, &kv(key))
                .header(TOKEN, token)
                .header("content-type", "application/json")
                .body(body.into()),
        )
        .await
    }

    pub async fn kv_put_scoped(&self, key: &str, token: &str, scope: &str, value: &Value) -> Resp {
        self.send(
            self.req(Method::PUT, &kv(key))
                .header(TOKEN, token)
                .header(SCOPE, scope)
                .json(value),
        )
        .await
    }

    pub async fn kv_get(&self, key: &str) -> Resp {
        self.get(&kv(key)).await
    }

    pub async fn kv_delete(&self, key: &str, token: &str) -> Resp {
        self.send(self.req(Method::DELETE, &kv(key)).header(TOKEN, token))
            .await
    }

    pub async fn kv_delete_scoped(&self, key: &str, token: &str, scope: &str) -> Resp {
        self.send(
            self.req(Method::DELETE, &kv(key))
                .header(TOKEN, token)
                .header(SCOPE, scope),
        )
        .await
    }

    pub async fn batch(&self, token: Option<&str>, scope: Option<&str>, body: &Value) -> Resp {
        let mut rb = self.req(Method::POST, "/v1/batch").json(body);
        if let Some(t) = token {
            rb = rb.header(TOKEN, t);
        }
        if let Some(s) = scope {
            rb = rb.header(SCOPE, s);
        }
        self.send(rb).await
    }

    /// `POST /v1/batch` of a body sent as it is (JSON that serde_json would not produce).
    pub async fn batch_raw(&self, token: &str, body: &str) -> Resp {
        self.send(
            self.req(Method::POST, "/v1/batch")
                .header(TOKEN, token)
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    /// `POST /v1/fences/{scope}`; `scope` is a path segment (percent-encode if needed).
    pub async fn claim(&self, scope: &str, token: &str) -> Resp {
        self.send(
            self.req(Method::POST, &format!("/v1/fences/{scope}"))
                .header(TOKEN, token),
        )
        .await
    }

    pub async fn fence(&self, scope: &str) -> Resp {
        self.get(&format!("/v1/fences/{scope}")).await
    }

    /// Asserts that GET of `key` returns `value` with fence token `token`.
    pub async fn assert_value(&self, key: &str, value: &Value, token: &str) {
        let body = self.kv_get(key).await.expect(200);
        assert_eq!(&body["value"], value, "value of {key}: {body}");
        assert_eq!(
            body["fence_token"],
            Value::from(token),
            "fence_token of {key}: {body}"
        );
    }

    /// Asserts that GET of `key` is a 404 problem.
    pub async fn assert_absent(&self, key: &str) {
        self.kv_get(key).await.problem(404, "not-found");
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn kv(key: &str) -> String {
    format!("/v1/kv/{key}")
}

/// Percent-encodes every byte except RFC 3986 unreserved characters.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            write!(out, "%{b:02X}").unwrap();
        }
    }
    out
}

/// A unique, readable key/scope name for a test.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn send(rb: RequestBuilder) -> Result<Resp, String> {
    let (client, req) = rb.build_split();
    let req = req.map_err(|e| format!("could not build request: {e}"))?;
    let mut what = format!("{} {}", req.method(), req.url().path());
    if let Some(q) = req.url().query() {
        write!(what, "?{q}").unwrap();
    }
    for (name, value) in req.headers() {
        let n = name.as_str();
        if n.starts_with("x-fencing") {
            write!(
                what,
                " [{n}: {:?}]",
                String::from_utf8_lossy(value.as_bytes())
            )
            .unwrap();
        }
    }
    let resp = client
        .execute(req)
        .await
        .map_err(|e| format!("{what}: request failed: {e:?}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("{what}: reading body failed: {e:?}"))?;
    Ok(Resp {
        what,
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// A captured response.
#[derive(Debug)]
pub struct Resp {
    /// Method, path and fencing headers of the request, for failure messages.
    pub what: String,
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Resp {
    fn ctx(&self) -> String {
        format!(
            "{} -> {} (content-type {:?})\nbody: {}",
            self.what,
            self.status,
            self.header(CONTENT_TYPE.as_str()),
            self.text
        )
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("<non-ascii>"))
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e})\n{}", self.ctx()))
    }

    /// Asserts the exact status and a JSON body; returns the body.
    #[track_caller]
    pub fn expect(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "unexpected status\n{}", self.ctx());
        self.json()
    }

    /// Asserts one of `statuses` and a JSON body; returns the body.
    #[track_caller]
    pub fn expect_any(&self, statuses: &[u16]) -> Value {
        assert!(
            statuses.contains(&self.status),
            "unexpected status, wanted one of {statuses:?}\n{}",
            self.ctx()
        );
        self.json()
    }

    /// Asserts an RFC 9457 problem of the given status and type slug; returns the body.
    #[track_caller]
    pub fn problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(self.status, status, "unexpected status\n{}", self.ctx());
        let body = self.assert_problem_shape();
        let ty = body["type"].as_str().unwrap();
        assert_eq!(
            ty,
            format!("{PROBLEM_BASE}{slug}"),
            "unexpected problem type\n{}",
            self.ctx()
        );
        body
    }

    /// Content-Type application/problem+json; type, title, status (== HTTP status), detail.
    #[track_caller]
    pub fn assert_problem_shape(&self) -> Value {
        let ct = self.header(CONTENT_TYPE.as_str()).unwrap_or("");
        assert!(
            ct.starts_with("application/problem+json"),
            "content-type is not application/problem+json\n{}",
            self.ctx()
        );
        let body = self.json();
        assert!(
            body["type"].is_string(),
            "problem without string `type`\n{}",
            self.ctx()
        );
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty()),
            "problem without non-empty `title`\n{}",
            self.ctx()
        );
        assert_eq!(
            body["status"].as_u64(),
            Some(u64::from(self.status)),
            "problem `status` must be the HTTP status as a number\n{}",
            self.ctx()
        );
        assert!(
            body["detail"].is_string(),
            "problem without string `detail`\n{}",
            self.ctx()
        );
        body
    }

    /// Asserts a 412 stale-token problem naming `key` with the given tokens (as JSON strings).
    #[track_caller]
    pub fn stale_key(&self, key: &str, presented: &str, current: &str) -> Value {
        let body = self.problem(412, "stale-token");
        assert_eq!(body["key"], Value::from(key), "412 `key`\n{}", self.ctx());
        assert_eq!(
            body["presented_token"],
            Value::from(presented),
            "412 `presented_token`\n{}",
            self.ctx()
        );
        assert_eq!(
            body["current_token"],
            Value::from(current),
            "412 `current_token`\n{}",
            self.ctx()
        );
        body
    }

    /// Asserts a 409 scope-mismatch problem: `key` is bound to `scope` (None: unscoped) and the
    /// write came under `presented` (None: unscoped).
    #[track_caller]
    pub fn mismatch(&self, key: &str, scope: Option<&str>, presented: Option<&str>) -> Value {
        let body = self.problem(409, "scope-mismatch");
        assert_eq!(body["key"], Value::from(key), "409 `key`\n{}", self.ctx());
        assert_eq!(
            body["scope"],
            Value::from(scope),
            "409 `scope`\n{}",
            self.ctx()
        );
        assert_eq!(
            body["presented_scope"],
            Value::from(presented),
            "409 `presented_scope`\n{}",
            self.ctx()
        );
        body
    }

    /// Asserts a 412 stale-token problem naming `scope` with the given tokens (as JSON strings).
    #[track_caller]
    pub fn stale_scope(&self, scope: &str, presented: &str, current: &str) -> Value {
        let body = self.problem(412, "stale-token");
        assert_eq!(
            body["scope"],
            Value::from(scope),
            "412 `scope`\n{}",
            self.ctx()
        );
        assert_eq!(
            body["presented_token"],
            Value::from(presented),
            "412 `presented_token`\n{}",
            self.ctx()
        );
        assert_eq!(
            body["current_token"],
            Value::from(current),
            "412 `current_token`\n{}",
            self.ctx()
        );
        body
    }
}

/// The real `fencegate` executable, started with `serve --listen 127.0.0.1:0`.
pub struct BinApp {
    pub address: String,
    pub client: reqwest::Client,
    child: tokio::process::Child,
    stderr: Drain,
    /// The config file of `spawn_binary_configured`, removed with the app.
    config: Option<tempfile::TempPath>,
}

pub async fn spawn_binary(db_url: &str) -> BinApp {
    spawn_binary_with(db_url, &[]).await
}

/// As `spawn_binary`, with more arguments after `serve` (e.g. `--config FILE`).
pub async fn spawn_binary_with(db_url: &str, extra: &[&str]) -> BinApp {
    spawn_binary_limited(db_url, extra, None).await
}

/// As `spawn_binary`, with `--config FILE` of `toml` and, with `open_files`, under that
/// open-file limit (`ulimit -n`).
pub async fn spawn_binary_configured(db_url: &str, toml: &str, open_files: Option<u32>) -> BinApp {
    let mut file = tempfile::Builder::new()
        .prefix("fencegate-test-")
        .suffix(".toml")
        .tempfile()
        .expect("a config file");
    std::io::Write::write_all(&mut file, toml.as_bytes()).expect("write the config file");
    let path = file.into_temp_path();
    let mut app =
        spawn_binary_limited(db_url, &["--config", path.to_str().unwrap()], open_files).await;
    app.config = Some(path);
    app
}

/// As `spawn_binary_with`; with `open_files`, under that open-file limit (`ulimit -n`).
pub async fn spawn_binary_limited(db_url: &str, extra: &[&str], open_files: Option<u32>) -> BinApp {
    let mut command = match open_files {
        None => tokio::process::Command::new(env!("CARGO_BIN_EXE_fencegate")),
        Some(n) => {
            let mut sh = tokio::process::Command::new("sh");
            sh.args([
                "-c",
                &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                env!("CARGO_BIN_EXE_fencegate"),
            ]);
            sh
        }
    };
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", db_url])
        .args(extra)
        // Only the command line configures this process.
        .env_remove("DATABASE_URL")
        .env_remove("FENCEGATE_LISTEN")
        .env_remove("FENCEGATE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cannot start the fencegate binary");

    let stderr = Drain::start(child.stderr.take().unwrap());

    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let line = match first {
        Ok(Ok(Some(line))) => line,
        other => {
            let status = child.try_wait();
            panic!(
                "fencegate did not print `listening on ADDR` ({other:?}; exit status {status:?})\nstderr:\n{}",
                stderr.text()
            )
        }
    };
    let addr = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first stdout line is not `listening on ADDR`: {line:?}"));
    assert!(
        addr.starts_with("127.0.0.1:") && addr[10..].parse::<u16>().is_ok_and(|p| p != 0),
        "`listening on` must name the bound address with its real port: {line:?}"
    );
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    BinApp {
        address: format!("http://{addr}"),
        client: client(),
        child,
        stderr,
        config: None,
    }
}

impl BinApp {
    /// A `TestApp`-like view for the request helpers. The binary owns its server; the view
    /// has no in-process server to stop.
    pub fn view(&self) -> TestApp {
        TestApp {
            address: self.address.clone(),
            client: self.client.clone(),
            shutdown: None,
            server: Mutex::new(None),
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// The config file of `spawn_binary_configured`.
    pub fn config_path(&self) -> &std::path::Path {
        self.config
            .as_deref()
            .expect("started with spawn_binary_configured")
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("child already reaped");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
            .expect("send a signal");
    }

    /// Waits (up to 10 s) until stderr holds `needle` `count` times; returns stderr.
    pub async fn wait_for_log(&self, needle: &str, count: usize) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.stderr();
            if text.matches(needle).count() >= count {
                return text;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} (x{count}) in the log within 10 s:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL: the server vanishes mid-request, as in a crash or a lost machine.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL fencegate");
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// SIGTERM, then wait (bounded) for the exit status; returns it with everything the
    /// process wrote to stderr.
    pub async fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().expect("child already reaped");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let status = match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => status.expect("wait for fencegate"),
            Err(_) => panic!(
                "fencegate did not exit within 30s of SIGTERM\nstderr:\n{}",
                self.stderr()
            ),
        };
        let stderr = self.stderr.finish(Duration::from_secs(5)).await;
        (status, stderr)
    }
}

/// A legacy table `table` fenced through the ledger, keyed by its column `id`, as resource `name`.
pub fn ledger_table(name: &str, table: &str) -> fencegate::tables::ResourceSettings {
    fencegate::tables::ResourceSettings {
        name: name.into(),
        table: table.into(),
        key: vec!["id".into()],
        fence: fencegate::tables::FenceMode::Ledger,
        fence_column: None,
        strict: false,
        scope: None,
        guard: None,
    }
}
