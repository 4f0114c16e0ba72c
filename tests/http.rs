//! The HTTP layer over axum, with the engine on `MemoryStore` and (feature `redis`) on a real
//! `redis-server`. The memory cases run on paused time, which the layer's clock (`Age`,
//! freshness) follows; the redis cases on real time (`store_test!`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use support::{store_test, wait_until, Counter, Shared};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_stampede::{Cache, StampedeLayer};

/// The apps of a test, each over the shared store.
trait Apps {
    /// An axum app (its own `Cache`, so its own L1) over the shared store.
    fn app(&self, origin: &Counter) -> Router;

    /// Two apps (each its own `Cache`, so its own L1 and flights, as two processes) that
    /// serve `path` with `handler` behind the layer, over the shared store.
    fn two_apps<H, T>(&self, path: &str, handler: H) -> [Router; 2]
    where
        H: axum::handler::Handler<T, ()> + Clone,
        T: 'static;
}

impl Apps for Shared {
    fn app(&self, origin: &Counter) -> Router {
        app(origin).layer(StampedeLayer::new(self.cache().build()))
    }

    fn two_apps<H, T>(&self, path: &str, handler: H) -> [Router; 2]
    where
        H: axum::handler::Handler<T, ()> + Clone,
        T: 'static,
    {
        [(); 2].map(|()| {
            Router::new()
                .route(path, get(handler.clone()))
                .layer(StampedeLayer::new(self.cache().build()))
        })
    }
}

