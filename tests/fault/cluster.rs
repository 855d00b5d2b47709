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

use crate::support_pg::{self, is_root, shell_quote};
pub use crate::support_pg::{free_port, Cluster};

const NOT_FOUND: &str =
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them \
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
        let bindir = support_pg::bindir(
            std::env::var_os("FAULT_PG_BINDIR").map(PathBuf::from),
            NOT_FOUND,
        );
        if is_root() && !which("runuser") {
            panic!("running as root needs `runuser` (util-linux) to start PostgreSQL as the postgres user");
        }
        let pgroot = root.join("pg");
        std::fs::create_dir_all(&pgroot).expect("create the cluster directory");
        if is_root() {
            // The postgres user must be able to reach its directory.
            let _ = std::process::Command::new("chmod")
                .arg("755")
                .arg(root)
                .status();
        }
        let settings = "-c fsync=off -c full_page_writes=off -c max_connections=200 -c log_min_messages=warning";
        let remove = if keep {
            String::new()
        } else {
            format!("rm -rf {}", shell_quote(root))
        };
        Cluster::new(&bindir, &pgroot, settings, &remove, "")
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (after crash recovery).
    pub async fn start(&self) -> Result<(), String> {
        run(self.start_command(), "pg_ctl start", &self.log).await
    }

    /// The crash: `pg_ctl stop -m immediate` (every server process quits at once, no checkpoint;
    /// the next start runs crash recovery).
    pub async fn crash(&self) -> Result<(), String> {
        run(
            self.stop_command("immediate"),
            "pg_ctl stop -m immediate",
            &self.log,
        )
        .await
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

/// A primary and a hot standby made from it with `pg_basebackup -R`, the standby streaming
/// through `link` (a proxy the nemesis can stall: a lagging standby). With `synchronous`, the
/// primary waits for the standby to flush each commit before acknowledging it
/// (`synchronous_standby_names = '*'`); else replication is asynchronous.
pub struct Replicated {
    pub primary: Cluster,
    pub standby: Cluster,
    pub link: crate::proxy::Proxy,
}

impl Replicated {
    /// Both servers live under `root` (`primary/`, `standby/`); once this process is gone the
    /// watchdogs stop both, then remove `root` (unless `keep`).
    pub async fn create(root: &Path, keep: bool, synchronous: bool) -> Replicated {
        let bindir = support_pg::bindir(
            std::env::var_os("FAULT_PG_BINDIR").map(PathBuf::from),
            NOT_FOUND,
        );
        if is_root() {
            let _ = std::process::Command::new("chmod")
                .arg("755")
                .arg(root)
                .status();
        }
        let settings = "-c fsync=off -c full_page_writes=off -c max_connections=200 -c log_min_messages=warning";
        let primary_dir = root.join("primary");
        std::fs::create_dir_all(&primary_dir).expect("create the primary's directory");
        let primary = Cluster::new(&bindir, &primary_dir, settings, "", "");
        let link = crate::proxy::Proxy::start(([127, 0, 0, 1], primary.port).into()).await;
        // The standby's watchdog stops it, then the primary, then removes everything.
        let stop_primary = {
            let cmd = primary.stop_command("immediate");
            let args: Vec<String> = std::iter::once(cmd.get_program())
                .chain(cmd.get_args())
                .map(|a| support_pg::shell_quote(Path::new(a)))
                .collect();
            args.join(" ")
        };
        let remove = if keep {
            String::new()
        } else {
            format!("rm -rf {}", shell_quote(root))
        };
        let standby_settings = format!("{settings} -c cluster_name=standby -c hot_standby=on");
        let (dir, port) = (root.join("standby"), link.port);
        let standby = tokio::task::spawn_blocking(move || {
            Cluster::standby_of(
                &bindir,
                &dir,
                port,
                &standby_settings,
                &format!("{stop_primary} >/dev/null 2>&1; {remove}"),
            )
        })
        .await
        .expect("create the standby");
        let pair = Replicated {
            primary,
            standby,
            link,
        };
        if synchronous {
            pair.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await;
            pair.sql("SELECT pg_reload_conf()").await;
        }
        let want = if synchronous { "sync" } else { "async" };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let state = pair.replication_state().await;
            if state.iter().any(|s| s == &format!("streaming/{want}")) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the standby is not streaming ({want}) after 30 s: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        pair
    }

    async fn sql(&self, statement: &str) {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.primary.url())
            .await
            .expect("connect to the primary");
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
        let _ = conn.close().await;
    }

    /// `state/sync_state` of each standby, as the primary sees it.
    async fn replication_state(&self) -> Vec<String> {
        use sqlx::Connection;
        let Ok(mut conn) = sqlx::PgConnection::connect(&self.primary.url()).await else {
            return Vec::new();
        };
        let rows: Vec<String> =
            sqlx::query_scalar("SELECT state || '/' || sync_state FROM pg_stat_replication")
                .fetch_all(&mut conn)
                .await
                .unwrap_or_default();
        let _ = conn.close().await;
        rows
    }

    /// `pg_ctl promote -w` on the standby.
    pub async fn promote(&self) -> Result<(), String> {
        run(
            self.standby.promote_command(),
            "pg_ctl promote",
            &self.standby.log,
        )
        .await
    }
}
