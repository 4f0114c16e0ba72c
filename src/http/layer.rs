//! The layer: configuration only, and the settings it shares with every service it makes.

use std::sync::Arc;

use tower::Layer;

use super::{DefaultKey, MakeKey, Policy, RfcPolicy, Stampede};
use crate::cache::Cache;

/// Wraps services in a [`Stampede`] guard over one [`Cache`]; see the [module docs](super).
///
/// Every service the layer makes shares the cache (and so its L1, flights and store).
#[derive(Clone, Debug)]
#[must_use]
pub struct StampedeLayer {
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl StampedeLayer {
    /// A layer that caches through `cache`, with the [`DefaultKey`] and
    /// the [`RfcPolicy`] without a default TTL.
    pub fn new(cache: Cache) -> Self {
        StampedeLayer {
            cache,
            config: Arc::new(HttpConfig::default()),
        }
    }

    /// The largest response body that is stored, in bytes; larger ones stream through to
    /// their caller intact and are not stored. Default: 1 MiB.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body_bytes = limit;
        self
    }

    /// How requests are keyed. Default: [`DefaultKey`] (method, scheme,
    /// authority and path with query).
    ///
    /// Two requests that must not share a response must not share a key. When responses
    /// depend on a request header the origin does not name in `Vary` (a tenant, a locale),
    /// add it to the key; a request the key cannot describe may bypass the cache:
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{request::Parts, Request, Response};
    /// use http_body_util::{BodyExt, Full};
    /// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
    /// use tower_stampede::http::DefaultKey;
    /// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// /// The default key, then the tenant; requests without a tenant bypass the cache.
    /// fn by_tenant(request: &Parts) -> Option<String> {
    ///     let tenant = request.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("{}\0tenant={tenant}", DefaultKey.key(request)))
    /// }
    ///
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let mut service = ServiceBuilder::new()
    ///     .layer(StampedeLayer::new(cache).make_key(by_tenant))
    ///     .service(service_fn(|request: Request<()>| async move {
    ///         let tenant = request.headers()["x-tenant"].to_str().unwrap_or("").to_owned();
    ///         let mut response = Response::new(Full::new(Bytes::from(tenant)));
    ///         response.headers_mut().insert("cache-control", "max-age=60".parse()?);
    ///         Ok::<_, http::Error>(response)
    ///     }));
    ///
    /// for (tenant, mark) in [("a", "MISS"), ("b", "MISS"), ("a", "HIT")] {
    ///     let request = Request::get("http://example.com/").header("x-tenant", tenant).body(())?;
    ///     let response = service.ready().await?.call(request).await?;
    ///     assert_eq!(response.headers()["x-cache"], mark);
    ///     assert_eq!(response.into_body().collect().await?.to_bytes(), tenant);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn make_key(mut self, make_key: impl MakeKey) -> Self {
        Arc::make_mut(&mut self.config).make_key = Arc::new(make_key);
        self
    }

    /// What is stored, and for how long. Default: [`RfcPolicy::new()`](super::RfcPolicy),
    /// which stores only responses with explicit freshness; give it a
    /// [`default_ttl`](super::RfcPolicy::default_ttl) to store the others with a cacheable
    /// status too. A policy of one's own may start from the RFC's decision:
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{request, response, StatusCode};
    /// use tower_stampede::http::{Decision, Policy, RfcPolicy};
    /// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    ///
    /// let rfc = RfcPolicy::new().default_ttl(Duration::from_secs(30));
    /// // Also keep temporary redirects for 5 s, whatever they say.
    /// let policy = move |request: &request::Parts, response: &response::Parts| {
    ///     match response.status {
    ///         StatusCode::FOUND => Decision::Store(Duration::from_secs(5)),
    ///         _ => rfc.decide(request, response),
    ///     }
    /// };
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let layer = StampedeLayer::new(cache).policy(policy);
    /// ```
    pub fn policy(mut self, policy: impl Policy) -> Self {
        Arc::make_mut(&mut self.config).policy = Arc::new(policy);
        self
    }

    /// Whether a client's `Cache-Control: no-cache` or `max-age=0` (or `Pragma: no-cache`
    /// without `Cache-Control`) sends its request to the inner service, marked `BYPASS`, and
    /// leaves the cache as it is. Off by default, as shared caches usually ignore them: a
    /// reload button must not let one client make every request reach the backend. When on,
    /// each such request is one call to the inner service, not coalesced with others and not
    /// stored (so a stampede of them is not held back).
    pub fn honor_client_no_cache(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.config).honor_client_no_cache = on;
        self
    }
}

impl<S> Layer<S> for StampedeLayer {
    type Service = Stampede<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Stampede::new(inner, self.cache.clone(), Arc::clone(&self.config))
    }
}

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct HttpConfig {
    pub(crate) max_body_bytes: usize,
    pub(crate) make_key: Arc<dyn MakeKey>,
    pub(crate) policy: Arc<dyn Policy>,
    pub(crate) honor_client_no_cache: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 1024 * 1024,
            make_key: Arc::new(DefaultKey),
            policy: Arc::new(RfcPolicy::new()),
            honor_client_no_cache: false,
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("honor_client_no_cache", &self.honor_client_no_cache)
            .finish_non_exhaustive()
    }
}
