//! What a loader is given ([`Previous`]) and what it produces ([`Loaded`]).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::config::Life;
use super::entry::Windows;
use crate::store::KeyDigest;

/// The value a revalidating loader reloads (see [`Cache::fetch_revalidating`](crate::Cache::fetch_revalidating)): the one the
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

/// What a loader passed to [`Cache::fetch`](crate::Cache::fetch) produced: a value (bytes, or with `Typed::fetch`,
/// feature `serde`, a `T` to encode) and how to keep it.
#[derive(Clone, Debug)]
pub struct Loaded<V = Bytes> {
    pub(super) kind: LoadedKind<V>,
    /// The digests of the value's tags.
    pub(super) tags: Vec<KeyDigest>,
    /// The value's own stale windows (each `None`: the cache's).
    pub(super) windows: Windows,
    /// The most added at random to the value's freshness (`None`: the cache's
    /// [`ttl_jitter`](crate::CacheBuilder::ttl_jitter)).
    pub(super) jitter: Option<Duration>,
}

/// A loader's result, as the engine reads it.
#[derive(Clone, Debug)]
pub(super) enum LoadedKind<V = Bytes> {
    Value {
        bytes: V,
        ttl: Option<Duration>,
    },
    /// The [`Previous`] value still holds, fresh again for `ttl` (or the default TTL).
    NotModified {
        ttl: Option<Duration>,
    },
    /// Nothing to store; `handoff` goes to the callers of the flight in this process, and
    /// the pass marker tells other processes that their callers may share one load each
    /// (`shared`), or must each go to the backend.
    Pass {
        handoff: Option<Handoff>,
        shared: bool,
    },
    /// For the calls that waited only; `failed`: a failed load's answer, which a stale value
    /// stands in for where it may.
    ForWaiters {
        bytes: Bytes,
        failed: bool,
    },
}

impl<V> Loaded<V> {
    fn of(kind: LoadedKind<V>) -> Self {
        Loaded {
            kind,
            tags: Vec::new(),
            windows: Windows::default(),
            jitter: None,
        }
    }

    /// A value to store for the cache's default [`ttl`](crate::CacheBuilder::ttl).
    pub fn value(value: V) -> Self {
        Loaded::of(LoadedKind::Value {
            bytes: value,
            ttl: None,
        })
    }

    /// A value to store for `ttl`.
    pub fn value_with_ttl(value: V, ttl: Duration) -> Self {
        Loaded::of(LoadedKind::Value {
            bytes: value,
            ttl: Some(ttl),
        })
    }

    /// Nothing to store: the load's result is not cacheable. A short "pass" marker tells
    /// followers to stop waiting and go to the backend directly.
    pub fn pass() -> Self {
        Loaded::of(LoadedKind::Pass {
            handoff: None,
            shared: false,
        })
    }

    /// Gives the value a stale-while-revalidate window of its own (RFC 5861 §3), in place of
    /// the cache's [`stale`](crate::CacheBuilder::stale): past its freshness, it may be served for
    /// `window` while a reload runs. No window reaches past how long the cache keeps values
    /// past their freshness (the longest of its `stale`, `stale_if_error` and
    /// [`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)). A value that is not
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
    /// cache's [`stale_if_error`](crate::CacheBuilder::stale_if_error): past its freshness, it may
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
    /// Gives the value a TTL jitter of its own, in place of the cache's
    /// [`ttl_jitter`](crate::CacheBuilder::ttl_jitter): up to `max` (uniformly drawn) is added to
    /// its freshness. `Duration::ZERO` keeps its TTL exact.
    #[must_use]
    pub fn ttl_jitter(mut self, max: Duration) -> Self {
        self.jitter = Some(max);
        self
    }

    /// How long a value (or a value not modified) of this load stays fresh.
    pub(super) fn life(&self) -> Life {
        let ttl = match &self.kind {
            LoadedKind::Value { ttl, .. } | LoadedKind::NotModified { ttl } => *ttl,
            LoadedKind::Pass { .. } | LoadedKind::ForWaiters { .. } => None,
        };
        Life {
            ttl,
            jitter: self.jitter,
        }
    }

