//! The `fencegate` command: parse the command line, then call into the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fencegate::config::{Overrides, Settings};

/// With `--features jemalloc`: jemalloc instead of the system allocator (measured in
/// bench/README.md, abuse bench).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "fencegate", version, about = "Fencing-aware storage proxy: rejects stale (zombie) writes at the resource")]
struct Cli {
    /// Config file (TOML; see config/default.toml).
    #[arg(long, global = true, env = "FENCEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// PostgreSQL URL (overrides DATABASE_URL and the config file).
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:8080 (overrides FENCEGATE_LISTEN).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Show a zombie write rejected: real worker processes, a real SIGSTOP, fenced and unfenced.
    Demo {
        /// Use this running fencegate instead of starting one.
        #[arg(long)]
        url: Option<String>,
        /// Lease of the demo lock, in milliseconds (worker A is frozen 500 ms longer).
        #[arg(long, default_value_t = 1000)]
        lease_ms: u64,
    },
    /// One demo worker process (started by `demo`).
    #[command(hide = true)]
    DemoWorker {
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
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match start(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fencegate: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Loads the settings first: they say how many threads the runtime gets.
fn start(cli: Cli) -> anyhow::Result<()> {
    let listen = match &cli.command {
        Command::Serve { listen } => listen.clone(),
        _ => None,
    };
    let overrides = Overrides { listen, database_url: cli.database_url.clone() };
    let settings = Settings::load(cli.config.as_deref(), |k| std::env::var(k).ok(), overrides)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.server.threads())
        .enable_all()
        .build()
        .map_err(|err| anyhow::anyhow!("cannot start the async runtime: {err}"))?;
    runtime.block_on(run(cli, settings))
}

async fn run(cli: Cli, mut settings: Settings) -> anyhow::Result<()> {
    if matches!(cli.command, Command::Demo { .. } | Command::DemoWorker { .. }) {
        // The demo's output is its timeline; logs would only interleave with it.
        settings.log.filter = "warn".into();
    }
    fencegate::telemetry::init_logging(&settings.log);
    match cli.command {
        Command::Serve { .. } => {
            let addr = settings.listen_addr()?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e} (choose another --listen address)"))?;
            let bound = listener.local_addr()?;
            let started = fencegate::server::serve_announced(settings, listener, fencegate::server::shutdown_signal(), move || {
                // A stable line on stdout, so scripts and tests can learn the port of --listen :0.
                println!("listening on {bound}");
            });
            started.await
        }
        Command::Demo { url, lease_ms } => {
            // Started by the demo, fencegate uses the configured database (by default the
            // embedded SQLite file); against --url, only an explicitly configured one is known.
            let database_url = match &url {
                None => Some(settings.database.effective_url()),
                Some(_) => settings.database.url.clone(),
            };
            let options = fencegate::demo::DemoOptions { url, database_url, lease_ms };
            if fencegate::demo::run(options).await? {
                Ok(())
            } else {
                anyhow::bail!("the zombie's write was not rejected")
            }
        }
        Command::DemoWorker { url, name, lock, key, lease_ms, work_ms, unfenced_db } => {
            fencegate::demo::worker(fencegate::demo::WorkerOptions { url, name, lock, key, lease_ms, work_ms, unfenced_db })
                .await
        }
        Command::Migrate => {
            let mut settings = settings;
            settings.database.migrate_on_start = true;
            let store = fencegate::server::open_store(&settings).await?;
            drop(store);
            println!("migrations applied");
            Ok(())
        }
    }
}
