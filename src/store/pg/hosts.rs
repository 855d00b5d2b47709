//! Host lists: libpq's multi-host database URL and `target_session_attrs`, and the check that
//! every connection fencegate opens can write.
//!
//! `postgres://h1:5432,h2:5432,[::1]:5433/db?target_session_attrs=read-write` (or the query
//! form `?host=h1,h2&port=5432,5433`, where one port applies to every host) is what
//! pg_auto_failover hands out and what libpq users write; sqlx takes one host. So the pool opens
//! its connections here ([`HostList::open`], the pool's `connector`): hosts are tried in order,
//! as libpq does, and the first whose session can write is kept; one that cannot is closed and
//! the next tried. With one host this is sqlx's own connect plus one check.
//!
//! Why every connection is checked, whatever `target_session_attrs` says: fencegate writes, and
//! a session on a standby (or with `default_transaction_read_only`) fails every write with
//! 25006 and could serve reads from a node that is no longer primary. Checking when a connection
//! is opened (one round trip, never per statement) keeps such sessions out of the pool; after a
//! failover the old primary's connections are lost or closed (`replication::keep_on_release`),
//! and the new ones find the new primary. So `any` (libpq's default), `read-write` and `primary`
//! all mean "the first host that takes writes" here; `standby`, `prefer-standby` and
//! `read-only` are refused at start, since a session they pick can never take a write. A
//! primary with `default_transaction_read_only` on is used when no host takes writes: its reads
//! are current, its writes fail with 503, and `/readyz` says why (`replication::READ_ONLY`).

use std::{fmt, future::Future, io, pin::Pin, sync::Arc, time::Duration};

use sqlx::{
    postgres::{PgConnectOptions, PgSslMode},
    ConnectOptions, Connection, PgConnection,
};

use super::{replication, tls::PgTls};
use crate::store::{Cause, StoreError};

/// libpq's `target_session_attrs`, as fencegate takes it (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Any,
    ReadWrite,
    Primary,
}

const TARGETS: &str = "any, read-write, primary (libpq's standby, prefer-standby and read-only \
                       are not accepted: fencegate writes)";

impl Target {
    fn parse(value: &str) -> anyhow::Result<Target> {
        match value {
            "any" => Ok(Target::Any),
            "read-write" => Ok(Target::ReadWrite),
            "primary" => Ok(Target::Primary),
            "standby" | "prefer-standby" | "read-only" => anyhow::bail!(
                "target_session_attrs={value} in the database URL picks a session that cannot write, and fencegate \
                 writes: use target_session_attrs=read-write (or primary, or any: fencegate keeps only sessions \
                 that can write either way)"
            ),
            other => anyhow::bail!(
                "target_session_attrs={other} in the database URL is not a value fencegate knows: use one of {TARGETS}"
            ),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Target::Any => "any",
            Target::ReadWrite => "read-write",
            Target::Primary => "primary",
        }
    }
}

/// One entry of the host list: `None` keeps what the (first-host) connect options say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    host: Option<String>,
    port: Option<u16>,
}

impl Host {
    fn apply(&self, base: &PgConnectOptions, tls_mode: PgSslMode) -> PgConnectOptions {
        let mut opts = base.clone();
        if let Some(port) = self.port {
            opts = opts.port(port);
        }
        if let Some(host) = &self.host {
            if host.starts_with('/') {
                // libpq: no TLS over a Unix socket (tls.rs).
                opts = opts.socket(host).ssl_mode(PgSslMode::Disable);
            } else {
                opts = opts.host(host).ssl_mode(tls_mode);
            }
        }
        opts
    }

    /// `host:port`, `[::1]:5432` or the socket directory, as an error names it.
    fn shown(opts: &PgConnectOptions) -> String {
        if let Some(socket) = opts.get_socket() {
            return format!("{}:{}", socket.display(), opts.get_port());
        }
        let host = opts.get_host();
        if host.contains(':') {
            format!("[{host}]:{}", opts.get_port())
        } else {
            format!("{host}:{}", opts.get_port())
        }
    }
}

