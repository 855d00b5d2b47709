//! The console (`/ui`) in a real headless browser: Debian's `chromium`, driven through
//! `chromedriver` (WebDriver) by `fantoccini`, against a fencegate on its own PostgreSQL
//! database. A separate binary from tests/api so that one browser at a time shares the CPU
//! with nothing else of ours.
//!
//! Nothing here skips: without chromium and chromedriver the tests fail and say what to install.
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

pub const BACKEND: pg::Backend = pg::Backend::Postgres;

mod browser;
mod console;
