//! The `fencegate` command: parse the command line, then call into the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fencegate::{
    config::{Overrides, Settings},
    fence::{Key, Scope},
    store::admin::{Reset, ResetTarget},
};

/// jemalloc instead of the system allocator (the default feature `jemalloc`): glibc's malloc
/// spent 28% of a lone PUT's instructions, and kept more memory after a burst (bench/RESULTS.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fencing-aware storage proxy: rejects stale (zombie) writes at the resource"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The settings of the commands that run a server or open the database (the client commands
/// talk HTTP and take `--url` instead).
#[derive(clap::Args, Clone, Default)]
struct ServerArgs {
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
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:8080 (overrides FENCEGATE_LISTEN).
        #[arg(long)]
        listen: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Apply pending database migrations and exit (needs a configured database).
    Migrate(ServerArgs),
    /// Guarded legacy tables: `fencegate guard sql` prints the triggers' DDL for their owners.
    Guard {
        #[command(subcommand)]
        command: GuardCommand,
    },
    /// Credentials: `fencegate auth new-key --name billing-worker`.
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Run CMD while holding the built-in lock NAME: FENCEGATE_URL, FENCEGATE_TOKEN and
    /// FENCEGATE_SCOPE in its environment, renewed every ttl/3, released when CMD exits. A lost
    /// lease stops CMD (SIGTERM, then SIGKILL) and exits 70; a lock still held after --wait-ms
    /// exits 75; otherwise CMD's own status (128+N for signal N).
    Lock(fencegate::client::lock::LockArgs),
    /// A value: `kv get KEY`, `kv put KEY JSON`, `kv delete KEY` (--token and --scope default
    /// to FENCEGATE_TOKEN and FENCEGATE_SCOPE). Exit 0 on 2xx, 4 on 412, 3 on 404, 2 on another
    /// 4xx, 1 on 5xx or no answer.
    Kv {
        #[command(subcommand)]
        command: fencegate::client::KvCommand,
    },
    /// A scope's fence: `fence get SCOPE`, `fence claim SCOPE --token N` (exit codes as for kv).
    Fence {
        #[command(subcommand)]
        command: fencegate::client::FenceCommand,
    },
    /// Who holds the built-in lock NAME and for how long (exit 3 when it is free).
    LockInfo(fencegate::client::LockInfo),
    /// Show a zombie write rejected: real worker processes, a real SIGSTOP, fenced and unfenced.
    Demo {
        /// Use this running fencegate instead of starting one.
        #[arg(long)]
        url: Option<String>,
        /// Lease of the demo lock, in milliseconds (worker A is frozen 500 ms longer).
        #[arg(long, default_value_t = 1000)]
        lease_ms: u64,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Sign a fencing token for a scope as an [[issuers]] lock service does: prints the value of
    /// X-Fencing-Proof (base64url of the signature over "fencegate-token-v1\n{scope}\n{token}").
    /// For a lock service that cannot sign itself: run it next to the service, holding the key.
    Sign {
        /// The scope, as written in X-Fencing-Scope after percent-decoding (the lock's name).
        #[arg(long)]
        scope: String,
        /// The fencing token, a canonical decimal.
        #[arg(long)]
        token: String,
        /// The environment variable holding the HMAC-SHA256 secret.
        #[arg(
            long,
            conflicts_with = "ed25519_key_file",
            required_unless_present = "ed25519_key_file"
        )]
        hmac_secret_env: Option<String>,
        /// A file holding the Ed25519 signing key: standard base64 of its 32-byte seed.
        #[arg(long)]
        ed25519_key_file: Option<PathBuf>,
    },
    /// Administration against the database itself (for when the HTTP side is locked down).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
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
        #[arg(long)]
        scratch_schema: Option<String>,
    },
}

