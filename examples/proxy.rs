//! A caching reverse proxy: one origin behind a [`StampedeLayer`].
//!
//! Every request is forwarded to the origin (`--origin http://host:port`). Cacheable `GET`
//! and `HEAD` responses (by the shared-cache rules of RFC 9111, see the `http` module of the
//! crate: no `no-store`/`private`/`Set-Cookie`, one entry per variant for `Vary`, ...) are
//! shared through the cache: fresh for the origin's `s-maxage`, `max-age` or `Expires`, or,
//! for statuses cacheable by default (200, 404, ...), `--ttl-secs` when it gives none. Each
//! response says how it was served in `x-cache` (`HIT`, `MISS`, `STALE` or `BYPASS`; other
//! methods than `GET` pass through without it). With `--stale-secs S`, a response up to S
//! seconds past its freshness is served at once while one request refreshes it, and in place
//! of a failed refresh; hot responses are refreshed shortly before they expire
//! (`--early-refresh-beta`, on by default).
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
//! Without `--redis` or `--redis-cluster`, the proxy caches in an embedded, in-process store.
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
//! The cache key is the origin's URL (scheme, authority, path and query), whatever `Host` the
//! client sent: every proxy in front of one origin shares one entry per URL. Hop-by-hop headers
//! are dropped both ways; `Host` is set to the origin's authority. An origin that cannot be
//! reached becomes a `502 Bad Gateway`. Upgrades (WebSocket) are not proxied.
//!
//! After binding, the proxy prints `listening on ADDR` (the bound address, so `--listen
//! 127.0.0.1:0` works) on stdout. Ctrl-C shuts it down: it stops accepting, lets requests in
//! flight finish (for up to 5 s) and exits with code 0. Exit codes: 1 when Redis cannot be
//! reached or the address cannot be bound, 2 for bad arguments. `--help` lists every option.

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use http::header::{HeaderName, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, HOST};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tower::{service_fn, ServiceBuilder};
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

/// How long in-flight requests may run on after Ctrl-C.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A caching reverse proxy with cache-stampede protection (tower-stampede).
#[derive(Debug, Parser)]
#[command(
    name = "proxy",
    max_term_width = 100,
    after_help = "Prints `listening on ADDR` once bound. Exit codes: 0 after Ctrl-C, 1 when \
                  Redis cannot be reached or the address cannot be bound, 2 for bad arguments."
)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0: any free port)
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    listen: SocketAddr,

    /// The origin server, http://host:port
    #[arg(long, value_name = "URL", value_parser = Origin::parse)]
    origin: Origin,

    /// Share the cache through Redis, e.g. redis://127.0.0.1:6379/ (default: an embedded
    /// in-process store)
    #[arg(long, value_name = "URL", value_parser = redis_url)]
    redis: Option<String>,

    /// Share the cache through a Redis Cluster: some of its nodes' URLs, comma-separated
    /// (needs the `cluster` feature; not with --redis)
    #[arg(long, value_name = "URLS", value_parser = cluster_urls)]
    redis_cluster: Option<ClusterUrls>,

    /// Freshness when the origin gives none, for statuses cacheable by default (200, 404,
    /// ...)
    #[arg(
        long = "ttl-secs",
        value_name = "S",
        value_parser = positive_secs,
        default_value = "60"
    )]
    ttl: Duration,

    /// How long past its freshness a response may be served (x-cache: STALE) while one
    /// request refreshes it, or when the refresh fails (default: 0)
    #[arg(long = "stale-secs", value_name = "S", value_parser = secs)]
    stale: Option<Duration>,

    /// Refresh hot responses shortly before they expire (XFetch); larger B refreshes earlier,
    /// 0 turns it off (default: 1)
    #[arg(long, value_name = "B", value_parser = beta, allow_negative_numbers = true)]
    early_refresh_beta: Option<f64>,

    /// Lifetime of the reload lock if its holder dies (default: 5000)
    #[arg(long = "lock-ttl-ms", value_name = "MS", value_parser = positive_millis)]
    lock_ttl: Option<Duration>,

    /// Bound on each Redis call; slower calls fall back to in-process protection (default: 50)
    #[arg(long = "store-timeout-ms", value_name = "MS", value_parser = positive_millis)]
    store_timeout: Option<Duration>,

    /// Prefix of the cache's keys in the store
    #[arg(long, value_name = "NS", value_parser = namespace, default_value = "proxy")]
    namespace: String,

    /// Largest response body that is cached (default: 1048576)
    #[arg(long, value_name = "N", value_parser = byte_count)]
    max_body_bytes: Option<usize>,

    /// Serve Prometheus metrics on http://ADDR/metrics (needs the `metrics` feature; prints
    /// `metrics on ADDR` once bound)
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    metrics: Option<SocketAddr>,

    /// Answer PURGE (of a URL, or of the tags in its Surrogate-Key) for requests with
    /// `Authorization: Bearer TOKEN` (default: PURGE goes to the origin)
    #[arg(long, value_name = "TOKEN", value_parser = PurgeToken::parse)]
    purge_token: Option<PurgeToken>,
}

