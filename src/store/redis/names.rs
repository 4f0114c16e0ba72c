//! The Redis names of a store key: the key of its value, the key of its lock, the key of the
//! answer of a load for its waiters, and the channels
//! on which its namespace's fills are published (one classic channel, and on a Redis Cluster a
//! small fixed family of shard channels).

use std::io::Write;
use std::sync::atomic::Ordering;

use redis::{RedisWrite, ToRedisArgs};

use super::RedisStore;
use crate::store::key::StoreKey;

impl RedisStore {
    /// The name of the Redis key that holds the value of `key`: `{namespace}:{{digest}}:v`,
    /// the digest as 64 hex digits.
    ///
    /// The digest stands in a hash tag, so the value and the lock of a key share a Redis
    /// Cluster slot (the scripts touch both in one call); [`StoreKey`] namespaces never hold a
    /// brace that could move the tag.
    pub fn value_name(key: &StoreKey) -> String {
        KeyName::value(key).to_name()
    }

    /// The name of the Redis key that holds the lock of `key` (or its `fresh` or `failed`
    /// marker): `{namespace}:{{digest}}:l`, in the slot of [`value_name`](Self::value_name).
    pub fn lock_name(key: &StoreKey) -> String {
        KeyName::lock(key).to_name()
    }

    /// The name of the Redis key that holds the answer of a load for its waiters only (see
    /// [`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters)):
    /// `{namespace}:{{digest}}:w`, in the slot of [`value_name`](Self::value_name).
    pub fn waiters_name(key: &StoreKey) -> String {
        KeyName::waiters(key).to_name()
    }

    /// What this store's scripts publish a change of a `namespace` key on: the shard channel
    /// family on a cluster with sharded pub/sub, else the classic channel.
    pub(super) fn fill_channel(&self, namespace: &str) -> String {
        if self.sharded.load(Ordering::Relaxed) {
            shard_channel_family(namespace)
        } else {
            channel(namespace)
        }
    }
}

/// One of the Redis keys of a store key, `{namespace}:{{digest}}:{suffix}`, as the store's
/// commands take it: an argument that writes itself straight into its command's buffer, with
/// no `String` of its own (key names go into every store call, two or three at a time).
#[derive(Clone, Copy)]
pub(super) struct KeyName<'a> {
    key: &'a StoreKey,
    suffix: u8,
}

impl<'a> KeyName<'a> {
    /// The key of the value ([`RedisStore::value_name`]).
    pub(super) fn value(key: &'a StoreKey) -> Self {
        KeyName { key, suffix: b'v' }
    }

    /// The key of the lock and its markers ([`RedisStore::lock_name`]).
    pub(super) fn lock(key: &'a StoreKey) -> Self {
        KeyName { key, suffix: b'l' }
    }

    /// The key of the answer for waiters ([`RedisStore::waiters_name`]).
    pub(super) fn waiters(key: &'a StoreKey) -> Self {
        KeyName { key, suffix: b'w' }
    }

    /// The keys of the value and of the lock, in the order the scripts take them.
    pub(super) fn value_and_lock(key: &'a StoreKey) -> [Self; 2] {
        [KeyName::value(key), KeyName::lock(key)]
    }

    /// Its length in bytes.
    fn len(self) -> usize {
        self.key.namespace().len() + ":{".len() + 64 + "}:".len() + 1
    }

    /// Hands what follows the namespace to `put`, in order: `:{`, the digest's hex digits,
    /// `}:` and the suffix, all ASCII.
    fn after_namespace(self, mut put: impl FnMut(&[u8])) {
        put(b":{");
        put(&self.key.digest().hex_bytes());
        put(b"}:");
        put(&[self.suffix]);
    }

    /// As a `String`, for [`RedisStore::value_name`] and its kin.
    fn to_name(self) -> String {
        let mut name = String::with_capacity(self.len());
        name.push_str(self.key.namespace());
        // ASCII: one `char` per byte.
        self.after_namespace(|part| name.extend(part.iter().copied().map(char::from)));
        name
    }
}

impl ToRedisArgs for KeyName<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        // Put together on the stack and written whole: one copy into the command's buffer
        // instead of five writes through its `io::Write` (names go into every store call).
        let mut stack = [0u8; NAME_ON_STACK];
        if let Some(name) = stack.get_mut(..self.len()) {
            let namespace = self.key.namespace().as_bytes();
            let (start, mut rest) = name.split_at_mut(namespace.len());
            start.copy_from_slice(namespace);
            self.after_namespace(|part| {
                let (here, after) = std::mem::take(&mut rest).split_at_mut(part.len());
                here.copy_from_slice(part);
                rest = after;
            });
            out.write_arg(name);
            return;
        }
        let mut arg = out.writer_for_next_arg();
        // A command's buffer is a `Vec`: a write into it does not fail.
        let _ = arg.write_all(self.key.namespace().as_bytes());
        self.after_namespace(|part| {
            let _ = arg.write_all(part);
        });
    }
}

/// The longest key name put together on the stack: a namespace of up to 187 bytes.
const NAME_ON_STACK: usize = 256;

/// The name of a namespace's tag state (its generation, clock and tags' versions, see
/// [`store::tags`](crate::store::tags)), one hash so that it is lost as a whole:
/// `{namespace}:{tags}:h`.
pub(super) fn tag_state_name(namespace: &str) -> String {
    let namespace = crate::store::key::sanitize_namespace(namespace);
    format!("{namespace}:{{tags}}:h")
}

