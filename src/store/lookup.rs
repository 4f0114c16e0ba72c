//! What a [`Store::lookup`](crate::store::Store::lookup) answers: the value found ([`Stored`]) and what became of the
//! reload lock ([`LockState`]), asked for as [`LockWhen`] says.

use std::time::Duration;

use bytes::Bytes;

/// A value read from a store, with its remaining life there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The bytes as they were filled.
    pub bytes: Bytes,
    /// How long the value has left in the store; `None` if it has no expiry (a foreign write).
    pub ttl: Option<Duration>,
}

/// What happened to the reload lock during a [`Store::lookup`](crate::store::Store::lookup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// The value was fresh, so the lock was not asked for.
    NotRequested,
    /// The lock is now ours, under the token we passed: we are the leader.
    Acquired,
    /// Someone else holds the lock: we are a follower.
    HeldElsewhere,
    /// The last load failed a moment ago (see [`StoreExt::fail`](crate::store::StoreExt::fail)): nobody may reload until the
    /// failure marker expires, and followers fail (or serve stale) at once.
    Failed,
}

/// When a [`Store::lookup`](crate::store::Store::lookup) asks for the reload lock.
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

/// The answer of a [`Store::lookup`](crate::store::Store::lookup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The value, fresh or not, if the store has one.
    pub value: Option<Stored>,
    /// Whether the lock was asked for and who holds it.
    pub lock: LockState,
}