impl Args {
    /// The command line; on a usage error, prints it and exits with code 2 (after `--help`,
    /// prints the help and exits with code 0).
    fn parse_or_exit() -> Args {
        let args = Args::parse();
        if args.redis.is_some() && args.redis_cluster.is_some() {
            Args::command()
                .error(
                    ErrorKind::ArgumentConflict,
                    "--redis and --redis-cluster are mutually exclusive: give one server or the \
                     cluster's nodes",
                )
                .exit();
        }
        if args
            .purge_token
            .as_ref()
            .is_some_and(|token| token.0.is_none())
        {
            Args::command()
                .error(
                    ErrorKind::InvalidValue,
                    "--purge-token must be visible ASCII characters, without spaces (the value \
                     given is not repeated here)",
                )
                .exit();
        }
        args
    }
}

/// The seed nodes' URLs of a Redis Cluster.
#[derive(Clone, Debug)]
struct ClusterUrls(Vec<String>);

/// A URL of a Redis server.
fn redis_url(text: &str) -> Result<String, String> {
    if !text.contains("://") {
        return Err("not a URL (expected e.g. redis://127.0.0.1:6379/)".to_owned());
    }
    Ok(text.to_owned())
}

/// `URL,URL,...`: at least one, each a URL.
fn cluster_urls(text: &str) -> Result<ClusterUrls, String> {
    let urls: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(
            "needs at least one URL (e.g. redis://10.0.0.1:6379/,redis://10.0.0.2:6379/)"
                .to_owned(),
        );
    }
    if let Some(bad) = urls.iter().find(|url| !url.contains("://")) {
        return Err(format!(
            "{bad:?} is not a URL (expected e.g. redis://10.0.0.1:6379/)"
        ));
    }
    Ok(ClusterUrls(urls))
}

fn positive(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("not a positive whole number".to_owned()),
    }
}

fn positive_secs(text: &str) -> Result<Duration, String> {
    positive(text).map(Duration::from_secs)
}

fn positive_millis(text: &str) -> Result<Duration, String> {
    positive(text).map(Duration::from_millis)
}

fn secs(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| "not a number of seconds".to_owned())
}

fn beta(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(beta) if beta.is_finite() && beta >= 0.0 => Ok(beta),
        _ => Err("not a number >= 0".to_owned()),
    }
}

fn byte_count(text: &str) -> Result<usize, String> {
    text.parse::<usize>()
        .map_err(|_| "not a number of bytes".to_owned())
}

fn namespace(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(text.to_owned())
}

/// The purge token, kept as its SHA-256 digest only: the token itself is never held, so never
/// printed (`Debug` says `set`). `None` for a token that cannot be sent in a header: refused
/// once the command line is parsed (a value parser's error would quote it).
#[derive(Clone)]
struct PurgeToken(Option<[u8; 32]>);

impl PurgeToken {
    fn parse(text: &str) -> Result<PurgeToken, Infallible> {
        let valid = !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic());
        Ok(PurgeToken(
            valid.then(|| Sha256::digest(text.as_bytes()).into()),
        ))
    }

    /// Whether a request carries `Authorization: Bearer TOKEN`. The digests are compared in
    /// constant time, so the time taken tells nothing of the token (its length included).
    fn allows(&self, request: &http::request::Parts) -> bool {
        let (Some(token), Some(presented)) = (
            self.0.as_ref(),
            request
                .headers
                .get(AUTHORIZATION)
                .and_then(|value| bearer_token(value.as_bytes())),
        ) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        digest
            .iter()
            .zip(token)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
    }
}

impl std::fmt::Debug for PurgeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PurgeToken(set)")
    }
}

/// The token of an `Authorization: Bearer TOKEN` value (RFC 6750: the scheme's case does not
/// matter, one or more spaces follow it).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.starts_with(b" ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// An IP address and port, or a host name that resolves to one (`localhost:8080`).
fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| "not an address (expected e.g. 127.0.0.1:8080)".to_owned())
}

