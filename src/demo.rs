//! `fencegate demo`: the zombie scenario with real processes and a real pause.
//!
//! Two worker processes (this same binary, `demo-worker`) take the same lock and append their
//! name to a shared list (read-modify-write). Worker A is frozen with SIGSTOP right after it
//! read the list, for longer than its lease; B acquires the lock, reads, appends and writes;
//! then A is resumed with SIGCONT and writes the list it read before the pause.
//! - fenced: A's write carries its old token through fencegate and is refused (412); B's entry
//!   survives.
//! - unfenced: the same workers write with a plain upsert; A's write silently erases B's.
//!
//! The demo exits 0 only if fencing prevented the lost update.

use std::{
    io::IsTerminal,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use crate::store::unfenced::Unfenced;

/// How the demo is run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// An existing fencegate; `None` starts one.
    pub url: Option<String>,
    /// The configured database (`None`: none configured). Started by the demo, fencegate runs
    /// on it in a scratch schema (PostgreSQL), or on a scratch SQLite file when there is none;
    /// the unfenced side writes the same scratch place. With `url` and no database, the
    /// unfenced side is skipped. The scratch place is removed when the demo ends: the demo
    /// leaves nothing in the user's data.
    pub database_url: Option<String>,
    pub lease_ms: u64,
}

/// What a worker does (the hidden `demo-worker` subcommand).
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub url: String,
    pub name: String,
    pub lock: String,
    pub key: String,
    pub lease_ms: u64,
    pub work_ms: u64,
    /// `None`: write through fencegate with the token. `Some(db)`: plain upsert into `db`.
    pub unfenced_db: Option<String>,
    /// PostgreSQL: the demo's scratch schema, where the unfenced table is.
    pub scratch_schema: Option<String>,
}

/// Where the demo writes: a schema of its own in the configured PostgreSQL, or a scratch SQLite
/// file; removed by [`Scratch::remove`].
struct Scratch {
    /// The database fencegate (when the demo starts it) and the unfenced side use.
    url: Option<String>,
    /// PostgreSQL: `fencegate_demo_<run id>`, made here (never from input).
    schema: Option<String>,
    /// SQLite: the scratch directory holding the file.
    dir: Option<std::path::PathBuf>,
}

impl Scratch {
    fn new(configured: Option<&str>, run_id: u128, starts_server: bool) -> anyhow::Result<Scratch> {
        match configured {
            Some(url) if !url.starts_with("sqlite:") => Ok(Scratch {
                url: Some(url.to_owned()),
                schema: Some(format!("fencegate_demo_{run_id}")),
                dir: None,
            }),
            // The user's own SQLite file is never the demo's: a scratch file instead.
            _ if starts_server => {
                let dir = std::env::temp_dir()
                    .join(format!("fencegate-demo-{run_id}-{}", std::process::id()));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                Ok(Scratch {
                    url: Some(format!("sqlite://{}", dir.join("demo.sqlite").display())),
                    schema: None,
                    dir: Some(dir),
                })
            }
            _ => Ok(Scratch {
                url: None,
                schema: None,
                dir: None,
            }),
        }
    }

