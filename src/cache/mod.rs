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
//! A flight runs in its own task: a caller that goes away does not cancel the load, which fills
//! the cache for everyone else. The lock is released on every path: by the fill itself, by an
//! explicit token-checked release when a load fails, by a drop guard if the flight's task is
//! torn down, and by the lock's TTL if the whole process dies.
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

mod breaker;
mod config;
pub(crate) mod entry;
mod error;
pub(crate) mod telemetry;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, debug_span, warn, Instrument};

use crate::store::{
    BoxFuture, KeyDigest, LockState, LockToken, LockWhen, Store, StoreError, StoreKey,
};
use breaker::{Admit, Breaker};
use entry::Entry;
use telemetry::{LockEvent, WaitEnd};

pub(crate) use config::Config;
pub use config::{CacheBuilder, WaitTimeoutPolicy};
pub use error::{BoxError, Error, ErrorKind};

/// What a loader passed to [`Cache::fetch`] produced.
#[derive(Clone, Debug)]
pub struct Loaded {
    kind: LoadedKind,
}

#[derive(Clone, Debug)]
enum LoadedKind {
    Value { bytes: Bytes, ttl: Option<Duration> },
    Pass,
}

impl Loaded {
    /// A value to store for the cache's default [`ttl`](CacheBuilder::ttl).
    pub fn value(bytes: Bytes) -> Self {
        Loaded {
            kind: LoadedKind::Value { bytes, ttl: None },
        }
    }

    /// A value to store for `ttl`.
    pub fn value_with_ttl(bytes: Bytes, ttl: Duration) -> Self {
        Loaded {
            kind: LoadedKind::Value {
                bytes,
                ttl: Some(ttl),
            },
        }
    }

    /// Nothing to store: the load's result is not cacheable. A short "pass" marker tells
    /// followers to stop waiting and go to the backend directly.
    pub fn pass() -> Self {
        Loaded {
            kind: LoadedKind::Pass,
        }
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
}

impl Outcome {
    /// A short name for logs and metrics: `hit-l1`, `hit-l2`, `miss-leader`, `follower`,
    /// `pass`, `uncached`, `stale`, `degraded`.
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
        }
    }
}

/// The answer of [`Cache::fetch`].
#[derive(Clone, Debug)]
pub struct Fetched {
    value: Option<Bytes>,
    outcome: Outcome,
}

impl Fetched {
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

#[derive(Default)]
struct Counters {
    loads: AtomicU64,
    corrupt_entries: AtomicU64,
    store_errors: AtomicU64,
    store_calls_skipped: AtomicU64,
    breaker_opened: AtomicU64,
    early_refreshes: AtomicU64,
}

/// How much later than this process reckons the store may still call the value it early
/// refreshes due (the store's clock is read a round trip away).
const EARLY_REFRESH_SLACK: Duration = Duration::from_millis(5);

/// A flight's loader, and which payloads its caller can read: a stored value whose payload it
/// cannot read is treated as a corrupt entry (a miss, counted and overwritten).
struct BoxLoader {
    run: Box<dyn FnOnce() -> BoxFuture<'static, Result<Loaded, BoxError>> + Send>,
    accepts: fn(&Bytes) -> bool,
}

impl BoxLoader {
    fn new<F, Fut, E>(accepts: fn(&Bytes) -> bool, loader: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        BoxLoader {
            run: Box::new(move || Box::pin(async move { loader().await.map_err(Into::into) })),
            accepts,
        }
    }

