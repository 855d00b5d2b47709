//! The client's one way to talk to fencegate: a reqwest client (rustls for https URLs), the
//! bearer credential from `FENCEGATE_API_KEY`, and the exit status a response stands for.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::{Method, RequestBuilder};

use super::ClientTls;

/// Everything but RFC 3986 unreserved characters is escaped, so any key or lock name (`/`,
/// `%`, `é` included) reaches the server as the one spelling it decodes strictly.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A name as a URL path segment, or as the value of `X-Fencing-Scope` (decoded the same way).
pub fn segment(name: &str) -> String {
    utf8_percent_encode(name, SEGMENT).to_string()
}

pub const TOKEN: &str = "x-fencing-token";
pub const SCOPE: &str = "x-fencing-scope";

/// Exit statuses of the client commands (docs/api.md, *The command line as a client*).
pub mod exit {
    pub const OK: u8 = 0;
    /// 5xx, or no answer at all (refused, timed out, not HTTP).
    pub const UNAVAILABLE: u8 = 1;
    /// Another 4xx, or bad usage.
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const STALE: u8 = 4;
}

/// A fencegate at `url`.
#[derive(Clone)]
pub struct Api {
    base: reqwest::Url,
    http: reqwest::Client,
    bearer: Option<String>,
    /// What fencegate's certificate is checked against, for messages.
    roots: String,
}

/// What came back.
#[derive(Debug)]
pub enum Answer {
    Status {
        status: u16,
        body: String,
    },
    /// No HTTP answer: why (connection refused, timeout, ...).
    None(String),
    /// Not sent: the request itself cannot be built (a header value with a newline, ...).
    Unsendable(String),
}

impl Api {
    /// `timeout`: the longest any one request may take, connecting included.
    /// `tls`: the CA to trust and the client certificate to present, for an https:// URL.
    pub fn new(url: &str, timeout: Duration, tls: &ClientTls) -> Result<Api, String> {
        let base =
            reqwest::Url::parse(url).map_err(|e| format!("--url {url:?} is not a URL: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(format!("--url {url:?} must be an http:// or https:// URL"));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        let mut roots =
            "the bundled public root CAs (give fencegate's CA with --cacert FILE)".to_owned();
        if let Some(cacert) = &tls.cacert {
            let pem = read_pem(cacert, "--cacert")?;
            let cas = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|cas| !cas.is_empty() && has_block(&pem, "CERTIFICATE"))
                .ok_or_else(|| {
                    format!(
                        "--cacert {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        cacert.display()
                    )
                })?;
            // As curl's --cacert: these CAs instead of the public ones.
            builder = builder.tls_built_in_root_certs(false);
            for ca in cas {
                builder = builder.add_root_certificate(ca);
            }
            roots = format!("--cacert {}", cacert.display());
        }
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let mut pem = read_pem(cert, "--cert")?;
                if !has_block(&pem, "CERTIFICATE") {
                    return Err(format!(
                        "--cert {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        cert.display()
                    ));
                }
                let key_pem = read_pem(key, "--key")?;
                if !has_block(&key_pem, "PRIVATE KEY")
                    || has_block(&key_pem, "ENCRYPTED PRIVATE KEY")
                {
                    return Err(format!(
                        "--key {} holds no unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1)",
                        key.display()
                    ));
                }
                pem.push(b'\n');
                pem.extend_from_slice(&key_pem);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    format!(
                        "--cert {} with --key {} cannot be used: {}",
                        cert.display(),
                        key.display(),
                        describe(&e)
                    )
                })?;
                builder = builder.identity(identity);
            }
            (Some(cert), None) => {
                return Err(format!(
                    "--cert {} needs its private key: give --key FILE (or FENCEGATE_KEY)",
                    cert.display()
                ))
            }
            (None, Some(key)) => {
                return Err(format!(
                    "--key {} needs its certificate: give --cert FILE (or FENCEGATE_CERT)",
                    key.display()
                ))
            }
            (None, None) => {}
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {}", describe(&e)))?;
        let bearer = std::env::var("FENCEGATE_API_KEY")
            .ok()
            .filter(|key| !key.is_empty());
        Ok(Api {
            base,
            http,
            bearer,
            roots,
        })
    }

    /// The base URL, as handed to a wrapped command in `FENCEGATE_URL`.
    pub fn url(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// A request to `path` (already encoded: build it with [`segment`]) under the base URL.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!("{}{path}", self.url());
        let rb = self.http.request(method, url);
        match &self.bearer {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    /// Sends `rb` and reads the whole answer.
    pub async fn send(&self, rb: RequestBuilder) -> Answer {
        match rb.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.text().await {
                    Ok(body) => Answer::Status { status, body },
                    Err(e) => Answer::None(format!("the answer ({status}) broke off: {e}")),
                }
            }
            Err(e) if e.is_builder() => Answer::Unsendable(describe(&e)),
            Err(e) => Answer::None(self.explain(describe(&e))),
        }
    }
}

