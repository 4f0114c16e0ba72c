//! A caching reverse proxy: one origin behind a [`StampedeLayer`].
//!
//! Every request is forwarded to the origin (`--origin http://host:port`). Cacheable `GET`
//! and `HEAD` responses (by the shared-cache rules of RFC 9111, see the `http` module of the
//! crate: no `no-store`/`private`/`Set-Cookie`, one entry per variant for `Vary`, ...) are
//! shared through the cache: fresh for the origin's `CDN-Cache-Control`, `s-maxage`,
//! `max-age` or `Expires`. Responses without explicit freshness are not stored unless
//! `--ttl-secs S` (default 0) gives the freshness to invent for statuses cacheable by
//! default (200, 404, ...): a shared cache should not make up a lifetime for everything
//! (RFC 9111 §4.2.2). An origin's `5xx` without explicit freshness goes to the requests
//! that waited for its load, and is never reused. Each response says how it was served in
//! `Cache-Status` (RFC 9211, as `tower-stampede`) and `x-cache` (`HIT`, `MISS`, `STALE` or
//! `BYPASS`; other methods than `GET` pass through without them). With `--stale-secs S`, a
//! response up to S seconds past its freshness is served at once while one request refreshes
//! it, and in place of a failed refresh; hot responses are refreshed shortly before they
//! expire (`--early-refresh-beta`, on by default). A response is kept `--revalidate-secs` (an
//! hour by default) past its freshness so that its reload is a conditional request
//! (`If-None-Match` / `If-Modified-Since` from its `ETag` / `Last-Modified`): a `304` makes it
//! fresh again and its stored body is served; `no-cache` responses with a validator are stored
//! and revalidated before each use.
//!
//! Run several proxies over one Redis and a stampede on a cold URL reaches the origin once in
//! all, whichever proxies the requests land on:
//!
//! ```sh
//! redis-server --port 6379 &
//! cargo run --release --example proxy -- --listen 127.0.0.1:8081 \
//!     --origin http://127.0.0.1:8080 --redis redis://127.0.0.1:6379/ &
//! cargo run --release --example proxy -- --listen 127.0.0.1:8082 \
//!     --origin http://127.0.0.1:8080 --redis redis://127.0.0.1:6379/ &
//! curl -i http://127.0.0.1:8081/some/page
//! ```
//!
//! On a Redis Cluster, give some of its nodes instead (built with the `cluster` feature):
//!
//! ```sh
//! cargo run --release --features cluster --example proxy -- --listen 127.0.0.1:8081 \
//!     --origin http://127.0.0.1:8080 \
//!     --redis-cluster redis://10.0.0.1:6379/,redis://10.0.0.2:6379/,redis://10.0.0.3:6379/
//! ```
//!
//! Behind Redis Sentinel, give some of the sentinels and the service's name (built with the
//! `sentinel` feature); the proxy follows the primary through failovers:
//!
//! ```sh
//! cargo run --release --features sentinel --example proxy -- --listen 127.0.0.1:8081 \
//!     --origin http://127.0.0.1:8080 --sentinel-master mymaster \
//!     --redis-sentinel redis://10.0.0.1:26379/,redis://10.0.0.2:26379/,redis://10.0.0.3:26379/
//! ```
//!
//! Without `--redis`, `--redis-cluster` or `--redis-sentinel`, the proxy caches in an
//! embedded, in-process store.
//!
//! A `POST`, `PUT`, `DELETE`, `PATCH` (or any other unsafe method) that the origin answers
//! with a 2xx or 3xx removes the URL's cached responses (and those of a same-origin
//! `Location` / `Content-Location`) from every proxy (RFC 9111 §4.4). Tags the origin gives in
//! `Surrogate-Key` (or `Cache-Tag`) are stored with the response and not sent on to clients.
//! With `--purge-token TOKEN`, the proxy answers `PURGE` itself, for requests with
//! `Authorization: Bearer TOKEN` only (others get `403` and remove nothing): `PURGE /path`
//! removes that URL's responses everywhere, and `PURGE` with `Surrogate-Key: t1 t2` the
//! responses tagged `t1` or `t2`:
//!
//! ```sh
//! curl -X PURGE -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8081/some/page
//! curl -X PURGE -H "Authorization: Bearer $TOKEN" -H "Surrogate-Key: user:42" http://127.0.0.1:8081/
//! ```
//!
//! Without `--purge-token`, a `PURGE` goes to the origin like any other method. The token is
//! compared in constant time and never printed; being a command-line argument, it is visible
//! to other users of the machine in its process list: give it on a machine of one's own.
//!
//! A request with a cookie or `Authorization` gets its own page: its response is stored only
//! if the origin says it may be shared (`public`, `s-maxage`, `must-revalidate`, or per cookie
//! with `Vary: Cookie`), never for `--ttl-secs`; analytics cookies (`_ga`, `_gid`, `_fbp`,
//! ...) do not count, `--ignore-cookie NAME` (repeatable) names more cookies that personalise
//! nothing, `--ignore-all-cookies` says no page depends on cookies. A `GET` with a forwarding
//! header (`X-Forwarded-Host`, `Forwarded`, `X-Original-URL`, ...) is keyed by its values, so
//! that no client's value becomes everyone's page while the load balancer's values share one
//! entry; `--trust-header NAME` (repeatable) leaves one the load balancer overwrites out of
//! the key. A `GET` with a method override or a body goes to the origin uncached.
//!
//! The cache key is the origin's URL (scheme, authority, path and query), whatever `Host` the
//! client sent: every proxy in front of one origin shares one entry per URL; proxies in front
//! of copies of one site at different addresses share them with `--cache-authority
//! shop.example`, which keys by that authority instead of the origin's. Hop-by-hop headers
//! are dropped both ways; `Host` is set to the origin's authority. An origin that cannot be
//! reached becomes a `502 Bad Gateway`. Upgrades (WebSocket) are not proxied.
//!
//! After binding, the proxy prints `listening on ADDR` (the bound address, so `--listen
//! 127.0.0.1:0` works) on stdout. Ctrl-C shuts it down: it stops accepting, lets requests in
//! flight finish (for up to 5 s) and exits with code 0. Exit codes: 1 when Redis cannot be
//! reached or the address cannot be bound, 2 for bad arguments. `--help` lists every option;
//! `args.rs` reads them.