/// The origin: counts every request that reaches a handler.
fn app(origin: &Counter) -> Router {
    let count = |origin: Counter| move || origin.hit();
    let page = {
        let hit = count(origin.clone());
        move || async move {
            hit();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut headers = HeaderMap::new();
            headers.insert(
                "content-type",
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            headers.append("x-origin", HeaderValue::from_static("one"));
            headers.append("x-origin", HeaderValue::from_static("two"));
            headers.insert("etag", HeaderValue::from_static("\"v1\""));
            headers.insert(
                "cache-control",
                HeaderValue::from_static("public, max-age=60"),
            );
            (StatusCode::OK, headers, Bytes::from(vec![b'p'; 10_000]))
        }
    };
    let with = |header: &'static str, value: &'static str, status: StatusCode| {
        let hit = count(origin.clone());
        move || async move {
            hit();
            let mut headers = HeaderMap::new();
            headers.insert(header, HeaderValue::from_static(value));
            (status, headers, "uncacheable")
        }
    };
    let short = {
        let hit = count(origin.clone());
        move || async move {
            hit();
            ([("cache-control", "max-age=1")], "short-lived")
        }
    };
    let echo = {
        let hit = count(origin.clone());
        move |body: Bytes| async move {
            hit();
            body
        }
    };
    let huge = {
        let hit = count(origin.clone());
        move || async move {
            hit();
            huge_body()
        }
    };
    Router::new()
        .route("/page", get(page).post(echo))
        .route(
            "/no-store",
            get(with("cache-control", "no-store", StatusCode::OK)),
        )
        .route(
            "/private",
            get(with("cache-control", "private, max-age=60", StatusCode::OK)),
        )
        .route(
            "/cookie",
            get(with("set-cookie", "session=secret", StatusCode::OK)),
        )
        .route(
            "/error",
            get(with("x-error", "1", StatusCode::INTERNAL_SERVER_ERROR)),
        )
        .route("/short", get(short))
        .route("/huge", get(huge))
}

/// 3 MB of bytes that differ from position to position, so a lost or reordered chunk shows.
fn huge_body() -> Bytes {
    (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

async fn send(app: &Router, method: &str, uri: &str) -> (StatusCode, HeaderMap, Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

fn x_cache(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-cache").map(|v| v.to_str().unwrap())
}

store_test!(a_miss_then_hits_byte_for_byte);
async fn a_miss_then_hits_byte_for_byte(shared: Shared) {
    let origin = Counter::default();
    let bare = app(&Counter::default());
    let (a, b) = (shared.app(&origin), shared.app(&origin));
    let (want_status, mut want_headers, want_body) =
        send(&bare, "GET", "http://app.test/page").await;

    let (status, mut headers, body) = send(&a, "GET", "http://app.test/page").await;
    assert_eq!(x_cache(&headers), Some("MISS"));
    for (app, source) in [(&a, "L1"), (&b, "the store")] {
        let (hit_status, mut hit_headers, hit_body) =
            send(app, "GET", "http://app.test/page").await;
        assert_eq!(x_cache(&hit_headers), Some("HIT"), "{source}");
        assert_eq!(
            (hit_status, &hit_body),
            (want_status, &want_body),
            "{source}"
        );
        hit_headers.remove("x-cache");
        // RFC 9211 §2.1, §2.4: a hit, with what is left of its freshness.
        let member = hit_headers.remove("cache-status").unwrap();
        let (rest, ttl) = support::http::split_ttl(member.to_str().unwrap());
        assert_eq!(rest, "tower-stampede; hit", "RFC 9211 §2.1");
        let ttl = ttl.expect("a ttl on a hit");
        assert!((50..=60).contains(&ttl), "max-age=60, ttl={ttl}");
        let age: u64 = hit_headers
            .remove("age")
            .expect("Age")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(age < 60, "Age {age}");
        assert_eq!(hit_headers, want_headers, "headers from {source}");
    }
    assert_eq!(origin.get(), 1);
    headers.remove("x-cache");
    assert_eq!(
        headers.remove("cache-status").unwrap(),
        "tower-stampede; fwd=uri-miss; fwd-status=200; stored; ttl=60",
        "RFC 9211 §2.2, §2.3, §2.4, §2.5"
    );
    assert!(
        headers.remove("age").is_some(),
        "a MISS from the entry has Age"
    );
    want_headers.remove("x-cache");
    assert_eq!(
        (status, headers, body),
        (want_status, want_headers, want_body)
    );
}

store_test!(thousand_requests_over_four_apps_reach_the_origin_once);
async fn thousand_requests_over_four_apps_reach_the_origin_once(shared: Shared) {
    let origin = Counter::default();
    let apps: Vec<Router> = (0..4).map(|_| shared.app(&origin)).collect();
    let mut requests = Vec::new();
    for i in 0..1000 {
        let app = apps[i % 4].clone();
        requests.push(tokio::spawn(async move {
            send(&app, "GET", "http://app.test/page").await
        }));
    }
    let mut loads = 0;
    for request in requests {
        let (status, headers, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.len(), 10_000);
        let cache_status = headers["cache-status"].to_str().unwrap();
        // This request's own load stored the page; the others were collapsed onto it (a MISS
        // too: forwarded, by another request) or came from the cache.
        loads += usize::from(cache_status.ends_with("stored; ttl=60"));
        assert!(matches!(x_cache(&headers), Some("MISS" | "HIT")));
    }
    assert_eq!(origin.get(), 1, "origin requests");
    assert_eq!(loads, 1);
}

store_test!(other_methods_pass_through_and_say_what_they_invalidated);
async fn other_methods_pass_through_and_say_what_they_invalidated(shared: Shared) {
    let origin = Counter::default();
    let app = shared.app(&origin);
    // Issue 52: each says what became of the URL's stored responses (RFC 9111 §4.4): the
    // first invalidates them, the second, within the interval, is coalesced.
    for detail in ["invalidated", "invalidation-coalesced"] {
        let request = Request::post("http://app.test/page")
            .body(Body::from("posted"))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(x_cache(response.headers()), Some("BYPASS"));
        assert_eq!(
            response.headers()["cache-status"],
            format!("tower-stampede; fwd=method; fwd-status=200; detail={detail}")
        );
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "posted"
        );
    }
    assert_eq!(origin.get(), 2);
}

store_test!(uncacheable_responses_and_requests_are_bypassed);
async fn uncacheable_responses_and_requests_are_bypassed(shared: Shared) {
    // Issue 40: each pass names its rule, for the requests sent on by a "pass" marker too.
    for (path, rule) in [
        ("/no-store", "no-store"),
        ("/private", "private"),
        ("/cookie", "set-cookie"),
    ] {
        let origin = Counter::default();
        let (a, b) = (shared.app(&origin), shared.app(&origin));
        let bare = send(&app(&Counter::default()), "GET", path).await;
        for app in [&a, &a, &b] {
            let (status, mut headers, body) = send(app, "GET", path).await;
            assert_eq!(x_cache(&headers), Some("BYPASS"), "{path}");
            headers.remove("x-cache");
            assert_eq!(
                headers.remove("cache-status").unwrap(),
                format!("tower-stampede; fwd=uri-miss; fwd-status=200; detail={rule}"),
                "{path}"
            );
            assert_eq!(
                (status, headers, body),
                bare.clone(),
                "{path} passed on intact"
            );
        }
        assert_eq!(origin.get(), 3, "{path} every request reaches the origin");
    }
    // Credentials: not shared unless the response allows it (`/short` does not say
    // `public`).
    let origin = Counter::default();
    let app = shared.app(&origin);
    for _ in 0..2 {
        let request = Request::get("/short")
            .header("authorization", "Bearer a")
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.headers()["x-cache"], "BYPASS");
    }
    assert_eq!(origin.get(), 2);
}

store_test!(max_age_sets_the_ttl);
async fn max_age_sets_the_ttl(shared: Shared) {
    let origin = Counter::default();
    let cache = shared.cache().build();
    let app = app(&origin).layer(StampedeLayer::new(cache.clone()));
    let (_, headers, _) = send(&app, "GET", "http://app.test/short").await;
    assert_eq!(x_cache(&headers), Some("MISS"));
    let key = "http\0GET\0http\0app.test\0/short";
    let stored = shared
        .store
        .get(&cache.store_key(key))
        .await
        .unwrap()
        .expect("stored");
    let ttl = stored.ttl.unwrap();
    assert!(
        ttl <= Duration::from_secs(1) && ttl > Duration::ZERO,
        "{ttl:?}"
    );
    let (_, page_headers, _) = send(&app, "GET", "http://app.test/page").await;
    assert_eq!(x_cache(&page_headers), Some("MISS"));
    let page_key = "http\0GET\0http\0app.test\0/page";
    let page = shared
        .store
        .get(&cache.store_key(page_key))
        .await
        .unwrap()
        .expect("stored");
    assert!(page.ttl.unwrap() > Duration::from_secs(50), "max-age=60");
}

/// A body of `data` in chunks of `chunk` bytes, without a size hint, so the layer has to read
/// past its limit to learn that the body is too large.
struct Chunked {
    data: Bytes,
    chunk: usize,
}

impl http_body::Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.data.is_empty() {
            return Poll::Ready(None);
        }
        let n = this.chunk.min(this.data.len());
        Poll::Ready(Some(Ok(Frame::data(this.data.split_to(n)))))
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

store_test!(a_body_over_the_limit_streams_through_intact_and_is_not_stored);
async fn a_body_over_the_limit_streams_through_intact_and_is_not_stored(shared: Shared) {
    for path in ["/huge", "/huge-chunked"] {
        let origin = Counter::default();
        let cache = shared.cache().build();
        let layer = StampedeLayer::new(cache.clone()).max_body_bytes(64 * 1024);
        let chunked = {
            let origin = origin.clone();
            move || async move {
                origin.hit();
                let body = Chunked {
                    data: huge_body(),
                    chunk: 7919,
                };
                ([("cache-control", "max-age=60")], Body::new(body))
            }
        };
        let app = app(&origin)
            .route("/huge-chunked", get(chunked))
            .layer(layer);
        let want = sha256(&huge_body());
        // One after another: the requests that wait for a load share its body (see
        // `http_coalesce.rs`); each of these comes after the last load ended.
        for _ in 0..5 {
            let uri = format!("http://app.test{path}");
            let (status, headers, body) = send(&app, "GET", &uri).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(x_cache(&headers), Some("BYPASS"), "{path}");
            assert_eq!(body.len(), 3_000_000, "{path}");
            assert_eq!(sha256(&body), want, "{path}: every byte, in order");
        }
        assert_eq!(origin.get(), 5, "{path}: never served from cache");
        // At most the few bytes of a pass marker are kept under the key.
        let key = format!("http\0GET\0http\0app.test\0{path}");
        let stored = shared.store.get(&cache.store_key(key)).await.unwrap();
        assert!(
            stored.is_none_or(|s| s.bytes.len() < 64),
            "{path}: nothing of the body is stored"
        );
    }
}

/// A body that yields its chunks, then fails.
struct FailingBody {
    chunks: VecDeque<Bytes>,
}

impl http_body::Body for FailingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        Poll::Ready(Some(match this.chunks.pop_front() {
            Some(chunk) => Ok(Frame::data(chunk)),
            None => Err(std::io::Error::other("origin hung up")),
        }))
    }
}

