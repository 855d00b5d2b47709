//! Figures out of raw samples (percentiles, rates), the per-step lines printed while the bench
//! runs, and the markdown table printed at the end (bench/README.md explains every column).

use std::fmt::Write as _;

use crate::{
    load_generator::{FgRun, Stats},
    machine::{loadavg, Machine},
    pgbench::PgRun,
    server::stderr_log,
    settings::Settings,
    steps::Soak,
    KEYS, VALUE,
};

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

pub struct Lat {
    pub p50: f64,
    pub p99: f64,
}

fn lat(mut v: Vec<u32>) -> Lat {
    v.sort_unstable();
    Lat {
        p50: percentile(&v, 50.0),
        p99: percentile(&v, 99.0),
    }
}

pub struct Row {
    pub workload: String,
    pub conns: usize,
    pub unit: &'static str,
    pub fg_rate: f64,
    pub fg: Lat,
    pub fg_errors: String,
    pub pg: Option<(f64, Lat, String)>,
    /// One connection only: pgbench through a byte-copying relay (`relay`); `Some(None)`: not
    /// measured (no haproxy, or it could not start).
    pub relay: Option<Option<RelayFloor>>,
    pub cpu: Cpu,
}

/// The floor of one more hop at one connection: pgbench through a byte-copying relay.
#[derive(Clone, Copy)]
pub struct RelayFloor {
    /// Its writes/s ÷ pgbench's straight to PostgreSQL.
    pub share: f64,
    /// The relay's own CPU per request, in µs, and the kernel's part of it: what one more hop
    /// costs a process that does nothing but copy the bytes.
    pub cpu_us: f64,
    pub kernel_us: f64,
}

/// fencegate's CPU in a step, in µs, and PostgreSQL's per write through it.
pub struct Cpu {
    /// Per ok request (2xx).
    pub fg_per_request: f64,
    /// Per write the database applied.
    pub fg_per_write: f64,
    /// PostgreSQL's CPU per applied write through fencegate; `None`: not a local server.
    pub pg_through: Option<f64>,
}

/// The h2c step's figures the targets are read against.
pub struct H2cFigures {
    /// fencegate's writes/s ÷ pgbench's at 64 clients.
    pub ratio: f64,
    pub fg_per_write: f64,
    pub pg_through: Option<f64>,
}

fn fmt_rate(r: f64) -> String {
    format!("{r:.0}")
}

pub fn fmt_ms(ms: f64) -> String {
    if ms.is_nan() {
        "–".into()
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.1}")
    }
}

pub fn errors_cell(s: &Stats) -> String {
    let mut cell = format!("{} / {} / {}", s.stale, s.other_total(), s.transport);
    if !s.other.is_empty() {
        let detail: Vec<String> = s.other.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        let _ = write!(cell, " ({})", detail.join(", "));
    }
    cell
}

