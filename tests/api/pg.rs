//! Database provisioning for the black-box tests: every test gets a fresh PostgreSQL database.
//!
//! With `DATABASE_URL` set, databases are created on that server. Without it, one throwaway cluster
//! is started per run of this test binary (initdb + pg_ctl on a free port in a temporary directory)
//! and torn down by a detached watchdog once this process is gone — even if it is killed.
//! Nothing here skips: a missing dependency is a failure that says what to install.
//!
//! The cluster is started synchronously with `std::process`, because every `#[tokio::test]` has
//! its own runtime and nothing async may be shared between them. Per-test work (CREATE DATABASE)
//! uses a short-lived connection owned by the calling test's runtime.

use std::path::PathBuf;
use std::sync::OnceLock;

use sqlx::{Connection, Executor, PgConnection};

use fencegate::redact::redact_url;

use crate::db_url::with_database;
use crate::support_pg;

/// Admin URL of the server the per-test databases are created on.
fn admin_url() -> &'static str {
    static ADMIN: OnceLock<String> = OnceLock::new();
    ADMIN.get_or_init(|| match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => start_throwaway_cluster(),
    })
}

/// The backend a test binary exercises: `tests/api` runs on PostgreSQL, `tests/sqlite` runs
/// the same contract modules on the embedded SQLite backend. Each binary's main.rs sets
/// `BACKEND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Creates a brand-new, empty database and returns a URL that points at it.
pub async fn fresh_database() -> String {
    if crate::BACKEND == Backend::Sqlite {
        return fresh_sqlite_database();
    }
    let admin = admin_url();
    let name = format!("fg_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {}: {e}", redact_url(admin)));
    // template0 + UTF8/C: deterministic encoding whatever the server's defaults are (the key tests
    // store non-ASCII text), and template0 never has other sessions attached, so concurrent
    // CREATE DATABASE calls from parallel tests do not trip over each other.
    conn.execute(
        format!(
            "CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
        )
        .as_str(),
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "CREATE DATABASE {name} failed on {}: {e}",
            redact_url(admin)
        )
    });
    // Tag the database with its owner, so a later run can drop it once this process is gone
    // (on a shared DATABASE_URL server nothing else would; the throwaway cluster goes whole).
    let _ = conn
        .execute(
            format!(
                "COMMENT ON DATABASE {name} IS '{}'",
                owner_tag(std::process::id())
            )
            .as_str(),
        )
        .await;
    sweep_leftovers(&mut conn).await;
    let _ = conn.close().await;
    with_database(admin, &name)
}

/// `fencegate-tests host=<hostname> pid=<pid>`: who created a test database.
fn owner_tag(pid: u32) -> String {
    format!("{}{pid}", owner_prefix())
}

fn owner_prefix() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    let host = HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|h| h.trim().to_string())
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "-._".contains(*c))
            .collect()
    });
    format!("fencegate-tests host={host} pid=")
}

/// Once per run: drops test databases that earlier runs on this host left behind, i.e. those
/// whose creating process no longer exists. Databases of live processes (a concurrent run)
/// and of other hosts are never touched. Best effort: failures are ignored.
async fn sweep_leftovers(conn: &mut PgConnection) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT d.datname::text, shobj_description(d.oid, 'pg_database')
         FROM pg_database d WHERE d.datname LIKE 'fg\\_test\\_%'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    let prefix = owner_prefix();
    for (name, comment) in rows {
        let Some(pid) = comment
            .as_deref()
            .and_then(|c| c.strip_prefix(prefix.as_str()))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        let is_name = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !alive && is_name {
            let _ = conn
                .execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
                .await;
        }
    }
}

const NOT_FOUND: &str = "PostgreSQL server binaries not found: install them \
     (Debian: apt-get install postgresql) or set DATABASE_URL";

/// Starts a throwaway cluster and returns its admin URL. Runs once per test binary.
fn start_throwaway_cluster() -> String {
    let bindir = support_pg::bindir(None, NOT_FOUND);
    let root = tempfile::Builder::new()
        .prefix("fencegate-pg-")
        .tempdir()
        .expect("cannot create a temporary directory for the throwaway cluster")
        // The cluster's watchdog owns the cleanup: it must outlive this process.
        .keep();
    let settings =
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400";
    let cleanup = format!("rm -rf {}", support_pg::shell_quote(&root));
    support_pg::Cluster::new(&bindir, &root, settings, &cleanup, " or set DATABASE_URL").url()
}

/// A new SQLite file in this run's scratch directory (removed by a watchdog once this process
/// is gone, like the throwaway PostgreSQL cluster).
fn fresh_sqlite_database() -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("fencegate-sqlite-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the SQLite scratch directory");
        support_pg::watchdog(&format!("rm -rf {}", support_pg::shell_quote(&dir)), None);
        dir
    });
    format!(
        "sqlite://{}/{}.sqlite",
        dir.display(),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod unit {
    use crate::db_url::*;

    #[test]
    fn database_name_is_replaced_and_query_kept() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }

    #[test]
    fn the_server_address_is_found_and_replaced() {
        // A password may hold an `@`: the host follows the last one.
        let url = "postgres://u:p@ss@db.example:6543/app?sslmode=disable";
        assert_eq!(host_port(url), "db.example:6543");
        assert_eq!(
            with_host_port(url, "127.0.0.1:9"),
            "postgres://u:p@ss@127.0.0.1:9/app?sslmode=disable"
        );
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1/postgres"),
            "127.0.0.1:5432"
        );
        assert_eq!(
            with_host_port("postgres://h/db", "p:1"),
            "postgres://p:1/db"
        );
    }
}
