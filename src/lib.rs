//! Cache-stampede protection for tower services and hot keys.
//!
//! When a hot key expires and a thousand requests arrive at once, across many processes,
//! exactly one of them reloads the backing store; everyone else is answered from the cache the
//! moment it is filled.
//!
//! - [`cache`]: the engine, [`Cache::get_or_load`], for any hot key, and with feature `serde`
//!   typed values of any serde type (`Cache::typed`);
//! - [`http`]: the tower middleware, [`StampedeLayer`], for HTTP services (axum, hyper);
//! - [`service`]: [`CacheLayer`](service::CacheLayer), for any tower service (gRPC, clients);
//! - [`store`]: where values and reload locks are shared: [`MemoryStore`](store::MemoryStore)
//!   (embedded default) and `RedisStore` (feature `redis`; Redis Cluster with feature
//!   `cluster`, `rediss://` with feature `tls`).
//!
//! # Example
//!
//! Two concurrent lookups of one cold key cost one load; the second caller is answered with
//! the value the first one loaded.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! use bytes::Bytes;
//! use tower_stampede::{store::MemoryStore, Cache};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_stampede::Error> {
//! let cache = Cache::builder(MemoryStore::new()).build();
//! let loads = Arc::new(AtomicUsize::new(0));
//! let load = || {
//!     let loads = Arc::clone(&loads);
//!     move || async move {
//!         // The slow part: a database query, a render.
//!         loads.fetch_add(1, Ordering::SeqCst);
//!         Ok::<_, std::io::Error>(Bytes::from_static(b"Ada Lovelace"))
//!     }
//! };
//! let (first, second) = tokio::join!(
//!     cache.get_or_load("user:42", load()),
//!     cache.get_or_load("user:42", load()),
//! );
//! assert_eq!(first?, "Ada Lovelace");
//! assert_eq!(second?, "Ada Lovelace");
//! assert_eq!(loads.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```
//!
//! With a `RedisStore` shared by several processes instead, the lookups of all of them cost
//! one load.
#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
#[macro_use]
mod macros;

pub mod cache;
pub mod guide;
pub mod http;
pub mod service;
pub mod store;
mod sync;

pub use cache::{
    BoxError, BuildError, Cache, CacheBuilder, Error, ErrorKind, Fetched, Health, Loaded, Outcome,
    Previous, Stats, WaitTimeoutPolicy,
};
pub use http::{Stampede, StampedeLayer};

/// The README's examples, compiled as doctests. They use every feature (`RedisStore` on a
/// Redis Cluster and over TLS, typed values), so they build with `--all-features`, as
/// `scripts/test.sh` runs.
#[cfg(all(
    doctest,
    feature = "cluster",
    feature = "sentinel",
    feature = "tls",
    feature = "serde"
))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guides' examples (`docs/*.md`), compiled as doctests, as the README's are.
#[cfg(all(
    doctest,
    feature = "cluster",
    feature = "sentinel",
    feature = "tls",
    feature = "serde"
))]
mod guide_doctests {
    #[doc = include_str!("../docs/recipes.md")]
    pub struct Recipes;
    #[doc = include_str!("../docs/operations.md")]
    pub struct Operations;
    #[doc = include_str!("../docs/services.md")]
    pub struct Services;
}