/// Where fencegate's connections go: the hosts in order, and the target.
#[derive(Debug)]
pub struct HostList {
    hosts: Vec<Host>,
    target: Target,
    /// libpq's `connect_timeout` (seconds), per host: a host that drops packets would
    /// otherwise hold up the ones after it.
    per_host: Option<Duration>,
    tls: PgTls,
}

/// What one host was found to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    InRecovery,
    ReadOnly,
    Failed(String),
}

/// No host gave a session that can write. Carried inside `sqlx::Error::Io`, so the pool
/// bubbles it up (or retries, when every host refused the connection) and readiness can say
/// which case it is.
#[derive(Debug)]
pub struct NoWritableHost {
    target: Target,
    tried: Vec<(String, Found)>,
}

impl fmt::Display for NoWritableHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no host matched target_session_attrs={} (",
            self.target.name()
        )?;
        for (i, (host, found)) in self.tried.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match found {
                Found::InRecovery => write!(f, "{host}: in recovery (a standby)")?,
                Found::ReadOnly => {
                    write!(f, "{host}: read-only (default_transaction_read_only is on)")?
                }
                Found::Failed(why) => write!(f, "{host}: {why}")?,
            }
        }
        f.write_str(")")
    }
}

impl std::error::Error for NoWritableHost {}

impl NoWritableHost {
    /// Some host answered, and none can write: a standby, or a primary with writes switched
    /// off (the others could not be reached). What readiness says then (the hosts go to the log only: `/readyz` is open).
    fn not_ready(&self) -> Option<String> {
        let standbys = self
            .tried
            .iter()
            .filter(|(_, f)| *f == Found::InRecovery)
            .count();
        let read_only = self
            .tried
            .iter()
            .filter(|(_, f)| *f == Found::ReadOnly)
            .count();
        if standbys + read_only == 0 {
            return None; // none answered: the database cannot be reached, not "not primary"
        }
        Some(match (standbys, read_only) {
            (_, 0) => replication::IN_RECOVERY.to_owned(),
            (0, _) => replication::READ_ONLY.to_owned(),
            _ => format!(
                "no host of the database URL takes writes: {standbys} in recovery (a standby), {read_only} with \
                 default_transaction_read_only on; fencegate becomes ready when one takes writes"
            ),
        })
    }

    /// No host that answered can write, and none of them is merely read-only: standbys only
    /// (start-up then waits for a promotion).
    pub fn all_in_recovery(&self) -> bool {
        !self.tried.iter().any(|(_, f)| *f == Found::ReadOnly)
    }
}

/// The `NoWritableHost` inside a connection error, if that is what it is.
pub fn no_writable_host(err: &sqlx::Error) -> Option<&NoWritableHost> {
    match err {
        sqlx::Error::Io(e) => e.get_ref()?.downcast_ref::<NoWritableHost>(),
        _ => None,
    }
}

/// For readiness: a connection error that means "every host answered, none takes writes"
/// becomes `NotReady` with fencegate's own words; anything else is kept.
pub fn readiness(err: StoreError) -> StoreError {
    if let StoreError::Unavailable(Cause::Database { err: db, .. }) = &err {
        if let Some(why) = no_writable_host(db).and_then(NoWritableHost::not_ready) {
            tracing::warn!(error = %db, "not ready");
            return StoreError::NotReady(why);
        }
    }
    err
}

/// What the first connection at start-up found.
pub enum AtStart {
    Writable,
    /// Every host is a standby: `serve` starts, not ready, and migrates once one is promoted.
    Standby,
    /// A host answered, none takes writes, not all standbys (`default_transaction_read_only`).
    ReadOnly,
}

