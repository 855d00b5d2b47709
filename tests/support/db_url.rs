//! Database URLs (`postgres://user:password@host:port/db?query`) taken apart and put back
//! together: one copy for the test binaries (`#[path]`-included as `db_url`) and bench/load.
//! Printing a URL goes through `fencegate::redact::redact_url`, the server's own redaction.
#![allow(dead_code)] // each user needs a different part

/// Replaces the database name (path) of a `postgres://` URL, keeping any query string.
pub fn with_database(url: &str, db: &str) -> String {
    let (head, _, query) = split(url);
    format!("{head}/{db}{query}")
}

/// `host:port` of the server (port 5432 when the URL names none).
pub fn host_port(url: &str) -> String {
    let (head, _, _) = split(url);
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let authority = &head[authority_start..];
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// The same URL pointing at another server address (`host:port`), e.g. a proxy in front of it.
pub fn with_host_port(url: &str, host_port: &str) -> String {
    let (head, path, query) = split(url);
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let userinfo_end = head[authority_start..]
        .rfind('@')
        .map_or(authority_start, |at| authority_start + at + 1);
    format!("{}{host_port}{path}{query}", &head[..userinfo_end])
}

/// (scheme and authority, path, query with its `?`), each possibly empty.
fn split(url: &str) -> (&str, &str, &str) {
    let (base, query) = url.find('?').map_or((url, ""), |i| url.split_at(i));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let (head, path) = base.split_at(path_start);
    (head, path, query)
}
