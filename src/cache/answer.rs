//! What a lookup answers: what a loader was given ([`Previous`]) and produced ([`Loaded`]),
//! how a call was served ([`Outcome`], [`Fetched`]), and what the cache has counted
//! ([`Stats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::breaker::CallCounts;
use super::entry::Windows;
use crate::store::KeyDigest;

/// The value a revalidating loader reloads (see [`Cache::fetch_revalidating`]): the one the
/// store still keeps past its freshness, which the loader may confirm with
/// [`Loaded::not_modified`] instead of loading it again.
#[derive(Clone, Debug)]
pub struct Previous {
    pub(super) value: Bytes,
    pub(super) staleness: Duration,
    /// The digests of the value's tags.
    pub(super) tags: Vec<KeyDigest>,
}

impl Previous {
    /// The value as it was stored.
    pub fn value(&self) -> &Bytes {
        &self.value
    }

    /// How long past its freshness the value was when the reload started.
    pub fn staleness(&self) -> Duration {
        self.staleness
    }
}

/// What a loader passed to [`Cache::fetch`] produced.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub(super) kind: LoadedKind,
    /// The digests of the value's tags.
    pub(super) tags: Vec<KeyDigest>,
    /// The value's own stale windows (each `None`: the cache's).
    pub(super) windows: Windows,
}

/// A loader's result, as the engine reads it.
#[derive(Clone, Debug)]
pub(super) enum LoadedKind {
    Value {
        bytes: Bytes,
        ttl: Option<Duration>,
    },
    /// The [`Previous`] value still holds, fresh again for `ttl` (or the default TTL).
    NotModified {
        ttl: Option<Duration>,
    },
    Pass,
    ForWaiters {
        bytes: Bytes,
    },
}

