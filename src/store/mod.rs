//! Shared stores: where values and reload locks live across processes.
//!
//! A [`Store`] keeps two things per key: the cached value (with a TTL) and a short reload lock
//! (with a TTL and a random owner token). Every call is ONE round trip on Redis. A store
//! implements the calls marked *primitive*; the named writes are [`StoreExt`]'s, on top of
//! [`settle`](Store::settle) and [`change`](Store::change) for every store, and the rest are
//! defaults a store may override:
//!
//! | call | kind | what it does |
//! | --- | --- | --- |
//! | [`Store::lookup`] | primitive | value and its remaining life if present; if absent or about to expire (see [`LockWhen`]), try `SET lock NX PX` |
//! | [`Store::lookup_many`] | default: a lookup each | the lookups of a batch of keys, in one round trip |
//! | [`Store::get`] | primitive | a plain read of the value and its remaining life |
//! | [`Store::extend`] | primitive | compare-and-`PEXPIRE` of many locks at once, for the renewals of long loads |
//! | [`Store::settle`] | primitive | the end of a lock, fenced by its token: one of [`Settle`]'s |
//! | [`StoreExt::fill`] | [`Settle::Fill`] | fenced write: store the value only while the lock still holds our token, then drop the lock |
//! | [`StoreExt::renew`] | [`Settle::Renew`] | fenced renewal: the value is fresh again for a new TTL, its bytes untouched, then drop the lock |
//! | [`StoreExt::answer_waiters`] | [`Settle::AnswerWaiters`] | fenced write of a load's answer for its waiters only, beside the value (which stays, for the next load to revalidate), then drop the lock |
//! | [`StoreExt::fail`] | [`Settle::Fail`] | compare-and-replace the lock by a short failure marker: followers fail at once |
//! | [`StoreExt::release`] | [`Settle::Release`] | compare-and-delete: never removes someone else's lock |
//! | [`Store::waiters_answer`] | default: none | a plain read of the waiters' answer and its remaining life |
//! | [`Store::change`] | primitive | a change outside a load, whatever the lock holds: one of [`Change`]'s |
//! | [`StoreExt::put`] | [`Change::Put`] | write of the value (and a notification), the lock untouched; refused where the stored value's load started later ([`load_start`]) |
//! | [`StoreExt::set`] | [`Change::Set`] | write of the value, its lock voided, then notify |
//! | [`StoreExt::expire`] | [`Change::Expire`] | end of the value's freshness, its lock voided, then notify |
//! | [`StoreExt::invalidate`] | [`Change::Invalidate`] | remove the value and void its lock, whoever holds it, then notify |
//! | [`Store::invalidate_many`] | default: an invalidation each | the invalidations of several keys, in one round trip |
//! | [`Store::tag_clock`], [`Store::tag_versions`], [`Store::invalidate_tags`] | primitive | a namespace's tag state (see [`TagClock`]) |
//! | [`Store::clear`] | default: refuses | a new tag generation: every value of the namespace outdated |
//! | [`Store::subscribe`], [`Store::notifier`] | default: none | not round trips: a watch woken when the key is filled or released, and the notifier L1 entries are stamped with |
//! | [`Store::call_limit`] | default: none | not a round trip: how many calls the store takes at once |
//!
//! Two implementations ship with the crate: [`MemoryStore`], the embedded default (one process,
//! no server), and `RedisStore` (feature `redis`, on by default), shared by every process that
//! points at the same Redis or Redis Cluster (feature `cluster`).
//!
//! Stores hold opaque bytes; the [`cache`](crate::cache) engine decides what they mean, so a
//! store never needs to parse a value.
//!
//! A failed call is a [`StoreError`]: its [`kind`](StoreError::kind) says what went wrong, its
//! `source()` the client's own error. The engine answers every kind the same way, by falling
//! back to protection within this process.
//!
//! # What is for whom
//!
//! **For applications**: [`MemoryStore`], `RedisStore` and `RedisStoreBuilder` (feature
//! `redis`), and [`StoreError`] with its [`StoreErrorKind`]. Everything else here is needed
//! only to write a store of your own; applications never call it (the engine does).
//!
//! **For `Store` implementors**, the one extension point:
//!
//! - the trait, [`Store`], with what its calls take and return: [`StoreKey`] (a namespace and
//!   a [`KeyDigest`], the SHA-256 of the logical key), [`LockToken`], [`Stored`],
//!   [`Lookup`], [`LockState`], [`LockWhen`], [`Settle`], [`Settled`], [`Change`],
//!   [`Renewal`], [`BoxFuture`], and [`load_start`];
//! - the notifications a store feeds, if it has any: [`Notifier`] (the store calls
//!   [`notify`](Notifier::notify) for each change, [`lost`](Notifier::lost) and
//!   [`restored`](Notifier::restored) as its subscription drops and comes back,
//!   [`subscription_failed`](Notifier::subscription_failed)); the engine takes
//!   [`Stamp`]s and [`FillWatch`]es from it;
//! - tag invalidation: [`TagClock`], [`TagVersions`] and [`MAX_TAG_VERSIONS`];
//! - how many calls it takes at once: [`CallLimit`], shared by every cache over the store.
//!
//! A store's health is read through the cache, not the store: [`Cache::health`]
//! (`notifications_live`, `store_answers`, `breaker_closed`).
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | the [`Store`] trait; [`load_start`]; how durations become milliseconds |
//! | `named.rs` | [`StoreExt`]: the named writes, each one call of a primitive |
//! | `lookup.rs` | what a lookup asks and answers: [`LockWhen`], [`Lookup`], [`LockState`], [`Stored`] |
//! | `primitives.rs` | what the write primitives take and answer: [`Settle`], [`Settled`], [`Change`]; [`Renewal`] |
//! | `key.rs` | [`StoreKey`], [`KeyDigest`], [`LockToken`] |
//! | `notify.rs` | the [`Notifier`] and its watches |
//! | `tags.rs` | a namespace's tag state: [`TagClock`], [`TagVersions`] |
//! | `call_limit.rs` | [`CallLimit`] |
//! | `error.rs` | [`StoreError`] |
//! | `memory/` | [`MemoryStore`] |
//! | `redis/` | `RedisStore` (feature `redis`) |
//!
//! [`Cache::health`]: crate::Cache::health

