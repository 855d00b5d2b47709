//! `cargo bench --bench load`: fenced writes per second through fencegate versus the same
//! upsert sent straight to PostgreSQL by pgbench, on one machine, in one run.
//!
//! What it does (bench/README.md explains every figure):
//! 1. creates a fresh database on the server in `DATABASE_URL` (an admin URL; default
//!    `postgres://postgres@127.0.0.1:5432/postgres`) and starts the real fencegate binary on it;
//! 2. for each step, resets the table to 10 000 live keys, then drives fencegate with N tokio
//!    tasks, each on ONE keep-alive HTTP/1.1 connection (hyper, no pool in between), doing
//!    `PUT /v1/kv/{key}` with a token from a global, increasing counter;
//! 3. runs pgbench with the identical fenced statement (`fencegate::store::kv_put_sql`, the
//!    function the store itself builds it with) at the same concurrency against the same database;
//! 4. adds a hot-key run, a hot-scope run (one lock holder, one token, random keys; pgbench runs
//!    the scoped statement with the same fixed token), a 90% GET / 10% PUT mix and an RSS soak,
//!    and prints one markdown table.
//!
//! Environment: `DATABASE_URL` (admin URL), `BENCH_SECONDS` (per step, default 10),
//! `BENCH_SOAK_SECONDS` (default 60), `PGBENCH` (path to pgbench; default: PATH, then
//! /usr/lib/postgresql/*/bin), `BENCH_AUTH=1` (fencegate with one API key configured, and every
//! request sending it: the cost of authentication), `BENCH_ISSUER=1` (an Ed25519 `[[issuers]]`
//! entry for every scope; the hot-scope step's writes send their proof: the cost of proofs).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicI64, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::{
    body::Bytes,
    client::conn::http1,
    header::{CONTENT_TYPE, HOST},
    Method, Request, StatusCode,
};
use hyper_util::rt::TokioIo;
use sqlx::{Connection, PgConnection};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpStream,
    process::{Child, Command},
    sync::Barrier,
};

/// Keys written by the random-key steps: `1` ..= `KEYS`, as decimal strings (pgbench's `:k`).
const KEYS: u64 = 10_000;
/// The hot key of the hot-key steps.
const HOT_KEY: u64 = 1;
/// The scope of the hot-scope step: one lock whose holder writes random keys from many tasks.
const HOT_SCOPE: &str = "bench-lock";
/// The hot-scope step writes keys of its own (`SCOPE_KEYS + 1 ..= SCOPE_KEYS + KEYS`): a key
/// the unscoped steps wrote is bound to no scope (sticky scope), so a scoped write of it is a
/// 409, on both sides.
const SCOPE_KEYS: u64 = 1_000_000;
/// The value every PUT writes, as the HTTP body and as pgbench's jsonb literal.
const VALUE: &str = r#"{"n": 42, "by": "bench"}"#;
/// Per-request bound; a request that takes longer counts as a transport error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-task bound on requests in one phase, beside the time bound.
const MAX_REQUESTS_PER_TASK: u64 = 5_000_000;
/// pgbench's token: microseconds since the epoch at the start of the statement. statement_timestamp()
/// is stable within a statement, so both uses of `$4` (key_fence, fence_token) get one value, as
/// they do when fencegate binds one token; and it grows over time, so writes are accepted.
const PGBENCH_TOKEN: &str = "(extract(epoch from statement_timestamp()) * 1000000)::bigint";

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("bench/load.rs: run it with `cargo bench --bench load`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("\nload bench FAILED: {err:#}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Settings and machine facts

struct Settings {
    admin_url: String,
    step: Duration,
    warmup: Duration,
    soak: Duration,
    /// BENCH_ONLY: run only these steps (ids: random1 random16 random64 hot scope mix soak).
    only: Option<Vec<String>>,
    /// BENCH_SCRAPE_SECONDS: GET /metrics this often during the soak, as Prometheus would.
    scrape_every: Option<Duration>,
    pgbench: PathBuf,
    out_dir: PathBuf,
}

impl Settings {
    fn runs(&self, id: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.iter().any(|o| o == id))
    }
}

fn env_secs(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => {
            let n: u64 = v.trim().parse().with_context(|| format!("{name}={v:?} is not a number of seconds"))?;
            if n == 0 || n > 3600 {
                bail!("{name}={n}: choose 1..=3600 seconds");
            }
            Ok(n)
        }
        Err(_) => Ok(default),
    }
}

fn find_pgbench() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("PGBENCH") {
        candidates.push(p.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("pgbench")));
    }
    if let Ok(dirs) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = dirs.flatten().map(|d| d.path().join("bin/pgbench")).collect();
        versions.sort();
        versions.reverse();
        candidates.extend(versions);
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
    }
    bail!(
        "pgbench not found (looked in $PGBENCH, PATH and /usr/lib/postgresql/*/bin). Install it \
         (Debian/Ubuntu: apt-get install postgresql-client, or postgresql-contrib on older releases) \
         or set PGBENCH=/path/to/pgbench"
    )
}

