//! fencegate as its own client: `kv`, `fence` and `lock -- CMD` (docs/api.md, *The command line
//! as a client*). Every command takes `--url` (env `FENCEGATE_URL`), for an https:// URL
//! `--cacert`, `--cert` and `--key` (env `FENCEGATE_CACERT`, `FENCEGATE_CERT`, `FENCEGATE_KEY`),
//! and sends `FENCEGATE_API_KEY`, when set, as the bearer credential; `--token` and `--scope` default to
//! `FENCEGATE_TOKEN` and `FENCEGATE_SCOPE`, which `fencegate lock` hands to the command it runs.
//!
//! - [`http`]: the HTTP client and the exit status of an answer.
//! - [`requests`]: `kv`, `fence`, `lock-info`: one request per command; the body to stdout.
//! - [`lock`]: the wrapper that holds a lease while a command runs.

pub mod http;
pub mod lock;
pub mod requests;

use clap::{Args, Subcommand};

/// Where fencegate is.
#[derive(Args, Debug, Clone)]
pub struct Endpoint {
    /// fencegate's base URL (http:// or https://).
    #[arg(long, env = "FENCEGATE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Give up on a request after this long (no answer: exit 1).
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub tls: ClientTls,
}

/// TLS to an https:// fencegate.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientTls {
    /// Trust only the CA certificates in this PEM file for fencegate's certificate (instead of
    /// the bundled public root CAs).
    #[arg(
        long = "cacert",
        id = "tls_cacert",
        env = "FENCEGATE_CACERT",
        value_name = "FILE"
    )]
    pub cacert: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM, with its chain) to fencegate; needs --key.
    #[arg(
        long = "cert",
        id = "tls_cert",
        env = "FENCEGATE_CERT",
        value_name = "FILE"
    )]
    pub cert: Option<std::path::PathBuf>,
    /// The private key of --cert (unencrypted PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long = "key",
        id = "tls_key",
        env = "FENCEGATE_KEY",
        value_name = "FILE"
    )]
    pub key: Option<std::path::PathBuf>,
}

/// The fencing headers of a write.
#[derive(Args, Debug, Clone)]
pub struct Fencing {
    /// The fencing token of the lock you hold (X-Fencing-Token).
    #[arg(long, env = "FENCEGATE_TOKEN")]
    pub token: String,
    /// Write under this scope's fence (X-Fencing-Scope), normally the lock's name.
    #[arg(long, env = "FENCEGATE_SCOPE")]
    pub scope: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// GET /v1/kv/KEY: prints {key, value, fence_token, ...}.
    Get {
        key: String,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// PUT /v1/kv/KEY with JSON as the value (read from stdin when left out).
    Put {
        key: String,
        /// The value, a JSON document (e.g. '{"n": 1}' or '"text"').
        json: Option<String>,
        #[command(flatten)]
        fencing: Fencing,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// DELETE /v1/kv/KEY (the tombstone keeps the fence).
    Delete {
        key: String,
        #[command(flatten)]
        fencing: Fencing,
        #[command(flatten)]
        endpoint: Endpoint,
    },
}

#[derive(Subcommand, Debug)]
pub enum FenceCommand {
    /// GET /v1/fences/SCOPE: prints {scope, fence_token}.
    Get {
        /// The scope (default: FENCEGATE_SCOPE).
        #[arg(env = "FENCEGATE_SCOPE")]
        scope: String,
        #[command(flatten)]
        endpoint: Endpoint,
    },
    /// POST /v1/fences/SCOPE: raise the scope's fence to --token without writing data.
    Claim {
        /// The scope (default: FENCEGATE_SCOPE).
        #[arg(env = "FENCEGATE_SCOPE")]
        scope: String,
        /// The fencing token to raise the fence to.
        #[arg(long, env = "FENCEGATE_TOKEN")]
        token: String,
        #[command(flatten)]
        endpoint: Endpoint,
    },
}

/// `fencegate lock-info NAME`.
#[derive(Args, Debug)]
pub struct LockInfo {
    /// The built-in lock (default: FENCEGATE_SCOPE, the lock a wrapped command runs under).
    #[arg(env = "FENCEGATE_SCOPE")]
    pub name: String,
    #[command(flatten)]
    pub endpoint: Endpoint,
}

/// Runs a client command on a small runtime of its own; returns the process's exit status.
pub fn block_on<F: std::future::Future<Output = u8>>(command: F) -> u8 {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(command),
        Err(e) => {
            eprintln!("fencegate: cannot start the async runtime: {e}");
            http::exit::UNAVAILABLE
        }
    }
}
