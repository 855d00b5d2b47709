//! `cargo bench --bench abuse`: does fencegate keep serving well-behaved clients while it is
//! attacked (issue 14)? And how much memory does a burst of large bodies leave behind?
//!
//! 1. Creates a fresh database on the server in `DATABASE_URL` (admin URL; default
//!    `postgres://postgres@127.0.0.1:5432/postgres`) and starts the real fencegate binary
//!    (default config) on it.
//! 2. **baseline**: `ABUSE_CLIENTS` (16) keep-alive connections doing random-key PUTs for
//!    `BENCH_SECONDS` (10): ok/s and p99.
//! 3. **abuse**: the same clients again, while the server is attacked by
//!    - 2,000 slow connections, each sending one header byte every 2 s (reconnecting when cut);
//!    - 200 PUTs trickling their body `1,` every 2 s (reconnecting when cut);
//!    - 4 connections sending amplification payloads, `ABUSE_AMP_PER_SEC` (100) each per second
//!      (0: as fast as they are answered): `{"n": 1e131071}` (9 bytes that PostgreSQL would
//!      print as 131,072 digits) and `{"n": 1e999999}` (which PostgreSQL cannot store; both are
//!      400 at the edge);
//!    - 4 connections pipelining GETs of a 1 MiB value and never reading the answers.
//!
//!    The well-behaved rate must hold within 20% of the baseline. The attackers run on a thread
//!    of their own, so that they do not slow the well-behaved clients' load generator itself.
//! 4. **memory**: RSS of fencegate before, at the peak of, and 2 s and 10 s after 256 parallel
//!    PUTs of 1 MiB each (each on its own connection), with the statuses they got.
//!
//! `ABUSE_MALLOC_ENV` (e.g. `MALLOC_ARENA_MAX=2`): extra environment for fencegate, to compare
//! allocator settings. `ABUSE_FENCEGATE`: another fencegate binary to measure (an older
//! commit's build). `ABUSE_FENCEGATE_TOML`: configuration for it, as TOML (`\n` may be written
//! as the two characters `\n`). `ABUSE_ONLY=zero-window`: only step 5.
//!
//! 5. **zero window**: 10 h2c connections announce SETTINGS_INITIAL_WINDOW_SIZE = 0 and each
//!    ask for the 1 MiB value on 100 streams, never making room: RSS of fencegate before, at the
//!    peak (sampled every 20 ms for 15 s), and after; the streams answered and refused
//!    (REFUSED_STREAM), and how many connections fencegate closed. `ABUSE_ZERO_WINDOW_KEYS=N`:
//!    N different 1 MiB values asked for in turn (written first), instead of one.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use sqlx::{Connection, Executor, PgConnection};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    process::{Child, Command},
};

const VALUE: &str = r#"{"n": 42, "by": "bench"}"#;
const SLOW_HEADERS: usize = 2000;
const SLOW_BODIES: usize = 200;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("bench/abuse.rs: run it with `cargo bench --bench abuse`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("\nabuse bench FAILED: {err:#}");
        std::process::exit(1);
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run() -> Result<()> {
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let secs = Duration::from_secs(env_num("BENCH_SECONDS", 10));
    let clients = env_num("ABUSE_CLIENTS", 16) as usize;
    let db_name = format!("fencegate_abuse_{}", std::process::id());
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .context("connect to DATABASE_URL (admin)")?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {db_name}").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {db_name}").as_str())
        .await?;
    let db_url = match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{db_name}"),
        None => bail!("DATABASE_URL has no database part"),
    };
    let outcome = bench(&db_url, secs, clients).await;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)").as_str())
        .await?;
    outcome
}

struct Fencegate {
    child: Child,
    pid: u32,
    addr: SocketAddr,
}

