//! SHA-256 digests as hex text: the leaf that names, labels and content hashes share.
//!
//! It imports nothing from this crate, so `labels` and `names` can shorten values with a hash
//! without reaching `hash` (which reads the copy rule, which reads `labels`).

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// First 8 hex characters of the SHA-256 of `s`, for short collision-resistant name suffixes.
pub fn short_hash(s: &str) -> String {
    sha256_hex(s.as_bytes())[..8].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_hash_is_the_prefix_of_the_full_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(short_hash("abc"), "ba7816bf");
    }
}
