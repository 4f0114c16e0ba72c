//! The engine: one load per stampede, across tasks and across processes.
//!
//! A [`Cache`] answers [`get_or_load`](Cache::get_or_load) in three tiers:
//!
//! 1. **L1**, an in-process [moka] cache bounded in bytes, whose entries never outlive their
//!    freshness in the store (nor [`l1_ttl_cap`](CacheBuilder::l1_ttl_cap)).
//! 2. **A flight**: concurrent misses of one key in this process share one flight, so N local
//!    callers cost one store round trip and at most one load.
//! 3. **The store** (Redis, or the embedded [`MemoryStore`](crate::store::MemoryStore)): one
//!    round trip answers "fresh value, or take the reload lock". The flight that takes the lock
//!    is the **leader**: it loads, writes the value through a fenced **fill** and drops the lock.
//!    Every other flight, in this process or another, is a **follower**: it re-reads the store
//!    as soon as the store notifies it of the fill (or of the lock's release), and otherwise
//!    with a jittered exponential backoff, until the value is there, the lock is free again
//!    (then it leads), or the wait times out (then [`WaitTimeoutPolicy`] decides).
//!
//! A flight outlives its callers: the caller that starts it drives it, and hands it to the
//! runtime as a task of its own if it goes away first; the load itself runs in a task of its
//! own. A caller that goes away does not cancel the load, which fills the cache for everyone
//! else. The lock is released on every path: by the fill itself, by an explicit token-checked
//! release when a load fails, by a drop guard if the flight is torn down, and by the lock's
//! TTL if the whole process dies.
//!
//! If the store fails or is slower than [`store_timeout`](CacheBuilder::store_timeout), the
//! flight loads by itself: protection falls back to one load per process, never to an error.
//! After repeated failures a [circuit breaker](CacheBuilder::circuit_breaker) skips the store
//! altogether until a background probe finds it answering again.
//!
//! # Concurrent calls on the same key
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use tower_stampede::{store::MemoryStore, Cache};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let cache = Cache::builder(MemoryStore::new()).build();
//! let loads = Arc::new(AtomicUsize::new(0));
//! let callers = (0..100).map(|_| {
//!     let (cache, loads) = (cache.clone(), loads.clone());
//!     tokio::spawn(async move {
//!         cache
//!             .get_or_load("user:42", move || async move {
//!                 loads.fetch_add(1, Ordering::SeqCst);
//!                 tokio::time::sleep(std::time::Duration::from_millis(50)).await;
//!                 Ok::<_, std::io::Error>(Bytes::from_static(b"Ada"))
//!             })
//!             .await
//!     })
//! });
//! for caller in callers.collect::<Vec<_>>() {
//!     assert_eq!(caller.await.unwrap().unwrap(), "Ada");
//! }
//! assert_eq!(loads.load(Ordering::SeqCst), 1);
//! # }
//! ```
//!
//! # Inside the engine
//!
//! A [`Cache`] holds components that each own their state, and the configuration; the
//! protocol across processes (a folder of its own) drives them.
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | [`Cache`], its public calls, and `Inner`: the parts, the flights, the key spelling |
//! | `parts.rs` | `Parts`: the components and settings every flight's roles are handed |
//! | `config.rs` | the settings, a slice for each component that reads them |
//! | `builder.rs` | [`CacheBuilder`]: the settings, set in code |
//! | `build_error.rs` | [`BuildError`]: the settings that cannot work, refused by the build |
//! | `l1/` | `L1`: the moka cache, its weight in bytes, the notifier's stamps that keep it in step, and each thread's view of its hot entries (and its tests) |
//! | `flights.rs` | `Flights`: the flights in progress in this process, by key |
//! | `flight.rs` | a fetch: L1, then joining or starting a flight, and the flight's loader |
//! | `carry.rs` | how the caller that starts a flight carries it, and how it posts to the others |
//! | `breaker/` | `Breaker`: the circuit breaker, every store call, and its probe (and its tests) |
//! | `known_tags.rs` | `KnownTags`: whether loaders return tags, the first tag clock, the versions read |
//! | `tags.rs` | [`Cache::invalidate_tags`], and `TagChecks`: the tag clock a value is stamped with, and whether its tags and generation still hold |
//! | `refreshes.rs` | `Refreshes`: when a value is due for an early refresh, and which keys have one |
//! | `batch.rs` | [`Cache::get_many_or_load`]: batches |
//! | `peek.rs` | [`Cache::get`]: what is cached, from L1 then the store, never loaded |
//! | `changes.rs` | [`Cache::invalidate`], [`Cache::set`], [`Cache::expire`], [`Cache::clear`]: changes made outside a load, and how each makes this process forget the keys |
//! | `protocol/` | leader, follower, waiters, revalidation, stale values, early refresh |
//! | `loaded.rs` | what a loader is given and produces: [`Previous`], [`Loaded`] |
//! | `fetched.rs` | what a call is answered: [`Fetched`], [`Outcome`]; what a loader gives and what of it reaches its own caller alone (`Gives`, `Own`) |
//! | `stats.rs` | [`Stats`] and the counters behind it |
//! | `store_timeout.rs` | the store timeout, measured against the store, not the process's scheduling |
//! | `entry/` | the bytes kept in the store: header, kinds, tags, windows (and its tests) |
//! | `error.rs` | [`Error`] and [`ErrorKind`] |
//! | `health.rs` | [`Cache::health`] and [`Health`] |
//! | `fetch.rs` | [`Cache::get_or_load`] and [`Cache::fetch`], and every call's way into the engine: the L1 hit, the fetch, its span and count |
//! | `telemetry.rs` | tracing events and metrics |
//! | `typed/` | typed values (feature `serde`): handles, codecs, batches |