store_test!(a_body_that_fails_halfway_reaches_the_caller_and_is_not_cached);
async fn a_body_that_fails_halfway_reaches_the_caller_and_is_not_cached(shared: Shared) {
    let origin = Counter::default();
    let inner = {
        let origin = origin.clone();
        service_fn(move |_req: Request<()>| {
            origin.hit();
            async move {
                let chunks = VecDeque::from([
                    Bytes::from_static(b"first "),
                    Bytes::from_static(b"second "),
                ]);
                // Cacheable, but for its body.
                let mut response = Response::new(FailingBody { chunks });
                response
                    .headers_mut()
                    .insert("cache-control", HeaderValue::from_static("max-age=60"));
                Ok::<_, Infallible>(response)
            }
        })
    };
    // No failure window: the second request must reach the origin again.
    let cache = Cache::builder_shared(Arc::clone(&shared.store))
        .namespace("http-test")
        .failure_ttl(Duration::ZERO)
        .build();
    let mut service = ServiceBuilder::new()
        .layer(StampedeLayer::new(cache.clone()))
        .service(inner);
    for _ in 0..2 {
        let request = Request::get("http://app.test/broken").body(()).unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.headers()["x-cache"], "BYPASS");
        let mut body = response.into_body();
        let mut received = Vec::new();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => received.extend_from_slice(&frame.into_data().unwrap()),
                Some(Err(error)) => break error,
                None => panic!("the body ended without its error"),
            }
        };
        assert_eq!(received, b"first second ");
        assert_eq!(error.to_string(), "origin hung up");
    }
    assert_eq!(origin.get(), 2, "nothing partial was cached");
    let key = cache.store_key("http\0GET\0http\0app.test\0/broken");
    assert_eq!(
        shared.store.get(&key).await.unwrap(),
        None,
        "nothing stored"
    );
}

