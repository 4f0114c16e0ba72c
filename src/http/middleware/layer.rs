//! The layer: configuration only; the settings it shares with every service it makes are
//! an [`HttpConfig`].

use std::sync::Arc;
use std::time::Duration;

use http::request;
use tower::Layer;

use super::service::Stampede;
use crate::cache::Cache;
use crate::http::invalidation::bounded::Invalidations;
use crate::http::invalidation::purge::Purger;
use crate::http::rules::field_name::field_name;
use crate::http::rules::policy::Policy;
use crate::http::serving::config::{HttpConfig, UnsafeInvalidation};
use crate::http::serving::passes::Passes;
use crate::http::stored::key::MakeKey;

/// Wraps services in a [`Stampede`] guard over one [`Cache`]; see the [module docs](crate::http).
///
/// Every service the layer makes shares the cache (and so its L1, flights and store).
#[derive(Clone, Debug)]
#[must_use]
pub struct StampedeLayer {
    cache: Cache,
    config: Arc<HttpConfig>,
}

impl StampedeLayer {
    /// A layer that caches through `cache`, with the [`DefaultKey`](crate::http::DefaultKey) and
    /// the [`RfcPolicy`](crate::http::RfcPolicy) without a default TTL.
    pub fn new(cache: Cache) -> Self {
        let mut config = HttpConfig::default();
        config.cache_status = config.cache_status.reporting(Passes::new(cache.meter()));
        StampedeLayer {
            cache,
            config: Arc::new(config),
        }
    }

