//! A worker process: read-modify-write of one counter under the built-in lock, recording every
//! request in its history file.
//!
//! Compiled into examples/fault_worker.rs: the harness starts that program with `FAULT_WORKER_*`
//! variables, so workers are real processes the nemesis can SIGSTOP. One cycle:
//!
//! 1. `POST /v1/locks/counter {owner, ttl_ms}` -> token (409: someone holds it; try again soon);
//! 2. `GET /v1/kv/counter` -> n (404: 0);
//! 3. a short "think" (the window in which a freeze makes this worker a zombie);
//! 4. `PUT /v1/kv/counter` n+1 with `X-Fencing-Token: token`, `X-Fencing-Scope: counter`; an
//!    unknown outcome (503, timeout, connection lost) is retried with the same token and value,
//!    which docs/api.md promises is safe (a fenced write is idempotent under its token);
//! 5. `DELETE /v1/locks/counter` with the token.
//!
//! Requests alternate between the fencegate processes; one that refused a connection is avoided
//! for a moment (fail-over).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::{rngs::StdRng, Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::history::{now_us, Event, Kind, Op, Recorder};

/// The counter's key and the lock guarding it (the lock's name is also the fence scope).
pub const KEY: &str = "counter";
pub const LOCK: &str = "counter";

pub struct WorkerConfig {
    pub id: String,
    pub key: String,
    pub lock: String,
    /// Negative control: each write names a fresh scope, so no fence ever refuses it. The
    /// checker must then find the zombie writes and lost updates that fencing prevents.
    pub unfenced: bool,
    pub nodes: Vec<String>,
    pub history: PathBuf,
    pub lease_ms: u64,
    pub deadline_us: u64,
    pub seed: u64,
    pub client_timeout_ms: u64,
    pub parent_pid: u32,
    /// Workers finish their cycle and exit once this file exists.
    pub stop_file: PathBuf,
}

impl WorkerConfig {
    pub fn to_env(&self) -> Vec<(String, String)> {
        vec![
            ("FAULT_WORKER_ID".into(), self.id.clone()),
            ("FAULT_WORKER_KEY".into(), self.key.clone()),
            ("FAULT_WORKER_LOCK".into(), self.lock.clone()),
            (
                "FAULT_WORKER_UNFENCED".into(),
                (self.unfenced as u8).to_string(),
            ),
            ("FAULT_WORKER_NODES".into(), self.nodes.join(",")),
            (
                "FAULT_WORKER_HISTORY".into(),
                self.history.display().to_string(),
            ),
            ("FAULT_WORKER_LEASE_MS".into(), self.lease_ms.to_string()),
            (
                "FAULT_WORKER_DEADLINE_US".into(),
                self.deadline_us.to_string(),
            ),
            ("FAULT_WORKER_SEED".into(), self.seed.to_string()),
            (
                "FAULT_WORKER_TIMEOUT_MS".into(),
                self.client_timeout_ms.to_string(),
            ),
            ("FAULT_WORKER_PARENT".into(), self.parent_pid.to_string()),
            (
                "FAULT_WORKER_STOP".into(),
                self.stop_file.display().to_string(),
            ),
        ]
    }

    /// `None` unless this process was started as a worker.
    pub fn from_env() -> Option<WorkerConfig> {
        let id = std::env::var("FAULT_WORKER_ID").ok()?;
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| panic!("worker {id}: {name} is not set"))
        };
        let num = |name: &str| {
            var(name)
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("worker {id}: {name}: {e}"))
        };
        Some(WorkerConfig {
            key: var("FAULT_WORKER_KEY"),
            lock: var("FAULT_WORKER_LOCK"),
            unfenced: var("FAULT_WORKER_UNFENCED") == "1",
            nodes: var("FAULT_WORKER_NODES")
                .split(',')
                .map(str::to_string)
                .collect(),
            history: PathBuf::from(var("FAULT_WORKER_HISTORY")),
            lease_ms: num("FAULT_WORKER_LEASE_MS"),
            deadline_us: num("FAULT_WORKER_DEADLINE_US"),
            seed: num("FAULT_WORKER_SEED"),
            client_timeout_ms: num("FAULT_WORKER_TIMEOUT_MS"),
            parent_pid: num("FAULT_WORKER_PARENT") as u32,
            stop_file: PathBuf::from(var("FAULT_WORKER_STOP")),
            id,
        })
    }
}

/// What came back for one request.
enum Reply {
    Status {
        status: u16,
        retry_after: bool,
        body: Value,
    },
    /// The client's timeout fired: a hang, unless the process was frozen meanwhile.
    Timeout,
    /// No connection could be made: the request was certainly not processed.
    Connect(String),
    /// The connection failed after the request may have been sent: outcome unknown.
    Io(String),
}

struct Worker {
    cfg: WorkerConfig,
    client: reqwest::Client,
    rec: Recorder,
    rng: StdRng,
    next_node: usize,
    /// A node that refused a connection is avoided until this instant.
    avoid_until: Vec<Option<Instant>>,
}