struct Machine {
    nproc: usize,
    cpu: String,
    mem_gib: f64,
    host: String,
    kernel: String,
    pg_version: String,
    synchronous_commit: String,
    fsync: String,
    shared_buffers: String,
    pg_max_connections: String,
    pgbench_version: String,
    commit: String,
    date: String,
    load_before: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_else(|_| "?".into())
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn git_commit() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let Some(head) = command_line("git", &["-C", dir, "rev-parse", "--short=10", "HEAD"]) else {
        return "unknown (no git)".into();
    };
    // The binary under test is built from the working tree: say so if it differs from HEAD.
    match command_line("git", &["-C", dir, "status", "--porcelain", "--", "src", "migrations", "Cargo.toml", "Cargo.lock"]) {
        Some(s) if !s.is_empty() => format!("{head} + uncommitted changes in src/"),
        _ => head,
    }
}

async fn machine_facts(admin: &mut PgConnection, pgbench: &Path) -> Result<Machine> {
    let mut fact = BTreeMap::new();
    for name in ["server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections"] {
        let v: String = sqlx::query_scalar("SELECT current_setting($1)").bind(name).fetch_one(&mut *admin).await?;
        fact.insert(name, v);
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "?".into());
    Ok(Machine {
        nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        cpu,
        mem_gib: mem_kib / 1024.0 / 1024.0,
        host: read_trim("/proc/sys/kernel/hostname"),
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        pg_version: fact["server_version"].clone(),
        synchronous_commit: fact["synchronous_commit"].clone(),
        fsync: fact["fsync"].clone(),
        shared_buffers: fact["shared_buffers"].clone(),
        pg_max_connections: fact["max_connections"].clone(),
        pgbench_version: command_line(pgbench.to_str().unwrap_or("pgbench"), &["--version"]).unwrap_or_else(|| "?".into()),
        commit: git_commit(),
        date: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into()),
        load_before: loadavg(),
    })
}

fn loadavg() -> String {
    read_trim("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// Database: admin connection, fresh database, table reset

fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[after_scheme..].find('/').map(|i| after_scheme + i).unwrap_or(base.len());
    let mut out = format!("{}/{db}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

fn redact(url: &str) -> String {
    // postgres://user:secret@host -> postgres://user:***@host
    if let (Some(s), Some(at)) = (url.find("://"), url.find('@')) {
        if let Some(colon) = url[s + 3..at].find(':') {
            return format!("{}:***{}", &url[..s + 3 + colon], &url[at..]);
        }
    }
    url.to_owned()
}

async fn connect_admin(url: &str) -> Result<PgConnection> {
    let shown = redact(url);
    match tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(url)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => bail!(
            "PostgreSQL is not reachable at {shown}: {e}.\n  The load bench needs a running PostgreSQL server and a role that may CREATE DATABASE.\n  \
             Start one (Debian/Ubuntu: apt-get install postgresql && pg_ctlcluster <version> main start; \
             or: docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16)\n  \
             or point DATABASE_URL at an admin URL, e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
        ),
        Err(_) => bail!("PostgreSQL at {shown} did not answer within 10 s; is the server up (and the address right)?"),
    }
}

/// Puts the table in the same state before every step: `KEYS` live keys, fence 0, version 1,
/// vacuumed and analyzed, then a checkpoint, so no step pays for the previous one's dirt.
/// This lowers fences behind fencegate's back, which is harmless here only because every token
/// of the run (TokenClock, pgbench's clock) is higher than any token presented before it.
async fn reset_table(db: &mut PgConnection, admin: &mut PgConnection) -> Result<()> {
    sqlx::raw_sql("TRUNCATE fencegate_kv").execute(&mut *db).await?;
    sqlx::query(
        "INSERT INTO fencegate_kv (key, value, deleted, key_fence, fence_token, scope)
         SELECT g::text, '{\"n\": 0}'::jsonb, false, 0, 0, NULL FROM generate_series(1, $1::bigint) AS g",
    )
    .bind(KEYS as i64)
    .execute(&mut *db)
    .await?;
    sqlx::raw_sql("VACUUM ANALYZE fencegate_kv").execute(&mut *db).await?;
    // Superuser (or pg_checkpoint) only; without it the step just starts with pending writes.
    let _ = sqlx::raw_sql("CHECKPOINT").execute(&mut *admin).await;
    Ok(())
}

/// Sum of `version` over the table: every accepted write adds exactly 1 (no deletes here), a
/// refused (stale) one adds 0. The difference across a step = writes the database applied.
async fn version_sum(db: &mut PgConnection) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT coalesce(sum(version), 0)::bigint FROM fencegate_kv")
        .fetch_one(&mut *db)
        .await?)
}

// ---------------------------------------------------------------------------------------------
// The statement pgbench runs

fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The put statement as pgbench runs it: $1 key -> `:k`, $2 -> the jsonb value, $3 -> false
/// (not a delete), $4 -> the time-based token.
fn pgbench_put(put_key: &str) -> String {
    let sql = one_line(put_key)
        .replace("$1", ":k")
        .replace("$2", &format!("'{VALUE}'::jsonb"))
        .replace("$3", "false")
        .replace("$4", PGBENCH_TOKEN);
    format!("{sql};\n")
}

/// The scoped put as pgbench runs it: the holder's token is `:t` (pgbench `-D t=..`), fixed
/// for the step as it is for the HTTP clients, and the scope is [`HOT_SCOPE`].
fn pgbench_put_scoped(put_scoped: &str) -> String {
    let sql = one_line(put_scoped)
        .replace("$1", ":k")
        .replace("$2", &format!("'{VALUE}'::jsonb"))
        .replace("$3", "false")
        .replace("$4", ":t")
        .replace("$5", &format!("'{HOT_SCOPE}'"));
    format!("{sql};\n")
}

struct Scripts {
    random: PathBuf,
    hot: PathBuf,
    mix: PathBuf,
    scope: PathBuf,
}

fn pgbench_scripts(put_key: &str, put_scoped: &str, dir: &Path) -> Result<Scripts> {
    let put = pgbench_put(put_key);
    let random = dir.join("put_random.sql");
    std::fs::write(&random, format!("\\set k random(1, {KEYS})\n{put}"))?;
    let hot = dir.join("put_hot.sql");
    std::fs::write(&hot, format!("\\set k {HOT_KEY}\n{put}"))?;
    let mix = dir.join("mix.sql");
    // pgbench would take `:MI` in the to_char format for a variable: spell the colons chr(58),
    // which the planner folds into the same constant once per prepared statement.
    let get = one_line(fencegate::store::KV_GET)
        .replace("HH24:MI:SS", "HH24' || chr(58) || 'MI' || chr(58) || 'SS")
        .replace("$1", ":k");
    std::fs::write(
        &mix,
        format!("\\set k random(1, {KEYS})\n\\set r random(1, 100)\n\\if :r <= 90\n{get};\n\\else\n{put}\\endif\n"),
    )?;
    let scope = dir.join("put_scope.sql");
    std::fs::write(
        &scope,
        format!("\\set k random({}, {})\n{}", SCOPE_KEYS + 1, SCOPE_KEYS + KEYS, pgbench_put_scoped(put_scoped)),
    )?;
    Ok(Scripts { random, hot, mix, scope })
}

// ---------------------------------------------------------------------------------------------
// fencegate process

struct Fencegate {
    child: Child,
    pid: u32,
    addr: SocketAddr,
}

/// With `BENCH_AUTH=1`: the API key every request sends (`Authorization: Bearer ...`).
fn bench_key() -> Option<&'static str> {
    static KEY: OnceLock<Option<String>> = OnceLock::new();
    KEY.get_or_init(|| {
        (std::env::var("BENCH_AUTH").as_deref() == Ok("1")).then(|| fencegate::auth::new_key().expect("a random key"))
    })
    .as_deref()
}

/// With `BENCH_ISSUER=1`: fencegate has an Ed25519 `[[issuers]]` entry covering every scope,
/// and every scoped write sends the proof of its token (one signature per token, made by the
/// client once: a lock holder's signer signs each token once).
fn bench_issuer() -> bool {
    std::env::var("BENCH_ISSUER").as_deref() == Ok("1")
}

const ISSUER_SEED: [u8; 32] = [3; 32];

/// The proof of `token` for the bench scope, signed once per token.
fn proof_of(token: i64) -> String {
    static LAST: std::sync::Mutex<Option<(i64, String)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap();
    match &*last {
        Some((t, proof)) if *t == token => proof.clone(),
        _ => {
            let proof = fencegate::issuers::sign(
                HOT_SCOPE,
                fencegate::fence::FencingToken::from_db(token).expect("a bench token"),
                fencegate::issuers::SigningKey::Ed25519(&ISSUER_SEED),
            );
            *last = Some((token, proof.clone()));
            proof
        }
    }
}

