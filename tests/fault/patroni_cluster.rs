//! A Patroni cluster of its own for the HA-manager fault run (tests/fault/patroni.rs): one etcd
//! as the DCS (its v3 API), Patroni 3 nodes each managing a PostgreSQL bootstrapped with initdb,
//! `synchronous_mode: true`, and `patronictl` with a config file of its own. Every program runs
//! on free ports, in the run's scratch directory, in a process group of its own (daemon.rs).
//!
//! Timing: `loop_wait` 1 s, `retry_timeout` 2 s, `ttl` 5 s (Patroni wants ttl >= loop_wait +
//! 2 x retry_timeout), so a killed leader's key expires and its synchronous standby takes over
//! within about 5-6 s, instead of the 30 s of Patroni's defaults.
//!
//! With `synchronous_mode` only the synchronous standby may be promoted, so a fault is injected
//! only once [`PatroniCluster::await_healthy`] has seen one streaming (`sync` in the leader's
//! `pg_stat_replication`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sqlx::Connection;

use crate::daemon::{self, await_port, Daemon};
use crate::support_pg::{self, free_port, is_root};

/// The Patroni cluster's name (`scope`): its keys in etcd live under /service/fencegate.
pub const SCOPE: &str = "fencegate";

const PG_NOT_FOUND: &str =
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: install them \
     (Debian/Ubuntu: apt-get install postgresql) or put their directory in FAULT_PG_BINDIR";

/// One member: Patroni's REST API port, its PostgreSQL's port, its directory.
pub struct PatroniNode {
    pub name: String,
    pub pg_port: u16,
    pub api_port: u16,
    dir: PathBuf,
    patroni: PathBuf,
    daemon: Option<Daemon>,
}

