//! Keys and scopes: the names fences are kept under.

use std::fmt;

/// Why a name was refused. The message is shown to clients as-is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} bytes long; the limit is {max} bytes (UTF-8)")]
    TooLong { len: usize, max: usize },
    #[error("contains a control character (U+{0:04X}); percent-encode printable text only")]
    ControlChar(u32),
}

fn check(raw: &str, max_bytes: usize) -> Result<(), NameError> {
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.len() > max_bytes {
        return Err(NameError::TooLong {
            len: raw.len(),
            max: max_bytes,
        });
    }
    // Control characters are refused: PostgreSQL text cannot hold NUL, and newlines or escapes
    // in names end up in logs and terminals.
    if let Some(c) = raw.chars().find(|c| c.is_control()) {
        return Err(NameError::ControlChar(c as u32));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The only way in: non-empty UTF-8, at most `max_bytes`, no control characters.
            pub fn parse(raw: &str, max_bytes: usize) -> Result<Self, NameError> {
                check(raw, max_bytes).map(|()| $name(raw.to_owned()))
            }

            /// [`Self::parse`] of text already owned (a decoded path segment): kept, not copied.
            pub fn parse_owned(raw: String, max_bytes: usize) -> Result<Self, NameError> {
                check(&raw, max_bytes).map(|()| $name(raw))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A kv key (an already percent-decoded path segment).
    Key
);
name_type!(
    /// A scope: the name of a fence shared by every key written under it (normally a lock name).
    Scope
);

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Fuzz: any string is accepted exactly when it is non-empty, within the byte limit and
        /// free of control characters, and then kept verbatim.
        #[test]
        fn any_string_is_judged_per_the_rules(raw in "\\PC{0,40}|.{0,40}", max in 1usize..64) {
            let ok = !raw.is_empty() && raw.len() <= max && !raw.chars().any(char::is_control);
            match Key::parse(&raw, max) {
                Ok(key) => {
                    proptest::prop_assert!(ok);
                    proptest::prop_assert_eq!(key.as_str(), raw.as_str());
                }
                Err(_) => proptest::prop_assert!(!ok),
            }
        }
    }

    #[test]
    fn names() {
        assert!(Key::parse("a/b ✓ 日本", 512).is_ok());
        assert_eq!(Key::parse("", 512), Err(NameError::Empty));
        assert_eq!(Key::parse("a\0b", 512), Err(NameError::ControlChar(0)));
        assert_eq!(Key::parse("a\nb", 512), Err(NameError::ControlChar(10)));
        assert_eq!(
            Key::parse(&"x".repeat(513), 512),
            Err(NameError::TooLong { len: 513, max: 512 })
        );
        // The limit counts bytes, not characters.
        assert!(Scope::parse(&"✓".repeat(171), 512).is_err());
        assert!(Scope::parse(&"✓".repeat(170), 512).is_ok());
    }
}
