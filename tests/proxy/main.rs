//! The `proxy` example end to end: real proxy processes over a real `redis-server`, in front of
//! a slow origin in this process.
#![cfg(feature = "redis")]

mod balancer;
#[cfg(feature = "sentinel")]
mod sentinel;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
#[cfg(feature = "cluster")]
use support::RedisCluster;
use support::{Counter, RedisServer};
use tokio::sync::Barrier;

/// The failure guard on anything that waits: far beyond what a healthy run needs.
const LIMIT: Duration = Duration::from_secs(30);

/// The origin's delay on every request.
const ORIGIN_DELAY: Duration = Duration::from_millis(300);

/// The origin's body for a path and query: a few KiB that name it.
fn origin_body(path_and_query: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(4200);
    let mut line = 0;
    while body.len() < 4096 {
        body.extend_from_slice(format!("{line:04} origin body for {path_and_query}\n").as_bytes());
        line += 1;
    }
    body
}

/// The origin's body for `/big`: 50 KB of every byte value.
fn big_body() -> Vec<u8> {
    (0..50_000u32).map(|i| (i % 251) as u8).collect()
}

/// The origin's body for `/large`: 2 MiB (over the proxy's default `--max-body-bytes`, 1 MiB)
/// of bytes that differ from position to position.
fn large_body() -> Vec<u8> {
    (0..2 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// A slow origin on a free loopback port, counting every request it receives.
async fn start_origin(counter: Counter) -> SocketAddr {
    let app = Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let counter = counter.clone();
            async move {
                let n = counter.hit();
                tokio::time::sleep(ORIGIN_DELAY).await;
                let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
                let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
                let body = if uri.path().starts_with("/dash") {
                    // A page for the user its session cookie names; `/dash-public` says it may be
                    // shared, `/dash` says nothing of its freshness.
                    let page = format!("hello {} #{n}", header("cookie").unwrap_or("nobody"));
                    if uri.path() == "/dash-public" {
                        return ([(header::CACHE_CONTROL, "public, max-age=30")], page)
                            .into_response();
                    }
                    return page.into_response();
                } else if uri.path() == "/reflect" {
                    // What frameworks answer from: a method override, a rewrite, a forwarded
                    // host, a GET's body.
                    let page = if let Some(method) = header("x-http-method-override") {
                        format!("{method} done")
                    } else if let Some(path) = header("x-original-url") {
                        format!("the page at {path}")
                    } else {
                        // Read, as CGI-style servers do, with `_` for `-` too.
                        let host = header("x-forwarded-host")
                            .or_else(|| header("x_forwarded_host"))
                            .unwrap_or("origin");
                        let port =
                            header("x-forwarded-port").map_or(String::new(), |p| format!(":{p}"));
                        let host = format!("{host}{port}");
                        let scheme = header("x-forwarded-proto").unwrap_or("http");
                        let query = String::from_utf8_lossy(&body);
                        format!("<a href=\"{scheme}://{host}/next\"> {query}")
                    };
                    return ([(header::CACHE_CONTROL, "max-age=60")], page).into_response();
                } else if method == Method::POST {
                    [b"posted:".as_slice(), &body].concat()
                } else if uri.path() == "/short" {
                    // Fresh for one second; the body tells which origin request made it.
                    return (
                        [
                            (header::CACHE_CONTROL, "max-age=1"),
                            (header::CONTENT_TYPE, "text/plain"),
                        ],
                        format!("load {n}").into_bytes(),
                    )
                        .into_response();
                } else if uri.path() == "/counted" {
                    // Fresh for a minute; the body tells which origin request made it, and
                    // `?tags=a+b` tags it.
                    let mut response = (
                        [
                            (header::CACHE_CONTROL, "max-age=60"),
                            (header::CONTENT_TYPE, "text/plain"),
                        ],
                        format!("load {n}").into_bytes(),
                    )
                        .into_response();
                    if let Some(tags) = uri.query().and_then(|q| q.strip_prefix("tags=")) {
                        let tags = tags.replace('+', " ");
                        response
                            .headers_mut()
                            .insert("surrogate-key", tags.parse().expect("tags"));
                    }
                    return response;
                } else if uri.path() == "/bare" {
                    // No explicit freshness at all.
                    return format!("bare #{n}").into_response();
                } else if uri.path() == "/fail" {
                    // A server error without explicit freshness; the body tells which origin
                    // request made it.
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("x-origin-error", "1")],
                        format!("down #{n}"),
                    )
                        .into_response();
                } else if let Some(shape) = uri.path().strip_prefix("/shape/") {
                    // The response shapes of `balancer.rs`, each body naming its load.
                    return balancer::shape(shape, n);
                } else if uri.path() == "/big" {
                    big_body()
                } else if uri.path() == "/large" {
                    large_body()
                } else {
                    origin_body(&path)
                };
                (
                    [
                        (header::CACHE_CONTROL, "max-age=60"),
                        (header::CONTENT_TYPE, "application/octet-stream"),
                    ],
                    body,
                )
                    .into_response()
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the origin");
    let addr = listener.local_addr().expect("the origin's address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("the origin serves");
    });
    addr
}

/// A namespace no other run shares, so the key is cold.
fn unique_namespace(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("test-{test}-{}-{nanos}", std::process::id())
}

/// A proxy's arguments: listen on any free port, in front of `origin`, in a namespace of its
/// own for `test`, then `extra`.
fn proxy_args(
    origin: SocketAddr,
    test: &str,
    extra: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut args = vec![
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--origin".to_owned(),
        format!("http://{origin}"),
        "--namespace".to_owned(),
        unique_namespace(test),
    ];
    args.extend(extra);
    args
}

