//! `cargo bench --bench idle`: what idle keep-alive connections cost fencegate in memory
//! (issue 19: 10,000 of them within 100 MiB of RSS).
//!
//! 1. Creates a fresh database on the server in `DATABASE_URL` (admin URL; default
//!    `postgres://postgres@127.0.0.1:5432/postgres`) and starts the real fencegate binary on it,
//!    with a config that lets every connection stay: `server.max_connections` above
//!    `IDLE_CONNECTIONS`, and `server.idle_timeout_ms` of one hour (longer than the whole run).
//! 2. Warms fencegate up on one connection (100 requests, then closed), so that what the first
//!    requests allocate once (pool connections, prepared statements) is not counted per
//!    connection; reads VmRSS and VmHWM: the baseline.
//! 3. Opens `IDLE_CONNECTIONS` (10,000) connections, at most 128 at a time, and makes ONE
//!    request on each (`IDLE_REQUEST`: `put`, a 24-byte value under a key of its own, or
//!    `healthz`); the connection is kept alive and left idle. `IDLE_OPEN_RATE` (`1000,0`): the
//!    connections opened a second, one round each with a fresh fencegate; 0 is as fast as
//!    fencegate answers (a burst).
//! 4. With all of them idle, samples fencegate's memory every
//!    second for `IDLE_SECONDS` (10), checks that every connection is still open (on both ends),
//!    and prints the total, the delta over the baseline and the bytes per idle connection.
//! 5. Closes them all, waits until fencegate has let go of them, and reads the memory again.
//! 6. Prints one table row per round.
//!
//! Each idle connection keeps hyper's connection: its read buffer (8 KiB once a request came),
//! its write buffer and its task. Parking idle connections (hyper's parts dropped after a
//! short idle spell, a fresh hyper connection for the next request) was tried on a branch and
//! is not merged yet (bench/README.md, "Idle connections").
//!
//! The clients are plain tokio `TcpStream`s writing a raw HTTP/1.1 request: 10,000 sockets and
//! nothing else per connection, in a process of their own. Both processes need
//! `IDLE_CONNECTIONS` + a few hundred file descriptors (`ulimit -n`).
//!
//! `IDLE_FENCEGATE_ENV` (e.g. `_RJEM_MALLOC_CONF=background_thread:true`): extra environment for
//! fencegate, to compare allocator settings; `--no-default-features` measures glibc's malloc
//! instead of jemalloc.

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use sqlx::{Connection, Executor, PgConnection};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

// One copy of the URL helper, shared with the test binaries and bench/load.
#[path = "../tests/support/db_url.rs"]
mod db_url;
#[path = "support/process.rs"]
mod process;

use process::{stop, Fencegate};

