//! `fencegate demo` (and the hidden `demo-worker` processes it starts): a zombie write rejected,
//! with real processes and a real SIGSTOP.

use fencegate::config::Settings;

use super::ServerArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Use this running fencegate instead of starting one.
    #[arg(long)]
    url: Option<String>,
    /// Lease of the demo lock, in milliseconds (worker A is frozen 500 ms longer).
    #[arg(long, default_value_t = 1000)]
    lease_ms: u64,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long)]
    name: String,
    #[arg(long)]
    lock: String,
    #[arg(long)]
    key: String,
    #[arg(long)]
    lease_ms: u64,
    #[arg(long)]
    work_ms: u64,
    #[arg(long)]
    unfenced_db: Option<String>,
    #[arg(long)]
    scratch_schema: Option<String>,
}

pub async fn run(args: Args, settings: Settings) -> anyhow::Result<()> {
    // Started by the demo, fencegate uses the configured PostgreSQL (in a scratch schema) or a
    // scratch SQLite file; against --url, only an explicitly configured database is known (for
    // the unfenced side, in a scratch schema too).
    let options = fencegate::demo::DemoOptions {
        url: args.url,
        database_url: settings.database.url.clone(),
        lease_ms: args.lease_ms,
    };
    if fencegate::demo::run(options).await? {
        Ok(())
    } else {
        anyhow::bail!("the zombie's write was not rejected")
    }
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    fencegate::demo::worker(fencegate::demo::WorkerOptions {
        url: args.url,
        name: args.name,
        lock: args.lock,
        key: args.key,
        lease_ms: args.lease_ms,
        work_ms: args.work_ms,
        unfenced_db: args.unfenced_db,
        scratch_schema: args.scratch_schema,
    })
    .await
}
