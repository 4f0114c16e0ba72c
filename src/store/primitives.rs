//! What a store's two write primitives are told and answer: [`Settle`] and [`Settled`] for
//! [`Store::settle`](crate::store::Store::settle) (the end of a reload lock, by its holder), [`Change`] for
//! [`Store::change`](crate::store::Store::change) (a change made outside a load). The named calls the engine makes
//! ([`StoreExt::fill`](crate::store::StoreExt::fill), [`StoreExt::put`](crate::store::StoreExt::put), ...) are built on them; [`Renewal`] is what
//! [`StoreExt::renew`](crate::store::StoreExt::renew) makes of a [`Settled`].
//!
//! [`Settle`] and [`Change`] are matched by every store, so they are not `#[non_exhaustive]`:
//! a new variant must fail to compile in each store until the store gives it its semantics.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use super::call_limit::CallLimit;
use super::error::StoreError;
use super::key::{KeyDigest, LockToken, StoreKey};
use super::lookup::{LockWhen, Lookup, Stored};
use super::notify::{FillWatch, Notifier};
use super::tags::{TagClock, TagVersions};

/// What the holder of a reload lock does with it, at the end of its load: the argument of
/// [`Store::settle`](crate::store::Store::settle).
///
/// Every variant is fenced by the lock: it acts only if the lock of the key holds the token
/// (held, or lapsed while nobody took it: see the [`Store`](crate::store::Store) trait's "Locks that lapse"), and
/// otherwise changes nothing and answers [`Settled::LockLost`], so a late leader cannot
/// overwrite a newer value or free another leader's lock. "Notifies as a fill does" means: the
/// key's watches wake ([`Store::subscribe`](crate::store::Store::subscribe)) and every process's [`Notifier`](crate::store::Notifier) hears of the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Fenced write ([`StoreExt::fill`](crate::store::StoreExt::fill)): stores `value` for `ttl`, deletes the lock (a store
    /// that marks fresh values leaves its mark for as long as the value is fresh), notifies as
    /// a fill does, and answers [`Settled::Done`].
    ///
    /// Fenced by load starts as [`Change::Put`] is: where the stored value's load started
    /// later than `value`'s ([`load_start`](crate::store::load_start): a put after a wait timeout), keeps the stored
    /// value, frees the lock and notifies all the same, and answers [`Settled::KeptNewer`].
    Fill {
        /// The bytes to store.
        value: Bytes,
        /// How long the value lives in the store.
        ttl: Duration,
    },
    /// Fenced renewal ([`StoreExt::renew`](crate::store::StoreExt::renew)), for a reload that found the value it reloads
    /// unchanged (it was revalidated): where the value is there, sets it to expire `ttl` from
    /// now without rewriting it (its [`load_start`](crate::store::load_start) stays the first load's), drops the lock as
    /// [`Fill`](Self::Fill) does (a store that marks fresh values marks it fresh again),
    /// notifies as a fill does, and answers [`Settled::Done`].
    ///
    /// Where there is no value to renew (it expired or was evicted), changes nothing, keeps
    /// the lock held and answers [`Settled::NoValue`]: the leader then fills the value's bytes
    /// instead. A store that cannot renew answers [`Settled::NoValue`] to every renewal whose
    /// lock is the token's.
    Renew {
        /// How long the value lives in the store from now.
        ttl: Duration,
    },
    /// Fenced answer of a load for the calls that waited for it only
    /// ([`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters); see [`Loaded::for_waiters`](crate::Loaded::for_waiters)),
    /// kept beside the value: keeps `answer` for `ttl` in the key's waiters' slot (read by
    /// [`Store::waiters_answer`](crate::store::Store::waiters_answer)), leaves the value as it is (a value kept past its freshness
    /// stays, so the next load still revalidates it), frees the lock as
    /// [`Release`](Self::Release) does, notifies as a fill does, and answers
    /// [`Settled::Done`].
    ///
    /// A store without a waiters' slot settles it as a [`Fill`](Self::Fill) of `answer` in
    /// the value's place, where followers read it too (the value kept for revalidation is
    /// lost).
    AnswerWaiters {
        /// The bytes the waiters read.
        answer: Bytes,
        /// How long the answer is kept.
        ttl: Duration,
    },
    /// A failed load ([`StoreExt::fail`](crate::store::StoreExt::fail)): replaces the lock by a failure marker that lives
    /// `failure_ttl` (no token opens it, and lookups report [`LockState::Failed`](crate::store::LockState::Failed)), notifies
    /// followers as a release does, and answers [`Settled::Done`].
    ///
    /// A store without failure markers settles it as a [`Release`](Self::Release).
    Fail {
        /// How long the failure marker lives.
        failure_ttl: Duration,
    },
    /// Compare-and-delete ([`StoreExt::release`](crate::store::StoreExt::release)): deletes the lock, never someone else's,
    /// notifies as a fill does (followers wake and read again), and answers
    /// [`Settled::Done`].
    Release,
}