pub fn report_fg(name: &str, conns: usize, r: &FgRun) -> (f64, Lat) {
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
    let (cpu, kernel) = r.cpu_ticks.per(ok);
    println!("             fencegate CPU {cpu:.1} µs per ok request (kernel {kernel:.1})");
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
pub fn report_pg(name: &str, conns: usize, r: &PgRun, writes_only: bool) -> (f64, Lat, String) {
    let l = lat(r.lat.clone());
    let (rate, stale) = if writes_only {
        let applied = (r.db_applied.max(0) as u64).min(r.processed);
        (
            r.tps * applied as f64 / r.processed.max(1) as f64,
            r.processed - applied,
        )
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
    let cell = if writes_only {
        format!("{stale} / {}", r.failed)
    } else {
        format!("– / {}", r.failed)
    };
    (rate, l, cell)
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The markdown table of the whole run, with the facts needed to read it. `hwm_end`: fencegate's
/// peak RSS (VmHWM, KiB) at the end of the run. `more`: the tables of other steps (keyspace),
/// printed under the main one.
pub fn table(
    s: &Settings,
    m: &Machine,
    rows: &[Row],
    h2c: Option<&H2cFigures>,
    more: &str,
    soak: Option<&Soak>,
    hwm_end: u64,
) -> String {
    let stderr_log = stderr_log(&s.out_dir, 0);
    let log_lines = std::fs::read_to_string(&stderr_log)
        .map(|t| t.lines().count())
        .unwrap_or(0);

    let mut t = String::new();
    let _ = writeln!(
        t,
        "### Load bench: {} on {}, commit {}",
        m.date, m.host, m.commit
    );
    let _ = writeln!(t);
    let _ =
        writeln!(
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
        "fencegate: release build, default config (database pool 16 connections){}, FENCEGATE_LOG=warn, \
         {} process(es) on the one database. \
         {} s per step ({:.1} s warm-up before fencegate steps), {KEYS} keys, body `{VALUE}`. \
         Load generator, fencegate, pgbench and PostgreSQL share the machine.",
        match crate::server::bench_trust() {
            Some(true) => format!(
                "; BENCH_TRUST=on: API key, Ed25519 issuer proofs, sticky scope, jump cap {}",
                crate::server::TRUST_JUMP_CAP
            ),
            Some(false) => "; BENCH_TRUST=off: no auth, no issuer, sticky scope off, no jump cap".to_owned(),
            None => String::new(),
        },
        s.processes,
        s.step.as_secs(),
        s.warmup.as_secs_f64()
    );
    let _ = writeln!(t);
    if rows.is_empty() {
        t.push_str(more);
        return finish(t, s, soak, hwm_end, &stderr_log, log_lines);
    }
    let _ = writeln!(t, "| workload | conns | fencegate ok/s | p50 ms | p99 ms | 412 / other / transport | pgbench ok/s | p50 ms | p99 ms | stale / failed | ok/s fg÷pg | p99 fg÷pg |");
    let _ = writeln!(t, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        let (pg_rate, pg_p50, pg_p99, pg_err, ratio_rate, ratio_p99) = match &r.pg {
            Some((rate, l, err)) => (
                fmt_rate(*rate),
                fmt_ms(l.p50),
                fmt_ms(l.p99),
                err.clone(),
                format!("**{:.2}×**", r.fg_rate / rate),
                format!("{:.2}×", r.fg.p99 / l.p99),
            ),
            None => (
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
                "–".into(),
            ),
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
    for r in rows {
        match (r.relay, &r.pg) {
            (Some(Some(floor)), Some((pg, ..))) => {
                let _ = writeln!(
                    t,
                    "At {} connection, pgbench through a relay that only copies bytes (haproxy, `mode tcp`) kept {:.2}× \
                     of its direct writes/s: the floor of any proxy's hop, against fencegate's {:.2}×. The relay spent \
                     {:.1} µs of CPU per request ({:.1} in the kernel), fencegate {:.1}.  ",
                    r.conns,
                    floor.share,
                    r.fg_rate / pg,
                    floor.cpu_us,
                    floor.kernel_us,
                    r.cpu.fg_per_request
                );
            }
            (Some(None), _) => {
                let _ = writeln!(t, "The relay floor at {} connection was not measured (see the run's output for why).  ", r.conns);
            }
            _ => {}
        }
    }
    targets(&mut t, rows, h2c);
    if !more.is_empty() {
        t.push_str(more);
        let _ = writeln!(t);
    }
    finish(t, s, soak, hwm_end, &stderr_log, log_lines)
}

/// The performance targets (bench/README.md, *Targets*), each with its figures from this run
/// and whether it was met; a target whose steps did not run is left out.
fn targets(t: &mut String, rows: &[Row], h2c: Option<&H2cFigures>) {
    let random = |conns| {
        rows.iter()
            .find(|r| r.conns == conns && r.workload == "random key")
    };
    let met = |ok: bool| if ok { "met" } else { "**missed**" };
    let mut lines = Vec::new();
    if let (Some(lone), Some(busy)) = (random(1), random(64)) {
        let bound = 40.0 + busy.cpu.fg_per_write;
        // What a process that only copies the bytes spends on the same hop, for scale.
        let relay = match lone.relay {
            Some(Some(floor)) => format!(
                " (a byte-copying relay's own, per lone request: {:.1} µs, {:.1} of it kernel; \
                 fencegate's beyond it: {:.1} µs)",
                floor.cpu_us,
                floor.kernel_us,
                lone.cpu.fg_per_request - floor.cpu_us
            ),
            _ => String::new(),
        };
        lines.push(format!(
            "a lone request's CPU {:.1} µs ≤ 40 µs + a write's at 64 connections ({:.1}) = {bound:.1} µs: {}{relay}",
            lone.cpu.fg_per_request,
            busy.cpu.fg_per_write,
            met(lone.cpu.fg_per_request <= bound)
        ));
    }
    if let Some(busy) = random(64) {
        if let Some(pg) = busy.cpu.pg_through {
            lines.push(format!(
                "fencegate's CPU per write ≤ PostgreSQL's through it, 64 connections, HTTP/1.1: {:.1} against {pg:.1} µs ({:.2}×): {}",
                busy.cpu.fg_per_write,
                busy.cpu.fg_per_write / pg,
                met(busy.cpu.fg_per_write <= pg)
            ));
        }
    }
    if let Some(h) = h2c {
        if let Some(pg) = h.pg_through {
            lines.push(format!(
                "the same over h2c (reported): {:.1} against {pg:.1} µs ({:.2}×)",
                h.fg_per_write,
                h.fg_per_write / pg
            ));
        }
        lines.push(format!(
            "h2c ≥ 3× pgbench's 64 clients: {:.2}×: {}",
            h.ratio,
            met(h.ratio >= 3.0)
        ));
    }
    if let Some(lone) = random(1) {
        if let (Some(Some(floor)), Some((pg, ..))) = (lone.relay, &lone.pg) {
            let fg = lone.fg_rate / pg;
            lines.push(format!(
                "one connection within 0.05 of the relay floor: fencegate {fg:.2}×, relay {:.2}× (gap {:.2}): {}",
                floor.share,
                floor.share - fg,
                met(floor.share - fg <= 0.05)
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(t);
    let _ = writeln!(t, "Targets:");
    let _ = writeln!(t);
    for line in lines {
        let _ = writeln!(t, "- {line}");
    }
    let _ = writeln!(t);
}

/// The lines under the table: fencegate's memory and its log.
fn finish(
    mut t: String,
    s: &Settings,
    soak: Option<&Soak>,
    hwm_end: u64,
    stderr_log: &std::path::Path,
    log_lines: usize,
) -> String {
    match soak {
        Some(soak) => {
            let scraped = match soak.scrapes {
                Some(n) => format!(
                    "GET /metrics every {} s ({n} scrapes)",
                    s.scrape_every.map_or(0, |d| d.as_secs())
                ),
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
            let _ = writeln!(
                t,
                "fencegate memory: peak RSS (VmHWM) after the run {} (no soak: BENCH_ONLY).  ",
                mib(hwm_end)
            );
        }
    }
    let _ = writeln!(
        t,
        "fencegate wrote {log_lines} log lines at level warn ({}).",
        stderr_log.display()
    );
    t
}
