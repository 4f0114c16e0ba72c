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
//! | `mod.rs` | this map, and the names the crate shows |
//! | `engine.rs` | [`Cache`] and `Inner`: the parts, the flights, the key spelling; the calls that read no flight ([`Cache::stats`], [`Cache::store`], [`Cache::store_key`]) |
//! | `parts.rs` | `Parts`: the components and settings every flight's roles are handed (their lookups are built in `protocol/lookup.rs`, their tag checks in `tags.rs`) |
//! | `config.rs` | the settings, a slice for each component that reads them |
//! | `builder.rs` | [`CacheBuilder`] and [`Cache::builder`]: the settings, set in code |
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
//! | `loaded.rs` | what a loader is given and produces: [`Previous`], [`Loaded`], and the `Handoff` of a load that stores nothing |
//! | `outcome.rs` | how a call was answered: [`Outcome`] |
//! | `fetched.rs` | what a call is answered: [`Fetched`]; what a loader gives and what of it reaches its own caller alone (`Gives`, `Own`) |
//! | `stats.rs` | [`Stats`] and the counters behind it |
//! | `store_timeout.rs` | the store timeout, measured against the store, not the process's scheduling |
//! | `entry/` | the bytes kept in the store: header, kinds, tags, windows (and its tests) |
//! | `error.rs` | [`Error`] and [`ErrorKind`] |
//! | `health.rs` | [`Cache::health`] and [`Health`] |
//! | `fetch.rs` | [`Cache::get_or_load`], [`Cache::fetch`] and their siblings (with a loader that chooses, revalidates, or its own soft timeout), and every call's way into the engine: the L1 hit, the fetch, its span and count |
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
mod engine;
pub(crate) mod entry;
mod error;
mod fetched;
mod flight;
mod flights;
mod health;
mod known_tags;
mod l1;
mod loaded;
mod outcome;
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

pub use build_error::BuildError;
pub use builder::CacheBuilder;
pub use config::WaitTimeoutPolicy;
pub use engine::Cache;
pub(crate) use engine::L1Found;
pub use error::{BoxError, Error, ErrorKind};
pub(crate) use fetch::Ask;
pub use fetched::Fetched;
pub(crate) use fetched::{Gives, Own};
pub use health::Health;
pub(crate) use loaded::Handoff;
pub use loaded::{Loaded, Previous};
pub use outcome::Outcome;
pub use stats::Stats;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use telemetry::{describe_metrics, DURATION_BUCKETS, HISTOGRAMS, METRICS_PREFIX};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use typed::{Codec, Postcard, Typed};
