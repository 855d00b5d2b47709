//! `cargo bench --bench auth`: the CPU cost of authenticating one request, without HTTP or a
//! database: `Authenticator::authenticate` on an `Authorization` value, per credential kind.
//! The load bench (`BENCH_AUTH=1 cargo bench --bench load`) gives the end-to-end figure; this
//! one is steadier on a busy machine.

use std::time::{Duration, Instant};

use fencegate::auth::{
    digest_hex, new_key, ApiKeySettings, AuthSettings, Authenticator, JwtSettings,
};

fn settings(keys: usize) -> (AuthSettings, String) {
    let secrets: Vec<String> = (0..keys).map(|_| new_key().unwrap()).collect();
    let keys = secrets
        .iter()
        .enumerate()
        .map(|(i, s)| ApiKeySettings {
            name: format!("svc-{i}"),
            sha256: digest_hex(s),
            rights: vec!["read".into(), "write".into()],
            prefixes: vec!["".into()],
            tables: vec![],
        })
        .collect();
    (
        AuthSettings {
            keys,
            ..Default::default()
        },
        secrets.last().unwrap().clone(),
    )
}

/// ns per call of `f`, the best of 5 rounds of `n` calls.
fn time(n: u32, mut f: impl FnMut()) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(started.elapsed());
    }
    best.as_nanos() as f64 / n as f64
}

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        println!("bench/auth.rs: run with `cargo bench --bench auth`");
        return;
    }
    for keys in [1, 16] {
        let (s, good) = settings(keys);
        let auth = Authenticator::new(&s, |_| None).unwrap().unwrap();
        let header = format!("Bearer {good}");
        let ns = time(200_000, || {
            assert!(auth
                .authenticate(Some(std::hint::black_box(header.as_bytes())), None)
                .is_ok())
        });
        println!("API key, {keys:>2} configured, valid:   {ns:>8.0} ns");
        let bad = format!("Bearer {}", new_key().unwrap());
        let ns = time(200_000, || {
            assert!(auth
                .authenticate(Some(std::hint::black_box(bad.as_bytes())), None)
                .is_err())
        });
        println!("API key, {keys:>2} configured, unknown: {ns:>8.0} ns");
    }
    let var = "FENCEGATE_BENCH_JWT_SECRET";
    let secret = format!("{}{}", new_key().unwrap(), new_key().unwrap());
    let jwt = JwtSettings {
        hs256_secret_env: Some(var.into()),
        ..Default::default()
    };
    let s = AuthSettings {
        jwt: Some(jwt),
        ..Default::default()
    };
    let auth = Authenticator::new(&s, |_| Some(secret.clone()))
        .unwrap()
        .unwrap();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let claims = serde_json::json!({"sub": "svc", "exp": exp, "fencegate": {"rights": ["write"], "prefixes": [""]}});
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    let header = format!("Bearer {token}");
    let ns = time(50_000, || {
        assert!(auth
            .authenticate(Some(std::hint::black_box(header.as_bytes())), None)
            .is_ok())
    });
    println!("JWT HS256, again (remembered):   {ns:>8.0} ns");
    let pem = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt");
    let jwt = JwtSettings {
        public_key_pem_file: Some(pem.join("rsa_public.pem")),
        ..Default::default()
    };
    let s = AuthSettings {
        jwt: Some(jwt),
        ..Default::default()
    };
    let auth = Authenticator::new(&s, |_| None).unwrap().unwrap();
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(
        &std::fs::read(pem.join("rsa_private.pem")).unwrap(),
    )
    .unwrap();
    // First use of each token: the full verification (a verified token is remembered).
    let fresh: Vec<String> = (0..200)
        .map(|i| {
            let mut c = claims.clone();
            c["sub"] = format!("svc-{i}").into();
            format!(
                "Bearer {}",
                jsonwebtoken::encode(
                    &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
                    &c,
                    &key
                )
                .unwrap()
            )
        })
        .collect();
    let started = Instant::now();
    for header in &fresh {
        assert!(auth.authenticate(Some(header.as_bytes()), None).is_ok());
    }
    let ns = started.elapsed().as_nanos() as f64 / fresh.len() as f64;
    println!("JWT RS256 (2048), first use:     {ns:>8.0} ns");
    let header = &fresh[0];
    let ns = time(200_000, || {
        assert!(auth
            .authenticate(Some(std::hint::black_box(header.as_bytes())), None)
            .is_ok())
    });
    println!("JWT RS256 (2048), again:         {ns:>8.0} ns");
}
