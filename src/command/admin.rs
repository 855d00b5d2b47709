//! `fencegate admin reset|rebind`: audited administration against the database itself, for
//! when the HTTP side is locked down. Acts as `cli:$USER`, in one transaction each.

use fencegate::{
    config::Settings,
    fence::{FencingToken, Key, Scope},
    store::admin::{Rebind, RebindTarget, Reset, ResetTarget},
    tables::RowKey,
};

use super::{cli_actor, ServerArgs};

#[derive(clap::Subcommand)]
pub enum Command {
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

pub async fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Reset {
            scope,
            key,
            table,
            row,
            to,
            bind,
            unbind,
            reason,
            ..
        } => {
            let store = fencegate::server::open_store(&settings).await?;
            let max = settings.kv.max_key_bytes;
            let target = match (scope, key, table) {
                (Some(scope), _, _) => ResetTarget::Scope(parse_scope("--scope", &scope, max)?),
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
                    let row = RowKey::parse(&resource, row.as_deref().unwrap_or_default(), max)
                        .map_err(|e| anyhow::anyhow!("--row: {e}"))?;
                    ResetTarget::Row { resource, key: row }
                }
                _ => anyhow::bail!("name what to reset: --scope, --key, or --table with --row"),
            };
            let to = to
                .map(|to| {
                    FencingToken::parse(to.as_bytes()).map_err(|e| anyhow::anyhow!("--to: {e}"))
                })
                .transpose()?;
            let scope = match (bind, unbind) {
                (Some(s), _) => Some(Some(parse_scope("--bind", &s, max)?)),
                (None, true) => Some(None),
                (None, false) => None,
            };
            let reset = Reset {
                target,
                to,
                scope,
                reason,
                actor: cli_actor(),
            };
            match store.reset(reset).await? {
                Ok(done) => print_json(&done),
                Err(refused) => anyhow::bail!("{refused}"),
            }
        }
        Command::Rebind {
            prefix,
            table,
            bind,
            unbind,
            reason,
            ..
        } => {
            let max = settings.kv.max_key_bytes;
            let scope = match (bind, unbind) {
                (Some(s), _) => Some(parse_scope("--bind", &s, max)?),
                (None, true) => None,
                (None, false) => anyhow::bail!("say where to: --bind SCOPE, or --unbind for none"),
            };
            let store = fencegate::server::open_store(&settings).await?;
            let target = match (prefix, table) {
                (Some(prefix), _) => {
                    if let Some((bound, to)) =
                        settings.bindings()?.contradicting(&prefix, scope.as_ref())
                    {
                        anyhow::bail!(
                            "the configuration binds keys starting with {bound:?} to scope {:?}: nothing was changed",
                            to.as_str()
                        );
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
                        anyhow::bail!(
                            "the configuration puts every write to {table:?} under another scope: nothing was changed"
                        );
                    }
                    RebindTarget::Table(resource)
                }
                _ => anyhow::bail!("name what to rebind: --prefix, or --table"),
            };
            let rebind = Rebind {
                target,
                scope,
                reason,
                actor: cli_actor(),
            };
            match store.rebind(rebind).await? {
                Ok(done) => print_json(&done),
                Err(refused) => anyhow::bail!("{refused}"),
            }
        }
    }
}

fn parse_scope(flag: &str, scope: &str, max: usize) -> anyhow::Result<Scope> {
    Scope::parse(scope, max).map_err(|e| anyhow::anyhow!("{flag}: the scope {e}"))
}

fn print_json(done: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(done)?);
    Ok(())
}
