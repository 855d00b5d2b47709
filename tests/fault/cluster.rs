//! A throwaway PostgreSQL cluster that this test owns and crashes (adapted from tests/api/pg.rs).
//!
//! It never uses `DATABASE_URL`: the nemesis kills the server with `pg_ctl stop -m immediate`,
//! which must never happen to a shared server. initdb + pg_ctl on a free port in a temporary
//! directory, as the `postgres` user when run as root; a detached watchdog stops the cluster and
//! removes the directory once this test process is gone, even if it is killed.
//!
//! Durability settings: `fsync=off` and `full_page_writes=off` only matter for an operating-system
//! crash (they skip flushing the kernel's page cache and protect against torn pages); an
//! immediate shutdown kills processes, and everything they `write(2)` survives in the page cache.
//! `synchronous_commit` stays ON (the default): with it off, a commit returns before its WAL is
//! written, and an immediate shutdown would lose acknowledged writes the checker would then
//! rightly report.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::process::Command;

const NOT_FOUND: &str = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them \
     (Debian/Ubuntu: apt-get install postgresql) or put their directory in FAULT_PG_BINDIR. \
     The fault-injection test needs its own cluster to crash; it never uses DATABASE_URL";

pub struct Cluster {
    pub port: u16,
    data: PathBuf,
    pub log: PathBuf,
    pg_ctl: PathBuf,
    opts: String,
}

/// Directory holding `initdb`, `pg_ctl`, `postgres`.
fn pg_bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("FAULT_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        assert!(dir.join("initdb").is_file(), "FAULT_PG_BINDIR={} has no initdb. {NOT_FOUND}", dir.display());
        return dir;
    }
    if let Ok(out) = std::process::Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if dir.join("initdb").is_file() {
                return dir;
            }
        }
    }
    // Debian/Ubuntu layout: /usr/lib/postgresql/<major>/bin, newest major wins.
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major: u32 = entry.file_name().to_str()?.split('.').next()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    candidates.sort();
    match candidates.pop() {
        Some((_, bin)) => bin,
        None => panic!("{NOT_FOUND}"),
    }
}

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false))
}

/// initdb and pg_ctl refuse to run as root: as root, run them as `postgres`.
fn pg_command(bin: &Path) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(bin);
        cmd
    } else {
        Command::new(bin)
    }
}

pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("cannot bind an ephemeral port on 127.0.0.1")
        .port()
}

async fn run(mut cmd: Command, what: &str, log: &Path) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let server_log = std::fs::read_to_string(log).unwrap_or_default();
    let tail: String = server_log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(format!(
        "{what} failed ({}):\nstdout: {}\nstderr: {}\nserver log (tail):\n{tail}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    ))
}

impl Cluster {
    /// initdb + start. `root` is this run's scratch directory; the cluster lives in `root/pg`.
    /// `keep`: the watchdog leaves `root` in place (FAULT_KEEP) for post-mortems.
    pub async fn create(root: &Path, keep: bool) -> Cluster {
        let bindir = pg_bindir();
        let initdb = bindir.join("initdb");
        let pg_ctl = bindir.join("pg_ctl");
        if !initdb.is_file() || !pg_ctl.is_file() || !bindir.join("postgres").is_file() {
            panic!("{NOT_FOUND} (looked in {})", bindir.display());
        }
        if is_root() && !which("runuser") {
            panic!("running as root needs `runuser` (util-linux) to start PostgreSQL as the postgres user");
        }
        let pgroot = root.join("pg");
        std::fs::create_dir_all(&pgroot).expect("create the cluster directory");
        let data = pgroot.join("data");
        let log = pgroot.join("server.log");

        // Tear-down first, so that even a failed start leaves nothing behind. The watchdog is in
        // its own process group: a Ctrl-C aimed at the test run does not kill it before it cleans up.
        let stop = if is_root() {
            format!("runuser -u postgres -- {}", shell_quote(&pg_ctl))
        } else {
            shell_quote(&pg_ctl)
        };
        let remove = if keep { String::new() } else { format!("rm -rf {}", shell_quote(root)) };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             {stop} -D {data} stop -m immediate >/dev/null 2>&1; {remove}",
            pid = std::process::id(),
            data = shell_quote(&data),
        );
        // Never waited for: it must outlive this process.
        #[allow(clippy::zombie_processes)]
        std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("cannot spawn the cluster watchdog (sh)");

        if is_root() {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&pgroot)
                .status()
                .expect("cannot run chown");
            assert!(
                status.success(),
                "chown of {} to postgres failed: running as root needs a `postgres` user \
                 (Debian: apt-get install postgresql)",
                pgroot.display()
            );
            // The postgres user must be able to reach its directory.
            let _ = std::process::Command::new("chmod").arg("755").arg(root).status();
        }

        let mut cmd = pg_command(&initdb);
        cmd.arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"]);
        run(cmd, "initdb", &log).await.unwrap_or_else(|e| panic!("{e}"));

        let port = free_port();
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c full_page_writes=off \
             -c max_connections=200 -c log_min_messages=warning",
            sock = shell_quote(&pgroot),
        );
        let cluster = Cluster { port, data, log, pg_ctl, opts };
        cluster.start().await.unwrap_or_else(|e| panic!("{e}"));
        cluster
    }

    /// Admin URL (database `postgres`) straight to the server.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (after crash recovery).
    pub async fn start(&self) -> Result<(), String> {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "-o", &self.opts, "start"]);
        // The postmaster outlives pg_ctl: keep it out of our process group and Ctrl-C.
        cmd.process_group(0);
        run(cmd, "pg_ctl start", &self.log).await
    }

    /// The crash: `pg_ctl stop -m immediate` (every server process quits at once, no checkpoint;
    /// the next start runs crash recovery).
    pub async fn crash(&self) -> Result<(), String> {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D").arg(&self.data).args(["-w", "-t", "30", "stop", "-m", "immediate"]);
        run(cmd, "pg_ctl stop -m immediate", &self.log).await
    }

    /// A clean stop at the end of the run.
    pub async fn stop(&self) {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D").arg(&self.data).args(["-w", "-t", "30", "stop", "-m", "fast"]);
        let _ = tokio::time::timeout(Duration::from_secs(40), run(cmd, "pg_ctl stop", &self.log)).await;
    }

    /// Server log lines containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Lines of the server log that report a PANIC (data-level trouble; crash-recovery chatter
    /// is expected and not counted).
    pub fn panics_in_log(&self) -> Vec<String> {
        self.log_lines("PANIC:")
    }
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(bin).is_file()))
        .unwrap_or(false)
}