/// Opens (and gives back) one connection through the pool: whether a host takes writes, and
/// the connection error otherwise (the database cannot be reached: start-up fails with it).
pub async fn at_start(pool: &sqlx::PgPool) -> Result<AtStart, sqlx::Error> {
    match pool.acquire().await {
        Ok(conn) => {
            drop(conn);
            Ok(AtStart::Writable)
        }
        Err(e) => match no_writable_host(&e) {
            Some(none) if none.not_ready().is_some() => Ok(if none.all_in_recovery() {
                AtStart::Standby
            } else {
                AtStart::ReadOnly
            }),
            _ => Err(e),
        },
    }
}

/// The authority of a `postgres://` URL split into its user part and its host entries.
fn split_authority(url: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme, "postgres" | "postgresql") {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    Some((scheme, user, hosts, tail))
}

/// `h`, `h:5432`, `[::1]`, `[::1]:5432`, or empty (the default host).
fn parse_entry(entry: &str) -> anyhow::Result<Host> {
    let (host, port) = if let Some(v6) = entry.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or_else(|| {
            anyhow::anyhow!("host \"{entry}\" in the database URL has no closing ]")
        })?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                anyhow::anyhow!("host \"{entry}\" in the database URL: expected :PORT after ]")
            })?),
        };
        (addr.to_owned(), port)
    } else {
        match entry.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (entry.to_owned(), None),
        }
    };
    let host = percent_decode(&host);
    Ok(Host {
        host: (!host.is_empty()).then_some(host),
        port: port.map(|p| parse_port(p, entry)).transpose()?,
    })
}

