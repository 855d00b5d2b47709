//! Client certificates as identities: what a verified certificate names, and what an
//! `[[auth.certs]]` entry matches.

/// What an `[[auth.certs]]` entry matches.
#[derive(Debug, Clone)]
pub(super) enum CertName {
    CommonName(String),
    Uri(String),
}

/// What a verified client certificate names (`crate::tls::client_cert`): its subject's common
/// names and its URI subject alternative names, and when it is valid (seconds since the
/// epoch), checked on every request: a resumed TLS session, or a connection that outlives the
/// certificate, is not verified again by the handshake.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCert {
    pub common_names: Vec<String>,
    pub uris: Vec<String>,
    pub not_before: Option<u64>,
    pub not_after: Option<u64>,
}

impl ClientCert {
    pub(super) fn names(&self, name: &CertName) -> bool {
        match name {
            CertName::CommonName(cn) => self.common_names.iter().any(|c| c == cn),
            CertName::Uri(uri) => self.uris.iter().any(|u| u == uri),
        }
    }
}