mod call_limit;
mod error;
pub(crate) mod key;
mod lookup;
mod memory;
mod named;
mod notify;
mod primitives;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod tags;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use call_limit::CallLimit;
pub use error::{StoreError, StoreErrorKind};
pub use key::{KeyDigest, LockToken, StoreKey};
pub use lookup::{LockState, LockWhen, Lookup, Stored};
pub use memory::MemoryStore;
pub use named::StoreExt;
pub use notify::{FillWatch, Notifier, Stamp};
pub use primitives::{Change, Renewal, Settle, Settled};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisStoreBuilder};
pub use tags::{TagClock, TagVersions, MAX_TAG_VERSIONS};

/// A boxed, `Send` future, as returned by the object-safe [`Store`] trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A shared store of values and reload locks.
///
/// The trait is object-safe (the engine holds an `Arc<dyn Store>`); each method returns a boxed
/// future. Implementations must give every method the semantics described here, which are the
/// semantics of the Lua scripts of `RedisStore`: the engine's correctness (one load per
/// stampede, fenced writes) rests on them.
///
/// Durations are rounded down to whole milliseconds, with a floor of one millisecond and a
/// ceiling of about 34 years.
///
/// # What a store implements
///
/// A store must implement eight methods: [`lookup`](Self::lookup), [`get`](Self::get),
/// [`extend`](Self::extend), the two write primitives [`settle`](Self::settle) (the end of a
/// lock, by its holder: [`Settle`]) and [`change`](Self::change) (a change made outside a
/// load: [`Change`]), and the tag state's [`tag_clock`](Self::tag_clock),
/// [`tag_versions`](Self::tag_versions) and [`invalidate_tags`](Self::invalidate_tags). The
/// named writes the engine calls ([`StoreExt::fill`], [`renew`](StoreExt::renew),
/// [`answer_waiters`](StoreExt::answer_waiters), [`fail`](StoreExt::fail),
/// [`release`](StoreExt::release); [`put`](StoreExt::put), [`set`](StoreExt::set),
/// [`expire`](StoreExt::expire), [`invalidate`](StoreExt::invalidate)) are [`StoreExt`]'s,
/// implemented for every store on top of the two primitives, one call of a primitive each: a
/// store does not write them, and a wrapper store forwards the primitives alone. The other
/// provided methods have defaults a store overrides
/// where it can do better: a batch in one round trip ([`lookup_many`](Self::lookup_many),
/// [`invalidate_many`](Self::invalidate_many)), a waiters' slot
/// ([`waiters_answer`](Self::waiters_answer)), notifications ([`subscribe`](Self::subscribe),
/// [`notifier`](Self::notifier)), [`clear`](Self::clear), a [`call_limit`](Self::call_limit).
///
/// # Locks that lapse
///
/// A lock taken (or [extended](Self::extend)) for `lock_ttl` *holds* for `lock_ttl`: until
/// then, no other token takes it. Then it *lapses*: any lookup may take it, as if it were
/// free. But until someone does, or for ten times its `lock_ttl`, the lapsed lock is
/// still its holder's: the fenced calls (every [`settle`](Self::settle), and
/// [`extend`](Self::extend)) take it as held. The fence is against another holder, not
/// against the clock: a leader whose renewal came late (a slow network, a busy process) still
/// fills where nobody took its place, instead of leaving the key to a second load. Whatever
/// voids a lock (a [`change`](Self::change) other than a [`Change::Put`], another leader's
/// lock, fill or release) voids a lapsed one too, so a load that started before such a change
/// still cannot fill.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Reads the value of `key` and, when `lock_when` says so, also tries to take its lock
    /// with `token` for `lock_ttl`.
    ///
    /// With [`LockWhen::LifeAtMost`], a value whose remaining life is more than the bound is
    /// fresh: it is returned with [`LockState::NotRequested`]. An absent value, or one with
    /// less life left, or one without expiry, is stale: the lookup asks for the lock. With
    /// [`LockWhen::Always`] it asks for the lock whatever it finds.
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>>;

    /// [`lookup`](Self::lookup)s each of `keys` with `token`, in one round trip (on a Redis
    /// Cluster, one per master, all at once): for a batch
    /// ([`Cache::get_many_or_load`](crate::Cache::get_many_or_load)), whose missing keys' locks
    /// are taken in the same trip as the lookup of the whole batch. Answers in the order of
    /// `keys`, each as its own lookup would (the locks are per key: one token may hold many).
    /// On an error, locks may have been taken for some keys: the caller releases them. The
    /// default looks the keys up one after the other, a call each.
    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        let keys = keys.to_vec();
        Box::pin(async move {
            let mut found = Vec::with_capacity(keys.len());
            for key in &keys {
                found.push(self.lookup(key, token, lock_ttl, lock_when).await?);
            }
            Ok(found)
        })
    }

    /// Ends the lock of `key` that `token` holds as `how` says (see [`Settle`] for the
    /// semantics of each), fenced by the lock, in one round trip; answers what it did.
    fn settle(
        &self,
        key: &StoreKey,
        token: LockToken,
        how: Settle,
    ) -> BoxFuture<'_, Result<Settled, StoreError>>;

    /// Changes `key` as `what` says, whatever its lock holds (see [`Change`] for the
    /// semantics of each), in one round trip; answers whether the change was made (`false`
    /// only for a [`Change::Put`] refused by load starts).
    fn change(&self, key: &StoreKey, what: Change) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Reads the waiters' slot of `key` (see [`Settle::AnswerWaiters`]): the answer and its
    /// remaining life, if one is there. The default has no such slot: `None`.
    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let _ = key;
        Box::pin(async { Ok(None) })
    }

    /// Renews locks: the lock of each `(key, token)` of `locks` holds for `lock_ttl` from now
    /// if it is that token's (held, or lapsed while nobody took it); answers, in order, whether
    /// it was. One round trip however many locks there are (on a Redis Cluster, one per
    /// master, all at once): the engine renews every lock its leaders hold, a batch's among
    /// them, in one call.
    fn extend(
        &self,
        locks: &[(StoreKey, LockToken)],
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<bool>, StoreError>>;

    /// Reads the value of `key`, without touching the lock.
    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>>;

    /// Watches `key` for "filled" notifications: a successful [`fill`](StoreExt::fill) or
    /// [`release`](StoreExt::release) of `key`, by any process, wakes the watch. Followers wait on
    /// it and poll as well, so a store may lose notifications (Redis pub/sub does) at the cost
    /// of latency only. The default has no notifications: followers only poll.
    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        let _ = key;
        None
    }

    /// [`Change::Invalidate`]s each of `keys` (as [`StoreExt::invalidate`] does one), in one
    /// round trip (on a Redis Cluster, one per slot, all at once): for a change that names
    /// several keys (an HTTP URL with and without credentials, its `Location`). The default
    /// changes them one after the other, a call each.
    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        let keys = keys.to_vec();
        Box::pin(async move {
            for key in &keys {
                self.change(key, Change::Invalidate).await?;
            }
            Ok(())
        })
    }

    /// The tag generation and clock of `namespace` (see [`TagClock`]): the clock counts the
    /// [`invalidate_tags`](Self::invalidate_tags) calls of the generation. Where the namespace
    /// has no tag state (none yet, or it was lost), starts it: a new random generation, at
    /// clock 0. The engine reads it before a load, and stores it with the value's tags.
    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>>;

    /// The current generation of `namespace`, and the clock at which each of `tags`
    /// (digests) was last invalidated in it, in order (0 for a tag not invalidated in it);
    /// `None` where the namespace has no tag state (then every tagged value is outdated). One
    /// round trip whatever the number of tags.
    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>>;

    /// Invalidates `tags` in `namespace`: moves the tag clock on and records its new value for
    /// each tag, so that every value loaded before (whose stored clock is lower) is a miss;
    /// then notifies every process of each tag (as of a key with the tag's digest), so that
    /// their L1 entries carrying it are dropped. A constant number of store calls, however
    /// many values carry the tags. Where the namespace has no tag state, or keeps
    /// [`MAX_TAG_VERSIONS`] already, first starts a new generation (every tagged value of an
    /// older one is outdated).
    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Clears `namespace`: starts a new tag generation in it (as a lost tag state does; see
    /// [`tag_clock`](Self::tag_clock)), so that every value the engine stored under an older
    /// one is outdated, whatever their number, in one round trip; then notifies every process
    /// ([`Notifier::cleared`]), whose L1 forgets what it holds. The default cannot clear: it
    /// fails and changes nothing.
    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = namespace;
        Box::pin(async { Err(StoreError::new("this store cannot clear a namespace")) })
    }

    /// The notifier this store feeds, if it has notifications: the engine stamps L1 entries
    /// with it ([`Notifier::stamp`]), so that what one process changes, every process's L1
    /// forgets. Without one, L1 entries live out their (capped) TTL.
    ///
    /// A store with a notifier notifies it of each change it makes (a fill, release, failure
    /// marker, put, invalidation, set or expiry that took effect) exactly once, before the call
    /// returns, and of every change made elsewhere once it hears of it.
    fn notifier(&self) -> Option<&Notifier> {
        None
    }

    /// How many calls the store takes at once before it queues them inside its client, where
    /// their time would run against the engine's store timeout while they have not even been
    /// sent: a limit the store owns, shared by its clones, so that every cache over the store
    /// keeps its calls within it together. The engine keeps at most this many calls out (half
    /// for lookups, half for the calls of flights past their lookup) and makes the others wait
    /// for room, their timeout not yet running. A wrapper store returns its inner store's.
    ///
    /// Default: `None`, and each cache over the store keeps a limit of its own, of
    /// [`CallLimit::DEFAULT_CALLS`].
    fn call_limit(&self) -> Option<&CallLimit> {
        None
    }
}

