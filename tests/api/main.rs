//! Black-box tests for fencegate: every test starts a server on its own fresh PostgreSQL
//! database and asserts what a client sees over HTTP, against docs/wire.md.

#[path = "../support/db_url.rs"]
mod db_url;
#[path = "../support/drain.rs"]
mod drain;
mod helpers;
mod pg;
#[path = "../support/pgbouncer.rs"]
mod pgbouncer;
mod pki;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/postgres.rs"]
mod support_pg;

/// This binary runs on PostgreSQL (see tests/sqlite for the embedded backend).
pub const BACKEND: pg::Backend = pg::Backend::Postgres;

mod admin;
mod auth;
mod auth_tables;
mod availability;
mod batch;
mod byol;
mod client;
mod client_tls;
mod concurrency;
mod console;
mod demo;
mod dropin;
mod edge;
mod errors;
mod held;
mod hosts;
mod http2;
mod idempotency;
mod idempotency_tables;
mod kv;
mod limits;
mod locks;
mod model;
mod openapi;
mod operating;
mod ops;
mod outage;
mod partition;
mod poison;
mod pooler;
mod reload;
mod restart;
mod schemathesis;
mod scopes;
mod sources;
mod sql_writers;
mod sticky;
mod tables;
mod tls;
mod tls_pg;
mod tokens;