/// The origin: where every request goes.
#[derive(Clone, Debug)]
struct Origin {
    scheme: Scheme,
    authority: Authority,
    host: HeaderValue,
}

impl Origin {
    fn parse(text: &str) -> Result<Origin, String> {
        let bad = |why: &str| format!("{why} (expected http://host:port)");
        let uri: Uri = text.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(bad("uses https, which this proxy does not speak")),
            _ => return Err(bad("not an http:// URL")),
        }
        let authority = uri.authority().cloned().ok_or_else(|| bad("has no host"))?;
        if authority.host().is_empty() {
            return Err(bad("has no host"));
        }
        if authority.as_str().contains('@') {
            return Err(bad("holds user info"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(bad("has a path or query"));
        }
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| bad("has a bad host"))?;
        Ok(Origin {
            scheme: Scheme::HTTP,
            authority,
            host,
        })
    }

    /// The origin's URI for a request's path and query.
    fn uri_for(&self, uri: &Uri) -> Uri {
        let path = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .expect("scheme, authority and path and query make a URI")
    }
}

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

/// Sends a request on to the origin; an origin that cannot be reached becomes a 502.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    origin: Arc<Origin>,
    mut request: Request<Incoming>,
) -> Response<ProxyBody> {
    *request.uri_mut() = origin.uri_for(request.uri());
    // The client may have spoken HTTP/2 to us; the origin connection is HTTP/1.1.
    *request.version_mut() = Version::HTTP_11;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers);
    headers.insert(HOST, origin.host.clone());

    match client.request(request).await {
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

/// Sends every request to the origin's URI before the layer sees it, so that the cache key is
/// the origin's URL, not the `Host` the client happened to use for this proxy.
fn to_origin_uri(origin: &Origin, mut request: Request<Incoming>) -> Request<Incoming> {
    *request.uri_mut() = origin.uri_for(request.uri());
    request
}

async fn build_cache(args: &Args) -> Result<Cache, String> {
    let builder = match (&args.redis, &args.redis_cluster) {
        (Some(url), _) => Cache::builder(connect_redis(url).await?),
        (None, Some(urls)) => Cache::builder(connect_redis_cluster(&urls.0).await?),
        (None, None) => Cache::builder(MemoryStore::new()),
    };
    let mut builder = builder.namespace(&args.namespace);
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
    Ok(builder.build())
}

/// Installs a Prometheus recorder and serves its text on `http://ADDR/metrics`; returns the
/// bound address.
#[cfg(feature = "metrics")]
async fn serve_metrics(addr: SocketAddr) -> Result<SocketAddr, String> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the metrics address: {e}"))?;
    // Histograms are summarised on upkeep: keep them fresh.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
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

async fn connect_redis(url: &str) -> Result<RedisStore, String> {
    RedisStore::connect(url)
        .await
        .map_err(|e| format!("cannot use Redis: {e}"))
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
    // --ttl-secs.
    let mut layer = StampedeLayer::new(cache).policy(RfcPolicy::new().default_ttl(args.ttl));
    if let Some(limit) = args.max_body_bytes {
        layer = layer.max_body_bytes(limit);
    }
    if let Some(token) = args.purge_token.clone() {
        layer = layer.purge(move |request| token.allows(request));
    }

    let origin = Arc::new(args.origin.clone());
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let inner = {
        let origin = Arc::clone(&origin);
        service_fn(move |request: Request<Incoming>| {
            let (client, origin) = (client.clone(), Arc::clone(&origin));
            async move { Ok::<_, Infallible>(forward(client, origin, request).await) }
        })
    };
    let service = ServiceBuilder::new()
        .map_request({
            let origin = Arc::clone(&origin);
            move |request| to_origin_uri(&origin, request)
        })
        .layer(layer)
        .service(inner);

    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        // Whoever started us may wait for this line; if it is gone, keep serving regardless.
        let _ = writeln!(stdout, "listening on {local_addr}");
        let _ = stdout.flush();
    }

    let server = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(error) => {
                        // Out of file descriptors and the like: pause rather than spin.
                        eprintln!("proxy: accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let connection = server
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service.clone()))
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    // A client that goes away mid-request is nothing to report.
                    let _ = connection.await;
                });
            }
            signal = &mut ctrl_c => {
                if let Err(error) = signal {
                    return Err(format!("cannot listen for Ctrl-C: {error}"));
                }
                break;
            }
        }
    }

    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "proxy: requests still in flight after {} s; exiting anyway",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    Ok(())
}