/// The `proxy` example's binary, built (or brought up to date) once per test run, with the
/// profile this test was built with.
fn proxy_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        // target/<profile>/deps/proxy-<hash> -> target/<profile>/examples/proxy
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lives in <target>/<profile>/deps");
        let binary = profile_dir
            .join("examples")
            .join(format!("proxy{}", std::env::consts::EXE_SUFFIX));
        // `cargo test` builds the examples, but `cargo test --test proxy` does not, and an
        // earlier build may be stale: ask cargo, which does nothing if it is up to date.
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "--example", "proxy"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        // Cargo describes the package to this test at run time (`CARGO_PKG_NAME`, ...), not to
        // the outer build; `ring` (under `tls`) rebuilds when any such variable changes, and
        // with it everything above it, twice per run. The nested build must not see them.
        for (name, _) in std::env::vars_os() {
            let name_text = name.to_string_lossy();
            if name_text.starts_with("CARGO_PKG_")
                || name_text.starts_with("CARGO_MANIFEST_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "OUT_DIR",
                ]
                .contains(&&*name_text)
            {
                build.env_remove(&name);
            }
        }
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        // The features this test was built with (list new ones here), so the nested build
        // reuses the library artifacts instead of rebuilding them with other features.
        let features: &[&str] = &[
            #[cfg(feature = "redis")]
            "redis",
            #[cfg(feature = "cluster")]
            "cluster",
            #[cfg(feature = "sentinel")]
            "sentinel",
            #[cfg(feature = "tls")]
            "tls",
            #[cfg(feature = "metrics")]
            "metrics",
        ];
        if !features.is_empty() {
            build.args(["--features", &features.join(",")]);
        }
        let output = build
            .output()
            .expect("run cargo to build the proxy example");
        if !output.status.success() && !binary.exists() {
            panic!(
                "`cargo build --example proxy` failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        if !output.status.success() {
            eprintln!(
                "warning: `cargo build --example proxy` failed; using the existing {}:\n{}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        assert!(
            binary.exists(),
            "{} does not exist after `cargo build --example proxy`; is CARGO_TARGET_DIR or the \
             profile different from this test's?",
            binary.display()
        );
        binary
    })
}

/// A running `proxy` process, killed when dropped.
struct Proxy {
    child: Child,
    addr: SocketAddr,
    /// Where it serves metrics, if it was asked to (`--metrics`): read by the metrics test
    /// alone, which needs the `metrics` feature.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    metrics: Option<SocketAddr>,
}

