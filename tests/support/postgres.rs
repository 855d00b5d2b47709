//! Shared by the test binaries (`#[path]`-included as `support_pg` by tests/api, tests/sqlite and
//! tests/fault): a throwaway PostgreSQL cluster, and the detached watchdog that cleans up after a
//! test process even if it is killed.
//!
//! A cluster is initdb + pg_ctl on a free port in a directory of its own, as the `postgres` user
//! when run as root (initdb and pg_ctl refuse to run as root). It is driven synchronously with
//! `std::process`; async callers turn the returned commands into `tokio::process::Command`s.
#![allow(dead_code)] // each test binary uses a different part

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// Directory holding `initdb`, `pg_ctl`, `postgres`: `preset` if given, else pg_config's, else the
/// newest /usr/lib/postgresql/<major>/bin. Panics with `not_found` (what to install) otherwise.
pub fn bindir(preset: Option<PathBuf>, not_found: &str) -> PathBuf {
    let has_initdb = |dir: &PathBuf| dir.join("initdb").is_file();
    let pg_config = || {
        let out = Command::new("pg_config").arg("--bindir").output().ok()?;
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (out.status.success() && has_initdb(&dir)).then_some(dir)
    };
    // Debian/Ubuntu layout: /usr/lib/postgresql/<major>/bin, newest major wins.
    let debian = || {
        let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let major: u32 = entry
                    .file_name()
                    .to_str()?
                    .split('.')
                    .next()?
                    .parse()
                    .ok()?;
                let bin = entry.path().join("bin");
                has_initdb(&bin).then_some((major, bin))
            })
            .collect();
        candidates.sort();
        candidates.pop().map(|(_, bin)| bin)
    };
    match preset.or_else(pg_config).or_else(debian) {
        Some(dir)
            if ["initdb", "pg_ctl", "postgres"]
                .iter()
                .all(|b| dir.join(b).is_file()) =>
        {
            dir
        }
        Some(dir) => panic!("{not_found} (looked in {})", dir.display()),
        None => panic!("{not_found}"),
    }
}

pub fn is_root() -> bool {
    // /proc/self is owned by the effective uid of this process (Linux), no extra dependency needed.
    use std::os::unix::fs::MetadataExt;
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    })
}

/// A command for a PostgreSQL server binary; as root it runs as the `postgres` user,
/// because initdb and pg_ctl refuse to run as root.
pub fn pg_command(bin: &Path) -> Command {
    let mut cmd = if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(bin);
        cmd
    } else {
        Command::new(bin)
    };
    cmd.stdin(Stdio::null());
    cmd
}

pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// A port on 127.0.0.1 that nothing listens on now, for a server a test starts later (and may
/// restart on the same port). It is chosen *below* the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port from that range (what binding port 0 gives) can be
/// taken at any moment as the local end of some outbound connection — the test's own clients,
/// a pool's reconnects — and the server then fails with "Address already in use". Ports are
/// never handed out twice by one test process.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let (lo, hi) = outside_ephemeral_range();
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), lo..hi);
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {lo}..{hi} after 1000 tries")
}

/// Ports [lo, hi) that the kernel never picks for an outbound connection: below the ephemeral
/// range if there is room (at least 5000 ports above 10000), otherwise above it.
fn outside_ephemeral_range() -> (u16, u16) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|n| n.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    match range {
        (low, _) if low >= 15000 => (10000, low as u16),
        (_, high) if high <= 60000 => (high as u16 + 1, 65535),
        // The whole space is ephemeral: nothing is safe, take the lower part and hope.
        _ => (10000, 20000),
    }
}

/// Spawns a detached `sh` that waits until this test process is gone, then runs the shell commands
/// `cleanup`: it cleans up even after a SIGKILL. With `Some(pid)` it exits without cleaning up as
/// soon as process `pid` is gone (the test cleaned up itself, and the pid may be reused). The
/// watchdog is in its own process group: a Ctrl-C aimed at the test run does not kill it before it
/// cleans up.
pub fn watchdog(cleanup: &str, unless_gone: Option<u32>) {
    let early = unless_gone
        .map(|pid| format!("kill -0 {pid} 2>/dev/null || exit 0; "))
        .unwrap_or_default();
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do {early}sleep 1; done; {cleanup}",
        pid = std::process::id()
    );
    // Never waited for: it must outlive this process.
    #[allow(clippy::zombie_processes)]
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("cannot spawn a watchdog (sh)");
}