async fn start(db_url: &str) -> Result<Fencegate> {
    let binary = std::env::var("ABUSE_FENCEGATE")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencegate").to_owned());
    let mut cmd = Command::new(binary);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--database-url", db_url]);
    if let Ok(toml) = std::env::var("ABUSE_FENCEGATE_TOML") {
        let path =
            std::env::temp_dir().join(format!("fencegate-abuse-{}.toml", std::process::id()));
        std::fs::write(&path, toml.replace("\\n", "\n"))?;
        cmd.arg("--config").arg(path);
    }
    cmd.env("FENCEGATE_LOG", "error")
        .env_remove("RUST_LOG")
        .env_remove("FENCEGATE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Ok(extra) = std::env::var("ABUSE_MALLOC_ENV") {
        for pair in extra.split_whitespace() {
            if let Some((k, v)) = pair.split_once('=') {
                cmd.env(k, v);
            }
        }
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().context("exited")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await??
        .context("no output")?;
    let addr = line
        .strip_prefix("listening on ")
        .context("no `listening on`")?
        .trim()
        .parse()?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Fencegate { child, pid, addr })
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// One request on a raw keep-alive connection; returns the status (the body is read and dropped).
async fn request(stream: &mut BufReader<TcpStream>, head_and_body: &[u8]) -> Result<u16> {
    stream.get_mut().write_all(head_and_body).await?;
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let status: u16 = line.split(' ').nth(1).context("status line")?.parse()?;
    let mut length = 0usize;
    let mut close = false;
    loop {
        line.clear();
        if stream.read_line(&mut line).await? == 0 {
            bail!("closed");
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            length = v.trim().parse()?;
        }
        if l == "connection: close" {
            close = true;
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    if close {
        // The status too: a refusal that ends its connection (413, 408, a 503 mid-body) is
        // still an answer, not a cut connection.
        bail!("{status}, then the server closed");
    }
    Ok(status)
}

fn put(key: u64, token: u64, body: &str) -> Vec<u8> {
    format!(
        "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[derive(Default)]
struct Tally {
    ok: u64,
    other: BTreeMap<String, u64>,
    lat_us: Vec<u32>,
}

static TOKEN: AtomicU64 = AtomicU64::new(1);

/// `clients` well-behaved connections for `dur`.
async fn well_behaved(
    addr: SocketAddr,
    clients: usize,
    dur: Duration,
) -> (f64, f64, BTreeMap<String, u64>) {
    let until = Instant::now() + dur;
    let mut tasks = Vec::new();
    for c in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let mut conn: Option<BufReader<TcpStream>> = None;
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1);
            while Instant::now() < until {
                if conn.is_none() {
                    match TcpStream::connect(addr).await {
                        Ok(s) => conn = Some(BufReader::new(s)),
                        Err(e) => {
                            *t.other.entry(format!("connect: {e}")).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let req = put(
                    rng % 10_000 + 1,
                    TOKEN.fetch_add(1, Ordering::Relaxed),
                    VALUE,
                );
                let started = Instant::now();
                let res = tokio::time::timeout(
                    Duration::from_secs(10),
                    request(conn.as_mut().unwrap(), &req),
                )
                .await;
                match res {
                    Ok(Ok(s)) if (200..300).contains(&s) => {
                        t.ok += 1;
                        t.lat_us.push(started.elapsed().as_micros() as u32);
                    }
                    Ok(Ok(s)) => *t.other.entry(s.to_string()).or_default() += 1,
                    Ok(Err(e)) => {
                        *t.other.entry(format!("transport: {e}")).or_default() += 1;
                        conn = None;
                    }
                    Err(_) => {
                        *t.other.entry("timeout".into()).or_default() += 1;
                        conn = None;
                    }
                }
            }
            t
        }));
    }
    let started = Instant::now();
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.expect("client");
        all.ok += t.ok;
        all.lat_us.extend(t.lat_us);
        for (k, v) in t.other {
            *all.other.entry(k).or_default() += v;
        }
    }
    let elapsed = started.elapsed().max(dur);
    all.lat_us.sort_unstable();
    let p99 = all
        .lat_us
        .get(all.lat_us.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0) as f64
        / 1000.0;
    (all.ok as f64 / elapsed.as_secs_f64(), p99, all.other)
}

/// Attackers run until `stop`; counts what they achieved.
#[derive(Default)]
struct Attack {
    slow_cut: AtomicU64,
    trickle_cut: AtomicU64,
    amplification_sent: AtomicU64,
    amplification_400: AtomicU64,
    non_reader_cut: AtomicU64,
}

fn attack(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    counts: Arc<Attack>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..SLOW_HEADERS {
        let (stop, counts) = (stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            // Spread the start so 2,000 connects do not land in one instant.
            tokio::time::sleep(Duration::from_millis((i % 1000) as u64)).await;
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\n").await;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    if s.write_all(b"X").await.is_err() {
                        counts.slow_cut.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }));
    }
    for i in 0..SLOW_BODIES {
        let (stop, counts) = (stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis((i * 5) as u64)).await;
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let head = format!("PUT /v1/kv/trickle{i} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n[");
                let _ = s.write_all(head.as_bytes()).await;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    if s.write_all(b"1,").await.is_err() {
                        counts.trickle_cut.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    let mut probe = [0u8; 1];
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut probe)).await {
                        counts.trickle_cut.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }));
    }
    let per_sec = env_num("ABUSE_AMP_PER_SEC", 100);
    for i in 0..4u64 {
        let (stop, counts) = (stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn: Option<BufReader<TcpStream>> = None;
            let mut pace = (per_sec > 0)
                .then(|| tokio::time::interval(Duration::from_secs(1) / per_sec as u32));
            while !stop.load(Ordering::Relaxed) {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                if conn.is_none() {
                    conn = TcpStream::connect(addr).await.ok().map(BufReader::new);
                    if conn.is_none() {
                        continue;
                    }
                }
                let body = if i % 2 == 0 {
                    r#"{"n": 1e131071}"#
                } else {
                    r#"{"n": 1e999999}"#
                };
                counts.amplification_sent.fetch_add(1, Ordering::Relaxed);
                match request(conn.as_mut().unwrap(), &put(900_000 + i, 1, body)).await {
                    Ok(400) => {
                        counts.amplification_400.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => conn = None,
                }
            }
        }));
    }
    for _ in 0..4 {
        let (stop, counts) = (stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let gets = "GET /v1/kv/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(64);
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    continue;
                };
                let _ = s.write_all(gets.as_bytes()).await;
                // Never read; wait until the server gives up on us (the write timeout).
                let mut closed = false;
                while !stop.load(Ordering::Relaxed) && !closed {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    closed = s.write_all(b"\r\n").await.is_err();
                }
                if closed {
                    counts.non_reader_cut.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tasks
}

async fn bench(db_url: &str, secs: Duration, clients: usize) -> Result<()> {
    let fg = start(db_url).await?;
    let addr = fg.addr;
    println!("fencegate abuse bench: {} s per phase, {clients} well-behaved connections (random-key PUTs)", secs.as_secs());
    println!(
        "  binary {} pid {} on {addr}",
        std::env::var("ABUSE_FENCEGATE")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencegate").to_owned()),
        fg.pid
    );
    if let Ok(extra) = std::env::var("ABUSE_MALLOC_ENV") {
        println!("  fencegate environment: {extra}");
    }
    // A 1 MiB value for the non-readers.
    let big = format!("\"{}\"", "x".repeat(1024 * 1024 - 16));
    let mut s = BufReader::new(TcpStream::connect(addr).await?);
    let status = request(&mut s, &put_key("big", 1, &big)).await?;
    if status >= 300 {
        bail!("could not write the big value: {status}");
    }
    drop(s);
    if std::env::var("ABUSE_ONLY").as_deref() == Ok("zero-window") {
        zero_window(&fg).await?;
        return stop_fencegate(fg).await;
    }

    let _ = well_behaved(addr, clients, Duration::from_secs(2)).await; // warm-up
    let (base_rate, base_p99, base_other) = well_behaved(addr, clients, secs).await;
    println!("| phase | well-behaved ok/s | p99 ms | other outcomes | fencegate RSS |");
    println!("|---|--:|--:|---|--:|");
    println!(
        "| baseline | {base_rate:.0} | {base_p99:.2} | {base_other:?} | {:.1} MiB |",
        rss_mib(fg.pid)
    );

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Attack::default());
    let attackers = {
        let (stop, counts) = (stop.clone(), counts.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("attack runtime");
            rt.block_on(async move {
                let tasks = attack(addr, stop.clone(), counts);
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                for t in tasks {
                    t.abort();
                }
            });
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await; // let the attack build up
    let (abuse_rate, abuse_p99, abuse_other) = well_behaved(addr, clients, secs).await;
    let rss_attack = rss_mib(fg.pid);
    let open = std::fs::read_dir(format!("/proc/{}/fd", fg.pid))
        .map(|d| d.count())
        .unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || attackers.join())
        .await?
        .map_err(|_| anyhow::anyhow!("attackers panicked"))?;
    println!("| under attack | {abuse_rate:.0} | {abuse_p99:.2} | {abuse_other:?} | {rss_attack:.1} MiB |");
    println!();
    println!(
        "under attack / baseline: **{:.2}×** (target >= 0.80). fencegate had {open} open files during the attack. \
         Attack: {SLOW_HEADERS} slow-header connections (cut {} times), {SLOW_BODIES} trickled bodies (cut {} times), \
         amplification PUTs ({} per connection per second; 0 = unpaced) {} sent / {} answered 400, 4 non-reading pipeliners (cut {} times).",
        abuse_rate / base_rate,
        counts.slow_cut.load(Ordering::Relaxed),
        counts.trickle_cut.load(Ordering::Relaxed),
        env_num("ABUSE_AMP_PER_SEC", 100),
        counts.amplification_sent.load(Ordering::Relaxed),
        counts.amplification_400.load(Ordering::Relaxed),
        counts.non_reader_cut.load(Ordering::Relaxed),
    );

    // Memory: 256 parallel 1 MiB PUTs.
    tokio::time::sleep(Duration::from_secs(12)).await; // the attack's connections time out
    let before = rss_mib(fg.pid);
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling, pid) = (peak.clone(), sampling.clone(), fg.pid);
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max((rss_mib(pid) * 1024.0) as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let big = Arc::new(big);
    let mut puts = Vec::new();
    for i in 0..256u64 {
        let big = big.clone();
        puts.push(tokio::spawn(async move {
            let mut s = BufReader::new(TcpStream::connect(addr).await?);
            request(&mut s, &put_key(&format!("mem{i}"), 1, &big)).await
        }));
    }
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for p in puts {
        let key = match p.await? {
            Ok(s) => s.to_string(),
            Err(e) => format!("error: {e}"),
        };
        *statuses.entry(key).or_default() += 1;
    }
    sampling.store(false, Ordering::Relaxed);
    sampler.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after2 = rss_mib(fg.pid);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after10 = rss_mib(fg.pid);
    println!(
        "memory: 256 parallel 1 MiB PUTs ({statuses:?}): RSS before {before:.1} MiB, peak {:.1} MiB, 2 s after {after2:.1} MiB, 10 s after {after10:.1} MiB",
        peak.load(Ordering::Relaxed) as f64 / 1024.0
    );
    zero_window(&fg).await?;
    stop_fencegate(fg).await
}

async fn stop_fencegate(mut fg: Fencegate) -> Result<()> {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(fg.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tokio::time::timeout(Duration::from_secs(15), fg.child.wait()).await;
    Ok(())
}

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Step 5 (module docs): 10 h2c connections with a zero window, 100 GETs of the 1 MiB value
/// each; with `ABUSE_ZERO_WINDOW_KEYS=N`, of N different 1 MiB values in turn (written first).
async fn zero_window(fg: &Fencegate) -> Result<()> {
    const CONNECTIONS: usize = 10;
    const STREAMS: u32 = 100;
    let (addr, pid) = (fg.addr, fg.pid);
    let keys = env_num("ABUSE_ZERO_WINDOW_KEYS", 1).max(1);
    if keys > 1 {
        let big = format!("\"{}\"", "y".repeat(1024 * 1024 - 16));
        let mut s = BufReader::new(TcpStream::connect(addr).await?);
        for k in 0..keys {
            let status = request(&mut s, &put_key(&format!("big{k:04}"), 1, &big)).await?;
            if status >= 300 {
                bail!("could not write big{k:04}: {status}");
            }
        }
    }
    let before = rss_mib(pid);
    let answered = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..CONNECTIONS {
        let (answered, refused, closed) = (answered.clone(), refused.clone(), closed.clone());
        readers.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await?;
            let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            // SETTINGS_INITIAL_WINDOW_SIZE (4) = 0
            out.extend(h2_frame(4, 0, 0, &[0, 4, 0, 0, 0, 0]));
            for i in 0..STREAMS {
                // HPACK: GET, http, :path /v1/kv/big (or big0000...), :authority 127.0.0.1
                let path = if keys > 1 {
                    format!("/v1/kv/big{:04}", u64::from(i) % keys)
                } else {
                    "/v1/kv/big".to_owned()
                };
                let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
                block.extend_from_slice(path.as_bytes());
                block.extend_from_slice(&[0x01, 9]);
                block.extend_from_slice(b"127.0.0.1");
                out.extend(h2_frame(1, 1 | 4, 2 * i + 1, &block));
            }
            stream.write_all(&out).await?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 65536];
            loop {
                match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                    Err(_) => break,
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        closed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                }
                while buf.len() >= 9 {
                    let len = (usize::from(buf[0]) << 16)
                        | (usize::from(buf[1]) << 8)
                        | usize::from(buf[2]);
                    if buf.len() < 9 + len {
                        break;
                    }
                    match buf[3] {
                        1 => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        3 if buf[9..13] == 7u32.to_be_bytes() => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    buf.drain(..9 + len);
                }
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    let mut peak = before;
    while started.elapsed() < Duration::from_secs(15) {
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in readers {
        r.await??;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_mib(pid);
    println!(
        "zero window: {CONNECTIONS} h2c connections x {STREAMS} GETs of 1 MiB ({keys} different values), window 0: {} answered, {} refused (REFUSED_STREAM), \
         {} of {CONNECTIONS} connections closed by fencegate within 15 s; RSS before {before:.1} MiB, peak {peak:.1} MiB \
         (+{:.1}), 2 s after the 15 s {after:.1} MiB",
        answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        closed.load(Ordering::Relaxed),
        peak - before,
    );
    Ok(())
}

fn put_key(key: &str, token: u64, body: &str) -> Vec<u8> {
    format!(
        "PUT /v1/kv/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Fencing-Token: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
