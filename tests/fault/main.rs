//! Fault injection, Jepsen-style (issue #6): real processes, real pauses, real crashes, and a
//! checker over the recorded history that proves nothing acknowledged is lost.
//!
//! The run: a throwaway PostgreSQL cluster of its own (it gets crashed), two or more real
//! `fencegate serve` processes on it (n0 through a TCP proxy the nemesis can cut or stall, n1
//! directly), and four or more worker processes (this binary, re-executed) incrementing one
//! counter under the built-in lock with short leases, each writing its history as JSON lines
//! (examples/fault_worker.rs, which `cargo test` builds).
//! Meanwhile the nemesis freezes workers past their lease (zombies), SIGKILLs and restarts
//! fencegate processes, crash-restarts PostgreSQL, and cuts or stalls n0's database link. Then
//! the faults are healed, the workers stop, the final state is read, and `checker` judges it all.
//!
//! Settings (environment):
//! - `FAULT_SECONDS` (default 75): length of the fault phase;
//! - `FAULT_QUIET_SECONDS` (3): fault-free run after healing (progress must resume);
//! - `FAULT_WORKERS` (4), `FAULT_NODES` (2), `FAULT_LEASE_MS` (400);
//! - `FAULT_SEED`: the nemesis's and workers' randomness (printed; set it to replay a schedule);
//! - `FAULT_CLIENT_TIMEOUT_MS` (5000): every client request's timeout (longer = a hang);
//! - `FAULT_REQUEST_TIMEOUT_MS` (3000): fencegate's `server.request_timeout_ms`, kept below the
//!   client's so a request stuck on an unreachable database is answered 503, not left hanging;
//! - `FAULT_RECOVERY_MS` (5000): `/readyz` must be 200 this soon after the database is back;
//! - `FAULT_KINDS` (all): comma list of pause, kill, crash, cut, stall;
//! - `FAULT_CONTROL_SECONDS` (10, 0 = off): the negative control (below);
//! - `FAULT_KEEP=1`: keep the scratch directory (histories, logs, cluster) for a post-mortem;
//! - `FAULT_PG_BINDIR`: where initdb/pg_ctl/postgres are, if not found automatically.
//!
//! The negative control: after the main run, the same processes run a second counter whose
//! writes bypass fencing (each write names a fresh scope, so no fence refuses it) while the
//! nemesis freezes lock holders. The checker MUST then report accepted zombie writes and lost
//! updates; if it does not, the checker is blind and the test fails.
//!
//! The failover scenario (tests/fault/failover.rs) and the Patroni scenario
//! (tests/fault/patroni.rs) run as tests of their own, one after the other, never beside this
//! one (`SERIAL`).
//!
//! Run: `cargo build --example fault_worker && cargo test --test fault -- --nocapture`.

mod checker;
mod cluster;
mod daemon;
mod failover;
mod haproxy;
mod history;
mod nemesis;
mod node;
mod patroni;
mod patroni_cluster;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/postgres.rs"]
mod support_pg;
// The harness uses its configuring half; the running half is examples/fault_worker.rs's.
#[allow(dead_code)]
mod worker;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::{Connection, PgConnection, Row};

use crate::cluster::{free_port, Cluster};
use crate::history::now_us;
use crate::nemesis::{stamp, Nemesis, NemesisLog, WorkerRef};
use crate::node::{die_with_parent, Node};
use crate::proxy::Proxy;

/// The worker program (examples/fault_worker.rs), next to this test binary: `cargo test`
/// builds it. Missing or older than its sources: say how to build it (nothing here may run
/// cargo: the running `cargo test` holds the build directory's lock).
fn worker_program() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of this test binary");
    // target/<profile>/deps/fault-<hash> -> target/<profile>/examples/fault_worker
    let program = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("examples").join("fault_worker"))
        .expect("this test binary lives in target/<profile>/deps");
    let build =
        "build it with `cargo build --example fault_worker` (a plain `cargo test` builds it; \
                 `cargo test --test fault` alone does not)";
    let built = std::fs::metadata(&program)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "the fault worker program {} is missing: {build}",
                program.display()
            )
        });
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for source in [
        "examples/fault_worker.rs",
        "tests/fault/worker.rs",
        "tests/fault/history.rs",
    ] {
        let changed = std::fs::metadata(root.join(source)).and_then(|m| m.modified());
        if changed.is_ok_and(|changed| changed > built) {
            panic!(
                "the fault worker program {} is older than {source}: {build}",
                program.display()
            );
        }
    }
    program
}

