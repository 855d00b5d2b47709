//! Client certificates as identities: what a verified certificate names, and what an
//! `[[auth.certs]]` entry matches.

/// What an `[[auth.certs]]` entry matches.
#[derive(Debug, Clone)]
pub(super) enum CertName {
    CommonName(String),
    Uri(String),
}

/// What a verified client certificate names (`crate::tls::client_cert`): its subject's common
/// names and its URI subject alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCert {
    pub common_names: Vec<String>,
    pub uris: Vec<String>,
}

impl ClientCert {
    pub(super) fn names(&self, name: &CertName) -> bool {
        match name {
            CertName::CommonName(cn) => self.common_names.iter().any(|c| c == cn),
            CertName::Uri(uri) => self.uris.iter().any(|u| u == uri),
        }
    }
}
