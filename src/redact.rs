//! Secrets kept out of what fencegate prints: a database URL's password. Used by the
//! configuration (its `Debug`), the store (connection errors) and the CLI, so it belongs to
//! none of them.

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(parts) => parts,
        None => return url.to_owned(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("sqlite://fencegate.sqlite"),
            "sqlite://fencegate.sqlite"
        );
    }
}
