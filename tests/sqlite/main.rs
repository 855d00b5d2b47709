//! The contract tests again, on the embedded SQLite backend: kv, batch, fences and locks must
//! behave exactly as on PostgreSQL. The modules are the very files of `tests/api`; only the
//! database differs (`BACKEND`). PostgreSQL-only features (legacy tables, the throwaway
//! cluster) are not included.
#![allow(dead_code)]

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
#[path = "../api/concurrency.rs"]
mod concurrency;
#[path = "../api/demo.rs"]
mod demo;
#[path = "../api/errors.rs"]
mod errors;
#[path = "../api/kv.rs"]
mod kv;
#[path = "../api/locks.rs"]
mod locks;
#[path = "../api/model.rs"]
mod model;
#[path = "../api/ops.rs"]
mod ops;
#[path = "../api/poison.rs"]
mod poison;
#[path = "../api/restart.rs"]
mod restart;
#[path = "../api/scopes.rs"]
mod scopes;
#[path = "../api/sticky.rs"]
mod sticky;
#[path = "../api/tokens.rs"]
mod tokens;