// First: its `impl Cache` opens the rustdoc page of `Cache` (the calls a newcomer needs first),
// and rustdoc lists the modules' impls in the order they are declared.
mod fetch;

mod batch;
mod breaker;
mod build_error;
mod builder;
mod carry;
mod changes;
mod config;
pub(crate) mod entry;
mod error;
mod fetched;
mod flight;
mod flights;
mod health;
mod known_tags;
mod l1;
mod loaded;
mod parts;
mod peek;
mod protocol;
mod refreshes;
mod renewals;
mod stats;
mod store_timeout;
mod tags;
pub(crate) mod telemetry;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod typed;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{KeyDigest, Store, StoreError, StoreKey, Stored};
use parts::Parts;

pub use build_error::BuildError;
pub use builder::CacheBuilder;
pub(crate) use config::Config;
pub use config::WaitTimeoutPolicy;
pub use error::{BoxError, Error, ErrorKind};
pub(crate) use fetch::Ask;
pub use fetched::{Fetched, Outcome};
pub(crate) use fetched::{Gives, Handoff, Own};
pub use health::Health;
pub use loaded::{Loaded, Previous};
pub use stats::Stats;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use telemetry::{describe_metrics, DURATION_BUCKETS, HISTOGRAMS, METRICS_PREFIX};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use typed::{Codec, Postcard, Typed};

/// The stampede guard's engine: one load per stampede, across tasks and processes.
///
/// Start with [`get_or_load`](Cache::get_or_load): the value of a key, loaded at most once per
/// stampede. [`fetch`](Cache::fetch) is the same with a loader that chooses its value's TTL,
/// tags and stale windows, or not to store it. Then the rest: batches
/// ([`get_many_or_load`](Cache::get_many_or_load)), changes ([`invalidate`](Cache::invalidate),
/// [`set`](Cache::set), [`expire`](Cache::expire), [`invalidate_tag`](Cache::invalidate_tag),
/// [`clear`](Cache::clear)), a peek ([`get`](Cache::get)), and [`health`](Cache::health) and
/// [`stats`](Cache::stats) for probes and dashboards.
///
/// ```
/// use bytes::Bytes;
/// use tower_stampede::{store::MemoryStore, Cache};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_stampede::Error> {
/// let cache = Cache::builder(MemoryStore::new()).build();
/// let name = cache
///     .get_or_load("user:42", || async {
///         Ok::<_, std::io::Error>(Bytes::from("Ada")) // one database call per stampede
///     })
///     .await?;
/// assert_eq!(name, "Ada");
/// # Ok(()) }
/// ```
///
/// Cheap to clone: clones share L1, flights and settings. Build one with [`Cache::builder`];
/// more in the [module docs](self).
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

