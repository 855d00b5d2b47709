//! HTTPS on the listener: `[server.tls]` (a PEM certificate chain and its key, and optionally a
//! PEM file of CAs whose client certificates are asked for and verified), served with rustls.
//!
//! - The configuration is built once at start-up, where a bad file is an error naming the file
//!   and what is wrong with it, and again on SIGHUP ([`Tls::replace`]): each new connection
//!   takes the configuration current when it is accepted, so a connection already open keeps
//!   the certificate it was served with, and none is dropped.
//! - ALPN offers `h2` and `http/1.1`; a client offering neither (or no ALPN) gets HTTP/1.1.
//! - With `client_ca_file`, a client certificate is asked for but not required: one that does
//!   not verify against those CAs fails the handshake; none at all falls back to a bearer
//!   credential (`auth`). What a verified certificate names ([`ClientCert`]) goes with every
//!   request of its connection, for `[[auth.certs]]`.

use std::{
    path::Path,
    sync::{Arc, RwLock},
};

use anyhow::{bail, Context};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    sign::CertifiedKey,
    RootCertStore, ServerConfig,
};
use serde::Deserialize;

use crate::auth::ClientCert;

/// `[server.tls]`: HTTPS on the listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain, the server's own certificate first.
    pub cert_file: std::path::PathBuf,
    /// PEM private key of that certificate (unencrypted).
    pub key_file: std::path::PathBuf,
    /// PEM CA certificates: ask clients for a certificate and verify it against these.
    pub client_ca_file: Option<std::path::PathBuf>,
}

/// The listener's TLS configuration, replaceable while serving.
pub struct Tls {
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Reads and checks every file of `settings`.
    pub fn new(settings: &TlsSettings) -> anyhow::Result<Tls> {
        Ok(Tls {
            current: RwLock::new(server_config(settings)?),
        })
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    /// A new configuration, for connections accepted from now on.
    pub fn replace(&self, config: Arc<ServerConfig>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration of `settings`; every error names the file and the problem.
pub fn server_config(settings: &TlsSettings) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = provider();
    let chain = certificates(&settings.cert_file, "server.tls.cert_file")?;
    usable_server_certificate(&chain[0], &settings.cert_file)?;
    let key = private_key(&settings.key_file)?;
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        anyhow::anyhow!(
            "server.tls.key_file {} cannot be used with the certificate in server.tls.cert_file {}: {e} (the key \
             must be the private key of the chain's first certificate, RSA, ECDSA or Ed25519)",
            settings.key_file.display(),
            settings.cert_file.display()
        )
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(path, "server.tls.client_ca_file")? {
                roots.add(cert).map_err(|e| {
                    anyhow::anyhow!(
                        "server.tls.client_ca_file {}: a certificate is not a usable CA: {e}",
                        path.display()
                    )
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| {
                    anyhow::anyhow!("server.tls.client_ca_file {}: {e}", path.display())
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Refuses a server certificate every handshake would fail with: one that is not valid now
/// (expired, or not yet valid), or one whose extended key usage does not include server
/// authentication (a client certificate). At start-up that stops fencegate, on SIGHUP the
/// running certificate is kept; either way the message names the file and the reason.
fn usable_server_certificate(der: &[u8], path: &Path) -> anyhow::Result<()> {
    use x509_cert::{
        der::{
            oid::db::rfc5280::{ANY_EXTENDED_KEY_USAGE, ID_KP_SERVER_AUTH},
            Decode,
        },
        ext::pkix::ExtendedKeyUsage,
        Certificate,
    };
    let cert = Certificate::from_der(der).map_err(|e| {
        anyhow::anyhow!(
            "server.tls.cert_file {}: the first certificate cannot be read: {e}",
            path.display()
        )
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let validity = &cert.tbs_certificate.validity;
    if now > validity.not_after.to_unix_duration() {
        bail!(
            "server.tls.cert_file {}: the certificate expired at {} (notAfter): every handshake would fail",
            path.display(),
            validity.not_after
        );
    }
    if now < validity.not_before.to_unix_duration() {
        bail!(
            "server.tls.cert_file {}: the certificate is not valid before {} (notBefore): every handshake would fail",
            path.display(),
            validity.not_before
        );
    }
    if let Ok(Some((_, usage))) = cert.tbs_certificate.get::<ExtendedKeyUsage>() {
        if !usage
            .0
            .iter()
            .any(|oid| *oid == ID_KP_SERVER_AUTH || *oid == ANY_EXTENDED_KEY_USAGE)
        {
            bail!(
                "server.tls.cert_file {}: the certificate is not for server authentication (its extendedKeyUsage \
                 lacks serverAuth; a client certificate?): every handshake would fail",
                path.display()
            );
        }
    }
    Ok(())
}

/// Every certificate of a PEM file (at least one).
fn certificates(path: &Path, setting: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("{setting}: cannot read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{setting}: {} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{setting}: {} holds no certificate (expected \"-----BEGIN CERTIFICATE-----\" blocks)",
            path.display()
        );
    }
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("server.tls.key_file: cannot read {}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow::anyhow!(
            "server.tls.key_file: {} holds no usable private key ({e}); expected an unencrypted PEM key \
             (\"-----BEGIN PRIVATE KEY-----\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\")",
            path.display()
        )
    })
}

/// What the verified end-entity certificate `der` names: its subject's common names and its
/// URI subject alternative names (SPIFFE IDs). A certificate rustls verified always parses; if
/// one did not, it names nothing (and so matches no `[[auth.certs]]` entry).
pub fn client_cert(der: &[u8]) -> ClientCert {
    use x509_cert::{
        der::{oid::db::rfc4519::CN, Decode},
        ext::pkix::{name::GeneralName, SubjectAltName},
        Certificate,
    };
    let mut named = ClientCert::default();
    let Ok(cert) = Certificate::from_der(der) else {
        return named;
    };
    for rdn in cert.tbs_certificate.subject.0.iter() {
        for attribute in rdn.0.iter() {
            if attribute.oid == CN {
                // UTF8String, PrintableString, IA5String: their bytes are the text.
                if let Ok(text) = std::str::from_utf8(attribute.value.value()) {
                    named.common_names.push(text.to_owned());
                }
            }
        }
    }
    let validity = &cert.tbs_certificate.validity;
    named.not_before = Some(validity.not_before.to_unix_duration().as_secs());
    named.not_after = Some(validity.not_after.to_unix_duration().as_secs());
    if let Ok(Some((_, san))) = cert.tbs_certificate.get::<SubjectAltName>() {
        for name in san.0 {
            if let GeneralName::UniformResourceIdentifier(uri) = name {
                named.uris.push(uri.as_str().to_owned());
            }
        }
    }
    named
}
