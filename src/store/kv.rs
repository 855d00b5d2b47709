//! What a kv write carries and what it leaves, the same on every backend.

use serde_json::value::RawValue;

use super::{decode::ScopeState, StoreError};
use crate::fence::{FencingToken, Guard, Key, Outcome, Scope};

/// A kv operation inside a batch (or a single write).
#[derive(Debug, Clone)]
pub enum Write {
    Put { key: Key, value: Document },
    Delete { key: Key },
}

impl Write {
    pub fn key(&self) -> &Key {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// A JSON document to store, kept as the client's text: checked, never parsed into a tree.
///
/// A write's value goes from the request body to the database's `jsonb` (or SQLite's text)
/// unchanged, so nothing is allocated per member, walked, or printed again; the database
/// parses it once, as it must anyway. Numbers keep their exact text, as they did when the
/// value was a `serde_json::Value` (the crate's `arbitrary_precision`).
#[derive(Debug, Clone)]
pub struct Document(Box<RawValue>);

impl Document {
    /// `raw` (one well-formed JSON value, as serde_json checked it; it does not limit nesting
    /// when it keeps a value as text) if every backend can store it and read it back:
    /// PostgreSQL `jsonb` refuses the NUL character (`\u0000`) and a UTF-16 surrogate escape
    /// that is not half of a pair, in strings and object keys alike, and a read parses at most
    /// [`MAX_DEPTH`] levels of nesting. Checked before any write, so such a value is a 400 for
    /// the client (and identical on every backend), never a database error or a value that
    /// cannot be read.
    pub fn new(raw: Box<RawValue>) -> Result<Document, String> {
        check_escapes(raw.get())?;
        Ok(Document(raw))
    }

    /// A value built in code (tests, tools), under the same check.
    pub fn from_value(value: &serde_json::Value) -> Result<Document, String> {
        Document::new(serde_json::value::to_raw_value(value).map_err(|e| e.to_string())?)
    }

    /// The JSON text, as sent.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

/// Serialized as the text it holds: `sqlx::types::Json(&document)` binds it as `jsonb` as sent.
impl serde::Serialize for Document {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// The deepest nesting of arrays and objects a value may have: what serde_json allows when it
/// parses a value, as every read of a stored value does. A deeper value would be stored but
/// could never be read back, and PostgreSQL's own parser runs out of stack far deeper.
pub const MAX_DEPTH: usize = 127;

/// What `jsonb` and a later read cannot take in well-formed JSON `text` (see
/// [`Document::new`]): nesting beyond [`MAX_DEPTH`], and the `\u` escapes it refuses. One pass:
/// outside strings JSON has no backslash, and inside one every backslash starts an escape.
fn check_escapes(text: &str) -> Result<(), String> {
    let bytes = text.as_bytes();
    // The code unit of the `\uXXXX` at `at`, if one starts there.
    let unit = |at: usize| -> Option<u16> {
        let hex = bytes.get(at..at + 6)?;
        (hex[0] == b'\\' && hex[1] == b'u')
            .then(|| std::str::from_utf8(&hex[2..]).ok())
            .flatten()
            .and_then(|h| u16::from_str_radix(h, 16).ok())
    };
    let (mut i, mut depth, mut in_string) = (0, 0usize, false);
    while i < bytes.len() {
        let at = i;
        i += 1;
        match bytes[at] {
            b'"' => in_string = !in_string,
            b'[' | b'{' if !in_string => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "arrays and objects are nested more than {MAX_DEPTH} deep; flatten the value"
                    ));
                }
            }
            b']' | b'}' if !in_string => depth -= 1,
            b'\\' => {
                i = at + 2;
                let Some(code) = unit(at) else { continue };
                i = at + 6;
                match code {
                    0 => {
                        return Err(
                            "JSON strings and object keys must not contain \\u0000 (PostgreSQL jsonb cannot store it)"
                                .into(),
                        )
                    }
                    0xD800..=0xDBFF => match unit(at + 6) {
                        Some(0xDC00..=0xDFFF) => i = at + 12,
                        _ => {
                            return Err(format!(
                                "the escape {} is the first half of a UTF-16 surrogate pair, and no second half follows it",
                                &text[at..at + 6]
                            ))
                        }
                    },
                    0xDC00..=0xDFFF => {
                        return Err(format!(
                            "the escape {} is the second half of a UTF-16 surrogate pair, with no first half before it",
                            &text[at..at + 6]
                        ))
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The stored state a write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub key: Key,
    /// `false` if the key held a live value before this write.
    pub was_live: bool,
    pub version: i64,
}

/// A live value, as read back. The value is shared, not copied, between the reads of one key
/// that a coalesced statement answers together (`pg/reads.rs`): a burst of reads of one large
/// value holds it once.
#[derive(Debug, Clone)]
pub struct Entry {
    pub value: std::sync::Arc<serde_json::Value>,
    pub fence_token: FencingToken,
    pub scope: Option<String>,
    pub version: i64,
    pub updated_at: String,
}

/// Result of a claim: the scope's fence now equals the presented token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub created: bool,
}

/// Fenced kv writes, scope claims and reads (`kv.rs`).
pub(in crate::store) trait KvStore {
    /// A write's statement is run by a worker of the backend's, not by the caller's future:
    /// then the caller may await it on its own task (a dropped request abandons nothing).
    fn writes_on_workers(&self) -> bool;

    /// Likewise for reads.
    fn reads_on_workers(&self) -> bool;

    async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError>;

    /// Every write or none, under one token.
    async fn batch(
        &self,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Outcome<Vec<Written>>, StoreError>;

    async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError>;

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError>;

    async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError>;

    /// A scope's fence and the latest token granted by the built-in lock of that name: what
    /// the verdict reads to explain a refusal without a write.
    async fn scope_state(&self, scope: &Scope) -> Result<ScopeState, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::Document;
    use proptest::prelude::*;
    use serde_json::{json, value::RawValue, Value};

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn has_nul(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(a) => a.iter().any(has_nul),
            Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }

    fn text(json: &str) -> Result<Document, String> {
        let raw: Box<RawValue> = serde_json::from_str(json).expect("well-formed JSON");
        Document::new(raw)
    }

    /// Pieces of a JSON string's text, escapes that matter among them.
    fn string_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(r"\u0000"),
            Just(r"\\u0000"),
            Just(r"\\"),
            Just(r#"\""#),
            Just(r"\uD83D"),
            Just(r"\uDE00"),
            Just(r"\udbff"),
            Just(r"\udfff"),
            Just(r"\u0041"),
            Just(r"\n"),
            Just("a"),
            Just("é"),
        ];
        prop::collection::vec(piece, 0..8).prop_map(|p| format!("\"{}\"", p.concat()))
    }

    proptest! {
        /// Fuzz: any JSON value is refused exactly when a string or key holds a NUL.
        #[test]
        fn storable_iff_no_nul(v in json_value()) {
            prop_assert_eq!(Document::from_value(&v).is_ok(), !has_nul(&v));
        }

        /// Fuzz, with serde_json's own string parser as the oracle: a string's text is taken
        /// exactly when it decodes to a string (every surrogate escape paired) without a NUL.
        #[test]
        fn escapes_are_judged_as_a_decoder_would(s in string_text()) {
            let decoded = serde_json::from_str::<String>(&s);
            let want = matches!(&decoded, Ok(d) if !d.contains('\0'));
            prop_assert_eq!(text(&s).is_ok(), want, "{} decodes to {:?}", s, decoded);
            let as_key = format!("{{{s}: 1}}");
            prop_assert_eq!(text(&as_key).is_ok(), want);
        }
    }

    #[test]
    fn nul_deep_inside_is_found() {
        assert!(Document::from_value(&json!({"a": [1, {"b": "x\u{0}"}]})).is_err());
        assert!(Document::from_value(&json!({"a\u{0}": 1})).is_err());
        assert!(Document::from_value(&json!({"a": ["fine", 1, null]})).is_ok());
    }

    #[test]
    fn the_text_is_kept_as_sent() {
        let sent = r#"{"n": 1.50, "big": 123456789012345678901234567890, "s": "\u00e9\/"}"#;
        assert_eq!(text(sent).unwrap().as_str(), sent);
    }

    /// serde_json's own parse is the oracle: what it can read back is what may be stored.
    #[test]
    fn nesting_stops_where_a_read_would() {
        for depth in [1, 2, 126, 127, 128, 129, 5000] {
            for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
                let leaf = if open == "[" { "" } else { "1" };
                let json = format!("{}{leaf}{}", open.repeat(depth), close.repeat(depth));
                let readable = serde_json::from_str::<Value>(&json).is_ok();
                assert_eq!(readable, depth <= super::MAX_DEPTH, "depth {depth}");
                let doc = serde_json::from_str::<Box<RawValue>>(&json)
                    .map_err(|e| e.to_string())
                    .and_then(Document::new);
                assert_eq!(doc.is_ok(), readable, "depth {depth} {open}: {doc:?}");
            }
        }
        // Brackets inside strings are text, however many.
        let json = format!("[\"{}\", \"\\\"[\"]", "[".repeat(500));
        assert!(text(&json).is_ok());
    }

    #[test]
    fn surrogates_must_pair() {
        assert!(text(r#""\uD83D\uDE00""#).is_ok());
        let lone = text(r#""\uD83Dx""#).unwrap_err();
        assert!(lone.contains(r"\uD83D"), "{lone}");
        assert!(text(r#""\uDE00""#).is_err());
        assert!(text(r#""\uD83D\u0041""#).is_err());
        assert!(text(r#""\uD83D""#).is_err());
    }
}
