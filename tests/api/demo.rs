//! `fencegate demo` is part of the product: it must show the zombie rejected (exit 0) and the
//! lost update of the unfenced side, with real processes and a real SIGSTOP.

use std::process::Command;

#[tokio::test]
async fn demo_rejects_the_zombie_and_shows_the_lost_update() {
    let db = crate::pg::fresh_database().await;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["demo", "--lease-ms", "500", "--database-url", &db])
            .env_remove("DATABASE_URL")
            .output()
            .expect("run fencegate demo")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("SIGSTOP A"), "{stdout}");
    assert!(stdout.contains("412 REJECTED"), "fenced zombie not rejected:\n{stdout}");
    assert!(stdout.contains("final list: [\"B\"]"), "{stdout}");
    assert!(stdout.contains("LOST"), "unfenced side did not show the lost update:\n{stdout}");
    assert!(stdout.contains("verdict: PASS"), "{stdout}");
}