/// Longer than any run, so that no connection is closed as idle while it is measured.
const IDLE_TIMEOUT_MS: u64 = 3_600_000;
/// Connections opened (connect + one request) at once: below the listen backlog (1024).
const OPENING_AT_ONCE: usize = 128;
const WARMUP_REQUESTS: u64 = 100;
const VALUE: &str = r#"{"n": 42, "by": "bench"}"#;
const MIB: f64 = 1024.0 * 1024.0;

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("bench/idle.rs: run it with `cargo bench --bench idle`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("\nidle bench FAILED: {err:#}");
        std::process::exit(1);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Put,
    Healthz,
}

struct Settings {
    admin_url: String,
    connections: usize,
    /// Connections opened a second, one round (and one fencegate process) each; 0: as fast as
    /// fencegate answers.
    rates: Vec<u64>,
    idle: Duration,
    kind: Kind,
    fencegate_env: Vec<(String, String)>,
}

fn settings() -> Result<Settings> {
    let number = |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| -> Result<u64> {
        match std::env::var(name) {
            Err(_) => Ok(default),
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(n) if range.contains(&n) => Ok(n),
                _ => bail!("{name}={v:?}: choose a number in {range:?}"),
            },
        }
    };
    let kind = match std::env::var("IDLE_REQUEST").as_deref() {
        Err(_) | Ok("put") => Kind::Put,
        Ok("healthz") => Kind::Healthz,
        Ok(other) => bail!("IDLE_REQUEST={other:?}: choose put or healthz"),
    };
    let rates = match std::env::var("IDLE_OPEN_RATE") {
        Err(_) => vec![1_000, 0],
        Ok(v) => v
            .split([',', ' '])
            .filter(|r| !r.is_empty())
            .map(|r| {
                r.parse::<u64>().with_context(|| {
                    format!(
                        "IDLE_OPEN_RATE={v:?}: connections a second, comma-separated; 0: at once"
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    ensure!(
        !rates.is_empty(),
        "IDLE_OPEN_RATE is empty: give at least one rate (0: at once)"
    );
    let fencegate_env = std::env::var("IDLE_FENCEGATE_ENV")
        .unwrap_or_default()
        .split_whitespace()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
            None => bail!("IDLE_FENCEGATE_ENV: {pair:?} is not NAME=VALUE"),
        })
        .collect::<Result<_>>()?;
    Ok(Settings {
        admin_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        connections: number("IDLE_CONNECTIONS", 10_000, 1..=1_000_000)? as usize,
        rates,
        idle: Duration::from_secs(number("IDLE_SECONDS", 10, 2..=600)?),
        kind,
        fencegate_env,
    })
}

async fn run() -> Result<()> {
    let s = settings()?;
    let needed = s.connections as u64 + 256;
    let limit = open_files_limit();
    ensure!(
        limit >= needed,
        "{} connections need about {needed} file descriptors in this process and in fencegate, and \
         `ulimit -n` is {limit}: raise it (ulimit -n {needed}) or lower IDLE_CONNECTIONS",
        s.connections
    );
    let db_name = format!("fencegate_idle_{}", std::process::id());
    let mut admin = PgConnection::connect(&s.admin_url)
        .await
        .context("connecting to DATABASE_URL (admin)")?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {db_name}").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {db_name}").as_str())
        .await
        .context("CREATE DATABASE (the DATABASE_URL role needs CREATEDB)")?;
    let outcome = bench(&s, &db_url::with_database(&s.admin_url, &db_name)).await;
    // Always clean up the database, also after a failure.
    if let Err(e) = admin
        .execute(format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)").as_str())
        .await
    {
        eprintln!("warning: could not drop database {db_name}: {e}");
    }
    outcome
}

async fn start(s: &Settings, db_url: &str, out_dir: &Path) -> Result<Fencegate> {
    std::fs::create_dir_all(out_dir)?;
    let config = out_dir.join("idle.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nmax_connections = {}\nidle_timeout_ms = {IDLE_TIMEOUT_MS}\n",
            s.connections + 100
        ),
    )?;
    let mut cmd = process::command(env!("CARGO_BIN_EXE_fencegate"), db_url, Some(&config));
    cmd.envs(s.fencegate_env.iter().map(|(k, v)| (k, v)));
    process::spawn(cmd, &out_dir.join("fencegate.stderr.log")).await
}

/// What /proc says of fencegate's memory, in KiB.
#[derive(Clone, Copy)]
struct Memory {
    rss: u64,
    hwm: u64,
    anon: u64,
}

fn memory(pid: u32) -> Memory {
    let [rss, hwm, anon] = process::status_kib(pid, ["VmRSS:", "VmHWM:", "RssAnon:"]);
    Memory { rss, hwm, anon }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VmRSS {:.1} MiB (RssAnon {:.1}), VmHWM {:.1} MiB",
            mib(self.rss),
            mib(self.anon),
            mib(self.hwm)
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// File descriptors fencegate holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// This process's soft limit of open files (fencegate inherits it).
fn open_files_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(u64::MAX)
}

fn request(kind: Kind, round: usize, n: u64) -> Vec<u8> {
    match kind {
        Kind::Healthz => b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
        Kind::Put => format!(
            "PUT /v1/kv/idle-{round}-{n} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{VALUE}",
            VALUE.len()
        )
        .into_bytes(),
    }
}

/// One request on a keep-alive connection: the status, once the whole response is read.
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> Result<u16> {
    stream.write_all(request).await?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await?;
        ensure!(n > 0, "fencegate closed the connection before answering");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end])?.to_ascii_lowercase();
        let status: u16 = head.split(' ').nth(1).context("no status line")?.parse()?;
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .context("a response without content-length")?
            .trim()
            .parse()?;
        ensure!(
            !head.contains("\nconnection: close"),
            "fencegate answered {status} and closes the connection"
        );
        if buf.len() >= end + 4 + length {
            return Ok(status);
        }
    }
}