fn parse_port(port: &str, of: &str) -> anyhow::Result<u16> {
    port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        anyhow::anyhow!("invalid port \"{port}\" for \"{of}\" in the database URL: a port is a number from 1 to 65535")
    })
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Splits a libpq URL with a host list into a URL of its first host (for `tls::options`, which
/// reads every other parameter) and the list. A URL with one host comes back unchanged but for
/// `target_session_attrs` and `connect_timeout`, which sqlx does not read.
pub fn split(url: &str) -> anyhow::Result<(String, Vec<Host>, Target, Option<Duration>)> {
    let shown = crate::redact::redact_url(url);
    let Some((scheme, user, authority_hosts, tail)) = split_authority(url) else {
        return Ok((url.to_owned(), vec![no_override()], Target::Any, None));
    };
    let mut hosts: Vec<Host> = authority_hosts
        .split(',')
        .map(parse_entry)
        .collect::<anyhow::Result<_>>()
        .map_err(|e| anyhow::anyhow!("{e} ({shown})"))?;
    let first = authority_hosts.split(',').next().unwrap_or("");
    let single = format!("{scheme}://{user}{first}{tail}");
    let mut parsed = url::Url::parse(&single)
        .map_err(|e| anyhow::anyhow!("invalid database URL {shown}: {e}"))?;

    let mut target = Target::Any;
    let mut per_host = None;
    let (mut q_hosts, mut q_ports) = (None::<Vec<String>>, None::<Vec<String>>);
    let mut kept = Vec::new();
    for (k, v) in parsed.query_pairs() {
        match k.as_ref() {
            "target_session_attrs" => target = Target::parse(&v)?,
            "connect_timeout" => {
                let secs: u64 = v.trim().parse().map_err(|_| {
                    anyhow::anyhow!(
                        "connect_timeout={v} in the database URL is not a number of seconds"
                    )
                })?;
                // libpq: 0 means wait forever; 1 is taken as 2.
                per_host = (secs > 0).then(|| Duration::from_secs(secs.max(2)));
            }
            "host" if v.contains(',') => q_hosts = Some(v.split(',').map(str::to_owned).collect()),
            "port" if v.contains(',') => q_ports = Some(v.split(',').map(str::to_owned).collect()),
            _ => kept.push((k.into_owned(), v.into_owned())),
        }
    }
    if let Some(list) = &q_hosts {
        // The query's host list wins over the URL's, as in libpq.
        hosts = list
            .iter()
            .map(|h| Host {
                host: (!h.is_empty()).then(|| h.clone()),
                port: None,
            })
            .collect();
        if let Some(first) = list.first() {
            kept.push(("host".into(), first.clone()));
        }
    }
    if let Some(ports) = &q_ports {
        let ports: Vec<u16> = ports
            .iter()
            .map(|p| parse_port(p, "port"))
            .collect::<anyhow::Result<_>>()?;
        if ports.len() != hosts.len() {
            anyhow::bail!(
                "the database URL gives {} ports for {} hosts: give one port for every host, or one for all",
                ports.len(),
                hosts.len()
            );
        }
        for (host, port) in hosts.iter_mut().zip(&ports) {
            host.port = Some(*port);
        }
        kept.push(("port".into(), ports[0].to_string()));
    }
    if let Some(port) = kept
        .iter()
        .find(|(k, _)| k == "port")
        .map(|(_, p)| p.clone())
        .filter(|_| q_ports.is_none())
    {
        // One port for all hosts (the query's `port=`), unless an entry names its own.
        let port = parse_port(&port, "port")?;
        for host in hosts.iter_mut().filter(|h| h.port.is_none()) {
            host.port = Some(port);
        }
    }
    parsed.query_pairs_mut().clear().extend_pairs(kept);
    if parsed.query() == Some("") {
        parsed.set_query(None);
    }
    if hosts.len() == 1 {
        hosts = vec![no_override()];
    }
    Ok((parsed.to_string(), hosts, target, per_host))
}

fn no_override() -> Host {
    Host {
        host: None,
        port: None,
    }
}

/// The future a connector returns (`PgPoolOptions::connector`, vendor/sqlx-core).
pub type Opening<'o> = Pin<Box<dyn Future<Output = Result<PgConnection, sqlx::Error>> + Send + 'o>>;

impl HostList {
    pub fn new(
        hosts: Vec<Host>,
        target: Target,
        per_host: Option<Duration>,
        tls: PgTls,
    ) -> HostList {
        HostList {
            hosts,
            target,
            per_host,
            tls,
        }
    }

    /// The pool's connector: every new connection opens through [`HostList::open`].
    /// `or_standby`: when no host takes writes, the first that answered is taken anyway (the
    /// start-up pool, which only reads on a standby: catalog, guards; never a request's pool).
    pub fn connector(
        self: &Arc<Self>,
        or_standby: bool,
    ) -> impl for<'o> Fn(&'o PgConnectOptions) -> Opening<'o> {
        let hosts = self.clone();
        move |base| {
            let hosts = hosts.clone();
            Box::pin(async move { hosts.open(base, or_standby).await })
        }
    }

    /// A connection to the first host, in order, whose session can write (module docs). With
    /// one host, a connection failure is sqlx's own error, as without a list.
    pub async fn open(
        &self,
        base: &PgConnectOptions,
        or_standby: bool,
    ) -> Result<PgConnection, sqlx::Error> {
        let mut tried = Vec::with_capacity(self.hosts.len());
        let mut fallback = None;
        let mut all_refused = true;
        for host in &self.hosts {
            let opts = host.apply(base, base.get_ssl_mode());
            let shown = Host::shown(&opts);
            let connecting = opts.connect();
            let connected = match self.per_host {
                Some(limit) => tokio::time::timeout(limit, connecting)
                    .await
                    .unwrap_or_else(|_| {
                        Err(sqlx::Error::Io(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no answer within connect_timeout={}", limit.as_secs()),
                        )))
                    }),
                None => connecting.await,
            };
            let mut conn = match connected {
                Ok(conn) => conn,
                Err(e) if self.hosts.len() == 1 => return Err(e),
                Err(e) => {
                    all_refused &= matches!(&e, sqlx::Error::Io(io) if io.kind() == io::ErrorKind::ConnectionRefused);
                    tried.push((
                        shown,
                        Found::Failed(self.tls.describe(&e, || e.to_string())),
                    ));
                    continue;
                }
            };
            all_refused = false;
            match sqlx::query_as::<_, (bool, bool)>(replication::WRITABLE)
                .fetch_one(&mut conn)
                .await
            {
                Ok((false, false)) => return Ok(conn),
                Ok((in_recovery, _)) => {
                    // A read-only primary is still the primary: its reads are current, its
                    // writes fail (503) and readiness says why; kept if no host takes writes.
                    // A standby only for start-up's reads.
                    if (or_standby || !in_recovery) && fallback.is_none() {
                        fallback = Some(conn);
                    } else {
                        let _ = conn.close().await;
                    }
                    let found = if in_recovery {
                        Found::InRecovery
                    } else {
                        Found::ReadOnly
                    };
                    tracing::debug!(host = %shown, ?found, "skipping a database host whose session cannot write");
                    tried.push((shown, found));
                }
                Err(e) if self.hosts.len() == 1 => return Err(e),
                Err(e) => tried.push((shown, Found::Failed(e.to_string()))),
            }
        }
        if let Some(conn) = fallback {
            return Ok(conn);
        }
        let kind = if all_refused {
            // The pool retries these (a server starting up), as it does for one host.
            io::ErrorKind::ConnectionRefused
        } else {
            io::ErrorKind::Other
        };
        Err(sqlx::Error::Io(io::Error::new(
            kind,
            NoWritableHost {
                target: self.target,
                tried,
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts_of(url: &str) -> Vec<(Option<String>, Option<u16>)> {
        split(url)
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .1
            .into_iter()
            .map(|h| (h.host, h.port))
            .collect()
    }

    #[test]
    fn a_libpq_host_list_is_split_in_order_with_ports_and_ipv6() {
        let (single, hosts, target, _) = split(
            "postgres://u:pw@127.0.0.1:5433,db2,[::1]:5435/app?target_session_attrs=read-write&sslmode=disable",
        )
        .unwrap();
        assert_eq!(single, "postgres://u:pw@127.0.0.1:5433/app?sslmode=disable");
        assert_eq!(target, Target::ReadWrite);
        let hosts: Vec<_> = hosts.into_iter().map(|h| (h.host, h.port)).collect();
        assert_eq!(
            hosts,
            vec![
                (Some("127.0.0.1".into()), Some(5433)),
                (Some("db2".into()), None),
                (Some("::1".into()), Some(5435)),
            ]
        );
        // One host: the URL is kept (but for what sqlx does not read), and nothing overridden.
        assert_eq!(hosts_of("postgres://u@h:1/db"), vec![(None, None)]);
        assert_eq!(
            split("postgres://u@h/db?target_session_attrs=primary&connect_timeout=3")
                .unwrap()
                .0,
            "postgres://u@h/db"
        );
    }

    #[test]
    fn query_host_and_port_lists_follow_libpq() {
        assert_eq!(
            hosts_of("postgres:///db?host=a,b&port=1,2"),
            vec![(Some("a".into()), Some(1)), (Some("b".into()), Some(2))]
        );
        // One port for every host.
        assert_eq!(
            hosts_of("postgres:///db?host=a,/run/postgresql&port=7"),
            vec![
                (Some("a".into()), Some(7)),
                (Some("/run/postgresql".into()), Some(7))
            ]
        );
        let err = split("postgres:///db?host=a,b,c&port=1,2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 ports for 3 hosts"), "{err}");
    }

    #[test]
    fn bad_values_name_what_is_allowed() {
        let err = split("postgres://a,b/db?target_session_attrs=master")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("target_session_attrs=master") && err.contains("read-write"),
            "{err}"
        );
        let err = split("postgres://a,b/db?target_session_attrs=standby")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot write"), "{err}");
        let err = split("postgres://u:secret@a:1,b:x/db")
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid port \"x\""), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}