async fn start_fencegate(db_url: &str, out_dir: &Path) -> Result<Fencegate> {
    let bin = env!("CARGO_BIN_EXE_fencegate");
    let log_path = out_dir.join("fencegate.stderr.log");
    let log = std::fs::File::create(&log_path)?;
    let mut args = vec!["serve".to_owned(), "--listen".into(), "127.0.0.1:0".into(), "--database-url".into(), db_url.into()];
    let mut config_text = String::new();
    if let Some(key) = bench_key() {
        config_text.push_str(&format!(
            "[[auth.keys]]\nname = \"bench\"\nsha256 = \"{}\"\nrights = [\"read\", \"write\"]\nprefixes = [\"\"]\n",
            fencegate::auth::digest_hex(key)
        ));
    }
    if bench_issuer() {
        config_text.push_str(&format!(
            "[[issuers]]\nname = \"bench\"\nscopes = [\"\"]\ned25519_public_key = \"{}\"\n",
            fencegate::issuers::ed25519_public_key(&ISSUER_SEED)
        ));
    }
    if !config_text.is_empty() {
        let config = out_dir.join("bench.toml");
        std::fs::write(&config, config_text)?;
        args.extend(["--config".to_owned(), config.display().to_string()]);
    }
    let mut child = Command::new(bin)
        .args(&args)
        .env("FENCEGATE_LOG", "warn")
        .env_remove("RUST_LOG")
        .env_remove("FENCEGATE_CONFIG")
        .env_remove("FENCEGATE_LISTEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {bin}"))?;
    let pid = child.id().context("fencegate exited at once")?;
    FG_PID.store(pid, Ordering::Relaxed);
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let line = match first {
        Ok(Ok(Some(line))) => line,
        other => {
            let _ = child.start_kill();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let why = match other {
                Err(_) => "no `listening on` line within 60 s".to_owned(),
                Ok(Err(e)) => format!("reading its stdout: {e}"),
                _ => "it exited before listening".to_owned(),
            };
            bail!("fencegate did not start ({why}); its stderr:\n{}", log.trim());
        }
    };
    let addr: SocketAddr = line
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected first line from fencegate: {line:?}"))?
        .trim()
        .parse()?;
    // Keep draining stdout so fencegate can never block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Fencegate { child, pid, addr })
}

async fn stop_fencegate(mut fg: Fencegate) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(fg.pid as i32), nix::sys::signal::Signal::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(15), fg.child.wait()).await.is_err() {
        let _ = fg.child.kill().await;
    }
}

/// (VmRSS, VmHWM) in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---------------------------------------------------------------------------------------------
// HTTP load generator

#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    /// PUT on a random key of `KEYS`.
    Random,
    /// PUT on `HOT_KEY` only.
    Hot,
    /// `read_pct`% GET, the rest PUT, on random keys.
    Mix { read_pct: u64 },
    /// PUT on a random key under [`HOT_SCOPE`], every request with the same token: one lock
    /// holder writing from many tasks. `token` is set when the step starts.
    Scope { token: i64 },
}

#[derive(Default)]
struct Stats {
    put_ok: u64,
    get_ok: u64,
    /// 412 stale token.
    stale: u64,
    /// Other non-2xx statuses, by status.
    other: BTreeMap<u16, u64>,
    /// Connect errors, broken connections, timeouts.
    transport: u64,
    /// Latency in µs of every request that got a response (any status), by kind.
    put_lat: Vec<u32>,
    get_lat: Vec<u32>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
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
    fn other_total(&self) -> u64 {
        self.other.values().sum()
    }
}

/// The fencing tokens of the HTTP clients: one global, strictly increasing counter for the whole
/// run, never reset. Each token is max(previous + 1, now in µs since the epoch), so it is on the
/// same scale as pgbench's statement_timestamp() tokens: whichever side wrote a key last, the
/// next writer's token is higher, and a fencegate fence cache from an earlier step never sees a
/// token go backwards (the table reset between steps lowers fences; no token ever does).
struct TokenClock(AtomicI64);

impl TokenClock {
    fn next(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let prev = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some((p + 1).max(now)))
            .expect("closure always returns Some");
        (prev + 1).max(now)
    }
}

static TOKENS: TokenClock = TokenClock(AtomicI64::new(0));

