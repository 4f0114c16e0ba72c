//! The tower middleware: a stampede guard in front of any HTTP service, that a shared cache
//! may be trusted with.
//!
//! [`StampedeLayer`] wraps a service (an axum `Router`, a hyper client, any
//! `Service<http::Request<B>>`) so that cacheable `GET` responses are shared through a
//! [`Cache`](crate::Cache): when a thousand requests for one cold URL arrive across many
//! processes, the inner service is called once and everyone else is answered from the cache.
//! What may be shared follows the shared-cache rules of RFC 9111 (a subset, below); keys and
//! the storing rules can be replaced in code ([`MakeKey`], [`Policy`]).
//!
//! The rules in full, with the RFC sections they follow, are in [the HTTP guide](crate::guide::http)
//! (`docs/http.md`): the `Cache-Status` and `x-cache` each outcome carries, what is cached and
//! why, under which key ([`DefaultKey`], [`OriginKey`] for a reverse proxy with one origin,
//! [`SiteKey`] for instances that each see their own `Host`), why a request passes, how
//! unsafe methods, tags and purges invalidate (the [`Purger`]), and what is left out of RFC
//! 9111. Where the layer is stricter than RFC 9111 is in the README: those are promises.
//!
//! # Backpressure
//!
//! [`Stampede`] is always ready: hits and waiting followers never hold the inner service's
//! readiness; see [its docs](Stampede#backpressure) for where a concurrency limit goes.
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
//!         Response::builder()
//!             .header("cache-control", "max-age=60")
//!             .body(Full::new(Bytes::from("hello")))
//!     }));
//!
//! let first = service.ready().await?.call(Request::get("http://example.com/").body(())?).await?;
//! assert_eq!(first.headers()["x-cache"], "MISS");
//! let second = service.ready().await?.call(Request::get("http://example.com/").body(())?).await?;
//! assert_eq!(second.headers()["x-cache"], "HIT");
//! assert!(second.headers().contains_key("age"), "seconds since it was stored");
//! assert_eq!(second.into_body().collect().await?.to_bytes(), "hello");
//!
//! // A HEAD is answered from the GET entry, without the body.
//! let head = service.ready().await?.call(Request::head("http://example.com/").body(())?).await?;
//! assert_eq!(head.headers()["x-cache"], "HIT");
//! assert!(head.into_body().collect().await?.to_bytes().is_empty());
//! # Ok(()) }
//! ```

// | folder | holds |
// | --- | --- |
// | `middleware/` | the tower shell: layer, service, future, body |
// | `rules/` | what may be stored and answered: request rules, the policy, the fields they read |
// | `stored/` | the entries the layer stores (codec) and their keys |
// | `serving/` | a cacheable request's path, its load, and the responses it is answered with |
// | `invalidation/` | unsafe methods, purges by URL and by tag |

mod invalidation;
mod middleware;
mod rules;
mod serving;
mod stored;

pub use invalidation::Purger;
pub use middleware::{ResponseFuture, Stampede, StampedeLayer};
pub use rules::{Decision, Policy, RfcPolicy, Staleness};
pub use serving::body::ResponseBody;
pub use stored::{DefaultKey, MakeKey, OriginKey, SiteKey};
