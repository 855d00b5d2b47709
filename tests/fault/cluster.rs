//! A throwaway PostgreSQL cluster that this test owns and crashes: the shared one of
//! tests/support/postgres.rs, with a crash and a restart.
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

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

pub use crate::support_pg::{free_port, Cluster};
use crate::support_pg::{self, is_root, shell_quote};

const NOT_FOUND: &str = "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them \
     (Debian/Ubuntu: apt-get install postgresql) or put their directory in FAULT_PG_BINDIR. \
     The fault-injection test needs its own cluster to crash; it never uses DATABASE_URL";

async fn run(cmd: std::process::Command, what: &str, log: &Path) -> Result<(), String> {
    support_pg::check(what, Command::from(cmd).output().await, log)
}

// The fault run's own methods on the shared cluster type.
impl Cluster {
    /// initdb + start. `root` is this run's scratch directory; the cluster lives in `root/pg`.
    /// `keep`: the watchdog leaves `root` in place (FAULT_KEEP) for post-mortems.
    pub async fn create(root: &Path, keep: bool) -> Cluster {
        let bindir = support_pg::bindir(std::env::var_os("FAULT_PG_BINDIR").map(PathBuf::from), NOT_FOUND);
        if is_root() && !which("runuser") {
            panic!("running as root needs `runuser` (util-linux) to start PostgreSQL as the postgres user");
        }
        let pgroot = root.join("pg");
        std::fs::create_dir_all(&pgroot).expect("create the cluster directory");
        if is_root() {
            // The postgres user must be able to reach its directory.
            let _ = std::process::Command::new("chmod").arg("755").arg(root).status();
        }
        let settings = "-c fsync=off -c full_page_writes=off -c max_connections=200 -c log_min_messages=warning";
        let remove = if keep { String::new() } else { format!("rm -rf {}", shell_quote(root)) };
        Cluster::new(&bindir, &pgroot, settings, &remove, "")
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (after crash recovery).
    pub async fn start(&self) -> Result<(), String> {
        run(self.start_command(), "pg_ctl start", &self.log).await
    }

    /// The crash: `pg_ctl stop -m immediate` (every server process quits at once, no checkpoint;
    /// the next start runs crash recovery).
    pub async fn crash(&self) -> Result<(), String> {
        run(self.stop_command("immediate"), "pg_ctl stop -m immediate", &self.log).await
    }

    /// A clean stop at the end of the run.
    pub async fn stop(&self) {
        let stop = run(self.stop_command("fast"), "pg_ctl stop", &self.log);
        let _ = tokio::time::timeout(Duration::from_secs(40), stop).await;
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
