//! The command line: one module per subcommand (atuin's `command/`), each with its clap
//! arguments and its body. The library knows nothing of clap: a module turns its arguments
//! into the library's types and calls in.
//!
//! - [`serve`], [`migrate`], [`admin`], [`guard`], [`demo`]: open the settings (and the database);
//! - [`auth`], [`sign`]: need no settings;
//! - [`client`]: `lock`, `kv`, `fence`, `lock-info`, which talk HTTP to a running fencegate and
//!   have exit statuses of their own.

mod admin;
mod auth;
mod client;
mod demo;
mod guard;
mod migrate;
mod serve;
mod sign;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use fencegate::config::{Overrides, Settings};

#[derive(Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fencing-aware storage proxy: rejects stale (zombie) writes at the resource"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The settings of the commands that run a server or open the database (the client commands
/// talk HTTP and take `--url` instead).
#[derive(clap::Args, Clone, Default)]
pub struct ServerArgs {
    /// Config file (TOML; see config/default.toml).
    #[arg(long, env = "FENCEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Database URL: postgres://... or sqlite:FILE (overrides DATABASE_URL and the config file).
    #[arg(long)]
    database_url: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(serve::Args),
    /// Apply pending database migrations and exit (needs a configured database).
    Migrate(ServerArgs),
    /// Guarded legacy tables: `fencegate guard sql` prints the triggers' DDL for their owners.
    Guard {
        #[command(subcommand)]
        command: guard::Command,
    },
    /// Credentials: `fencegate auth new-key --name billing-worker`.
    Auth {
        #[command(subcommand)]
        command: auth::Command,
    },
    /// Run CMD while holding the built-in lock NAME: FENCEGATE_URL, FENCEGATE_TOKEN and
    /// FENCEGATE_SCOPE in its environment, renewed every ttl/3, released when CMD exits. A lost
    /// lease stops CMD (SIGTERM, then SIGKILL) and exits 70; a lock still held after --wait-ms
    /// exits 75; otherwise CMD's own status (128+N for signal N).
    Lock(client::lock::LockArgs),
    /// A value: `kv get KEY`, `kv put KEY JSON`, `kv delete KEY` (--token and --scope default
    /// to FENCEGATE_TOKEN and FENCEGATE_SCOPE). Exit 0 on 2xx, 4 on 412, 3 on 404, 2 on another
    /// 4xx, 1 on 5xx or no answer.
    Kv {
        #[command(subcommand)]
        command: client::KvCommand,
    },
    /// A scope's fence: `fence get SCOPE`, `fence claim SCOPE --token N` (exit codes as for kv).
    Fence {
        #[command(subcommand)]
        command: client::FenceCommand,
    },
    /// Who holds the built-in lock NAME and for how long (exit 3 when it is free).
    LockInfo(client::LockInfo),
    /// Show a zombie write rejected: real worker processes, a real SIGSTOP, fenced and unfenced.
    Demo(demo::Args),
    /// Sign a fencing token for a scope as an [[issuers]] lock service does: prints the value of
    /// X-Fencing-Proof (base64url of the signature over "fencegate-token-v1\n{scope}\n{token}").
    /// For a lock service that cannot sign itself: run it next to the service, holding the key.
    Sign(sign::Args),
    /// Administration against the database itself (for when the HTTP side is locked down).
    Admin {
        #[command(subcommand)]
        command: admin::Command,
    },
    /// One demo worker process (started by `demo`).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
}

/// Runs the command; the process's exit status.
pub fn main(cli: Cli) -> ExitCode {
    use client::{block_on, lock, requests};
    // Commands that need no settings and no database, with exit statuses of their own.
    let command = match cli.command {
        Command::Lock(args) => return block_on(lock::run(args)).into(),
        Command::Kv { command } => return block_on(requests::kv(command)).into(),
        Command::Fence { command } => return block_on(requests::fence(command)).into(),
        Command::LockInfo(args) => return block_on(requests::lock_info(args)).into(),
        Command::Sign(args) => return sign::run(args),
        Command::Auth { command } => return report(auth::run(command)),
        command => command,
    };
    report(start(command))
}

/// `fencegate: <error and its causes>` on stderr, exit 1.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fencegate: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the settings first: they say how many threads the runtime gets.
fn start(command: Command) -> anyhow::Result<()> {
    let (listen, server) = match &command {
        Command::Serve(args) => (args.listen.clone(), args.server.clone()),
        Command::Migrate(server)
        | Command::Demo(demo::Args { server, .. })
        | Command::Admin {
            command: admin::Command::Reset { server, .. } | admin::Command::Rebind { server, .. },
        }
        | Command::Guard {
            command: guard::Command::Sql { server, .. },
        } => (None, server.clone()),
        _ => (None, ServerArgs::default()),
    };
    let overrides = Overrides {
        listen,
        database_url: server.database_url.clone(),
    };
    let mut settings = Settings::load(
        server.config.as_deref(),
        |k| std::env::var(k).ok(),
        overrides.clone(),
    )?;
    if matches!(
        command,
        Command::Migrate(_) | Command::Admin { .. } | Command::Guard { .. }
    ) {
        require_database(&settings)?;
    }
    if matches!(command, Command::Demo(_) | Command::DemoWorker(_)) {
        // The demo's output is its timeline; logs would only interleave with it.
        settings.log.filter = "warn".into();
    }
    // One thread: tokio's current-thread scheduler, which does with one thread what the
    // multi-threaded one does with one worker, without the machinery for handing work between
    // workers (its injection queue, idle bookkeeping, a separate main thread).
    let runtime = match settings.server.threads() {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .map_err(|err| anyhow::anyhow!("cannot start the async runtime: {err}"))?;
    runtime.block_on(async move {
        fencegate::telemetry::init_logging(&settings.log);
        match command {
            Command::Serve(_) => {
                // SIGHUP: the same sources read again.
                let config_file = server.config.clone();
                let reload: fencegate::server::Reload = Box::new(move || {
                    Settings::load(
                        config_file.as_deref(),
                        |k| std::env::var(k).ok(),
                        overrides.clone(),
                    )
                });
                serve::run(settings, reload).await
            }
            Command::Migrate(_) => migrate::run(settings).await,
            Command::Guard { command } => guard::run(command, settings).await,
            Command::Admin { command } => admin::run(command, settings).await,
            Command::Demo(args) => demo::run(args, settings).await,
            Command::DemoWorker(args) => demo::worker(args).await,
            Command::Lock(_)
            | Command::Kv { .. }
            | Command::Fence { .. }
            | Command::LockInfo(_)
            | Command::Sign(_)
            | Command::Auth { .. } => unreachable!("handled before the settings are loaded"),
        }
    })
}

/// A command that works on an existing database (`migrate`, `admin`) needs one named: with none
/// configured it would create an empty SQLite file wherever it runs, and report on that.
fn require_database(settings: &Settings) -> anyhow::Result<()> {
    let Some(url) = &settings.database.url else {
        anyhow::bail!(
            "no database configured: pass --database-url (postgres://... or sqlite:FILE), set DATABASE_URL, or give \
             --config with database.url; nothing was done"
        );
    };
    if let Some(file) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        let file = file.split('?').next().unwrap_or_default();
        if !std::path::Path::new(file).exists() {
            anyhow::bail!(
                "no SQLite database at {file:?} (from {}): nothing was done",
                fencegate::redact::redact_url(url)
            );
        }
    }
    Ok(())
}

/// Who an administrative command acts as in the audit log: `cli:$USER`.
fn cli_actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}
