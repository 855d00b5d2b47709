//! The measured steps of a run, in order: for each workload, fencegate then pgbench on a freshly
//! reset table, and at the end the soak (fencegate alone, RSS sampled while it runs).

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Result;
use sqlx::PgConnection;

use crate::{
    database::reset_table,
    load_generator::{fencegate_step, scrape_metrics, Workload, TOKENS},
    pgbench::{pgbench_step, Scripts},
    report::{errors_cell, mib, report_fg, report_pg, Cpu, H2cFigures, RelayFloor, Row},
    server::{rss_kib, CpuTicks, Fencegate},
    settings::Settings,
    KEYS,
};

pub struct Soak {
    pub rate: f64,
    pub errors: String,
    pub samples: Vec<u64>,
    pub every: Duration,
    /// GET /metrics done during the soak (None: not asked for, BENCH_SCRAPE_SECONDS unset).
    pub scrapes: Option<u64>,
}

pub async fn measure(
    s: &Settings,
    fg: &Fencegate,
    addrs: &[std::net::SocketAddr],
    db_url: &str,
    db: &mut PgConnection,
    admin: &mut PgConnection,
    scripts: &Scripts,
) -> Result<(Vec<Row>, Option<H2cFigures>, Option<Soak>)> {
    let mut rows = Vec::new();
    let mut h2c = None;
    let steps: [(&str, &str, usize, Workload, &Path); 6] = [
        (
            "random",
            "random key, writes/s",
            1,
            Workload::Random { keys: KEYS },
            &scripts.random,
        ),
        (
            "random",
            "random key, writes/s",
            16,
            Workload::Random { keys: KEYS },
            &scripts.random,
        ),
        (
            "random",
            "random key, writes/s",
            64,
            Workload::Random { keys: KEYS },
            &scripts.random,
        ),
        (
            "hot",
            "one hot key, writes/s",
            64,
            Workload::Hot,
            &scripts.hot,
        ),
        (
            "scope",
            "one hot scope (random keys), writes/s",
            64,
            Workload::Scope { token: 0 },
            &scripts.scope,
        ),
        (
            "mix",
            "90% GET / 10% PUT, ops/s",
            64,
            Workload::Mix { read_pct: 90 },
            &scripts.mix,
        ),
    ];
    println!();
    for (name, title, conns, workload, script) in steps {
        let id = if name == "random" {
            format!("{name}{conns}")
        } else {
            name.to_owned()
        };
        if !s.runs(&id) {
            continue;
        }
        let (workload_name, unit) = title.split_once(", ").expect("title");
        // The hot scope's holder presents one token for the whole step, above every earlier one.
        let workload = match workload {
            Workload::Scope { .. } => Workload::Scope {
                token: TOKENS.next(),
            },
            other => other,
        };
        reset_table(db, admin).await?;
        let r = fencegate_step(addrs, conns, workload, s, s.step, db).await?;
        let (fg_rate, fg_lat) = report_fg(name, conns, &r);
        reset_table(db, admin).await?;
        let defines = match workload {
            Workload::Scope { .. } => vec![format!("t={}", TOKENS.next())],
            _ => Vec::new(),
        };
        let p = pgbench_step(
            s,
            &format!("{name}_c{conns}"),
            conns,
            script,
            &defines,
            db_url,
            s.step,
            db,
        )
        .await?;
        let pg = report_pg(
            name,
            conns,
            &p,
            workload != (Workload::Mix { read_pct: 90 }),
        );
        println!(
            "  ratio      fencegate/pgbench: ok/s {:.2}×, p99 {:.2}×   (fencegate VmRSS {})\n",
            fg_rate / pg.0,
            fg_lat.p99 / pg.1.p99,
            mib(rss_kib(fg.pid).0)
        );
        // The whole system's CPU per applied write: fencegate + PostgreSQL through fencegate,
        // against PostgreSQL alone under pgbench (pgbench's own CPU, the client, not counted,
        // as fencegate's load generator is not). Writes only: the mix's GETs apply nothing.
        // µs per ok request, and the kernel's part of it.
        let per_request = r.cpu_ticks.per(r.stats.put_ok + r.stats.get_ok);
        let cpu = Cpu {
            fg_per_request: per_request.0,
            fg_per_write: r.cpu_ticks.per(r.db_applied.max(0) as u64).0,
            pg_through: r.pg_cpu_us,
        };
        if workload != (Workload::Mix { read_pct: 90 }) {
            system_cpu(r.cpu_ticks, r.db_applied, r.pg_cpu_us, p.pg_cpu_us);
        }
        let relay = match conns {
            1 => Some(relay_floor(s, script, db_url, db, admin, pg.0, fg_rate, per_request).await?),
            _ => None,
        };
        rows.push(Row {
            workload: workload_name.to_owned(),
            conns,
            unit,
            fg_rate,
            fg: fg_lat,
            fg_errors: errors_cell(&r.stats),
            pg: Some(pg),
            relay,
            cpu,
        });
    }

    // HTTP/2: h2load, 4 connections x 16 streams, against pgbench's 64 clients (only when
    // named in BENCH_ONLY: it needs h2load).
    if s.only
        .as_ref()
        .is_some_and(|only| only.iter().any(|o| o == "h2c"))
    {
        reset_table(db, admin).await?;
        let h = crate::h2c::h2c_step(fg.addr, s.step, &s.out_dir, db).await?;
        let (cpu_us, kernel_us) = h.cpu.per(h.ok);
        println!(
            "  fencegate  h2c     {}x{}  {:>8.0} ok/s   non-2xx {}   [db applied {}]\n             fencegate CPU {cpu_us:.1} µs per ok request (kernel {kernel_us:.1})",
            crate::h2c::CONNECTIONS,
            crate::h2c::STREAMS,
            h.rate,
            h.non_2xx,
            h.applied,
        );
        reset_table(db, admin).await?;
        let p = pgbench_step(s, "h2c_c64", 64, &scripts.random, &[], db_url, s.step, db).await?;
        let pg = report_pg("random", 64, &p, true);
        println!(
            "  ratio      fencegate (h2c)/pgbench: ok/s {:.2}×",
            h.rate / pg.0
        );
        system_cpu(h.cpu, h.applied, h.pg_cpu_us, p.pg_cpu_us);
        h2c = Some(H2cFigures {
            ratio: h.rate / pg.0,
            fg_per_write: h.cpu.per(h.applied.max(0) as u64).0,
            pg_through: h.pg_cpu_us,
        });
    }

    // Soak: 64 connections of random-key PUTs, RSS sampled while it runs.
    if !s.runs("soak") {
        return Ok((rows, h2c, None));
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
    let r = fencegate_step(addrs, 64, Workload::Random { keys: KEYS }, s, s.soak, db).await?;
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
        samples
            .iter()
            .map(|k| format!("{:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let soak = Soak {
        rate,
        errors: errors_cell(&r.stats),
        samples,
        every,
        scrapes,
    };
    Ok((rows, h2c, Some(soak)))
}

/// Prints the whole system's CPU per applied write through fencegate (`fg`: fencegate's CPU
/// over the window in which the database applied `applied` writes; `fg_pg`: PostgreSQL's per
/// write then) against PostgreSQL's alone under pgbench (`pg`), and its floor if fencegate's
/// user-space work cost nothing: PostgreSQL's part plus fencegate's kernel time, with
/// fencegate's syscalls as they are. Per applied write on both sides (the "fencegate CPU" line
/// above it is per ok request). `None`: PostgreSQL's CPU is not readable here.
fn system_cpu(fg: CpuTicks, applied: i64, fg_pg: Option<f64>, pg: Option<f64>) {
    let (fg_us, fg_kernel_us) = fg.per(applied.max(0) as u64);
    let (Some(fg_pg), Some(pg)) = (fg_pg, pg) else {
        println!(
            "  system CPU per write: PostgreSQL's CPU is not readable here (not a local server)\n"
        );
        return;
    };
    println!(
        "  system CPU per write: through fencegate {:.1} µs (fencegate {fg_us:.1} + PostgreSQL {fg_pg:.1}), \
         straight to PostgreSQL {pg:.1} µs: {:.2}×",
        fg_us + fg_pg,
        (fg_us + fg_pg) / pg
    );
    println!(
        "                        without fencegate's user-space work (its kernel {fg_kernel_us:.1} + PostgreSQL {fg_pg:.1}): {:.2}×\n",
        (fg_kernel_us + fg_pg) / pg
    );
}

/// The one-connection step's floor: pgbench through a relay that only copies bytes, on a
/// freshly reset table as the other sides (`relay`). Returns its share of direct writes/s and
/// its own CPU per request, or `None` when haproxy is not installed or the relay could not
/// start (said in the output, and in the table's notes).
#[allow(clippy::too_many_arguments)]
async fn relay_floor(
    s: &Settings,
    script: &Path,
    db_url: &str,
    db: &mut PgConnection,
    admin: &mut PgConnection,
    direct: f64,
    fg_rate: f64,
    fg_cpu: (f64, f64),
) -> Result<Option<RelayFloor>> {
    let Some(haproxy) = crate::settings::on_path("haproxy") else {
        println!("  relay      not measured: haproxy is not installed (apt-get install haproxy)\n");
        return Ok(None);
    };
    // A relay that cannot start (a socket-only DATABASE_URL, say) costs this figure, not the run.
    let relay = match crate::relay::start(&haproxy, db_url, &s.out_dir).await {
        Ok(relay) => relay,
        Err(e) => {
            println!("  relay      not measured: {e:#}\n");
            return Ok(None);
        }
    };
    reset_table(db, admin).await?;
    let before = relay.cpu_ticks();
    let p = pgbench_step(s, "relay_c1", 1, script, &[], &relay.url, s.step, db).await;
    let relay_cpu = relay.cpu_ticks() - before;
    drop(relay);
    // pgbench can fail only through the relay (a certificate checked against the relay's
    // address, say): that costs this figure, not the run.
    let p = match p {
        Ok(p) => p,
        Err(e) => {
            println!("  relay      not measured: pgbench through the relay failed: {e:#}\n");
            return Ok(None);
        }
    };
    let rate = report_pg("relay", 1, &p, true).0;
    // Each side's time per write beyond pgbench straight to PostgreSQL.
    let added = |r: f64| (1e6 / r - 1e6 / direct).max(0.0);
    let (cpu_us, kernel_us) = relay_cpu.per(p.processed);
    println!(
        "  floor      pgbench through a byte-copying relay (haproxy): {:.2}× of direct, fencegate {:.2}×; \
         per write the relay's hop adds {:.0} µs, fencegate's {:.0} µs\n\
         \x20 floor      CPU per request: the relay {cpu_us:.1} µs (kernel {kernel_us:.1}), fencegate {:.1} µs (kernel {:.1})\n",
        rate / direct,
        fg_rate / direct,
        added(rate),
        added(fg_rate),
        fg_cpu.0,
        fg_cpu.1,
    );
    Ok(Some(RelayFloor {
        share: rate / direct,
        cpu_us,
        kernel_us,
    }))
}