/// `fencegate sign`: the proof an issuer would send for `token` in `scope`.
fn sign(
    scope: &str,
    token: &str,
    hmac_env: Option<&str>,
    ed25519_file: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    use base64::Engine;
    use fencegate::issuers::SigningKey;
    let token = fencegate::fence::FencingToken::parse(token.as_bytes())
        .map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    fencegate::fence::Scope::parse(scope, 2048)
        .map_err(|e| anyhow::anyhow!("--scope: the scope {e}"))?;
    Ok(match (hmac_env, ed25519_file) {
        (Some(var), _) => {
            let secret = std::env::var(var)
                .map_err(|_| anyhow::anyhow!("--hmac-secret-env: {var} is not set"))?;
            fencegate::issuers::sign(scope, token, SigningKey::Hmac(secret.as_bytes()))
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            let seed: [u8; 32] = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{} must hold the standard base64 of a 32-byte Ed25519 seed",
                        path.display()
                    )
                })?;
            fencegate::issuers::sign(scope, token, SigningKey::Ed25519(&seed))
        }
        (None, None) => anyhow::bail!("give --hmac-secret-env or --ed25519-key-file"),
    })
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Lower a fence, or rebind a key's or table row's sticky scope: audited (actor
    /// "cli:$USER"), in one transaction, honoured at once by every fencegate process.
    Reset {
        /// The scope whose fence to lower.
        #[arg(long, group = "target")]
        scope: Option<String>,
        /// The kv key to reset.
        #[arg(long, group = "target")]
        key: Option<String>,
        /// The legacy-table resource (with --row).
        #[arg(long, group = "target", requires = "row")]
        table: Option<String>,
        /// The row's key in URL form (values joined by ',', each percent-encoded).
        #[arg(long)]
        row: Option<String>,
        /// The new fence: below the current one.
        #[arg(long)]
        to: Option<String>,
        /// Rebind the key or row to this scope.
        #[arg(long, conflicts_with = "unbind")]
        bind: Option<String>,
        /// Rebind the key or row to no scope.
        #[arg(long)]
        unbind: bool,
        /// Why (1..=1000 bytes): recorded in the audit log.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Rebind every key under a prefix, or every fenced row of a legacy table, to a sticky
    /// scope (or none): audited (actor "cli:$USER"), in one transaction. The fences stay.
    Rebind {
        /// Keys starting with this ("" for every key).
        #[arg(long, group = "what")]
        prefix: Option<String>,
        /// The legacy-table resource: all its rows.
        #[arg(long, group = "what")]
        table: Option<String>,
        /// The new scope.
        #[arg(long, conflicts_with = "unbind")]
        bind: Option<String>,
        /// No scope.
        #[arg(long)]
        unbind: bool,
        /// Why (1..=1000 bytes): recorded in the audit log.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Subcommand)]
enum GuardCommand {
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

#[derive(Subcommand)]
enum AuthCommand {
    /// Print a fresh random API key and the [[auth.keys]] block (with its sha256) for the config.
    NewKey {
        /// The actor's name: in logs, and the owner of the leases it takes.
        #[arg(long, default_value = "my-service")]
        name: String,
    },
}

fn main() -> std::process::ExitCode {
    use fencegate::client::{block_on, lock, requests};
    let Cli { command } = Cli::parse();
    // The client commands need no settings, no database, and have exit statuses of their own.
    let command = match command {
        Command::Lock(args) => return block_on(lock::run(args)).into(),
        Command::Kv { command } => return block_on(requests::kv(command)).into(),
        Command::Fence { command } => return block_on(requests::fence(command)).into(),
        Command::LockInfo(args) => return block_on(requests::lock_info(args)).into(),
        // A proof needs no settings: what is wrong is the usage (a malformed token, a missing
        // key or secret), exit 2 as for the other client commands.
        Command::Sign {
            scope,
            token,
            hmac_secret_env,
            ed25519_key_file,
        } => {
            return match sign(
                &scope,
                &token,
                hmac_secret_env.as_deref(),
                ed25519_key_file.as_deref(),
            ) {
                Ok(proof) => {
                    println!("{proof}");
                    std::process::ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("fencegate sign: {err:#}");
                    std::process::ExitCode::from(2)
                }
            };
        }
        command => command,
    };
    match start(Cli { command }) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fencegate: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Loads the settings first: they say how many threads the runtime gets.
fn start(cli: Cli) -> anyhow::Result<()> {
    // Needs no settings, no runtime and no database.
    if let Command::Auth {
        command: AuthCommand::NewKey { name },
    } = &cli.command
    {
        return new_key(name);
    }
    let (listen, server) = match &cli.command {
        Command::Serve { listen, server } => (listen.clone(), server.clone()),
        Command::Migrate(server)
        | Command::Demo { server, .. }
        | Command::Admin {
            command: AdminCommand::Reset { server, .. } | AdminCommand::Rebind { server, .. },
        }
        | Command::Guard {
            command: GuardCommand::Sql { server, .. },
        } => (None, server.clone()),
        _ => (None, ServerArgs::default()),
    };
    let overrides = Overrides {
        listen,
        database_url: server.database_url.clone(),
    };
    let settings = Settings::load(
        server.config.as_deref(),
        |k| std::env::var(k).ok(),
        overrides.clone(),
    )?;
    // SIGHUP (`serve`): the same sources read again.
    let config_file = server.config.clone();
    let reload: fencegate::server::Reload = Box::new(move || {
        Settings::load(
            config_file.as_deref(),
            |k| std::env::var(k).ok(),
            overrides.clone(),
        )
    });
    if matches!(
        cli.command,
        Command::Migrate(_) | Command::Admin { .. } | Command::Guard { .. }
    ) {
        require_database(&settings)?;
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
    runtime.block_on(run(cli, settings, reload))
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

/// The key on stdout's first line (for scripts), then the config block; the key is shown once
/// and never stored anywhere by fencegate.
fn new_key(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
        anyhow::bail!("--name must be 1 to 256 printable bytes");
    }
    let key = fencegate::auth::new_key()?;
    println!("{key}");
    println!();
    println!(
        "# The key above goes to the service (Authorization: Bearer <key>); it is shown only now."
    );
    println!(
        "# Add this block to the fencegate config file, with the least rights the service needs:"
    );
    print!("{}", fencegate::auth::key_block(name, &key));
    Ok(())
}

async fn run(
    cli: Cli,
    mut settings: Settings,
    reload: fencegate::server::Reload,
) -> anyhow::Result<()> {
    if matches!(
        cli.command,
        Command::Demo { .. } | Command::DemoWorker { .. }
    ) {
        // The demo's output is its timeline; logs would only interleave with it.
        settings.log.filter = "warn".into();
    }
    fencegate::telemetry::init_logging(&settings.log);
    match cli.command {
        Command::Serve { .. } => {
            let addr = settings.server.listen_addr()?;
            let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                anyhow::anyhow!("cannot listen on {addr}: {e} (choose another --listen address)")
            })?;
            let bound = listener.local_addr()?;
            let scheme = if settings.server.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let announce = move || {
                // A stable line on stdout, so scripts and tests can learn the port of --listen :0.
                println!("listening on {bound}");
                tracing::info!("serving {scheme}://{bound}");
            };
            let started = fencegate::server::serve_reloadable(
                settings,
                listener,
                fencegate::server::shutdown_signal(),
                announce,
                Some(reload),
            );
            started.await
        }
        Command::Demo { url, lease_ms, .. } => {
            // Started by the demo, fencegate uses the configured PostgreSQL (in a scratch schema)
            // or a scratch SQLite file; against --url, only an explicitly configured database is
            // known (for the unfenced side, in a scratch schema too).
            let database_url = settings.database.url.clone();
            let options = fencegate::demo::DemoOptions {
                url,
                database_url,
                lease_ms,
            };
            if fencegate::demo::run(options).await? {
                Ok(())
            } else {
                anyhow::bail!("the zombie's write was not rejected")
            }
        }
        Command::DemoWorker {
            url,
            name,
            lock,
            key,
            lease_ms,
            work_ms,
            unfenced_db,
            scratch_schema,
        } => {
            let options = fencegate::demo::WorkerOptions {
                url,
                name,
                lock,
                key,
                lease_ms,
                work_ms,
                unfenced_db,
                scratch_schema,
            };
            fencegate::demo::worker(options).await
        }
        Command::Sign { .. } => unreachable!("handled before the settings are loaded"),
        Command::Admin {
            command:
                AdminCommand::Reset {
                    scope,
                    key,
                    table,
                    row,
                    to,
                    bind,
                    unbind,
                    reason,
                    ..
                },
        } => {
            let store = fencegate::server::open_store(&settings).await?;
            let max = settings.kv.max_key_bytes;
            let target = match (scope, key, table) {
                (Some(scope), _, _) => ResetTarget::Scope(
                    Scope::parse(&scope, max)
                        .map_err(|e| anyhow::anyhow!("--scope: the scope {e}"))?,
                ),
                (_, Some(key), _) => ResetTarget::Key(
                    Key::parse(&key, max).map_err(|e| anyhow::anyhow!("--key: the key {e}"))?,
                ),
                (_, _, Some(table)) => {
                    let resources = store.resources(&settings.resources).await?;
                    let resource = resources.get(&table).cloned().ok_or_else(|| {
                        anyhow::anyhow!(
                            "--table: no resource {table:?} in [[resources]] of the config file"
                        )
                    })?;
                    let row = fencegate::tables::RowKey::parse(
                        &resource,
                        row.as_deref().unwrap_or_default(),
                        max,
                    )
                    .map_err(|e| anyhow::anyhow!("--row: {e}"))?;
                    ResetTarget::Row { resource, key: row }
                }
                _ => anyhow::bail!("name what to reset: --scope, --key, or --table with --row"),
            };
            let to = to
                .map(|to| {
                    fencegate::fence::FencingToken::parse(to.as_bytes())
                        .map_err(|e| anyhow::anyhow!("--to: {e}"))
                })
                .transpose()?;
            let scope = match (bind, unbind) {
                (Some(s), _) => Some(Some(
                    Scope::parse(&s, max).map_err(|e| anyhow::anyhow!("--bind: the scope {e}"))?,
                )),
                (None, true) => Some(None),
                (None, false) => None,
            };
            let actor = format!(
                "cli:{}",
                std::env::var("USER").unwrap_or_else(|_| "unknown".into())
            );
            match store
                .reset(Reset {
                    target,
                    to,
                    scope,
                    reason,
                    actor,
                })
                .await?
            {
                Ok(done) => {
                    println!("{}", serde_json::to_string(&done)?);
                    Ok(())
                }
                Err(refused) => anyhow::bail!("{refused}"),
            }
        }
        Command::Admin {
            command:
                AdminCommand::Rebind {
                    prefix,
                    table,
                    bind,
                    unbind,
                    reason,
                    ..
                },
        } => {
            use fencegate::{
                fence::Scope,
                store::admin::{Rebind, RebindTarget},
            };
            let max = settings.kv.max_key_bytes;
            let scope = match (bind, unbind) {
                (Some(s), _) => Some(
                    Scope::parse(&s, max).map_err(|e| anyhow::anyhow!("--bind: the scope {e}"))?,
                ),
                (None, true) => None,
                (None, false) => anyhow::bail!("say where to: --bind SCOPE, or --unbind for none"),
            };
            let store = fencegate::server::open_store(&settings).await?;
            let target = match (prefix, table) {
                (Some(prefix), _) => {
                    if let Some((bound, to)) =
                        settings.bindings()?.contradicting(&prefix, scope.as_ref())
                    {
                        anyhow::bail!("the configuration binds keys starting with {bound:?} to scope {:?}: nothing was changed", to.as_str());
                    }
                    RebindTarget::Keys { prefix }
                }
                (_, Some(table)) => {
                    let resources = store.resources(&settings.resources).await?;
                    let resource = resources.get(&table).cloned().ok_or_else(|| {
                        anyhow::anyhow!(
                            "--table: no resource {table:?} in [[resources]] of the config file"
                        )
                    })?;
                    if resource
                        .scope
                        .as_ref()
                        .is_some_and(|configured| scope.as_ref() != Some(configured))
                    {
                        anyhow::bail!("the configuration puts every write to {table:?} under another scope: nothing was changed");
                    }
                    RebindTarget::Table(resource)
                }
                _ => anyhow::bail!("name what to rebind: --prefix, or --table"),
            };
            let actor = format!(
                "cli:{}",
                std::env::var("USER").unwrap_or_else(|_| "unknown".into())
            );
            match store
                .rebind(Rebind {
                    target,
                    scope,
                    reason,
                    actor,
                })
                .await?
            {
                Ok(done) => {
                    println!("{}", serde_json::to_string(&done)?);
                    Ok(())
                }
                Err(refused) => anyhow::bail!("{refused}"),
            }
        }
        Command::Auth { .. }
        | Command::Lock(_)
        | Command::Kv { .. }
        | Command::Fence { .. }
        | Command::LockInfo(_) => {
            unreachable!("handled before the runtime starts")
        }
        Command::Guard {
            command: GuardCommand::Sql { resource, .. },
        } => {
            let store = fencegate::server::open_store(&settings).await?;
            print!(
                "{}",
                store
                    .guard_ddl(&settings.resources, resource.as_deref())
                    .await?
            );
            Ok(())
        }
        Command::Migrate(_) => {
            let mut settings = settings;
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
    }
}