    /// Decodes a store entry; a value this loader's caller cannot read is corrupt.
    fn decode(&self, bytes: &Bytes) -> Result<Entry, entry::Corrupt> {
        match entry::decode(bytes)? {
            Entry::Value { payload, .. } if !(self.accepts)(&payload) => Err(entry::Corrupt),
            entry => Ok(entry),
        }
    }
}

type FlightResult = Result<Fetched, Error>;

/// One flight in progress: its id (so only it removes itself) and where its result appears.
struct FlightHandle {
    id: u64,
    result: watch::Receiver<Option<FlightResult>>,
}

/// An entry of L1: the value, how long it may live there, and what early refresh needs.
#[derive(Clone)]
struct L1Entry {
    value: Bytes,
    ttl: Duration,
    /// When the value stops being fresh in the store.
    fresh_until: Instant,
    /// How long its load took (XFetch's δ).
    load_time: Duration,
}

/// A value past its freshness that the store still keeps, and how far past it was when read.
struct StaleValue {
    payload: Bytes,
    staleness: Duration,
    read_at: Instant,
}

impl StaleValue {
    fn staleness(&self) -> Duration {
        self.staleness.saturating_add(self.read_at.elapsed())
    }
}

impl L1Entry {
    /// What the entry costs L1: its value, plus about what the digest and moka's own
    /// bookkeeping cost per entry.
    fn weight(&self) -> u32 {
        u32::try_from(self.value.len().saturating_add(96)).unwrap_or(u32::MAX)
    }
}

struct L1Expiry;

impl moka::Expiry<KeyDigest, L1Entry> for L1Expiry {
    fn expire_after_create(
        &self,
        _key: &KeyDigest,
        value: &L1Entry,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &KeyDigest,
        value: &L1Entry,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// The stampede guard's engine; see the [module docs](self).
///
/// Cheap to clone: clones share L1, flights and settings. Build one with [`Cache::builder`].
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    config: Config,
    breaker: Arc<Breaker>,
    /// L1's weight in bytes: added on insert, taken off by moka's eviction listener.
    l1_bytes: Arc<AtomicU64>,
    l1: Option<moka::future::Cache<KeyDigest, L1Entry>>,
    flights: Mutex<HashMap<KeyDigest, FlightHandle>>,
    /// Keys with an early refresh in progress in this process.
    refreshing: Mutex<HashSet<KeyDigest>>,
    next_flight: AtomicU64,
    counters: Counters,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("store", &self.inner.store)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// A builder for a cache over `store`.
    pub fn builder(store: impl Store) -> CacheBuilder {
        CacheBuilder::new(Arc::new(store))
    }

    /// A builder for a cache over a store that is already shared.
    pub fn builder_shared(store: Arc<dyn Store>) -> CacheBuilder {
        CacheBuilder::new(store)
    }

    pub(crate) fn from_parts(store: Arc<dyn Store>, config: Config) -> Self {
        let l1_bytes = Arc::new(AtomicU64::new(0));
        let l1 = (config.l1_capacity > 0).then(|| {
            let removed = Arc::clone(&l1_bytes);
            moka::future::Cache::builder()
                .max_capacity(config.l1_capacity)
                .weigher(|_key: &KeyDigest, entry: &L1Entry| entry.weight())
                .expire_after(L1Expiry)
                // Replaced, expired or evicted: no longer counted.
                .eviction_listener(move |_key, entry: L1Entry, _cause| {
                    let weight = u64::from(entry.weight());
                    let before = removed
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                            Some(b.saturating_sub(weight))
                        })
                        .unwrap_or_default();
                    telemetry::l1_bytes(before.saturating_sub(weight));
                })
                .build()
        });
        Cache {
            inner: Arc::new(Inner {
                store,
                l1_bytes,
                breaker: Arc::new(Breaker::new(
                    config.breaker_threshold,
                    config.breaker_open_for,
                )),
                config,
                l1,
                flights: Mutex::new(HashMap::new()),
                refreshing: Mutex::new(HashSet::new()),
                next_flight: AtomicU64::new(0),
                counters: Counters::default(),
            }),
        }
    }