impl Loaded {
    /// A value to store for the cache's default [`ttl`](CacheBuilder::ttl).
    pub fn value(bytes: Bytes) -> Self {
        Loaded {
            kind: LoadedKind::Value { bytes, ttl: None },
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// A value to store for `ttl`.
    pub fn value_with_ttl(bytes: Bytes, ttl: Duration) -> Self {
        Loaded {
            kind: LoadedKind::Value {
                bytes,
                ttl: Some(ttl),
            },
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// Nothing to store: the load's result is not cacheable. A short "pass" marker tells
    /// followers to stop waiting and go to the backend directly.
    pub fn pass() -> Self {
        Loaded {
            kind: LoadedKind::Pass,
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// A result that is not kept, but that the calls waiting for this load get as well, in
    /// this process and in every other that shares the store: not a failure they share (see
    /// [`failure_ttl`](CacheBuilder::failure_ttl)), not a [`pass`](Self::pass) that sends each
    /// of them to the backend. A call that starts after the load ended does not get it: it
    /// loads again, one load at a time across processes, as for any miss. (A call is told
    /// from a waiter by the store's clock, read in whole milliseconds and a round trip late:
    /// one that joined less than a round trip before the load ended loads again too.) A value
    /// the store keeps past its freshness for revalidation (see
    /// [`keep_for_revalidation`](CacheBuilder::keep_for_revalidation)) stays, and is the
    /// [`Previous`] value of that next load: this result is kept beside it for the waiters
    /// ([`Store::answer_waiters`](crate::store::Store::answer_waiters)).
    ///
    /// Where a stale value may stand in for a failed load (see
    /// [`stale_if_error`](CacheBuilder::stale_if_error)), it does, and this result is treated
    /// as a failure; an early refresh that gets it keeps the value it refreshes. The HTTP layer
    /// answers this way for an origin's server error without explicit freshness.
    pub fn for_waiters(bytes: Bytes) -> Self {
        Loaded {
            kind: LoadedKind::ForWaiters { bytes },
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// The [`Previous`] value the loader was given still holds: it is fresh again for the
    /// cache's default [`ttl`](CacheBuilder::ttl), as if it had been loaded now, and the store
    /// keeps it without its bytes being sent again. A loader that was given no previous value
    /// must not answer this: its load fails.
    pub fn not_modified() -> Self {
        Loaded {
            kind: LoadedKind::NotModified { ttl: None },
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// Like [`not_modified`](Self::not_modified), fresh again for `ttl`.
    pub fn not_modified_with_ttl(ttl: Duration) -> Self {
        Loaded {
            kind: LoadedKind::NotModified { ttl: Some(ttl) },
            tags: Vec::new(),
            windows: Windows::default(),
        }
    }

    /// Gives the value a stale-while-revalidate window of its own (RFC 5861 §3), in place of
    /// the cache's [`stale`](CacheBuilder::stale): past its freshness, it may be served for
    /// `window` while a reload runs. No window reaches past how long the cache keeps values
    /// past their freshness (the longest of its `stale`, `stale_if_error` and
    /// [`keep_for_revalidation`](CacheBuilder::keep_for_revalidation)). A value that is not
    /// modified keeps the windows it was stored with.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use bytes::Bytes;
    /// # use tower_stampede::Loaded;
    /// let loaded = Loaded::value(Bytes::from_static(b"feed"))
    ///     .stale_while_revalidate(Duration::from_secs(30))
    ///     .stale_if_error(Duration::from_secs(600));
    /// ```
    #[must_use]
    pub fn stale_while_revalidate(mut self, window: Duration) -> Self {
        self.windows.while_revalidating = Some(window);
        self
    }

    /// Gives the value a stale-if-error window of its own (RFC 5861 §4), in place of the
    /// cache's [`stale_if_error`](CacheBuilder::stale_if_error): past its freshness, it may
    /// stand in for a reload that failed for `window`, within the same bound as
    /// [`stale_while_revalidate`](Self::stale_while_revalidate).
    #[must_use]
    pub fn stale_if_error(mut self, window: Duration) -> Self {
        self.windows.if_error = Some(window);
        self
    }

    /// The value is never served past its freshness, whatever the cache's stale windows
    /// (RFC 9111 §4.2.4, `must-revalidate`): once stale it is only what its reload
    /// revalidates ([`Previous`]). The same as both stale windows zero.
    #[must_use]
    pub fn must_revalidate(self) -> Self {
        self.stale_while_revalidate(Duration::ZERO)
            .stale_if_error(Duration::ZERO)
    }

    /// Attaches the tags of the `previous` value (see [`tags`](Self::tags)): for a value
    /// rebuilt from the previous one (a revalidated HTTP response with updated headers), so
    /// that an invalidation of the previous value's tags still reaches it.
    #[must_use]
    pub fn tags_of(mut self, previous: &Previous) -> Self {
        self.tags.extend_from_slice(&previous.tags);
        self.tags.sort_unstable();
        self.tags.dedup();
        self
    }

    /// Attaches tags to the value: [`Cache::invalidate_tag`](super::Cache::invalidate_tag)
    /// of any of them makes it a miss, in every process. A value carries at most 1024 tags;
    /// one with more is not stored (its callers still get it). Tags cost a tagged value's L2
    /// hits one more store round trip (reading the tags' state); untagged values pay nothing.
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use tower_stampede::Loaded;
    /// let loaded = Loaded::value(Bytes::from_static(b"<li>Ada</li>")).tags(["user:42", "users"]);
    /// ```
    #[must_use]
    pub fn tags<I, T>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        self.tags
            .extend(tags.into_iter().map(|tag| KeyDigest::of_tag(tag.as_ref())));
        self.tags.sort_unstable();
        self.tags.dedup();
        self
    }
}

/// How a [`Cache::fetch`] was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// From this process's L1.
    L1Hit,
    /// From the shared store, fresh.
    L2Hit,
    /// This call's own loader ran and its value was filled.
    Leader,
    /// Another call's load (in this process or another) answered this one.
    Follower,
    /// The key is marked "pass": nothing is cached, go to the backend. If this call's own
    /// loader ran, the load was not cacheable.
    Pass,
    /// This call's own loader ran after the wait timed out; its value was not stored.
    Uncached,
    /// A stale value (past its freshness, within the stale window), served while a leader
    /// refreshes it, or because the refresh failed.
    Stale,
    /// The store failed, so this call's own loader ran with in-process protection only.
    Degraded,
    /// This call's own loader confirmed the stored value ([`Loaded::not_modified`]): it is
    /// fresh again, for every process.
    Revalidated,
}

impl Outcome {
    /// A short name for logs and metrics: `hit-l1`, `hit-l2`, `miss-leader`, `follower`,
    /// `pass`, `uncached`, `stale`, `degraded`, `revalidated`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::L1Hit => "hit-l1",
            Outcome::L2Hit => "hit-l2",
            Outcome::Leader => "miss-leader",
            Outcome::Follower => "follower",
            Outcome::Pass => "pass",
            Outcome::Uncached => "uncached",
            Outcome::Stale => "stale",
            Outcome::Degraded => "degraded",
            Outcome::Revalidated => "revalidated",
        }
    }
}

/// The answer of [`Cache::fetch`].
#[derive(Clone, Debug)]
pub struct Fetched {
    pub(super) value: Option<Bytes>,
    pub(super) outcome: Outcome,
    /// When the value stops (or stopped) being fresh, for an answer from the cache.
    pub(super) fresh_until: Option<Instant>,
}

impl Fetched {
    /// An answer with `value` that a load gave, how the call was answered.
    pub(super) fn loaded(value: Bytes, outcome: Outcome) -> Self {
        Fetched {
            value: Some(value),
            outcome,
            fresh_until: None,
        }
    }

    /// An answer with `value` from the cache, fresh until `fresh_until` as far as this
    /// process knows.
    pub(super) fn cached(value: Bytes, outcome: Outcome, fresh_until: Option<Instant>) -> Self {
        Fetched {
            value: Some(value),
            outcome,
            fresh_until,
        }
    }

    /// The answer of a load whose result is not cacheable: no value, for the callers that
    /// did not load.
    pub(super) fn pass() -> Self {
        Fetched {
            value: None,
            outcome: Outcome::Pass,
            fresh_until: None,
        }
    }

    /// The value; `None` only when the outcome is [`Outcome::Pass`].
    pub fn value(&self) -> Option<&Bytes> {
        self.value.as_ref()
    }

    /// The value, taken out.
    pub fn into_value(self) -> Option<Bytes> {
        self.value
    }

    /// How the call was answered.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// When the value stops being fresh (a hit, from L1 or the store) or stopped being fresh
    /// (a stale value), as far as this process knows; `None` for an answer from a load. For
    /// a remaining freshness to show, as RFC 9211's `ttl` does (negative once stale).
    pub fn fresh_until(&self) -> Option<Instant> {
        self.fresh_until
    }

    /// The value, or an error of kind [`Pass`](super::ErrorKind::Pass) when there is none.
    pub(super) fn value_or_pass(self) -> Result<Bytes, super::Error> {
        self.value
            .ok_or_else(|| super::Error::new(super::ErrorKind::Pass))
    }
}

/// Counters of what the cache has seen since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Loads started (this process's loader calls).
    pub loads: u64,
    /// Store entries that were not this engine's (corrupt or foreign): treated as a miss.
    pub corrupt_entries: u64,
    /// Store calls that failed or timed out.
    pub store_errors: u64,
    /// Store calls not made because the circuit breaker was open.
    pub store_calls_skipped: u64,
    /// Times the circuit breaker opened.
    pub breaker_opened: u64,
    /// Bytes held by L1 (values plus a per-entry overhead); entries that expired are taken
    /// off when L1 sweeps them.
    pub l1_bytes: u64,
    /// Early refreshes started by this process (see
    /// [`early_refresh`](CacheBuilder::early_refresh)); each one that takes the lock loads.
    pub early_refreshes: u64,
}

/// The counters behind [`Stats`], bumped as things happen.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) loads: AtomicU64,
    pub(super) corrupt_entries: AtomicU64,
}

impl Counters {
    /// A snapshot of the counters, with L1's current weight, the early refreshes started
    /// and what the breaker counted of the store calls.
    pub(super) fn stats(&self, l1_bytes: u64, early_refreshes: u64, calls: CallCounts) -> Stats {
        Stats {
            loads: self.loads.load(Ordering::Relaxed),
            corrupt_entries: self.corrupt_entries.load(Ordering::Relaxed),
            store_errors: calls.errors,
            store_calls_skipped: calls.skipped,
            l1_bytes,
            breaker_opened: calls.opened,
            early_refreshes,
        }
    }
}
