//! Shared stores: where values and reload locks live across processes.
//!
//! A [`Store`] keeps two things per key: the cached value (with a TTL) and a short reload lock
//! (with a TTL and a random owner token). Every call is ONE round trip on Redis:
//!
//! | call | what it does |
//! | --- | --- |
//! | [`Store::lookup`] | value and its remaining life if present; if absent or about to expire (see [`LockWhen`]), try `SET lock NX PX` |
//! | [`Store::lookup_many`] | the lookups of a batch of keys, in one round trip |
//! | [`Store::fill`] | fenced write: store the value only while the lock still holds our token, then drop the lock |
//! | [`Store::release`] | compare-and-delete: never removes someone else's lock |
//! | [`Store::extend`] | compare-and-`PEXPIRE` of many locks at once, for the renewals of long loads |
//! | [`Store::renew`] | fenced renewal: the value is fresh again for a new TTL, its bytes untouched, then drop the lock |
//! | [`Store::fail`] | compare-and-replace the lock by a short failure marker: followers fail at once |
//! | [`Store::answer_waiters`] | fenced write of a load's answer for its waiters only, beside the value (which stays, for the next load to revalidate), then drop the lock |
//! | [`Store::waiters_answer`] | a plain read of that answer and its remaining life |
//! | [`Store::put`] | write of the value (and a notification) whatever the lock holds, the lock untouched; refused where the stored value's load started later ([`load_start`]) |
//! | [`Store::get`] | a plain read of the value and its remaining life |
//! | [`Store::invalidate`], [`Store::invalidate_many`] | remove the value (of each key) and void its lock, whoever holds it, then notify |
//! | [`Store::subscribe`] | not a round trip: a watch woken when the key is filled or released |
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
//!   [`Lookup`], [`LockState`], [`LockWhen`], [`Renewal`], [`BoxFuture`], and [`load_start`];
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
//! [`Cache::health`]: crate::Cache::health

mod call_limit;
mod error;
pub(crate) mod key;
mod memory;
mod notify;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod tags;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

pub use call_limit::CallLimit;
pub use error::{StoreError, StoreErrorKind};
pub use key::{KeyDigest, LockToken, StoreKey};
pub use memory::MemoryStore;
pub use notify::{FillWatch, Notifier, Stamp};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisStore, RedisStoreBuilder};
pub use tags::{TagClock, TagVersions, MAX_TAG_VERSIONS};

/// A boxed, `Send` future, as returned by the object-safe [`Store`] trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A value read from a store, with its remaining life there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The bytes as they were filled.
    pub bytes: Bytes,
    /// How long the value has left in the store; `None` if it has no expiry (a foreign write).
    pub ttl: Option<Duration>,
}

/// What happened to the reload lock during a [`Store::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// The value was fresh, so the lock was not asked for.
    NotRequested,
    /// The lock is now ours, under the token we passed: we are the leader.
    Acquired,
    /// Someone else holds the lock: we are a follower.
    HeldElsewhere,
    /// The last load failed a moment ago (see [`Store::fail`]): nobody may reload until the
    /// failure marker expires, and followers fail (or serve stale) at once.
    Failed,
}

/// When a [`Store::lookup`] asks for the reload lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockWhen {
    /// When the value is absent, or its remaining life in the store is at most this (a value
    /// without expiry counts as stale). The engine passes how long a value is kept in the store
    /// past its freshness, so the lock is asked for exactly when the value is stale.
    LifeAtMost(Duration),
    /// Whatever the value's remaining life: for a value that must be replaced, fresh or not
    /// (the engine overwrites a corrupt entry this way). The lock is still only taken where
    /// nobody holds it.
    Always,
    /// For an early refresh: when the remaining life is at most `life`, although the value
    /// stays fresh while its remaining life is above `fresh_above` (the stale period). A store
    /// that marks fresh values measures the mark the fill leaves from `fresh_above`, so the
    /// refreshed value is marked fresh for all of its freshness.
    Early {
        /// Take the lock when the remaining life is at most this.
        life: Duration,
        /// The value is fresh while its remaining life is above this.
        fresh_above: Duration,
    },
}

