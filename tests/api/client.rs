//! fencegate as its own client, with real processes: `kv` and `fence` exit with the class of
//! the answer, and `lock -- CMD` holds a lease while CMD runs, stops CMD when the lease is lost
//! (a real SIGSTOP of the wrapper, a real SIGKILL of the server), and passes statuses and
//! signals through (docs/api.md, *The command line as a client*).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::helpers::{enc, spawn_app, spawn_app_with, spawn_binary, unique, TestApp};
use crate::pg;

const BIN: &str = env!("CARGO_BIN_EXE_fencegate");

/// `fencegate ARGS` against `url`, with none of the client's variables inherited from the test.
fn fencegate(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("FENCEGATE_URL", url)
        .env("FG", BIN)
        .env_remove("FENCEGATE_TOKEN")
        .env_remove("FENCEGATE_SCOPE")
        .env_remove("FENCEGATE_API_KEY")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs it to the end: exit status (None: killed by a signal), stdout, stderr.
async fn run(mut command: Command) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("fencegate did not finish within 60 s")
        .expect("run fencegate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `fencegate ARGS` with `env`, run to the end.
async fn client(url: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, Value, String) {
    let mut command = fencegate(url, args);
    command.envs(env.iter().copied());
    let (code, stdout, stderr) = run(command).await;
    let body = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (code, body, stderr)
}

/// Polls `check` every 10 ms until it holds; panics with `what` after `within`.
async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < give_up,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn pid_in(path: &Path) -> Pid {
    Pid::from_raw(
        read(path)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no pid in {}", path.display())),
    )
}

fn alive(pid: Pid) -> bool {
    kill(pid, None).is_ok()
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id().expect("running") as i32), signal).expect("signal the wrapper");
}

async fn acquire(app: &TestApp, name: &str, owner: &str, ttl_ms: u64) -> crate::helpers::Resp {
    app.send(
        app.req(Method::POST, &format!("/v1/locks/{}", enc(name)))
            .json(&json!({"owner": owner, "ttl_ms": ttl_ms})),
    )
    .await
}

async fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("the wrapper did not exit within {within:?}"))
        .expect("wait for the wrapper")
}

