//! Bring your own lock: fencing tokens minted by real lock services work with fencegate as they
//! are. These tests run the scripts in `examples/` as real processes against a Redis and an etcd
//! that each test starts for itself on free ports. The examples are therefore tested.
//!
//! Zombie scenario: A takes the lock and prints its token, then is frozen with SIGSTOP (its whole
//! process group, so its `sleep` stops too) until its lease has run out in the lock service. B
//! then takes the lock, gets a larger token and writes. A is resumed and writes with its old
//! token: fencegate must answer 412, and the key must keep B's value.
//!
//! Nothing here skips. A missing binary is a failure that names the Debian package to install.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

use crate::drain::Drain;
use crate::helpers::{self, spawn_app, unique, TestApp};
use crate::support_pg::{free_port, shell_quote, watchdog};

/// How long a lock service may take to start and answer its health check.
const STARTUP: Duration = Duration::from_secs(30);
/// How long a script may take to print its token or to finish, beyond its own work time.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Binaries

/// Finds `bin` on PATH, or panics with the Debian package that provides it.
fn require(bin: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{bin}` not found on PATH: install it (Debian: apt-get install {package})")
        })
}

/// What the example scripts themselves run.
fn require_script_tools() {
    require("curl", "curl");
    require("jq", "jq");
    require("sh", "dash");
    require("sleep", "coreutils");
}

fn example(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    assert!(
        path.is_file(),
        "example script {} is missing",
        path.display()
    );
    path
}

// ---------------------------------------------------------------------------------------------
// Throwaway lock-service servers

/// A lock-service server owned by one test: killed, and its directory removed, when dropped.
/// A watchdog process does the same if the test binary dies without dropping it (SIGKILL).
struct Server {
    name: &'static str,
    child: std::process::Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Spawns `cmd` with its output going to a log file in a fresh temporary directory.
    /// `cmd` gets the directory's path, to put data in it.
    fn spawn(name: &'static str, bin: &Path, args: impl FnOnce(&Path) -> Vec<String>) -> Server {
        let dir = tempfile::Builder::new()
            .prefix(&format!("fencegate-byol-{name}-"))
            .tempdir()
            .expect("cannot create a temporary directory");
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).expect("cannot create the server log");
        let err = out.try_clone().expect("cannot clone the server log handle");
        let child = std::process::Command::new(bin)
            .args(args(dir.path()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));

        // Once the test binary is gone without dropping this (SIGKILL), kill the server.
        let cleanup = format!(
            "kill -9 {srv} 2>/dev/null; rm -rf {dir}",
            srv = child.id(),
            dir = shell_quote(dir.path())
        );
        watchdog(&cleanup, Some(child.id()));

        Server {
            name,
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `Some(log)` if the server has exited.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited ({status}); log:\n{}",
                self.name,
                self.log()
            )),
            _ => None,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `_dir` is removed after this, once the server is gone.
    }
}

/// Starts a server on fresh free ports until it answers `ready`, retrying when the port was
/// taken between choosing it and the server binding it.
async fn start_until_ready<F, Fut>(name: &str, spawn: impl Fn() -> (Server, F)) -> Server
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut last = String::new();
    for _ in 0..5 {
        let (mut server, ready) = spawn();
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(log) = server.exited() {
                if log.contains("address already in use") || log.contains("Address already in use")
                {
                    last = log;
                    break;
                }
                panic!("{log}");
            }
            if ready().await {
                return server;
            }
            if Instant::now() > deadline {
                panic!(
                    "{name} did not become ready within {STARTUP:?}; log:\n{}",
                    server.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    panic!("{name} could not bind a free port in 5 attempts; last log:\n{last}");
}

/// The lock service a script talks to, as the script sees it (environment variables).
enum LockService {
    Redis {
        server: Server,
        port: u16,
        prefix: String,
    },
    Etcd {
        server: Server,
        endpoint: String,
        prefix: String,
        http: reqwest::Client,
    },
}

impl LockService {
    /// `redis-server` on a free port, no persistence; the key prefix is unique to the test.
    async fn redis() -> LockService {
        let bin = require("redis-server", "redis-server");
        require("redis-cli", "redis-tools");
        require_script_tools();
        let port = Arc::new(Mutex::new(0u16));
        let server = start_until_ready("redis-server", || {
            let p = free_port();
            *port.lock().unwrap() = p;
            let server = Server::spawn("redis-server", &bin, |dir| {
                [
                    "--port",
                    &p.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    &dir.display().to_string(),
                ]
                .map(String::from)
                .to_vec()
            });
            (server, move || async move {
                redis_cli(p, &["PING"])
                    .await
                    .is_some_and(|out| out == "PONG")
            })
        })
        .await;
        let port = *port.lock().unwrap();
        LockService::Redis {
            server,
            port,
            prefix: format!("{}:", unique("byol")),
        }
    }

    /// A single-member `etcd` cluster on free ports, in a temporary data directory; default
    /// timing (so the default minimum lease TTL); the key prefix is unique to the test.
    async fn etcd() -> LockService {
        let bin = require("etcd", "etcd-server");
        require_script_tools();
        let http = helpers::client();
        let endpoint = Arc::new(Mutex::new(String::new()));
        let server = start_until_ready("etcd", || {
            let (client, peer) = (free_port(), free_port());
            let url = format!("http://127.0.0.1:{client}");
            *endpoint.lock().unwrap() = url.clone();
            let peer_url = format!("http://127.0.0.1:{peer}");
            let server = Server::spawn("etcd", &bin, |dir| {
                vec![
                    "--name".into(),
                    "default".into(),
                    "--data-dir".into(),
                    dir.join("data").display().to_string(),
                    "--listen-client-urls".into(),
                    url.clone(),
                    "--advertise-client-urls".into(),
                    url.clone(),
                    "--listen-peer-urls".into(),
                    peer_url.clone(),
                    "--initial-advertise-peer-urls".into(),
                    peer_url.clone(),
                    "--initial-cluster".into(),
                    format!("default={peer_url}"),
                    "--logger".into(),
                    "zap".into(),
                    "--log-outputs".into(),
                    "stderr".into(),
                ]
            });
            let http = http.clone();
            (server, move || {
                let (http, health) = (http.clone(), format!("{url}/health"));
                async move {
                    match http
                        .get(&health)
                        .timeout(Duration::from_secs(2))
                        .send()
                        .await
                    {
                        Ok(resp) if resp.status().is_success() => resp
                            .json::<Value>()
                            .await
                            .is_ok_and(|body| body["health"] == json!("true")),
                        _ => false,
                    }
                }
            })
        })
        .await;
        let endpoint = endpoint.lock().unwrap().clone();
        LockService::Etcd {
            server,
            endpoint,
            prefix: format!("{}/", unique("byol")),
            http,
        }
    }

    fn script(&self) -> PathBuf {
        match self {
            LockService::Redis { .. } => example("redis-lock.sh"),
            LockService::Etcd { .. } => example("etcd-lock.sh"),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            LockService::Redis { port, prefix, .. } => vec![
                ("REDIS_URL", format!("redis://127.0.0.1:{port}")),
                ("REDIS_LOCK_PREFIX", prefix.clone()),
            ],
            LockService::Etcd {
                endpoint, prefix, ..
            } => vec![
                ("ETCD_ENDPOINT", endpoint.clone()),
                ("ETCD_LOCK_PREFIX", prefix.clone()),
            ],
        }
    }

    fn server(&mut self) -> &mut Server {
        match self {
            LockService::Redis { server, .. } | LockService::Etcd { server, .. } => server,
        }
    }

    /// Whether the lock key `lock` exists in the lock service right now.
    async fn lock_exists(&self, lock: &str) -> bool {
        match self {
            LockService::Redis { port, prefix, .. } => {
                let key = format!("{prefix}{lock}");
                match redis_cli(*port, &["EXISTS", &key]).await.as_deref() {
                    Some("1") => true,
                    Some("0") => false,
                    other => panic!("redis-cli EXISTS {key}: unexpected reply {other:?}"),
                }
            }
            LockService::Etcd {
                endpoint,
                prefix,
                http,
                ..
            } => {
                let key = format!("{prefix}{lock}");
                let resp = http
                    .post(format!("{endpoint}/v3/kv/range"))
                    .json(&json!({"key": base64(key.as_bytes())}))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("etcd range {key}: {e}"));
                let body: Value = resp
                    .json()
                    .await
                    .unwrap_or_else(|e| panic!("etcd range {key}: {e}"));
                assert!(body.get("error").is_none(), "etcd range {key}: {body}");
                // Zero counts are left out of the gateway's JSON.
                body["kvs"].as_array().is_some_and(|kvs| !kvs.is_empty())
            }
        }
    }

    /// Waits until the lock service has dropped the lock `lock` on its own (lease expiry),
    /// within `ttl` plus a margin for the service's expiry sweep.
    async fn wait_lock_expired(&mut self, lock: &str, ttl: Duration) {
        let started = Instant::now();
        let deadline = started + ttl + Duration::from_secs(10);
        while self.lock_exists(lock).await {
            if let Some(log) = self.server().exited() {
                panic!("{log}");
            }
            assert!(
                Instant::now() < deadline,
                "lock {lock} still exists {:?} after it was taken with a {ttl:?} TTL",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `redis-cli -p PORT ARGS...`: its trimmed stdout, or None if it failed.
async fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The example scripts as child processes

/// One run of an example script, in its own process group: SIGSTOP/SIGCONT/SIGKILL reach the
/// script and whatever it is running (sleep, curl). Killed when dropped unfinished.
struct Run {
    label: String,
    child: tokio::process::Child,
    pgid: Pid,
    stdout: Lines<BufReader<ChildStdout>>,
    seen: Vec<String>,
    stderr: Drain,
    finished: bool,
}

/// What a finished run printed and how it exited.
struct Outcome {
    label: String,
    code: Option<i32>,
    stdout: Vec<String>,
    stderr: String,
}

impl Outcome {
    fn ctx(&self) -> String {
        format!(
            "{}: exit code {:?}\nstdout:\n{}\nstderr:\n{}",
            self.label,
            self.code,
            self.stdout.join("\n"),
            self.stderr
        )
    }

    /// The value of the last `name=VALUE` line on stdout.
    fn field(&self, name: &str) -> Option<&str> {
        field(&self.stdout, name)
    }

    fn token(&self) -> u64 {
        let t = self
            .field("token")
            .unwrap_or_else(|| panic!("no token= line\n{}", self.ctx()));
        t.parse()
            .unwrap_or_else(|_| panic!("token={t:?} is not a decimal\n{}", self.ctx()))
    }

    #[track_caller]
    fn assert_exit(&self, code: i32, status: Option<&str>) {
        assert_eq!(self.code, Some(code), "unexpected exit\n{}", self.ctx());
        assert_eq!(
            self.field("status"),
            status,
            "unexpected status= line\n{}",
            self.ctx()
        );
    }

    /// The problem document the script passed on to stderr.
    fn problem(&self) -> Value {
        self.stderr
            .lines()
            .find_map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
            })
            .unwrap_or_else(|| panic!("no JSON problem on stderr\n{}", self.ctx()))
    }
}

fn field<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
}

/// The script's arguments, in its order.
struct Args<'a> {
    lock: &'a str,
    owner: &'a str,
    ttl_ms: u64,
    key: &'a str,
    value: &'a Value,
    work_secs: u64,
}

impl Run {
    fn start(label: &str, service: &LockService, app: &TestApp, a: Args<'_>) -> Run {
        Run::start_with(label, service, app, a, &[])
    }

    /// [`Run::start`] with extra environment for the script (e.g. FENCEGATE_SIGN).
    fn start_with(
        label: &str,
        service: &LockService,
        app: &TestApp,
        a: Args<'_>,
        env: &[(&str, String)],
    ) -> Run {
        let script = service.script();
        let mut child = tokio::process::Command::new(&script)
            .args([
                app.address.clone(),
                a.lock.to_string(),
                a.owner.to_string(),
                a.ttl_ms.to_string(),
                a.key.to_string(),
                a.value.to_string(),
                a.work_secs.to_string(),
            ])
            .envs(service.env())
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let pgid = Pid::from_raw(child.id().expect("just spawned") as i32);

        let stderr = Drain::start(child.stderr.take().unwrap());
        Run {
            label: format!(
                "{label} ({} as {})",
                script.file_name().unwrap().to_string_lossy(),
                a.owner
            ),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            pgid,
            seen: Vec::new(),
            stderr,
            finished: false,
        }
    }

    fn ctx(&self) -> String {
        format!(
            "{}\nstdout so far:\n{}\nstderr so far:\n{}",
            self.label,
            self.seen.join("\n"),
            self.stderr.text()
        )
    }

    /// Reads stdout until the script has printed `token=` and `ttl_ms=`, that is, it holds
    /// the lock and has started its work. Returns the token and the lock's TTL.
    async fn holding(&mut self) -> (u64, Duration) {
        let deadline = tokio::time::Instant::now() + SCRIPT_DEADLINE;
        while field(&self.seen, "token").is_none() || field(&self.seen, "ttl_ms").is_none() {
            match tokio::time::timeout_at(deadline, self.stdout.next_line()).await {
                Ok(Ok(Some(line))) => self.seen.push(line),
                Ok(Ok(None)) => {
                    let status = self.child.wait().await;
                    self.finished = true;
                    panic!(
                        "exited ({status:?}) before it held the lock\n{}",
                        self.ctx()
                    );
                }
                Ok(Err(e)) => panic!("reading stdout: {e}\n{}", self.ctx()),
                Err(_) => panic!(
                    "no token= and ttl_ms= lines within {SCRIPT_DEADLINE:?}\n{}",
                    self.ctx()
                ),
            }
        }
        let token = field(&self.seen, "token").unwrap();
        let token = token
            .parse()
            .unwrap_or_else(|_| panic!("token={token:?} is not a decimal\n{}", self.ctx()));
        let ttl = field(&self.seen, "ttl_ms").unwrap();
        let ttl = ttl
            .parse()
            .unwrap_or_else(|_| panic!("ttl_ms={ttl:?} is not a number\n{}", self.ctx()));
        (token, Duration::from_millis(ttl))
    }

    /// Freezes the script and everything it runs, as a GC pause or a VM stall would.
    async fn freeze(&mut self) {
        killpg(self.pgid, Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("SIGSTOP: {e}\n{}", self.ctx()));
        // Signals are delivered asynchronously: wait until the script is stopped, or has
        // SIGSTOP pending while it sleeps in the kernel (state D, e.g. in vfork() waiting for the
        // child it is starting, itself stopped before exec). A pending SIGSTOP is handled before
        // the process runs any more of its own code.
        let status = format!("/proc/{}/status", self.pgid);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let raw = std::fs::read_to_string(&status).unwrap_or_default();
            let line = |name: &str| {
                raw.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or("")
            };
            let pending = |name: &str| {
                u64::from_str_radix(line(name), 16)
                    .is_ok_and(|mask| mask & (1 << (Signal::SIGSTOP as u64 - 1)) != 0)
            };
            match line("State:").chars().next() {
                Some('T') => break,
                Some('Z') | None => panic!("exited before it could be frozen\n{}", self.ctx()),
                Some(_) if pending("ShdPnd:") || pending("SigPnd:") => break,
                _ if Instant::now() > deadline => panic!(
                    "not stopped 10s after SIGSTOP ({status}:\n{raw})\n{}",
                    self.ctx()
                ),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        // It must not have written yet, or the scenario is void.
        assert!(
            field(&self.seen, "status").is_none(),
            "had already written before it was frozen\n{}",
            self.ctx()
        );
    }

    fn thaw(&self) {
        killpg(self.pgid, Signal::SIGCONT)
            .unwrap_or_else(|e| panic!("SIGCONT: {e}\n{}", self.ctx()));
    }

    /// Reads stdout to the end and waits for the exit.
    async fn finish(mut self) -> Outcome {
        let deadline = tokio::time::Instant::now() + SCRIPT_DEADLINE;
        loop {
            match tokio::time::timeout_at(deadline, self.stdout.next_line()).await {
                Ok(Ok(Some(line))) => self.seen.push(line),
                Ok(Ok(None)) => break,
                Ok(Err(e)) => panic!("reading stdout: {e}\n{}", self.ctx()),
                Err(_) => panic!("did not finish within {SCRIPT_DEADLINE:?}\n{}", self.ctx()),
            }
        }
        let status = match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(status) => status.expect("wait for the script"),
            Err(_) => panic!("closed stdout but did not exit\n{}", self.ctx()),
        };
        self.finished = true;
        let stderr = self.stderr.finish(Duration::from_secs(5)).await;
        Outcome {
            label: self.label.clone(),
            code: status.code(),
            stdout: std::mem::take(&mut self.seen),
            stderr,
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.finished {
            // Also reaches a frozen group: SIGKILL needs no SIGCONT.
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios, run against each lock service

/// A holds the lock and is frozen past its lease. B takes the lock and writes. A wakes up and
/// writes with its old token: 412, exit 3; the key keeps B's value.
async fn zombie_is_fenced(mut service: LockService) {
    let app = spawn_app().await;
    let lock = unique("lock");
    let key = unique("key");
    let (value_a, value_b) = (json!({"writer": "A"}), json!({"writer": "B"}));

    // A's work (2s) only has to outlast the moment between its token= line and SIGSTOP; after
    // SIGCONT its sleep is already past due.
    let mut a = Run::start(
        "zombie A",
        &service,
        &app,
        Args {
            lock: &lock,
            owner: "A",
            ttl_ms: 1000,
            key: &key,
            value: &value_a,
            work_secs: 2,
        },
    );
    let (token_a, ttl) = a.holding().await;
    a.freeze().await;
    assert!(
        ttl >= Duration::from_millis(1000),
        "the service granted less than asked: {ttl:?}\n{}",
        a.ctx()
    );
    assert!(
        service.lock_exists(&lock).await,
        "A printed its token but the lock {lock} does not exist"
    );

    // Past A's lease (as the service granted it; etcd rounds small TTLs up).
    service.wait_lock_expired(&lock, ttl).await;

    let b = Run::start(
        "holder B",
        &service,
        &app,
        Args {
            lock: &lock,
            owner: "B",
            ttl_ms: 30_000,
            key: &key,
            value: &value_b,
            work_secs: 0,
        },
    )
    .finish()
    .await;
    b.assert_exit(0, Some("201"));
    let token_b = b.token();
    assert!(
        token_b > token_a,
        "B's token {token_b} must be greater than A's {token_a}\n{}",
        b.ctx()
    );

    a.thaw();
    let a = a.finish().await;
    a.assert_exit(3, Some("412"));
    assert_eq!(a.token(), token_a, "A's token changed\n{}", a.ctx());
    let problem = a.problem();
    assert_eq!(problem["status"], json!(412), "{}", a.ctx());
    assert_eq!(
        problem["scope"],
        json!(lock),
        "the fence is the lock's scope\n{}",
        a.ctx()
    );
    assert_eq!(
        problem["presented_token"],
        json!(token_a.to_string()),
        "{}",
        a.ctx()
    );
    assert_eq!(
        problem["current_token"],
        json!(token_b.to_string()),
        "{}",
        a.ctx()
    );

    let got = app.kv_get(&key).await.expect(200);
    assert_eq!(got["value"], value_b, "{got}");
    assert_eq!(got["fence_token"], json!(token_b.to_string()), "{got}");
    assert_eq!(got["scope"], json!(lock), "{got}");
    assert_eq!(
        app.fence(&lock).await.expect(200),
        json!({"scope": lock, "fence_token": token_b.to_string()})
    );
}

/// Successive holders get strictly increasing tokens; a second client cannot take a held lock
/// (exit 2, no token, no write); a released lock can be taken at once.
async fn tokens_strictly_increase(service: LockService) {
    let app = spawn_app().await;
    let lock = unique("lock");
    let key = unique("key");

    // A holds the lock for a while, long enough for C to try it.
    let mut a = Run::start(
        "holder A",
        &service,
        &app,
        Args {
            lock: &lock,
            owner: "A",
            ttl_ms: 30_000,
            key: &key,
            value: &json!("A"),
            work_secs: 2,
        },
    );
    let (token_a, _) = a.holding().await;
    let c = Run::start(
        "contender C",
        &service,
        &app,
        Args {
            lock: &lock,
            owner: "C",
            ttl_ms: 30_000,
            key: &key,
            value: &json!("C"),
            work_secs: 0,
        },
    )
    .finish()
    .await;
    c.assert_exit(2, None);
    assert_eq!(
        c.field("token"),
        None,
        "a refused client must not get a token\n{}",
        c.ctx()
    );
    let a = a.finish().await;
    a.assert_exit(0, Some("201"));

    // A released the lock: B and then D take it without waiting for a TTL.
    let mut previous = token_a;
    for (owner, value) in [("B", json!("B")), ("D", json!("D"))] {
        let run = Run::start(
            "next holder",
            &service,
            &app,
            Args {
                lock: &lock,
                owner,
                ttl_ms: 30_000,
                key: &key,
                value: &value,
                work_secs: 0,
            },
        )
        .finish()
        .await;
        run.assert_exit(0, Some("200"));
        let token = run.token();
        assert!(
            token > previous,
            "token {token} must be greater than the previous holder's {previous}\n{}",
            run.ctx()
        );
        previous = token;
    }
    assert!(
        !service.lock_exists(&lock).await,
        "the last holder did not release {lock}"
    );
    app.assert_value(&key, &json!("D"), &previous.to_string())
        .await;
}

#[tokio::test]
async fn redis_zombie_write_is_rejected_after_the_next_holder_wrote() {
    zombie_is_fenced(LockService::redis().await).await;
}

#[tokio::test]
async fn redis_tokens_strictly_increase_across_holders() {
    tokens_strictly_increase(LockService::redis().await).await;
}

/// `[[issuers]]` with a lock service that cannot sign: the example script calls a signer
/// (`fencegate sign`, holding the HMAC secret) for the token it got, and sends the proof. The
/// same script without the signer is refused (422, exit 1) and writes nothing.
async fn signed_tokens_pass_and_unsigned_ones_are_refused(service: LockService) {
    let var = unique("BYOL_SECRET").replace('-', "_");
    std::env::set_var(&var, "a-byol-test-secret-of-at-least-32-bytes");
    let issuer_var = var.clone();
    let app = crate::helpers::spawn_app_with(move |s| {
        s.issuers = vec![fencegate::issuers::IssuerSettings {
            name: "lock-service".into(),
            scopes: vec!["signed-".into()],
            ed25519_public_key: None,
            hmac_sha256_secret_env: Some(issuer_var),
        }];
    })
    .await;
    let lock = unique("signed-lock");
    let value = json!({"signed": true});
    let args = |key: &'static str| Args {
        lock: &lock,
        owner: "S",
        ttl_ms: 5000,
        key,
        value: &value,
        work_secs: 0,
    };

    let unsigned = Run::start("unsigned", &service, &app, args("unsigned-key"))
        .finish()
        .await;
    unsigned.assert_exit(1, Some("422"));
    app.assert_absent("unsigned-key").await;

    let signer = format!(
        "{} sign --hmac-secret-env {var}",
        env!("CARGO_BIN_EXE_fencegate")
    );
    let signed = Run::start_with(
        "signed",
        &service,
        &app,
        args("signed-key"),
        &[("FENCEGATE_SIGN", signer)],
    )
    .finish()
    .await;
    signed.assert_exit(0, Some("201"));
    app.assert_value("signed-key", &value, &signed.token().to_string())
        .await;
}

/// With authentication on, the example sends the service's key (FENCEGATE_API_KEY) as the
/// bearer; without it, the write is 401 and nothing is written.
#[tokio::test]
async fn redis_example_sends_its_api_key_to_an_authenticated_server() {
    let service = LockService::redis().await;
    let secret = fencegate::auth::new_key().unwrap();
    let digest = fencegate::auth::digest_hex(&secret);
    let app = crate::helpers::spawn_app_with(move |s| {
        s.auth.keys = vec![fencegate::auth::ApiKeySettings {
            name: "byol".into(),
            sha256: digest,
            rights: vec!["read".into(), "write".into()],
            prefixes: vec!["".into()],
            tables: vec![],
        }];
    })
    .await;
    let lock = unique("auth-lock");
    let value = json!({"authenticated": true});
    let args = |key: &'static str| Args {
        lock: &lock,
        owner: "K",
        ttl_ms: 5000,
        key,
        value: &value,
        work_secs: 0,
    };
    let anonymous = Run::start("no key", &service, &app, args("no-key"))
        .finish()
        .await;
    anonymous.assert_exit(1, Some("401"));
    let with_key = Run::start_with(
        "with key",
        &service,
        &app,
        args("with-key"),
        &[("FENCEGATE_API_KEY", secret.clone())],
    )
    .finish()
    .await;
    with_key.assert_exit(0, Some("201"));
    let got = app.send(
        app.req(reqwest::Method::GET, "/v1/kv/with-key")
            .header("Authorization", format!("Bearer {secret}")),
    );
    assert_eq!(got.await.expect(200)["value"], value);
    app.kv_get("no-key").await.problem(401, "unauthenticated");
}

#[tokio::test]
async fn redis_signed_tokens_pass_and_unsigned_ones_are_refused() {
    signed_tokens_pass_and_unsigned_ones_are_refused(LockService::redis().await).await;
}

#[tokio::test]
async fn etcd_signed_tokens_pass_and_unsigned_ones_are_refused() {
    signed_tokens_pass_and_unsigned_ones_are_refused(LockService::etcd().await).await;
}

#[tokio::test]
async fn etcd_zombie_write_is_rejected_after_the_next_holder_wrote() {
    zombie_is_fenced(LockService::etcd().await).await;
}

#[tokio::test]
async fn etcd_tokens_strictly_increase_across_holders() {
    tokens_strictly_increase(LockService::etcd().await).await;
}

#[test]
fn base64_matches_rfc4648() {
    for (input, expected) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(input.as_bytes()), expected, "{input:?}");
    }
}
