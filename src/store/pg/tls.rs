//! TLS to PostgreSQL: the libpq URL parameters `sslmode`, `sslrootcert`, `sslcert` and `sslkey`
//! (or `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), read by sqlx, with libpq's meaning
//! where sqlx's differs, and errors that name the parameter, the file and what failed.
//!
//! Where fencegate follows libpq rather than sqlx:
//! - a Unix-socket host never uses TLS, whatever `sslmode` says (the server offers none there);
//! - `sslmode=require` with an `sslrootcert` checks the certificate against it (`verify-ca`);
//! - `sslmode=allow` tries without TLS, then with it (decided once, at start-up);
//! - `sslrootcert=system`: the bundled public root CAs, and `verify-full` unless told otherwise.
//!
//! The files are read and parsed before connecting, so a missing or unreadable file, or one
//! without the expected PEM, is named instead of surfacing as an I/O error of the connection.

use std::path::PathBuf;

use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection};

/// A file parameter and where it came from (`sslrootcert` in the URL or `PGSSLROOTCERT`).
#[derive(Debug, Clone)]
struct FileParam {
    name: &'static str,
    path: PathBuf,
}

impl FileParam {
    /// `sslrootcert=/path`
    fn shown(&self) -> String {
        format!("{}={}", self.name, self.path.display())
    }
}

/// The TLS settings a connection was made with, to explain its failure.
#[derive(Debug, Clone)]
pub struct PgTls {
    mode: PgSslMode,
    /// How the mode was chosen, for messages: `sslmode=verify-full`, `PGSSLMODE=require`, ...
    mode_shown: String,
    root: Option<FileParam>,
    cert: Option<FileParam>,
    key: Option<FileParam>,
    host: String,
    socket: bool,
}

const MODES: &str = "disable, allow, prefer, require, verify-ca or verify-full";

fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// The URL's last value of any of `names`, else the environment variable `env`: (shown name, value).
fn param(
    url: &url::Url,
    names: &[&'static str],
    env: &'static str,
) -> Option<(&'static str, String)> {
    let from_url = url
        .query_pairs()
        .filter_map(|(k, v)| {
            names
                .iter()
                .find(|n| **n == k)
                .map(|n| (*n, v.into_owned()))
        })
        .last();
    from_url.or_else(|| {
        std::env::var(env)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| (env, v))
    })
}

/// Connect options for `url` (see the module documentation) and the TLS settings they carry.
/// Fails, naming the parameter and the file, when a TLS file cannot be used.
pub fn options(url: &str) -> anyhow::Result<(PgConnectOptions, PgTls)> {
    let shown_url = crate::redact::redact_url(url);
    let mut parsed = url::Url::parse(url)
        .map_err(|e| anyhow::anyhow!("invalid database URL {shown_url}: {e}"))?;

    let mode_param = param(&parsed, &["sslmode", "ssl-mode"], "PGSSLMODE");
    let given_mode = match &mode_param {
        Some((name, value)) => Some(value.parse::<PgSslMode>().map_err(|_| {
            let place = if name.starts_with("PG") {
                "in the environment"
            } else {
                "in the database URL"
            };
            anyhow::anyhow!("{name}={value} {place} is not an sslmode: use one of {MODES}")
        })?),
        None => None,
    };
    let root_param = param(
        &parsed,
        &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        "PGSSLROOTCERT",
    );

    // sslrootcert=system: the bundled public roots, which sqlx trusts anyway; sqlx would read
    // "system" as a file name, so it is taken out of the URL.
    let system_roots = root_param.as_ref().is_some_and(|(_, v)| v == "system");
    if system_roots {
        if root_param
            .as_ref()
            .is_some_and(|(name, _)| name.starts_with("PG"))
        {
            anyhow::bail!("PGSSLROOTCERT=system is not supported: put sslrootcert=system in the database URL instead");
        }
        if let Some(mode) = given_mode.filter(|m| !matches!(m, PgSslMode::VerifyFull)) {
            anyhow::bail!(
                "sslmode={} cannot be used with sslrootcert=system: use sslmode=verify-full (or leave sslmode out)",
                mode_name(mode)
            );
        }
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !["sslrootcert", "ssl-root-cert", "ssl-ca"].contains(&k.as_ref()))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(kept);
        if parsed.query() == Some("") {
            parsed.set_query(None);
        }
    }

    let mut options: PgConnectOptions = parsed
        .as_str()
        .parse()
        .map_err(|e| anyhow::anyhow!("invalid database URL {shown_url}: {e}"))?;
    let socket = options.get_socket().is_some() || options.get_host().starts_with('/');
    let file = |p: Option<(&'static str, String)>| {
        p.map(|(name, value)| FileParam {
            name,
            path: value.into(),
        })
    };
    let root = if system_roots { None } else { file(root_param) };
    let cert = file(param(&parsed, &["sslcert", "ssl-cert"], "PGSSLCERT"));
    let key = file(param(&parsed, &["sslkey", "ssl-key"], "PGSSLKEY"));

    let mut mode = given_mode.unwrap_or(if system_roots {
        PgSslMode::VerifyFull
    } else {
        PgSslMode::Prefer
    });
    let mut mode_shown = match &mode_param {
        Some((name, value)) => format!("{name}={value}"),
        None if system_roots => {
            "sslmode=verify-full, the default with sslrootcert=system".to_owned()
        }
        None => "sslmode=prefer, the default".to_owned(),
    };
    if socket {
        // libpq: no TLS over a Unix socket; the server answers a TLS request there with "no".
        mode = PgSslMode::Disable;
        mode_shown = "a Unix socket, where sslmode does not apply".to_owned();
    } else if matches!(mode, PgSslMode::Require) && root.is_some() {
        // libpq: "require" with a root CA file checks the certificate chain against it.
        mode = PgSslMode::VerifyCa;
        mode_shown =
            format!("{mode_shown} with sslrootcert, which checks the CA as verify-ca does");
    }
    options = options.ssl_mode(mode);

    let tls = PgTls {
        mode,
        mode_shown,
        root,
        cert,
        key,
        host: options.get_host().to_owned(),
        socket,
    };
    if !matches!(mode, PgSslMode::Disable) {
        tls.check_files()?;
    }
    Ok((options, tls))
}