#[tokio::test]
async fn kv_and_fence_commands_exit_with_the_class_of_the_answer() {
    let app = spawn_app().await;
    let url = app.address.as_str();
    let key = unique("cli/a b%é");

    let (code, body, err) = client(
        url,
        &["kv", "put", &key, r#"{"n": 1}"#, "--token", "10"],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        (body["key"].as_str(), body["fence_token"].as_str()),
        (Some(key.as_str()), Some("10")),
        "{body}"
    );
    let (code, body, err) = client(url, &["kv", "get", &key], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(body["value"], json!({"n": 1}), "{body}");

    // 412: the body (the problem) still goes to stdout; one line on stderr.
    let (code, body, err) = client(url, &["kv", "put", &key, "2", "--token", "9"], &[]).await;
    assert_eq!(code, Some(4), "{body} {err}");
    assert_eq!(body["current_token"], json!("10"), "{body}");
    assert!(err.contains("412 stale-token"), "{err}");
    // 404
    let (code, body, _) = client(url, &["kv", "get", &unique("absent")], &[]).await;
    assert_eq!(
        (code, body["status"].as_u64()),
        (Some(3), Some(404)),
        "{body}"
    );
    // Another 4xx: bad JSON (400), a malformed token (400); bad usage: no token at all.
    let (code, body, _) = client(url, &["kv", "put", &key, "{nope", "--token", "11"], &[]).await;
    assert_eq!(
        (code, body["status"].as_u64()),
        (Some(2), Some(400)),
        "{body}"
    );
    let (code, _, _) = client(url, &["kv", "put", &key, "1", "--token", "-1"], &[]).await;
    assert_eq!(code, Some(2));
    let (code, _, err) = client(url, &["kv", "put", &key, "1"], &[]).await;
    assert_eq!(code, Some(2), "a write without a token is bad usage: {err}");
    app.assert_value(&enc(&key), &json!({"n": 1}), "10").await;

    // The token and scope come from the environment a wrapper sets; the value from stdin.
    let scope = unique("scope");
    let scoped = unique("scoped");
    let mut command = fencegate(url, &["kv", "put", &scoped]);
    command
        .env("FENCEGATE_TOKEN", "5")
        .env("FENCEGATE_SCOPE", &scope)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = command.spawn().unwrap();
    use tokio::io::AsyncWriteExt;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"[1, 2]")
        .await
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let got = app.kv_get(&enc(&scoped)).await.expect(200);
    assert_eq!(
        (got["value"].clone(), got["scope"].clone()),
        (json!([1, 2]), json!(scope)),
        "{got}"
    );

    // Delete, then the key is gone (3).
    let (code, _, err) = client(url, &["kv", "delete", &key, "--token", "12"], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, _) = client(url, &["kv", "get", &key], &[]).await;
    assert_eq!(code, Some(3));

    // Fences: claim (0), a lower claim (4), read (0), an unknown scope (3).
    let (code, body, err) = client(url, &["fence", "claim", &scope, "--token", "7"], &[]).await;
    assert_eq!(code, Some(0), "{body} {err}");
    let (code, _, _) = client(url, &["fence", "claim", &scope, "--token", "6"], &[]).await;
    assert_eq!(code, Some(4));
    let (code, body, _) = client(url, &["fence", "get"], &[("FENCEGATE_SCOPE", &scope)]).await;
    assert_eq!(
        (code, body),
        (Some(0), json!({"scope": scope, "fence_token": "7"}))
    );
    let (code, _, _) = client(url, &["fence", "get", &unique("none")], &[]).await;
    assert_eq!(code, Some(3));

    // No answer at all: 1.
    let (code, _, err) = client("http://127.0.0.1:1", &["kv", "get", "k"], &[]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no answer"), "{err}");
    // Not a URL: usage.
    let (code, _, _) = client("127.0.0.1:1", &["kv", "get", "k"], &[]).await;
    assert_eq!(code, Some(2));
}

#[tokio::test]
async fn the_api_key_in_the_environment_is_sent_as_the_bearer() {
    let secret = fencegate::auth::new_key().unwrap();
    let digest = fencegate::auth::digest_hex(&secret);
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![fencegate::auth::ApiKeySettings {
            name: "cli".into(),
            sha256: digest,
            rights: vec!["admin".into()],
            prefixes: vec![],
            tables: vec![],
        }];
    })
    .await;
    let key = unique("k");
    let (code, body, _) =
        client(&app.address, &["kv", "put", &key, "1", "--token", "1"], &[]).await;
    assert_eq!(
        (code, body["status"].as_u64()),
        (Some(2), Some(401)),
        "{body}"
    );
    let (code, body, err) = client(
        &app.address,
        &["kv", "put", &key, "1", "--token", "1"],
        &[("FENCEGATE_API_KEY", &secret)],
    )
    .await;
    assert_eq!(code, Some(0), "{body} {err}");
}

