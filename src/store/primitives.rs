//! What a store's two write primitives are told and answer: [`Settle`] and [`Settled`] for
//! [`Store::settle`](crate::store::Store::settle) (the end of a reload lock, by its holder), [`Change`] for
//! [`Store::change`](crate::store::Store::change) (a change made outside a load). The named calls the engine makes
//! ([`StoreExt::fill`](crate::store::StoreExt::fill), [`StoreExt::put`](crate::store::StoreExt::put), ...) are built on them; [`Renewal`] is what
//! [`StoreExt::renew`](crate::store::StoreExt::renew) makes of a [`Settled`].
//!
//! [`Settle`] and [`Change`] are matched by every store, so they are not `#[non_exhaustive]`:
//! a new variant must fail to compile in each store until the store gives it its semantics.

use std::time::Duration;

use bytes::Bytes;

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