fn read(param: &FileParam) -> anyhow::Result<Vec<u8>> {
    std::fs::read(&param.path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read {} (database URL): {e}. The file must exist and be readable by the user fencegate runs as",
            param.shown()
        )
    })
}

fn certificates(param: &FileParam) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let data = read(param)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&data).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => anyhow::bail!(
            "{} holds no PEM certificate (a block starting -----BEGIN CERTIFICATE-----)",
            param.shown()
        ),
        Err(e) => anyhow::bail!(
            "{} holds no PEM certificate that can be read: {e}",
            param.shown()
        ),
    }
}

impl PgTls {
    fn check_files(&self) -> anyhow::Result<()> {
        if let Some(root) = &self.root {
            certificates(root)?;
        }
        match (&self.cert, &self.key) {
            (Some(cert), None) => anyhow::bail!(
                "{} is given without sslkey: a client certificate needs its private key (sslkey=FILE in the database URL)",
                cert.shown()
            ),
            (None, Some(key)) => anyhow::bail!(
                "{} is given without sslcert: a private key needs its client certificate (sslcert=FILE in the database URL)",
                key.shown()
            ),
            (Some(cert), Some(key)) => {
                certificates(cert)?;
                let data = read(key)?;
                if let Err(e) = PrivateKeyDer::from_pem_slice(&data) {
                    let encrypted = String::from_utf8_lossy(&data).contains("ENCRYPTED");
                    anyhow::bail!(
                        "{} holds no PEM private key that can be used ({e}): an unencrypted PKCS#8, PKCS#1 (RSA) or SEC1 (EC) key is needed{}",
                        key.shown(),
                        if encrypted { "; this one is encrypted, which is not supported (openssl pkey -in KEY -out KEY.plain)" } else { "" }
                    );
                }
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// `sslmode=allow`, as libpq: without TLS if the server accepts that, else with it. Decided
    /// once with a trial connection; the options of every later connection follow.
    pub async fn resolve_allow(&mut self, options: PgConnectOptions) -> PgConnectOptions {
        if !matches!(self.mode, PgSslMode::Allow) {
            return options;
        }
        let plain = options.clone().ssl_mode(PgSslMode::Disable);
        match plain.connect().await {
            Ok(conn) => {
                let _ = conn.close().await;
                self.mode = PgSslMode::Disable;
                plain
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("28000") => {
                self.mode = PgSslMode::Require;
                self.mode_shown = "sslmode=allow, which went on to TLS when the server refused a connection without it".into();
                options.ssl_mode(PgSslMode::Require)
            }
            // Anything else is reported by the real connection.
            Err(_) => {
                self.mode = PgSslMode::Disable;
                plain
            }
        }
    }

    /// What went wrong with TLS, for a connection error; `None` when it is not about TLS.
    pub fn explain(&self, err: &sqlx::Error) -> Option<String> {
        let mode = &self.mode_shown;
        let roots = match &self.root {
            Some(root) => root.shown(),
            None => "the bundled public root CAs (no sslrootcert given)".to_owned(),
        };
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => format!(
                "the client certificate {} (with {})",
                cert.shown(),
                key.shown()
            ),
            _ => "no client certificate (sslcert and sslkey)".to_owned(),
        };
        let tls_error = match err {
            sqlx::Error::Io(e) => e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
            sqlx::Error::Tls(e) => e.downcast_ref::<rustls::Error>(),
            _ => None,
        };
        if let Some(e) = tls_error {
            return Some(match e {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
                | rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. }) => format!(
                    "the server's certificate is not valid for the host \"{}\" ({mode}): {e}. Connect by a name or \
                     address the certificate lists, or use sslmode=verify-ca to check the CA but not the name",
                    self.host
                ),
                rustls::Error::InvalidCertificate(_) => format!(
                    "the server's certificate does not verify against {roots}: {e} ({mode}). Give as sslrootcert \
                     the CA certificate that signed the server's (for a managed database: the provider's CA bundle)"
                ),
                rustls::Error::AlertReceived(alert) => format!(
                    "the server ended the TLS handshake ({alert:?}) ({mode}), having been sent {client}: if it asks \
                     for client certificates, give one signed by a CA in the server's ssl_ca_file"
                ),
                other => format!("the TLS handshake with the server failed ({mode}): {other}"),
            });
        }
        match err {
            sqlx::Error::Tls(e) if e.to_string().contains("does not support TLS") => Some(format!(
                "the server does not accept TLS ({mode} requires it): turn ssl on in the server, or connect to one that has it"
            )),
            sqlx::Error::Tls(e) => Some(format!("TLS with the server failed ({mode}): {e}")),
            sqlx::Error::Configuration(e) if self.cert.is_some() || self.key.is_some() => {
                Some(format!("{client} cannot be used: {e}"))
            }
            sqlx::Error::Database(db) if db.code().as_deref() == Some("28000") => {
                let msg = db.message();
                if msg.contains("no encryption") && matches!(self.mode, PgSslMode::Disable) && !self.socket {
                    Some(format!(
                        "the server refused a connection without TLS ({mode}): {msg}. Set sslmode=verify-full with \
                         sslrootcert=the server's CA file (or sslmode=require, which encrypts without checking the \
                         certificate) in the database URL"
                    ))
                } else if msg.contains("requires a valid client certificate") {
                    Some(format!(
                        "the server requires a client certificate: {msg}. Set sslcert=FILE and sslkey=FILE in the database \
                         URL (a certificate signed by a CA in the server's ssl_ca_file, whose CN is the user name)"
                    ))
                } else if msg.contains("certificate authentication failed") {
                    Some(format!(
                        "{msg}: the server accepted {client}, but its CN is not the database user (nor mapped to it in pg_ident.conf)"
                    ))
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// For a connection error: what `explain` says, or `generic`.
    pub fn describe(&self, err: &sqlx::Error, generic: impl FnOnce() -> String) -> String {
        self.explain(err).unwrap_or_else(generic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_with_a_root_certificate_checks_the_ca_and_a_socket_never_uses_tls() {
        let dir = tempfile_dir();
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, TEST_CERT).unwrap();
        let (opts, tls) = super::options(&format!(
            "postgres://h/db?sslmode=require&sslrootcert={}",
            ca.display()
        ))
        .unwrap();
        assert_eq!(mode_name(opts.get_ssl_mode()), "verify-ca");
        assert!(
            tls.mode_shown.contains("sslmode=require with sslrootcert"),
            "{}",
            tls.mode_shown
        );
        let (opts, _) = options_of(
            "postgres:///db?host=/run/postgresql&sslmode=verify-full&sslrootcert=/nonexistent",
        );
        assert_eq!(mode_name(opts.get_ssl_mode()), "disable");
        let (opts, _) = options_of("postgres://%2Frun%2Fpostgresql/db?sslmode=require");
        assert_eq!(mode_name(opts.get_ssl_mode()), "disable");
    }

    #[test]
    fn sslrootcert_system_means_the_bundled_roots_and_verify_full() {
        let (opts, tls) = options_of("postgres://db.example/app?sslrootcert=system");
        assert_eq!(mode_name(opts.get_ssl_mode()), "verify-full");
        assert!(tls.root.is_none());
        let err = super::options("postgres://db.example/app?sslrootcert=system&sslmode=require")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sslmode=require cannot be used with sslrootcert=system"),
            "{err}"
        );
    }

    fn options_of(url: &str) -> (PgConnectOptions, PgTls) {
        super::options(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn tempfile_dir() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fencegate-pg-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Only the PEM framing is read here, not the certificate.
    const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
}