store_test!(the_layer_s_own_gateway_errors_say_so_in_cache_status);
/// RFC 9211 §2.8 (`detail`): the only responses the layer makes itself, a `502` when there is
/// no answer of the origin to give (here: the inner service failed, and the failure is
/// remembered across processes) and a `504` when the load timed out, say so in
/// `Cache-Status`; neither reaches the origin again.
async fn the_layer_s_own_gateway_errors_say_so_in_cache_status(shared: Shared) {
    let origin = Counter::default();
    let inner = {
        let origin = origin.clone();
        service_fn(move |request: Request<()>| {
            origin.hit();
            async move {
                if request.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                Err::<Response<Body>, _>(std::io::Error::other("origin unreachable"))
            }
        })
    };
    let instance = || {
        let cache = shared
            .cache()
            .failure_ttl(Duration::from_secs(60))
            .load_timeout(Duration::from_millis(200))
            .build();
        ServiceBuilder::new()
            .layer(StampedeLayer::new(cache))
            .service(inner.clone())
    };
    let (mut a, mut b) = (instance(), instance());
    let get = |path: &str| {
        Request::get(format!("http://app.test{path}"))
            .body(())
            .unwrap()
    };
    // The loading request gets the inner service's own error.
    let failed = a.ready().await.unwrap().call(get("/down")).await;
    assert!(failed.is_err());
    // Another process, within failure_ttl: no origin answer to give, and none asked for.
    let response = b.ready().await.unwrap().call(get("/down")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        response.headers()["cache-status"],
        "tower-stampede; fwd=uri-miss; detail=no-origin-response"
    );
    assert_eq!(origin.get(), 1);
    // A load past load_timeout.
    let response = a.ready().await.unwrap().call(get("/slow")).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        response.headers()["cache-status"],
        "tower-stampede; fwd=uri-miss; detail=timeout"
    );
    assert_eq!(origin.get(), 2);
}

