//! The fencing token: a canonical decimal in `0..=i64::MAX` (a PostgreSQL `bigint`).

use std::fmt;

/// A validated fencing token. [`FencingToken::parse`] is the only way to make one from input,
/// so a value of this type is always in range and came from a canonical decimal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token must be a canonical decimal integer (digits only, no sign, no leading zeros, no spaces)")]
    NotCanonical,
    #[error("the token is larger than 9223372036854775807 (the largest PostgreSQL bigint)")]
    OutOfRange,
}

impl FencingToken {
    pub const MAX: FencingToken = FencingToken(i64::MAX);
    pub const ZERO: FencingToken = FencingToken(0);

    /// Parses a header value. Only `0` or a digit string without leading zeros is canonical:
    /// "+1", "-0", "007", " 1", "1e3", "0x10" and "1.0" are all rejected. Rejecting
    /// non-canonical forms matters because two clients must never disagree about which token
    /// they hold: "007" and "7" would otherwise be the same token spelled two ways.
    pub fn parse(raw: &[u8]) -> Result<Self, TokenError> {
        match raw {
            [] => Err(TokenError::Empty),
            [b'0'] => Ok(FencingToken(0)),
            [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => {
                // At most 19 digits fit; overflow is detected by checked arithmetic, not length.
                let mut value: i64 = 0;
                for digit in raw {
                    value = value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(i64::from(digit - b'0')))
                        .ok_or(TokenError::OutOfRange)?;
                }
                Ok(FencingToken(value))
            }
            _ => Err(TokenError::NotCanonical),
        }
    }

    /// Builds a token from a value read back from the database, where the column is a
    /// non-negative bigint by constraint. Negative values would mean a corrupted row.
    pub fn from_db(value: i64) -> Option<Self> {
        (value >= 0).then_some(FencingToken(value))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Tokens travel in JSON as strings: JavaScript clients lose precision above 2^53.
impl serde::Serialize for FencingToken {
    /// A JSON string of the decimal digits. Written with `itoa`, not through `Display`
    /// (`collect_str` goes through the formatting machinery and an escaping writer).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(itoa::Buffer::new().format(self.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_a_json_string_of_its_digits() {
        for n in [0, 7, 10, 1_700_000_000_000_000, i64::MAX] {
            let token = FencingToken::from_db(n).unwrap();
            assert_eq!(serde_json::to_string(&token).unwrap(), format!("\"{n}\""));
        }
    }

    #[test]
    fn accepts_canonical_decimals() {
        assert_eq!(FencingToken::parse(b"0").unwrap().get(), 0);
        assert_eq!(FencingToken::parse(b"42").unwrap().get(), 42);
        assert_eq!(
            FencingToken::parse(b"9223372036854775807").unwrap(),
            FencingToken::MAX
        );
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "", "-1", "+1", "-0", "007", "00", " 1", "1 ", "1 2", "0x10", "1e3", "1.0", "abc", "١",
            "９",
        ] {
            assert!(
                FencingToken::parse(bad.as_bytes()).is_err(),
                "{bad:?} was accepted"
            );
        }
        assert_eq!(
            FencingToken::parse(b"9223372036854775808"),
            Err(TokenError::OutOfRange)
        );
        assert_eq!(
            FencingToken::parse(b"99999999999999999999999"),
            Err(TokenError::OutOfRange)
        );
    }

    proptest::proptest! {
        /// Fuzz: any bytes parse or fail cleanly, and parse succeeds exactly for canonical
        /// decimals that fit, to the value they spell.
        #[test]
        fn any_bytes_parse_exactly_per_the_contract(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..24)) {
            let canonical = !raw.is_empty()
                && raw.iter().all(u8::is_ascii_digit)
                && (raw.len() == 1 || raw[0] != b'0');
            let fits = canonical && std::str::from_utf8(&raw).unwrap().parse::<i64>().is_ok();
            match FencingToken::parse(&raw) {
                Ok(t) => {
                    proptest::prop_assert!(fits);
                    let shown = t.to_string();
                    proptest::prop_assert_eq!(shown.as_bytes(), &raw[..]);
                }
                Err(_) => proptest::prop_assert!(!fits),
            }
        }

        #[test]
        fn every_token_round_trips(v in 0..=i64::MAX) {
            let t = FencingToken::parse(v.to_string().as_bytes()).unwrap();
            proptest::prop_assert_eq!(t.get(), v);
        }

        #[test]
        fn digit_strings_never_panic(s in "[0-9+-]{0,30}") {
            let _ = FencingToken::parse(s.as_bytes());
        }
    }

    #[test]
    fn serializes_as_a_string() {
        let t = FencingToken::parse(b"9223372036854775807").unwrap();
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"9223372036854775807\""
        );
    }
}
