//! `fencegate migrate`: apply the pending migrations to the configured database and exit.

use fencegate::config::Settings;

pub async fn run(mut settings: Settings) -> anyhow::Result<()> {
    settings.database.migrate_on_start = true;
    let store = fencegate::server::open_store(&settings).await?;
    if store.awaits_primary() {
        anyhow::bail!(
            "the database is in recovery (a standby): nothing was migrated; run `fencegate migrate` against the primary"
        );
    }
    drop(store);
    println!("migrations applied");
    Ok(())
}