/// The scenarios of this binary run one at a time: each starts its own clusters and processes,
/// and their timing checks (no hang, time to ready) must not measure each other's load.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Config {
    fault_secs: u64,
    quiet_secs: u64,
    workers: usize,
    nodes: usize,
    lease_ms: u64,
    seed: u64,
    client_timeout_ms: u64,
    request_timeout_ms: u64,
    recovery_ms: u64,
    control_secs: u64,
    kinds: Vec<nemesis::FaultKind>,
    keep: bool,
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
        _ => default,
    }
}

impl Config {
    fn from_env() -> Config {
        let cfg = Config {
            fault_secs: env_u64("FAULT_SECONDS", 75),
            quiet_secs: env_u64("FAULT_QUIET_SECONDS", 3),
            workers: env_u64("FAULT_WORKERS", 4) as usize,
            nodes: env_u64("FAULT_NODES", 2) as usize,
            lease_ms: env_u64("FAULT_LEASE_MS", 400),
            seed: env_u64("FAULT_SEED", rand::random::<u32>() as u64),
            client_timeout_ms: env_u64("FAULT_CLIENT_TIMEOUT_MS", 5000),
            request_timeout_ms: env_u64("FAULT_REQUEST_TIMEOUT_MS", 3000),
            recovery_ms: env_u64("FAULT_RECOVERY_MS", 5000),
            control_secs: env_u64("FAULT_CONTROL_SECONDS", 10),
            kinds: match std::env::var("FAULT_KINDS") {
                Ok(list) if !list.trim().is_empty() => list
                    .split(',')
                    .map(|k| {
                        nemesis::FaultKind::parse(k).unwrap_or_else(|| {
                            panic!(
                                "FAULT_KINDS: unknown kind {k:?} (pause, kill, crash, cut, stall)"
                            )
                        })
                    })
                    .collect(),
                _ => nemesis::FaultKind::ALL.to_vec(),
            },
            keep: std::env::var("FAULT_KEEP").is_ok_and(|v| !v.is_empty() && v != "0"),
        };
        assert!(
            cfg.workers >= 1 && cfg.nodes >= 1 && cfg.lease_ms >= 50,
            "FAULT_WORKERS, FAULT_NODES >= 1; FAULT_LEASE_MS >= 50"
        );
        cfg
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

struct WorkerProc {
    name: String,
    child: tokio::process::Child,
    history: PathBuf,
    output: PathBuf,
}

/// What the nemesis needs to know of each worker: its name, pid and history file.
fn worker_refs(workers: &[WorkerProc]) -> Vec<WorkerRef> {
    workers
        .iter()
        .map(|w| WorkerRef {
            name: w.name.clone(),
            pid: w.child.id().expect("worker pid"),
            history: w.history.clone(),
        })
        .collect()
}

/// What a group of workers works on.
struct Job<'a> {
    /// Worker names are `{prefix}{i}`.
    prefix: &'a str,
    key: &'a str,
    lock: &'a str,
    unfenced: bool,
    stop_file: PathBuf,
    hard_deadline_us: u64,
}

fn spawn_worker(i: usize, cfg: &Config, root: &Path, nodes: &[String], job: &Job) -> WorkerProc {
    let name = format!("{}{i}", job.prefix);
    let history = root.join(format!("{name}.history.jsonl"));
    let output = root.join(format!("{name}.out"));
    let wcfg = worker::WorkerConfig {
        id: name.clone(),
        key: job.key.to_string(),
        lock: job.lock.to_string(),
        unfenced: job.unfenced,
        nodes: nodes.to_vec(),
        history: history.clone(),
        lease_ms: cfg.lease_ms,
        deadline_us: job.hard_deadline_us,
        seed: cfg
            .seed
            .wrapping_mul(1000)
            .wrapping_add(i as u64 + if job.unfenced { 100 } else { 0 }),
        client_timeout_ms: cfg.client_timeout_ms,
        parent_pid: std::process::id(),
        stop_file: job.stop_file.clone(),
    };
    let out = std::fs::File::create(&output).expect("create the worker output file");
    let err = out.try_clone().expect("clone a file handle");
    let mut cmd = tokio::process::Command::new(worker_program());
    cmd.envs(wcfg.to_env())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true);
    die_with_parent(&mut cmd);
    let child = cmd
        .spawn()
        .expect("cannot start a worker process (examples/fault_worker)");
    WorkerProc {
        name,
        child,
        history,
        output,
    }
}