store_test!(stale_responses_while_refreshing_and_in_place_of_errors);
async fn stale_responses_while_refreshing_and_in_place_of_errors(shared: Shared) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let origin = Counter::default();
    let failing = Arc::new(AtomicBool::new(false));
    // The background refresh (version 2) waits for the test, so the stale answer is seen.
    let refresh_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (origin, failing, gate) = (origin.clone(), failing.clone(), refresh_gate.clone());
        move || async move {
            let n = origin.hit();
            if n == 2 {
                let _ = gate.acquire().await;
            }
            if failing.load(Ordering::SeqCst) {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("cache-control", "no-store")],
                    "down".to_owned(),
                );
            }
            (
                StatusCode::OK,
                [("cache-control", "max-age=1")],
                format!("version {n}"),
            )
        }
    };
    let cache = Cache::builder_shared(Arc::clone(&shared.store))
        .namespace("http-stale")
        .stale(Duration::from_secs(60))
        .build();
    let app = Router::new()
        .route("/v", get(handler))
        .layer(StampedeLayer::new(cache));
    let (_, headers, body) = send(&app, "GET", "http://app.test/v").await;
    assert_eq!(
        (x_cache(&headers), body.as_ref()),
        (Some("MISS"), &b"version 1"[..])
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Stale: answered at once with version 1 while version 2 loads in the background.
    let (_, headers, body) = send(&app, "GET", "http://app.test/v").await;
    assert_eq!(
        (x_cache(&headers), body.as_ref()),
        (Some("STALE"), &b"version 1"[..])
    );
    // RFC 9211 §2.1, §2.4: not forwarded for this answer, so a hit; a stale one, with a
    // negative ttl (stale by 0.3 s here: -1 unless the machine stalled for seconds).
    let (rest, ttl) = support::http::split_ttl(headers["cache-status"].to_str().unwrap());
    assert_eq!(rest, "tower-stampede; hit; detail=stale");
    assert!(ttl.is_some_and(|ttl| ttl < 0), "ttl {ttl:?}");
    refresh_gate.add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, headers, body) = send(&app, "GET", "http://app.test/v").await;
        if body == "version 2" {
            assert_eq!(x_cache(&headers), Some("HIT"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The origin fails: the stale version 2 is served in its place, never the 503.
    failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for _ in 0..3 {
        let (status, headers, body) = send(&app, "GET", "http://app.test/v").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (x_cache(&headers), body.as_ref()),
            (Some("STALE"), &b"version 2"[..])
        );
    }
}

store_test!(a_server_error_goes_to_its_waiters_and_later_requests_reach_the_origin);
/// An origin's server error without explicit freshness (the layer's rule for RFC 9111 §4's
/// collapsed requests): the requests that waited for its load, in both processes, get the
/// origin's own answer (status, headers, body), never a `502` the layer makes up; a request
/// that comes after the load ended goes to the origin again, one at a time.
async fn a_server_error_goes_to_its_waiters_and_later_requests_reach_the_origin(shared: Shared) {
    let origin = Counter::default();
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most_in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let failing = {
        let (origin, release) = (origin.clone(), Arc::clone(&release));
        let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most_in_flight));
        move || async move {
            let n = origin.hit();
            let now = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            if n == 1 {
                // The first load is held until the stampede waits for it.
                release.acquire().await.unwrap().forget();
            }
            in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("x-error", "1"), ("retry-after", "5")],
                format!("down #{n}"),
            )
        }
    };
    let apps = shared.two_apps("/error", failing);
    let (mut requests, sent) = (Vec::new(), Counter::default());
    for i in 0..100 {
        let (app, sent) = (apps[i % 2].clone(), sent.clone());
        requests.push(tokio::spawn(async move {
            sent.hit();
            send(&app, "GET", "http://app.test/error").await
        }));
    }
    // The first load is held until every request has been sent.
    wait_until(shared.name, || origin.get() > 0 && sent.get() == 100).await;
    release.add_permits(1);
    let mut first = 0;
    for request in requests {
        let (status, headers, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["x-error"], "1");
        assert_eq!(headers["retry-after"], "5");
        let cache_status = headers["cache-status"].to_str().unwrap();
        assert!(
            cache_status.starts_with("tower-stampede; fwd=uri-miss; fwd-status=503"),
            "{cache_status}"
        );
        assert!(!cache_status.contains("stored"));
        if body == "down #1" {
            first += 1;
        } else {
            assert!(body.starts_with(b"down #"), "{body:?}");
        }
    }
    assert_eq!(
        most_in_flight.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one load at a time"
    );
    // A request counts as sent when its task starts; on a busy machine some of them reach
    // the cache only after the first load ended (49 of 100 waited in one run under load),
    // and are then answered by a load of their own, as the loop below checks. The stampede
    // must still have waited.
    assert!(
        first > 10,
        "the stampede waited for the first load ({first})"
    );
    // After the load: not reused; the origin answers again, in either process.
    for app in &apps {
        let calls = origin.get();
        let (status, headers, body) = send(app, "GET", "http://app.test/error").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, format!("down #{}", calls + 1));
        assert_eq!(x_cache(&headers), Some("MISS"));
        assert_eq!(origin.get(), calls + 1);
    }
}

