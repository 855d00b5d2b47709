//! The client libraries (clients/python, clients/typescript, clients/go, clients/java), each run
//! with its own test runner (pytest, `node --test`, `go test`, JUnit 5's console launcher)
//! against this build's fencegate binary on its own PostgreSQL
//! database. A separate binary from tests/api, so that their timing-sensitive lease tests share
//! the CPU with nothing else of ours; one library at a time.
//!
//! Nothing here skips: a missing runtime (python3 with venv, node 20.3+ and npm, go 1.19+, a JDK
//! 17+ and junit5, redis-server) fails the test with what to install (each library's test.sh
//! says it).
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

use std::time::Duration;

/// One library at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `clients/<dir>/test.sh` against a fresh server; its output goes to this test's output.
async fn run_library_tests(dir: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = helpers::spawn_binary(&pg::fresh_database().await).await;
    // For the tests that start servers of their own (auth, issuers, a frozen database).
    let spare = pg::fresh_database().await;
    let script = format!("{}/clients/{dir}/test.sh", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::time::timeout(
        Duration::from_secs(900),
        tokio::process::Command::new("bash")
            .arg(&script)
            .env("FENCEGATE_URL", &server.address)
            .env("FENCEGATE_BIN", env!("CARGO_BIN_EXE_fencegate"))
            .env("DATABASE_URL", &spare)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} did not finish within 15 minutes"))
    .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.stderr()
    );
}

#[tokio::test]
async fn the_typescript_client_passes_its_tests_against_this_build() {
    run_library_tests("typescript").await;
}

#[tokio::test]
async fn the_python_client_passes_its_tests_against_this_build() {
    run_library_tests("python").await;
}

#[tokio::test]
async fn the_go_client_passes_its_tests_against_this_build() {
    run_library_tests("go").await;
}

#[tokio::test]
async fn the_java_client_passes_its_tests_against_this_build() {
    run_library_tests("java").await;
}
