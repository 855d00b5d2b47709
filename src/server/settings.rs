//! `[server]` as written in the config file: the listener, the connection caps and timeouts
//! (`conn`, `slots`), HTTP/2's limits, the edge's bounds on requests (`http`), and TLS.
//! One table in the file, so one struct; `[server.tls]` is [`TlsSettings`], beside `tls`.

use std::{net::SocketAddr, time::Duration};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::tls::TlsSettings;

/// `[server]`: the listener, its connections and the requests on them.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on (`FENCEGATE_LISTEN`, `--listen`).
    pub listen: String,
    /// Largest accepted request body; larger bodies get 413.
    pub body_limit_bytes: usize,
    /// A request that takes longer is answered 503 (its write may still commit: retry with the
    /// same token, which is safe because fenced writes are idempotent under one token).
    pub request_timeout_ms: u64,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish before the process exits.
    pub shutdown_grace_ms: u64,
    /// Requests handled at once; more are shed with 503 + Retry-After (bounded memory and
    /// latency under overload instead of an unbounded queue).
    pub max_in_flight: usize,
    /// Threads running the HTTP server and database I/O. 0 = automatic: half the CPUs, at
    /// least one (see [`ServerSettings::threads`]).
    pub worker_threads: usize,
    /// A connection that has started a request but not finished sending its headers within
    /// this long is closed.
    pub header_timeout_ms: u64,
    /// A request body not fully received within this long (from the end of its headers) is
    /// answered 408 and its connection closed.
    pub body_timeout_ms: u64,
    /// After a body's first second, it must keep arriving at this many bytes a second on
    /// average, else 408 and the connection closed: a stalled or trickled body is cut in
    /// seconds, not at `body_timeout_ms`. 0: no minimum rate.
    pub min_body_rate_bytes_per_s: u64,
    /// A keep-alive connection with no request in progress is closed after this long.
    pub idle_timeout_ms: u64,
    /// A response the client does not read (no byte written for this long) closes the
    /// connection, freeing what the response held.
    pub write_timeout_ms: u64,
    /// Open client connections at most. At the cap, a new connection closes the one that has
    /// made no progress the longest among those not handling a request; if every connection is
    /// handling one, it waits in the listen backlog.
    pub max_connections: usize,
    /// Open connections from one peer IP address at most; a connection beyond it is closed at
    /// once. 0: no per-client cap.
    pub max_connections_per_client: usize,
    /// Request body bytes buffered at once across all requests; a body that would exceed it is
    /// answered 503 + Retry-After.
    pub max_buffered_bytes: usize,
    /// Origins (`https://app.example`) allowed to call fencegate from a browser (CORS). Empty:
    /// no CORS headers at all, so browsers refuse cross-origin reads and preflighted requests.
    pub cors_origins: Vec<String>,
    /// HTTP/2: streams (requests) open at once on one connection; more are refused by the
    /// protocol (the client waits or retries). Each still takes an in-flight slot.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list of a request (decoded names and values, plus 32 bytes per
    /// field); larger requests are refused.
    pub http2_max_header_list_bytes: u32,
    /// HTTP/2: bytes of responses one connection's client has not read yet (a zero or tiny
    /// flow-control window holds them in fencegate's memory); past it, new streams are refused
    /// (REFUSED_STREAM) until it reads. A connection that makes no room for them for
    /// `write_timeout_ms` is closed.
    pub http2_max_unread_bytes_per_connection: usize,
    /// HTTP/2: the same, across all connections.
    pub http2_max_unread_bytes: usize,
    /// `[server.tls]`: HTTPS (absent: plain HTTP).
    pub tls: Option<TlsSettings>,
}

impl ServerSettings {
    /// `listen`, parsed.
    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen.parse().with_context(|| {
            format!("server.listen / FENCEGATE_LISTEN / --listen must be IP:PORT, e.g. 127.0.0.1:8080 (got {:?})", self.listen)
        })
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    /// Refuses settings that cannot work, naming the one to fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        if self.body_limit_bytes == 0 {
            bail!("server.body_limit_bytes must be at least 1");
        }
        if self.worker_threads > 1024 {
            bail!(
                "server.worker_threads must be at most 1024 (0 = automatic), got {}",
                self.worker_threads
            );
        }
        if self.max_in_flight == 0 {
            bail!("server.max_in_flight must be at least 1");
        }
        if self.request_timeout_ms == 0 {
            bail!("server.request_timeout_ms must be at least 1");
        }
        for (name, ms) in [
            ("header_timeout_ms", self.header_timeout_ms),
            ("body_timeout_ms", self.body_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("write_timeout_ms", self.write_timeout_ms),
        ] {
            if ms == 0 {
                bail!("server.{name} must be at least 1");
            }
        }
        if self.max_connections == 0 {
            bail!("server.max_connections must be at least 1");
        }
        if self.http2_max_concurrent_streams == 0 {
            bail!("server.http2_max_concurrent_streams must be at least 1");
        }
        if self.http2_max_header_list_bytes < 1024 {
            bail!("server.http2_max_header_list_bytes must be at least 1024");
        }
        if self.http2_max_unread_bytes_per_connection == 0 {
            bail!("server.http2_max_unread_bytes_per_connection must be at least 1");
        }
        if self.http2_max_unread_bytes < self.http2_max_unread_bytes_per_connection {
            bail!("server.http2_max_unread_bytes ({}) must be at least server.http2_max_unread_bytes_per_connection ({})",
                self.http2_max_unread_bytes, self.http2_max_unread_bytes_per_connection);
        }
        if self.max_buffered_bytes < self.body_limit_bytes {
            bail!("server.max_buffered_bytes ({}) must be at least server.body_limit_bytes ({}): one largest body must fit",
                self.max_buffered_bytes, self.body_limit_bytes);
        }
        for origin in &self.cors_origins {
            if axum::http::HeaderValue::from_str(origin).is_err()
                || !origin.contains("://")
                || origin.ends_with('/')
            {
                bail!("server.cors_origins: {origin:?} is not an origin (scheme://host[:port], no path)");
            }
        }
        Ok(())
    }

    /// The runtime's worker threads. Automatic is half the CPUs because fencegate's work per
    /// request is small next to the database's, which usually shares the host, and every extra
    /// idle thread costs cross-thread wake-ups: on 2 CPUs, one thread instead of two cut CPU
    /// per lone write from about 160 µs to 110 µs and raised 1-connection writes/s from about
    /// 0.56x to 0.78x pgbench's, with 64-connection throughput unchanged (see bench/RESULTS.md).
    /// One thread is run by tokio's current-thread scheduler (`main.rs`).
    pub fn threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            listen: "127.0.0.1:8080".into(),
            body_limit_bytes: 1024 * 1024,
            request_timeout_ms: 10_000,
            shutdown_grace_ms: 10_000,
            max_in_flight: 1024,
            worker_threads: 0,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            min_body_rate_bytes_per_s: 1024,
            idle_timeout_ms: 60_000,
            write_timeout_ms: 10_000,
            max_connections: 10_000,
            max_connections_per_client: 0,
            max_buffered_bytes: 64 * 1024 * 1024,
            cors_origins: Vec::new(),
            http2_max_concurrent_streams: 100,
            http2_max_header_list_bytes: 16 * 1024,
            http2_max_unread_bytes_per_connection: 16 * 1024 * 1024,
            http2_max_unread_bytes: 64 * 1024 * 1024,
            tls: None,
        }
    }
}