    /// The largest response body that is stored, in bytes; larger ones stream through to
    /// their caller intact and are not stored (but are still shared with the requests of this
    /// process that waited for their load: see [`max_relay_bytes`](Self::max_relay_bytes)).
    /// Default: 1 MiB.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body_bytes = limit;
        self
    }

    /// The largest body over [`max_body_bytes`](Self::max_body_bytes) that is relayed: read
    /// once from the origin, streamed to the request that loaded it, and kept in memory until
    /// it is complete for the requests of this process that waited for that load (in other
    /// processes, the first waiter loads it once for the others). A waiter gets its response
    /// once the whole body is in, and reads it at its own pace; a slow client holds up
    /// nobody. A larger body (by its `Content-Length`, or once this much was read), one that
    /// fails or ends with trailers sends the waiters to the origin, each for itself, before
    /// their response starts; the loading request's body then streams on with at most 256
    /// KiB read ahead of it. So each such load holds at most this much memory. 0 relays
    /// nothing. Default: 16 MiB.
    pub fn max_relay_bytes(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config).max_relay_bytes = limit;
        self
    }

    /// The most bytes a stored response's header fields may take (each counted as its name,
    /// its value and 4 bytes for `: ` and the line's end); a response with more streams
    /// through to its caller and is not stored, so that one response cannot make every hit
    /// send a huge header block (or fill the store with one). Default: 32 KiB, the
    /// total Varnish allows.
    pub fn max_header_bytes(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config).max_header_bytes = limit;
        self
    }

    /// A request header your own load balancer or proxy sets on every request, replacing
    /// whatever a client sent, such as `X-Forwarded-Proto`: it is left out of the key (its
    /// value is ignored), so requests with any value of it share one entry. Give one call per
    /// header.
    ///
    /// By default a `GET` or `HEAD` that carries a well-known forwarding or rewrite header
    /// (`X-Forwarded-Host`, `X-Host`, `X-Forwarded-Proto`, `X-Forwarded-Scheme`,
    /// `X-Forwarded-Ssl`, `X-Forwarded-Port`, `X-Forwarded-Prefix`, `Forwarded`,
    /// `X-Original-URL`, `X-Rewrite-URL`) is keyed by its values (see the
    /// [HTTP guide](crate::guide::http#what-is-cached-and-why)): frameworks reflect these in the page (links to
    /// `http://evil.example/`, the `/admin` page under another URL), so an attacker's value
    /// makes a variant that only requests with that value read, while your load balancer's
    /// values make one entry. Trusting a header saves the variants it would make, and is
    /// right only for a header the load balancer overwrites; one it appends to (`Forwarded`,
    /// often) still carries what the client sent. A method override (`X-HTTP-Method-Override`,
    /// `X-HTTP-Method`, `X-Method-Override`) or a body passes, and so does any of these
    /// headers spelled with underscores, trusted or not; a trusted method override no longer
    /// passes.
    ///
    /// It takes a [`HeaderName`](http::HeaderName), as [`pass_header`](Self::pass_header)
    /// does, so a name that is not a header field name is refused where it is made:
    /// `HeaderName::try_from(text)` is the error (`invalid HTTP header name`), and a literal is
    /// checked by `HeaderName::from_static`. Other setters that take a field name
    /// (`tag_headers`, `RfcPolicy::targeted_field`) take text, in any ASCII case, and ignore
    /// one that is not a field name with an error logged (no request can carry it).
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    ///
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let layer = StampedeLayer::new(cache)
    ///     .trust_header(HeaderName::from_static("x-forwarded-proto"))
    ///     .pass_header(HeaderName::from_static("x-theme"));
    /// assert!(HeaderName::try_from("not a field name").is_err());
    /// ```
    pub fn trust_header(mut self, name: http::HeaderName) -> Self {
        Arc::make_mut(&mut self.config).reflected.trust(&name);
        self
    }

    /// A request header your application reflects in its responses without naming it in
    /// `Vary` (a theme, a debug switch, a header of its own framework): `GET`s and `HEAD`s
    /// that carry it pass (neither stored nor answered from the cache; `Cache-Status` says
    /// `detail=pass-header:x-theme`), as those with a method override do (see
    /// [`trust_header`](Self::trust_header)); a forwarding header named so passes instead of
    /// being keyed. To cache such requests per value instead, add the header to the key
    /// ([`make_key`](Self::make_key)). Give one call per header. A
    /// [`HeaderName`](http::HeaderName), so an invalid name is refused where it is made (see
    /// [`trust_header`](Self::trust_header)).
    pub fn pass_header(mut self, name: http::HeaderName) -> Self {
        Arc::make_mut(&mut self.config).reflected.pass(name);
        self
    }

    /// How requests are keyed. Default: [`DefaultKey`](crate::http::DefaultKey) (method, scheme,
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

    /// What is stored, and for how long. Default: [`RfcPolicy::new()`](crate::http::RfcPolicy),
    /// which stores only responses with explicit freshness; give it a
    /// [`default_ttl`](crate::http::RfcPolicy::default_ttl) to store the others with a cacheable
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
        Arc::make_mut(&mut self.config).set_policy(policy);
        self
    }

    /// The longest stale window a response may give itself with `stale-while-revalidate=N`
    /// or `stale-if-error=N` (RFC 5861): longer ones are cut to it. A response that says
    /// nothing has the cache's [`stale`](crate::CacheBuilder::stale) windows. No window
    /// outlasts how long the cache keeps values past their freshness, so a response's windows
    /// need the cache to keep values (its `stale`, `stale_if_error` or
    /// [`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation)). Default: 1 hour.
    pub fn max_response_stale(mut self, max: std::time::Duration) -> Self {
        Arc::make_mut(&mut self.config).max_response_stale = max;
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

    /// The cache's name in the `Cache-Status` field (RFC 9211) of every response the layer
    /// handles (`tower-stampede; hit`): one name per cache in a chain, so that a response that
    /// went through several says which did what. Written as a Structured Field Token if it is
    /// one, else as a String (of its printable ASCII characters). Default: `tower-stampede`.
    pub fn cache_status_name(mut self, name: impl AsRef<str>) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.cache_status = config.cache_status.renamed(name.as_ref());
        self
    }

    /// Whether responses the layer handles also carry `x-cache` (`HIT`, `MISS`, `STALE`,
    /// `BYPASS`), the field of this crate's first versions and of many caches before RFC 9211,
    /// beside `Cache-Status`. Default: on, for existing users; off leaves `Cache-Status` alone.
    pub fn x_cache(mut self, on: bool) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.cache_status = config.cache_status.clone().with_x_cache(on);
        self
    }

    /// The response header fields that tag a stored response: each holds tags separated by
    /// spaces or commas, and [`Purger::purge_tags`] (or a `PURGE` with such a field, see
    /// [`purge`](Self::purge)) of any of them removes the response everywhere. Default:
    /// `Surrogate-Key` (space-separated, as Fastly and Varnish xkey write it) and `Cache-Tag`
    /// (comma-separated, as Cloudflare does); none turns tags off.
    ///
    /// A response may carry at most 128 distinct tags of at most 256 bytes each; one with
    /// more, or longer, is passed through and not stored (a purge could not reach it).
    pub fn tag_headers(mut self, names: impl IntoIterator<Item: AsRef<str>>) -> Self {
        Arc::make_mut(&mut self.config).tag_headers = names
            .into_iter()
            .filter_map(|name| field_name("tag_headers", name.as_ref()))
            .collect();
        self
    }

    /// Whether the [tag header fields](Self::tag_headers) stay in the responses sent
    /// to clients (and in the stored responses they come from). Default: off, so tags, which
    /// often name internal things (tables, users, templates), stay between the origin and
    /// the layer; on, for a cache further down that reads them too.
    pub fn keep_tag_headers(mut self, keep: bool) -> Self {
        Arc::make_mut(&mut self.config).keep_tag_headers = keep;
        self
    }

    /// Turns on the purge endpoint, for the requests `authorize` allows: a `PURGE` of a URL
    /// removes its stored responses (every `Vary` variant, with and without
    /// credentials), and a `PURGE` with a [tag header field](Self::tag_headers)
    /// (`Surrogate-Key: t1 t2`) removes every response carrying one of those tags instead, in
    /// every process that shares the store. Off by default: then a `PURGE` goes to the inner
    /// service like any other unsafe method.
    ///
    /// The layer answers every `PURGE` itself (the inner service never sees one): `403
    /// Forbidden` if `authorize` says no (nothing is removed), `200 OK` once removed, `400 Bad
    /// Request` for a tag field with no tag or more than a response may carry, and `503
    /// Service Unavailable` if the store could not be reached (other processes may still hold
    /// the responses; this one's memory has forgotten them). The layer's own answers say so
    /// in their body.
    ///
    /// `authorize` sees the request's head (method, URI, headers, extensions): check a token
    /// in constant time, a client certificate an outer layer put in the extensions, or the
    /// peer's address.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{request::Parts, Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
    /// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// // Only requests from this host's own network (an outer layer put the peer in the
    /// // extensions, as axum's `ConnectInfo` does).
    /// #[derive(Clone, Copy)]
    /// struct Peer(std::net::IpAddr);
    /// fn from_loopback(request: &Parts) -> bool {
    ///     request.extensions.get::<Peer>().is_some_and(|peer| peer.0.is_loopback())
    /// }
    ///
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let mut service = ServiceBuilder::new()
    ///     .layer(StampedeLayer::new(cache).purge(from_loopback))
    ///     .service(service_fn(|_req: Request<()>| async {
    ///         Ok::<_, http::Error>(Response::new(Full::new(Bytes::from("hello"))))
    ///     }));
    ///
    /// let purge = Request::builder().method("PURGE").uri("http://example.com/").body(())?;
    /// let refused = service.ready().await?.call(purge).await?;
    /// assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    ///
    /// let mut purge = Request::builder().method("PURGE").uri("http://example.com/").body(())?;
    /// purge.extensions_mut().insert(Peer([127, 0, 0, 1].into()));
    /// let purged = service.ready().await?.call(purge).await?;
    /// assert_eq!(purged.status(), StatusCode::OK);
    /// # Ok(()) }
    /// ```
    pub fn purge(
        mut self,
        authorize: impl Fn(&request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).purge = Some(Arc::new(authorize));
        self
    }

    /// Whether a non-error response to an unsafe method (`POST`, `PUT`, `DELETE`, ...)
    /// invalidates the stored responses of its URL (RFC 9111 §4.4; see the
    /// [HTTP guide](crate::guide::http#invalidation-over-http)). Default: on. Off, unsafe requests go to the inner
    /// service and cost the store nothing: for services where a `POST` changes no page
    /// the layer stores (gRPC, GraphQL, JSON-RPC); see also
    /// [`invalidate_on_unsafe_if`](Self::invalidate_on_unsafe_if).
    pub fn invalidate_on_unsafe(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.config).unsafe_invalidation = if on {
            UnsafeInvalidation::Always
        } else {
            UnsafeInvalidation::Never
        };
        self
    }

    /// The least time between two invalidations of one URL by unsafe requests, in each
    /// process. The first unsafe request of a URL invalidates it at once (its client reads its
    /// change next); those that come within `interval` after it are coalesced into one more
    /// invalidation at the interval's end, so the last change is read at most `interval`
    /// late, and no client, signed in or not, can empty a hot page more than once an
    /// interval per process, however many `POST`s it sends: a flood of them costs the origin
    /// at most one reload of the page per interval per process. Each unsafe response says
    /// which it got in `Cache-Status` (`detail=invalidated`, `detail=invalidation-coalesced`).
    /// `Duration::ZERO` invalidates on every unsafe request (RFC 9111 §4.4 to the letter).
    /// Default: 1 s.
    pub fn invalidation_interval(mut self, interval: Duration) -> Self {
        Arc::make_mut(&mut self.config).invalidations = Invalidations::new(interval);
        self
    }

    /// Invalidates after the unsafe requests that `invalidates` says change what the layer
    /// stores, and only those (RFC 9111 §4.4 for them); the others go to the inner service
    /// and cost the store nothing. For an app that serves pages and an API of `POST`s (a
    /// GraphQL endpoint) under one layer:
    ///
    /// ```
    /// use http::request::Parts;
    /// use tower_stampede::{store::MemoryStore, Cache, StampedeLayer};
    ///
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let layer = StampedeLayer::new(cache)
    ///     .invalidate_on_unsafe_if(|request: &Parts| request.uri.path() != "/graphql");
    /// ```
    pub fn invalidate_on_unsafe_if(
        mut self,
        invalidates: impl Fn(&request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).unsafe_invalidation =
            UnsafeInvalidation::If(Arc::new(invalidates));
        self
    }

    /// A handle that purges stored responses by URL or by tag from application code, in
    /// every process that shares the store; see [`Purger`]. It keys URLs as this layer does
    /// now: take it once the layer is configured.
    pub fn purger(&self) -> Purger {
        Purger::new(self.cache.clone(), Arc::clone(&self.config))
    }
}

impl<S> Layer<S> for StampedeLayer {
    type Service = Stampede<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Stampede::new(inner, self.cache.clone(), Arc::clone(&self.config))
    }
}