store_test!(a_server_error_with_explicit_freshness_is_stored);
/// A server error with explicit freshness is stored and served like any response.
async fn a_server_error_with_explicit_freshness_is_stored(shared: Shared) {
    let origin = Counter::default();
    let handler = {
        let origin = origin.clone();
        move || async move {
            let n = origin.hit();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("cache-control", "max-age=60")],
                format!("down #{n}"),
            )
        }
    };
    let apps = shared.two_apps("/error", handler);
    for (app, mark) in [(&apps[0], "MISS"), (&apps[0], "HIT"), (&apps[1], "HIT")] {
        let (status, headers, body) = send(app, "GET", "http://app.test/error").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            (x_cache(&headers), &body[..]),
            (Some(mark), &b"down #1"[..])
        );
    }
    assert_eq!(origin.get(), 1);
}

store_test!(a_hot_page_is_refreshed_early_while_every_request_hits);
async fn a_hot_page_is_refreshed_early_while_every_request_hits(shared: Shared) {
    let origin = Counter::default();
    // The first load is slow (δ = 300 ms): its refresh point is drawn at least δ (and with
    // β = 3, on average 4δ) before the page's one second of freshness ends, so hits for
    // 800 ms reach it. The refresh answers at once (δ = 0), so the refreshed page's own point
    // is its expiry, past the hits: a refresh that took time would draw a point of its own,
    // rarely early enough to refresh it again within the 800 ms.
    let handler = {
        let origin = origin.clone();
        move || async move {
            let n = origin.hit();
            let delay = if n == 1 { 300 } else { 0 };
            tokio::time::sleep(Duration::from_millis(delay)).await;
            ([("cache-control", "max-age=1")], format!("version {n}"))
        }
    };
    let cache = Cache::builder_shared(Arc::clone(&shared.store))
        .namespace("http-early")
        .early_refresh(3.0)
        .build();
    let app = Router::new()
        .route("/hot", get(handler))
        .layer(StampedeLayer::new(cache));
    let (_, headers, body) = send(&app, "GET", "http://app.test/hot").await;
    assert_eq!(x_cache(&headers), Some("MISS"));
    assert_eq!(body, "version 1");
    let mut refreshed = false;
    // On tokio's clock, which the memory case's paused time moves: 800 ms of hits.
    let hitting = tokio::time::Instant::now();
    while hitting.elapsed() < Duration::from_millis(800) {
        let (status, headers, body) = send(&app, "GET", "http://app.test/hot").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(x_cache(&headers), Some("HIT"));
        refreshed |= body == "version 2";
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refreshed, "refreshed before it expired");
    assert_eq!(origin.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn hits_share_the_cached_body_instead_of_copying_it() {
    let page = Bytes::from(vec![b'x'; 64 * 1024]);
    let inner = service_fn({
        let page = page.clone();
        move |_request: Request<http_body_util::Full<Bytes>>| {
            let page = page.clone();
            let response = Response::builder()
                .header("cache-control", "max-age=60")
                .body(http_body_util::Full::new(page));
            async move { Ok::<_, Infallible>(response.unwrap()) }
        }
    });
    let service = ServiceBuilder::new()
        .layer(StampedeLayer::new(
            Cache::builder(tower_stampede::store::MemoryStore::new()).build(),
        ))
        .service(inner);
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let request = Request::get("http://app.test/shared")
            .body(http_body_util::Full::default())
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        let mut body = response.into_body();
        let mut data = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(chunk) = frame.unwrap().into_data() {
                data.push(chunk);
            }
        }
        assert_eq!(data.len(), 1, "a cached body is one chunk");
        bodies.push(data.remove(0));
    }
    assert_eq!(bodies[1], page);
    // Both hits hand out the same bytes L1 holds: no copy per response.
    assert_eq!(bodies[1].as_ptr(), bodies[2].as_ptr());
}

