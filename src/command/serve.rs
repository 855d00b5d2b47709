//! `fencegate serve`: bind the listener, announce the port, serve until a shutdown signal.

use fencegate::config::Settings;

use super::ServerArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on, e.g. 127.0.0.1:8080 (overrides FENCEGATE_LISTEN).
    #[arg(long)]
    pub listen: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn run(settings: Settings, reload: fencegate::server::Reload) -> anyhow::Result<()> {
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
    fencegate::server::serve_reloadable(
        settings,
        listener,
        fencegate::server::shutdown_signal(),
        announce,
        Some(reload),
    )
    .await
}