mod args;
#[path = "../shared/serve.rs"]
mod serve;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use args::{Args, Origin};
use bytes::Bytes;
use http::header::{HeaderName, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::{service_fn, Layer};
use tower_stampede::http::RfcPolicy;
use tower_stampede::store::{MemoryStore, RedisStore};
use tower_stampede::{Cache, StampedeLayer};

/// Hop-by-hop headers, never forwarded (RFC 9110 section 7.6.1), besides those `Connection`
/// names.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// What the proxy's inner service needs to reach the origin, behind one `Arc`: the layer
/// clones its inner service for every request (hits included), and a `Client` is several.
struct Forwarder {
    client: Client<HttpConnector, Incoming>,
    origin: Origin,
}

/// Sends a request on to the origin; an origin that cannot be reached becomes a 502.
async fn forward(forwarder: Arc<Forwarder>, mut request: Request<Incoming>) -> Response<ProxyBody> {
    let origin = &forwarder.origin;
    to_origin_uri(origin, &mut request);
    // The client may have spoken HTTP/2 to us; the origin connection is HTTP/1.1.
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers);
    headers.insert(HOST, origin.host.clone());

    match forwarder.client.request(request).await {
        Ok(response) => {
            let mut response = response.map(BodyExt::boxed_unsync);
            strip_hop_by_hop(response.headers_mut());
            response
        }
        Err(error) => {
            let mut message = format!("origin {} unreachable: {error}", origin.authority);
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("proxy: {message}");
            bad_gateway(message)
        }
    }
}

fn bad_gateway(message: String) -> Response<ProxyBody> {
    let body = format!("502 Bad Gateway: {message}\n");
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Sends a request to the origin's URI. Only requests that go to the origin pay for it: the
/// layer keys every request by the origin's URL already ([`Origin::key`]), whatever `Host`
/// the client used for this proxy.
fn to_origin_uri(origin: &Origin, request: &mut Request<Incoming>) {
    let uri = std::mem::take(request.uri_mut());
    *request.uri_mut() = origin.uri_for(uri);
}

async fn build_cache(args: &Args) -> Result<Cache, String> {
    let sentinel = args
        .redis_sentinel
        .as_ref()
        .zip(args.sentinel_master.as_ref());
    let builder = match (&args.redis, &args.redis_cluster, sentinel) {
        (Some(url), _, _) => Cache::builder(connect_redis(url).await?),
        (None, Some(urls), _) => Cache::builder(connect_redis_cluster(&urls.0).await?),
        (None, None, Some((urls, service))) => {
            Cache::builder(connect_redis_sentinel(&urls.0, service)?)
        }
        (None, None, None) => Cache::builder(MemoryStore::new()),
    };
    let mut builder = builder
        .namespace(&args.namespace)
        .readable_keys(args.readable_keys)
        .keep_for_revalidation(args.revalidate);
    if let Some(stale) = args.stale {
        builder = builder.stale(stale);
    }
    if let Some(beta) = args.early_refresh_beta {
        builder = builder.early_refresh(beta);
    }
    if let Some(lock_ttl) = args.lock_ttl {
        builder = builder.lock_ttl(lock_ttl);
    }
    if let Some(store_timeout) = args.store_timeout {
        builder = builder.store_timeout(store_timeout);
    }
    // Settings from the command line: one that cannot work is an error, not a panic.
    builder.try_build().map_err(|refused| refused.to_string())
}

/// Installs a Prometheus recorder and serves its text on `http://ADDR/metrics`; returns the
/// bound address. The engine's histograms get buckets (from 1 ms to 30 s), not summaries, so
/// that they can be summed across proxies; their `# HELP` lines come from the engine, which
/// describes its metrics as the cache is built.
#[cfg(feature = "metrics")]
async fn serve_metrics(addr: SocketAddr) -> Result<SocketAddr, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use tower_stampede::cache::{DURATION_BUCKETS, METRICS_PREFIX};

    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix(METRICS_PREFIX.into()), &DURATION_BUCKETS)
        .map_err(|e| format!("cannot set the histograms' buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the metrics address: {e}"))?;
    // Upkeep drains the histograms' samples into their buckets between scrapes.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route(
        "/metrics",
        // A scrape is of this instance now: `no-store`, so no cache between keeps it.
        axum::routing::get(move || {
            let no_store = [(http::header::CACHE_CONTROL, "no-store")];
            std::future::ready((no_store, handle.render()))
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("metrics server stopped: {error}");
        }
    });
    Ok(bound)
}