/// The counter as every fencegate serves it and as the tables hold it.
async fn read_final_state(
    nodes: &[Node],
    db_url: &str,
    key: &str,
    lock: &str,
) -> Result<checker::FinalState, String> {
    let client = nemesis::probe_client();
    let mut fs = checker::FinalState::default();
    for node in nodes {
        let got = client.get(format!("{}/v1/kv/{key}", node.url)).send().await;
        let entry = match got {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
                let token = body["fence_token"].as_str().and_then(|t| t.parse().ok());
                checker::NodeRead {
                    node: node.name.clone(),
                    status: Some(status),
                    value: body["value"].as_i64(),
                    token,
                }
            }
            Err(e) => {
                println!("final read on {} failed: {e}", node.name);
                checker::NodeRead {
                    node: node.name.clone(),
                    status: None,
                    value: None,
                    token: None,
                }
            }
        };
        fs.http.push(entry);
    }
    let mut conn = PgConnection::connect(db_url)
        .await
        .map_err(|e| format!("connect to {db_url}: {e}"))?;
    let row = sqlx::query(
        "SELECT value, fence_token, deleted FROM fencegate.fencegate_kv WHERE key = $1",
    )
    .bind(key)
    .fetch_optional(&mut conn)
    .await
    .map_err(|e| format!("read fencegate_kv: {e}"))?;
    if let Some(row) = row {
        let value: Option<sqlx::types::Json<serde_json::Value>> =
            row.try_get(0).map_err(|e| e.to_string())?;
        let token: i64 = row.try_get(1).map_err(|e| e.to_string())?;
        let deleted: bool = row.try_get(2).map_err(|e| e.to_string())?;
        fs.sql = Some((value.and_then(|v| v.0.as_i64()), token as u64, deleted));
    }
    let fence: Option<i64> =
        sqlx::query_scalar("SELECT fence_token FROM fencegate.fencegate_fences WHERE scope = $1")
            .bind(lock)
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| format!("read fencegate_fences: {e}"))?;
    fs.scope_fence = fence.map(|f| f as u64);
    let lock: Option<i64> =
        sqlx::query_scalar("SELECT token FROM fencegate.fencegate_locks WHERE name = $1")
            .bind(lock)
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| format!("read fencegate_locks: {e}"))?;
    fs.lock_token = lock.map(|t| t as u64);
    let _ = conn.close().await;
    Ok(fs)
}