    /// The value as bytes, by `encode`, with the same TTL, tags and windows.
    #[cfg(feature = "serde")]
    pub(super) fn try_map<E>(
        self,
        encode: impl FnOnce(V) -> Result<Bytes, E>,
    ) -> Result<Loaded, E> {
        let kind = match self.kind {
            LoadedKind::Value { bytes, ttl } => LoadedKind::Value {
                bytes: encode(bytes)?,
                ttl,
            },
            LoadedKind::NotModified { ttl } => LoadedKind::NotModified { ttl },
            LoadedKind::Pass { handoff, shared } => LoadedKind::Pass { handoff, shared },
            LoadedKind::ForWaiters { bytes, failed } => LoadedKind::ForWaiters { bytes, failed },
        };
        Ok(Loaded {
            kind,
            tags: self.tags,
            windows: self.windows,
            jitter: self.jitter,
        })
    }
}

impl Loaded {
    /// The same result with `bytes` as its value, its TTL, windows and tags kept: for a
    /// result described before its value was encoded (the service layer's freshness). A
    /// result that stores no value is returned as it is.
    pub(crate) fn with_bytes(mut self, bytes: Bytes) -> Self {
        if let LoadedKind::Value { bytes: value, .. } = &mut self.kind {
            *value = bytes;
        }
        self
    }

    /// A result that is not kept, but that the calls waiting for this load get as well, in
    /// this process and in every other that shares the store: not a failure they share (see
    /// [`failure_ttl`](crate::CacheBuilder::failure_ttl)), not a [`pass`](Self::pass) that sends each
    /// of them to the backend. A call that starts after the load ended does not get it: it
    /// loads again, one load at a time across processes, as for any miss. (A call is told
    /// from a waiter by the store's clock, read in whole milliseconds and a round trip late:
    /// one that joined less than a round trip before the load ended loads again too.) A value
    /// the store keeps past its freshness for revalidation (see
    /// [`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)) stays, and is the
    /// [`Previous`] value of that next load: this result is kept beside it for the waiters
    /// ([`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters)).
    ///
    /// Where a stale value may stand in for a failed load (see
    /// [`stale_if_error`](crate::CacheBuilder::stale_if_error)), it does, and this result is treated
    /// as a failure; an early refresh that gets it keeps the value it refreshes. The HTTP layer
    /// answers this way for an origin's server error without explicit freshness.
    pub fn for_waiters(bytes: Bytes) -> Self {
        Loaded::of(LoadedKind::ForWaiters {
            bytes,
            failed: true,
        })
    }

    /// Like [`for_waiters`](Self::for_waiters), for a result that is no failure: it goes to
    /// the calls that waited for the load and is not kept, and a stale value never stands in
    /// for it. The HTTP layer answers this way for a response that may be shared but declares
    /// no freshness.
    pub(crate) fn shared_with_waiters(bytes: Bytes) -> Self {
        Loaded::of(LoadedKind::ForWaiters {
            bytes,
            failed: false,
        })
    }

    /// Like [`pass`](Self::pass), for a result that may still be shared within a process:
    /// `handoff` goes to the calls that joined this load's flight in this process, and the pass
    /// marker tells the flights of other processes to load once each (their first caller's
    /// loader runs, without the lock, and its result goes to the others) rather than send every
    /// caller to the backend. The HTTP layer answers this way for a body too large to store,
    /// which it relays.
    pub(crate) fn pass_handing(handoff: Handoff) -> Self {
        Loaded::of(LoadedKind::Pass {
            handoff: Some(handoff),
            shared: true,
        })
    }

    /// Like [`pass`](Self::pass), telling the calls that joined this load's flight in this
    /// process `handoff` (why the result was not kept, say); other processes' callers each go
    /// to the backend, as for a plain pass.
    pub(crate) fn pass_telling(handoff: Handoff) -> Self {
        Loaded::of(LoadedKind::Pass {
            handoff: Some(handoff),
            shared: false,
        })
    }

    /// The [`Previous`] value the loader was given still holds: it is fresh again for the
    /// cache's default [`ttl`](crate::CacheBuilder::ttl), as if it had been loaded now, and the store
    /// keeps it without its bytes being sent again. A loader that was given no previous value
    /// must not answer this: its load fails.
    pub fn not_modified() -> Self {
        Loaded::of(LoadedKind::NotModified { ttl: None })
    }

    /// Like [`not_modified`](Self::not_modified), fresh again for `ttl`.
    pub fn not_modified_with_ttl(ttl: Duration) -> Self {
        Loaded::of(LoadedKind::NotModified { ttl: Some(ttl) })
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
}

/// What a load that stores nothing hands to the callers that joined its flight in this
/// process, beside its pass (see `Loaded::pass_handing`): the HTTP layer's relay of a body too
/// large to store. Never stored, never seen by another process.
#[derive(Clone)]
pub(crate) struct Handoff(pub(crate) Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handoff")
    }
}
