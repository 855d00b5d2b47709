//! `fencegate sign`: the X-Fencing-Proof an [[issuers]] lock service would send for a token.

use std::{path::PathBuf, process::ExitCode};

use base64::Engine;
use fencegate::{
    fence::{FencingToken, Scope},
    issuers::SigningKey,
};

#[derive(clap::Args)]
pub struct Args {
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
}

/// Prints the proof. A proof needs no settings: what can be wrong is the usage (a malformed
/// token, a missing key or secret), exit 2 as for the other client commands.
pub fn run(args: Args) -> ExitCode {
    match proof(&args) {
        Ok(proof) => {
            println!("{proof}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fencegate sign: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn proof(args: &Args) -> anyhow::Result<String> {
    let token =
        FencingToken::parse(args.token.as_bytes()).map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    Scope::parse(&args.scope, 2048).map_err(|e| anyhow::anyhow!("--scope: the scope {e}"))?;
    Ok(match (&args.hmac_secret_env, &args.ed25519_key_file) {
        (Some(var), _) => {
            let secret = std::env::var(var)
                .map_err(|_| anyhow::anyhow!("--hmac-secret-env: {var} is not set"))?;
            fencegate::issuers::sign(&args.scope, token, SigningKey::Hmac(secret.as_bytes()))
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
            fencegate::issuers::sign(&args.scope, token, SigningKey::Ed25519(&seed))
        }
        (None, None) => anyhow::bail!("give --hmac-secret-env or --ed25519-key-file"),
    })
}