/// The wrapper ran nothing because its lock's grant arrived past the lease's soft stop (half
/// of a 1 s lease): right on a starved machine, where the request took that long, and beside
/// the point of the tests with short leases, which then start their wrapper again.
/// `fencegate lock LOCK --ttl-ms 1000 OPTIONS -- sh -c JOB`: the paused-wrapper test's wrappers.
fn locked_job(url: &str, lock: &str, options: &[&str], job: &str) -> Command {
    let mut args = vec!["lock", lock, "--ttl-ms", "1000"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", "sh", "-c", job]);
    fencegate(url, &args)
}

fn grant_came_too_late(stderr: &str) -> bool {
    stderr.contains("took too long to arrive")
}

#[tokio::test]
async fn a_paused_wrapper_loses_its_lease_its_command_is_killed_and_its_late_writes_are_refused() {
    let app = spawn_app().await;
    let lock = unique("job");
    let key = unique("k");
    let dir = tempfile::tempdir().unwrap();
    let log1 = dir.path().join("log1");

    // Job 1 writes "one-N" every 50 ms under the lock's token and scope, logging each status.
    let job1 = r#"echo $$ > "$D/pid1"; i=0; while :; do i=$((i+1)); "$FG" kv put "$K" "\"one-$i\"" >/dev/null 2>&1; echo "$i $?" >> "$D/log1"; sleep 0.05; done"#;
    let start_one = || {
        let mut one = locked_job(&app.address, &lock, &["--kill-grace-ms", "500"], job1);
        one.env("D", dir.path())
            .env("K", &key)
            .stderr(Stdio::piped());
        one.spawn().unwrap()
    };
    let mut one = start_one();
    // A deadline, not a guess: the wrapper starts a process that starts the job, which took
    // over 20 s on a loaded 2-core machine (3.4 s when quiet).
    let give_up = Instant::now() + Duration::from_secs(90);
    while !read(&log1).lines().any(|l| l.ends_with(" 0")) {
        if Instant::now() > give_up || one.try_wait().unwrap().is_some() {
            let _ = one.start_kill();
            let out = one.wait_with_output().await.unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            if Instant::now() <= give_up && grant_came_too_late(&stderr) {
                one = start_one();
                continue;
            }
            panic!(
                "no accepted write of job 1 (wrapper: {:?}, {stderr}); its log:\n{}",
                out.status,
                read(&log1)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let token1: u64 = app.kv_get(&enc(&key)).await.expect(200)["fence_token"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // The wrapper freezes (a GC pause, a VM stall); its job does not.
    signal(&one, Signal::SIGSTOP);
    let job2 = r#""$FG" kv put "$K" '"two"' && sleep 0.5"#;
    let two = || {
        // A deadline for the takeover (lease 1 lapses after 1 s), generous for a loaded machine.
        let mut two = locked_job(&app.address, &lock, &["--wait-ms", "60000"], job2);
        two.env("K", &key);
        two
    };
    let give_up = Instant::now() + Duration::from_secs(90);
    let (code, _, err) = loop {
        let (code, out, err) = run(two()).await;
        if code == Some(0) || Instant::now() > give_up || !grant_came_too_late(&err) {
            break (code, out, err);
        }
    };
    assert_eq!(
        code,
        Some(0),
        "wrapper 2 must get the lock once lease 1 expired and pass on its job's 0: {err}"
    );

    // While wrapper 1 was frozen, job 1 went on writing: refused (412, exit 4) since the takeover.
    // Each of job 1's writes starts a process: seconds apart on a loaded machine.
    eventually("a refused write of job 1", Duration::from_secs(60), || {
        read(&log1).lines().any(|l| l.ends_with(" 4"))
    })
    .await;
    let got = app.kv_get(&enc(&key)).await.expect(200);
    assert_eq!(got["value"], json!("two"), "{got}");
    let token2: u64 = got["fence_token"].as_str().unwrap().parse().unwrap();
    assert!(token2 > token1, "{token2} > {token1}");

    // Wrapper 1 wakes up, finds its lease gone before doing anything else, and stops job 1.
    signal(&one, Signal::SIGCONT);
    let status = wait_exit(&mut one, Duration::from_secs(60)).await;
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    one.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    assert_eq!(status.code(), Some(70), "a lost lease exits 70: {stderr}");
    assert!(stderr.contains("lease lost"), "{stderr}");
    assert!(
        !alive(pid_in(&dir.path().join("pid1"))),
        "job 1 must be gone"
    );
    let lines = read(&log1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        read(&log1),
        lines,
        "job 1 wrote on after its wrapper exited"
    );
    // No write of job 1 was accepted after the first refusal.
    let statuses: Vec<&str> = lines.lines().filter_map(|l| l.split(' ').nth(1)).collect();
    let first_refused = statuses.iter().position(|s| *s == "4").unwrap();
    assert!(
        statuses[first_refused..].iter().all(|s| *s == "4"),
        "job 1 statuses: {statuses:?}"
    );
    app.assert_value(&enc(&key), &json!("two"), &token2.to_string())
        .await;
}

#[tokio::test]
async fn a_lock_held_past_wait_ms_exits_75_without_running_the_command() {
    let app = spawn_app().await;
    let lock = unique("busy");
    acquire(&app, &lock, "the-holder", 30_000).await.expect(201);
    let dir = tempfile::tempdir().unwrap();
    for wait in ["0", "400"] {
        let started = Instant::now();
        let mut command = fencegate(
            &app.address,
            &[
                "lock",
                &lock,
                "--wait-ms",
                wait,
                "--",
                "sh",
                "-c",
                r#"touch "$D/ran""#,
            ],
        );
        command.env("D", dir.path());
        let (code, _, err) = run(command).await;
        assert_eq!(code, Some(75), "{err}");
        assert!(err.contains("the-holder"), "the holder is named: {err}");
        assert!(
            started.elapsed() >= Duration::from_millis(wait.parse().unwrap()),
            "gave up early"
        );
        assert!(
            !dir.path().join("ran").exists(),
            "the command ran without the lock"
        );
    }
}

#[tokio::test]
async fn the_command_gets_the_lease_in_its_environment_and_its_status_is_passed_on() {
    let app = spawn_app().await;
    let lock = unique("café job");
    // Inside, `lock-info` (on FENCEGATE_SCOPE) sees the lease held by this wrapper's owner.
    let job = r#"test "$FENCEGATE_SCOPE" = "$L" && test "$FENCEGATE_URL" = "$U" && "$FG" lock-info >&2 && echo "$FENCEGATE_TOKEN"; exit 7"#;
    let mut command = fencegate(
        &app.address,
        &[
            "lock",
            &lock,
            "--owner",
            "the-wrapper",
            "--",
            "sh",
            "-c",
            job,
        ],
    );
    command.env("L", &lock).env("U", &app.address);
    let (code, stdout, err) = run(command).await;
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains(r#""owner":"the-wrapper""#), "{err}");
    let token: u64 = stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no token on stdout: {stdout:?} {err}"));
    // Released on exit: the next grant comes at once, with a larger token.
    let next = acquire(&app, &lock, "next", 1_000).await.expect(201);
    assert!(
        next["token"].as_str().unwrap().parse::<u64>().unwrap() > token,
        "{next}"
    );
    acquire(&app, &lock, "other", 1_000)
        .await
        .problem(409, "lock-held");
    let (code, body, _) = client(&app.address, &["lock-info", &lock], &[]).await;
    assert_eq!(
        (code, body["owner"].as_str()),
        (Some(0), Some("next")),
        "{body}"
    );
    assert!(
        body.get("token").is_none(),
        "the holder's token is never shown: {body}"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (code, body, _) = client(&app.address, &["lock-info", &lock], &[]).await;
    assert_eq!(code, Some(3), "an expired lease: the lock is free: {body}");

    // A signal that ends the command: 128 + N.
    let (code, _, err) = run(fencegate(
        &app.address,
        &["lock", &lock, "--", "sh", "-c", "kill -KILL $$"],
    ))
    .await;
    assert_eq!(code, Some(128 + 9), "{err}");
    let (code, _, err) = run(fencegate(
        &app.address,
        &["lock", &lock, "--", "sh", "-c", "kill -USR1 $$"],
    ))
    .await;
    assert_eq!(code, Some(128 + 10), "{err}");
    // A command that cannot be run: 127, and the lock is released.
    let (code, _, err) = run(fencegate(
        &app.address,
        &["lock", &lock, "--", "/nonexistent/cmd"],
    ))
    .await;
    assert_eq!(code, Some(127), "{err}");
    acquire(&app, &lock, "after", 1_000).await.expect(201);
}

#[tokio::test]
async fn sigterm_to_the_wrapper_reaches_the_command_and_the_lock_is_released() {
    let app = spawn_app().await;
    let lock = unique("term");
    let dir = tempfile::tempdir().unwrap();
    let job = r#"trap 'echo term > "$D/term"; exit 3' TERM; echo ready > "$D/ready"; while :; do sleep 0.05; done"#;
    // A long lease: only the release can free the lock right after.
    let mut command = fencegate(
        &app.address,
        &["lock", &lock, "--ttl-ms", "60000", "--", "sh", "-c", job],
    );
    command.env("D", dir.path());
    let mut wrapper = command.spawn().unwrap();
    eventually("the job to start", Duration::from_secs(90), || {
        dir.path().join("ready").exists()
    })
    .await;
    signal(&wrapper, Signal::SIGTERM);
    let status = wait_exit(&mut wrapper, Duration::from_secs(60)).await;
    assert_eq!(
        status.code(),
        Some(3),
        "the job's own status after its TERM trap"
    );
    assert_eq!(read(&dir.path().join("term")).trim(), "term");
    acquire(&app, &lock, "right-after", 1_000).await.expect(201);
}

#[tokio::test]
async fn the_command_is_killed_before_the_lease_can_pass_on_when_the_server_dies() {
    let db = pg::fresh_database().await;
    let first = spawn_binary(&db).await;
    let lock = unique("orphan");
    let dir = tempfile::tempdir().unwrap();
    // The job ignores SIGTERM (so does everything it starts): only the SIGKILL stops it, which
    // must land before the lease expires although the grace (5 s) is longer than the lease.
    let job = r#"trap '' TERM; echo $$ > "$D/pid"; while :; do sleep 0.05; done"#;
    let mut command = fencegate(
        &first.address,
        &[
            "lock",
            &lock,
            "--ttl-ms",
            "3000",
            "--kill-grace-ms",
            "5000",
            "--",
            "sh",
            "-c",
            job,
        ],
    );
    command.env("D", dir.path()).stderr(Stdio::piped());
    let mut wrapper = command.spawn().unwrap();
    // The shell creates the file before it writes the pid into it: wait for the pid itself.
    eventually("the job to start", Duration::from_secs(90), || {
        read(&dir.path().join("pid")).trim().parse::<i32>().is_ok()
    })
    .await;
    let job_pid = pid_in(&dir.path().join("pid"));
    tokio::time::sleep(Duration::from_millis(1_200)).await; // a renew went through
    first.kill().await;

    // The wrapper's exit, timed as it happens.
    let exited = tokio::spawn(async move {
        let status = wait_exit(&mut wrapper, Duration::from_secs(30)).await;
        let mut stderr = String::new();
        use tokio::io::AsyncReadExt;
        wrapper
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        (status, Instant::now(), stderr)
    });
    // Another fencegate on the same database hands the lock out as soon as the lease expires.
    let second = spawn_binary(&db).await;
    let app = second.view();
    let granted_after = loop {
        let sent = Instant::now();
        let resp = acquire(&app, &lock, "next", 5_000).await;
        match resp.status {
            201 => break sent,
            409 => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => panic!("{resp:?}"),
        }
    };
    let (status, exited_at, stderr) = exited.await.unwrap();
    assert_eq!(status.code(), Some(70), "{stderr}");
    assert!(
        exited_at < granted_after,
        "the job must be dead before the next grant was even asked for ({:?} too late)\n{stderr}",
        exited_at - granted_after
    );
    assert!(!alive(job_pid), "the job survived");
}

/// CMD exits 0 but leaves a process of its own behind (`worker &`): the wrapper stops it
/// before it releases the lock, so nothing started under the lease runs on once the next
/// holder can take it (found in review: the leftover kept running with the old token).
#[tokio::test]
async fn what_the_command_leaves_running_is_stopped_before_the_release() {
    let app = spawn_app().await;
    let lock = unique("leftover");
    let dir = tempfile::tempdir().unwrap();
    let job = r#"sleep 60 & echo $! > "$D/worker"; exit 0"#;
    let mut command = fencegate(
        &app.address,
        &["lock", &lock, "--ttl-ms", "60000", "--", "sh", "-c", job],
    );
    command.env("D", dir.path());
    let (code, _, err) = run(command).await;
    assert_eq!(code, Some(0), "{err}");
    let worker = pid_in(&dir.path().join("worker"));
    // Stopped, not just signalled: gone (or a zombie of init's) by the time the wrapper exits.
    let status = std::fs::read_to_string(format!("/proc/{worker}/status")).unwrap_or_default();
    assert!(
        !alive(worker) || status.contains("State:\tZ"),
        "the leftover worker {worker} still runs: {status}"
    );
    // And the lock was released, not left to expire.
    acquire(&app, &lock, "next", 1_000).await.expect(201);
}
