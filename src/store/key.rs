//! Key identities: what the store sees of a logical key, and who owns a lock.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

/// The fixed-length identity of a logical key: its SHA-256.
///
/// User-controlled input (a URL, a header) never reaches a store raw and never makes a store key
/// long; a cryptographic hash keeps a crafted key from colliding with another page's.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyDigest([u8; 32]);

/// Hashed by its first eight bytes: a SHA-256 digest is already evenly spread, and every map
/// keyed by digests (L1, the flights, the notifier's, the embedded store's) hashes one per
/// call. The map's own hasher still keys it (std's `RandomState`: SipHash), and equality still
/// compares all 32 bytes.
impl std::hash::Hash for KeyDigest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let [a, b, c, d, e, f, g, h, ..] = self.0;
        state.write_u64(u64::from_le_bytes([a, b, c, d, e, f, g, h]));
    }
}

/// A [`KeyDigest`] in the making, of a logical key given in parts: the digest of their
/// concatenation, for a key that would otherwise be built only to be hashed. The parts are
/// gathered a block at a time: a key is made of many short parts, and hashing each apart
/// costs more than copying it.
pub(crate) struct KeyHasher {
    hasher: Sha256,
    gathered: [u8; Self::GATHER],
    len: usize,
}

impl KeyHasher {
    /// Bytes gathered before they are hashed: four SHA-256 blocks.
    const GATHER: usize = 256;

    pub(crate) fn new() -> Self {
        KeyHasher {
            hasher: Sha256::new(),
            gathered: [0; Self::GATHER],
            len: 0,
        }
    }

    #[inline]
    pub(crate) fn update(&mut self, part: &[u8]) {
        let end = self.len + part.len();
        match self.gathered.get_mut(self.len..end) {
            Some(room) => {
                room.copy_from_slice(part);
                self.len = end;
            }
            None => self.hash_gathered_then(part),
        }
    }

    /// Hashes what is gathered, then gathers `part` (or hashes it, if longer than a
    /// gathering): apart from [`update`](Self::update), so that its common case stays small.
    #[cold]
    #[inline(never)]
    fn hash_gathered_then(&mut self, part: &[u8]) {
        self.hasher.update(&self.gathered[..self.len]);
        self.len = 0;
        if part.len() > Self::GATHER {
            self.hasher.update(part);
        } else {
            self.gathered[..part.len()].copy_from_slice(part);
            self.len = part.len();
        }
    }

    pub(crate) fn finish(mut self) -> KeyDigest {
        self.hasher.update(&self.gathered[..self.len]);
        KeyDigest(self.hasher.finalize().into())
    }
}

impl KeyDigest {
    /// The digest of a logical key.
    pub fn of(logical_key: &[u8]) -> Self {
        KeyDigest(Sha256::digest(logical_key).into())
    }

    /// A digest from its bytes (as stored by the engine).
    pub(crate) const fn from_bytes(bytes: [u8; 32]) -> Self {
        KeyDigest(bytes)
    }

    /// The digest of a tag: apart from every logical key's (a tag named like a key is not
    /// that key).
    pub fn of_tag(tag: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"tower-stampede tag\0");
        hasher.update(tag);
        KeyDigest(hasher.finalize().into())
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses 64 hex digits (as written by [`to_hex`](Self::to_hex)).
    pub fn from_hex(hex: &str) -> Option<Self> {
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut digest = [0u8; 32];
        for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
            let high = char::from(pair[0]).to_digit(16)?;
            let low = char::from(pair[1]).to_digit(16)?;
            *byte = u8::try_from(high * 16 + low).ok()?;
        }
        Some(KeyDigest(digest))
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The digest as 64 lowercase hex digits, without an allocation.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn hex_bytes(&self) -> [u8; 64] {
        hex_array(&self.0)
    }
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first 8 bytes are plenty to tell keys apart in logs.
        write!(f, "KeyDigest({}…)", hex(&self.0[..8]))
    }
}

impl fmt::Display for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A key as a store sees it: a namespace and the digest of the logical key.
///
/// Stores derive their own key names from it (see `RedisStore::value_name`).
#[derive(Clone, PartialEq, Eq)]
pub struct StoreKey {
    namespace: Arc<str>,
    digest: KeyDigest,
}

/// Hashed by its digest alone: keys of one map nearly always share their namespace, so
/// hashing it would spread nothing; equality still compares the namespace.
impl std::hash::Hash for StoreKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

impl StoreKey {
    /// A store key from a namespace and a digest.
    ///
    /// The namespace is sanitised as [`CacheBuilder::namespace`](crate::CacheBuilder::namespace)
    /// sanitises it: braces (which would break Redis Cluster hash tags) become `_`, and an empty
    /// namespace becomes `stampede`. A cache's namespace is already sanitised, so its keys keep
    /// their namespace as it is.
    pub fn new(namespace: Arc<str>, digest: KeyDigest) -> Self {
        let namespace = if is_sanitized(&namespace) {
            namespace
        } else {
            sanitize_namespace(&namespace)
        };
        StoreKey { namespace, digest }
    }