impl Proxy {
    /// Starts a proxy and waits (up to [`LIMIT`]) for its `listening on ADDR` line.
    fn start(args: &[&str]) -> Proxy {
        let mut child = Command::new(proxy_binary())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the proxy example");
        let stdout = child.stdout.take().expect("the proxy's stdout");
        // Kill the child if anything below panics.
        let mut guard = Started(Some(child));

        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            // Reads to the end, so the proxy never blocks on a full pipe.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Once nobody listens any more, this keeps draining.
                let _ = lines.send(line);
            }
        });

        let deadline = Instant::now() + LIMIT;
        let mut metrics = None;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match received.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("metrics on ") {
                        metrics = addr.trim().parse::<SocketAddr>().ok();
                    }
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        break addr
                            .trim()
                            .parse::<SocketAddr>()
                            .unwrap_or_else(|e| panic!("bad address in {line:?}: {e}"));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("proxy {args:?} did not print `listening on` within {LIMIT:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = guard.0.as_mut().map(|c| c.wait());
                    panic!("proxy {args:?} exited before listening: {status:?}")
                }
            }
        };
        let child = guard.0.take().expect("the child is still guarded");
        Proxy {
            child,
            addr,
            metrics,
        }
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{path_and_query}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process not yet handed to its [`Proxy`]: killed if it is dropped here.
struct Started(Option<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `proxies` proxies hold their connections to `redis` (besides this one's): two
/// each, for its commands and its subscriber. A proxy opens its store in the background
/// (`RedisStore::open`), and a request it serves before its connection is up loads with
/// in-process protection only (as a proxy started while Redis is down does), which a test of
/// what the proxies share must not meet.
async fn wait_for_connections(redis: &RedisServer, proxies: usize) {
    let count = 2 * proxies;
    let mut connection = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query_async(&mut connection)
            .await
            .unwrap();
        let clients = info
            .lines()
            .find_map(|line| line.strip_prefix("connected_clients:"))
            .and_then(|clients| clients.trim().parse::<usize>().ok());
        if clients.is_some_and(|clients| clients > count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{proxies} proxies never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts `count` proxies (in parallel) with the same arguments.
async fn start_proxies(count: usize, args: Vec<String>) -> Vec<Proxy> {
    let args = Arc::new(args);
    let starting: Vec<_> = (0..count)
        .map(|_| {
            let args = Arc::clone(&args);
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Proxy::start(&args)
            })
        })
        .collect();
    let mut proxies = Vec::with_capacity(count);
    for start in starting {
        proxies.push(start.await.expect("starting a proxy panicked"));
    }
    proxies
}

/// The soft limit on open files of this process, where the system tells.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// An HTTP client. It speaks HTTP/1.1 (one connection per request in flight) unless this
/// process may not open that many sockets; then it speaks HTTP/2, which the proxy accepts too.
fn client(in_flight: usize) -> Client<HttpConnector, Full<Bytes>> {
    let mut builder = Client::builder(TokioExecutor::new());
    let room = open_files_limit().unwrap_or(u64::MAX);
    if room < in_flight as u64 + 256 {
        eprintln!("open files limited to {room}: the client speaks HTTP/2");
        builder.http2_only(true);
    }
    builder.build_http()
}

/// One response, read to the end.
struct Answer {
    status: StatusCode,
    x_cache: Option<String>,
    headers: HeaderMap,
    body: Bytes,
    latency: Duration,
}

impl Answer {
    /// The layer's `Cache-Status` member (the last), or `""`.
    fn cache_status(&self) -> &str {
        let mut members = self.headers.get_all("cache-status").iter();
        members.next_back().map_or("", |v| v.to_str().unwrap_or(""))
    }

    /// Whether this response is its own request's load (forwarded, not collapsed onto
    /// another's: that is a `MISS` too, RFC 9211 §3).
    fn own_load(&self) -> bool {
        let ours = self.cache_status();
        ours.contains("; fwd=") && !ours.contains("; collapsed")
    }
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<Answer, String> {
    let started = Instant::now();
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status();
        let x_cache = response
            .headers()
            .get("x-cache")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?
            .to_bytes();
        Ok(Answer {
            status,
            x_cache,
            headers,
            body,
            latency: started.elapsed(),
        })
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .map_err(|_| format!("no answer within {LIMIT:?}"))?
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::default()).expect("a request")
}

/// `requests` concurrent GETs of `path`, spread round robin over `proxies` and released
/// together; each answer, or why there is none, in the order they were sent.
async fn burst(proxies: &[Proxy], requests: usize, path: &str) -> Vec<Result<Answer, String>> {
    burst_with(proxies, requests, path, |_| Vec::new()).await
}

/// Header fields to send.
type Headers = Vec<(&'static str, String)>;

/// As [`burst`], the `i`th request with the headers `headers(i)`.
async fn burst_with(
    proxies: &[Proxy],
    requests: usize,
    path: &str,
    headers: impl Fn(usize) -> Headers,
) -> Vec<Result<Answer, String>> {
    let client = client(requests);
    let barrier = Arc::new(Barrier::new(requests));
    let tasks: Vec<_> = (0..requests)
        .map(|i| {
            let (client, barrier) = (client.clone(), Arc::clone(&barrier));
            let mut request = get(&proxies[i % proxies.len()].url(path));
            for (name, value) in headers(i) {
                request
                    .headers_mut()
                    .append(name, value.parse().expect("a header value"));
            }
            tokio::spawn(async move {
                barrier.wait().await;
                send(&client, request).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(requests);
    for task in tasks {
        answers.push(
            task.await
                .unwrap_or_else(|panicked| Err(format!("task failed: {panicked}"))),
        );
    }
    answers
}

/// The layer's rule for an origin's server error without explicit freshness, black-box: the
/// requests of a stampede over two proxies that waited for a load get the origin's own `503`
/// (status, headers, body; never a `502` the proxy makes up), loads go one at a time, and a
/// request after the stampede reaches the origin again (the error is not reused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_error_reaches_its_waiters_and_is_not_reused() {
    const REQUESTS: usize = 50;
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let args = proxy_args(
        origin,
        "server-error",
        [
            "--redis".to_owned(),
            redis.url(),
            "--store-timeout-ms".to_owned(),
            "2000".to_owned(),
        ],
    );
    let proxies = start_proxies(2, args).await;
    wait_for_connections(&redis, 2).await;
    let mut bodies = std::collections::BTreeSet::new();
    for answer in burst(&proxies, REQUESTS, "/fail").await {
        let answer = answer.expect("an answer");
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{:?}",
            answer.headers
        );
        assert_eq!(answer.headers["x-origin-error"], "1");
        assert!(answer.body.starts_with(b"down #"), "{:?}", answer.body);
        bodies.insert(answer.body);
    }
    // Each origin request's answer went to the requests that waited for it.
    assert_eq!(bodies.len(), origin_requests.get());
    assert!(
        origin_requests.get() < REQUESTS / 2,
        "{} origin requests for {REQUESTS}",
        origin_requests.get()
    );
    let client = client(1);
    for proxy in &proxies {
        let before = origin_requests.get();
        let answer = send(&client, get(&proxy.url("/fail"))).await.unwrap();
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.body, format!("down #{}", before + 1));
        assert_eq!(origin_requests.get(), before + 1);
    }
}

/// A handler that sets no `Cache-Control` (nor `Expires`), under the proxy's default policy
/// (no default TTL): the response is not stored, but the requests of a stampede over two
/// proxies that waited for its load get it (RFC 9111 §4 lets a cache collapse requests onto a
/// response it could store): one origin load per stampede, and a later stampede loads once
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_response_without_freshness_is_loaded_once_per_stampede() {
    const REQUESTS: usize = 200;
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let proxies = two_proxies(origin, "no-freshness", &redis, &[]).await;
    for stampede in 1..=2 {
        let mut bodies = std::collections::BTreeSet::new();
        for answer in burst(&proxies, REQUESTS, "/bare").await {
            let answer = answer.expect("an answer");
            assert_eq!(answer.status, StatusCode::OK);
            bodies.insert(answer.body);
        }
        println!(
            "stampede {stampede}: {REQUESTS} GETs of /bare over 2 proxies: origin loads so far {}",
            origin_requests.get()
        );
        assert_eq!(
            origin_requests.get(),
            stampede,
            "stampede {stampede}: one origin load each, nothing stored ({bodies:?})"
        );
        assert_eq!(bodies.len(), 1, "{bodies:?}");
    }
}

/// A 2 MiB `max-age=60` body, over the proxy's `--max-body-bytes` (the layer's default,
/// 1 MiB): not stored, but loaded at most once per proxy in a stampede of 200 requests over
/// two proxies, and every client gets all of it, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_limit_is_loaded_once_per_proxy_in_a_stampede() {
    const REQUESTS: usize = 200;
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let proxies = two_proxies(origin, "large", &redis, &[]).await;
    let expected = large_body();
    for answer in burst(&proxies, REQUESTS, "/large").await {
        let answer = answer.expect("an answer");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.body.len(), expected.len());
        assert!(
            answer.body == expected,
            "the body differs from the origin's"
        );
    }
    println!(
        "{REQUESTS} GETs of a 2 MiB body over 2 proxies: origin loads {}",
        origin_requests.get()
    );
    assert!(
        origin_requests.get() <= proxies.len(),
        "{} origin loads for {REQUESTS} requests over {} proxies",
        origin_requests.get(),
        proxies.len()
    );
}

/// RFC 9111 §4.2.2: a shared cache should not invent freshness for everything. By default (and
/// with `--ttl-secs 0`) the proxy stores no response without explicit freshness; with
/// `--ttl-secs S` it stores those with a status cacheable by default for S seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_proxy_invents_no_freshness_unless_told_to() {
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let client = client(1);
    for (ttl, marks) in [
        (None, ["BYPASS", "BYPASS"]),
        (Some("0"), ["BYPASS", "BYPASS"]),
        (Some("60"), ["MISS", "HIT"]),
    ] {
        let extra = ttl.map(|s| vec!["--ttl-secs".to_owned(), s.to_owned()]);
        let args = proxy_args(origin, "ttl", extra.unwrap_or_default());
        let proxy = start_proxies(1, args).await.remove(0);
        let before = origin_requests.get();
        for mark in marks {
            let answer = send(&client, get(&proxy.url("/bare"))).await.unwrap();
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(answer.x_cache.as_deref(), Some(mark), "--ttl-secs {ttl:?}");
        }
        let loads = if marks[1] == "HIT" { 1 } else { 2 };
        assert_eq!(origin_requests.get(), before + loads, "--ttl-secs {ttl:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stampede_over_three_proxies_loads_the_origin_once() {
    const REQUESTS: usize = 1000;
    const PATH: &str = "/hot?x=1";

    let redis = RedisServer::start();
    let origin_loads = Counter::default();
    let origin = start_origin(origin_loads.clone()).await;
    let args = proxy_args(
        origin,
        "stampede",
        [
            "--redis".to_owned(),
            redis.url(),
            // 1000 connections on a 2-core machine can starve a proxy's runtime for longer than
            // the 250 ms default; a store call that times out falls back to in-process protection,
            // which is right in production but would make this count flaky.
            "--store-timeout-ms".to_owned(),
            "2000".to_owned(),
        ],
    );
    let proxies = start_proxies(3, args).await;
    wait_for_connections(&redis, 3).await;

    let started = Instant::now();
    let mut answers = Vec::with_capacity(REQUESTS);
    let mut errors = Vec::new();
    for answer in burst(&proxies, REQUESTS, PATH).await {
        match answer {
            Ok(answer) => answers.push(answer),
            Err(error) => errors.push(error),
        }
    }
    let elapsed = started.elapsed();

    let expected = origin_body(PATH);
    let count = |mark: &str| {
        answers
            .iter()
            .filter(|a| a.x_cache.as_deref() == Some(mark))
            .count()
    };
    let misses = answers.iter().filter(|a| a.own_load()).count();
    let collapsed = answers
        .iter()
        .filter(|a| a.cache_status().ends_with("; collapsed"))
        .count();
    let hits = count("HIT") + collapsed;
    let mut latencies: Vec<_> = answers.iter().map(|a| a.latency).collect();
    latencies.sort();
    let percentile = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .map_or(0, |d| d.as_millis())
    };
    println!(
        "{REQUESTS} GETs over {} proxies in {} ms: origin loads {}, MISS {misses}, HIT {hits}, \
         errors {}, latency p50 {} ms, p99 {} ms, max {} ms",
        proxies.len(),
        elapsed.as_millis(),
        origin_loads.get(),
        errors.len(),
        percentile(50),
        percentile(99),
        percentile(100),
    );

    assert!(
        errors.is_empty(),
        "{} requests failed, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert_eq!(answers.len(), REQUESTS);
    for answer in &answers {
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "x-cache {:?}",
            answer.x_cache
        );
        assert!(
            answer.body == expected,
            "a body differs from the origin's ({} bytes, x-cache {:?})",
            answer.body.len(),
            answer.x_cache
        );
    }
    assert_eq!(
        origin_loads.get(),
        1,
        "the origin was loaded more than once"
    );
    assert_eq!(misses, 1, "exactly one response is the load's own");
    assert_eq!(
        hits,
        REQUESTS - 1,
        "every other response is a hit, or collapsed onto the load"
    );
    assert_eq!(
        count("MISS"),
        misses + collapsed,
        "x-cache tells what fwd does"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn posts_reach_the_origin_and_large_bodies_stream_through() {
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let args = proxy_args(
        origin,
        "bypass",
        ["--max-body-bytes".to_owned(), "1000".to_owned()],
    );
    let proxy = start_proxies(1, args).await.remove(0);
    let client = client(4);

    // Every POST reaches the origin, body and all, and says what became of the URL (the
    // first invalidates it, the second within the interval is coalesced).
    let details = ["invalidated", "invalidation-coalesced"];
    for (n, (payload, detail)) in ["first", "second"].into_iter().zip(details).enumerate() {
        let request = Request::post(proxy.url("/submit"))
            .body(Full::new(Bytes::from(payload)))
            .expect("a request");
        let answer = send(&client, request)
            .await
            .expect("POST through the proxy");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.x_cache.as_deref(), Some("BYPASS"));
        assert_eq!(
            answer.cache_status(),
            format!("tower-stampede; fwd=method; fwd-status=200; detail={detail}")
        );
        assert_eq!(answer.body, format!("posted:{payload}").as_bytes());
        assert_eq!(origin_requests.get(), n + 1, "each POST reaches the origin");
    }
    assert_eq!(origin_requests.get(), 2);

    // A body over --max-body-bytes is not stored: it streams through intact, every time.
    let expected = big_body();
    for n in 1..=2 {
        let answer = send(&client, get(&proxy.url("/big")))
            .await
            .expect("GET /big through the proxy");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.x_cache.as_deref(), Some("BYPASS"));
        assert_eq!(answer.body.len(), expected.len());
        assert!(answer.body == expected, "the large body differs");
        assert_eq!(
            origin_requests.get(),
            2 + n,
            "an unstored body is loaded again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_responses_are_served_while_one_proxy_refreshes() {
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let args = proxy_args(
        origin,
        "stale",
        [
            "--redis".to_owned(),
            redis.url(),
            "--stale-secs".to_owned(),
            "60".to_owned(),
            "--early-refresh-beta".to_owned(),
            "0".to_owned(),
            "--store-timeout-ms".to_owned(),
            "2000".to_owned(),
        ],
    );
    let proxies = start_proxies(2, args).await;
    wait_for_connections(&redis, 2).await;
    let client = client(64);

    let first = send(&client, get(&proxies[0].url("/short"))).await.unwrap();
    assert_eq!(first.x_cache.as_deref(), Some("MISS"));
    assert_eq!(first.body, "load 1");
    // Past its one second of freshness, within the stale window.
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let requests: Vec<_> = (0..20)
        .map(|i| {
            let (client, url) = (client.clone(), proxies[i % 2].url("/short"));
            tokio::spawn(async move { send(&client, get(&url)).await })
        })
        .collect();
    for request in requests {
        let answer = request.await.unwrap().unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.x_cache.as_deref(), Some("STALE"));
        assert_eq!(answer.body, "load 1");
    }

    // One request refreshed it, in the background, for both proxies.
    let deadline = Instant::now() + LIMIT;
    loop {
        let answer = send(&client, get(&proxies[1].url("/short"))).await.unwrap();
        if answer.body == "load 2" {
            assert_eq!(answer.x_cache.as_deref(), Some("HIT"));
            break;
        }
        assert!(Instant::now() < deadline, "the refresh never landed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(origin_requests.get(), 2);
}

#[test]
fn bad_refresh_and_key_settings_are_usage_errors() {
    for (flag, value) in [
        ("--early-refresh-beta", "-1"),
        ("--early-refresh-beta", "NaN"),
        ("--stale-secs", "soon"),
        ("--cache-authority", "user@shop.example"),
        ("--cache-authority", "shop example"),
    ] {
        let output = Command::new(proxy_binary())
            .args(["--listen", "127.0.0.1:0", "--origin", "http://127.0.0.1:1"])
            .args([flag, value])
            .output()
            .expect("run the proxy example");
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
}

#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_serves_prometheus_metrics() {
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let args = proxy_args(
        origin,
        "metrics",
        ["--metrics".to_owned(), "127.0.0.1:0".to_owned()],
    );
    // Every metric carries the cache's namespace, so two caches of one process are told apart.
    let namespace = args[5].clone();
    let proxy = start_proxies(1, args).await.remove(0);
    let client = client(4);
    let miss = send(&client, get(&proxy.url("/page"))).await.unwrap();
    assert_eq!(miss.x_cache.as_deref(), Some("MISS"));
    let hit = send(&client, get(&proxy.url("/page"))).await.unwrap();
    assert_eq!(hit.x_cache.as_deref(), Some("HIT"));
    // A stampede on one proxy: the requests that joined the leader's flight waited for it.
    let stampede = burst(std::slice::from_ref(&proxy), 50, "/hot").await;
    assert!(stampede
        .iter()
        .all(|a| a.as_ref().is_ok_and(|a| a.status == StatusCode::OK)));
    let metrics = proxy.metrics.expect("the proxy printed `metrics on ADDR`");
    let scraped = send(&client, get(&format!("http://{metrics}/metrics")))
        .await
        .unwrap();
    assert_eq!(scraped.status, StatusCode::OK);
    // A scrape is of this instance, now: no cache between may keep it.
    assert_eq!(scraped.headers["cache-control"], "no-store");
    let text = String::from_utf8_lossy(&scraped.body);
    for line in [
        format!("stampede_lookups_total{{cache=\"{namespace}\",outcome=\"miss-leader\"}} 2"),
        format!("stampede_loads_total{{cache=\"{namespace}\"}} 2"),
        format!("stampede_lock_total{{cache=\"{namespace}\",event=\"acquired\"}} 2"),
        "# TYPE stampede_load_duration_seconds histogram".to_owned(),
        "# TYPE stampede_follower_wait_seconds histogram".to_owned(),
        format!("stampede_load_duration_seconds_bucket{{cache=\"{namespace}\",le=\"0.001\"}} 0"),
        format!("stampede_load_duration_seconds_bucket{{cache=\"{namespace}\",le=\"30\"}} 2"),
        format!("stampede_load_duration_seconds_count{{cache=\"{namespace}\"}} 2"),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    for family in [
        "stampede_lookups_total",
        "stampede_loads_total",
        "stampede_load_duration_seconds",
        "stampede_lock_total",
        "stampede_follower_wait_seconds",
        "stampede_l1_bytes",
    ] {
        let help = format!("# HELP {family} ");
        assert!(
            text.lines().any(|l| l.starts_with(&help)),
            "no {help:?} in:\n{text}"
        );
    }
    // Every request of the stampede but the leader's joined its flight or hit L1 after it.
    let count = |prefix: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let joined = count(&format!(
        "stampede_follower_wait_seconds_count{{cache=\"{namespace}\",ended=\"joined\"}}"
    ));
    let followers = count(&format!(
        "stampede_lookups_total{{cache=\"{namespace}\",outcome=\"follower\"}}"
    ));
    let hits = count(&format!(
        "stampede_lookups_total{{cache=\"{namespace}\",outcome=\"hit-l1\"}}"
    ));
    assert!(joined >= 1, "{text}");
    assert_eq!(joined, followers, "{text}");
    assert_eq!(followers + hits, 49 + 1, "{text}");
    assert_eq!(origin_requests.get(), 2);
}

#[test]
fn redis_and_redis_cluster_together_are_a_usage_error() {
    let output = Command::new(proxy_binary())
        .args(["--listen", "127.0.0.1:0", "--origin", "http://127.0.0.1:1"])
        .args(["--redis", "redis://127.0.0.1:1/"])
        .args([
            "--redis-cluster",
            "redis://127.0.0.1:2/,redis://127.0.0.1:3/",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run the proxy example");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--redis and --redis-cluster are mutually exclusive"),
        "{stderr}"
    );
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stampede_over_two_proxies_on_a_redis_cluster_loads_the_origin_once() {
    const REQUESTS: usize = 100;
    const PATH: &str = "/hot?on=cluster";

    let cluster = RedisCluster::start();
    let origin_loads = Counter::default();
    let origin = start_origin(origin_loads.clone()).await;
    let args = proxy_args(
        origin,
        "cluster",
        [
            "--redis-cluster".to_owned(),
            cluster.urls().join(","),
            // As in the stampede over one Redis: a timed-out store call would degrade to
            // in-process protection and make the count flaky.
            "--store-timeout-ms".to_owned(),
            "2000".to_owned(),
        ],
    );
    let proxies = start_proxies(2, args).await;

    let expected = origin_body(PATH);
    let mut misses = 0;
    for answer in burst(&proxies, REQUESTS, PATH).await {
        let answer = answer.expect("an answer");
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "x-cache {:?}",
            answer.x_cache
        );
        assert!(answer.body == expected, "a body differs from the origin's");
        misses += usize::from(answer.own_load());
    }
    assert_eq!(
        origin_loads.get(),
        1,
        "the origin was loaded more than once"
    );
    assert_eq!(misses, 1, "exactly one response is the load's own");
}

/// A request with `method`, `headers` and an empty body.
fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::default()).expect("a request")
}

/// `GET`s `path` on `proxy` until the body is `want` (the change has reached that proxy),
/// within [`LIMIT`]; returns that answer.
async fn eventually(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: &Proxy,
    path: &str,
    want: &str,
) -> Answer {
    let deadline = Instant::now() + LIMIT;
    loop {
        let answer = send(client, get(&proxy.url(path))).await.unwrap();
        if answer.body == want {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: still {:?}, never {want:?}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `path` cached in every proxy's memory: loaded through the first, then read by each.
async fn cached_everywhere(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxies: &[Proxy],
    path: &str,
) -> Bytes {
    let first = send(client, get(&proxies[0].url(path))).await.unwrap();
    assert_eq!(first.x_cache.as_deref(), Some("MISS"), "{path}");
    for proxy in proxies.iter().chain(proxies) {
        let hit = send(client, get(&proxy.url(path))).await.unwrap();
        assert_eq!(hit.x_cache.as_deref(), Some("HIT"), "{path}");
        assert_eq!(hit.body, first.body, "{path}");
    }
    first.body
}

/// Two proxies over one `redis-server`, with `extra` arguments.
async fn two_proxies(
    origin: SocketAddr,
    test: &str,
    redis: &RedisServer,
    extra: &[&str],
) -> Vec<Proxy> {
    let mut args = vec![
        "--redis".to_owned(),
        redis.url(),
        "--store-timeout-ms".to_owned(),
        "2000".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let proxies = start_proxies(2, proxy_args(origin, test, args)).await;
    wait_for_connections(redis, 2).await;
    proxies
}

/// `Cookie: session=...` with the header value `cookie`, on `proxy`.
async fn as_user(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: &Proxy,
    path: &str,
    cookie: &str,
) -> Answer {
    let request = request("GET", &proxy.url(path), &[("cookie", cookie)]);
    send(client, request).await.unwrap()
}

/// The scenario through two proxies with `--ttl-secs 30`: a page that greets the user
/// from the session cookie and says nothing of its freshness goes to each user as their own
/// (RFC 9111 §3.5, applied to `Cookie` as to `Authorization`; no invented freshness for it);
/// a page that says `public` is shared. `--ignore-cookie` names a cookie that personalises
/// nothing: requests with it alone are cached; `--ignore-all-cookies` shares every page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_user_gets_their_own_page_through_the_proxies() {
    let redis = RedisServer::start();
    let origin = start_origin(Counter::default()).await;
    let client = client(1);
    let proxies = two_proxies(origin, "cookies", &redis, &["--ttl-secs", "30"]).await;
    for (proxy, user) in [(0, "alice"), (1, "bob"), (0, "bob"), (1, "alice")] {
        let cookie = format!("session={user}");
        let answer = as_user(&client, &proxies[proxy], "/dash", &cookie).await;
        let body = String::from_utf8_lossy(&answer.body).into_owned();
        assert!(
            body.starts_with(&format!("hello {cookie} #")),
            "{user} got {body:?}"
        );
        assert_eq!(answer.x_cache.as_deref(), Some("BYPASS"), "{user}");
    }
    let alice = as_user(&client, &proxies[0], "/dash-public", "session=alice").await;
    let bob = as_user(&client, &proxies[1], "/dash-public", "session=bob").await;
    assert_eq!(
        [alice.x_cache.as_deref(), bob.x_cache.as_deref()],
        [Some("MISS"), Some("HIT")]
    );
    assert_eq!(bob.body, alice.body, "the page said it may be shared");

    let extra = [
        "--ttl-secs",
        "30",
        "--ignore-cookie",
        "_ga",
        "--ignore-cookie",
        "consent",
    ];
    let proxies = two_proxies(origin, "ignored-cookies", &redis, &extra).await;
    let first = as_user(&client, &proxies[0], "/dash", "_ga=1; consent=yes").await;
    let second = as_user(&client, &proxies[1], "/dash", "_ga=2").await;
    assert_eq!(
        [first.x_cache.as_deref(), second.x_cache.as_deref()],
        [Some("MISS"), Some("HIT")]
    );
    let personal = as_user(&client, &proxies[1], "/dash", "_ga=2; session=bob").await;
    assert_eq!(personal.x_cache.as_deref(), Some("BYPASS"));
    assert!(personal.body.starts_with(b"hello _ga=2; session=bob #"));

    let extra = ["--ttl-secs", "30", "--ignore-all-cookies"];
    let proxies = two_proxies(origin, "all-cookies", &redis, &extra).await;
    let first = as_user(&client, &proxies[0], "/dash", "session=alice").await;
    let second = as_user(&client, &proxies[1], "/dash", "session=bob").await;
    assert_eq!(
        [first.x_cache.as_deref(), second.x_cache.as_deref()],
        [Some("MISS"), Some("HIT")],
        "--ignore-all-cookies shares everything"
    );
}

/// Cache poisoning through the proxies, one attacker's request then plain ones: a method
/// override, a `GET` with a body and a forwarded host spelled `x_forwarded_host` each go to
/// the origin uncached; a forwarded host, a forwarded port and a rewritten URL are part of
/// the key (issue 40), so each is stored as a variant that only the attacker's own value
/// reads; and the victims (on either proxy) get the page the URL names. A header the load
/// balancer sets (`--trust-header`) is cached, and left out of the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_attackers_request_becomes_the_page_of_the_proxies() {
    let redis = RedisServer::start();
    let origin = start_origin(Counter::default()).await;
    let client = client(1);
    let extra = ["--trust-header", "x-forwarded-proto"];
    let proxies = two_proxies(origin, "poisoning", &redis, &extra).await;
    let with_body = |url: &str| {
        Request::get(url)
            .body(Full::new(Bytes::from_static(b"q=POISON")))
            .expect("a request")
    };
    let attacks = [
        request(
            "GET",
            &proxies[0].url("/reflect?1"),
            &[("x-http-method-override", "DELETE")],
        ),
        with_body(&proxies[0].url("/reflect?2")),
        request(
            "GET",
            &proxies[0].url("/reflect?3"),
            &[("x-forwarded-host", "evil.example")],
        ),
        request(
            "GET",
            &proxies[0].url("/reflect?4"),
            &[("x-original-url", "/admin")],
        ),
        request(
            "GET",
            &proxies[0].url("/reflect?5"),
            &[("x_forwarded_host", "evil.example")],
        ),
        request(
            "GET",
            &proxies[0].url("/reflect?6"),
            &[("x-forwarded-port", "1337")],
        ),
    ];
    // The attacks whose header is part of the key: `x-forwarded-host`, `x-original-url`,
    // `x-forwarded-port`.
    let keyed = [2, 3, 5];
    for (i, attack) in attacks.into_iter().enumerate() {
        let path = format!("/reflect?{}", i + 1);
        let repeat = {
            let mut again = Request::get(proxies[1].url(&path))
                .body(Full::default())
                .unwrap();
            *again.headers_mut() = attack.headers().clone();
            again
        };
        let attacked = send(&client, attack).await.unwrap();
        if keyed.contains(&i) {
            // Stored for its own value alone.
            assert_eq!(attacked.x_cache.as_deref(), Some("MISS"), "{path}");
        } else {
            // Passed: a bypass, or (the override to `DELETE`) unmarked, as a `DELETE` is.
            assert!(
                matches!(attacked.x_cache.as_deref(), Some("BYPASS") | None),
                "{path}: {:?}",
                attacked.x_cache
            );
        }
        let honest = "<a href=\"http://origin/next\"> ";
        for proxy in [&proxies[1], &proxies[0]] {
            let victim = send(&client, get(&proxy.url(&path))).await.unwrap();
            assert_eq!(String::from_utf8_lossy(&victim.body), honest, "{path}");
        }
        if keyed.contains(&i) {
            let again = send(&client, repeat).await.unwrap();
            assert_eq!(
                (again.x_cache.as_deref(), &again.body),
                (Some("HIT"), &attacked.body),
                "{path}: the variant only the attacker's value reads"
            );
        }
    }
    let proto = [("x-forwarded-proto", "https")];
    let first = send(
        &client,
        request("GET", &proxies[0].url("/reflect?lb"), &proto),
    )
    .await;
    let second = send(
        &client,
        request("GET", &proxies[1].url("/reflect?lb"), &proto),
    )
    .await;
    assert_eq!(
        [first.unwrap().x_cache, second.unwrap().x_cache].map(|mark| mark.unwrap_or_default()),
        ["MISS", "HIT"],
        "--trust-header"
    );
}

/// RFC 9111 §4.4 across processes: a `POST` through proxy A evicts the page that proxy B
/// held in memory; the next `GET`s on both reach the origin once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_through_one_proxy_evicts_the_page_from_the_others_memory() {
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let proxies = two_proxies(origin, "post-evicts", &redis, &[]).await;
    let client = client(8);
    let (a, b) = (&proxies[0], &proxies[1]);

    assert_eq!(
        cached_everywhere(&client, &proxies, "/counted").await,
        "load 1"
    );
    let posted = send(&client, request("POST", &a.url("/counted"), &[]))
        .await
        .unwrap();
    assert_eq!(posted.status, StatusCode::OK);
    assert_eq!(posted.body, "posted:", "the origin's own answer");
    assert_eq!(origin_requests.get(), 2);

    let reloaded = eventually(&client, b, "/counted", "load 3").await;
    assert_eq!(reloaded.x_cache.as_deref(), Some("MISS"));
    let from_b = send(&client, get(&a.url("/counted"))).await.unwrap();
    assert_eq!(
        (from_b.x_cache.as_deref(), &from_b.body[..]),
        (Some("HIT"), &b"load 3"[..])
    );
    assert_eq!(origin_requests.get(), 3, "one load between the two proxies");
}

/// `--cache-authority`: proxies in front of copies of one site at different addresses (each
/// proxy its own origin, so each keyed its own origin's URLs) key by one authority, so they
/// share one cache: a cold stampede over both loads once, and a `POST` through one is seen by
/// the other's next `GET` (RFC 9111 §4.4 across proxies).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxies_keyed_by_one_cache_authority_share_one_cache() {
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let namespace = unique_namespace("cache-authority");
    let mut proxies = Vec::new();
    for _ in 0..2 {
        let origin = start_origin(origin_requests.clone()).await;
        let args = [
            "--listen",
            "127.0.0.1:0",
            "--origin",
            &format!("http://{origin}"),
            "--namespace",
            &namespace,
            "--redis",
            &redis.url(),
            "--store-timeout-ms",
            "2000",
            "--cache-authority",
            "shop.example",
        ];
        proxies.extend(start_proxies(1, args.map(str::to_owned).to_vec()).await);
    }
    for answer in burst(&proxies, 40, "/hot").await {
        let answer = answer.unwrap();
        assert_eq!(answer.body, origin_body("/hot"));
    }
    assert_eq!(origin_requests.get(), 1, "one load for both proxies");

    let client = client(8);
    let (a, b) = (&proxies[0], &proxies[1]);
    assert_eq!(
        cached_everywhere(&client, &proxies, "/counted").await,
        "load 2"
    );
    let posted = send(&client, request("POST", &a.url("/counted"), &[]))
        .await
        .unwrap();
    assert_eq!(posted.body, "posted:", "the origin's own answer");
    let reloaded = eventually(&client, b, "/counted", "load 4").await;
    assert_eq!(reloaded.x_cache.as_deref(), Some("MISS"));
    assert_eq!(origin_requests.get(), 4);
}

/// `--purge-token`: a `PURGE` without `Authorization: Bearer TOKEN` (or with another token)
/// gets 403, removes nothing and never reaches the origin; with it, 200, and the page is gone
/// from both proxies. A `PURGE` with `Surrogate-Key` purges those tags; tags never reach
/// clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purge_needs_the_token_and_then_removes_the_page_everywhere() {
    const TOKEN: &str = "s3cret-Token_1";
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let proxies = two_proxies(origin, "purge", &redis, &["--purge-token", TOKEN]).await;
    let client = client(8);
    let (a, b) = (&proxies[0], &proxies[1]);
    let allowed = format!("Bearer {TOKEN}");

    assert_eq!(
        cached_everywhere(&client, &proxies, "/counted").await,
        "load 1"
    );
    for headers in [
        &[][..],
        &[("authorization", "Bearer s3cret-Token_2")],
        &[("authorization", "Basic czNjcmV0LVRva2VuXzE=")],
        &[("authorization", TOKEN)],
    ] {
        let refused = send(&client, request("PURGE", &a.url("/counted"), headers))
            .await
            .unwrap();
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{headers:?}");
    }
    assert_eq!(origin_requests.get(), 1, "no PURGE reached the origin");
    for proxy in &proxies {
        let kept = send(&client, get(&proxy.url("/counted"))).await.unwrap();
        assert_eq!(
            (kept.x_cache.as_deref(), &kept.body[..]),
            (Some("HIT"), &b"load 1"[..])
        );
    }

    let purged = send(
        &client,
        request("PURGE", &b.url("/counted"), &[("authorization", &allowed)]),
    )
    .await
    .unwrap();
    assert_eq!(purged.status, StatusCode::OK);
    assert_eq!(
        origin_requests.get(),
        1,
        "the PURGE never reached the origin"
    );
    let reloaded = eventually(&client, a, "/counted", "load 2").await;
    assert_eq!(reloaded.x_cache.as_deref(), Some("MISS"));
    eventually(&client, b, "/counted", "load 2").await;
    assert_eq!(origin_requests.get(), 2, "one load between the two proxies");

    // Tags: `a b` on the page, kept from clients; a purge of `b` removes it.
    let tagged = cached_everywhere(&client, &proxies, "/counted?tags=a+b").await;
    assert_eq!(tagged, "load 3");
    let answer = send(&client, get(&b.url("/counted?tags=a+b")))
        .await
        .unwrap();
    assert!(
        !answer.headers.contains_key("surrogate-key"),
        "kept from clients"
    );
    let headers = [("authorization", allowed.as_str()), ("surrogate-key", "b")];
    let purged = send(&client, request("PURGE", &a.url("/"), &headers))
        .await
        .unwrap();
    assert_eq!(purged.status, StatusCode::OK);
    let reloaded = eventually(&client, b, "/counted?tags=a+b", "load 4").await;
    assert!(!reloaded.headers.contains_key("surrogate-key"));
    eventually(&client, a, "/counted?tags=a+b", "load 4").await;
}

/// Without `--purge-token`, a `PURGE` is passed to the origin like any unknown method, and,
/// being unsafe, its non-error answer invalidates the URL (RFC 9111 §4.4).
#[tokio::test(flavor = "multi_thread")]
async fn without_a_token_purge_goes_to_the_origin() {
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let proxy = start_proxies(1, proxy_args(origin, "no-purge", [])).await;
    let client = client(4);
    assert_eq!(
        cached_everywhere(&client, &proxy, "/counted").await,
        "load 1"
    );
    let passed = send(&client, request("PURGE", &proxy[0].url("/counted"), &[]))
        .await
        .unwrap();
    assert_eq!(passed.status, StatusCode::OK);
    assert_eq!(passed.body, "load 2", "the origin's answer");
    assert_eq!(origin_requests.get(), 2, "the PURGE reached the origin");
    let reloaded = send(&client, get(&proxy[0].url("/counted"))).await.unwrap();
    assert_eq!(reloaded.body, "load 3");
}

#[test]
fn bad_purge_tokens_are_usage_errors() {
    for token in ["", "two words", "tab\there"] {
        let output = Command::new(proxy_binary())
            .args(["--listen", "127.0.0.1:0", "--origin", "http://127.0.0.1:1"])
            .args(["--purge-token", token])
            .stdin(Stdio::null())
            .output()
            .expect("run the proxy example");
        assert_eq!(output.status.code(), Some(2), "{token:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--purge-token"), "{token:?}: {stderr}");
        assert!(
            token.is_empty() || !stderr.contains(token),
            "{token:?}: the token is not printed: {stderr}"
        );
    }
}

/// How long proxies stay idle after Redis is back before a stampede: longer than a store's
/// reconnect backoff (at most 1 s between attempts, plus as much jitter); an idle spell that
/// is part of the scenario, not a wait for speed.
const IDLE_AFTER_REDIS: Duration = Duration::from_secs(3);

/// The arguments of a proxy over `redis`, with a store timeout that a starved runtime does
/// not reach (see `a_stampede_over_three_proxies_loads_the_origin_once`).
fn patient_redis(redis: &RedisServer) -> [String; 4] {
    [
        "--redis".to_owned(),
        redis.url(),
        "--store-timeout-ms".to_owned(),
        "2000".to_owned(),
    ]
}

/// A stampede over the proxies on a cold path: the origin's loads for it, and the answers'
/// errors.
async fn cold_stampede(proxies: &[Proxy], origin_loads: &Counter, path: &str) -> usize {
    let before = origin_loads.get();
    let answers = burst(proxies, 600, path).await;
    let errors: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        errors.is_empty(),
        "{} failed, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    origin_loads.get() - before
}

/// Issue 29, through the proxy: three proxies on one Redis; Redis killed; one request per
/// proxy while it is down (fewer failures than the breaker's threshold); Redis restarted
/// empty on the same port; the proxies idle; then a stampede on a cold path loads the origin
/// once. Before, it loaded it once per proxy: each proxy's first lookup was handed the
/// failure of its connection's last reconnect attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_redis_blip_and_idle_proxies_the_next_stampede_loads_the_origin_once() {
    let mut redis = RedisServer::start();
    let origin_loads = Counter::default();
    let origin = start_origin(origin_loads.clone()).await;
    let args = proxy_args(origin, "blip", patient_redis(&redis));
    let proxies = start_proxies(3, args).await;
    wait_for_connections(&redis, 3).await;
    redis.kill();
    for (n, proxy) in proxies.iter().enumerate() {
        let answer = send(&client(1), get(&proxy.url(&format!("/down?p={n}")))).await;
        assert_eq!(answer.map(|a| a.status), Ok(StatusCode::OK));
    }
    redis.restart();
    tokio::time::sleep(IDLE_AFTER_REDIS).await;
    // Reconnected by themselves, commands and subscribers: within the idle spell on an idle
    // machine, later on a starved one (two suites at once on 2 cores took longer than 3 s),
    // within `LIMIT` or the test fails.
    wait_for_connections(&redis, 3).await;
    let loads = cold_stampede(&proxies, &origin_loads, "/after-blip").await;
    assert_eq!(loads, 1, "the origin was loaded once per proxy, not once");
}

/// Issue 29, through the proxy: proxies started while Redis is down serve at once (with
/// in-process protection), and once Redis is up they connect by themselves: a stampede on a
/// cold path loads the origin once. Before, a proxy could not start without Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxies_started_while_redis_is_down_share_it_once_it_is_up() {
    let mut redis = RedisServer::start();
    redis.kill();
    let origin_loads = Counter::default();
    let origin = start_origin(origin_loads.clone()).await;
    let args = proxy_args(origin, "started-down", patient_redis(&redis));
    let proxies = start_proxies(3, args).await;
    for proxy in &proxies {
        let answer = send(&client(1), get(&proxy.url("/while-down"))).await;
        assert_eq!(answer.map(|a| a.status), Ok(StatusCode::OK));
    }
    redis.restart();
    tokio::time::sleep(IDLE_AFTER_REDIS).await;
    // Reconnected by themselves, commands and subscribers: within the idle spell on an idle
    // machine, later on a starved one (two suites at once on 2 cores took longer than 3 s),
    // within `LIMIT` or the test fails.
    wait_for_connections(&redis, 3).await;
    let loads = cold_stampede(&proxies, &origin_loads, "/after-start").await;
    assert_eq!(loads, 1, "the origin was loaded once per proxy, not once");
}