/// A violation found outside the history: (rule, message).
type Problem = (&'static str, String);

/// Signals the workers to stop after their current cycle and reaps them; problems are returned.
async fn stop_workers(workers: &mut [WorkerProc], stop_file: &Path) -> Vec<Problem> {
    std::fs::write(stop_file, b"stop").expect("write the stop file");
    let mut problems = Vec::new();
    for w in workers {
        match tokio::time::timeout(Duration::from_secs(30), w.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(status) => problems.push((
                "4-process",
                format!(
                    "worker {} exited with {status:?}; output:\n{}",
                    w.name,
                    tail(&w.output, 20)
                ),
            )),
            Err(_) => {
                if let Some(pid) = w.child.id() {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                }
                let _ = w.child.start_kill();
                problems.push((
                    "4-process",
                    format!(
                        "worker {} did not stop within 30 s of the stop signal (a hang)",
                        w.name
                    ),
                ));
            }
        }
    }
    problems
}

fn read_histories(workers: &[WorkerProc], problems: &mut Vec<Problem>) -> Vec<history::Event> {
    let mut events = Vec::new();
    for w in workers {
        match history::read_history(&w.history) {
            Ok(mut evs) => events.append(&mut evs),
            Err(e) => problems.push(("history", format!("history of {}: {e}", w.name))),
        }
    }
    events
}

/// The negative control (see the module doc): unfenced writers, frozen lock holders. Returns the
/// checker's report, which must contain violations.
async fn control_run(
    cfg: &Config,
    root: &Path,
    nodes: &[Node],
    db_url: &str,
    t0: u64,
) -> checker::Report {
    let say = |msg: &str| println!("[{}] control: {msg}", stamp(t0, now_us()));
    let start_us = now_us();
    let end_us = start_us + cfg.control_secs * 1_000_000;
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let job = Job {
        prefix: "c",
        key: "control",
        lock: "control",
        unfenced: true,
        stop_file: root.join("control.stop"),
        hard_deadline_us: end_us + 120 * 1_000_000,
    };
    let mut workers: Vec<WorkerProc> = (1..=cfg.workers)
        .map(|i| spawn_worker(i, cfg, root, &urls, &job))
        .collect();
    say(&format!(
        "{} workers write counter `control` WITHOUT fencing (a fresh scope per write) for {} s while lock holders are frozen",
        workers.len(),
        cfg.control_secs
    ));
    let refs = worker_refs(&workers);
    let log = Mutex::new(NemesisLog::default());
    let settings = nemesis::Settings {
        kinds: Vec::new(),
        pauses: true,
        db_url: db_url.to_string(),
        lease_ms: cfg.lease_ms,
        fault_end_us: end_us,
        t0_us: t0,
        recovery_limit: Duration::from_millis(cfg.recovery_ms),
    };
    nemesis::pause_loop(
        &refs,
        &settings,
        &log,
        rand::SeedableRng::seed_from_u64(cfg.seed ^ 0xc0),
    )
    .await;
    let mut problems = stop_workers(&mut workers, &job.stop_file).await;
    let final_state = read_final_state(nodes, db_url, job.key, job.lock)
        .await
        .unwrap_or_else(|e| {
            problems.push(("2-final", format!("cannot read the final state: {e}")));
            checker::FinalState::default()
        });
    let events = read_histories(&workers, &mut problems);
    let log = log.into_inner().unwrap();
    checker::check(&checker::Input {
        events: &events,
        nemesis: &log,
        final_state: &final_state,
        external: &problems,
        healed_us: start_us,
        recovery_limit_ms: cfg.recovery_ms as f64,
        t0_us: t0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_lost_under_faults() {
    let _serial = SERIAL.lock().await;
    let cfg = Config::from_env();
    let began = Instant::now();
    let t0 = now_us();
    let say = |msg: &str| println!("[{}] {msg}", stamp(t0, now_us()));
    println!(
        "== fencegate fault injection: {} s of faults ({}), {} workers, {} fencegate processes, lease {} ms, seed {} (replay: FAULT_SEED={}) ==",
        cfg.fault_secs,
        cfg.kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(", "),
        cfg.workers,
        cfg.nodes,
        cfg.lease_ms,
        cfg.seed,
        cfg.seed
    );

    // The scratch directory: cluster, config, logs, histories. The cluster's watchdog removes it
    // once this process is gone (unless FAULT_KEEP).
    let root = tempfile::Builder::new()
        .prefix("fencegate-fault-")
        .tempdir()
        .expect("create a scratch directory")
        .keep();
    say(&format!(
        "scratch directory {}{}",
        root.display(),
        if cfg.keep { " (kept: FAULT_KEEP)" } else { "" }
    ));
    let cluster = Cluster::create(&root, cfg.keep).await;
    say(&format!(
        "PostgreSQL up on 127.0.0.1:{} (own throwaway cluster)",
        cluster.port
    ));
    let proxy = Proxy::start(([127, 0, 0, 1], cluster.port).into()).await;

    let config = root.join("fencegate.toml");
    std::fs::write(
        &config,
        format!(
            "# written by tests/fault: answer 503 before the client gives up\n\
             [server]\nrequest_timeout_ms = {}\nshutdown_grace_ms = 1000\n",
            cfg.request_timeout_ms
        ),
    )
    .expect("write the fencegate config");
    let mut nodes: Vec<Node> = (0..cfg.nodes)
        .map(|i| {
            // Even nodes reach PostgreSQL through the proxy (cut/stall), odd nodes directly.
            let proxied = i % 2 == 0;
            let port = if proxied { proxy.port } else { cluster.port };
            let db = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            Node::new(
                i,
                free_port(),
                proxied,
                db,
                config.clone(),
                root.join(format!("n{i}.log")),
            )
        })
        .collect();
    for node in &mut nodes {
        node.start().await.unwrap_or_else(|e| panic!("{e}"));
        say(&format!(
            "{} listening on {} (database {})",
            node.name,
            node.url,
            if node.proxied {
                "through the proxy"
            } else {
                "direct"
            }
        ));
    }

    // Workers.
    let node_urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let fault_start_us = now_us();
    let fault_end_us = fault_start_us + cfg.fault_secs * 1_000_000;
    let job = Job {
        prefix: "w",
        key: worker::KEY,
        lock: worker::LOCK,
        unfenced: false,
        stop_file: root.join("workers.stop"),
        hard_deadline_us: fault_end_us + (cfg.quiet_secs + 120) * 1_000_000,
    };
    let mut workers: Vec<WorkerProc> = (1..=cfg.workers)
        .map(|i| spawn_worker(i, &cfg, &root, &node_urls, &job))
        .collect();
    let worker_refs = worker_refs(&workers);
    say(&format!(
        "{} workers started; fault phase until {}",
        workers.len(),
        stamp(t0, fault_end_us)
    ));

    // Fault phase.
    let log = Arc::new(Mutex::new(NemesisLog::default()));
    let mut nemesis = Nemesis {
        nodes: &mut nodes,
        cluster: &cluster,
        proxy: &proxy,
        workers: &worker_refs,
        settings: nemesis::Settings {
            kinds: cfg
                .kinds
                .iter()
                .copied()
                .filter(|k| *k != nemesis::FaultKind::Pause)
                .collect(),
            pauses: cfg.kinds.contains(&nemesis::FaultKind::Pause),
            db_url: cluster.url(),
            lease_ms: cfg.lease_ms,
            fault_end_us,
            t0_us: t0,
            recovery_limit: Duration::from_millis(cfg.recovery_ms),
        },
        log: log.clone(),
    };
    nemesis.run(cfg.seed).await;
    nemesis.heal_all().await;
    let healed_us = now_us();
    say(&format!(
        "faults over and healed; {} s of quiet running",
        cfg.quiet_secs
    ));
    tokio::time::sleep(Duration::from_secs(cfg.quiet_secs)).await;

    // Stop the workers: they finish their current cycle.
    let mut external = stop_workers(&mut workers, &job.stop_file).await;
    say("workers stopped");

    for node in &mut nodes {
        if let Err(e) = node.check_alive() {
            external.push(("4-process", e));
        }
    }
    let final_state = match read_final_state(&nodes, &cluster.url(), job.key, job.lock).await {
        Ok(fs) => fs,
        Err(e) => {
            external.push(("2-final", format!("cannot read the final state: {e}")));
            checker::FinalState::default()
        }
    };
    for line in cluster.panics_in_log() {
        external.push(("2-final", format!("PostgreSQL log: {line}")));
    }
    let nested = cluster.log_lines("there is already a transaction in progress");
    if !nested.is_empty() {
        external.push(("5-leaked-transaction", format!(
            "PostgreSQL logged {} x `WARNING: there is already a transaction in progress`: \
             fencegate sent BEGIN on a pooled connection that was still inside an earlier transaction \
             (first: {})",
            nested.len(),
            nested[0]
        )));
    }
    match nemesis::leaked_transactions(&cluster.url()).await {
        Ok(leaks) if !leaks.is_empty() => external.push((
            "5-leaked-transaction",
            format!(
                "at the end of the run, {} fencegate database session(s) are still inside an open transaction: {}",
                leaks.len(),
                leaks.join("; ")
            ),
        )),
        Ok(_) => {}
        Err(e) => external.push(("5-leaked-transaction", format!("cannot query pg_stat_activity: {e}"))),
    }
    let events = read_histories(&workers, &mut external);
    let nemesis_log = std::mem::take(&mut *log.lock().unwrap());
    let _ = std::fs::write(
        root.join("nemesis.log"),
        format!(
            "{:#?}\n{:#?}\n{:#?}\n{:#?}\n",
            nemesis_log.faults, nemesis_log.probes, nemesis_log.recoveries, nemesis_log.violations
        ),
    );
    let report = checker::check(&checker::Input {
        events: &events,
        nemesis: &nemesis_log,
        final_state: &final_state,
        external: &external,
        healed_us,
        recovery_limit_ms: cfg.recovery_ms as f64,
        t0_us: t0,
    });

    let control = if cfg.control_secs > 0 {
        // The control's writers step around the fence with a fresh scope per write: exactly
        // the bypass that sticky scopes (the default, which the fenced run above used) now
        // refuse with 409. So the control's nodes run with sticky scopes off, to show what a
        // store without fencing lets through.
        std::fs::write(
            &config,
            format!(
                "{}\n[kv]\nsticky_scope = false\n",
                std::fs::read_to_string(&config).unwrap()
            ),
        )
        .expect("rewrite the fencegate config for the control run");
        for node in &mut nodes {
            node.kill().await;
            node.start()
                .await
                .unwrap_or_else(|e| panic!("restart for the control run: {e}"));
        }
        Some(control_run(&cfg, &root, &nodes, &cluster.url(), t0).await)
    } else {
        None
    };

    let node_errors: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{}: {} starts, {} ERROR log lines",
                n.name,
                n.starts,
                n.error_lines().len()
            )
        })
        .collect();
    for node in &mut nodes {
        node.kill().await;
    }
    cluster.stop().await;
    drop(proxy);

    println!();
    println!(
        "== summary: seed {}, {} s of faults, {} workers, {} fencegate processes ({}), lease {} ms, {} history events, runtime {:.1} s ==",
        cfg.seed,
        cfg.fault_secs,
        cfg.workers,
        cfg.nodes,
        node_errors.join("; "),
        cfg.lease_ms,
        events.len(),
        began.elapsed().as_secs_f64()
    );
    print!("{}", report.summary);
    if !report.violations.is_empty() {
        println!("\nVIOLATIONS:");
        for v in &report.violations {
            println!("  {v}");
        }
        for node in &nodes {
            println!("\n-- {} log (tail) --\n{}", node.name, node.log_tail(12));
        }
        println!(
            "\nhistories and logs: {} ({})",
            root.display(),
            if cfg.keep {
                "kept"
            } else {
                "set FAULT_KEEP=1 to keep them"
            }
        );
    }
    let mut control_blind = None;
    if let Some(control) = &control {
        println!("\n== negative control: the same checker over {} s of UNFENCED writers (violations expected) ==", cfg.control_secs);
        print!("{}", control.summary);
        for v in control.violations.iter().take(4) {
            println!("  e.g. {v}");
        }
        let found = |rule: &str| control.rules.get(rule).copied().unwrap_or(0);
        if found("1-fencing") == 0 || found("3-lost-update") + found("2-lost-write") == 0 {
            control_blind = Some(format!(
                "the negative control ran unfenced writers with frozen lock holders, but the checker found {} accepted zombie writes and {} lost updates/writes: it would not see them in the fenced run either (rules found: {:?})",
                found("1-fencing"),
                found("3-lost-update") + found("2-lost-write"),
                control.rules
            ));
        } else {
            println!(
                "negative control: the checker caught what fencing prevents: {:?}",
                control.rules
            );
        }
    }
    println!("total runtime {:.1} s", began.elapsed().as_secs_f64());
    assert!(
        report.violations.is_empty(),
        "{} violation(s) (seed {}; replay with FAULT_SEED={}):\n{}",
        report.violations.len(),
        cfg.seed,
        cfg.seed,
        report.violations.join("\n")
    );
    if let Some(blind) = control_blind {
        panic!("{blind}");
    }
}

/// A PostgreSQL failover to a synchronous standby loses no acknowledged fence, and the same
/// checker catches an asynchronous one losing them (tests/fault/failover.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_survive_a_failover_to_a_synchronous_standby() {
    let _serial = SERIAL.lock().await;
    let cfg = Config::from_env();
    let t0 = now_us();
    println!(
        "== failover: a synchronous standby, then an asynchronous one (negative control); seed {} (replay: FAULT_SEED={}) ==",
        cfg.seed, cfg.seed
    );
    let synchronous = failover::run(&cfg, true, t0).await;
    synchronous.print();
    let control = failover::run(&cfg, false, t0).await;
    control.print();
    assert!(
        synchronous.report.violations.is_empty(),
        "failover to a synchronous standby: {} violation(s) (seed {}):\n{}",
        synchronous.report.violations.len(),
        cfg.seed,
        synchronous.report.violations.join("\n")
    );
    assert_eq!(
        synchronous.lost, 0,
        "acknowledged increments were lost in a failover to a synchronous standby"
    );
    let found = |rule: &str| control.report.rules.get(rule).copied().unwrap_or(0);
    let lost_rules = found("2-lost-write") + found("3-lost-update") + found("3-reads");
    assert!(
        lost_rules > 0,
        "the negative control failed over to an asynchronous standby that had fallen behind, yet the checker \
         found no lost acknowledged write (rules found: {:?}): it would not see a loss in the synchronous run either",
        control.report.rules
    );
    println!(
        "negative control: the checker caught the asynchronous failover losing acknowledged writes \
         ({} acknowledged increments missing from the counter; rules {:?})",
        control.lost, control.report.rules
    );
}

