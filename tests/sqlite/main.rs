//! The contract tests again, on the embedded SQLite backend: every request these modules send
//! must get the answer it gets on PostgreSQL. The modules are the very files of `tests/api`;
//! only the database differs (`BACKEND`). Not included: what SQLite does not have or does
//! differently (docs/operations.md, Backends): legacy tables (`tables`, `auth_tables`,
//! `idempotency_tables`), coalescing and the connection pool (`limits`), the database behind a
//! TCP proxy (`outage`), fencegate's own
//! schema beside an application's (`dropin`: a SQLite file is fencegate's alone and has no
//! schemas; `database.schema` does not apply); and what does not depend on the backend
//! (`edge`, `byol`, `client_tls`). Nor `tls_pg`: PostgreSQL over TLS has no SQLite counterpart.
#![allow(dead_code)]

#[path = "../support/db_url.rs"]
mod db_url;
#[path = "../support/drain.rs"]
mod drain;
#[path = "../api/helpers.rs"]
mod helpers;
#[path = "../api/pg.rs"]
mod pg;
#[path = "../support/postgres.rs"]
mod support_pg;

pub const BACKEND: pg::Backend = pg::Backend::Sqlite;

#[path = "../api/admin.rs"]
mod admin;
#[path = "../api/auth.rs"]
mod auth;
#[path = "../api/batch.rs"]
mod batch;
#[path = "../api/client.rs"]
mod client;
#[path = "../api/concurrency.rs"]
mod concurrency;
#[path = "../api/console.rs"]
mod console;
#[path = "../api/demo.rs"]
mod demo;
#[path = "../api/errors.rs"]
mod errors;
#[path = "../api/idempotency.rs"]
mod idempotency;
#[path = "../api/kv.rs"]
mod kv;
#[path = "../api/locks.rs"]
mod locks;
#[path = "../api/model.rs"]
mod model;
#[path = "../api/openapi.rs"]
mod openapi;
#[path = "../api/operating.rs"]
mod operating;
#[path = "../api/ops.rs"]
mod ops;
#[path = "../api/poison.rs"]
mod poison;
#[path = "../api/restart.rs"]
mod restart;
#[path = "../api/scopes.rs"]
mod scopes;
#[path = "../api/sources.rs"]
mod sources;
#[path = "../api/sticky.rs"]
mod sticky;
#[path = "../api/tokens.rs"]
mod tokens;
