//! HAProxy in front of a Patroni cluster, the usual way: TCP mode, and a health check per member
//! on Patroni's REST API (`GET /primary` is 200 only on the leader), so clients reach whichever
//! member leads now. `on-marked-down shutdown-sessions` cuts the sessions to a member that
//! stopped leading, so no client goes on talking to a demoted server.
//!
//! Runs in the foreground (`-db`) with a generated config, on a free port, as a [`Daemon`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::daemon::{self, await_port, Daemon};
use crate::patroni_cluster::PatroniCluster;

pub struct Haproxy {
    /// Where clients connect: 127.0.0.1:`port` reaches the leader's PostgreSQL.
    pub port: u16,
    pub config: PathBuf,
    daemon: Daemon,
}

/// The config (docs/operations.md shows this text): a check every 300 ms, down after 2 failed
/// checks, up after 1 good one.
pub fn config_text(port: u16, members: &[(String, u16, u16)]) -> String {
    let mut text = format!(
        "global
    maxconn 1000

defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen postgres_primary
    bind 127.0.0.1:{port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 300ms fastinter 300ms downinter 300ms fall 2 rise 1 on-marked-down shutdown-sessions
"
    );
    for (name, pg_port, api_port) in members {
        text.push_str(&format!(
            "    server {name} 127.0.0.1:{pg_port} check port {api_port}\n"
        ));
    }
    text
}

impl Haproxy {
    /// Writes the config for `cluster`'s members into `scratch`, checks it (`haproxy -c`) and
    /// starts HAProxy; returns once it listens.
    pub async fn start(scratch: &Path, cluster: &PatroniCluster) -> Result<Haproxy, String> {
        let bin = daemon::require("haproxy", "haproxy");
        let port = crate::cluster::free_port();
        let members: Vec<(String, u16, u16)> = cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.pg_port, n.api_port))
            .collect();
        let config = scratch.join("haproxy.cfg");
        std::fs::write(&config, config_text(port, &members)).map_err(|e| e.to_string())?;
        let check = Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&config)
            .output()
            .map_err(|e| format!("cannot run haproxy -c: {e}"))?;
        if !check.status.success() {
            return Err(format!(
                "haproxy -c refused {}: {}{}",
                config.display(),
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            ));
        }
        let mut cmd = Command::new(&bin);
        cmd.arg("-db").arg("-f").arg(&config);
        let mut daemon = Daemon::spawn(scratch, "haproxy", cmd, false)?;
        await_port(&mut daemon, port, Duration::from_secs(20)).await?;
        Ok(Haproxy {
            port,
            config,
            daemon,
        })
    }

    /// `Some` if HAProxy exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.daemon.exited()
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.daemon.log_tail(n)
    }
}