/// What a [`Store::settle`](crate::store::Store::settle) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The lock held the token, and the settlement took effect.
    Done,
    /// The lock no longer holds the token (it was taken by another leader, voided by a
    /// change, or it expired): nothing changed.
    LockLost,
    /// A [`Settle::Renew`] whose lock holds the token found no value to renew: nothing
    /// changed, and the lock is still held.
    NoValue,
    /// A [`Settle::Fill`] whose lock held the token found a value whose load started later:
    /// that value stays; the lock was freed and followers notified.
    KeptNewer,
}

/// A change of a key made outside a load, whatever its lock holds: the argument of
/// [`Store::change`](crate::store::Store::change).
///
/// Each variant notifies every process of the key as a fill does, once it took effect (the
/// key's watches wake, and every process's L1 drops the key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Writes `value` for `ttl` without touching the lock ([`StoreExt::put`](crate::store::StoreExt::put)), and answers
    /// `true`. For a follower that gave up waiting and caches its own load
    /// ([`WaitTimeoutPolicy::LoadAndCache`](crate::WaitTimeoutPolicy::LoadAndCache)), and for
    /// tools; the leader that still holds the lock overwrites the value when its fill lands.
    ///
    /// Fenced by the values' load starts ([`load_start`](crate::store::load_start)): where the stored value's load
    /// started later than `value`'s, changes nothing and answers `false`, so a slow load
    /// cannot overwrite a newer value. A value without a load start (foreign bytes, or written
    /// by a release of this crate before load starts) neither refuses nor is refused.
    Put {
        /// The bytes to store.
        value: Bytes,
        /// How long the value lives in the store.
        ttl: Duration,
    },
    /// Writes `value` for `ttl`, fresh for `fresh_for` (at most `ttl`), and voids the lock as
    /// [`Invalidate`](Self::Invalidate) does, so a load that started before cannot overwrite
    /// it ([`StoreExt::set`](crate::store::StoreExt::set)). Fenced as [`Put`](Self::Put) is: where the stored value was
    /// written (or its load started) later than `value`, changes nothing and answers `false`,
    /// so a write held up on the network (its caller timed out, its bytes still on their way)
    /// never undoes a newer one when it lands; else answers `true`.
    Set {
        /// The bytes to store.
        value: Bytes,
        /// How long the value is fresh (a store that marks fresh values marks it so long).
        fresh_for: Duration,
        /// How long the value lives in the store.
        ttl: Duration,
    },
    /// Ends the freshness of the value without removing it ([`StoreExt::expire`](crate::store::StoreExt::expire)): it is kept
    /// `keep` longer at most (a stale window may still serve it), or removed if `keep` is
    /// zero. Voids the lock as [`Invalidate`](Self::Invalidate) does. Answers `true`.
    Expire {
        /// How much longer the value is kept, at most.
        keep: Duration,
    },
    /// Removes the value and voids its lock, whoever holds it (a leader, a failure marker,
    /// the `fresh` marker): a leader whose load started before cannot fill any more, and the
    /// next lookup takes the lock ([`StoreExt::invalidate`](crate::store::StoreExt::invalidate)). Removing what is not there is not
    /// an error. Answers `true`.
    Invalidate,
}

/// What a [`StoreExt::renew`](crate::store::StoreExt::renew) did.
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
/// named writes the engine calls ([`StoreExt::fill`](crate::store::StoreExt::fill), [`renew`](crate::store::StoreExt::renew),
/// [`answer_waiters`](crate::store::StoreExt::answer_waiters), [`fail`](crate::store::StoreExt::fail),
/// [`release`](crate::store::StoreExt::release); [`put`](crate::store::StoreExt::put), [`set`](crate::store::StoreExt::set),
/// [`expire`](crate::store::StoreExt::expire), [`invalidate`](crate::store::StoreExt::invalidate)) are [`StoreExt`](crate::store::StoreExt)'s,
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
    /// fresh: it is returned with [`LockState::NotRequested`](crate::store::LockState::NotRequested). An absent value, or one with
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

    /// Watches `key` for "filled" notifications: a successful [`fill`](crate::store::StoreExt::fill) or
    /// [`release`](crate::store::StoreExt::release) of `key`, by any process, wakes the watch. Followers wait on
    /// it and poll as well, so a store may lose notifications (Redis pub/sub does) at the cost
    /// of latency only. The default has no notifications: followers only poll.
    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        let _ = key;
        None
    }

    /// [`Change::Invalidate`]s each of `keys` (as [`StoreExt::invalidate`](crate::store::StoreExt::invalidate) does one), in one
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
    /// [`MAX_TAG_VERSIONS`](crate::store::MAX_TAG_VERSIONS) already, first starts a new generation (every tagged value of an
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
/// as [`StoreExt::put`](crate::store::StoreExt::put)'s fence compares them: bytes 8 to 16 (big-endian) of a value that starts
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