pub fn run(cfg: WorkerConfig) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("worker runtime");
    runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(cfg.client_timeout_ms))
            .connect_timeout(Duration::from_millis(cfg.client_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("reqwest client");
        let rec = Recorder::create(&cfg.history);
        let rng = StdRng::seed_from_u64(cfg.seed);
        let n = cfg.nodes.len();
        let mut worker = Worker {
            client,
            rec,
            rng,
            next_node: 0,
            avoid_until: vec![None; n],
            cfg,
        };
        worker.next_node = worker.rng.gen_range(0..n);
        worker.main_loop().await;
    });
}

impl Worker {
    fn parent_gone(&self) -> bool {
        nix::unistd::getppid().as_raw() as u32 != self.cfg.parent_pid
    }

    /// Round robin over the nodes, skipping ones that just refused a connection (unless all did).
    fn pick_node(&mut self) -> usize {
        let n = self.cfg.nodes.len();
        let now = Instant::now();
        for _ in 0..n {
            let i = self.next_node % n;
            self.next_node = self.next_node.wrapping_add(1);
            if !matches!(self.avoid_until[i], Some(t) if t > now) {
                return i;
            }
        }
        let i = self.next_node % n;
        self.next_node = self.next_node.wrapping_add(1);
        i
    }

    fn event(&self, kind: Kind, op: Op, op_id: u64, attempt: u32) -> Event {
        Event::new(&self.cfg.id, kind, op, op_id, attempt, &self.cfg.key)
    }