/// The outcome of running a PostgreSQL command: on failure, what it said and the server log's tail.
pub fn check(what: &str, out: std::io::Result<Output>, log: &Path) -> Result<(), String> {
    let out = out.map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let server_log = std::fs::read_to_string(log).unwrap_or_default();
    let tail: String = server_log
        .lines()
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    Err(format!(
        "{what} failed ({}):\nstdout: {}\nstderr: {}\nserver log (tail):\n{tail}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    ))
}

/// Before a cluster is made in `dir`: the watchdog that stops it (and runs `cleanup`) once this
/// process is gone, set up first so that even a failed start leaves nothing behind; and, as
/// root, `dir` handed to the `postgres` user. Returns (pg_ctl, data directory, server log).
fn prepare(bindir: &Path, dir: &Path, cleanup: &str, hint: &str) -> (PathBuf, PathBuf, PathBuf) {
    let pg_ctl = bindir.join("pg_ctl");
    let data = dir.join("data");
    let log = dir.join("server.log");
    let stop = if is_root() {
        format!("runuser -u postgres -- {}", shell_quote(&pg_ctl))
    } else {
        shell_quote(&pg_ctl)
    };
    watchdog(
        &format!(
            "{stop} -D {} stop -m immediate >/dev/null 2>&1; {cleanup}",
            shell_quote(&data)
        ),
        None,
    );
    give_to_postgres(dir, hint);
    (pg_ctl, data, log)
}

/// As root, hands `dir` (recursively) to the `postgres` user, which the server binaries (and
/// PgBouncer and Patroni) are run as; otherwise does nothing. `hint` ends the failure message.
pub fn give_to_postgres(dir: &Path, hint: &str) {
    if !is_root() {
        return;
    }
    let status = Command::new("chown")
        .args(["-R", "postgres:"])
        .arg(dir)
        .status()
        .expect("cannot run chown");
    assert!(
        status.success(),
        "chown of {} to postgres failed: running as root needs a `postgres` user \
         (Debian: apt-get install postgresql){hint}",
        dir.display()
    );
}

/// A cluster in `dir` (`dir/data`, `dir/server.log`, the socket), listening on 127.0.0.1:`port`,
/// the same port after every restart.
pub struct Cluster {
    pub port: u16,
    pub log: PathBuf,
    data: PathBuf,
    pg_ctl: PathBuf,
    opts: String,
}

impl Cluster {
    /// initdb + start on a free port; panics with what went wrong. `settings`: server options
    /// (`-c name=value ...`). Once this process is gone, a watchdog stops the cluster and runs
    /// `cleanup` (shell). `hint` ends the message when root has no `postgres` user to run it as.
    pub fn new(bindir: &Path, dir: &Path, settings: &str, cleanup: &str, hint: &str) -> Cluster {
        let (pg_ctl, data, log) = prepare(bindir, dir, cleanup, hint);

        let mut cmd = pg_command(&bindir.join("initdb"));
        cmd.arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        check("initdb", cmd.output(), &log).unwrap_or_else(|e| panic!("{e}"));

        let port = free_port();
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} {settings}",
            shell_quote(dir)
        );
        let cluster = Cluster {
            port,
            log,
            data,
            pg_ctl,
            opts,
        };
        check(
            "pg_ctl start",
            cluster.start_command().output(),
            &cluster.log,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        cluster
    }

    /// A hot standby of the server on 127.0.0.1:`source_port` (which may be a proxy in front of
    /// it: the standby then streams through that proxy), made with `pg_basebackup -R` into
    /// `dir/data` and started; `settings` as for [`Cluster::new`]. Once this process is gone, a
    /// watchdog stops it and runs `cleanup`. Panics with what went wrong.
    pub fn standby_of(
        bindir: &Path,
        dir: &Path,
        source_port: u16,
        settings: &str,
        cleanup: &str,
    ) -> Cluster {
        std::fs::create_dir_all(dir).expect("create the standby's directory");
        let (pg_ctl, data, log) = prepare(bindir, dir, cleanup, "");
        let mut cmd = pg_command(&bindir.join("pg_basebackup"));
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &source_port.to_string(),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
            "-D",
        ])
        .arg(&data);
        check("pg_basebackup", cmd.output(), &log).unwrap_or_else(|e| panic!("{e}"));
        let port = free_port();
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} {settings}",
            shell_quote(dir)
        );
        let cluster = Cluster {
            port,
            log,
            data,
            pg_ctl,
            opts,
        };
        check(
            "pg_ctl start (standby)",
            cluster.start_command().output(),
            &cluster.log,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        cluster
    }

    /// `pg_ctl promote -w`: the standby ends recovery and becomes a primary.
    pub fn promote_command(&self) -> Command {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "promote"]);
        cmd
    }

    /// Admin URL (database `postgres`) straight to the server.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl start -w`: done once the server accepts connections (after crash recovery).
    pub fn start_command(&self) -> Command {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "-o", &self.opts, "start"]);
        // The postmaster outlives pg_ctl: keep it out of our process group and Ctrl-C.
        cmd.process_group(0);
        cmd
    }

    /// `pg_ctl stop -m <mode>`; `immediate` is a crash: every server process quits at once, no
    /// checkpoint, and the next start runs crash recovery.
    pub fn stop_command(&self, mode: &str) -> Command {
        let mut cmd = pg_command(&self.pg_ctl);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "30", "stop", "-m", mode]);
        cmd
    }
}