/// Opens a connection and makes request `n` on it; the connection stays open.
async fn open(addr: SocketAddr, kind: Kind, round: usize, n: u64) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.context("connect")?;
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        exchange(&mut stream, &request(kind, round, n)),
    )
    .await
    .context("no response within 30 s")??;
    ensure!(
        (200..300).contains(&status),
        "request {n} answered {status}"
    );
    Ok(stream)
}

/// Whether the peer still has the connection open: nothing to read, and no end of stream.
fn still_open(stream: &TcpStream) -> bool {
    matches!(stream.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// One measured round: its figures, in KiB.
struct Row {
    rate: f64,
    connections: usize,
    before: Memory,
    idle: Memory,
    after: Memory,
}

async fn bench(s: &Settings, db_url: &str) -> Result<()> {
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-idle");
    let allocator = if cfg!(feature = "jemalloc") {
        "jemalloc (default)"
    } else {
        "glibc malloc (--no-default-features)"
    };
    let kind = match s.kind {
        Kind::Put => "PUT /v1/kv/idle-{round}-{i} (24-byte JSON value)",
        Kind::Healthz => "GET /healthz",
    };
    let env: Vec<String> = s
        .fencegate_env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "fencegate idle-connection bench: {} connections, one request each, then idle {} s; a fresh fencegate per opening rate",
        s.connections,
        s.idle.as_secs()
    );
    println!(
        "  binary    {} ({allocator})",
        env!("CARGO_BIN_EXE_fencegate")
    );
    if !env.is_empty() {
        println!("  env       {}", env.join(" "));
    }
    println!(
        "  config    server.max_connections = {}, server.idle_timeout_ms = {IDLE_TIMEOUT_MS} (1 h: longer than the \
         run, so no connection is closed as idle); everything else default",
        s.connections + 100
    );
    println!("  request   {kind}, HTTP/1.1 keep-alive; each idle connection keeps its hyper connection and buffers");
    let mut rows = Vec::new();
    for (round, &rate) in s.rates.iter().enumerate() {
        let fg = start(s, db_url, &out_dir).await?;
        let row = measure(s, &fg, round, rate, &out_dir).await;
        stop(fg).await;
        rows.push(row?);
    }

    let allocator = match env.is_empty() {
        true => allocator.to_owned(),
        false => format!(
            "{allocator}, {}",
            env.iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    };
    println!();
    println!("| allocator | idle connections | opened | RSS before | RSS all idle | delta | per idle connection | VmHWM | RSS after closing |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in &rows {
        let delta = r.idle.rss.saturating_sub(r.before.rss);
        println!(
            "| {allocator} | {} | {:.0}/s | {:.1} MiB | {:.1} MiB | **{:.1} MiB** | {:.1} KiB | {:.1} MiB | {:.1} MiB |",
            r.connections,
            r.rate,
            mib(r.before.rss),
            mib(r.idle.rss),
            mib(delta),
            delta as f64 / r.connections as f64,
            mib(r.idle.hwm),
            mib(r.after.rss)
        );
    }
    println!();
    for r in &rows {
        let per_connection =
            r.idle.rss.saturating_sub(r.before.rss) as f64 * 1024.0 / r.connections as f64;
        let projected = per_connection * 10_000.0 / MIB;
        println!(
            "target: 10,000 idle connections within 100 MiB of RSS; opened {:.0}/s, at {:.1} KiB each: {projected:.1} MiB, {}",
            r.rate,
            per_connection / 1024.0,
            if projected <= 100.0 { "met" } else { "NOT met" }
        );
    }
    Ok(())
}

/// Warm-up, baseline, `s.connections` opened `rate` a second (0: at once), idle, closed.
async fn measure(
    s: &Settings,
    fg: &Fencegate,
    round: usize,
    rate: u64,
    out_dir: &Path,
) -> Result<Row> {
    let pid = fg.pid;
    let pace = match rate {
        0 => "as fast as fencegate answers".to_owned(),
        r => format!("{r} a second"),
    };
    println!("\nround {}: fencegate pid {pid}, {} connections opened {pace}, at most {OPENING_AT_ONCE} at once", round + 1, s.connections);
    println!("  started   {}", memory(pid));

    let warm_at = Instant::now();
    let mut warm = TcpStream::connect(fg.addr).await?;
    for i in 0..WARMUP_REQUESTS {
        let status = exchange(&mut warm, &request(s.kind, round, 1_000_000 + i)).await?;
        ensure!(
            (200..300).contains(&status),
            "warm-up request answered {status}"
        );
    }
    drop(warm);
    let fds_before = settle_fds(pid, None).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = memory(pid);
    println!("  baseline  {before} after {WARMUP_REQUESTS} warm-up requests on one connection ({:.1} s), {fds_before} open fds", warm_at.elapsed().as_secs_f64());

    let opening = Instant::now();
    let (addr, kind) = (fg.addr, s.kind);
    let streams: Vec<TcpStream> = stream::iter(0..s.connections as u64)
        .map(|n| async move {
            if rate > 0 {
                tokio::time::sleep_until(
                    (opening + Duration::from_secs_f64(n as f64 / rate as f64)).into(),
                )
                .await;
            }
            open(addr, kind, round, n).await
        })
        .buffer_unordered(OPENING_AT_ONCE)
        .try_collect()
        .await?;
    let opened_in = opening.elapsed();
    let n = streams.len();
    println!(
        "  opened    {n} connections in {:.1} s ({:.0}/s), one 2xx each; fencegate {}, {} open fds",
        opened_in.as_secs_f64(),
        n as f64 / opened_in.as_secs_f64(),
        memory(pid),
        open_fds(pid)
    );

    let mut samples = Vec::new();
    for _ in 0..s.idle.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(memory(pid));
    }
    let idle = memory(pid);
    let fds_idle = open_fds(pid);
    let closed = streams.iter().filter(|c| !still_open(c)).count();
    ensure!(
        closed == 0,
        "{closed} of {n} idle connections were closed by fencegate (see its log in {})",
        out_dir.display()
    );
    println!(
        "  idle RSS  every 1 s (MiB): {}",
        samples
            .iter()
            .map(|m| format!("{:.1}", mib(m.rss)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("  all idle  {idle}; all {n} connections still open, fencegate holds {fds_idle} fds");

    drop(streams);
    let closing = Instant::now();
    let fds_after = settle_fds(pid, Some(fds_idle - n)).await;
    let closed_in = closing.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = memory(pid);
    println!(
        "  closed    fencegate back to {fds_after} fds in {closed_in:.1} s; 2 s later {after}"
    );
    Ok(Row {
        rate: n as f64 / opened_in.as_secs_f64(),
        connections: n,
        before,
        idle,
        after,
    })
}

/// Waits (up to 30 s) until fencegate's open fds fall to `target`, or else stop changing.
async fn settle_fds(pid: u32, target: Option<usize>) -> usize {
    let mut last = open_fds(pid);
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = open_fds(pid);
        if target.map_or(now == last, |t| now <= t) {
            return now;
        }
        last = now;
    }
    last
}
