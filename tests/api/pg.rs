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

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sqlx::{Connection, Executor, PgConnection};

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
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {}: {e}", redact(admin)));
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
    .unwrap_or_else(|e| panic!("CREATE DATABASE {name} failed on {}: {e}", redact(admin)));
    // Tag the database with its owner, so a later run can drop it once this process is gone
    // (on a shared DATABASE_URL server nothing else would; the throwaway cluster goes whole).
    let _ = conn
        .execute(format!("COMMENT ON DATABASE {name} IS '{}'", owner_tag(std::process::id())).as_str())
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
        let Some(pid) = comment.as_deref().and_then(|c| c.strip_prefix(prefix.as_str())) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        let is_name = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !alive && is_name {
            let _ = conn.execute(format!("DROP DATABASE IF EXISTS {name}").as_str()).await;
        }
    }
}

/// Replaces the database name (path) of a `postgres://` URL, keeping any query string.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[authority_start..]
        .find('/')
        .map(|i| authority_start + i)
        .unwrap_or(base.len());
    format!("{}/{}{}", &base[..path_start], db, query)
}

fn redact(url: &str) -> String {
    // postgres://user:password@host -> postgres://user:***@host
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if url[s + 3..at].contains(':') => {
            let colon = s + 3 + url[s + 3..at].find(':').unwrap();
            format!("{}:***{}", &url[..colon], &url[at..])
        }
        _ => url.to_string(),
    }
}

const NOT_FOUND: &str = "PostgreSQL server binaries not found: install them \
     (Debian: apt-get install postgresql) or set DATABASE_URL";

/// Directory holding `initdb`, `pg_ctl`, `postgres`.
fn pg_bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
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

fn is_root() -> bool {
    // /proc/self is owned by the effective uid of this process (Linux), no extra dependency needed.
    use std::os::unix::fs::MetadataExt;
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false))
}

/// A command for a PostgreSQL server binary; as root it runs as the `postgres` user,
/// because initdb and pg_ctl refuse to run as root.
fn pg_command(bin: &Path) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(bin);
        cmd
    } else {
        Command::new(bin)
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("cannot bind an ephemeral port on 127.0.0.1")
        .port()
}

fn run(mut cmd: Command, what: &str, log: &Path) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    if !out.status.success() {
        let server_log = std::fs::read_to_string(log).unwrap_or_default();
        panic!(
            "{what} failed ({}):\nstdout: {}\nstderr: {}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            server_log
        );
    }
}

/// Starts a throwaway cluster and returns its admin URL. Runs once per test binary.
fn start_throwaway_cluster() -> String {
    let bindir = pg_bindir();
    let initdb = bindir.join("initdb");
    let pg_ctl = bindir.join("pg_ctl");
    if !initdb.is_file() || !pg_ctl.is_file() {
        panic!("{NOT_FOUND}");
    }

    let root = tempfile::Builder::new()
        .prefix("fencegate-pg-")
        .tempdir()
        .expect("cannot create a temporary directory for the throwaway cluster")
        // The watchdog below owns the cleanup: it must outlive this process.
        .keep();
    let data = root.join("data");
    let log = root.join("server.log");

    // Tear-down first, so that even a failed start leaves nothing behind. The watchdog is in its
    // own process group: a Ctrl-C aimed at the test run does not kill it before it cleans up.
    let stop = if is_root() {
        format!("runuser -u postgres -- {}", shell_quote(&pg_ctl))
    } else {
        shell_quote(&pg_ctl)
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {stop} -D {data} stop -m immediate >/dev/null 2>&1; rm -rf {root}",
        pid = std::process::id(),
        data = shell_quote(&data),
        root = shell_quote(&root),
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("cannot spawn the cluster watchdog (sh)");

    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:"])
            .arg(&root)
            .status()
            .expect("cannot run chown");
        assert!(
            status.success(),
            "chown of {} to postgres failed: running as root needs a `postgres` user \
             (Debian: apt-get install postgresql) or set DATABASE_URL",
            root.display()
        );
    }

    let mut cmd = pg_command(&initdb);
    cmd.arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"]);
    run(cmd, "initdb", &log);

    let port = free_port();
    let opts = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=400",
        sock = shell_quote(&root),
    );
    let mut cmd = pg_command(&pg_ctl);
    cmd.arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", "60", "-o", &opts, "start"])
        .process_group(0);
    run(cmd, "pg_ctl start", &log);

    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// A new SQLite file in this run's scratch directory (removed by a watchdog once this process
/// is gone, like the throwaway PostgreSQL cluster).
fn fresh_sqlite_database() -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fencegate-sqlite-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the SQLite scratch directory");
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; rm -rf {dir}",
            pid = std::process::id(),
            dir = shell_quote(&dir)
        );
        Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn the scratch-directory watchdog");
        dir
    });
    format!("sqlite://{}/{}.sqlite", dir.display(), uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn database_name_is_replaced_and_query_kept() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
    }
}
