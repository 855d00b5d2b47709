//! The floor of one more hop, measured in the run itself: pgbench through a relay that only
//! copies bytes (haproxy, `mode tcp`, one thread), beside pgbench straight to PostgreSQL.
//!
//! Whatever a proxy does, fencegate included, it pays at least this: two more sleeps and
//! wake-ups per request on the loopback, and the relay's own turn. At one connection that hop,
//! not the proxy's work, is most of what separates it from a client talking to PostgreSQL
//! directly, and its cost moves with the machine (0.86-0.97× of direct on 2-core VMs of one
//! kind), so the one-connection figure is read against the floor of the same run. TLS stays
//! end to end through the relay, as pgbench negotiates it with PostgreSQL.

use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

/// A running relay to the database of `db_url`; killed when dropped.
pub struct Relay {
    child: Child,
    /// `db_url` with the relay's address in place of the server's.
    pub url: String,
}

impl Relay {
    /// The relay's CPU time so far: the same hop's cost as fencegate's, without its work.
    pub fn cpu_ticks(&self) -> crate::server::CpuTicks {
        self.child
            .id()
            .map(crate::server::cpu_ticks_of)
            .unwrap_or_default()
    }
}

/// Starts haproxy in the foreground on a free loopback port, relaying to `db_url`'s server.
pub async fn start(haproxy: &Path, db_url: &str, dir: &Path) -> Result<Relay> {
    let mut url = url::Url::parse(db_url).context("the bench database URL")?;
    // libpq takes the server from the URL's authority unless `host`, `hostaddr` or `port`
    // parameters override it: the relay forwards to whichever wins, and those parameters are
    // dropped from the relay's URL, or pgbench would go around the relay. A socket directory
    // (a host that is a path, percent-encoded or not) cannot be relayed over TCP.
    let param = |name: &str| {
        url.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let socket = |h: &str| h.starts_with('/') || h.to_ascii_lowercase().starts_with("%2f");
    let host = param("hostaddr")
        .or_else(|| param("host"))
        .or_else(|| url.host_str().map(str::to_owned))
        .filter(|h| !h.is_empty() && !socket(h));
    let Some(host) = host else {
        bail!("the relay needs a database reached over TCP (a host name or address in DATABASE_URL), not a socket");
    };
    let db_port = match param("port") {
        Some(p) => p
            .parse::<u16>()
            .with_context(|| format!("the port parameter {p:?} of the bench database URL"))?,
        None => url.port().unwrap_or(5432),
    };
    // An IPv6 address goes in brackets in haproxy's `server` line as in a URL.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let server = match host.contains(':') {
        true => format!("[{host}]:{db_port}"),
        false => format!("{host}:{db_port}"),
    };
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !matches!(k.as_ref(), "host" | "hostaddr" | "port"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(kept);
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let (config, log) = (
        dir.join("relay-haproxy.cfg"),
        dir.join("relay-haproxy.stderr.log"),
    );
    std::fs::write(
        &config,
        format!(
            "global\n  maxconn 200\n  nbthread 1\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  \
             timeout server 120s\nlisten pg\n  bind 127.0.0.1:{port}\n  server pg {server}\n"
        ),
    )?;
    let mut child = Command::new(haproxy)
        .arg("-db") // foreground: the child is haproxy itself, and killing it stops the relay
        .arg("-f")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).context("haproxy's log file")?)
        .kill_on_drop(true)
        .spawn()
        .context("starting haproxy")?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if let Some(status) = child.try_wait()? {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "haproxy exited ({status}) instead of listening on {addr} (config {}): {}",
                config.display(),
                said.trim()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "haproxy did not listen on {addr} within 10 s (config {})",
                config.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    url.set_host(Some("127.0.0.1")).context("relay URL")?;
    url.set_port(Some(port))
        .map_err(|()| anyhow::anyhow!("relay URL: cannot set the port"))?;
    Ok(Relay {
        child,
        url: url.into(),
    })
}