    /// The value of `key`: from L1, from the store, or from `loader`, run at most once per
    /// stampede across every process that shares the store. The value is stored for the
    /// cache's default [`ttl`](CacheBuilder::ttl).
    ///
    /// `loader` runs in its own task, so it finishes and fills the cache even if this call is
    /// dropped. Callers that shared a failed load share its error.
    pub async fn get_or_load<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Bytes, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let fetched = self
            .fetch(key, move || async move {
                loader().await.map(Loaded::value).map_err(Into::into)
            })
            .await?;
        fetched
            .into_value()
            .ok_or_else(|| Error::new(ErrorKind::Pass))
    }

    /// Like [`get_or_load`](Self::get_or_load), with a loader that chooses each value's TTL or
    /// declares its result not cacheable ([`Loaded::pass`]), and an answer that tells how the
    /// call was served ([`Outcome`]).
    pub async fn fetch<F, Fut, E>(&self, key: impl AsRef<[u8]>, loader: F) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.fetch_accepting(key, |_| true, loader).await
    }

    /// Like [`fetch`](Self::fetch), for a caller that can read only the values `accepts` says
    /// yes to: any other value found in the store is a corrupt entry (a miss, counted and
    /// overwritten by this load).
    pub(crate) async fn fetch_accepting<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        accepts: fn(&Bytes) -> bool,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let digest = KeyDigest::of(key.as_ref());
        let span = debug_span!(
            "stampede.fetch",
            key = %digest,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        );
        // The wait is only measured for a span that records it.
        let started = (!span.is_disabled()).then(Instant::now);
        let answer = self
            .fetch_digest(digest, accepts, loader)
            .instrument(span.clone())
            .await;
        match &answer {
            Ok(fetched) => {
                telemetry::outcome(fetched.outcome);
                span.record("outcome", fetched.outcome.label());
            }
            Err(error) => {
                span.record("outcome", "error");
                debug!(parent: &span, %error, "no value");
            }
        }
        if let (Some(started), false) = (
            started,
            matches!(&answer, Ok(f) if f.outcome == Outcome::L1Hit),
        ) {
            span.record("wait_ms", started.elapsed().as_secs_f64() * 1000.0);
        }
        answer
    }

    async fn fetch_digest<F, Fut, E>(
        &self,
        digest: KeyDigest,
        accepts: fn(&Bytes) -> bool,
        loader: F,
    ) -> Result<Fetched, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Loaded, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let mut l1_checked_twice = false;
        let (mut result, created) = loop {
            if let Some(l1) = &self.inner.l1 {
                if let Some(entry) = l1.get(&digest).await {
                    if self
                        .inner
                        .early_refresh_due(entry.fresh_until, entry.load_time)
                    {
                        let loader = BoxLoader::new(accepts, loader);
                        self.inner.refresh_early(digest, loader, entry.fresh_until);
                    }
                    return Ok(Fetched {
                        value: Some(entry.value),
                        outcome: Outcome::L1Hit,
                    });
                }
            }
            let mut flights = self.inner.flights();
            if let Some(flight) = flights.get(&digest) {
                break (flight.result.clone(), false);
            }
            // A flight may have filled L1 and landed since the look above: look once more
            // rather than pay a store round trip.
            let in_l1 = self
                .inner
                .l1
                .as_ref()
                .is_some_and(|l1| l1.contains_key(&digest));
            if in_l1 && !l1_checked_twice {
                l1_checked_twice = true;
                continue;
            }
            let loader = BoxLoader::new(accepts, loader);
            let id = self.inner.next_flight.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = watch::channel(None);
            flights.insert(
                digest,
                FlightHandle {
                    id,
                    result: rx.clone(),
                },
            );
            let landing = Landing {
                inner: Arc::clone(&self.inner),
                digest,
                id,
            };
            tokio::spawn(fly(landing, tx, loader));
            break (rx, true);
        };
        let answer = match result.wait_for(Option::is_some).await {
            Ok(answer) => answer
                .clone()
                .unwrap_or_else(|| Err(Error::new(ErrorKind::LoadPanicked))),
            // The flight's task ended without an answer: it panicked or its runtime shut down.
            Err(_) => Err(Error::new(ErrorKind::LoadPanicked)),
        };
        answer.map(|mut fetched| {
            // Only the caller that started the flight gave it its loader.
            if !created
                && matches!(
                    fetched.outcome,
                    Outcome::Leader | Outcome::Uncached | Outcome::Degraded
                )
            {
                fetched.outcome = Outcome::Follower;
            }
            fetched
        })
    }

    /// What the cache has counted so far.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            loads: c.loads.load(Ordering::Relaxed),
            corrupt_entries: c.corrupt_entries.load(Ordering::Relaxed),
            store_errors: c.store_errors.load(Ordering::Relaxed),
            store_calls_skipped: c.store_calls_skipped.load(Ordering::Relaxed),
            l1_bytes: self.inner.l1_bytes.load(Ordering::Relaxed),
            breaker_opened: c.breaker_opened.load(Ordering::Relaxed),
            early_refreshes: c.early_refreshes.load(Ordering::Relaxed),
        }
    }

    /// Whether the store is believed to answer: `false` while the circuit breaker is open
    /// (this process then protects the backend on its own). For health checks.
    pub fn store_available(&self) -> bool {
        self.inner.breaker.is_closed()
    }

    /// The store this cache shares with other processes.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The store key of a logical key, as this cache names it (for tools and tests).
    pub fn store_key(&self, key: impl AsRef<[u8]>) -> StoreKey {
        StoreKey::new(
            Arc::clone(&self.inner.config.namespace),
            KeyDigest::of(key.as_ref()),
        )
    }
}

/// Removes a flight from the map when its task ends, whichever way it ends (even if the task
/// is dropped before it first runs, as when its runtime shuts down).
struct Landing {
    inner: Arc<Inner>,
    digest: KeyDigest,
    id: u64,
}

impl Drop for Landing {
    fn drop(&mut self) {
        let mut flights = self.inner.flights();
        if flights.get(&self.digest).is_some_and(|f| f.id == self.id) {
            flights.remove(&self.digest);
        }
    }
}

/// A flight's task: resolve the key, then land (leave the map) and publish the answer.
async fn fly(landing: Landing, result: watch::Sender<Option<FlightResult>>, loader: BoxLoader) {
    let inner = Arc::clone(&landing.inner);
    let answer = inner.resolve(landing.digest, loader, &result).await;
    drop(landing);
    result.send_replace(Some(answer));
}

/// The leader's lock, released when dropped unless the fill or an explicit release took it.
struct LockGuard {
    store: Arc<dyn Store>,
    key: StoreKey,
    token: LockToken,
    armed: bool,
}

impl LockGuard {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.armed {
            // The backstop for a flight torn down mid-load.
            release_in_background(&self.store, &self.key, self.token);
        }
    }
}

/// A best-effort, token-checked release in a task of its own; without a runtime, the lock's
/// TTL frees it.
fn release_in_background(store: &Arc<dyn Store>, key: &StoreKey, token: LockToken) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (store, key) = (Arc::clone(store), key.clone());
        runtime.spawn(async move {
            let _ = store.release(&key, token).await;
        });
    }
}