/// The answer of a [`Store::lookup`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The value, fresh or not, if the store has one.
    pub value: Option<Stored>,
    /// Whether the lock was asked for and who holds it.
    pub lock: LockState,
}

/// What a [`Store::renew`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// The value lives the new TTL, fresh again; the lock was dropped and followers notified,
    /// as by a fill.
    Renewed,
    /// The lock no longer holds the token: nothing changed, as for a refused fill.
    LockLost,
    /// The lock holds the token but there is no value to renew (it expired, was evicted, or
    /// the store cannot renew): nothing changed and the lock is still held, so the leader
    /// fills the value's bytes instead.
    NoValue,
}

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
/// # Locks that lapse
///
/// A lock taken (or [extended](Self::extend)) for `lock_ttl` *holds* for `lock_ttl`: until
/// then, no other token takes it. Then it *lapses*: any lookup may take it, as if it were
/// free. But until someone does, or for ten times its `lock_ttl`, the lapsed lock is
/// still its holder's: the fenced calls ([`fill`](Self::fill), [`renew`](Self::renew),
/// [`answer_waiters`](Self::answer_waiters), [`release`](Self::release),
/// [`extend`](Self::extend), [`fail`](Self::fail)) take it as held. The fence is against
/// another holder, not against the clock: a leader whose renewal came late (a slow network, a
/// busy process) still fills where nobody took its place, instead of leaving the key to a
/// second load. Whatever voids a lock (an [`invalidate`](Self::invalidate), a
/// [`set`](Self::set), an [`expire`](Self::expire), another leader's lock, fill or release)
/// voids a lapsed one too, so a load that started before such a change still cannot fill.
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

    /// Fenced write: if the lock of `key` still holds `token`, stores `value` for `ttl`, deletes
    /// the lock and returns `true`. Otherwise (the lock expired, or another leader took it)
    /// changes nothing and returns `false`, so a late leader cannot overwrite a newer value.
    /// Fenced by load starts as [`put`](Self::put) is: where the stored value's load started
    /// later than `value`'s (a [`put`](Self::put) after a wait timeout), keeps it, frees the
    /// lock and notifies as a fill does, and returns `false`.
    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Fenced renewal, for a reload that found the value it reloads unchanged (it was
    /// revalidated): if the lock of `key` still holds `token` and the value is there, sets the
    /// value to expire `ttl` from now without rewriting it (its [`load_start`] stays the
    /// first load's), drops the lock as [`fill`](Self::fill) does (a store that marks fresh
    /// values marks it fresh again), and notifies as a fill does. The default renews nothing
    /// ([`Renewal::NoValue`]): the engine then fills the bytes again.
    fn renew(
        &self,
        key: &StoreKey,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        let _ = (key, token, ttl);
        Box::pin(async { Ok(Renewal::NoValue) })
    }

    /// Fenced answer of a load for the calls that waited for it only (see
    /// [`Loaded::for_waiters`](crate::Loaded::for_waiters)), kept beside the value: if the
    /// lock of `key` holds `token`, keeps `answer` for `ttl` in the key's waiters' slot (read
    /// by [`waiters_answer`](Self::waiters_answer)), leaves the value as it is (a value kept
    /// past its freshness stays, so the next load still revalidates it), frees the lock as
    /// [`release`](Self::release) does, notifies as a fill does, and returns `true`.
    /// Otherwise (the lock is not ours) changes nothing and returns `false`.
    ///
    /// The default has no waiters' slot: it [`fill`](Self::fill)s `answer` in the value's
    /// place, where followers read it too, and the value kept for revalidation is lost.
    fn answer_waiters(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.fill(key, token, answer, ttl)
    }

    /// Reads the waiters' slot of `key` (see [`answer_waiters`](Self::answer_waiters)): the
    /// answer and its remaining life, if one is there. The default has no such slot: `None`.
    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let _ = key;
        Box::pin(async { Ok(None) })
    }

    /// Deletes the lock of `key` if it holds `token`; returns whether it did.
    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>>;

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

    /// Records a failed load: if the lock of `key` holds `token`, replaces it with a failure
    /// marker that lives `failure_ttl` (no token opens it, and lookups report
    /// [`LockState::Failed`]), notifies followers as a release does, and returns `true`.
    /// The default has no failure markers: it releases the lock.
    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = failure_ttl;
        self.release(key, token)
    }

    /// Writes `value` for `ttl` whatever the lock holds, without touching the lock, and notifies
    /// followers as a fill does; returns `true`. For a follower that gave up waiting and caches
    /// its own load ([`WaitTimeoutPolicy::LoadAndCache`](crate::WaitTimeoutPolicy::LoadAndCache)),
    /// and for tools; the leader that still holds the lock overwrites the value when its fill
    /// lands.
    ///
    /// Fenced by the values' load starts ([`load_start`]): where the stored value's load
    /// started later than `value`'s, changes nothing and returns `false`, so a slow load
    /// cannot overwrite a newer value. A value without a load start (foreign bytes, or written
    /// by a release of this crate before load starts) neither refuses nor is refused.
    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Reads the value of `key`, without touching the lock.
    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>>;

    /// Watches `key` for "filled" notifications: a successful [`fill`](Self::fill) or
    /// [`release`](Self::release) of `key`, by any process, wakes the watch. Followers wait on
    /// it and poll as well, so a store may lose notifications (Redis pub/sub does) at the cost
    /// of latency only. The default has no notifications: followers only poll.
    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        let _ = key;
        None
    }

    /// Removes the value of `key` and voids its lock, whoever holds it (a leader, a failure
    /// marker, the `fresh` marker): a leader whose load started before cannot fill any more,
    /// and the next lookup takes the lock. Then notifies every process, as a fill does (its
    /// followers wake, its L1 drops the key). Removing what is not there is not an error.
    fn invalidate(&self, key: &StoreKey) -> BoxFuture<'_, Result<(), StoreError>>;

    /// [`invalidate`](Self::invalidate)s each of `keys`, with the same fence and
    /// notifications, in one round trip (on a Redis Cluster, one per slot, all at once): for
    /// a change that names several keys (an HTTP URL with and without credentials, its
    /// `Location`). The default invalidates them one after the other, a call each.
    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        let keys = keys.to_vec();
        Box::pin(async move {
            for key in &keys {
                self.invalidate(key).await?;
            }
            Ok(())
        })
    }

    /// Writes `value` for `ttl`, fresh for `fresh_for` (at most `ttl`), and voids the lock of
    /// `key` as [`invalidate`](Self::invalidate) does, so a load that started before cannot
    /// overwrite it; then notifies every process.
    fn set(
        &self,
        key: &StoreKey,
        value: Bytes,
        fresh_for: Duration,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Ends the freshness of the value of `key` without removing it: it is kept `keep` longer
    /// at most (a stale window may still serve it), or removed if `keep` is zero. Voids the
    /// lock as [`invalidate`](Self::invalidate) does, then notifies every process.
    fn expire(&self, key: &StoreKey, keep: Duration) -> BoxFuture<'_, Result<(), StoreError>>;

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
/// as [`Store::put`]'s fence compares them: bytes 8 to 16 (big-endian) of a value that starts
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

/// How long a lock that lapsed is kept for its holder, while nobody takes it (see the
/// [`Store`] trait's "Locks that lapse"): ten times its TTL. It costs nothing but the lock key
/// of a leader that died, which lingers that long (nobody waits for it: a lapsed lock is
/// anyone's to take). Shorter, it left out the leaders that most need it: a process on a
/// machine with more busy processes than cores stalled past twice a 150 ms lock, and its
/// fill was refused where nobody had taken its lock (1 run in 20 of a burst over 2,000 keys).
pub(crate) fn lapsed_kept_for(lock_ttl: Duration) -> Duration {
    lock_ttl.saturating_mul(10)
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
