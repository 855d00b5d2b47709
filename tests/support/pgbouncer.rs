//! PgBouncer in front of the test server, for the pooler tests (`#[path]`-included as
//! `pgbouncer` by tests/api): Debian's `/usr/sbin/pgbouncer`, on a free port, with its own temp
//! dir and config, run as the `postgres` user when the tests run as root (PgBouncer refuses
//! root), stopped on drop and by a watchdog if the test process is killed.
//!
//! The config is PgBouncer's defaults but for the pool mode and size: in particular no
//! `ignore_startup_parameters`, so a client that sends `options` or `extra_float_digits` is
//! refused as it would be in production. `auth_type = trust` with a userlist holding the test
//! server's user (and its password, if the URL has one, which PgBouncer then uses to log in to
//! the server). docs/operations.md shows the same file.
#![allow(dead_code)] // not every test uses every part

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support_pg::{free_port, give_to_postgres, is_root, shell_quote, watchdog};

const BINARY: &str = "/usr/sbin/pgbouncer";

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

pub struct PgBouncer {
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// The pgbouncer.ini the tests use (docs/operations.md shows it): every database of the server
/// at `host:port`, on 127.0.0.1:`listen_port`.
pub fn config(
    dir: &Path,
    server_host: &str,
    server_port: &str,
    listen_port: u16,
    mode: PoolMode,
    pool_size: u32,
) -> String {
    format!(
        "[databases]\n\
         * = host={server_host} port={server_port}\n\
         \n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {listen_port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {auth}\n\
         pool_mode = {mode}\n\
         default_pool_size = {pool_size}\n\
         max_client_conn = 200\n\
         logfile = {log}\n\
         pidfile = {pid}\n",
        auth = dir.join("userlist.txt").display(),
        mode = mode.as_str(),
        log = dir.join("pgbouncer.log").display(),
        pid = dir.join("pgbouncer.pid").display(),
    )
}

impl PgBouncer {
    /// Starts PgBouncer in front of the server of `db_url` and waits (generously) until it
    /// accepts connections. Panics with what to install when PgBouncer is missing.
    pub fn start(db_url: &str, mode: PoolMode, pool_size: u32) -> PgBouncer {
        PgBouncer::start_with(db_url, mode, pool_size, "")
    }

    /// As `start`, with more lines for the `[pgbouncer]` section (e.g. a pooler that silently
    /// drops the startup parameters it does not know: `ignore_startup_parameters = ...`).
    pub fn start_with(db_url: &str, mode: PoolMode, pool_size: u32, extra: &str) -> PgBouncer {
        assert!(
            Path::new(BINARY).is_file(),
            "{BINARY} is missing: install PgBouncer (Debian: apt-get install pgbouncer; tests/run.sh does)"
        );
        let url = url::Url::parse(db_url).expect("the test database URL");
        let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
        let port = url.port().unwrap_or(5432).to_string();
        let user = url.username().to_owned();
        let password = url.password().unwrap_or_default().to_owned();

        let dir = tempfile::Builder::new()
            .prefix("fg-pgbouncer-")
            .tempdir()
            .expect("a temp dir for PgBouncer");
        let listen_port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            config(dir.path(), &host, &port, listen_port, mode, pool_size) + extra,
        )
        .expect("write pgbouncer.ini");
        std::fs::write(
            dir.path().join("userlist.txt"),
            format!("\"{user}\" \"{password}\"\n"),
        )
        .expect("write userlist.txt");

        let mut cmd = Command::new(BINARY);
        cmd.arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        give_to_postgres(dir.path(), " (PgBouncer's directory)");
        if is_root() {
            let (uid, gid) = postgres_ids();
            cmd.uid(uid).gid(gid);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BINARY}: {e}"));
        // A killed test process leaves no PgBouncer behind.
        watchdog(
            &format!(
                "kill {} 2>/dev/null; rm -rf {}",
                child.id(),
                shell_quote(dir.path())
            ),
            None,
        );
        let mut bouncer = PgBouncer {
            port: listen_port,
            child,
            dir,
        };
        bouncer.wait_ready();
        bouncer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "PgBouncer exited at start ({status}); its log:\n{}",
                    self.log()
                );
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PgBouncer did not listen on 127.0.0.1:{} within 30 s; its log:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `db_url` with PgBouncer's address in place of the server's.
    pub fn url(&self, db_url: &str) -> String {
        crate::db_url::with_host_port(db_url, &format!("127.0.0.1:{}", self.port))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `postgres` user's uid and gid (PgBouncer refuses to run as root).
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("cannot run id");
        assert!(
            out.status.success(),
            "running as root needs a `postgres` user for PgBouncer (Debian: apt-get install postgresql)"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}
