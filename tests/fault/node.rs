//! fencegate processes: the real binary, on a fixed port so a restarted process keeps its
//! address (workers keep their list of nodes).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Makes a child die with this process: SIGKILL when the thread that spawned it exits. Children
/// are spawned from the test's runtime threads, which live as long as the test.
#[allow(unsafe_code)] // pre_exec is unsafe by signature; the closure only calls prctl
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

pub struct Node {
    pub name: String,
    pub port: u16,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// Whether this node reaches PostgreSQL through the nemesis's proxy.
    pub proxied: bool,
    db_url: String,
    config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl Node {
    pub fn new(
        idx: usize,
        port: u16,
        proxied: bool,
        db_url: String,
        config: PathBuf,
        log: PathBuf,
    ) -> Node {
        Node {
            name: format!("n{idx}"),
            port,
            url: format!("http://127.0.0.1:{port}"),
            proxied,
            db_url,
            config,
            log,
            child: None,
            starts: 0,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Starts the process and waits for `listening on ADDR` (printed once the store is open and
    /// migrated). A port still in TIME_WAIT is no obstacle (the listener uses SO_REUSEADDR); a
    /// port taken by someone else is retried briefly, then reported.
    pub async fn start(&mut self) -> Result<Duration, String> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let started = Instant::now();
        let mut last_err = String::new();
        for _ in 0..5 {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| format!("open {}: {e}", self.log.display()))?;
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencegate"));
            cmd.arg("serve")
                .args(["--listen", &format!("127.0.0.1:{}", self.port)])
                .args(["--database-url", &self.db_url])
                .arg("--config")
                .arg(&self.config)
                // Only the command line and our config file configure this process.
                .env_remove("DATABASE_URL")
                .env_remove("FENCEGATE_LISTEN")
                .env_remove("FENCEGATE_CONFIG")
                .env_remove("RUST_LOG")
                .env("FENCEGATE_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log))
                .kill_on_drop(true);
            die_with_parent(&mut cmd);
            let mut child = cmd
                .spawn()
                .map_err(|e| format!("cannot start fencegate: {e}"))?;
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
                Ok(Ok(Some(line))) if line.starts_with("listening on ") => {
                    let want = format!("listening on 127.0.0.1:{}", self.port);
                    if line.trim() != want {
                        return Err(format!("{}: expected `{want}`, got `{line}`", self.name));
                    }
                    // Keep draining stdout so the child never blocks on a full pipe.
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    self.child = Some(child);
                    self.starts += 1;
                    return Ok(started.elapsed());
                }
                other => {
                    let _ = child.start_kill();
                    let status = child.wait().await;
                    last_err = format!(
                        "{} did not print `listening on ADDR` ({other:?}; exit {status:?}); log tail:\n{}",
                        self.name,
                        self.log_tail(15)
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
        Err(last_err)
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// `Err` if the process exited on its own (fencegate must survive every fault but SIGKILL).
    pub fn check_alive(&mut self) -> Result<(), String> {
        let Some(child) = self.child.as_mut() else {
            return Err(format!("{} is not running", self.name));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.child = None;
                Err(format!(
                    "{} exited on its own ({status}); log tail:\n{}",
                    self.name,
                    self.log_tail(20)
                ))
            }
            Err(e) => Err(format!("{}: cannot query its status: {e}", self.name)),
        }
    }

    /// The last `n` log lines, without terminal colour codes.
    pub fn log_tail(&self, n: usize) -> String {
        let text = strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Log lines at ERROR level, by message, for the summary (5xx are logged at error).
    pub fn error_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(str::to_string)
            .collect()
    }
}

/// Removes `ESC [ ... letter` sequences (tracing colours its output even into a file).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
