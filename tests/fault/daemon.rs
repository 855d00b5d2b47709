//! Long-running third-party programs a fault run starts (etcd, Patroni, HAProxy): each in a
//! process group of its own, SIGKILLed with its whole group when its guard drops, also when the
//! test panics.
//!
//! Each daemon leaves its process-group id in `<scratch>/pids/` while it runs, so the detached
//! watchdog of [`watch_scratch`] can kill whatever is left if this test process itself is killed
//! (a guard's `Drop` never runs then), and remove the scratch directory.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::support_pg::{self, is_root, shell_quote};

/// The path of `program`, from `PATH` or the sbin directories (HAProxy lives in /usr/sbin, which
/// a non-root `PATH` may lack); panics with what to install when it is missing: a missing
/// program fails the run, it never skips it.
pub fn require(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{program}` not found: install it (Debian/Ubuntu: apt-get install {package}; \
                 tests/run.sh does this when run as root)"
            )
        })
}

/// The `postgres` user's uid and gid, from /etc/passwd: Patroni and PostgreSQL refuse to run
/// as root, so as root they run as this user.
pub fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == "postgres")
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .expect(
            "running as root needs a `postgres` user to run Patroni and PostgreSQL as \
             (Debian: apt-get install postgresql)",
        )
}

/// Once this test process is gone (killed: the guards did not run), kills every daemon group
/// still listed in `scratch/pids` or `scratch/*/pids`, every postmaster under `scratch` (Patroni starts them in
/// sessions of their own), and removes `scratch` unless `keep`.
pub fn watch_scratch(scratch: &Path, keep: bool) {
    let root = shell_quote(scratch);
    let remove = if keep {
        String::new()
    } else {
        format!("sleep 1; rm -rf {root}")
    };
    support_pg::watchdog(
        &format!(
            "for f in {root}/pids/* {root}/*/pids/*; do [ -f \"$f\" ] && kill -9 -- -\"$(cat \"$f\")\"; done 2>/dev/null; \
             for f in {root}/*/data/postmaster.pid; do [ -f \"$f\" ] && kill -9 \"$(head -1 \"$f\")\"; done 2>/dev/null; \
             {remove}"
        ),
        None,
    );
}

/// A running program in a process group of its own; its output goes to `log`.
pub struct Daemon {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    pid_file: PathBuf,
    killed: bool,
}

impl Daemon {
    /// Starts `cmd` (as the `postgres` user when `as_postgres` and running as root), output
    /// appended to `<scratch>/<name>.log`.
    pub fn spawn(
        scratch: &Path,
        name: &str,
        mut cmd: Command,
        as_postgres: bool,
    ) -> Result<Daemon, String> {
        let log = scratch.join(format!("{name}.log"));
        // Appended to: a restarted daemon keeps its earlier life's output.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        if as_postgres && is_root() {
            let (uid, gid) = postgres_ids();
            cmd.uid(uid).gid(gid);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let pids = scratch.join("pids");
        std::fs::create_dir_all(&pids).map_err(|e| format!("{}: {e}", pids.display()))?;
        let pid_file = pids.join(name);
        std::fs::write(&pid_file, child.id().to_string())
            .map_err(|e| format!("{}: {e}", pid_file.display()))?;
        Ok(Daemon {
            name: name.to_string(),
            log,
            child,
            pid_file,
            killed: false,
        })
    }

    /// `Some` once the program has exited on its own.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL to the whole process group, and reap.
    pub fn kill(&mut self) {
        if self.killed {
            return;
        }
        self.killed = true;
        let _ = kill(Pid::from_raw(-(self.child.id() as i32)), Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// The last `n` lines of its output.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until 127.0.0.1:`port` accepts TCP connections; `Err` after `limit` or once `daemon`
/// has exited (with its log).
pub async fn await_port(
    daemon: &mut Daemon,
    port: u16,
    limit: std::time::Duration,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Some(status) = daemon.exited() {
            return Err(format!(
                "{} exited ({status}) before listening on :{port}; its output:\n{}",
                daemon.name,
                daemon.log_tail(30)
            ));
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{} is not listening on :{port} after {limit:?}; its output:\n{}",
                daemon.name,
                daemon.log_tail(30)
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