/// Certificates for TLS tests, made with the `openssl` command: a CA, a server certificate it
/// signed for `localhost` and 127.0.0.1 (not 127.0.0.2), a client certificate it signed for
/// the user `client_cn`, and a second, unrelated CA that signed nothing here. EC P-256 keys,
/// unencrypted PEM, valid for two days.
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
}

impl TlsFiles {
    /// Writes the files into `dir` (created). Panics, saying what to install, without `openssl`.
    pub fn make(dir: &Path, client_cn: &str) -> TlsFiles {
        std::fs::create_dir_all(dir).expect("create the certificates' directory");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output();
            match out {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    panic!("the `openssl` command is needed to make test certificates: install it (Debian: apt-get install openssl)")
                }
                Err(e) => panic!("cannot run openssl {args:?}: {e}"),
                Ok(out) if !out.status.success() => {
                    panic!(
                        "openssl {args:?} failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )
                }
                Ok(_) => {}
            }
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, cn) in [
            ("ca", "fencegate test CA"),
            ("other-ca", "unrelated test CA"),
        ] {
            let (key, crt, subj) = (
                format!("{name}.key"),
                format!("{name}.crt"),
                format!("/CN={cn}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&args);
        }
        let leaf = |name: &str, cn: &str, ext: &str| {
            let (key, csr, crt, subj, ext_file) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("/CN={cn}"),
                format!("{name}.ext"),
            );
            std::fs::write(dir.join(&ext_file), ext).expect("write an extensions file");
            let mut args = vec!["req", "-new"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(&args);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &format!("{}", 1000 + name.len()),
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext_file,
            ]);
        };
        leaf(
            "server",
            "localhost",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
             subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        );
        leaf("client", client_cn, "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n");
        for key in ["ca.key", "other-ca.key", "server.key", "client.key"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(key), std::fs::Permissions::from_mode(0o600))
                .expect("chmod 0600 a key");
        }
        TlsFiles {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            other_ca: dir.join("other-ca.crt"),
        }
    }

    /// Server options (for [`Cluster::new`]'s `settings`) turning TLS on with these files, client
    /// certificates checked against the CA, and `hba` as the whole of pg_hba.conf (written to
    /// `hba_file`). The files must be in the cluster's directory, so that it is handed to the
    /// `postgres` user with them (the server refuses a key others can read).
    pub fn server_settings(&self, hba_file: &Path, hba: &str) -> String {
        std::fs::write(hba_file, hba).expect("write pg_hba.conf");
        format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={} -c hba_file={}",
            shell_quote(&self.server_cert),
            shell_quote(&self.server_key),
            shell_quote(&self.ca),
            shell_quote(hba_file)
        )
    }
}

impl Cluster {
    /// A URL to this cluster through its Unix socket in `dir` (no TLS there: local connections).
    pub fn socket_url(&self, dir: &Path, database: &str) -> String {
        format!(
            "postgres:///{database}?host={}&port={}&user=postgres",
            dir.display(),
            self.port
        )
    }
}
