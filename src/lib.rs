//! Cache-stampede protection for tower services and hot keys.
//!
//! When a hot key expires and a thousand requests arrive at once, across many processes,
//! exactly one of them reloads the backing store; everyone else is answered from the cache the
//! moment it is filled.
//!
//! - [`cache`]: the engine, [`Cache::get_or_load`], for any hot key;
//! - [`http`]: the tower middleware, [`StampedeLayer`], for HTTP services (axum, hyper);
//! - [`store`]: where values and reload locks are shared: [`MemoryStore`](store::MemoryStore)
//!   (embedded default) and `RedisStore` (feature `redis`; Redis Cluster with feature
//!   `cluster`, `rediss://` with feature `tls`).
#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cache;
pub mod http;
pub mod store;
mod sync;

pub use cache::{
    BoxError, Cache, CacheBuilder, Error, ErrorKind, Fetched, Loaded, Outcome, Stats,
    WaitTimeoutPolicy,
};
pub use http::{Stampede, StampedeLayer};
