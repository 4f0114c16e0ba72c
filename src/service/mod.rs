//! A stampede guard for any tower [`Service`](tower::Service): a gRPC method, a database
//! client wrapped as a service, an internal RPC client. [`CacheLayer`] keys each request
//! with a function of yours, and answers it from the cache, or from one load of the inner
//! service per stampede across every process that shares the store.
//!
//! - The **key** function, `Fn(&Req) -> Option<Key>` (`Key: AsRef<[u8]>`): two requests
//!   that must not share an answer must not share a key. `None` sends the request to the
//!   inner service untouched (a call with credentials, a request that is not idempotent).
//! - The **codec** ([`ServiceCodec`]): with feature `serde`, responses are stored as
//!   typed values (`CacheLayer::new`, `Cache::typed`); any other format through
//!   [`CacheLayer::with_codec`].
//! - The **freshness** ([`Freshness`], or a function of the response): TTL, stale windows
//!   and tags, as a loader's [`Loaded`](crate::Loaded) has them. Early refresh and stale
//!   serving are the cache's own settings.
//! - **Errors** of the inner service go to every call that waited for the failed load, in
//!   this process (and in the others, where the codec encodes them); they are never stored
//!   unless [`CacheLayer::cache_errors`] says so. Errors of the cache become the inner
//!   service's error type ([`MapError`]).
//!
//! Responses are cloned out of L1 (`Response: Clone`).
//!
//! ```
//! # #[cfg(feature = "serde")]
//! # {
//! use std::time::Duration;
//! use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_stampede::service::CacheLayer;
//! use tower_stampede::{store::MemoryStore, Cache};
//!
//! #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
//! struct User {
//!     id: u64,
//!     name: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let cache = Cache::builder(MemoryStore::new()).build();
//! let mut users = ServiceBuilder::new()
//!     .layer(CacheLayer::new(cache, |id: &u64| Some(format!("user:{id}"))).ttl(Duration::from_secs(60)))
//!     .service(service_fn(|id: u64| async move {
//!         // The slow part: one query per stampede, cluster-wide.
//!         Ok::<_, BoxError>(User { id, name: "Ada".into() })
//!     }));
//! let user = users.ready().await?.call(42).await?;
//! assert_eq!(user, User { id: 42, name: "Ada".into() });
//! # Ok(())
//! # }
//! # }
//! # #[cfg(not(feature = "serde"))]
//! # fn main() {}
//! ```
//!
//! A gRPC service built this way, its key the method's path and the encoded request
//! message, is in `examples/grpc`; `docs/services.md` is the guide.
//!
//! | file | holds |
//! | --- | --- |
//! | `layer.rs` | [`CacheLayer`]: the configuration a user writes |
//! | `settings.rs` | `Settings`: what every service of a layer shares |
//! | `cache_service.rs` | [`CacheService`]: the key, an L1 hit, or a fetch |
//! | `fetch.rs` | a fetch through the engine, and the load that calls the inner service |
//! | `future.rs` | [`ResponseFuture`], the service's named future |
//! | `codec.rs` | [`ServiceCodec`], and the bytes the layer stores |
//! | `freshness.rs` | [`Freshness`], [`FreshnessFor`]: how long a response is stored |
//! | `error.rs` | [`MapError`], and the inner service's errors shared with waiters |

mod cache_service;
mod codec;
mod error;
mod fetch;
mod freshness;
mod future;
mod layer;
mod settings;

pub use cache_service::CacheService;
pub use codec::ServiceCodec;
pub use error::{IntoError, MapError};
pub use freshness::{CachingErrors, Freshness, FreshnessFor};
pub use future::ResponseFuture;
pub use layer::CacheLayer;
