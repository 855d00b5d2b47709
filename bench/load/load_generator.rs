//! The HTTP load generator: N clients, each on one keep-alive HTTP/1.1 connection (hyper, no
//! pool in between), driving one workload against fencegate for a step, and counting every
//! outcome and latency.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use http_body_util::{BodyExt, Full};
use hyper::{
    body::Bytes,
    client::conn::http1,
    header::{CONTENT_TYPE, HOST},
    Method, Request, StatusCode,
};
use hyper_util::rt::TokioIo;
use sqlx::PgConnection;
use tokio::{net::TcpStream, sync::Barrier, time::error::Elapsed};

use crate::{
    database::version_sum,
    server::{bench_issuer, bench_key, fg_cpu_ticks, proof_of, CpuTicks},
    settings::Settings,
    HOT_KEY, HOT_SCOPE, KEYS, MAX_REQUESTS_PER_TASK, REQUEST_TIMEOUT, SCOPE_KEYS, VALUE,
};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Workload {
    /// PUT on a random key of `1 ..= keys` (`KEYS`, or a keyspace step's size).
    Random { keys: u64 },
    /// PUT on `HOT_KEY` only.
    Hot,
    /// `read_pct`% GET, the rest PUT, on random keys.
    Mix { read_pct: u64 },
    /// PUT on a random key under [`HOT_SCOPE`], every request with the same token: one lock
    /// holder writing from many tasks. `token` is set when the step starts.
    Scope { token: i64 },
}

#[derive(Default)]
pub struct Stats {
    pub put_ok: u64,
    pub get_ok: u64,
    /// 412 stale token.
    pub stale: u64,
    /// Other non-2xx statuses, by status.
    pub other: BTreeMap<u16, u64>,
    /// Connect errors, broken connections, timeouts.
    pub transport: u64,
    /// Latency in µs of every request that got a response (any status), by kind.
    pub put_lat: Vec<u32>,
    pub get_lat: Vec<u32>,
}

impl Stats {
    pub fn merge(&mut self, o: Stats) {
        self.put_ok += o.put_ok;
        self.get_ok += o.get_ok;
        self.stale += o.stale;
        for (k, v) in o.other {
            *self.other.entry(k).or_default() += v;
        }
        self.transport += o.transport;
        self.put_lat.extend(o.put_lat);
        self.get_lat.extend(o.get_lat);
    }
    pub fn other_total(&self) -> u64 {
        self.other.values().sum()
    }
}

/// The fencing tokens of the HTTP clients: one global, strictly increasing counter for the whole
/// run, never reset. Each token is max(previous + 1, now in µs since the epoch), so it is on the
/// same scale as pgbench's statement_timestamp() tokens: whichever side wrote a key last, the
/// next writer's token is higher, and a fencegate fence cache from an earlier step never sees a
/// token go backwards (the table reset between steps lowers fences; no token ever does).
pub struct TokenClock(AtomicI64);

impl TokenClock {
    pub fn next(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let prev = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some((p + 1).max(now))
            })
            .expect("closure always returns Some");
        (prev + 1).max(now)
    }
}

pub static TOKENS: TokenClock = TokenClock(AtomicI64::new(0));

struct Ctx {
    /// The fencegate processes (address, Host header); connection `id` goes to `id % len`.
    targets: Vec<(SocketAddr, String)>,
    workload: Workload,
    warm_until: Instant,
    warmed: Barrier,
    go: Barrier,
    measure_until: OnceLock<Instant>,
}

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender> {
    let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr)).await??;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request on `sender` and its whole response body, within [`REQUEST_TIMEOUT`].
async fn exchange(
    sender: &mut Sender,
    req: Request<Full<Bytes>>,
) -> Result<Result<StatusCode, hyper::Error>, Elapsed> {
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        Ok(status)
    })
    .await
}

/// xorshift64*: a key per request without a shared RNG.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

