//! The tower middleware: a stampede guard in front of any HTTP service.
//!
//! [`StampedeLayer`] wraps a service (an axum `Router`, a hyper client, any
//! `Service<http::Request<B>>`) so that cacheable `GET` responses are shared through a
//! [`Cache`](crate::Cache): when a thousand requests for one cold URL arrive across many processes, the inner
//! service is called once and everyone else is answered from the cache.
//!
//! Every response the layer handles carries `x-cache`:
//!
//! | `x-cache` | meaning |
//! | --- | --- |
//! | `HIT` | from the cache (L1, the shared store, or another request's load) |
//! | `MISS` | this request's own load filled the cache |
//! | `STALE` | a stale response, served while another request refreshes it, or in place of a failed refresh (see [`stale`](crate::CacheBuilder::stale)) |
//! | `BYPASS` | passed to the inner service: not cacheable (request or response) |
//!
//! Requests with other methods than `GET` pass through untouched, without `x-cache`.
//!
//! # What is cached
//!
//! `GET` requests without `Authorization` or `Cache-Control: no-store`, keyed by scheme,
//! authority (or `Host`) and path with query. Responses with status 200 and no `no-store`,
//! `private`, `no-cache`, `Set-Cookie` or `Vary`, whose body fits
//! [`max_body_bytes`](StampedeLayer::max_body_bytes) and has no trailers. The TTL is the
//! response's `s-maxage` or `max-age`, else the cache's default [`ttl`](crate::CacheBuilder::ttl).
//! Status, headers (but hop-by-hop ones) and body are kept byte for byte.
//!
//! A response that is not cacheable streams to the request that loaded it untouched (a body
//! over the limit is replayed from what was read, then streamed on), and a short "pass" marker
//! sends the requests waiting for it to the inner service directly.
//!
//! # Backpressure
//!
//! [`Stampede`] is always ready: cache hits and followers waiting for another request's load
//! never call the inner service, so they must not hold its readiness. Each call that does reach
//! the inner service (a load, a pass, another method) drives a clone of it to readiness first,
//! inside the response future. Put a concurrency limit *inside* the layer to bound the load on
//! the backend, or *outside* it to bound requests in flight.
//!
//! The inner service, its futures, errors and bodies must be `Send + 'static`: a load runs in a
//! task of its own, so it completes and fills the cache even if the request that started it
//! is dropped.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//! use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let cache = Cache::builder(MemoryStore::new()).build();
//! let mut service = ServiceBuilder::new()
//!     .layer(StampedeLayer::new(cache))
//!     .service(service_fn(|_req: Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("hello"))))
//!     }));
//!
//! let first = service.ready().await?.call(Request::get("http://example.com/").body(())?).await?;
//! assert_eq!(first.headers()["x-cache"], "MISS");
//! let second = service.ready().await?.call(Request::get("http://example.com/").body(())?).await?;
//! assert_eq!(second.headers()["x-cache"], "HIT");
//! assert_eq!(second.into_body().collect().await?.to_bytes(), "hello");
//! # Ok(()) }
//! ```

mod body;
pub(crate) mod codec;
mod future;
mod layer;
mod policy;
mod service;

use http::{HeaderName, HeaderValue};

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::StampedeLayer;
pub use service::Stampede;

/// The header that tells how the layer answered.
pub(crate) static X_CACHE: HeaderName = HeaderName::from_static("x-cache");
pub(crate) const HIT: HeaderValue = HeaderValue::from_static("HIT");
pub(crate) const MISS: HeaderValue = HeaderValue::from_static("MISS");
pub(crate) const BYPASS: HeaderValue = HeaderValue::from_static("BYPASS");
pub(crate) const STALE: HeaderValue = HeaderValue::from_static("STALE");

/// The layer's settings, shared by every service it makes.
#[derive(Clone, Debug)]
pub(crate) struct HttpConfig {
    pub(crate) max_body_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 1024 * 1024,
        }
    }
}
