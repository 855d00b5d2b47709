//! Certificates for the TLS tests, made by the `openssl` command line in a temporary directory:
//! CAs, a server certificate for 127.0.0.1 and localhost, and client certificates by CN or
//! URI SAN (SPIFFE ID). P-256 keys, in PKCS#8 PEM.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub struct Pki {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    /// A CA named `ca`, and a server certificate `server` it signed.
    pub fn new() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().expect("a temporary directory"),
        };
        pki.ca("ca");
        pki.server("server", "ca");
        pki
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).unwrap()
    }

    /// `NAME.crt`, `NAME.key`: a self-signed CA.
    pub fn ca(&self, name: &str) {
        openssl(
            self.dir.path(),
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN=fencegate test {name}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    /// `NAME.crt`, `NAME.key`: a certificate signed by the CA `ca`, with `extensions`.
    fn leaf(&self, name: &str, ca: &str, subject: &str, extensions: &str) {
        let dir = self.dir.path();
        std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                subject,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.crt"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, name: &str, ca: &str) {
        self.leaf(
            name,
            ca,
            "/CN=fencegate",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        );
    }

    /// A client certificate with subject CN `cn` and, optionally, a URI SAN.
    pub fn client(&self, name: &str, ca: &str, cn: &str, uri: Option<&str>) {
        let mut ext =
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n"
                .to_owned();
        if let Some(uri) = uri {
            ext.push_str(&format!("subjectAltName=URI:{uri}\n"));
        }
        self.leaf(name, ca, &format!("/CN={cn}"), &ext);
    }

    /// A client certificate with the subject `subject` (`/CN=a/CN=b`: two common names) and
    /// the subject alternative names `san` (`URI:spiffe://a,URI:spiffe://b`), if any.
    pub fn client_naming(&self, name: &str, ca: &str, subject: &str, san: Option<&str>) {
        let mut ext =
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n"
                .to_owned();
        if let Some(san) = san {
            ext.push_str(&format!("subjectAltName={san}\n"));
        }
        self.leaf(name, ca, subject, &ext);
    }

    /// A client certificate with subject CN `cn`, valid until `not_after` (seconds since the
    /// Unix epoch), to the second.
    pub fn client_until(&self, name: &str, ca: &str, cn: &str, not_after: u64) {
        self.leaf_until(
            name,
            ca,
            &format!("/CN={cn}"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
            not_after,
        );
    }

    /// A server certificate for 127.0.0.1 and localhost, valid until `not_after` (which may be
    /// in the past: an expired one).
    pub fn server_until(&self, name: &str, ca: &str, not_after: u64) {
        self.leaf_until(
            name,
            ca,
            "/CN=fencegate",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
            not_after,
        );
    }

    /// `NAME.crt`, `NAME.key`, signed by `ca`, valid from two minutes before `not_after` or a
    /// minute ago, whichever is earlier, until `not_after`: `openssl ca`, which takes exact dates.
    fn leaf_until(&self, name: &str, ca: &str, subject: &str, extensions: &str, not_after: u64) {
        let dir = self.dir.path();
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                subject,
            ],
        );
        std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
        std::fs::write(
            dir.join(format!("{name}.cnf")),
            format!(
                "[ca]\ndefault_ca = here\n[here]\ndatabase = {name}.index\nnew_certs_dir = .\nserial = {name}.serial\n\
                 default_md = sha256\npolicy = any\nunique_subject = no\n[any]\ncommonName = supplied\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.join(format!("{name}.index")), "").unwrap();
        std::fs::write(dir.join(format!("{name}.serial")), "1000\n").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let not_before = (now - 60).min(not_after - 120);
        openssl(
            dir,
            &[
                "ca",
                "-batch",
                "-notext",
                "-config",
                &format!("{name}.cnf"),
                "-cert",
                &format!("{ca}.crt"),
                "-keyfile",
                &format!("{ca}.key"),
                "-in",
                &format!("{name}.csr"),
                "-out",
                &format!("{name}.crt"),
                "-extfile",
                &format!("{name}.ext"),
                "-startdate",
                &asn1_time(not_before),
                "-enddate",
                &asn1_time(not_after),
            ],
        );
    }

    /// `[server.tls]` with this PKI's server certificate; `client_ca` to ask for client
    /// certificates.
    pub fn settings(&self, client_ca: Option<&str>) -> fencegate::tls::TlsSettings {
        fencegate::tls::TlsSettings {
            cert_file: self.path("server.crt"),
            key_file: self.path("server.key"),
            client_ca_file: client_ca.map(|ca| self.path(&format!("{ca}.crt"))),
        }
    }

    /// An HTTPS client trusting the CA `ca`, presenting the client certificate `identity`.
    pub fn client_for(&self, ca: &str, identity: Option<&str>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(std::time::Duration::from_secs(30))
            .add_root_certificate(
                reqwest::Certificate::from_pem(&self.read(&format!("{ca}.crt"))).unwrap(),
            );
        if let Some(name) = identity {
            let mut pem = self.read(&format!("{name}.crt"));
            pem.extend(self.read(&format!("{name}.key")));
            builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        builder.build().unwrap()
    }
}

/// `unix` (seconds since the epoch) as ASN.1 UTCTime text, `YYMMDDHHMMSSZ`.
fn asn1_time(unix: u64) -> String {
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    // The civil date of a day count (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{:02}{month:02}{day:02}{:02}{:02}{:02}Z",
        year % 100,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}