/// When the load of a value the engine wrote started, in milliseconds since the UNIX epoch,
/// as [`StoreExt::put`]'s fence compares them: bytes 8 to 16 (big-endian) of a value that starts
/// with the engine's header (`TS`, then a version of 2 or more). `None` for other bytes,
/// which the fence lets any write replace.
///
/// Load starts are read on each process's wall clock: two loads started within the clocks'
/// disagreement of each other are ordered as those clocks say, either being about as new.
pub fn load_start(value: &[u8]) -> Option<u64> {
    match value.get(..16)? {
        [b'T', b'S', version, _, _, _, _, _, start @ ..] if *version >= 2 => {
            Some(u64::from_be_bytes(start.try_into().ok()?))
        }
        _ => None,
    }
}

/// How long a lock key lives, the one place that says it: its TTL while its leader holds it,
/// then ten times that while it lapsed, kept for its holder while nobody takes it (see the
/// [`Store`] trait's "Locks that lapse"); eleven TTLs in all. The lapsed time costs nothing
/// but the lock key of a leader that died, which lingers that long (nobody waits for it: a
/// lapsed lock is anyone's to take). Shorter, it left out the leaders that most need it: a
/// process on a machine with more busy processes than cores stalled past twice a 150 ms lock,
/// and its fill was refused where nobody had taken its lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockLife {
    /// While its leader holds it: the lock's TTL.
    pub(crate) held: Duration,
    /// Then while it lapsed.
    pub(crate) lapsed: Duration,
}

impl LockLife {
    pub(crate) fn of(lock_ttl: Duration) -> Self {
        LockLife {
            held: lock_ttl,
            lapsed: lock_ttl.saturating_mul(10),
        }
    }

    /// The lock key's whole life.
    pub(crate) fn whole(self) -> Duration {
        self.held.saturating_add(self.lapsed)
    }
}

/// The longest TTL a store is asked for (about 34 years): Redis rejects expiry times that
/// overflow its clock, and no cache entry needs more.
const MAX_MILLIS: u64 = 1 << 40;

/// Whole milliseconds, at least one (Redis rejects `PX 0`) and at most [`MAX_MILLIS`].
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_has_a_floor_and_a_ceiling() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }
}
