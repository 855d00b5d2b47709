//! Strict percent-decoding: the one spelling of a name in a URL path segment or a header.
//!
//! A lock called `café` is `/v1/locks/caf%C3%A9`; the same name in `X-Fencing-Scope` is
//! spelled the same way, so the scope of a write and the lock that guards it cannot drift apart
//! by encoding. Lenient decoders (the `percent-encoding` crate, axum's `Path`) keep an invalid
//! escape such as `%` or `%zz` as literal text, which gives one name two spellings (`/v1/kv/%`
//! and `/v1/kv/%25` would be the same key). Here every `%` must start an escape of two hex
//! digits, the decoded bytes must be UTF-8, and the raw text must be ASCII: a raw byte above
//! 0x7F has no agreed charset in a header, and a client that means `é` must encode it.

/// Decodes `raw`, or says what is wrong with it (shown to clients as-is).
pub fn decode_strict(raw: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (raw.get(i + 1).copied().and_then(hex), raw.get(i + 2).copied().and_then(hex)) {
                    (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                    _ => {
                        return Err(format!(
                            "invalid percent-escape at byte {i}: '%' must be followed by two hex digits (send a literal '%' as %25)"
                        ))
                    }
                }
                i += 3;
            }
            b if b >= 0x80 => {
                return Err(format!(
                    "raw non-ASCII byte 0x{b:02X} at byte {i}: percent-encode the UTF-8 bytes (e.g. caf%C3%A9 for café)"
                ))
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| {
        "the percent-decoded bytes are not UTF-8; percent-encode UTF-8 text".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::decode_strict;

    #[test]
    fn decodes_valid_escapes_and_plain_text() {
        assert_eq!(decode_strict(b"caf%C3%A9").unwrap(), "café");
        assert_eq!(
            decode_strict(b"caf%c3%a9").unwrap(),
            "café",
            "hex digits in either case"
        );
        assert_eq!(decode_strict(b"billing").unwrap(), "billing");
        assert_eq!(decode_strict(b"a%2Fb%25").unwrap(), "a/b%");
        assert_eq!(
            decode_strict(b"a+b c").unwrap(),
            "a+b c",
            "'+' is not a space in a path"
        );
    }

    #[test]
    fn refuses_invalid_escapes_raw_bytes_and_bad_utf8() {
        for bad in [
            &b"%"[..],
            b"%2",
            b"a%zz",
            b"%G0",
            b"100%",
            b"caf\xC3\xA9",
            b"%C3",
            b"%FF%FE",
        ] {
            assert!(
                decode_strict(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest::proptest! {
        /// Fuzz: encoding any string's UTF-8 bytes and decoding gives the string back.
        #[test]
        fn round_trips(s in "\\PC{0,24}") {
            let encoded: String = s.bytes().map(|b| format!("%{b:02X}")).collect();
            proptest::prop_assert_eq!(decode_strict(encoded.as_bytes()).unwrap(), s);
        }
    }
}
