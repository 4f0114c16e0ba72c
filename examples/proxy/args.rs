//! The proxy's command line: its options, how each value is read (a usage error, exit code 2,
//! for anything else), and what they name: the origin, the Redis servers, the purge token.

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use http::header::AUTHORIZATION;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Uri};
use sha2::{Digest, Sha256};
use tower_stampede::http::OriginKey;

/// A caching reverse proxy with cache-stampede protection (tower-stampede).
#[derive(Debug, Parser)]
#[command(
    name = "proxy",
    max_term_width = 100,
    after_help = "Prints `listening on ADDR` once bound. Exit codes: 0 after Ctrl-C, 1 when \
                  Redis cannot be reached or the address cannot be bound, 2 for bad arguments."
)]
pub(crate) struct Args {
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0: any free port)
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) listen: SocketAddr,

    /// The origin server, http://host:port
    #[arg(long, value_name = "URL", value_parser = Origin::parse)]
    pub(crate) origin: Origin,

    /// Share the cache through Redis, e.g. redis://127.0.0.1:6379/ (default: an embedded
    /// in-process store)
    #[arg(long, value_name = "URL", value_parser = redis_url)]
    pub(crate) redis: Option<String>,

    /// Share the cache through a Redis Cluster: some of its nodes' URLs, comma-separated
    /// (needs the `cluster` feature; not with --redis)
    #[arg(long, value_name = "URLS", value_parser = redis_urls)]
    pub(crate) redis_cluster: Option<RedisUrls>,

    /// Share the cache through the primary of a Redis Sentinel service: some of its
    /// sentinels' URLs, comma-separated (needs the `sentinel` feature; with
    /// --sentinel-master, not with --redis or --redis-cluster)
    #[arg(long, value_name = "URLS", value_parser = redis_urls, requires = "sentinel_master")]
    pub(crate) redis_sentinel: Option<RedisUrls>,

    /// The name the sentinels of --redis-sentinel monitor the primary by, e.g. mymaster
    #[arg(long, value_name = "NAME", requires = "redis_sentinel")]
    pub(crate) sentinel_master: Option<String>,

    /// Freshness to invent when the origin gives none, for statuses cacheable by default
    /// (200, 404, ...); 0 invents none: such responses are not stored. Default 0: a shared
    /// cache should not give every response a heuristic lifetime (RFC 9111 §4.2.2), so only
    /// what the origin declares fresh (s-maxage, max-age, Expires, CDN-Cache-Control) is
    /// stored unless this is set
    #[arg(
        long = "ttl-secs",
        value_name = "S",
        value_parser = secs,
        default_value = "0"
    )]
    pub(crate) ttl: Duration,

    /// How long past its freshness a response may be served (x-cache: STALE) while one
    /// request refreshes it, or when the refresh fails (default: 0)
    #[arg(long = "stale-secs", value_name = "S", value_parser = secs)]
    pub(crate) stale: Option<Duration>,

    /// How long past its freshness a response is kept for its reload to revalidate it with a
    /// conditional request (If-None-Match / If-Modified-Since); 0 keeps nothing, so stale
    /// responses are reloaded in full and no-cache responses are not stored
    #[arg(
        long = "revalidate-secs",
        value_name = "S",
        value_parser = secs,
        default_value = "3600"
    )]
    pub(crate) revalidate: Duration,

    /// Refresh hot responses shortly before they expire (XFetch); larger B refreshes earlier,
    /// 0 turns it off (default: 1)
    #[arg(long, value_name = "B", value_parser = beta, allow_negative_numbers = true)]
    pub(crate) early_refresh_beta: Option<f64>,

    /// Lifetime of the reload lock if its holder dies (default: 5000)
    #[arg(long = "lock-ttl-ms", value_name = "MS", value_parser = positive_millis)]
    pub(crate) lock_ttl: Option<Duration>,

    /// Bound on each Redis call; slower calls fall back to in-process protection (default: 250)
    #[arg(long = "store-timeout-ms", value_name = "MS", value_parser = positive_millis)]
    pub(crate) store_timeout: Option<Duration>,

    /// Key the cache by this authority (host[:port]) instead of the origin's: proxies whose
    /// origins are copies of one site at different addresses then share one cache over one
    /// store (default: the origin's authority)
    #[arg(long, value_name = "AUTHORITY", value_parser = cache_authority)]
    pub(crate) cache_authority: Option<Authority>,

    /// Prefix of the cache's keys in the store
    #[arg(long, value_name = "NS", value_parser = namespace, default_value = "proxy")]
    pub(crate) namespace: String,

    /// Show each request's method and URL, besides its key's hash, in the warnings logged
    /// while serving it (off: URLs may carry what logs must not, such as a token)
    #[arg(long)]
    pub(crate) readable_keys: bool,

    /// A cookie that personalises nothing (consent; the analytics cookies of Google, Meta and
    /// the like are ignored already): requests whose cookies are all ignored are cached as
    /// requests without cookies. Repeat for each name. Any other
    /// cookie makes a request private: its response is stored only if the origin says
    /// `public`, `s-maxage` or `must-revalidate` (or `Vary: Cookie`), and gets no --ttl-secs
    #[arg(long = "ignore-cookie", value_name = "NAME")]
    pub(crate) ignore_cookies: Vec<String>,

    /// Every cookie is ignored: the origin's pages never depend on cookies, so requests with
    /// and without them share one entry (a response with Set-Cookie is still never stored)
    #[arg(long)]
    pub(crate) ignore_all_cookies: bool,

    /// A forwarding header the load balancer in front of this proxy sets on every request,
    /// replacing any a client sent (e.g. x-forwarded-proto): left out of the key, its value
    /// ignored. Repeat for each name. By default a GET or HEAD with a forwarding or rewrite
    /// header (X-Forwarded-Host, X-Forwarded-Proto, Forwarded, X-Original-URL, ...) is keyed
    /// by its values, so that one client's value never becomes every client's page, and one
    /// with a method override or a body is passed to the origin, never cached
    #[arg(long = "trust-header", value_name = "NAME", value_parser = header_name)]
    pub(crate) trust_headers: Vec<HeaderName>,

    /// Largest response body that is cached (default: 1048576)
    #[arg(long, value_name = "N", value_parser = byte_count)]
    pub(crate) max_body_bytes: Option<usize>,

    /// Largest body over --max-body-bytes that is relayed to the requests that waited for its
    /// load; over it, they go to the origin themselves (default: 16777216)
    #[arg(long, value_name = "N", value_parser = byte_count)]
    pub(crate) max_relay_bytes: Option<usize>,

    /// Serve Prometheus metrics on http://ADDR/metrics (needs the `metrics` feature; prints
    /// `metrics on ADDR` once bound)
    #[arg(long, value_name = "ADDR", value_parser = socket_addr)]
    pub(crate) metrics: Option<SocketAddr>,

    /// Answer PURGE (of a URL, or of the tags in its Surrogate-Key) for requests with
    /// `Authorization: Bearer TOKEN` (default: PURGE goes to the origin)
    #[arg(long, value_name = "TOKEN", value_parser = PurgeToken::parse)]
    pub(crate) purge_token: Option<PurgeToken>,
}