    /// The namespace (never empty, never contains `{` or `}`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The digest of the logical key.
    pub fn digest(&self) -> &KeyDigest {
        &self.digest
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({}:{:?})", self.namespace, self.digest)
    }
}

/// Makes a namespace safe for key names: braces would break the hash tag, so they become `_`;
/// an empty namespace becomes `stampede`.
pub(crate) fn sanitize_namespace(namespace: &str) -> Arc<str> {
    if namespace.is_empty() {
        return Arc::from("stampede");
    }
    namespace
        .chars()
        .map(|c| if c == '{' || c == '}' { '_' } else { c })
        .collect::<String>()
        .into()
}

/// Whether [`sanitize_namespace`] would leave `namespace` as it is.
fn is_sanitized(namespace: &str) -> bool {
    !namespace.is_empty() && !namespace.contains(['{', '}'])
}

/// The random token that names the owner of a lock.
///
/// Each attempt to lead draws a new token, so a lock can only be released, extended or filled
/// through by the attempt that took it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(u128);

impl LockToken {
    /// A new random token (128 bits from the thread-local CSPRNG).
    pub fn random() -> Self {
        LockToken(rand::random())
    }

    /// The token as 32 lowercase hex digits, as stored in the lock key.
    pub fn to_hex(&self) -> String {
        hex(&self.0.to_be_bytes())
    }

    /// The token as 32 lowercase hex digits, without an allocation.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn hex_bytes(&self) -> [u8; 32] {
        hex_array(&self.0.to_be_bytes())
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({})", self.to_hex())
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.extend(HEX_PAIRS[usize::from(*b)].map(char::from));
    }
    out
}

/// `N` bytes as `2 * N = M` lowercase hex digits.
fn hex_array<const N: usize, const M: usize>(bytes: &[u8; N]) -> [u8; M] {
    let mut out = [0u8; M];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(*b)]);
    }
    out
}

/// The two lowercase hex digits of each byte: one load per byte, where key names (three per
/// lookup) and lock values are written.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [DIGITS[b >> 4], DIGITS[b & 0xf]];
        b += 1;
    }
    pairs
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_cannot_break_the_hash_tag() {
        assert_eq!(&*sanitize_namespace("a{b}c"), "a_b_c");
        assert_eq!(&*sanitize_namespace(""), "stampede");
        let digest = KeyDigest::of(b"key");
        assert_eq!(
            StoreKey::new(Arc::from("a{b}c"), digest).namespace(),
            "a_b_c"
        );
        assert_eq!(StoreKey::new(Arc::from(""), digest).namespace(), "stampede");
        let clean: Arc<str> = Arc::from("app");
        let key = StoreKey::new(Arc::clone(&clean), digest);
        assert!(
            std::ptr::eq(key.namespace(), &*clean),
            "a clean namespace is kept as it is"
        );
    }

    #[test]
    fn digest_is_sha256() {
        assert_eq!(
            KeyDigest::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_hex_round_trips() {
        let digest = KeyDigest::of(b"key");
        assert_eq!(KeyDigest::from_hex(&digest.to_hex()), Some(digest));
        assert_eq!(
            KeyDigest::from_hex(&digest.to_hex().to_uppercase()),
            Some(digest)
        );
        assert_eq!(KeyDigest::from_hex("abc"), None);
        assert_eq!(KeyDigest::from_hex(&"zz".repeat(32)), None);
        assert_eq!(KeyDigest::from_hex(&"é".repeat(32)), None);
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(LockToken::random(), LockToken::random());
        assert_eq!(LockToken::random().to_hex().len(), 32);
    }

    #[test]
    fn hex_without_allocation_matches_hex() {
        let token = LockToken::random();
        assert_eq!(&token.hex_bytes()[..], token.to_hex().as_bytes());
        let digest = KeyDigest::of(b"key");
        assert_eq!(&digest.hex_bytes()[..], digest.to_hex().as_bytes());
    }

    #[test]
    fn every_byte_is_written_as_its_two_lowercase_hex_digits() {
        for byte in 0..=u8::MAX {
            let written = HEX_PAIRS[usize::from(byte)];
            assert_eq!(written, format!("{byte:02x}").as_bytes(), "byte {byte}");
        }
        let bytes: [u8; 4] = [0x00, 0x9f, 0xa0, 0xff];
        assert_eq!(hex_array::<4, 8>(&bytes), *b"009fa0ff");
        assert_eq!(hex(&bytes), "009fa0ff");
    }

    proptest::proptest! {
        /// A digest made of parts is the digest of their concatenation, however the parts
        /// fall against the gathered blocks (empty, short, longer than a gathering).
        #[test]
        fn a_digest_of_parts_is_the_digest_of_their_concatenation(
            parts in proptest::collection::vec(
                proptest::collection::vec(proptest::num::u8::ANY, 0..600),
                0..12,
            ),
        ) {
            let mut hasher = KeyHasher::new();
            for part in &parts {
                hasher.update(part);
            }
            proptest::prop_assert_eq!(hasher.finish(), KeyDigest::of(&parts.concat()));
        }
    }
}