/// A follower's pause: `pause` long, or until the key's fill (or release) is notified.
async fn wait_for_fill(filled: &mut Option<crate::store::FillWatch>, pause: Duration) -> WaitEnd {
    let pause = tokio::time::sleep(pause);
    match filled {
        Some(filled) => {
            tokio::select! {
                () = pause => WaitEnd::Polled,
                () = filled.changed() => WaitEnd::Notified,
            }
        }
        None => {
            pause.await;
            WaitEnd::Polled
        }
    }
}

/// How a flight waited for other leaders, for the follower-wait metric.
#[derive(Default)]
struct Waiting {
    since: Option<Instant>,
    ended: Option<WaitEnd>,
}

/// Pauses between a follower's re-reads: exponential, capped, jittered.
struct Backoff {
    next: Duration,
    multiplier: f64,
    max: Duration,
}

impl Backoff {
    fn new(config: &Config) -> Self {
        Backoff {
            next: config.backoff_initial,
            multiplier: config.backoff_multiplier,
            max: config.backoff_max,
        }
    }

    /// The next pause: between half and all of the current step, then the step grows.
    fn pause(&mut self) -> Duration {
        let step = self.next;
        self.next = Duration::try_from_secs_f64(step.as_secs_f64() * self.multiplier)
            .unwrap_or(self.max)
            .min(self.max);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

impl Inner {
    fn flights(&self) -> MutexGuard<'_, HashMap<KeyDigest, FlightHandle>> {
        // Nothing panics while the map is locked; a poisoned map is still consistent.
        crate::sync::lock(&self.flights)
    }

    fn release_in_background(&self, key: &StoreKey, token: LockToken) {
        release_in_background(&self.store, key, token);
    }

    /// One store call, bounded by the store timeout, counted if it fails, and not made at all
    /// while the circuit breaker is open.
    async fn store_call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.breaker.admit() {
            Admit::Call => {}
            admit => {
                self.counters
                    .store_calls_skipped
                    .fetch_add(1, Ordering::Relaxed);
                if admit == Admit::Probe {
                    self.probe();
                }
                return Err(StoreError::circuit_open());
            }
        }
        let timeout = self.config.store_timeout;
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(timeout)),
        };
        if result.is_err() {
            self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
            telemetry::store_error();
        }
        if self.breaker.record(result.is_ok()) {
            self.counters.breaker_opened.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Asks the store, in the background, whether it answers again: a read of a probe key,
    /// bounded by the store timeout. Its answer closes the breaker or keeps it open.
    fn probe(&self) {
        let (store, breaker) = (Arc::clone(&self.store), Arc::clone(&self.breaker));
        let key = StoreKey::new(
            Arc::clone(&self.config.namespace),
            KeyDigest::of(b"tower-stampede:probe"),
        );
        let timeout = self.config.store_timeout;
        tokio::spawn(async move {
            let answered = matches!(
                tokio::time::timeout(timeout, store.get(&key)).await,
                Ok(Ok(_))
            );
            breaker.probed(answered);
        });
    }

    /// Keeps a value in L1 while it is fresh in the store (and no longer than the L1 cap).
    async fn l1_insert(
        &self,
        digest: KeyDigest,
        value: Bytes,
        fresh_for: Duration,
        load_time: Duration,
    ) {
        let ttl = fresh_for.min(self.config.l1_ttl_cap);
        if let (Some(l1), false) = (&self.l1, ttl.is_zero()) {
            let entry = L1Entry {
                value,
                ttl,
                fresh_until: Instant::now() + fresh_for,
                load_time,
            };
            // Counted before the insert, so the listener never takes off what was not added.
            let weight = u64::from(entry.weight());
            let bytes = self.l1_bytes.fetch_add(weight, Ordering::Relaxed) + weight;
            telemetry::l1_bytes(bytes);
            l1.insert(digest, entry).await;
        }
    }

    /// Whether a stale value may be served at once while another leader refreshes it.
    fn serves_while_updating(&self, stale: &StaleValue) -> bool {
        !self.config.stale.is_zero() && stale.staleness() <= self.config.stale
    }

    /// Whether a stale value may stand in for a failed or too slow load.
    fn serves_on_error(&self, stale: &StaleValue) -> bool {
        let max = self.config.stale_if_error();
        !max.is_zero() && stale.staleness() <= max
    }

    /// XFetch: whether a hit on a value fresh until `fresh_until`, whose load took
    /// `load_time`, should refresh it early.
    fn early_refresh_due(&self, fresh_until: Instant, load_time: Duration) -> bool {
        let beta = self.config.early_refresh_beta;
        if beta <= 0.0 {
            return false;
        }
        let delta = load_time.max(Duration::from_millis(1)).as_secs_f64() * beta;
        let now = Instant::now();
        // −ln u is at most about 37 for a 53-bit u: far from expiry, skip the draw.
        let longest = Duration::try_from_secs_f64(delta * 37.0).unwrap_or(Duration::MAX);
        if now.checked_add(longest).is_some_and(|t| t < fresh_until) {
            return false;
        }
        let u = 1.0 - rand::random::<f64>();
        let gap = Duration::try_from_secs_f64(-delta * u.ln()).unwrap_or(Duration::MAX);
        now.checked_add(gap).is_none_or(|t| t >= fresh_until)
    }

    /// Starts an early refresh of the value of `digest` that is fresh until `fresh_until`, in
    /// the background, unless one is running in this process.
    fn refresh_early(self: &Arc<Self>, digest: KeyDigest, loader: BoxLoader, fresh_until: Instant) {
        if !crate::sync::lock(&self.refreshing).insert(digest) {
            return;
        }
        self.counters
            .early_refreshes
            .fetch_add(1, Ordering::Relaxed);
        let refreshing = Refreshing {
            inner: Arc::clone(self),
            digest,
        };
        tokio::spawn(async move {
            refreshing.inner.refresh(digest, loader, fresh_until).await;
            drop(refreshing);
        });
    }

    /// An early refresh of the value that is fresh until `fresh_until`: takes the lock if the
    /// store still holds that value (not a newer one, refreshed by another process) and no one
    /// else holds the lock, then leads as any reload does. If another process is refreshing
    /// it, waits for that fill (while the value is still fresh) and takes the new value into
    /// L1, so this process does not start refresh after refresh meanwhile.
    async fn refresh(&self, digest: KeyDigest, loader: BoxLoader, fresh_until: Instant) {
        let config = &self.config;
        let key = StoreKey::new(Arc::clone(&config.namespace), digest);
        let token = LockToken::random();
        // The store's remaining life of that value, give or take a round trip: a newer value
        // has a whole TTL left.
        let below = config
            .keep()
            .saturating_add(fresh_until.saturating_duration_since(Instant::now()))
            .saturating_add(EARLY_REFRESH_SLACK);
        let mut filled = if config.notifications {
            self.store.subscribe(&key)
        } else {
            None
        };
        let mut backoff = Backoff::new(config);
        let mut fresh_until = None;
        loop {
            if let Some(filled) = filled.as_mut() {
                filled.mark_seen();
            }
            let lookup = match self
                .store_call(self.store.lookup(
                    &key,
                    token,
                    config.lock_ttl,
                    LockWhen::LifeAtMost(below),
                ))
                .await
            {
                Ok(lookup) => lookup,
                Err(error) => {
                    debug!(%error, key = ?digest, "early refresh: store lookup failed");
                    if !error.skipped() {
                        self.release_in_background(&key, token);
                    }
                    return;
                }
            };
            let entry = lookup
                .value
                .map(|stored| (loader.decode(&stored.bytes), stored.ttl));
            match (lookup.lock, entry) {
                (LockState::Acquired, _) => {
                    telemetry::lock(LockEvent::Acquired);
                    debug!(key = ?digest, "refreshing early");
                    if let Err(error) = self.lead(key, token, loader, None, None).await {
                        warn!(key = ?digest, %error, "early refresh failed");
                    }
                    return;
                }
                (LockState::NotRequested, Some((Ok(Entry::Value { payload, load_time }), ttl))) => {
                    // Refreshed by another process: take its value.
                    let fresh_for = ttl.unwrap_or_default().saturating_sub(config.keep());
                    self.l1_insert(digest, payload, fresh_for, load_time).await;
                    return;
                }
                (LockState::HeldElsewhere, Some((_, ttl))) => {
                    // Being refreshed elsewhere: follow it while the value is fresh.
                    let until = *fresh_until.get_or_insert_with(|| {
                        Instant::now() + ttl.unwrap_or_default().saturating_sub(config.keep())
                    });
                    let now = Instant::now();
                    if now >= until {
                        return;
                    }
                    let _ = wait_for_fill(&mut filled, backoff.pause().min(until - now)).await;
                }
                // Gone, or recently failed: ordinary flights deal with it.
                _ => return,
            }
        }
    }

    /// The leader/follower protocol for one key: ends with a value, a pass, or an error.
    ///
    /// `early` takes an answer before the flight ends: the stale value a leader serves while
    /// it refreshes in the background.
    async fn resolve(
        self: &Arc<Self>,
        digest: KeyDigest,
        loader: BoxLoader,
        early: &watch::Sender<Option<FlightResult>>,
    ) -> FlightResult {
        let mut waiting = Waiting::default();
        let answer = self.resolve_key(digest, loader, early, &mut waiting).await;
        if let (Some(since), Some(ended)) = (waiting.since, waiting.ended) {
            let waited = since.elapsed();
            debug!(key = ?digest, ?waited, ended = ended.label(), "followed another leader");
            telemetry::follower_wait(waited, ended);
        }
        answer
    }

    async fn resolve_key(
        self: &Arc<Self>,
        digest: KeyDigest,
        loader: BoxLoader,
        early: &watch::Sender<Option<FlightResult>>,
        waiting: &mut Waiting,
    ) -> FlightResult {
        let config = &self.config;
        let keep = config.keep();
        let key = StoreKey::new(Arc::clone(&config.namespace), digest);
        let token = LockToken::random();
        let started = Instant::now();
        let mut backoff = Backoff::new(config);
        // Set when a corrupt entry is seen: the next lookup (only) counts every value as
        // stale, so it takes the lock to overwrite the entry.
        let mut overwrite = false;
        // Whether this flight has waited for another leader.
        let mut followed = false;
        // The latest stale value seen while waiting, for `WaitTimeoutPolicy::ServeStale`.
        let mut last_stale = None;
        // Watch before the first read, so a fill that lands between a read and the wait wakes
        // the wait; the backoff poll stays as the fallback for lost notifications.
        let mut filled = if config.notifications {
            self.store.subscribe(&key)
        } else {
            None
        };
        loop {
            if let Some(filled) = filled.as_mut() {
                filled.mark_seen();
            }
            let lock_when = if std::mem::take(&mut overwrite) {
                LockWhen::Always
            } else {
                LockWhen::LifeAtMost(keep)
            };
            let lookup = match self
                .store_call(self.store.lookup(&key, token, config.lock_ttl, lock_when))
                .await
            {
                Ok(lookup) => lookup,
                Err(error) if error.skipped() => {
                    debug!(key = ?digest, "circuit open; loading with in-process protection only");
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
                Err(error) => {
                    warn!(%error, key = ?digest, "store lookup failed; loading with in-process protection only");
                    // A lookup that timed out may still have taken the lock: free it, or every
                    // other process would wait for its TTL.
                    self.release_in_background(&key, token);
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
            };
            let entry = lookup
                .value
                .as_ref()
                .map(|stored| (loader.decode(&stored.bytes), stored.ttl));
            let mut lock = lookup.lock;
            if lock_when == LockWhen::Always && lock == LockState::Acquired {
                // The lock was taken to overwrite a corrupt entry; if another leader has
                // overwritten it since, use its value instead of loading again.
                if let Some((Ok(Entry::Value { .. }), Some(ttl))) = &entry {
                    if *ttl > keep {
                        self.release_in_background(&key, token);
                        lock = LockState::NotRequested;
                    }
                }
            }
            // A value the lookup did not call fresh is stale: still kept in the store, past
            // its freshness by `keep` minus its remaining life.
            let stale = match &entry {
                Some((Ok(Entry::Value { payload, .. }), ttl))
                    if lock != LockState::NotRequested && !keep.is_zero() =>
                {
                    Some(StaleValue {
                        payload: payload.clone(),
                        staleness: keep.saturating_sub(ttl.unwrap_or_default()),
                        read_at: Instant::now(),
                    })
                }
                _ => None,
            };
            match lock {
                LockState::Acquired => telemetry::lock(LockEvent::Acquired),
                LockState::HeldElsewhere => telemetry::lock(LockEvent::Contended),
                _ => {}
            }
            match (lock, entry) {
                (LockState::Acquired, _) => {
                    return Box::pin(self.lead(key, token, loader, stale, Some(early))).await;
                }
                (_, Some((Ok(Entry::Pass), _))) => {
                    return Ok(Fetched {
                        value: None,
                        outcome: Outcome::Pass,
                    })
                }
                (LockState::NotRequested, Some((Ok(Entry::Value { payload, load_time }), ttl))) => {
                    let fresh_for = ttl.unwrap_or_default().saturating_sub(keep);
                    self.l1_insert(digest, payload.clone(), fresh_for, load_time)
                        .await;
                    let fresh_until = Instant::now() + fresh_for;
                    if self.early_refresh_due(fresh_until, load_time) {
                        self.refresh_early(digest, loader, fresh_until);
                    }
                    return Ok(Fetched {
                        value: Some(payload),
                        outcome: if followed {
                            Outcome::Follower
                        } else {
                            Outcome::L2Hit
                        },
                    });
                }
                (_, Some((Err(entry::Corrupt), _))) if lock_when != LockWhen::Always => {
                    self.counters
                        .corrupt_entries
                        .fetch_add(1, Ordering::Relaxed);
                    warn!(key = ?digest, "corrupt or foreign entry in the store; treating it as a miss");
                    overwrite = true;
                    continue;
                }
                (LockState::HeldElsewhere, _)
                    if stale
                        .as_ref()
                        .is_some_and(|s| self.serves_while_updating(s)) =>
                {
                    // Serve-while-updating: another leader refreshes it.
                    return Ok(Fetched {
                        value: stale.map(|s| s.payload),
                        outcome: Outcome::Stale,
                    });
                }
                (LockState::Failed, _)
                    if stale.as_ref().is_some_and(|s| self.serves_on_error(s)) =>
                {
                    // Stale-if-error: the last refresh failed a moment ago.
                    return Ok(Fetched {
                        value: stale.map(|s| s.payload),
                        outcome: Outcome::Stale,
                    });
                }
                (LockState::Failed, _) => return Err(Error::new(ErrorKind::RecentFailure)),
                (LockState::HeldElsewhere, _) => {
                    if stale.is_some() {
                        last_stale = stale;
                    }
                }
                (state, _) => {
                    // Only a store that breaks the lookup contract gets here.
                    warn!(?state, key = ?digest, "unexpected store lookup; loading with in-process protection only");
                    return Box::pin(self.load_alone(digest, loader, Outcome::Degraded)).await;
                }
            }
            // A follower: another leader holds the lock.
            followed = true;
            waiting.since.get_or_insert_with(Instant::now);
            let waited = started.elapsed();
            if waited >= config.wait_timeout {
                waiting.ended = Some(WaitEnd::TimedOut);
                debug!(key = ?digest, ?waited, policy = ?config.on_wait_timeout, "wait timed out");
                return match config.on_wait_timeout {
                    WaitTimeoutPolicy::LoadUncached => {
                        Box::pin(self.load_alone(digest, loader, Outcome::Uncached)).await
                    }
                    WaitTimeoutPolicy::LoadAndCache => {
                        Box::pin(self.load_and_put(&key, loader)).await
                    }
                    WaitTimeoutPolicy::ServeStale => match last_stale {
                        Some(stale) if self.serves_on_error(&stale) => Ok(Fetched {
                            value: Some(stale.payload),
                            outcome: Outcome::Stale,
                        }),
                        _ => Err(Error::new(ErrorKind::WaitTimeout)),
                    },
                    WaitTimeoutPolicy::Error => Err(Error::new(ErrorKind::WaitTimeout)),
                };
            }
            let pause = backoff.pause().min(config.wait_timeout - waited);
            waiting.ended = Some(wait_for_fill(&mut filled, pause).await);
        }
    }

    /// Runs a loader in a task of its own, bounded by the load timeout; while it runs, renews
    /// the lock named by `lock` (the watchdog).
    async fn load(
        &self,
        loader: BoxLoader,
        lock: Option<(&StoreKey, LockToken)>,
    ) -> Result<Loaded, Error> {
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        let config = &self.config;
        let started = Instant::now();
        let mut task = tokio::spawn((loader.run)());
        let deadline = tokio::time::sleep(config.load_timeout);
        tokio::pin!(deadline);
        let period = (config.lock_ttl / 3).max(Duration::from_millis(1));
        let mut renew = tokio::time::interval_at(Instant::now() + period, period);
        loop {
            tokio::select! {
                joined = &mut task => {
                    telemetry::load(started.elapsed());
                    return match joined {
                        Ok(Ok(loaded)) => Ok(loaded),
                        Ok(Err(error)) => Err(Error::load(error)),
                        Err(_) => Err(Error::new(ErrorKind::LoadPanicked)),
                    };
                }
                () = &mut deadline => {
                    telemetry::load(started.elapsed());
                    task.abort();
                    return Err(Error::load_timeout(config.load_timeout));
                }
                _ = renew.tick(), if lock.is_some() => {
                    if let Some((key, token)) = lock {
                        match self.store_call(self.store.extend(key, token, config.lock_ttl)).await {
                            Ok(true) => {
                                telemetry::lock(LockEvent::Extended);
                                debug!(?key, "lock extended");
                            }
                            Ok(false) => {
                                telemetry::lock(LockEvent::Lost);
                                warn!(?key, "lock lost during the load; its fill will be refused");
                            }
                            Err(error) => debug!(?key, %error, "lock extension failed"),
                        }
                    }
                }
            }
        }
    }

    /// The leader: load, fill (fenced), and make sure the lock goes on every path. With a
    /// `stale` value, the flight's callers get it at once (through `early`) when refreshes run
    /// in the background, and in place of an error if the load fails (stale-if-error).
    async fn lead(
        &self,
        key: StoreKey,
        token: LockToken,
        loader: BoxLoader,
        stale: Option<StaleValue>,
        early: Option<&watch::Sender<Option<FlightResult>>>,
    ) -> FlightResult {
        if let (Some(stale), Some(early), true) = (&stale, early, self.config.refresh_in_background)
        {
            if self.serves_while_updating(stale) {
                early.send_replace(Some(Ok(Fetched {
                    value: Some(stale.payload.clone()),
                    outcome: Outcome::Stale,
                })));
            }
        }
        let mut guard = LockGuard {
            store: Arc::clone(&self.store),
            key,
            token,
            armed: true,
        };
        let started = Instant::now();
        let loaded = self.load(loader, Some((&guard.key, token))).await;
        let load_time = started.elapsed();
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                // Tell every follower, here and elsewhere, instead of letting each of them
                // take the lock and call the failing backend in turn.
                let told = if self.config.failure_ttl.is_zero() {
                    self.store_call(self.store.release(&guard.key, token)).await
                } else {
                    self.store_call(self.store.fail(&guard.key, token, self.config.failure_ttl))
                        .await
                };
                if told.is_ok() {
                    guard.disarm();
                }
                return match stale {
                    Some(stale) if self.serves_on_error(&stale) => {
                        warn!(key = ?guard.key, %error, "load failed; serving the stale value");
                        Ok(Fetched {
                            value: Some(stale.payload),
                            outcome: Outcome::Stale,
                        })
                    }
                    _ => Err(error),
                };
            }
        };
        let digest = *guard.key.digest();
        match loaded.kind {
            LoadedKind::Value { bytes, ttl } => {
                let ttl = ttl.unwrap_or(self.config.ttl);
                let (encoded, value) = encode(&bytes, load_time);
                let store_ttl = ttl.saturating_add(self.config.keep());
                match self
                    .store_call(self.store.fill(&guard.key, token, encoded, store_ttl))
                    .await
                {
                    Ok(filled) => {
                        // The fill dropped the lock, or the lock was no longer ours.
                        guard.disarm();
                        if filled {
                            self.l1_insert(digest, value.clone(), ttl, load_time).await;
                        } else {
                            telemetry::lock(LockEvent::Lost);
                            warn!(key = ?guard.key, "lock lost before the fill; a newer leader owns the key");
                        }
                    }
                    Err(error) => {
                        warn!(key = ?guard.key, %error, "fill failed; value kept in this process only");
                        self.l1_insert(digest, value.clone(), ttl, load_time).await;
                    }
                }
                Ok(Fetched {
                    value: Some(value),
                    outcome: Outcome::Leader,
                })
            }
            LoadedKind::Pass => {
                let pass = entry::encode_pass();
                if let Ok(true | false) = self
                    .store_call(
                        self.store
                            .fill(&guard.key, token, pass, self.config.pass_ttl),
                    )
                    .await
                {
                    guard.disarm();
                }
                Ok(Fetched {
                    value: None,
                    outcome: Outcome::Pass,
                })
            }
        }
    }

    /// Loads without the store's lock: after a wait timeout, or while the store is failing.
    async fn load_alone(
        &self,
        digest: KeyDigest,
        loader: BoxLoader,
        outcome: Outcome,
    ) -> FlightResult {
        let started = Instant::now();
        match self.load(loader, None).await?.kind {
            LoadedKind::Value { bytes, ttl } => {
                if outcome == Outcome::Degraded {
                    // Keep this process from reloading while the store is down.
                    let ttl = ttl.unwrap_or(self.config.ttl);
                    self.l1_insert(digest, bytes.clone(), ttl, started.elapsed())
                        .await;
                }
                Ok(Fetched {
                    value: Some(bytes),
                    outcome,
                })
            }
            LoadedKind::Pass => Ok(Fetched {
                value: None,
                outcome: Outcome::Pass,
            }),
        }
    }

    /// Loads without the store's lock after a wait timeout, and stores the value anyway
    /// ([`WaitTimeoutPolicy::LoadAndCache`]).
    async fn load_and_put(&self, key: &StoreKey, loader: BoxLoader) -> FlightResult {
        let started = Instant::now();
        let LoadedKind::Value { bytes, ttl } = self.load(loader, None).await?.kind else {
            return Ok(Fetched {
                value: None,
                outcome: Outcome::Pass,
            });
        };
        let (ttl, load_time) = (ttl.unwrap_or(self.config.ttl), started.elapsed());
        let (encoded, value) = encode(&bytes, load_time);
        let store_ttl = ttl.saturating_add(self.config.keep());
        if let Err(error) = self
            .store_call(self.store.put(key, encoded, store_ttl))
            .await
        {
            warn!(?key, %error, "write after a wait timeout failed; value kept in this process only");
        }
        self.l1_insert(*key.digest(), value.clone(), ttl, load_time)
            .await;
        Ok(Fetched {
            value: Some(value),
            outcome: Outcome::Leader,
        })
    }
}

/// A value as the store keeps it, and the payload part of it (sharing the same buffer).
fn encode(bytes: &[u8], load_time: Duration) -> (Bytes, Bytes) {
    let encoded = entry::encode_value(bytes, load_time);
    let value = encoded.slice(entry::HEADER_LEN..);
    (encoded, value)
}

/// Marks an early refresh of a key as over when dropped, however its task ends.
struct Refreshing {
    inner: Arc<Inner>,
    digest: KeyDigest,
}

impl Drop for Refreshing {
    fn drop(&mut self) {
        crate::sync::lock(&self.inner.refreshing).remove(&self.digest);
    }
}