impl Args {
    /// The command line; on a usage error, prints it and exits with code 2 (after `--help`,
    /// prints the help and exits with code 0).
    pub(crate) fn parse_or_exit() -> Args {
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
        if args.redis_sentinel.is_some() && (args.redis.is_some() || args.redis_cluster.is_some()) {
            Args::command()
                .error(
                    ErrorKind::ArgumentConflict,
                    "--redis-sentinel is not with --redis or --redis-cluster: give the sentinels, \
                     one server or the cluster's nodes",
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
pub(crate) struct RedisUrls(pub(crate) Vec<String>);

/// A URL of a Redis server.
fn redis_url(text: &str) -> Result<String, String> {
    if !text.contains("://") {
        return Err("not a URL (expected e.g. redis://127.0.0.1:6379/)".to_owned());
    }
    Ok(text.to_owned())
}

/// `URL,URL,...`: at least one, each a URL.
fn redis_urls(text: &str) -> Result<RedisUrls, String> {
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
    Ok(RedisUrls(urls))
}

fn positive(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("not a positive whole number".to_owned()),
    }
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

fn header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(text.as_bytes()).map_err(|_| "not a header name".to_owned())
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
pub(crate) struct PurgeToken(Option<[u8; 32]>);

impl PurgeToken {
    fn parse(text: &str) -> Result<PurgeToken, Infallible> {
        let valid = !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic());
        Ok(PurgeToken(
            valid.then(|| Sha256::digest(text.as_bytes()).into()),
        ))
    }

    /// Whether a request carries `Authorization: Bearer TOKEN`. The digests are compared in
    /// constant time, so the time taken tells nothing of the token (its length included).
    pub(crate) fn allows(&self, request: &http::request::Parts) -> bool {
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

/// An authority to key the cache by: a host, and a port if any; no user info.
fn cache_authority(text: &str) -> Result<Authority, String> {
    let bad = || format!("{text:?} is not a host[:port] (expected e.g. shop.example)");
    let authority: Authority = text.parse().map_err(|_| bad())?;
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(bad());
    }
    Ok(authority)
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
pub(crate) struct Origin {
    scheme: Scheme,
    pub(crate) authority: Authority,
    pub(crate) host: HeaderValue,
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

    /// The layer's key of the requests this proxy sends to the origin: the origin's URL, with
    /// `authority` in place of the origin's if one is given (`--cache-authority`).
    pub(crate) fn key(&self, authority: Option<&Authority>) -> OriginKey {
        let authority = authority.unwrap_or(&self.authority);
        OriginKey::new(self.scheme.clone(), authority.clone())
    }

    /// The origin's URI for a request's path and query (the request's URI, taken apart: its
    /// path and query are not copied).
    pub(crate) fn uri_for(&self, uri: Uri) -> Uri {
        let mut parts = uri.into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        Uri::from_parts(parts).expect("scheme, authority and path and query make a URI")
    }
}
