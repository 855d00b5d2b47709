//! fencegate: a fencing-aware storage proxy in front of PostgreSQL.
//!
//! Module map (data flows one way: HTTP extractor -> fence decision + write in the store ->
//! outcome -> response):
//! - [`fence`]: tokens, keys, scopes, the accept rule, outcomes. No HTTP, no SQL.
//! - [`store`]: the backends; all SQL lives there.
//! - [`http`]: routes, extractors, problem+json errors, middleware.
//! - [`tables`]: legacy PostgreSQL tables fenced in place (no SQL, no HTTP in there).
//! - [`locks`]: the built-in lease service (domain rules; its SQL is in `store`).
//! - [`demo`]: the zombie demo (real processes, a real SIGSTOP).
//! - [`auth`]: credentials (API keys, JWTs, client certificates) and rights. No HTTP, no SQL.
//! - [`tls`]: HTTPS on the listener (rustls), and what a client certificate names.
//! - [`config`]: settings from file, environment and flags: loading, layering, and the checks
//!   across parts. Each part's own settings struct lives with the part (`server::ServerSettings`,
//!   `auth::AuthSettings`, `fence::KvSettings`...) and checks itself.
//! - [`telemetry`]: logs and metrics.
//! - [`events`]: grants, releases and refusals as they happen, for the console (`/ui`).
//! - [`server`]: start-up, the accept loop on a bound listener, graceful shutdown.
//! - [`conn`]: one client connection (TLS, HTTP/1.1 or HTTP/2) and its timeouts.
//! - [`redact`]: secrets kept out of what is printed (a database URL's password).
//! - [`slots`]: the connection cap (and per-client cap); closes idle connections to make room.
#![forbid(unsafe_code)]

pub mod auth;
pub mod config;
pub mod conn;
pub mod demo;
pub mod events;
pub mod fence;
pub mod http;
pub mod issuers;
pub mod locks;
pub mod percent;
pub mod redact;
pub mod server;
pub mod slots;
pub mod store;
pub mod tables;
mod task;
pub mod telemetry;
pub mod tls;

pub use server::serve;
