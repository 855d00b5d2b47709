//! `fencegate demo` is part of the product: it must show the zombie rejected (exit 0) and the
//! lost update of the unfenced side, with real processes and a real SIGSTOP.

use std::process::Command;

#[tokio::test]
async fn demo_rejects_the_zombie_and_shows_the_lost_update() {
    let db = crate::pg::fresh_database().await;
    let url = db.clone();
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
    assert!(
        out.status.success(),
        "demo failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("SIGSTOP A"), "{stdout}");
    assert!(
        stdout.contains("412 REJECTED"),
        "fenced zombie not rejected:\n{stdout}"
    );
    assert!(stdout.contains("final list: [\"B\"]"), "{stdout}");
    assert!(
        stdout.contains("LOST"),
        "unfenced side did not show the lost update:\n{stdout}"
    );
    assert!(stdout.contains("verdict: PASS"), "{stdout}");
    // It ran in a scratch place, gone now: nothing of the demo's is left in the user's database.
    if crate::BACKEND == crate::pg::Backend::Postgres {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let left: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace WHERE nspname NOT IN ('public', 'information_schema') AND nspname NOT LIKE 'pg\\_%'
             UNION ALL SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(left.is_empty(), "the demo left {left:?} in the database");
    } else {
        let file = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let rows: i64 = match std::path::Path::new(file).exists() {
            false => 0,
            true => {
                use sqlx::Connection;
                let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query_scalar(
                    "SELECT count(*) FROM sqlite_master WHERE name LIKE 'fencegate%'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap()
            }
        };
        assert_eq!(rows, 0, "the demo wrote into the configured SQLite file");
    }
}
