//! A fencegate process for the benches (`load`, `idle`): the release binary started on a
//! bench database, its address read from its first stdout line, stopped with SIGTERM, and what
//! /proc says about its memory. Each bench includes this file with `#[path]`.

use std::{net::SocketAddr, path::Path, process::Stdio, time::Duration};

use anyhow::{bail, Context, Result};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

pub struct Fencegate {
    pub child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
}

/// `BIN serve` on a free loopback port and `db_url`, with `config` if given, logging at warn,
/// and none of the caller's own fencegate settings from the environment.
pub fn command(bin: &str, db_url: &str, config: Option<&Path>) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--database-url", db_url]);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.env("FENCEGATE_LOG", "warn")
        .env_remove("RUST_LOG")
        .env_remove("FENCEGATE_CONFIG")
        .env_remove("FENCEGATE_LISTEN");
    cmd
}

/// Starts `cmd` (from [`command`]) with its stderr in `log_path`, and waits for it to listen.
pub async fn spawn(mut cmd: Command, log_path: &Path) -> Result<Fencegate> {
    let log = std::fs::File::create(log_path)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.as_std().get_program()))?;
    let pid = child.id().context("fencegate exited at once")?;
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let line = match first {
        Ok(Ok(Some(line))) => line,
        other => {
            let _ = child.start_kill();
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            let why = match other {
                Err(_) => "no `listening on` line within 60 s".to_owned(),
                Ok(Err(e)) => format!("reading its stdout: {e}"),
                _ => "it exited before listening".to_owned(),
            };
            bail!(
                "fencegate did not start ({why}); its stderr:\n{}",
                log.trim()
            );
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

/// SIGTERM (fencegate drains and exits), then SIGKILL after 15 s.
pub async fn stop(mut fg: Fencegate) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(fg.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    if tokio::time::timeout(Duration::from_secs(15), fg.child.wait())
        .await
        .is_err()
    {
        let _ = fg.child.kill().await;
    }
}

/// What `/proc/PID/stat` says of a process: its parent, its name and its CPU time, in clock
/// ticks (1/100 s).
// Only the load bench reads CPU time; `idle` includes this file too.
#[allow(dead_code)]
pub struct Stat {
    pub ppid: u32,
    pub comm: String,
    pub utime: u64,
    pub stime: u64,
    /// The CPU time of its children it has reaped (cutime + cstime).
    pub reaped: u64,
}

/// `/proc/PID/stat` of `pid`; `None` once it is gone (or the file cannot be read).
#[allow(dead_code)]
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `comm` may hold spaces and parentheses: it runs from the first '(' to the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); ppid is 4, utime 14, stime 15, cutime 16, cstime 17.
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(Stat {
        ppid: field(4) as u32,
        comm,
        utime: field(14),
        stime: field(15),
        reaped: field(16) + field(17),
    })
}

/// The named fields of `/proc/PID/status` (`"VmRSS:"`, ...), in KiB; 0 for one not found.
pub fn status_kib<const N: usize>(pid: u32, names: [&str; N]) -> [u64; N] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    names.map(|name| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    })
}