    async fn remove(&self) {
        if let (Some(url), Some(schema)) = (&self.url, &self.schema) {
            if let Err(err) = crate::store::unfenced::drop_scratch_schema(url, schema).await {
                eprintln!("could not drop the demo's scratch schema {schema}: {err}");
            }
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

const EVENT: &str = "EVENT ";

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

struct Timeline {
    start: Instant,
    style: Style,
}

impl Timeline {
    fn row(&self, actor: &str, action: &str, token: &str, result: &str) {
        let ms = self.start.elapsed().as_millis();
        let actor_col = match actor {
            "A" => self.style.paint("33", &format!("{actor:<5}")),
            "B" => self.style.paint("36", &format!("{actor:<5}")),
            _ => self.style.paint("2", &format!("{actor:<5}")),
        };
        let result = if result.starts_with("412") || result.starts_with("REJECTED") {
            self.style.paint("32", result)
        } else if result.contains("LOST") {
            self.style.paint("31;1", result)
        } else {
            result.to_owned()
        };
        println!("{ms:>7} ms  {actor_col}  {action:<40} {token:>6}  {result}");
    }
}

/// Runs the demo; returns whether fencing prevented the lost update.
pub async fn run(options: DemoOptions) -> anyhow::Result<bool> {
    let style = Style {
        on: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let scratch = Scratch::new(
        options.database_url.as_deref(),
        run_id,
        options.url.is_none(),
    )?;
    let result = run_in(&options, &scratch, run_id, &style).await;
    scratch.remove().await;
    result
}

async fn run_in(
    options: &DemoOptions,
    scratch: &Scratch,
    run_id: u128,
    style: &Style,
) -> anyhow::Result<bool> {
    let mut server = None;
    let url = match &options.url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => {
            let (child, addr) = start_server(scratch).await?;
            server = Some(child);
            format!("http://{addr}")
        }
    };
    println!(
        "{}",
        style.paint("1", "fencegate demo: a zombie writer, fenced and unfenced")
    );
    println!(
        "fencegate: {url}{}",
        if server.is_some() {
            " (started by the demo)"
        } else {
            ""
        }
    );
    println!(
        "lease: {} ms; worker A is frozen with SIGSTOP for {} ms\n",
        options.lease_ms,
        options.lease_ms + 500
    );

    let fenced = scenario(&url, None, run_id, options, style).await;
    let unfenced = match &scratch.url {
        Some(_) => Some(scenario(&url, Some(scratch), run_id, options, style).await),
        None => {
            println!("(unfenced side skipped: it writes straight to the database; pass --database-url)\n");
            None
        }
    };
    if let Some(mut child) = server {
        stop(&mut child).await;
    }
    let fenced = fenced?;
    let fenced_ok = fenced.zombie_rejected && fenced.final_list == json!(["B"]);
    let verdict = match (fenced_ok, unfenced.transpose()?) {
        (true, Some(u)) if u.final_list == json!(["A"]) => style.paint(
            "32;1",
            "verdict: PASS. Fenced, the zombie's write was rejected and B's entry survived; \
             unfenced, the zombie erased B's entry (lost update).",
        ),
        (true, Some(u)) => style.paint(
            "32;1",
            &format!(
                "verdict: PASS. Fenced, the zombie was rejected (unfenced ended with {}).",
                u.final_list
            ),
        ),
        (true, None) => style.paint(
            "32;1",
            "verdict: PASS. Fenced, the zombie's write was rejected.",
        ),
        (false, _) => style.paint(
            "31;1",
            &format!(
                "verdict: FAIL. Fenced run ended with {} (zombie rejected: {}).",
                fenced.final_list, fenced.zombie_rejected
            ),
        ),
    };
    println!("{verdict}");
    Ok(fenced_ok)
}

struct ScenarioResult {
    zombie_rejected: bool,
    final_list: Value,
}

async fn scenario(
    url: &str,
    unfenced: Option<&Scratch>,
    run_id: u128,
    options: &DemoOptions,
    style: &Style,
) -> anyhow::Result<ScenarioResult> {
    let unfenced_db = unfenced.and_then(|s| s.url.clone());
    let scratch_schema = unfenced.and_then(|s| s.schema.clone());
    let label = if unfenced_db.is_some() {
        "unfenced"
    } else {
        "fenced"
    };
    let title = match label {
        "fenced" => "== fenced: writes go through fencegate with the lock's token ==",
        _ => "== unfenced: the same workers, writing with a plain upsert (no token check) ==",
    };
    println!("{}", style.paint("1", title));
    println!(
        "{:>10}  {:<5}  {:<40} {:>6}  result",
        "elapsed", "actor", "action", "token"
    );
    let timeline = Timeline {
        start: Instant::now(),
        style: Style { on: style.on },
    };
    let worker = |name: &str, work_ms: u64| WorkerOptions {
        url: url.to_owned(),
        name: name.to_owned(),
        lock: format!("demo-{label}-{run_id}"),
        key: format!("demo-{label}-{run_id}"),
        lease_ms: options.lease_ms,
        work_ms,
        unfenced_db: unfenced_db.clone(),
        scratch_schema: scratch_schema.clone(),
    };

    // A takes the lock, reads the list, then "works" for a while: we freeze it right there.
    let mut a = spawn_worker(&worker("A", 300))?;
    let mut a_out = BufReader::new(a.stdout.take().context("worker stdout")?).lines();
    relay_until(&mut a_out, &timeline, "read").await?;
    signal(&a, Signal::SIGSTOP)?;
    timeline.row(
        "demo",
        "SIGSTOP A (a GC pause, a VM stall...)",
        "",
        "A is frozen mid-task",
    );
    tokio::time::sleep(Duration::from_millis(options.lease_ms + 500)).await;
    timeline.row("demo", "A's lease has expired", "", "");

    let mut b = spawn_worker(&worker("B", 0))?;
    let mut b_out = BufReader::new(b.stdout.take().context("worker stdout")?).lines();
    relay_until(&mut b_out, &timeline, "exit").await?;
    b.wait().await?;

    signal(&a, Signal::SIGCONT)?;
    timeline.row(
        "demo",
        "SIGCONT A",
        "",
        "A resumes, unaware it lost the lock",
    );
    let zombie_write = relay_until(&mut a_out, &timeline, "write").await?;
    relay_until(&mut a_out, &timeline, "exit").await?;
    a.wait().await?;

    let key = format!("demo-{label}-{run_id}");
    let final_list = match &unfenced_db {
        None => read_fenced(url, &key).await?,
        Some(db) => Unfenced::connect(db, scratch_schema.as_deref())
            .await?
            .read(&key)
            .await?
            .unwrap_or(json!([])),
    };
    let zombie_rejected = zombie_write.get("status").and_then(Value::as_u64) == Some(412);
    let outcome = if final_list == json!(["B"]) {
        "B's entry survived".to_owned()
    } else if final_list == json!(["A"]) {
        "B's entry was LOST: the zombie overwrote it".to_owned()
    } else {
        format!("unexpected: {final_list}")
    };
    timeline.row("demo", &format!("final list: {final_list}"), "", &outcome);
    println!();
    Ok(ScenarioResult {
        zombie_rejected,
        final_list,
    })
}

/// Prints a worker's events until one with `action == until`; returns that event.
async fn relay_until(
    out: &mut Lines<BufReader<ChildStdout>>,
    timeline: &Timeline,
    until: &str,
) -> anyhow::Result<Value> {
    let deadline = Duration::from_secs(30);
    loop {
        let line = tokio::time::timeout(deadline, out.next_line())
            .await
            .context("a worker said nothing for 30 s")??
            .with_context(|| format!("a worker exited before reporting {until:?}"))?;
        let Some(event) = line.strip_prefix(EVENT) else {
            continue;
        };
        let event: Value = serde_json::from_str(event)?;
        let field = |k: &str| {
            event
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        if field("action") != "exit" {
            timeline.row(
                &field("actor"),
                &field("text"),
                &field("token"),
                &field("result"),
            );
        }
        if field("action") == until {
            return Ok(event);
        }
    }
}

fn spawn_worker(w: &WorkerOptions) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find the fencegate executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("demo-worker")
        .args([
            "--url", &w.url, "--name", &w.name, "--lock", &w.lock, "--key", &w.key,
        ])
        .args([
            "--lease-ms",
            &w.lease_ms.to_string(),
            "--work-ms",
            &w.work_ms.to_string(),
        ]);
    if let Some(db) = &w.unfenced_db {
        cmd.args(["--unfenced-db", db]);
    }
    if let Some(schema) = &w.scratch_schema {
        cmd.args(["--scratch-schema", schema]);
    }
    cmd.stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd.spawn().context("cannot start a demo worker")
}

fn signal(child: &Child, sig: Signal) -> anyhow::Result<()> {
    let pid = child.id().context("worker already exited")?;
    nix::sys::signal::kill(Pid::from_raw(pid as i32), sig)
        .with_context(|| format!("cannot send {sig} to worker {pid}"))
}

async fn start_server(scratch: &Scratch) -> anyhow::Result<(Child, String)> {
    let exe = std::env::current_exe().context("cannot find the fencegate executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .env("FENCEGATE_LOG", "warn");
    if let Some(db) = &scratch.url {
        cmd.args(["--database-url", db]);
    }
    if let Some(schema) = &scratch.schema {
        cmd.env("FENCEGATE_DATABASE_SCHEMA", schema);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("fencegate did not start within 30 s")??
        .context("fencegate exited at start-up (its error is above)")?;
    let addr = line
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected output {line:?}"))?
        .to_owned();
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

/// An HTTP client that sends `Authorization: Bearer $FENCEGATE_API_KEY` when that variable is
/// set, so the demo also runs against a fencegate with auth on (`--url`).
fn http_client() -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = std::env::var("FENCEGATE_API_KEY")
        .ok()
        .filter(|k| !k.is_empty())
    {
        let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .context("FENCEGATE_API_KEY must be printable ASCII")?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .build()?)
}

async fn read_fenced(url: &str, key: &str) -> anyhow::Result<Value> {
    let response = http_client()?
        .get(format!("{url}/v1/kv/{key}"))
        .send()
        .await?;
    match response.status().as_u16() {
        404 => Ok(json!([])),
        200 => Ok(response.json::<Value>().await?["value"].clone()),
        other => bail!("GET {key}: unexpected status {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process.

fn emit(actor: &str, action: &str, text: &str, token: &str, result: &str) {
    emit_status(actor, action, text, token, result, None);
}

fn emit_status(
    actor: &str,
    action: &str,
    text: &str,
    token: &str,
    result: &str,
    status: Option<u16>,
) {
    let event = json!({"actor": actor, "action": action, "text": text, "token": token, "result": result, "status": status});
    println!("{EVENT}{event}");
}

/// One worker: take the lock, read the list, work, append our name, write it back.
pub async fn worker(w: WorkerOptions) -> anyhow::Result<()> {
    let http = http_client()?;
    let me = w.name.as_str();
    // Take the lock, waiting while someone else holds it.
    let (token, lease) = loop {
        let response = http
            .post(format!("{}/v1/locks/{}", w.url, w.lock))
            .json(&json!({"owner": me, "ttl_ms": w.lease_ms}))
            .send()
            .await?;
        match response.status().as_u16() {
            201 => {
                let body: Value = response.json().await?;
                let token = body["token"]
                    .as_str()
                    .context("lock response without token")?
                    .to_owned();
                break (token, body["ttl_ms"].clone());
            }
            409 => tokio::time::sleep(Duration::from_millis(50)).await,
            other => bail!(
                "lock request failed with {other}: {}",
                response.text().await?
            ),
        }
    };
    emit(
        me,
        "acquire",
        &format!("acquire lock (lease {lease} ms)"),
        &token,
        "granted",
    );

    let mut unfenced = match &w.unfenced_db {
        Some(db) => Some(Unfenced::connect(db, w.scratch_schema.as_deref()).await?),
        None => None,
    };
    let list = match &mut unfenced {
        Some(db) => db.read(&w.key).await?.unwrap_or(json!([])),
        None => read_fenced(&w.url, &w.key).await?,
    };
    emit(me, "read", "read the list", "", &list.to_string());

    // The work during which a pause hurts: a real process, really stopped, resumes here.
    tokio::time::sleep(Duration::from_millis(w.work_ms)).await;

    let mut new_list = list.as_array().cloned().unwrap_or_default();
    new_list.push(json!(me));
    let new_list = Value::Array(new_list);
    let text = format!("write {new_list}");
    match &mut unfenced {
        Some(db) => {
            db.write(&w.key, &new_list).await?;
            emit_status(
                me,
                "write",
                &text,
                &token,
                "ok (plain upsert: nothing checked)",
                Some(200),
            );
        }
        None => {
            let response = http
                .put(format!("{}/v1/kv/{}", w.url, w.key))
                .header("X-Fencing-Token", &token)
                .header("X-Fencing-Scope", &w.lock)
                .json(&new_list)
                .send()
                .await?;
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let result = match status {
                412 => format!(
                    "412 REJECTED: stale token, fence is {}",
                    body["current_token"].as_str().unwrap_or("?")
                ),
                s => format!("{s} {}", if s < 300 { "accepted" } else { "error" }),
            };
            emit_status(me, "write", &text, &token, &result, Some(status));
        }
    }
    println!("{EVENT}{}", json!({"action": "exit"}));
    Ok(())
}