    async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        let ms = self.rng.gen_range(lo..=hi);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Sends one request to `node`, recording the invoke; returns the reply and a completion
    /// event pre-filled with what every completion carries (the caller sets the kind and the
    /// op-specific fields, then records it).
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &mut self,
        node: usize,
        invoke: Event,
        method: Method,
        path: &str,
        token: Option<u64>,
        scope: Option<&str>,
        body: Option<Value>,
    ) -> (Reply, Event) {
        let mut invoke = invoke;
        invoke.node = Some(node);
        self.rec.record(&invoke);
        let url = format!("{}{}", self.cfg.nodes[node], path);
        let mut rb = self.client.request(method, url);
        if let Some(token) = token {
            rb = rb.header("X-Fencing-Token", token.to_string());
        }
        if let Some(scope) = scope {
            rb = rb.header("X-Fencing-Scope", scope);
        }
        if let Some(body) = body {
            rb = rb.json(&body);
        }
        let started = Instant::now();
        let reply = match rb.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp.headers().contains_key(reqwest::header::RETRY_AFTER);
                match resp.bytes().await {
                    Ok(bytes) => Reply::Status {
                        status,
                        retry_after,
                        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    },
                    Err(e) if e.is_timeout() => Reply::Timeout,
                    Err(e) => Reply::Io(format!("reading the body: {}", chain(&e))),
                }
            }
            Err(e) if e.is_timeout() => Reply::Timeout,
            Err(e) if e.is_connect() => Reply::Connect(chain(&e)),
            Err(e) => Reply::Io(chain(&e)),
        };
        let mut done = invoke.clone();
        done.t = now_us();
        done.latency_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        match &reply {
            Reply::Status {
                status,
                retry_after,
                ..
            } => {
                done.status = Some(*status);
                if *status == 503 {
                    done.retry_after = Some(*retry_after);
                }
            }
            Reply::Timeout => done.error = Some("timeout".into()),
            Reply::Connect(e) => {
                done.error = Some(format!("connect: {e}"));
                self.avoid_until[node] = Some(Instant::now() + Duration::from_millis(500));
            }
            Reply::Io(e) => done.error = Some(format!("io: {e}")),
        }
        (reply, done)
    }

    async fn main_loop(&mut self) {
        let mut op_id = 0u64;
        while now_us() < self.cfg.deadline_us && !self.parent_gone() && !self.cfg.stop_file.exists()
        {
            op_id += 1;
            let Some(token) = self.acquire(op_id).await else {
                continue;
            };
            let acquired = Instant::now();
            let Some(value) = self.read(op_id, acquired).await else {
                self.release(op_id, token).await;
                continue;
            };
            // Think: the window in which a freeze turns this worker into a zombie.
            self.sleep_ms(5, 30).await;
            let stale = self.write(op_id, token, value + 1, acquired).await;
            if !stale {
                self.release(op_id, token).await;
            }
        }
    }

    async fn acquire(&mut self, op_id: u64) -> Option<u64> {
        let node = self.pick_node();
        let owner = format!("{}-{op_id}", self.cfg.id);
        let invoke = self.event(Kind::Invoke, Op::Acquire, op_id, 1);
        let path = format!("/v1/locks/{}", self.cfg.lock);
        let body = json!({"owner": owner, "ttl_ms": self.cfg.lease_ms});
        let (reply, mut done) = self
            .call(node, invoke, Method::POST, &path, None, None, Some(body))
            .await;
        let mut granted = None;
        done.kind = match &reply {
            Reply::Status {
                status: 201, body, ..
            } => match token_of(&body["token"]) {
                Some(token) => {
                    granted = Some(token);
                    done.token = Some(token);
                    Kind::Ok
                }
                None => {
                    done.error = Some(format!("201 without a valid token: {body}"));
                    Kind::Info
                }
            },
            Reply::Status { status: 409, .. } => Kind::Fail,
            Reply::Status { status, .. } if is_definite_client_error(*status) => Kind::Fail,
            Reply::Connect(_) => Kind::Fail,
            // 503 (the grant may have committed), 5xx, timeouts, lost connections: unknown.
            _ => Kind::Info,
        };
        self.rec.record(&done);
        if granted.is_none() {
            match reply {
                Reply::Status {
                    status: 409, body, ..
                } => {
                    // Poll again soon; not longer than the holder's remaining lease.
                    let remaining = body["remaining_ms"].as_u64().unwrap_or(20).clamp(2, 40);
                    self.sleep_ms(2, remaining).await;
                }
                _ => self.sleep_ms(30, 120).await,
            }
        }
        granted
    }

    async fn read(&mut self, op_id: u64, acquired: Instant) -> Option<i64> {
        for attempt in 1..=3 {
            if acquired.elapsed() > Duration::from_millis(self.cfg.lease_ms / 2) {
                return None;
            }
            let node = self.pick_node();
            let invoke = self.event(Kind::Invoke, Op::Read, op_id, attempt);
            let path = format!("/v1/kv/{}", self.cfg.key);
            let (reply, mut done) = self
                .call(node, invoke, Method::GET, &path, None, None, None)
                .await;
            let mut value = None;
            done.kind = match &reply {
                Reply::Status {
                    status: 200, body, ..
                } => match (body["value"].as_i64(), token_of(&body["fence_token"])) {
                    (Some(v), Some(t)) => {
                        value = Some(v);
                        done.read = Some(v);
                        done.token = Some(t);
                        Kind::Ok
                    }
                    _ => {
                        done.error = Some(format!("unexpected body for 200: {body}"));
                        Kind::Fail
                    }
                },
                Reply::Status { status: 404, .. } => {
                    value = Some(0);
                    done.read = Some(0);
                    Kind::Ok
                }
                // A read changes nothing: whatever went wrong, it did not happen.
                _ => Kind::Fail,
            };
            self.rec.record(&done);
            if value.is_some() {
                return value;
            }
            self.sleep_ms(10, 40).await;
        }
        None
    }

    /// Returns `true` if the write was refused as stale (the lock is lost: no release).
    async fn write(&mut self, op_id: u64, token: u64, value: i64, acquired: Instant) -> bool {
        for attempt in 1..=6 {
            let node = self.pick_node();
            let mut invoke = self.event(Kind::Invoke, Op::Write, op_id, attempt);
            invoke.token = Some(token);
            invoke.write = Some(value);
            let path = format!("/v1/kv/{}", self.cfg.key);
            let scope = if self.cfg.unfenced {
                format!("{}-unfenced-{}-{op_id}", self.cfg.lock, self.cfg.id)
            } else {
                self.cfg.lock.clone()
            };
            let (reply, mut done) = self
                .call(
                    node,
                    invoke,
                    Method::PUT,
                    &path,
                    Some(token),
                    Some(&scope),
                    Some(json!(value)),
                )
                .await;
            let mut finished = false;
            let mut stale = false;
            done.kind = match &reply {
                Reply::Status {
                    status: 200 | 201, ..
                } => {
                    finished = true;
                    Kind::Ok
                }
                Reply::Status {
                    status: 412, body, ..
                } => {
                    finished = true;
                    stale = true;
                    done.current_token = token_of(&body["current_token"]);
                    Kind::Fail
                }
                Reply::Status { status, .. } if is_definite_client_error(*status) => {
                    finished = true;
                    Kind::Fail
                }
                Reply::Connect(_) => Kind::Fail,
                _ => Kind::Info,
            };
            self.rec.record(&done);
            if finished || acquired.elapsed() > Duration::from_secs(4) {
                return stale;
            }
            self.sleep_ms(20, 80).await;
        }
        false
    }

    async fn release(&mut self, op_id: u64, token: u64) {
        let node = self.pick_node();
        let invoke = self.event(Kind::Invoke, Op::Release, op_id, 1);
        let path = format!("/v1/locks/{}", self.cfg.lock);
        let (reply, mut done) = self
            .call(node, invoke, Method::DELETE, &path, Some(token), None, None)
            .await;
        done.token = Some(token);
        done.kind = match &reply {
            Reply::Status { status: 200, .. } => Kind::Ok,
            Reply::Status { status: 409, .. } => Kind::Fail,
            Reply::Status { status, .. } if is_definite_client_error(*status) => Kind::Fail,
            Reply::Connect(_) => Kind::Fail,
            _ => Kind::Info,
        };
        self.rec.record(&done);
    }
}

/// 4xx: the server refused the request without acting on it.
fn is_definite_client_error(status: u16) -> bool {
    StatusCode::from_u16(status).is_ok_and(|s| s.is_client_error())
}

/// Tokens are JSON strings of canonical decimals (docs/wire.md).
fn token_of(v: &Value) -> Option<u64> {
    let s = v.as_str()?;
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

/// An error with its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
