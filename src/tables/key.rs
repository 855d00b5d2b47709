//! The URL form of a row key: ONE path segment holding the key columns' values in the order of
//! `key = [...]`, joined by `,`, each value percent-encoded (so a comma inside a value is `%2C`
//! and a `%` is `%25`). `/v1/tables/orders/42,EU` is the row with `id = 42, region = 'EU'`.
//!
//! The segment is split on literal commas *before* percent-decoding, which is why this parser
//! reads the raw (still encoded) segment.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{Resource, RowError};

/// The key values of one row, decoded, in key-column order. Not yet checked against the
/// column types: PostgreSQL does that (and prints the canonical form) inside the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowKey {
    values: Vec<String>,
}

/// Everything but RFC 3986 unreserved characters is encoded in a canonical key, so the same
/// values always give the same text.
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl RowKey {
    /// Parses the raw path segment (or a batch op's `key`) for `resource`. `max_bytes` bounds
    /// the raw segment (`kv.max_key_bytes`).
    pub fn parse(resource: &Resource, raw: &str, max_bytes: usize) -> Result<Self, RowError> {
        let invalid = |column: Option<&str>, detail: String| RowError::Key {
            column: column.map(str::to_owned),
            detail,
        };
        if raw.len() > max_bytes {
            return Err(invalid(
                None,
                format!(
                    "the key is {} bytes long; the limit is {max_bytes} bytes",
                    raw.len()
                ),
            ));
        }
        let parts: Vec<&str> = raw.split(',').collect();
        if parts.len() != resource.key.len() {
            return Err(invalid(
                None,
                format!(
                    "the key has {} value(s) but resource {:?} has {} key column(s) ({}): join the values \
                     with ',' in that order and percent-encode a comma inside a value as %2C",
                    parts.len(),
                    resource.name,
                    resource.key.len(),
                    resource.key_names()
                ),
            ));
        }
        let mut values = Vec::with_capacity(parts.len());
        for (part, column) in parts.into_iter().zip(resource.key_columns()) {
            let name = Some(column.name.as_str());
            let value = crate::percent::decode_strict(part.as_bytes())
                .map_err(|why| invalid(name, format!("key column {:?}: {why}", column.name)))?;
            if value.is_empty() {
                return Err(invalid(
                    name,
                    format!("key column {:?}: the value is empty", column.name),
                ));
            }
            // PostgreSQL text cannot hold NUL; other control characters end up in logs.
            if let Some(c) = value.chars().find(|c| c.is_control()) {
                return Err(invalid(
                    name,
                    format!(
                        "key column {:?}: the value contains a control character (U+{:04X})",
                        column.name, c as u32
                    ),
                ));
            }
            values.push(value);
        }
        Ok(RowKey { values })
    }

    /// The decoded values, in key-column order.
    pub fn values(&self) -> &[String] {
        &self.values
    }
}

/// The canonical key: PostgreSQL's text of each key value, percent-encoded, joined by `,`.
/// It is what the ledger stores and what responses show, and it is itself a valid URL key.
pub fn canonical_key(texts: &[String]) -> String {
    texts
        .iter()
        .map(|t| utf8_percent_encode(t, ENCODE).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        fence::Rule,
        tables::{Column, Fence, KeyText},
    };

    fn resource(key: &[&str]) -> Resource {
        Resource {
            name: "orders".into(),
            relation: "public.orders".into(),
            schema: "public".into(),
            table: "orders".into(),
            columns: key
                .iter()
                .map(|name| Column {
                    name: (*name).into(),
                    sql_type: "text".into(),
                    read_only: None,
                    identity: false,
                    key_text: KeyText::Output,
                })
                .collect(),
            key: (0..key.len()).collect(),
            fence: Fence::Ledger,
            rule: Rule::Inclusive,
            scope: None,
            guard: None,
        }
    }

    #[test]
    fn splits_before_decoding() {
        let r = resource(&["id", "region"]);
        let key = RowKey::parse(&r, "42,a%2Cb%25", 512).unwrap();
        assert_eq!(key.values(), ["42", "a,b%"]);
        assert_eq!(
            RowKey::parse(&r, "caf%C3%A9,%20x", 512).unwrap().values(),
            ["café", " x"]
        );
    }

    #[test]
    fn refuses_what_cannot_be_a_key() {
        let r = resource(&["id", "region"]);
        for bad in ["42", "1,2,3", "42,", ",EU", "42,%FF", "42,a%00", "42,a%0Ab"] {
            assert!(
                matches!(RowKey::parse(&r, bad, 512), Err(RowError::Key { .. })),
                "{bad:?} was accepted"
            );
        }
        assert!(RowKey::parse(&r, &"x,".repeat(300), 512).is_err());
        let err = RowKey::parse(&r, "42,%FF", 512).unwrap_err();
        assert_eq!(err.column(), Some("region"));
    }

    #[test]
    fn canonical_keys_round_trip() {
        let r = resource(&["id", "region"]);
        let texts = vec!["42".to_string(), "a,b %é".to_string()];
        let canonical = canonical_key(&texts);
        assert_eq!(canonical, "42,a%2Cb%20%25%C3%A9");
        assert_eq!(
            RowKey::parse(&r, &canonical, 512).unwrap().values(),
            texts.as_slice()
        );
    }
}
