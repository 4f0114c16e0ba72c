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
//! Every response the layer handles carries a `Cache-Status` member (RFC 9211) under the
//! layer's name ([`cache_status_name`](StampedeLayer::cache_status_name), `tower-stampede` by
//! default), after any `Cache-Status` the origin sent (§2: the cache closest to the origin
//! comes first), and, unless [`x_cache(false)`](StampedeLayer::x_cache), the older `x-cache`:
//!
//! | `Cache-Status` | `x-cache` | meaning |
//! | --- | --- | --- |
//! | `hit; ttl=42` | `HIT` | from a fresh entry (L1 or the shared store), fresh for 42 more seconds (RFC 9211 §2.4) |
//! | `fwd=uri-miss; fwd-status=200; collapsed` | `MISS` | another request's load answered this one (here or in another process): a miss collapsed onto it (RFC 9211 §3) |
//! | `fwd=stale; fwd-status=304; collapsed` | `MISS` | another request's revalidation of the stale entry answered this one (here or in another process): the origin answered `304` (`fwd-status=200`, or a server error's status, when it sent a new response) |
//! | `fwd=uri-miss; fwd-status=200; stored; ttl=60` | `MISS` | this request's own load, stored for that long (without `stored` if it was not: a server error) |
//! | `fwd=stale; fwd-status=304; stored; ttl=60` | `MISS` | this request's own load revalidated a stale entry: the origin answered `304`, and the entry, its header fields updated, is fresh again for that long |
//! | `fwd=stale; fwd-status=200; stored; ttl=60` | `MISS` | this request's own load revalidated a stale entry, and the origin sent a new response, stored for that long (without `stored` if it was not: a server error) |
//! | `hit; ttl=-3; detail=stale` | `STALE` | a stale response (stale for 3 seconds: a negative `ttl`), served while a request refreshes it, or in place of a failed refresh (see [`stale`](crate::CacheBuilder::stale)) |
//! | `fwd=uri-miss; fwd-status=200; detail=no-freshness` | `BYPASS` | passed to the inner service: the response may not be stored, for the rule `detail` names ([below](#why-a-request-passes)) |
//! | `fwd=request; fwd-status=206; detail=range` | `BYPASS` | passed to the inner service: the request's own directives keep the cache out (`no-store`, a range, a precondition, an honoured reload: `detail`) |
//! | `fwd=bypass; fwd-status=200; detail=credentials` | `BYPASS` | passed to the inner service: the layer is configured not to handle the request (RFC 9211 §2.2): credentials the response does not share, a method override, a body, a `pass_header`, a `_` spelling, no key (`detail`) |
//! | `fwd=method; fwd-status=200; detail=invalidated` | `BYPASS` | an unsafe method, sent to the inner service, which invalidated the URL now (`invalidation-coalesced`: at its interval's end; `unsafe-method`: not at all, below) |
//! | `fwd=uri-miss; detail=no-origin-response` or `detail=timeout` | `MISS` | a `502` or `504` the layer made itself: the load got no answer from the origin (the inner service failed, its body failed), or timed out |
//!
//! `x-cache` tells what `Cache-Status` does: `HIT` and `STALE` from the cache, `MISS` forwarded
//! (by this request's load or the one it was collapsed onto), `BYPASS` where a `detail` names
//! the rule that kept the cache out. `ttl` is given on the response whose load stored it; the
//! fixed values are made once, so a hit pays for no formatting. `OPTIONS`, `TRACE` and
//! `CONNECT` pass through without either field; unsafe methods invalidate their URL (below).
//! Every response from a cache entry carries `Age`.
//!
//! # What is cached
//!
//! | request or response | cached? | why |
//! | --- | --- | --- |
//! | `GET` | yes | the method caches are for |
//! | `HEAD` | from the `GET` entry, without a body | a `HEAD` miss loads with a `GET` (as nginx and Varnish do), so `HEAD`s are coalesced and fill the entry for `GET`s |
//! | `OPTIONS`, `TRACE`, `CONNECT` | no, untouched | not cacheable |
//! | `POST`, `PUT`, `DELETE`, `PATCH`, any other method | no; a 2xx or 3xx response invalidates the URL, unless [turned off](StampedeLayer::invalidate_on_unsafe) | unsafe: RFC 9111 §4.4 (below) |
//! | request `Cache-Control: no-store` | no (`BYPASS`) | the client asks that nothing be stored |
//! | request `no-cache`, `max-age=0`, `Pragma: no-cache` | ignored by default; `BYPASS` with [`honor_client_no_cache`](StampedeLayer::honor_client_no_cache) | one client's reload must not reach the backend for everyone |
//! | request with `Range`, `If-Match`, `If-Unmodified-Since`, `If-Range` | no (`BYPASS`) | a 206 or 412 for this request only |
//! | `GET` or `HEAD` with a forwarding or rewrite header (`X-Forwarded-Host`, `X-Forwarded-Proto`, `X-Forwarded-Port`, `Forwarded`, `X-Original-URL`, ...) | yes, keyed by the values of those headers (`Forwarded` without its `for=` and `by=`), as if the response varied on them: a load balancer's values make one entry, an attacker's a variant only that value reads; at most 16 sets of values per URL stored in each process, those most requests carry (a set without a place is still coalesced, not stored: `detail=too-many-variants`); left out of the key if your load balancer overwrites it ([`trust_header`](StampedeLayer::trust_header)) | cache poisoning: the origin builds links and routes from them (see [Keys](#keys)); `X-Forwarded-For`, `X-Real-IP` and `for=` differ per client and are never keyed |
//! | `GET` or `HEAD` with a method override (`X-HTTP-Method-Override`, ...), a body, a forwarding header spelled with `_` (`X_Forwarded_Host`) or a [`pass_header`](StampedeLayer::pass_header) | no (`BYPASS`, `detail=method-override`, `body`, `forwarding-header:x_forwarded_host`, `pass-header:x-theme`); an override naming an unsafe method invalidates the URL as that method does | cache poisoning: the origin may answer from what the key leaves out; a load balancer overwrites no `_` spelling |
//! | request with `If-None-Match` / `If-Modified-Since` | yes | answered `304` from an entry with a matching `ETag` / `Last-Modified` |
//! | request with `Authorization` | only if the response says `public`, `s-maxage` or `must-revalidate`, with explicit freshness, or with [`share_authorized`](RfcPolicy::share_authorized); keyed apart from requests without credentials | RFC 9111 §3.5; credentials never decide what anonymous requests get |
//! | request with `Cookie` | as with `Authorization`, or per cookie value if the response has `Vary: Cookie`; the [analytics cookies](RfcPolicy::ignore_analytics_cookies) (`_ga`, `_gid`, `_fbp`, ...) and those the policy [ignores](RfcPolicy::ignore_cookie) (or [all](RfcPolicy::ignore_all_cookies)) do not count | a cookie usually names a user: stricter than RFC 9111, as Varnish is; scripts in the browser read analytics cookies, no page depends on them |
//! | [`MakeKey`] returns `None` | no (`BYPASS`) | the key cannot describe the request |
//! | response 200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501 | with explicit freshness, or with a [`default_ttl`](RfcPolicy::default_ttl) | cacheable by default, but a cache that invents freshness must be told to |
//! | a response that may be shared but declares no freshness (a status cacheable by default, no explicit freshness nor default TTL, not `no-store`, `private`, `no-cache`, `Set-Cookie`, `Vary: *`; a request without credentials) | not stored; handed to the requests that waited for its load, in every process, each only if it matches the loading request in every field `Vary` names: one origin load per burst ([`Policy::shares_with_waiters`]) | RFC 9111 §4: a cache may use a storable response to satisfy several requests (request collapsing), with heuristic freshness (§4.2.2) |
//! | other statuses (but 206, 304, 1xx) | only with explicit freshness | RFC 9111 §3 |
//! | response 5xx (but 501) without explicit freshness | no; the origin's own response goes to the request that loaded it and to every request that waited for that load, in every process; a later request goes to the origin again (one load at a time) | the origin's answer, not one the layer makes up; a stale response may stand in for it (see [`stale_if_error`](crate::CacheBuilder::stale_if_error)); one private to its request (`no-store`, `private`, `Set-Cookie`) goes to that request only, its waiters get a stale response or the layer's `502` |
//! | response `CDN-Cache-Control`, or a [`targeted_field`](RfcPolicy::targeted_field) of the operator's own | its directives decide for this cache, `Cache-Control` and `Expires` ignored; an invalid or empty one is ignored itself; forwarded downstream unchanged | RFC 9213 §2.1, §2.2 |
//! | response `no-store`, `private`, `Set-Cookie` | no (`BYPASS`) | private to one client |
//! | response `no-cache` (`no-cache="f"` read as plain `no-cache`) | with an `ETag` or `Last-Modified`, where the cache [keeps values](crate::CacheBuilder::keep_for_revalidation): stored fresh for 0, revalidated before each use; otherwise no (`BYPASS`) | RFC 9111 §5.2.2.4; without a validator nothing could revalidate it |
//! | a stale entry the cache still keeps | reloaded with a conditional request (`If-None-Match` / `If-Modified-Since`), one per stampede; a `304` updates the stored fields and freshness, and the stored body is served; a server error without explicit freshness goes to the requests that waited for that reload and leaves the entry kept, so the next request revalidates it again | RFC 9111 §4.3.1, §4.3.4 |
//! | response `must-revalidate`, `proxy-revalidate`, `s-maxage` | never served stale | RFC 9111 §4.2.4, §5.2.2.2, §5.2.2.8, §5.2.2.10 |
//! | response `stale-while-revalidate=N`, `stale-if-error=N` | its own stale windows, at most [`max_response_stale`](StampedeLayer::max_response_stale) | RFC 5861 §3, §4 |
//! | response `immutable` | nothing changes | RFC 8246: this cache never revalidates a fresh response anyway |
//! | response `Vary: *`, or `Vary` naming more than 16 fields, or unreadable | no (`BYPASS`) | no later request can be matched to it |
//! | response `Vary: a, b` | yes, per variant | keyed by the request's `a` and `b`, below |
//! | body over [`max_body_bytes`](StampedeLayer::max_body_bytes) | no (`BYPASS`); relayed to the requests of its process that waited for its load, if it may be shared, up to [`max_relay_bytes`](StampedeLayer::max_relay_bytes) | streamed through intact; nothing partial is stored or sent to a waiter; one origin load per process per burst |
//! | body with trailers, or failing | no (`BYPASS`) | streamed through intact; nothing partial is stored |
//! | header fields over [`max_header_bytes`](StampedeLayer::max_header_bytes) (32 KiB) | no (`BYPASS`) | streamed through intact; no hit sends a huge header block |
//!
//! Freshness comes from `s-maxage`, then `max-age` (of the targeted field when there is one),
//! then `Expires` less `Date`, then the policy's default TTL, less the `Age` the response
//! arrived with; a freshness of 0 is not stored. An `Expires` that is not a date (`0`), or
//! several that disagree, is in the past (RFC 9111 §5.3, §4.2.1); of several `Age` values the
//! first counts, and one that is not a number is ignored (§5.1). Status, headers and body are
//! stored byte for byte, but for hop-by-hop headers (and those `Connection` names), `Age`
//! (recomputed when served) and `x-cache`.
//!
//! A response that is not cacheable streams to the request that loaded it untouched (a body
//! over the limit is replayed from what was read, then streamed on), and a short "pass"
//! marker sends the requests waiting for it to the inner service directly, but for what may
//! be shared: see the rows above on responses without freshness and on bodies over the limit.
//!
//! # Keys
//!
//! [`MakeKey`] names a request's URL: [`DefaultKey`] (method, scheme, authority or `Host`,
//! path and query) unless replaced with [`StampedeLayer::make_key`], which shows how to add a
//! tenant or a locale; a reverse proxy with one origin keys by the origin's URL with
//! [`OriginKey`]; instances of one site that each see their own `Host` share one cache with
//! a [`SiteKey`] ([`DefaultKey::authority`], [`DefaultKey::aliases`]). A response with `Vary` is stored under a variant key: the URL's key and
//! the request's values of each field `Vary` names (names lowercase; each field line trimmed,
//! lines joined by `,`; absent and empty fields differ), so `Accept-Encoding: gzip` and
//! `identity` never get each other's body. The URL's key then holds a small vary marker with
//! the field names: a hit is two lookups (each an L1 hit or one store round trip), and a miss
//! loads once for both keys, one flight per key as for any other.
//!
//! Requests with credentials (`Authorization`, or a cookie the policy does not ignore) are
//! keyed apart from those without: a page stored for anonymous requests never answers a
//! signed-in user (it would show them signed out), nor the other way round.
//!
//! Requests with forwarding headers (`X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded`,
//! ...; those not [trusted](StampedeLayer::trust_header)) are keyed apart too, and by the
//! values of every such header, as if the response had named them all in `Vary` (the URL's
//! forwarded key holds a vary marker naming them): a load balancer that sets the same values
//! on every request makes one entry, cached and coalesced, while an attacker's
//! `X-Forwarded-Host: evil.example` makes a variant that only requests with that very value
//! read. What names the client (`X-Forwarded-For`, `X-Real-IP`, and the `for=` and `by=` of
//! `Forwarded`) is no part of the key, or each client would be a variant of its own. Each
//! process stores at most 16 sets of forwarding values per URL, chosen by use: a set takes the
//! place of the least used only once more requests carried it, so an attacker's values never
//! push out the set most requests carry; a request whose set has no place is looked up and
//! coalesced as any other, and its load stores nothing (`detail=too-many-variants`).
//! Invalidation and purges reach every such variant.
//!
//! Keys are hashed before they reach the store: a 64 KB URL or a thousand header values never
//! make a long store key.
//!
//! # Why a request passes
//!
//! Every pass says why, three ways: its `Cache-Status` ends with `detail=` naming the rule
//! (an RFC 8941 Token, RFC 9211 §2.8), the metric `stampede_http_passes_total` (with the
//! `metrics` feature) counts it under that `reason` (without the header), and a `WARN` names
//! the rule and the header, at most once a minute per rule per layer.
//!
//! | `detail` | rule |
//! | --- | --- |
//! | `credentials` | the request had `Authorization` or a cookie that counts, and the response does not say it may be shared |
//! | `private`, `no-store`, `set-cookie` | the response is private to its request |
//! | `no-cache` | `no-cache` without a validator, or where the cache keeps no values to revalidate |
//! | `no-freshness` | no explicit freshness (and no [`default_ttl`](RfcPolicy::default_ttl) for it), or a freshness of 0 |
//! | `status` | a `206`, `304` or informational response |
//! | `vary-star` | `Vary: *`, or a `Vary` the layer cannot key |
//! | `too-large`, `headers-too-large`, `trailers`, `body-error` | a body over [`max_body_bytes`](StampedeLayer::max_body_bytes), header fields over [`max_header_bytes`](StampedeLayer::max_header_bytes), a body with trailers, a body that failed |
//! | `relay-full` | a body over [`max_relay_bytes`](StampedeLayer::max_relay_bytes): the requests that waited for its load could not be handed it |
//! | `too-many-tags`, `not-encodable` | more tags than a stored response may carry; a response the layer cannot encode |
//! | `uncacheable` | another request's load of the URL, in another process, was not stored for a reason this request's response does not show, and the policy would store this one: a "pass" marker sent it on (a waiter of a load in its own process says that load's rule) |
//! | `policy` | a [`Policy`] of your own passed the response |
//! | `method-override`, `body` | a `GET` or `HEAD` with a method override, or a body |
//! | `forwarding-header:x_forwarded_host` | a forwarding header spelled with `_` |
//! | `pass-header:x-theme` | a header named with [`pass_header`](StampedeLayer::pass_header) |
//! | `too-many-variants` | the request's set of forwarding values has no place among the URL's 16 (per process) yet: its load went to its waiters, not stored |
//! | `no-store-request`, `client-no-cache`, `range`, `precondition` | the request's `no-store`, a reload the layer [honours](StampedeLayer::honor_client_no_cache), a `Range`, an `If-Match` / `If-Unmodified-Since` / `If-Range` |
//! | `no-key` | the [`MakeKey`] cannot describe the request |
//!
//! # Invalidation
//!
//! A response that is not an error (2xx, 3xx) to an unsafe method (anything but `GET`,
//! `HEAD`, `OPTIONS`, `TRACE` and `CONNECT`) invalidates the stored responses of its URL
//! before it is sent on (RFC 9111 §4.4), so the client that changed a resource reads the
//! change next: those under the key a `GET` of that URL (with the request's headers) would
//! have, with and without credentials and forwarding headers, every `Vary` and forwarding
//! variant included, and likewise for
//! the URLs in its `Location` and `Content-Location` when they are of the same origin
//! (relative, or the same scheme and authority). All of them go in one store call (one
//! round trip on Redis; on a Redis Cluster, one per slot, all at once). The invalidation
//! reaches every process that shares the store, and a load of the URL in progress anywhere
//! cannot store its (older) response afterwards (see
//! [`Cache::invalidate`](crate::Cache::invalidate)). If the store cannot be reached, a
//! warning is logged and the response is sent on unchanged. Where unsafe requests change no
//! stored page (gRPC, GraphQL, JSON-RPC: every call a `POST`), turn it off with
//! [`invalidate_on_unsafe(false)`](StampedeLayer::invalidate_on_unsafe), or pick the
//! requests that invalidate with
//! [`invalidate_on_unsafe_if`](StampedeLayer::invalidate_on_unsafe_if): the others cost the
//! store nothing.
//!
//! Invalidation by unsafe requests is bounded, so that no client can empty a hot page at will:
//! at most one per URL per [`invalidation_interval`](StampedeLayer::invalidation_interval)
//! (1 s) in each process. The first goes at once (`detail=invalidated`); those within the
//! interval after it are coalesced into one at its end (`detail=invalidation-coalesced`), so
//! the last change is read at most one interval late.
//!
//! A URL's query-string variants are other URLs: a `POST /p/2` does not reach a stored
//! `/p/2?ref=x`. Reach them by tagging the responses (below) and purging the tag.
//!
//! **Tags**: a response's `Surrogate-Key` (space-separated, as Fastly and Varnish xkey write
//! it) or `Cache-Tag` (comma-separated) names tags that are stored with it (the fields are
//! configurable with [`StampedeLayer::tag_headers`], and removed from the responses sent to
//! clients unless [`StampedeLayer::keep_tag_headers`] says otherwise); purging one tag
//! removes every response that carries it, in one store call.
//!
//! Application code purges by URL or by tag through a [`Purger`]
//! ([`StampedeLayer::purger`]); an HTTP `PURGE` endpoint (`PURGE /path`, or `PURGE` with
//! `Surrogate-Key: t1 t2`), off by default, is turned on with an authorization check by
//! [`StampedeLayer::purge`].
//!
//! # Conditional requests
//!
//! A `GET` or `HEAD` with `If-None-Match` (weak comparison, `*` included) or, without it,
//! `If-Modified-Since`, is looked up like any other (a miss still loads once, without the
//! preconditions, so the full response can be stored) and answered `304 Not Modified` when
//! the cached `200` matches, with the entry's `Cache-Control`, `Content-Location`, `Date`,
//! `ETag`, `Expires`, `Vary` and `Last-Modified`; otherwise with the full cached response.
//!
//! # Not done (parts of RFC 9111 left out)
//!
//! - **Revalidation without a kept value**: only values the cache keeps past their freshness
//!   ([`keep_for_revalidation`](crate::CacheBuilder::keep_for_revalidation), or its stale
//!   windows) are revalidated; otherwise a stale entry is reloaded in full and `no-cache`
//!   responses pass.
//! - **`no-cache` across processes**: one process's requests share one revalidation, but the
//!   requests of another process that waited for it revalidate again, one at a time.
//! - **Client freshness directives** other than `no-store`, `no-cache` and `max-age=0`
//!   (`max-stale`, `min-fresh`, `max-age=N`, `only-if-cached`): ignored, as shared caches
//!   usually do.
//! - **Field-qualified `no-cache="f"` and `private="f"`**: treated as the unqualified forms
//!   (revalidated before each use; not stored), rather than stored without the named fields.
//! - **Range requests**: passed through; a `206` is never stored or built from an entry.
//! - **The apparent age** (`now - Date`): `Age` counts from when the response arrived less the
//!   `Age` it carried, so a skewed origin clock never shortens or lengthens freshness.
//! - **`Cache-Status`'s `key`**: never sent (it may hold credentials). `ttl` is on hits,
//!   stale hits and the response whose load stored the entry, not on responses collapsed onto
//!   a load.
//! - **RFC 9211 §2's "should not" for responses the layer makes itself**: its own `502` /
//!   `504` carry `Cache-Status` with `detail=`, so a response the origin never sent can always
//!   be told apart.
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
