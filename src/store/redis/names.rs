//! The Redis names of a store key: the key of its value, the key of its lock, and the channel
//! on which its namespace's fills are published.

use super::RedisStore;
use crate::store::StoreKey;

impl RedisStore {
    /// The name of the Redis key that holds the value of `key`: `{namespace}:{{digest}}:v`,
    /// the digest as 64 hex digits.
    ///
    /// The digest stands in a hash tag, so the value and the lock of a key share a Redis
    /// Cluster slot (the scripts touch both in one call); [`StoreKey`] namespaces never hold a
    /// brace that could move the tag.
    pub fn value_name(key: &StoreKey) -> String {
        name(key, 'v')
    }

    /// The name of the Redis key that holds the lock of `key` (or its `fresh` or `failed`
    /// marker): `{namespace}:{{digest}}:l`, in the slot of [`value_name`](Self::value_name).
    pub fn lock_name(key: &StoreKey) -> String {
        name(key, 'l')
    }
}

/// `{namespace}:{{digest}}:{suffix}`, written straight into one allocation (key names are
/// built on every store call).
fn name(key: &StoreKey, suffix: char) -> String {
    let namespace = key.namespace();
    let mut name = String::with_capacity(namespace.len() + 70);
    name.push_str(namespace);
    name.push_str(":{");
    name.extend(key.digest().hex_bytes().map(char::from));
    name.push_str("}:");
    name.push(suffix);
    name
}

/// The names of a namespace's tag clock and of the hash of its tags' versions:
/// `{namespace}:{tags}:c` and `{namespace}:{tags}:h`, in one Redis Cluster slot.
pub(super) fn tag_names(namespace: &str) -> (String, String) {
    let namespace = crate::store::key::sanitize_namespace(namespace);
    (
        format!("{namespace}:{{tags}}:c"),
        format!("{namespace}:{{tags}}:h"),
    )
}

/// What follows the namespace in the name of its fill channel.
const CHANNEL_SUFFIX: &str = ":filled";

/// The channel on which fills and releases of a namespace's keys are published.
pub(super) fn channel(namespace: &str) -> String {
    format!("{namespace}{CHANNEL_SUFFIX}")
}

/// The namespace whose fill channel is `channel`, if it is one.
pub(super) fn namespace_of(channel: &str) -> Option<&str> {
    channel.strip_suffix(CHANNEL_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyDigest;
    use std::sync::Arc;

    fn key(namespace: &str, logical_key: &[u8]) -> StoreKey {
        StoreKey::new(Arc::from(namespace), KeyDigest::of(logical_key))
    }

    #[test]
    fn names_share_a_hash_tag_and_have_fixed_length() {
        let key = key("app", &vec![b'x'; 100_000]);
        let v = RedisStore::value_name(&key);
        let l = RedisStore::lock_name(&key);
        assert_eq!(v.len(), "app:{}:v".len() + 64);
        assert_eq!(v[..v.len() - 1], l[..l.len() - 1]);
        assert!(v.starts_with("app:{") && v.ends_with("}:v"));
    }

    #[test]
    fn names_hold_the_digest_in_hex() {
        let key = key("ns", b"key");
        let digest = key.digest().to_hex();
        assert_eq!(RedisStore::value_name(&key), format!("ns:{{{digest}}}:v"));
        assert_eq!(RedisStore::lock_name(&key), format!("ns:{{{digest}}}:l"));
    }

    #[test]
    fn a_namespace_with_braces_keeps_value_and_lock_in_one_slot() {
        // `{}` would be an empty hash tag, so Redis would hash the whole names apart.
        let key = key("a{}b", b"key");
        assert_eq!(key.namespace(), "a__b");
        assert!(RedisStore::value_name(&key).starts_with("a__b:{"));
    }

    #[test]
    fn channels_name_their_namespace() {
        assert_eq!(channel("app"), "app:filled");
        assert_eq!(namespace_of(&channel("app")), Some("app"));
        assert_eq!(namespace_of("app:other"), None);
    }
}
