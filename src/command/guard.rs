//! `fencegate guard sql`: the DDL a fronted table's owner runs once to install its guard trigger.

use fencegate::config::Settings;

use super::ServerArgs;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the DDL that installs the guard triggers of [[resources]] with `guard` (each
    /// table's owner runs it once; start-up stops with the same DDL while a trigger is missing).
    Sql {
        /// Only this resource.
        #[arg(long)]
        resource: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

pub async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    let Command::Sql { resource, .. } = command;
    let store = fencegate::server::open_store(&settings).await?;
    print!(
        "{}",
        store
            .guard_ddl(&settings.resources, resource.as_deref())
            .await?
    );
    Ok(())
}