/// The message of a namespace's [clear](crate::store::Store::clear) on its fill channel, in the
/// place of a key's digest (then the sender's origin): 64 characters, as a digest is, that no
/// digest is (a release that does not know it ignores it as foreign).
pub(super) const CLEARED: &str = "cleared:cleared:cleared:cleared:cleared:cleared:cleared:cleared:";

/// What follows the namespace in the name of its fill channel.
const CHANNEL_SUFFIX: &str = ":filled";

/// The classic channel on which fills and releases of a namespace's keys are published: on one
/// server, and on a cluster whose servers lack sharded pub/sub (before Redis 7.0).
pub(super) fn channel(namespace: &str) -> String {
    format!("{namespace}{CHANNEL_SUFFIX}")
}

/// The hash tags of a namespace's shard channels, `{namespace}:filled{<tag>}`: tag `i` hashes
/// to a slot among the first 64 of the `i`-th sixteenth of the 16384 slots (a unit test checks
/// it), so that every master of a cluster whose slots are split evenly among up to 16 masters
/// serves at least one of them.
///
/// A script that publishes a change sends it (`SPUBLISH`) on the first of these channels that
/// its own node serves, since a script may touch only its node's slots; a process subscribes to
/// all of them (`SSUBSCRIBE`, each where its slot is served). So a fill costs one message to
/// the key's shard (its master and replicas) instead of a broadcast to every node, and a process
/// holds 16 subscriptions whatever the number of keys or nodes. A master that serves none of
/// them (a cluster split very unevenly) publishes on the classic channel instead, which every
/// process also subscribes to.
pub(super) const SHARD_TAGS: [&str; 16] = [
    "460", "131", "201", "50", "461", "130", "200", "51", "16", "247", "177", "426", "17", "246",
    "176", "427",
];

/// What a script gets in place of the classic channel to publish on the namespace's shard
/// channels: the classic channel then `{` (no namespace holds a brace), to which the script
/// appends a tag and `}`.
pub(super) fn shard_channel_family(namespace: &str) -> String {
    format!("{namespace}{CHANNEL_SUFFIX}{{")
}

/// The namespace's shard channels, one per [`SHARD_TAGS`] tag.
#[cfg(feature = "cluster")]
pub(super) fn shard_channels(namespace: &str) -> impl Iterator<Item = String> + '_ {
    SHARD_TAGS
        .iter()
        .map(move |tag| format!("{namespace}{CHANNEL_SUFFIX}{{{tag}}}"))
}

/// The namespace whose fill channel (classic or shard) is `channel`, if it is one.
pub(super) fn namespace_of(channel: &str) -> Option<&str> {
    let classic = match channel.strip_suffix('}') {
        Some(shard) => &shard[..shard.rfind('{')?],
        None => channel,
    };
    classic.strip_suffix(CHANNEL_SUFFIX)
}

/// Redis Cluster's slot of a key: CRC16 (XMODEM) of its hash tag (what lies between its
/// first `{` and the next `}`, if not empty) or of the whole key, modulo 16384. redis-rs
/// computes it too, but does not give the number out.
#[cfg(any(feature = "cluster", test))]
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

#[cfg(any(feature = "cluster", test))]
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::key::KeyDigest;
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
    fn a_name_written_into_a_command_is_the_name() {
        // The commands take `KeyName`s, written into their buffers; users and tests read the
        // `String`s: both must be the same bytes, whatever the namespace's characters.
        // The longest namespace whose names are put together on the stack, one byte more, and
        // one far too long for it.
        let (fits, over, long) = ("n".repeat(187), "n".repeat(188), "n".repeat(NAME_ON_STACK));
        assert_eq!(KeyName::value(&key(&fits, b"k")).len(), NAME_ON_STACK);
        for namespace in ["app", "ünïcödé-名前", "", &fits, &over, &long] {
            let key = key(namespace, b"key");
            let names = [
                (KeyName::value(&key), RedisStore::value_name(&key)),
                (KeyName::lock(&key), RedisStore::lock_name(&key)),
                (KeyName::waiters(&key), RedisStore::waiters_name(&key)),
            ];
            for (name, string) in names {
                assert_eq!(name.len(), string.len());
                let (mut written, mut expected) = (redis::cmd("GET"), redis::cmd("GET"));
                written.arg(name).arg("next");
                expected.arg(string.as_str()).arg("next");
                assert_eq!(written.get_packed_command(), expected.get_packed_command());
            }
        }
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
        assert_eq!(shard_channel_family("app"), "app:filled{");
        assert_eq!(namespace_of("app:filled{460}"), Some("app"));
        assert_eq!(namespace_of("app:filled}"), None);
        assert_eq!(namespace_of("app:other{460}"), None);
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn shard_channels_are_the_family_and_a_tag() {
        let shards: Vec<String> = shard_channels("app").collect();
        assert_eq!(shards.len(), 16);
        assert_eq!(shards[0], "app:filled{460}");
        for (shard, tag) in shards.iter().zip(SHARD_TAGS) {
            assert_eq!(*shard, format!("{}{tag}}}", shard_channel_family("app")));
            assert_eq!(namespace_of(shard), Some("app"));
        }
    }

    #[test]
    fn shard_tags_spread_over_the_slots() {
        for (i, tag) in SHARD_TAGS.iter().enumerate() {
            let first = u16::try_from(i).unwrap() * 1024;
            assert!(
                (first..first + 64).contains(&key_slot(tag.as_bytes())),
                "{tag}: {}",
                key_slot(tag.as_bytes())
            );
        }
    }

    #[test]
    fn key_slots_are_those_redis_computes() {
        // The CRC16/XMODEM check value, and an answer of `redis-cli CLUSTER KEYSLOT a`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"a"), 15495);
        // The hash tag rules of the Redis Cluster specification.
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }
}
