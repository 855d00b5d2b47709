//! Black-box tests for fencegate: every test starts a server on its own fresh PostgreSQL
//! database and asserts what a client sees over HTTP, against docs/wire.md.

mod helpers;
mod pg;

mod batch;
mod concurrency;
mod errors;
mod kv;
mod ops;
mod restart;
mod scopes;
mod tokens;