/// The engine: its parts, handed to every flight, and what only the engine reads.
struct Inner {
    parts: Arc<Parts>,
    flights: flights::Flights,
    /// Whether a key's spelling goes with its digest to the store (see
    /// [`CacheBuilder::readable_keys`]).
    readable_keys: bool,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("store", &self.inner.parts.store)
            .field("namespace", &self.inner.parts.namespace)
            .field("lives", &self.inner.parts.lives)
            .field("loads", &self.inner.parts.loads)
            .field("waits", &self.inner.parts.waits)
            .field("l1", &self.inner.parts.l1_settings)
            .field("breaker", &self.inner.parts.breaker_settings)
            .field("readable_keys", &self.inner.readable_keys)
            .finish_non_exhaustive()
    }
}

/// What [`Cache::l1_hit`] found: the value as its reader decoded it, when it stops being
/// fresh, and when L1 was read (one clock reading for the caller's own times too).
pub(crate) struct L1Found<T> {
    pub(crate) value: Arc<T>,
    pub(crate) fresh_until: tokio::time::Instant,
    pub(crate) read_at: tokio::time::Instant,
}

impl Cache {
    pub(crate) fn from_parts(store: Arc<dyn Store>, config: Config) -> Self {
        Cache {
            inner: Arc::new(Inner {
                parts: Arc::new(Parts::new(store, &config)),
                flights: flights::Flights::default(),
                readable_keys: config.readable_keys,
            }),
        }
    }

    /// A builder for a cache over `store`.
    pub fn builder(store: impl Store) -> CacheBuilder {
        CacheBuilder::new(Arc::new(store))
    }

    /// A builder for a cache over a store that is already shared.
    pub fn builder_shared(store: Arc<dyn Store>) -> CacheBuilder {
        CacheBuilder::new(store)
    }

    /// Like [`fetch`](Self::fetch), with a loader that revalidates: when the store still keeps
    /// the value it reloads (past its freshness, within its stale windows or
    /// [`keep_for_revalidation`](CacheBuilder::keep_for_revalidation)), the loader is handed
    /// it as a [`Previous`], and may answer [`Loaded::not_modified`] (a conditional request
    /// that the backend answered "unchanged"): the value is then fresh again for every
    /// process, its bytes not sent to the store again, and the call's outcome is
    /// [`Outcome::Revalidated`]. It is still one load per stampede, across processes: the
    /// loader runs under the reload lock as any load does, and followers get the renewed
    /// value. Without a previous value the loader loads as any other.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// # tokio::time::pause();
    /// let cache = Cache::builder(MemoryStore::new())
    ///     .ttl(Duration::from_secs(60))
    ///     .keep_for_revalidation(Duration::from_secs(3600))
    ///     .build();
    /// // The backend's version of the document, as an `ETag` would say it.
    /// let revalidate = |previous: Option<tower_stampede::Previous>| async move {
    ///     match previous {
    ///         Some(previous) if previous.value().as_ref() == b"v1" => Ok(Loaded::not_modified()),
    ///         _ => Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v1"))),
    ///     }
    /// };
    /// let first = cache.fetch_revalidating("doc", revalidate).await?;
    /// assert_eq!(first.outcome(), Outcome::Leader);
    /// tokio::time::advance(Duration::from_secs(61)).await; // stale now
    /// let again = cache.fetch_revalidating("doc", revalidate).await?;
    /// assert_eq!(again.outcome(), Outcome::Revalidated);
    /// assert_eq!(again.value().map(|v| &v[..]), Some(&b"v1"[..]));
    /// # Ok(()) }
    /// ```
    pub async fn fetch_revalidating<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce(Option<Previous>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch_shared(fetch::Ask::key(key.as_ref()), loader)
            .await
    }

