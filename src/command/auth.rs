//! `fencegate auth new-key`: a fresh API key and the config block that admits it.

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print a fresh random API key and the [[auth.keys]] block (with its sha256) for the config.
    NewKey {
        /// The actor's name: in logs, and the owner of the leases it takes.
        #[arg(long, default_value = "my-service")]
        name: String,
    },
}

/// The key on stdout's first line (for scripts), then the config block; the key is shown once
/// and never stored anywhere by fencegate.
pub fn run(command: Command) -> anyhow::Result<()> {
    let Command::NewKey { name } = command;
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
    print!("{}", fencegate::auth::key_block(&name, &key));
    Ok(())
}