/// Issue 40, through two proxies on one Redis: 200 concurrent `GET`s of one URL (`max-age=60`)
/// from behind a load balancer, each with `X-Forwarded-Proto: https`, `X-Forwarded-Port: 443`
/// and its own `X-Forwarded-For`, load the origin once; so do 200 with the analytics cookies
/// `_ga` and `_gid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarding_headers_and_analytics_cookies_load_the_origin_once() {
    const REQUESTS: usize = 200;
    let redis = RedisServer::start();
    let origin_loads = Counter::default();
    let origin = start_origin(origin_loads.clone()).await;
    let proxies = two_proxies(origin, "behind-a-balancer", &redis, &[]).await;
    let balancer = |i: usize| {
        vec![
            ("x-forwarded-proto", "https".to_owned()),
            ("x-forwarded-port", "443".to_owned()),
            ("x-forwarded-for", format!("10.0.{}.{}", i / 256, i % 256)),
        ]
    };
    let analytics = |_| vec![("cookie", "_ga=GA1.2.3; _gid=GA1.2.4".to_owned())];
    let bursts: [(&str, &dyn Fn(usize) -> Headers); 2] =
        [("/balanced", &balancer), ("/analytics", &analytics)];
    for (path, headers) in bursts {
        let before = origin_loads.get();
        let answers = burst_with(&proxies, REQUESTS, path, headers).await;
        for answer in answers {
            let answer = answer.expect("an answer");
            assert_eq!(answer.status, StatusCode::OK, "{path}");
            assert_eq!(answer.body, origin_body(path), "{path}");
        }
        assert_eq!(origin_loads.get() - before, 1, "{path}: origin loads");
    }
}