impl PatroniNode {
    /// `http://127.0.0.1:API`
    pub fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    /// Admin URL straight to this member's PostgreSQL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.pg_port)
    }

    /// Starts Patroni on this member's config (`<dir>/patroni.yml`), output appended to
    /// `<dir>/patroni.log`. After a `kill -9` Patroni finds the data directory and rejoins, as a
    /// standby of the new leader (pg_rewind first if the timelines forked).
    pub fn start(&mut self) -> Result<(), String> {
        assert!(self.daemon.is_none(), "{}: Patroni is running", self.name);
        let mut cmd = Command::new(&self.patroni);
        cmd.arg(self.dir.join("patroni.yml")).env("HOME", &self.dir);
        self.daemon = Some(Daemon::spawn(&self.dir, "patroni", cmd, true)?);
        Ok(())
    }

    fn postmaster_pid_file(&self) -> PathBuf {
        self.dir.join("data").join("postmaster.pid")
    }

    /// The postmaster's pid (first line of postmaster.pid).
    fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.postmaster_pid_file())
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `kill -9` of Patroni (its process group) and of its postmaster, which Patroni starts in
    /// a session of its own. Returns the postmaster's pid.
    pub fn kill9(&mut self) -> Option<i32> {
        let postmaster = self.postmaster_pid();
        if let Some(mut patroni) = self.daemon.take() {
            patroni.kill();
        }
        if let Some(pid) = postmaster {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        // The file names a dead process now: the watchdog must not kill a reused pid.
        let _ = std::fs::remove_file(self.postmaster_pid_file());
        postmaster
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for PatroniNode {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The essentials of a member's Patroni configuration (docs/operations.md shows this text).
pub fn patroni_yaml(
    name: &str,
    api_port: u16,
    pg_port: u16,
    dir: &Path,
    bindir: &Path,
    etcd_port: u16,
) -> String {
    let dir = dir.display();
    let bindir = bindir.display();
    format!(
        r#"scope: {SCOPE}
name: {name}
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 5
    loop_wait: 1
    retry_timeout: 2
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        max_connections: 200
  initdb:
  - encoding: UTF8
  - locale: C
  - auth: trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {dir}/data
  bin_dir: {bindir}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: '{dir}'
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
watchdog:
  mode: off
"#
    )
}

/// patronictl's configuration (`patronictl -c FILE ...`): where the DCS is, and the cluster.
pub fn patronictl_yaml(etcd_port: u16) -> String {
    format!("scope: {SCOPE}\netcd3:\n  hosts: 127.0.0.1:{etcd_port}\n")
}

/// A member as `GET /cluster` reports it.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby`, `replica`
    pub role: String,
    /// `running`, `streaming`, `stopped`, `starting`, ...
    pub state: String,
}

pub struct PatroniCluster {
    pub nodes: Vec<PatroniNode>,
    etcd: Daemon,
    pub etcd_port: u16,
    /// patronictl's configuration (`-c`).
    pub ctl_config: PathBuf,
    client: reqwest::Client,
}

impl PatroniCluster {
    /// etcd, then `members` Patroni nodes (the first bootstraps with initdb, the others clone
    /// it), then waits until there is a leader and a synchronous standby.
    pub async fn start(scratch: &Path, members: usize) -> Result<PatroniCluster, String> {
        let patroni = daemon::require("patroni", "patroni");
        let etcd_bin = daemon::require("etcd", "etcd-server");
        daemon::require("patronictl", "patroni");
        let bindir = support_pg::bindir(
            std::env::var_os("FAULT_PG_BINDIR").map(PathBuf::from),
            PG_NOT_FOUND,
        );
        if is_root() {
            // The postgres user must reach its directories.
            let _ = Command::new("chmod").arg("755").arg(scratch).status();
        }

        let (etcd_port, peer_port) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(etcd_bin);
        cmd.args(["--name", "etcd0", "--data-dir"])
            .arg(scratch.join("etcd"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("etcd0={peer_url}")])
            .args(["--initial-cluster-state", "new"]);
        let mut etcd = Daemon::spawn(scratch, "etcd", cmd, false)?;
        await_port(&mut etcd, etcd_port, Duration::from_secs(30)).await?;

        let ctl_config = scratch.join("patronictl.yml");
        std::fs::write(&ctl_config, patronictl_yaml(etcd_port)).map_err(|e| e.to_string())?;

        let mut cluster = PatroniCluster {
            nodes: Vec::new(),
            etcd,
            etcd_port,
            ctl_config,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .pool_max_idle_per_host(0)
                .build()
                .expect("reqwest client"),
        };
        for i in 1..=members {
            let name = format!("pg{i}");
            let dir = scratch.join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let (api_port, pg_port) = (free_port(), free_port());
            let config = dir.join("patroni.yml");
            std::fs::write(
                &config,
                patroni_yaml(&name, api_port, pg_port, &dir, &bindir, etcd_port),
            )
            .map_err(|e| e.to_string())?;
            crate::support_pg::give_to_postgres(&dir, " (Patroni's directory)");
            let mut node = PatroniNode {
                name,
                pg_port,
                api_port,
                dir,
                patroni: patroni.clone(),
                daemon: None,
            };
            node.start()?;
            cluster.nodes.push(node);
            if i == 1 {
                // The others clone the leader once it exists.
                cluster
                    .await_primary(None, Duration::from_secs(60))
                    .await
                    .map_err(|e| format!("the first Patroni node did not bootstrap: {e}"))?;
            }
        }
        cluster.await_healthy(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    /// The members as the first answering node's `GET /cluster` reports them.
    pub async fn members(&self) -> Result<Vec<Member>, String> {
        let mut last = String::from("no node answered");
        for node in &self.nodes {
            let resp = match self
                .client
                .get(format!("{}/cluster", node.api()))
                .send()
                .await
            {
                Ok(resp) => resp,
                Err(e) => {
                    last = format!("{}: {e}", node.name);
                    continue;
                }
            };
            let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
            let members = body["members"].as_array().cloned().unwrap_or_default();
            return Ok(members
                .iter()
                .map(|m| Member {
                    name: m["name"].as_str().unwrap_or_default().to_string(),
                    role: m["role"].as_str().unwrap_or_default().to_string(),
                    state: m["state"].as_str().unwrap_or_default().to_string(),
                })
                .collect());
        }
        Err(last)
    }

    pub fn node(&self, name: &str) -> &PatroniNode {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no Patroni node {name}"))
    }

    /// `GET /primary` on a node: 200 iff it runs the leader's PostgreSQL (HAProxy's check).
    pub async fn is_primary(&self, node: &PatroniNode) -> bool {
        matches!(
            self.client.get(format!("{}/primary", node.api())).send().await,
            Ok(resp) if resp.status().as_u16() == 200
        )
    }

    /// Waits until some node other than `not` answers `/primary` 200; its name.
    pub async fn await_primary(
        &self,
        not: Option<&str>,
        limit: Duration,
    ) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            for node in &self.nodes {
                if Some(node.name.as_str()) != not
                    && node.daemon.is_some()
                    && self.is_primary(node).await
                {
                    return Ok(node.name.clone());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no Patroni node{} is primary after {limit:?}; members {:?}\n{}",
                    not.map(|n| format!(" but {n}")).unwrap_or_default(),
                    self.members().await,
                    self.logs(20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a leader whose PostgreSQL streams synchronously to a standby Patroni names
    /// `sync_standby`: only then may the leader fail. Returns (leader, synchronous standby).
    pub async fn await_healthy(&self, limit: Duration) -> Result<(String, String), String> {
        let deadline = Instant::now() + limit;
        let mut seen = String::new();
        loop {
            if let Ok(members) = self.members().await {
                let leader = members
                    .iter()
                    .find(|m| m.role == "leader" && m.state == "running");
                let sync = members.iter().find(|m| {
                    m.role == "sync_standby" && (m.state == "running" || m.state == "streaming")
                });
                if let (Some(leader), Some(sync)) = (leader, sync) {
                    let states = self.replication_states(self.node(&leader.name)).await;
                    if states.iter().any(|s| s.ends_with(":streaming/sync")) {
                        return Ok((leader.name.clone(), sync.name.clone()));
                    }
                    seen = format!("{members:?}; pg_stat_replication {states:?}");
                } else {
                    seen = format!("{members:?}");
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the Patroni cluster has no leader with a streaming synchronous standby after {limit:?} (last seen: {seen})\n{}",
                    self.logs(25)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the leader's PostgreSQL streams to member `name` (Patroni names each standby's
    /// connection after its member); returns the leader and that standby's `sync_state`.
    pub async fn await_streaming_to(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<(String, String), String> {
        let deadline = Instant::now() + limit;
        let mut seen = String::new();
        loop {
            if let Ok(members) = self.members().await {
                if let Some(leader) = members.iter().find(|m| m.role == "leader") {
                    let states = self.replication_states(self.node(&leader.name)).await;
                    let prefix = format!("{name}:streaming/");
                    if let Some(state) = states.iter().find_map(|s| s.strip_prefix(&prefix)) {
                        return Ok((leader.name.clone(), state.to_string()));
                    }
                    seen = format!("{members:?}; pg_stat_replication {states:?}");
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the leader does not stream to {name} after {limit:?} (last seen: {seen})\n{}",
                    self.logs(25)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `application_name:state/sync_state` of each standby, as `node`'s PostgreSQL sees it.
    async fn replication_states(&self, node: &PatroniNode) -> Vec<String> {
        let Ok(mut conn) = sqlx::PgConnection::connect(&node.url()).await else {
            return Vec::new();
        };
        let rows = sqlx::query_scalar(
            "SELECT application_name || ':' || state || '/' || sync_state FROM pg_stat_replication",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap_or_default();
        let _ = conn.close().await;
        rows
    }

    /// `patronictl switchover --leader LEADER --candidate CANDIDATE --force`: returns once Patroni
    /// reports the switch done (the old leader restarts as a standby afterwards).
    pub async fn switchover(&self, leader: &str, candidate: &str) -> Result<(), String> {
        let mut cmd = tokio::process::Command::new(daemon::require("patronictl", "patroni"));
        cmd.arg("-c")
            .arg(&self.ctl_config)
            .args(["switchover", "--leader", leader, "--candidate", candidate])
            .args(["--force", SCOPE])
            .stdin(std::process::Stdio::null());
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .map_err(|_| "patronictl switchover did not return within 60 s".to_string())?
            .map_err(|e| format!("cannot run patronictl: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && text.contains("Successfully switched over") {
            Ok(())
        } else {
            Err(format!(
                "patronictl switchover failed ({}):\n{text}\n{}",
                out.status,
                self.logs(20)
            ))
        }
    }

    /// `kill -9` of `name`'s Patroni and postmaster.
    pub fn kill9(&mut self, name: &str) -> Option<i32> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .and_then(PatroniNode::kill9)
    }

    /// Starts `name`'s Patroni again (after [`PatroniCluster::kill9`]).
    pub fn restart(&mut self, name: &str) -> Result<(), String> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| format!("no Patroni node {name}"))?
            .start()
    }

    /// The tail of every Patroni log and of etcd's, for a failure message.
    pub fn logs(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            out.push_str(&format!(
                "-- Patroni {} (tail) --\n{}\n",
                node.name,
                node.log_tail(n)
            ));
        }
        out.push_str(&format!(
            "-- etcd (tail) --\n{}\n",
            self.etcd.log_tail(n.min(10))
        ));
        out
    }

    /// Whether etcd exited on its own (it must survive every fault).
    pub fn etcd_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.etcd.exited()
    }
}