    /// Like [`fetch`](Self::fetch), with this call's own soft timeout in place of the
    /// cache's ([`CacheBuilder::soft_timeout`]): where a stale value is there to answer
    /// with, this call gets it once its reload has taken `soft_timeout`, and the reload
    /// goes on and fills the cache for everyone. A call that joins a flight of this process
    /// already in progress shares that flight's soft timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache, Loaded, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// # tokio::time::pause();
    /// let cache = Cache::builder(MemoryStore::new())
    ///     .stale_if_error(Duration::from_secs(3600))
    ///     .build();
    /// let load = |value: &'static [u8]| move || async move {
    ///     tokio::time::sleep(Duration::from_millis(500)).await; // a slow backend
    ///     Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(value)))
    /// };
    /// cache.fetch("report", load(b"v1")).await?;
    /// cache.expire("report").await?; // stale now
    /// let soft = Duration::from_millis(50);
    /// let answer = cache.fetch_with_soft_timeout("report", soft, load(b"v2")).await?;
    /// assert_eq!(answer.outcome(), Outcome::Stale);
    /// assert_eq!(answer.value().map(|v| &v[..]), Some(&b"v1"[..]));
    /// # Ok(()) }
    /// ```
    pub async fn fetch_with_soft_timeout<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        soft_timeout: Duration,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let ask = fetch::Ask::key(key.as_ref()).soft_timeout(soft_timeout);
        self.fetch_shared(ask, move |_| loader()).await
    }

    /// Where the cache's metrics go, for the HTTP layer's own.
    pub(crate) fn meter(&self) -> telemetry::Meter {
        self.inner.parts.meter.clone()
    }

    /// Counts a request the HTTP layer answered without the cache.
    pub(crate) fn count_bypass(&self) {
        self.inner.parts.meter.lookup("bypass");
    }

    /// How long the store keeps values past their freshness (for stale windows and
    /// revalidation).
    pub(crate) fn keep(&self) -> std::time::Duration {
        self.inner.parts.lives.keep()
    }

    /// What the cache has counted so far.
    pub fn stats(&self) -> Stats {
        let parts = &self.inner.parts;
        parts.counters.stats(
            parts.l1.bytes(),
            parts.refreshes.started(),
            parts.breaker.counts(),
        )
    }

    /// Whether the store is believed to answer: `false` while the circuit breaker is open
    /// (this process then protects the backend on its own). The breaker's state alone: a
    /// store that stopped answering while nobody called it stays "available"; a readiness
    /// probe wants [`health`](Self::health).
    pub fn store_available(&self) -> bool {
        self.inner.parts.breaker.is_closed()
    }

    /// The store this cache shares with other processes.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.parts.store
    }

    /// What the store holds under `key`, read as the engine's own store calls are: within
    /// [`store_timeout`](CacheBuilder::store_timeout), counted by the circuit breaker, and
    /// not sent while it is open. For the layer's reads outside a fetch.
    pub(crate) async fn read_stored(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let key = self.store_key(key);
        self.inner
            .parts
            .breaker
            .call(self.inner.parts.store.get(&key))
            .await
    }

    /// The store key of a logical key, as this cache names it (for tools and tests).
    pub fn store_key(&self, key: impl AsRef<[u8]>) -> StoreKey {
        StoreKey::new(
            Arc::clone(&self.inner.parts.namespace),
            KeyDigest::of(key.as_ref()),
        )
    }
}
