//! API keys: configured as sha256 digests only, made by `fencegate auth new-key`.

use sha2::{Digest, Sha256};

/// 64 hex digits -> 32 bytes.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The sha256 of `key`, in lower-case hex: what `[[auth.keys]] sha256` holds.
pub fn digest_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh API key: 32 bytes from the OS, URL-safe base64 without padding (43 characters).
pub fn new_key() -> anyhow::Result<String> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| anyhow::anyhow!("the OS random number generator failed: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The `[[auth.keys]]` block for a key (what `fencegate auth new-key` prints).
pub fn key_block(name: &str, key: &str) -> String {
    format!(
        "[[auth.keys]]\nname = {name:?}\nsha256 = \"{}\"\nrights = [\"read\", \"write\", \"lock\"]   # least rights: read, write, lock, fence, admin\nprefixes = [\"{name}/\"]   # the keys, scopes and lock names it may touch (\"\" = all)\ntables = []\n",
        digest_hex(key)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keys_are_long_and_url_safe() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_eq!(parse_digest(&digest_hex(&a)).map(|d| d.len()), Some(32));
        assert!(key_block("svc", &a).contains(&digest_hex(&a)));
    }
}