/// The layer's L1 hits, answered before any fetch, are traced as every fetch is: a
/// `stampede.fetch` span with the outcome, for a subscriber that wants it (without one, the
/// hit records nothing). One thread, so the thread-local subscriber sees every task.
#[tokio::test(start_paused = true)]
async fn the_layer_s_hits_and_misses_are_traced_for_a_subscriber() {
    use tower_stampede::Outcome;

    let logs = support::Logs::default();
    let _guard = logs.capture();
    let origin = Counter::default();
    let app = Shared::memory().app(&origin);
    for expected in ["MISS", "HIT"] {
        let (status, headers, _) = send(&app, "GET", "http://app.test/page").await;
        assert_eq!(
            (status, x_cache(&headers)),
            (StatusCode::OK, Some(expected))
        );
    }
    let text = logs.text();
    let outcomes: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("stampede.fetch{") && line.contains("close"))
        .filter_map(|line| line.split("outcome=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        outcomes,
        [Outcome::Leader.label(), Outcome::L1Hit.label()],
        "{text}"
    );
}

/// Issue 40, 52: a pass is logged with its rule, the header it names if any (no empty field),
/// and what to do about it, at most once a minute per rule per layer (on paused time).
#[tokio::test(start_paused = true)]
async fn a_pass_warns_with_its_rule_and_remedy_once_a_minute() {
    let logs = support::Logs::default();
    let _guard = logs.capture_default();
    let cache = Shared::memory().cache().build();
    let theme = axum::http::HeaderName::from_static("x-theme");
    let app = Router::new()
        .route("/bare", get(|| async { "no freshness" }))
        .layer(StampedeLayer::new(cache).pass_header(theme));
    for _ in 0..3 {
        send(&app, "GET", "http://app.test/bare").await;
    }
    let themed = Request::get("http://app.test/bare")
        .header("x-theme", "dark")
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(themed).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    send(&app, "GET", "http://app.test/bare").await;
    let text = logs.text();
    let (themed, warnings): (Vec<&str>, Vec<&str>) = text
        .lines()
        .filter(|l| l.contains("WARN"))
        .partition(|l| l.contains("pass-header"));
    assert_eq!(themed.len(), 1, "{themed:?}");
    assert!(themed[0].contains("header=\"x-theme\""), "{}", themed[0]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    for warning in warnings {
        assert!(warning.contains("rule=\"no-freshness\""), "{warning}");
        assert!(warning.contains("RfcPolicy::default_ttl"), "{warning}");
        assert!(!warning.contains("header="), "no empty field: {warning}");
    }
}