struct Ctx {
    addr: SocketAddr,
    host: String,
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

async fn drive(ctx: &Ctx, conn: &mut Option<Sender>, rng: &mut Rng, until: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut sent = 0u64;
    while sent < MAX_REQUESTS_PER_TASK && Instant::now() < until {
        sent += 1;
        let sender = match conn {
            Some(s) => s,
            None => match connect(ctx.addr).await {
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
            Workload::Random => (false, r % KEYS + 1),
            Workload::Hot => (false, HOT_KEY),
            Workload::Mix { read_pct } => ((r >> 32) % 100 < read_pct, r % KEYS + 1),
            Workload::Scope { .. } => (false, SCOPE_KEYS + r % KEYS + 1),
        };
        let mut builder = Request::builder().uri(format!("/v1/kv/{key}")).header(HOST, &ctx.host);
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
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            sender.ready().await?;
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            resp.into_body().collect().await?;
            Ok::<StatusCode, hyper::Error>(status)
        })
        .await;
        let micros = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        match outcome {
            Ok(Ok(status)) => {
                if is_get { &mut stats.get_lat } else { &mut stats.put_lat }.push(micros);
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
    let mut conn = connect(ctx.addr).await.ok();
    let _warm = drive(&ctx, &mut conn, &mut rng, ctx.warm_until).await;
    ctx.warmed.wait().await;
    ctx.go.wait().await;
    let until = *ctx.measure_until.get().expect("set before go");
    drive(&ctx, &mut conn, &mut rng, until).await
}

struct FgRun {
    stats: Stats,
    elapsed: Duration,
    db_applied: i64,
    /// fencegate's own CPU time over the measured window, in 1/100 s.
    cpu_ticks: u64,
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
            let ids: Vec<u64> = (0..conns as u64).filter(|i| *i as usize % threads == t).collect();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
                runtime.block_on(async move {
                    let tasks: Vec<_> = ids.into_iter().map(|i| tokio::spawn(client_task(ctx.clone(), i))).collect();
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

/// The fencegate process's pid, for its CPU time (set by `start_fencegate`).
static FG_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// User + system CPU time of the fencegate process so far, in clock ticks (1/100 s on Linux).
fn fg_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", FG_PID.load(Ordering::Relaxed))).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(14) + field(15)
}

async fn fencegate_step(fg_addr: SocketAddr, conns: usize, workload: Workload, s: &Settings, dur: Duration, db: &mut PgConnection) -> Result<FgRun> {
    let ctx = Arc::new(Ctx {
        addr: fg_addr,
        host: fg_addr.to_string(),
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
    Ok(FgRun { stats, elapsed, db_applied, cpu_ticks })
}

// ---------------------------------------------------------------------------------------------
// pgbench

struct PgRun {
    processed: u64,
    tps: f64,
    failed: u64,
    lat: Vec<u32>,
    db_applied: i64,
}

/// `defines`: pgbench `-D name=value` variables for the script.
#[allow(clippy::too_many_arguments)]
async fn pgbench_step(
    s: &Settings,
    label: &str,
    conns: usize,
    script: &Path,
    defines: &[String],
    db_url: &str,
    dur: Duration,
    db: &mut PgConnection,
) -> Result<PgRun> {
    let prefix = format!("pgbench_{label}");
    for entry in std::fs::read_dir(&s.out_dir)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&format!("{prefix}.")) {
            std::fs::remove_file(entry.path())?;
        }
    }
    let before = version_sum(db).await?;
    let out = tokio::time::timeout(
        dur + Duration::from_secs(120),
        Command::new(&s.pgbench)
            .current_dir(&s.out_dir)
            .args(["-M", "prepared", "-n"])
            .args(["-c", &conns.to_string(), "-j", &conns.min(2).to_string()])
            .args(["-T", &dur.as_secs().to_string()])
            .args(["--log", &format!("--log-prefix={prefix}")])
            .args(defines.iter().flat_map(|d| ["-D", d.as_str()]))
            .arg("-f")
            .arg(script)
            .arg(db_url)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("pgbench did not finish in time")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stdout.contains("aborted") {
        bail!("pgbench failed ({}):\n{stdout}\n{stderr}", out.status);
    }
    let db_applied = version_sum(db).await? - before;
    let number = |marker: &str| -> Option<f64> {
        let line = stdout.lines().find(|l| l.contains(marker))?;
        line.split(marker).nth(1)?.split_whitespace().next()?.parse().ok()
    };
    let processed = number("number of transactions actually processed:").context("pgbench output has no transaction count")? as u64;
    let tps = stdout
        .lines()
        .find(|l| l.starts_with("tps = ") && l.contains("without initial connection time"))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next()?.parse().ok())
        .with_context(|| format!("pgbench output has no tps line:\n{stdout}"))?;
    let failed = number("number of failed transactions:").unwrap_or(0.0) as u64;
    // Per-transaction log: client_id transaction_no time script_no time_epoch time_us [...];
    // `time` is the transaction's latency in µs.
    let mut lat = Vec::with_capacity(processed as usize);
    for entry in std::fs::read_dir(&s.out_dir)?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(&format!("{prefix}.")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())?;
        lat.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u32>().ok()));
    }
    if lat.is_empty() {
        bail!("pgbench wrote no per-transaction log lines (prefix {prefix} in {})", s.out_dir.display());
    }
    Ok(PgRun { processed, tps, failed, lat, db_applied })
}

// ---------------------------------------------------------------------------------------------
// Report

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

struct Lat {
    p50: f64,
    p99: f64,
}

fn lat(mut v: Vec<u32>) -> Lat {
    v.sort_unstable();
    Lat { p50: percentile(&v, 50.0), p99: percentile(&v, 99.0) }
}

struct Row {
    workload: String,
    conns: usize,
    unit: &'static str,
    fg_rate: f64,
    fg: Lat,
    fg_errors: String,
    pg: Option<(f64, Lat, String)>,
}

fn fmt_rate(r: f64) -> String {
    format!("{r:.0}")
}

fn fmt_ms(ms: f64) -> String {
    if ms.is_nan() {
        "–".into()
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

fn errors_cell(s: &Stats) -> String {
    let mut cell = format!("{} / {} / {}", s.stale, s.other_total(), s.transport);
    if !s.other.is_empty() {
        let detail: Vec<String> = s.other.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        let _ = write!(cell, " ({})", detail.join(", "));
    }
    cell
}

fn report_fg(name: &str, conns: usize, r: &FgRun) -> (f64, Lat) {
    let secs = r.elapsed.as_secs_f64();
    let s = &r.stats;
    let ok = s.put_ok + s.get_ok;
    let rate = ok as f64 / secs;
    let mut all = s.put_lat.clone();
    all.extend(&s.get_lat);
    let l = lat(all);
    println!(
        "  fencegate  {name:<7} c={conns:<3} {rate:>8.0} ok/s  p50 {:>6} ms  p99 {:>6} ms   412 {} / other non-2xx {} / transport {}   [{ok} ok in {secs:.2} s; PUT 2xx {}, db applied {}]",
        fmt_ms(l.p50),
        fmt_ms(l.p99),
        s.stale,
        s.other_total(),
        s.transport,
        s.put_ok,
        r.db_applied,
    );
    // Only a few requests can finish within a tick, so this is steadier than ok/s on a busy host.
    println!("             fencegate CPU {:.1} µs per ok request", r.cpu_ticks as f64 * 10_000.0 / ok.max(1) as f64);
    if s.get_ok > 0 {
        let g = lat(s.get_lat.clone());
        let p = lat(s.put_lat.clone());
        println!(
            "             GET {} ok p50 {} p99 {} ms; PUT {} ok p50 {} p99 {} ms",
            s.get_ok,
            fmt_ms(g.p50),
            fmt_ms(g.p99),
            s.put_ok,
            fmt_ms(p.p50),
            fmt_ms(p.p99)
        );
    }
    (rate, l)
}

/// pgbench's rate of *accepted* writes: its tps scaled by the share the database applied (a
/// stale statement returns no row; pgbench counts it as a transaction anyway).
fn report_pg(name: &str, conns: usize, r: &PgRun, writes_only: bool) -> (f64, Lat, String) {
    let l = lat(r.lat.clone());
    let (rate, stale) = if writes_only {
        let applied = (r.db_applied.max(0) as u64).min(r.processed);
        (r.tps * applied as f64 / r.processed.max(1) as f64, r.processed - applied)
    } else {
        (r.tps, 0)
    };
    println!(
        "  pgbench    {name:<7} c={conns:<3} {rate:>8.0} ok/s  p50 {:>6} ms  p99 {:>6} ms   stale (no row) {} / failed {}   [{} statements, {:.0} tps, db applied {}]",
        fmt_ms(l.p50),
        fmt_ms(l.p99),
        if writes_only { stale.to_string() } else { "–".into() },
        r.failed,
        r.processed,
        r.tps,
        r.db_applied,
    );
    let cell = if writes_only { format!("{stale} / {}", r.failed) } else { format!("– / {}", r.failed) };
    (rate, l, cell)
}

// ---------------------------------------------------------------------------------------------
// The run

async fn run() -> Result<()> {
    let admin_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let step = env_secs("BENCH_SECONDS", 10)?;
    let soak = env_secs("BENCH_SOAK_SECONDS", 60)?;
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-load");
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir)?;
    let s = Settings {
        admin_url,
        step: Duration::from_secs(step),
        warmup: Duration::from_millis((step * 1000 / 5).clamp(1000, 2000)),
        soak: Duration::from_secs(soak),
        only: std::env::var("BENCH_ONLY").ok().map(|v| {
            v.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_owned).collect()
        }),
        scrape_every: match std::env::var("BENCH_SCRAPE_SECONDS") {
            Ok(_) => Some(Duration::from_secs(env_secs("BENCH_SCRAPE_SECONDS", 0)?)),
            Err(_) => None,
        },
        pgbench: find_pgbench()?,
        out_dir,
    };

    let mut admin = connect_admin(&s.admin_url).await?;
    let machine = machine_facts(&mut admin, &s.pgbench).await?;
    let db_name = format!("fencegate_bench_{}", std::process::id());
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db_name}")).execute(&mut admin).await?;
    sqlx::raw_sql(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("CREATE DATABASE {db_name} on {} (the DATABASE_URL role needs CREATEDB)", redact(&s.admin_url)))?;
    let db_url = with_database(&s.admin_url, &db_name);

    let result = run_on(&s, &machine, &db_url, &mut admin).await;

    // Always clean up the database, also after a failure.
    if let Err(e) = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")).execute(&mut admin).await {
        eprintln!("warning: could not drop database {db_name}: {e}");
    }
    result
}

