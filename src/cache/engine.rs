//! [`Cache`], the handle every caller holds, and `Inner`, what its clones share: the parts
//! handed to every flight, the flights in progress, and the key spelling. Its calls that read
//! no flight (stats, the store, the store key) are here; the fetches are in `fetch.rs`, each
//! other family of calls in a file of its own (see the folder's map in `mod.rs`).

use std::sync::Arc;

use super::config::Config;
use super::flights::Flights;
use super::parts::Parts;
use super::stats::Stats;
use super::telemetry::Meter;
use crate::store::{KeyDigest, Store, StoreError, StoreKey, Stored};

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
/// more in the [module docs](crate::cache).
#[derive(Clone)]
pub struct Cache {
    pub(super) inner: Arc<Inner>,
}

/// The engine: its parts, handed to every flight, and what only the engine reads.
pub(super) struct Inner {
    pub(super) parts: Arc<Parts>,
    pub(super) flights: Flights,
    /// Whether a key's spelling goes with its digest to the store (see
    /// [`CacheBuilder::readable_keys`]).
    pub(super) readable_keys: bool,
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
                flights: Flights::default(),
                readable_keys: config.readable_keys,
            }),
        }
    }

    /// Where the cache's metrics go, for the HTTP layer's own.
    pub(crate) fn meter(&self) -> Meter {
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