async fn drive(
    ctx: &Ctx,
    target: &(SocketAddr, String),
    conn: &mut Option<Sender>,
    rng: &mut Rng,
    until: Instant,
) -> Stats {
    let mut stats = Stats::default();
    let mut sent = 0u64;
    while sent < MAX_REQUESTS_PER_TASK && Instant::now() < until {
        sent += 1;
        let sender = match conn {
            Some(s) => s,
            None => match connect(target.0).await {
                Ok(s) => conn.insert(s),
                Err(_) => {
                    stats.transport += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let r = rng.next();
        let (is_get, key) = match ctx.workload {
            Workload::Random { keys } => (false, r % keys + 1),
            Workload::Hot => (false, HOT_KEY),
            Workload::Mix { read_pct } => ((r >> 32) % 100 < read_pct, r % KEYS + 1),
            Workload::Scope { .. } => (false, SCOPE_KEYS + r % KEYS + 1),
        };
        let mut builder = Request::builder()
            .uri(format!("/v1/kv/{key}"))
            .header(HOST, &target.1);
        if let Some(key) = bench_key() {
            builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        if let Workload::Scope { .. } = ctx.workload {
            builder = builder.header("x-fencing-scope", HOT_SCOPE);
        }
        let req = if is_get {
            builder.method(Method::GET).body(Full::new(Bytes::new()))
        } else {
            let token = match ctx.workload {
                Workload::Scope { token } => token,
                _ => TOKENS.next(),
            };
            if let (Workload::Scope { .. }, true) = (ctx.workload, bench_issuer()) {
                builder = builder.header("x-fencing-proof", proof_of(token));
            }
            builder
                .method(Method::PUT)
                .header(CONTENT_TYPE, "application/json")
                .header("x-fencing-token", token.to_string())
                .body(Full::new(Bytes::from_static(VALUE.as_bytes())))
        }
        .expect("request");
        let started = Instant::now();
        let outcome = exchange(sender, req).await;
        let micros = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        match outcome {
            Ok(Ok(status)) => {
                if is_get {
                    &mut stats.get_lat
                } else {
                    &mut stats.put_lat
                }
                .push(micros);
                match status.as_u16() {
                    200..=299 if is_get => stats.get_ok += 1,
                    200..=299 => stats.put_ok += 1,
                    412 => stats.stale += 1,
                    s => *stats.other.entry(s).or_default() += 1,
                }
            }
            _ => {
                stats.transport += 1;
                *conn = None;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    stats
}

async fn client_task(ctx: Arc<Ctx>, id: u64) -> Stats {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let target = &ctx.targets[id as usize % ctx.targets.len()];
    let mut conn = connect(target.0).await.ok();
    let _warm = drive(&ctx, target, &mut conn, &mut rng, ctx.warm_until).await;
    ctx.warmed.wait().await;
    ctx.go.wait().await;
    let until = *ctx.measure_until.get().expect("set before go");
    drive(&ctx, target, &mut conn, &mut rng, until).await
}

pub struct FgRun {
    pub stats: Stats,
    pub elapsed: Duration,
    pub db_applied: i64,
    /// fencegate's own CPU time over the measured window.
    pub cpu_ticks: CpuTicks,
    /// PostgreSQL's CPU per applied write over the same window plus the step's VACUUM and
    /// CHECKPOINT, in µs (`pg_cpu`; None: no local server to read).
    pub pg_cpu_us: Option<f64>,
}

/// The HTTP clients run like pgbench's `-j min(N, 2)`: on min(conns, 2) threads, each a
/// single-threaded tokio runtime, with connections dealt round-robin. A request, its
/// connection's I/O and its timer then stay on one thread. On a multi-threaded runtime the
/// load generator itself added about 0.15 ms of cross-thread wake-ups to every request at one
/// connection (0.48 ms p50 against 0.33 ms measured with wrk, a C client, on the same server).
fn client_threads(ctx: &Arc<Ctx>, conns: usize) -> Vec<std::thread::JoinHandle<Stats>> {
    let threads = conns.clamp(1, 2);
    (0..threads)
        .map(|t| {
            let ctx = ctx.clone();
            let ids: Vec<u64> = (0..conns as u64)
                .filter(|i| *i as usize % threads == t)
                .collect();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                runtime.block_on(async move {
                    let tasks: Vec<_> = ids
                        .into_iter()
                        .map(|i| tokio::spawn(client_task(ctx.clone(), i)))
                        .collect();
                    let mut stats = Stats::default();
                    for task in tasks {
                        stats.merge(task.await.expect("client task panicked"));
                    }
                    stats
                })
            })
        })
        .collect()
}

/// One measured step against the fencegate processes at `fg_addrs` (connection `id` goes to
/// `fg_addrs[id % len]`, as behind a round-robin load balancer).
pub async fn fencegate_step(
    fg_addrs: &[SocketAddr],
    conns: usize,
    workload: Workload,
    s: &Settings,
    dur: Duration,
    db: &mut PgConnection,
) -> Result<FgRun> {
    let ctx = Arc::new(Ctx {
        targets: fg_addrs.iter().map(|a| (*a, a.to_string())).collect(),
        workload,
        warm_until: Instant::now() + s.warmup,
        warmed: Barrier::new(conns + 1),
        go: Barrier::new(conns + 1),
        measure_until: OnceLock::new(),
    });
    let threads = client_threads(&ctx, conns);
    ctx.warmed.wait().await;
    let before = version_sum(db).await?;
    let cpu_before = fg_cpu_ticks();
    let pg_before = crate::pg_cpu::ticks();
    let start = Instant::now();
    ctx.measure_until.set(start + dur).expect("once");
    ctx.go.wait().await;
    let mut stats = Stats::default();
    for t in threads {
        let thread_stats = tokio::task::spawn_blocking(move || t.join()).await?;
        stats.merge(thread_stats.map_err(|_| anyhow::anyhow!("client thread panicked"))?);
    }
    let elapsed = start.elapsed();
    let cpu_ticks = fg_cpu_ticks() - cpu_before;
    let db_applied = version_sum(db).await? - before;
    crate::pg_cpu::settle(db).await;
    let pg_cpu_us = crate::pg_cpu::per_write(pg_before, crate::pg_cpu::ticks(), db_applied);
    Ok(FgRun {
        stats,
        elapsed,
        db_applied,
        cpu_ticks,
        pg_cpu_us,
    })
}

pub async fn scrape_metrics(addr: SocketAddr) -> Result<()> {
    let mut sender = connect(addr).await?;
    let req = Request::builder()
        .uri("/metrics")
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let resp = exchange(&mut sender, req).await??;
    if !resp.is_success() {
        bail!("GET /metrics: {resp}");
    }
    Ok(())
}