impl Api {
    /// A TLS failure with what to check.
    fn explain(&self, text: String) -> String {
        if text.contains("invalid peer certificate") {
            if text.contains("NotValidForName") || text.contains("not valid for name") {
                format!("{text} (fencegate's certificate does not name the host of --url: use a name it lists)")
            } else {
                format!(
                    "{text} (fencegate's certificate does not verify against {})",
                    self.roots
                )
            }
        } else if text.contains("CertificateRequired")
            || text.contains("BadCertificate")
            || text.contains("UnknownCA")
        {
            format!("{text} (fencegate did not accept the client certificate: give one signed by a CA it trusts with --cert and --key)")
        } else {
            text
        }
    }
}

fn read_pem(path: &std::path::Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
}

/// Whether `pem` has a `-----BEGIN ...LABEL-----` block.
fn has_block(pem: &[u8], label: &str) -> bool {
    String::from_utf8_lossy(pem).lines().any(|line| {
        line.starts_with("-----BEGIN ") && line.trim_end().ends_with(&format!("{label}-----"))
    })
}

/// reqwest's error with its causes: "error sending request" alone says nothing useful.
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Answer {
    /// 0 on 2xx, 4 on 412, 3 on 404, 2 on another 4xx, 1 on 5xx or no answer.
    pub fn exit_code(&self) -> u8 {
        match self {
            Answer::Status {
                status: 200..=299, ..
            } => exit::OK,
            Answer::Status { status: 412, .. } => exit::STALE,
            Answer::Status { status: 404, .. } => exit::NOT_FOUND,
            Answer::Status {
                status: 400..=499, ..
            }
            | Answer::Unsendable(_) => exit::USAGE,
            Answer::Status { .. } | Answer::None(_) => exit::UNAVAILABLE,
        }
    }

    /// A JSON field of the body, if the body is a JSON object that has it.
    pub fn field(&self, name: &str) -> Option<serde_json::Value> {
        match self {
            Answer::Status { body, .. } => serde_json::from_str::<serde_json::Value>(body)
                .ok()?
                .get(name)
                .cloned(),
            Answer::None(_) | Answer::Unsendable(_) => None,
        }
    }

    /// One line for stderr: the status with the problem's type and detail, or why there was no
    /// answer.
    pub fn summary(&self) -> String {
        match self {
            Answer::None(why) => format!("no answer from fencegate: {why}"),
            Answer::Unsendable(why) => format!("cannot send this request: {why}"),
            Answer::Status { status, .. } => {
                let text = |name| self.field(name).and_then(|v| v.as_str().map(str::to_owned));
                let kind =
                    text("type").map(|t| t.rsplit('/').next().unwrap_or_default().to_owned());
                match (kind, text("detail")) {
                    (Some(kind), Some(detail)) => format!("{status} {kind}: {detail}"),
                    _ => format!("HTTP {status}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_to_the_one_spelling_the_server_decodes() {
        assert_eq!(segment("job-1.a_b~c"), "job-1.a_b~c");
        assert_eq!(segment("a/b c%"), "a%2Fb%20c%25");
        assert_eq!(segment("café"), "caf%C3%A9");
        assert_eq!(
            fencegate::percent::decode_strict(segment("a/b c%é").as_bytes()).unwrap(),
            "a/b c%é"
        );
    }

    #[test]
    fn statuses_map_to_the_pinned_exit_codes() {
        let status = |status| {
            Answer::Status {
                status,
                body: String::new(),
            }
            .exit_code()
        };
        assert_eq!(
            [status(200), status(201), status(412), status(404)],
            [0, 0, 4, 3]
        );
        assert_eq!(
            [status(400), status(409), status(428), status(401)],
            [2, 2, 2, 2]
        );
        assert_eq!([status(500), status(503)], [1, 1]);
        assert_eq!(Answer::None("refused".into()).exit_code(), 1);
    }

    #[test]
    fn only_http_urls_are_taken() {
        assert!(Api::new(
            "http://127.0.0.1:8080",
            Duration::from_secs(1),
            &ClientTls::default()
        )
        .is_ok());
        assert!(Api::new(
            "https://fencegate.example/",
            Duration::from_secs(1),
            &ClientTls::default()
        )
        .is_ok());
        assert!(Api::new("ftp://x", Duration::from_secs(1), &ClientTls::default()).is_err());
        assert!(Api::new(
            "127.0.0.1:8080",
            Duration::from_secs(1),
            &ClientTls::default()
        )
        .is_err());
    }
}