/// A real Patroni cluster (etcd, `synchronous_mode`) under fenced load with zombies: a
/// switchover and a `kill -9` of the leader lose no acknowledged write, admit no stale one, and
/// writes resume within seconds; through HAProxy and through a host list
/// (tests/fault/patroni.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_survive_patroni_switchover_and_leader_kill() {
    let _serial = SERIAL.lock().await;
    let cfg = Config::from_env();
    let t0 = now_us();
    let routes = patroni::Route::from_env();
    println!(
        "== Patroni: switchover and kill -9 of the leader under fenced load, routes {}; seed {} (replay: FAULT_SEED={}) ==",
        routes.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "),
        cfg.seed,
        cfg.seed
    );
    let mut outcomes = Vec::new();
    for route in routes {
        let outcome = patroni::run(&cfg, route, t0).await;
        outcome.print();
        outcomes.push(outcome);
    }
    for o in &outcomes {
        assert!(
            o.report.violations.is_empty(),
            "Patroni through {}: {} violation(s) (seed {}):\n{}",
            o.route.name(),
            o.report.violations.len(),
            cfg.seed,
            o.report.violations.join("\n")
        );
        assert_eq!(o.resume_ms.len(), 2, "both faults were injected");
        for (kind, ms) in &o.resume_ms {
            assert!(
                ms.is_some_and(|(ms, _)| ms <= patroni::RESUME_LIMIT.as_secs_f64() * 1000.0),
                "Patroni through {}: no write acknowledged within {:?} of the {} (first after {ms:?} ms)",
                o.route.name(),
                patroni::RESUME_LIMIT,
                kind.name()
            );
        }
        assert!(
            o.refused_stale > 0,
            "Patroni through {}: no zombie write was refused: the run froze no lock holder past its lease, so it proves nothing about fencing",
            o.route.name()
        );
    }
}