async fn run_on(s: &Settings, m: &Machine, db_url: &str, admin: &mut PgConnection) -> Result<()> {
    // The very statement fencegate runs for an unscoped PUT (kv.strict = false).
    let put_key = fencegate::store::kv_put_sql(fencegate::fence::Rule::Inclusive);
    let put_scoped = fencegate::store::kv_put_scoped_sql(fencegate::fence::Rule::Inclusive);
    let scripts = pgbench_scripts(&put_key, &put_scoped, &s.out_dir)?;

    println!("fencegate load bench: {} s per step (+{:.1} s warm-up for fencegate), soak {} s", s.step.as_secs(), s.warmup.as_secs_f64(), s.soak.as_secs());
    println!("  binary   {}", env!("CARGO_BIN_EXE_fencegate"));
    println!("  pgbench  {} ({})", s.pgbench.display(), m.pgbench_version);
    println!("  database {}", redact(db_url));
    println!("  pgbench statement (fencegate::store::kv_put_sql):\n    {}", std::fs::read_to_string(&scripts.random)?.trim().replace('\n', "\n    "));
    println!("  files    {}", s.out_dir.display());

    let fg = start_fencegate(db_url, &s.out_dir).await?;
    println!("  fencegate pid {} listening on {}", fg.pid, fg.addr);
    let mut db = PgConnection::connect(db_url).await.context("connecting to the bench database")?;

    let outcome = measure(s, &fg, db_url, &mut db, admin, &scripts).await;
    let (_, hwm_end) = rss_kib(fg.pid);
    stop_fencegate(fg).await;
    let (rows, soak) = outcome?;

    let stderr_log = s.out_dir.join("fencegate.stderr.log");
    let log_lines = std::fs::read_to_string(&stderr_log).map(|t| t.lines().count()).unwrap_or(0);

    // The table.
    let mut t = String::new();
    let _ = writeln!(t, "### Load bench: {} on {}, commit {}", m.date, m.host, m.commit);
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "Machine: {} CPUs ({}), {:.1} GiB RAM, Linux {}; load average at start {}, at end {}.  ",
        m.nproc, m.cpu, m.mem_gib, m.kernel, m.load_before, loadavg()
    );
    let _ = writeln!(
        t,
        "PostgreSQL {} on loopback: synchronous_commit={}, fsync={}, shared_buffers={}, max_connections={}; {}.  ",
        m.pg_version, m.synchronous_commit, m.fsync, m.shared_buffers, m.pg_max_connections, m.pgbench_version
    );
    let _ = writeln!(
        t,
        "fencegate: release build, default config (database pool 16 connections), FENCEGATE_LOG=warn. \
         {} s per step ({:.1} s warm-up before fencegate steps), {KEYS} keys, body `{VALUE}`. \
         Load generator, fencegate, pgbench and PostgreSQL share the machine.",
        s.step.as_secs(),
        s.warmup.as_secs_f64()
    );
    let _ = writeln!(t);
    let _ = writeln!(t, "| workload | conns | fencegate ok/s | p50 ms | p99 ms | 412 / other / transport | pgbench ok/s | p50 ms | p99 ms | stale / failed | ok/s fg÷pg | p99 fg÷pg |");
    let _ = writeln!(t, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in &rows {
        let (pg_rate, pg_p50, pg_p99, pg_err, ratio_rate, ratio_p99) = match &r.pg {
            Some((rate, l, err)) => (
                fmt_rate(*rate),
                fmt_ms(l.p50),
                fmt_ms(l.p99),
                err.clone(),
                format!("**{:.2}×**", r.fg_rate / rate),
                format!("{:.2}×", r.fg.p99 / l.p99),
            ),
            None => ("–".into(), "–".into(), "–".into(), "–".into(), "–".into(), "–".into()),
        };
        let _ = writeln!(
            t,
            "| {} ({}) | {} | {} | {} | {} | {} | {pg_rate} | {pg_p50} | {pg_p99} | {pg_err} | {ratio_rate} | {ratio_p99} |",
            r.workload,
            r.unit,
            r.conns,
            fmt_rate(r.fg_rate),
            fmt_ms(r.fg.p50),
            fmt_ms(r.fg.p99),
            r.fg_errors,
        );
    }
    let _ = writeln!(t);
    match &soak {
        Some(soak) => {
            let scraped = match soak.scrapes {
                Some(n) => format!("GET /metrics every {} s ({n} scrapes)", s.scrape_every.map_or(0, |d| d.as_secs())),
                None => "/metrics never scraped".to_owned(),
            };
            let _ = writeln!(
                t,
                "fencegate memory: peak RSS (VmHWM) after the whole run {}. Soak: 64 connections of random-key PUTs for {} s \
                 ({:.0} ok/s; 412 / other / transport {}; {scraped}): RSS first {}, last {}, max {}; every {} s (MiB): {}.  ",
                mib(hwm_end),
                s.soak.as_secs(),
                soak.rate,
                soak.errors,
                mib(soak.samples.first().copied().unwrap_or(0)),
                mib(soak.samples.last().copied().unwrap_or(0)),
                mib(soak.samples.iter().copied().max().unwrap_or(0)),
                soak.every.as_secs(),
                soak.samples.iter().map(|k| format!("{:.1}", *k as f64 / 1024.0)).collect::<Vec<_>>().join(", "),
            );
        }
        None => {
            let _ = writeln!(t, "fencegate memory: peak RSS (VmHWM) after the run {} (no soak: BENCH_ONLY).  ", mib(hwm_end));
        }
    }
    let _ = writeln!(t, "fencegate wrote {log_lines} log lines at level warn ({}).", stderr_log.display());
    println!("\n{t}");
    Ok(())
}