#[cfg(not(feature = "metrics"))]
async fn serve_metrics(_addr: SocketAddr) -> Result<SocketAddr, String> {
    Err("--metrics needs the `metrics` feature: \
         cargo run --example proxy --features metrics -- ..."
        .to_owned())
}

/// The store opens at once, even while Redis is down: the proxy serves with in-process
/// protection until Redis answers, then across proxies. A bad URL stops it at once.
async fn connect_redis(url: &str) -> Result<RedisStore, String> {
    RedisStore::open(url).map_err(|e| format!("cannot use Redis: {e}"))
}

#[cfg(feature = "cluster")]
async fn connect_redis_cluster(urls: &[String]) -> Result<RedisStore, String> {
    RedisStore::connect_cluster(urls.iter().cloned())
        .await
        .map_err(|e| format!("cannot use the Redis Cluster: {e}"))
}

#[cfg(not(feature = "cluster"))]
async fn connect_redis_cluster(_urls: &[String]) -> Result<RedisStore, String> {
    Err(
        "--redis-cluster needs the `cluster` feature of tower-stampede \
         (cargo run --features cluster --example proxy -- ...)"
            .to_owned(),
    )
}

/// As [`connect_redis`]: the store opens at once, and finds the primary through the
/// sentinels in the background (and again after each failover).
#[cfg(feature = "sentinel")]
fn connect_redis_sentinel(urls: &[String], service: &str) -> Result<RedisStore, String> {
    RedisStore::sentinel_builder(urls.iter().cloned(), service)
        .open()
        .map_err(|e| format!("cannot use Redis Sentinel: {e}"))
}

#[cfg(not(feature = "sentinel"))]
fn connect_redis_sentinel(_urls: &[String], _service: &str) -> Result<RedisStore, String> {
    Err(
        "--redis-sentinel needs the `sentinel` feature of tower-stampede \
         (cargo run --features sentinel --example proxy -- ...)"
            .to_owned(),
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    // The layer's warnings (a failing store, a lost lock) go to stderr.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse_or_exit();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("proxy: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    if let Some(addr) = args.metrics {
        let bound = serve_metrics(addr).await?;
        println!("metrics on {bound}");
    }
    let cache = build_cache(&args).await?;
    // Responses without explicit freshness, with a status cacheable by default, are kept for
    // --ttl-secs; with 0 (the default), not at all.
    let mut policy = RfcPolicy::new().ignore_all_cookies(args.ignore_all_cookies);
    if !args.ttl.is_zero() {
        policy = policy.default_ttl(args.ttl);
    }
    for name in &args.ignore_cookies {
        policy = policy.ignore_cookie(name);
    }
    let mut layer =
        StampedeLayer::new(cache).make_key(args.origin.key(args.cache_authority.as_ref()));
    for name in &args.trust_headers {
        layer = layer.trust_header(name.clone());
    }
    layer = layer.policy(policy);
    if let Some(limit) = args.max_body_bytes {
        layer = layer.max_body_bytes(limit);
    }
    if let Some(limit) = args.max_relay_bytes {
        layer = layer.max_relay_bytes(limit);
    }
    if let Some(token) = args.purge_token.clone() {
        layer = layer.purge(move |request| token.allows(request));
    }

    let forwarder = Arc::new(Forwarder {
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        origin: args.origin.clone(),
    });
    let inner = service_fn(move |request: Request<Incoming>| {
        let forwarder = Arc::clone(&forwarder);
        async move { Ok::<_, Infallible>(forward(forwarder, request).await) }
    });
    let service = layer.layer(inner);

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    serve::announce(&listener)?;
    serve::serve("proxy", listener, service).await
}