struct Soak {
    rate: f64,
    errors: String,
    samples: Vec<u64>,
    every: Duration,
    /// GET /metrics done during the soak (None: not asked for, BENCH_SCRAPE_SECONDS unset).
    scrapes: Option<u64>,
}

async fn scrape_metrics(addr: SocketAddr) -> Result<()> {
    let mut sender = connect(addr).await?;
    let req = Request::builder()
        .uri("/metrics")
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, async {
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        Ok::<_, hyper::Error>(status)
    })
    .await??;
    if !resp.is_success() {
        bail!("GET /metrics: {resp}");
    }
    Ok(())
}

async fn measure(
    s: &Settings,
    fg: &Fencegate,
    db_url: &str,
    db: &mut PgConnection,
    admin: &mut PgConnection,
    scripts: &Scripts,
) -> Result<(Vec<Row>, Option<Soak>)> {
    let mut rows = Vec::new();
    let steps: [(&str, &str, usize, Workload, &Path); 6] = [
        ("random", "random key, writes/s", 1, Workload::Random, &scripts.random),
        ("random", "random key, writes/s", 16, Workload::Random, &scripts.random),
        ("random", "random key, writes/s", 64, Workload::Random, &scripts.random),
        ("hot", "one hot key, writes/s", 64, Workload::Hot, &scripts.hot),
        ("scope", "one hot scope (random keys), writes/s", 64, Workload::Scope { token: 0 }, &scripts.scope),
        ("mix", "90% GET / 10% PUT, ops/s", 64, Workload::Mix { read_pct: 90 }, &scripts.mix),
    ];
    println!();
    for (name, title, conns, workload, script) in steps {
        let id = if name == "random" { format!("{name}{conns}") } else { name.to_owned() };
        if !s.runs(&id) {
            continue;
        }
        let (workload_name, unit) = title.split_once(", ").expect("title");
        // The hot scope's holder presents one token for the whole step, above every earlier one.
        let workload = match workload {
            Workload::Scope { .. } => Workload::Scope { token: TOKENS.next() },
            other => other,
        };
        reset_table(db, admin).await?;
        let r = fencegate_step(fg.addr, conns, workload, s, s.step, db).await?;
        let (fg_rate, fg_lat) = report_fg(name, conns, &r);
        reset_table(db, admin).await?;
        let defines = match workload {
            Workload::Scope { .. } => vec![format!("t={}", TOKENS.next())],
            _ => Vec::new(),
        };
        let p = pgbench_step(s, &format!("{name}_c{conns}"), conns, script, &defines, db_url, s.step, db).await?;
        let pg = report_pg(name, conns, &p, workload != (Workload::Mix { read_pct: 90 }));
        println!(
            "  ratio      fencegate/pgbench: ok/s {:.2}×, p99 {:.2}×   (fencegate VmRSS {})\n",
            fg_rate / pg.0,
            fg_lat.p99 / pg.1.p99,
            mib(rss_kib(fg.pid).0)
        );
        rows.push(Row {
            workload: workload_name.to_owned(),
            conns,
            unit,
            fg_rate,
            fg: fg_lat,
            fg_errors: errors_cell(&r.stats),
            pg: Some(pg),
        });
    }

    // Soak: 64 connections of random-key PUTs, RSS sampled while it runs.
    if !s.runs("soak") {
        return Ok((rows, None));
    }
    reset_table(db, admin).await?;
    let every = Duration::from_secs((s.soak.as_secs() / 12).clamp(1, 5));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pid) = (stop.clone(), fg.pid);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(every);
            // Bounded: at most one sample per `every` for one hour.
            for _ in 0..3600 {
                tick.tick().await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                samples.push(rss_kib(pid).0);
            }
            samples
        })
    };
    let scraper = s.scrape_every.map(|every| {
        let (stop, addr) = (stop.clone(), fg.addr);
        tokio::spawn(async move {
            let mut scrapes = 0u64;
            for _ in 0..3600 {
                tokio::time::sleep(every).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if scrape_metrics(addr).await.is_ok() {
                    scrapes += 1;
                }
            }
            scrapes
        })
    });
    let r = fencegate_step(fg.addr, 64, Workload::Random, s, s.soak, db).await?;
    stop.store(true, Ordering::Relaxed);
    let mut samples = sampler.await?;
    let scrapes = match scraper {
        Some(t) => Some(t.await?),
        None => None,
    };
    samples.push(rss_kib(fg.pid).0);
    let (rate, _) = report_fg("soak", 64, &r);
    println!(
        "  soak RSS every {} s (MiB): {}",
        every.as_secs(),
        samples.iter().map(|k| format!("{:.1}", *k as f64 / 1024.0)).collect::<Vec<_>>().join(" ")
    );
    let soak = Soak { rate, errors: errors_cell(&r.stats), samples, every, scrapes };
    Ok((rows, Some(soak)))
}
