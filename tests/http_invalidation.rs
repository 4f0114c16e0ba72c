//! Invalidation in the HTTP layer: unsafe methods (RFC 9111 §4.4), the [`Purger`] handle,
//! the `PURGE` endpoint and response tags, each through the real middleware over the embedded
//! `MemoryStore` and (feature `redis`) a real `redis-server`, with several app instances, each
//! a cache of its own (its own L1) over store connections of its own (its own subscriber).
//!
//! The origin serves a "resource" whose version the test moves on: `GET /any/path` answers
//! `/any/path v{version} #{call}` (and `?vary=NAME` varies it on that request header, echoed
//! in the body; `?tags=a+b` tags it with `Surrogate-Key: a b`; `?slow=MS` reads the version,
//! then takes that long; `?held` waits until the test releases it; `?gated` reads the version
//! and waits for a release too, if the test armed `gating`; `?swr` makes it `max-age=1,
//! stale-while-revalidate=60`). Any other method answers `changed` with the status, `Location` and
//! `Content-Location` its query asks for. Tests that wait for another instance to hear of a
//! change poll with a bounded deadline; none sleeps and hopes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::Router;
use support::http::{get, send, Answer};
use support::{store_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::http::Purger;
use tower_stampede::{Cache, StampedeLayer};

/// The failure guard on anything that waits for a notification: far beyond what it needs.
const LIMIT: Duration = Duration::from_secs(5);

/// The origin of every test: a resource whose version the test moves on.
#[derive(Clone)]
struct Origin {
    version: Arc<AtomicU32>,
    calls: Counter,
    /// Told when a slow `GET` has read the version.
    read: Arc<Notify>,
    /// Lets held `GET`s (`?held`) answer, one per permit.
    release: Arc<tokio::sync::Semaphore>,
    /// Whether the next `?gated` request is held (then it is not any more).
    gating: Arc<std::sync::atomic::AtomicBool>,
}

impl Origin {
    fn new() -> Self {
        Origin {
            version: Arc::new(AtomicU32::new(1)),
            calls: Counter::default(),
            read: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
            gating: Arc::default(),
        }
    }

    fn move_on(&self) -> u32 {
        self.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn router(&self) -> Router {
        let origin = self.clone();
        Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
            let origin = origin.clone();
            async move { origin.answer(method, uri, headers).await }
        })
    }

    async fn answer(
        &self,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
    ) -> axum::response::Response {
        let n = self.calls.hit();
        let query = query(&uri);
        let mut response = axum::response::Response::new(Body::empty());
        let set = |response: &mut axum::response::Response, name: &str, value: &str| {
            response.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        };
        if method != Method::GET && method != Method::HEAD {
            for (name, value) in &query {
                match name.as_str() {
                    "status" => *response.status_mut() = value.parse().unwrap(),
                    "location" | "content-location" => set(&mut response, name, value),
                    _ => {}
                }
            }
            *response.body_mut() = Body::from("changed");
            return response;
        }
        let version = self.version.load(Ordering::SeqCst);
        let mut body = format!("{} v{version} #{n}", uri.path());
        let swr = query.iter().any(|(name, _)| name == "swr");
        let cache_control = if swr {
            "public, max-age=1, stale-while-revalidate=60"
        } else {
            "public, max-age=60"
        };
        set(&mut response, "cache-control", cache_control);
        for (name, value) in &query {
            match name.as_str() {
                "slow" => {
                    self.read.notify_one();
                    tokio::time::sleep(Duration::from_millis(value.parse().unwrap())).await;
                }
                "held" => self.release.acquire().await.unwrap().forget(),
                "gated" if self.gating.swap(false, Ordering::SeqCst) => {
                    self.read.notify_one();
                    self.release.acquire().await.unwrap().forget();
                }
                "vary" => {
                    set(&mut response, "vary", value);
                    for v in headers.get_all(value.as_str()) {
                        body.push(' ');
                        body.push_str(v.to_str().unwrap());
                    }
                }
                "tags" => set(&mut response, "surrogate-key", &value.replace('+', " ")),
                "cache-tag" => set(&mut response, "cache-tag", value),
                _ => {}
            }
        }
        *response.body_mut() = Body::from(body);
        response
    }
}

/// The query's pairs (no percent-decoding: the tests write plain values).
fn query(uri: &Uri) -> Vec<(String, String)> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

/// An app instance: a cache of its own over store connections of its own.
async fn instance(
    shared: &Shared,
    origin: &Origin,
    layer: impl Fn(Cache) -> StampedeLayer,
) -> (Router, StampedeLayer) {
    let store = shared.other_process().await;
    let cache = Cache::builder_shared(store)
        .namespace("http-inval")
        // L1 copies that would outlive every deadline here, were they not kept in step.
        .l1_ttl_cap(Duration::from_secs(120))
        .build();
    let layer = layer(cache);
    (origin.router().layer(layer.clone()), layer)
}

/// Two app instances, `a` and `b`.
async fn apps(
    shared: &Shared,
    origin: &Origin,
    layer: impl Fn(Cache) -> StampedeLayer + Copy,
) -> [Router; 2] {
    [
        instance(shared, origin, layer).await.0,
        instance(shared, origin, layer).await.0,
    ]
}

/// Two app instances with the default layer, and the first one's [`Purger`].
async fn apps_and_purger(shared: &Shared, origin: &Origin) -> ([Router; 2], Purger) {
    let (a, layer) = instance(shared, origin, StampedeLayer::new).await;
    let (b, _) = instance(shared, origin, StampedeLayer::new).await;
    ([a, b], layer.purger())
}

/// A URL of the test origin.
fn url(path_and_query: &str) -> String {
    format!("http://app.test{path_and_query}")
}

/// Whether `body` is the origin's `GET` answer for `path` at `version`.
fn at_version(body: &str, path: &str, version: u32) -> bool {
    body.starts_with(&format!("{path} v{version} #"))
}

/// `GET`s `uri` on `app` (with `headers`) until it answers `version` (the change has reached
/// that instance), within [`LIMIT`].
async fn eventually(app: &Router, uri: &str, headers: &[(&str, &str)], version: u32) -> Answer {
    let path = uri.parse::<Uri>().unwrap().path().to_owned();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let answer = send(app, "GET", uri, headers).await;
        if at_version(answer.body(), &path, version) {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{uri}: still {:?} ({}), not v{version}",
            answer.body(),
            answer.x_cache()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Caches `uri` in both apps (a loads it, b reads it from the store, then both from L1).
async fn cached_in_both(apps: &[Router; 2], uri: &str, headers: &[(&str, &str)]) -> String {
    let first = send(&apps[0], "GET", uri, headers).await;
    assert_eq!(first.x_cache(), "MISS", "{uri}: {}", first.body());
    for app in [&apps[1], &apps[0], &apps[1]] {
        let hit = send(app, "GET", uri, headers).await;
        assert_eq!((hit.x_cache(), hit.body()), ("HIT", first.body()), "{uri}");
    }
    first.body().to_owned()
}

store_test!(unsafe_methods_invalidate_their_url_in_every_instance);
/// RFC 9111 §4.4: a non-error response to an unsafe method (`POST`, `PUT`, `DELETE`, `PATCH`,
/// or one the layer does not know) invalidates the stored responses of its URL, in every
/// instance: the one it went through answers the new version at once, the others as soon as
/// the store's notification reaches them.
async fn unsafe_methods_invalidate_their_url_in_every_instance(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    for method in ["POST", "PUT", "DELETE", "PATCH", "FROB"] {
        let uri = url(&format!("/{method}"));
        cached_in_both(&apps, &uri, &[]).await;
        let version = origin.move_on();
        let changed = send(&apps[0], method, &uri, &[]).await;
        assert_eq!(changed.status, StatusCode::OK);
        assert_eq!(changed.body(), "changed", "the origin's own");
        assert_eq!(
            changed.headers["cache-status"],
            "tower-stampede; fwd=method; fwd-status=200; detail=invalidated",
            "says what it did"
        );
        let next = get(&apps[0], &uri).await;
        assert_eq!(next.x_cache(), "MISS", "{method}");
        assert!(at_version(next.body(), &format!("/{method}"), version));
        let other = eventually(&apps[1], &uri, &[], version).await;
        assert_eq!(other.x_cache(), "HIT", "from a's load");
    }
}

store_test!(errors_and_safe_methods_invalidate_nothing);
/// RFC 9111 §4.4 asks for invalidation on non-error responses only, and to unsafe methods
/// only: an error response, `OPTIONS` and `TRACE` leave the stored response as it was.
async fn errors_and_safe_methods_invalidate_nothing(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    let uri = url("/kept");
    let body = cached_in_both(&apps, &uri, &[]).await;
    origin.move_on();
    for (method, status) in [
        ("POST", "400"),
        ("DELETE", "404"),
        ("PUT", "409"),
        ("POST", "500"),
        ("PATCH", "503"),
    ] {
        let changed = send(&apps[0], method, &format!("{uri}?status={status}"), &[]).await;
        assert_eq!(changed.status.as_str(), status);
    }
    for method in ["OPTIONS", "TRACE"] {
        send(&apps[0], method, &uri, &[]).await;
    }
    // The store still has it: an instance with nothing in L1 reads it from there.
    let (fresh, _) = instance(&shared, &origin, StampedeLayer::new).await;
    for app in [&apps[0], &apps[1], &fresh] {
        let answer = get(app, &uri).await;
        assert_eq!((answer.x_cache(), answer.body()), ("HIT", body.as_str()));
    }
}

store_test!(location_and_content_location_of_the_same_origin_are_invalidated);
/// RFC 9111 §4.4: the URLs in `Location` and `Content-Location` are invalidated too, when
/// they are of the same origin (relative, or the same scheme and authority), and never
/// otherwise; a redirection is not an error.
async fn location_and_content_location_of_the_same_origin_are_invalidated(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    let paths = ["/list", "/list/7", "/list/8", "/elsewhere"];
    for path in paths {
        cached_in_both(&apps, &url(path), &[]).await;
    }
    let version = origin.move_on();
    let post = url("/list/?status=303&location=7&content-location=http://APP.test:80/list/8");
    let changed = send(&apps[0], "POST", &post, &[]).await;
    assert_eq!(changed.status, StatusCode::SEE_OTHER);
    for elsewhere in [
        "/form?location=/list&content-location=http://other.test/elsewhere",
        "/form?content-location=https://app.test/elsewhere",
        "/form?location=//other.test/elsewhere",
    ] {
        let changed = send(&apps[0], "POST", &url(elsewhere), &[]).await;
        assert_eq!(changed.status, StatusCode::OK);
    }
    for path in ["/list", "/list/7", "/list/8"] {
        for app in &apps {
            eventually(app, &url(path), &[], version).await;
        }
    }
    // `/list/` and `/form` were never stored; `/elsewhere` is of another origin each time.
    let kept = get(&apps[1], &url("/elsewhere")).await;
    assert_eq!(kept.x_cache(), "HIT");
    assert!(at_version(kept.body(), "/elsewhere", 1));
}

store_test!(every_vary_variant_is_invalidated);
/// RFC 9111 §4.4: every `Vary` variant of the URL is invalidated, in every instance, though
/// the layer cannot list them: they hang off the URL's vary marker, which the change removes.
async fn every_vary_variant_is_invalidated(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    let uri = url("/varied?vary=accept-encoding");
    let variants: [&[(&str, &str)]; 3] = [
        &[("accept-encoding", "gzip")],
        &[("accept-encoding", "br")],
        &[],
    ];
    for headers in variants {
        cached_in_both(&apps, &uri, headers).await;
    }
    let version = origin.move_on();
    send(&apps[1], "POST", &uri, &[]).await;
    for headers in variants {
        for app in &apps {
            let answer = eventually(app, &uri, headers, version).await;
            let want = headers.first().map_or("", |(_, v)| *v);
            assert!(
                answer.body().ends_with(want),
                "{} for {want:?}",
                answer.body()
            );
        }
    }
    // One load per variant after the change.
    assert_eq!(origin.calls.get(), 3 + 1 + 3);
}

store_test!(responses_for_authorized_requests_are_invalidated_too);
/// RFC 9111 §4.4: responses stored for requests with `Authorization` (keyed apart) are
/// responses of the URL too, and go with it.
async fn responses_for_authorized_requests_are_invalidated_too(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    let uri = url("/mine");
    let bearer = [("authorization", "Bearer a")];
    cached_in_both(&apps, &uri, &bearer).await;
    cached_in_both(&apps, &uri, &[]).await;
    let version = origin.move_on();
    send(&apps[0], "DELETE", &uri, &[]).await;
    for app in &apps {
        eventually(app, &uri, &bearer, version).await;
        eventually(app, &uri, &[], version).await;
    }
}

store_test!(a_load_in_flight_when_its_url_changes_is_not_stored);
/// The race (RFC 9111 §4.4 with a load in flight): a `GET` reads version 1, the resource
/// moves to version 2 and a `POST` goes through while that load still runs. The load answers
/// its own request with version 1, but cannot store it: every later `GET` reads version 2.
/// With `Vary` too: the late load may store its variant, never the marker that leads to it.
async fn a_load_in_flight_when_its_url_changes_is_not_stored(shared: Shared) {
    for path in [
        "/raced?slow=300",
        "/raced-vary?slow=300&vary=accept-encoding",
    ] {
        let origin = Origin::new();
        let apps = apps(&shared, &origin, StampedeLayer::new).await;
        let uri = url(path);
        let read = origin.read.notified();
        let slow = tokio::spawn({
            let (app, uri) = (apps[0].clone(), uri.clone());
            async move { get(&app, &uri).await }
        });
        read.await;
        origin.move_on();
        let changed = send(&apps[1], "POST", &uri, &[]).await;
        assert_eq!(changed.status, StatusCode::OK);
        let late = slow.await.unwrap();
        assert!(late.body().contains(" v1 "), "{}", late.body());
        let name = path.split('?').next().unwrap();
        for app in &apps {
            let answer = get(app, &uri).await;
            assert!(
                at_version(answer.body(), name, 2),
                "{path}: {} ({})",
                answer.body(),
                answer.x_cache()
            );
        }
    }
}

store_test!(a_get_after_a_post_through_one_instance_never_gets_the_load_from_before_it);
/// Issue 29, defect 1 (RFC 9111 §4.4 within one instance): a `GET` of a URL is loading in an
/// instance (its origin request has read version 1 and is held); a client `POST`s to the URL
/// through the same instance, which invalidates it, then `GET`s it through that instance. The
/// `GET` must not join the load from before the `POST` (answered version 1, `HIT`): it is
/// answered version 2 without waiting for that load.
async fn a_get_after_a_post_through_one_instance_never_gets_the_load_from_before_it(
    shared: Shared,
) {
    let origin = Origin::new();
    let (app, _) = instance(&shared, &origin, StampedeLayer::new).await;
    let uri = url("/posted?gated");
    origin.gating.store(true, Ordering::SeqCst);
    let read = origin.read.notified();
    let held = tokio::spawn({
        let (app, uri) = (app.clone(), uri.clone());
        async move { get(&app, &uri).await }
    });
    read.await;
    origin.move_on();
    let changed = send(&app, "POST", &uri, &[]).await;
    assert_eq!(changed.status, StatusCode::OK);
    let after = tokio::time::timeout(LIMIT, get(&app, &uri))
        .await
        .unwrap_or_else(|_| panic!("the GET waited for the load from before"));
    assert!(
        at_version(after.body(), "/posted", 2),
        "{} ({})",
        after.body(),
        after.x_cache()
    );
    origin.release.add_permits(1);
    assert!(held.await.unwrap().body().contains(" v1 "));
}

store_test!(a_purge_of_a_tag_takes_effect_while_a_reload_runs);
/// Issue 29, defect 2 over HTTP: a tagged response is stale, within its own
/// `stale-while-revalidate` window (RFC 5861 §3), and a request has started its reload, whose
/// callers are answered `STALE` meanwhile. A purge of its tag through the same instance must
/// take effect at once: the next request is never answered the purged response, stale or not.
async fn a_purge_of_a_tag_takes_effect_while_a_reload_runs(shared: Shared) {
    let origin = Origin::new();
    let cache = Cache::builder_shared(shared.other_process().await)
        .namespace("http-inval")
        .stale(Duration::from_secs(60))
        .build();
    let layer = StampedeLayer::new(cache);
    let app = origin.router().layer(layer.clone());
    let uri = url("/reloading?tags=a&swr&gated");
    assert!(at_version(get(&app, &uri).await.body(), "/reloading", 1));
    // Past its freshness (`max-age=1`), on the store's clock.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    origin.move_on();
    origin.gating.store(true, Ordering::SeqCst);
    let read = origin.read.notified();
    let stale = get(&app, &uri).await;
    assert_eq!(stale.x_cache(), "STALE", "{}", stale.body());
    read.await;
    layer.purger().purge_tags(["a"]).await.unwrap();
    let mut after = tokio::spawn({
        let (app, uri) = (app.clone(), uri.clone());
        async move { get(&app, &uri).await }
    });
    // Before the fix the purged response was answered at once, from the reload's flight.
    let early = tokio::time::timeout(Duration::from_millis(200), &mut after).await;
    if let Ok(answer) = &early {
        let answer = answer.as_ref().unwrap();
        assert!(
            !at_version(answer.body(), "/reloading", 1),
            "{} ({}) after the purge",
            answer.body(),
            answer.x_cache()
        );
    }
    origin.release.add_permits(1);
    let answer = match early {
        Ok(answer) => answer.unwrap(),
        Err(_) => tokio::time::timeout(LIMIT, after).await.unwrap().unwrap(),
    };
    assert!(
        at_version(answer.body(), "/reloading", 2),
        "{} ({})",
        answer.body(),
        answer.x_cache()
    );
}

store_test!(the_purger_purges_a_url_everywhere);
/// A purge from application code, through the layer's [`Purger`]: the URL, every variant,
/// is gone from every instance.
async fn the_purger_purges_a_url_everywhere(shared: Shared) {
    let origin = Origin::new();
    let (apps, purger) = apps_and_purger(&shared, &origin).await;
    let plain = url("/page");
    let varied = url("/varied?vary=accept-encoding");
    let gzip = [("accept-encoding", "gzip")];
    cached_in_both(&apps, &plain, &[]).await;
    cached_in_both(&apps, &varied, &gzip).await;
    let version = origin.move_on();
    purger.purge_url(&plain.parse().unwrap()).await.unwrap();
    purger.purge_url(&varied.parse().unwrap()).await.unwrap();
    for app in &apps {
        eventually(app, &plain, &[], version).await;
        eventually(app, &varied, &gzip, version).await;
    }
    // Keyed as the layer keys requests in origin-form, with their `Host`.
    let host = [("host", "app.test")];
    cached_in_both(&apps, "/hosted", &host).await;
    let version = origin.move_on();
    purger
        .purge_url(&"http://app.test/hosted".parse().unwrap())
        .await
        .unwrap();
    for app in &apps {
        eventually(app, "/hosted", &host, version).await;
    }
    assert!(format!("{purger:?}").starts_with("Purger"));
}

store_test!(without_the_endpoint_a_purge_goes_to_the_inner_service);
/// Without [`StampedeLayer::purge`], a `PURGE` is an unsafe method like any other: it goes
/// to the inner service, and its non-error response invalidates the URL (RFC 9111 §4.4).
async fn without_the_endpoint_a_purge_goes_to_the_inner_service(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, StampedeLayer::new).await;
    let uri = url("/page");
    cached_in_both(&apps, &uri, &[]).await;
    let version = origin.move_on();
    let calls = origin.calls.get();
    let purge = send(&apps[0], "PURGE", &uri, &[]).await;
    assert_eq!(purge.body(), "changed", "the origin's answer");
    assert_eq!(origin.calls.get(), calls + 1);
    for app in &apps {
        eventually(app, &uri, &[], version).await;
    }
}

/// The layer for the endpoint tests: purges allowed with `Authorization: Bearer let-me`.
fn purging(cache: Cache) -> StampedeLayer {
    StampedeLayer::new(cache).purge(|request| {
        request
            .headers
            .get("authorization")
            .is_some_and(|v| v == "Bearer let-me")
    })
}

store_test!(the_purge_endpoint_removes_a_url_only_when_authorized);
/// The `PURGE` endpoint: refused without authorization (403, nothing removed, the inner
/// service never called); allowed, it removes the URL (every variant) from every instance,
/// and the inner service never sees it either.
async fn the_purge_endpoint_removes_a_url_only_when_authorized(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, purging).await;
    let uri = url("/varied?vary=accept-encoding");
    let gzip = [("accept-encoding", "gzip")];
    let body = cached_in_both(&apps, &uri, &gzip).await;
    origin.move_on();
    let calls = origin.calls.get();
    for headers in [&[][..], &[("authorization", "Bearer guess")]] {
        let refused = send(&apps[0], "PURGE", &uri, headers).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(origin.calls.get(), calls, "not called");
    for app in &apps {
        let answer = send(app, "GET", &uri, &gzip).await;
        assert_eq!((answer.x_cache(), answer.body()), ("HIT", body.as_str()));
    }
    let allowed = [("authorization", "Bearer let-me")];
    let purged = send(&apps[1], "PURGE", &uri, &allowed).await;
    assert_eq!(purged.status, StatusCode::OK);
    assert_eq!(purged.body(), "purged\n");
    assert_eq!(origin.calls.get(), calls, "not called");
    for app in &apps {
        eventually(app, &uri, &gzip, 2).await;
    }
}

/// A store that cannot be reached: the unsafe method's response is still the origin's, a
/// `PURGE` gets a 503 the layer says it made, and the purger's call is an error.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_is_logged_answered_503_or_an_error() {
    let mut shared = Shared::redis().await;
    let origin = Origin::new();
    let (app, layer) = instance(&shared, &origin, purging).await;
    let uri = url("/page");
    assert_eq!(get(&app, &uri).await.x_cache(), "MISS");
    shared.server_mut().kill();
    let started = std::time::Instant::now();
    let changed = send(&app, "POST", &format!("{uri}?status=201"), &[]).await;
    assert_eq!(
        (changed.status, changed.body()),
        (StatusCode::CREATED, "changed")
    );
    let purge = send(&app, "PURGE", &uri, &[("authorization", "Bearer let-me")]).await;
    assert_eq!(purge.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(purge.body().contains("not the origin"), "{}", purge.body());
    let error = layer
        .purger()
        .purge_url(&uri.parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), tower_stampede::ErrorKind::Store);
    assert!(started.elapsed() < LIMIT, "no long wait");
}

store_test!(a_purge_of_a_tag_removes_every_response_that_carries_it);
/// Response tags: a response tagged `Surrogate-Key: a b` is stored with both tags (the field
/// is not sent to clients), and a purge of either removes it from every instance, with every
/// `Vary` variant that carries it; responses without the tag stay.
async fn a_purge_of_a_tag_removes_every_response_that_carries_it(shared: Shared) {
    let origin = Origin::new();
    let (a, layer) = instance(&shared, &origin, StampedeLayer::new).await;
    let (b, _) = instance(&shared, &origin, StampedeLayer::new).await;
    let apps = [a, b];
    let tagged = url("/tagged?tags=a+b");
    let varied = url("/tagged-vary?tags=b+c&vary=accept-encoding");
    let other = url("/other?tags=a+c");
    let gzip = [("accept-encoding", "gzip")];
    cached_in_both(&apps, &tagged, &[]).await;
    cached_in_both(&apps, &varied, &gzip).await;
    cached_in_both(&apps, &varied, &[]).await;
    cached_in_both(&apps, &other, &[]).await;
    for app in &apps {
        let answer = get(app, &tagged).await;
        assert!(
            !answer.headers.contains_key("surrogate-key"),
            "the tags stay between origin and layer"
        );
    }
    let version = origin.move_on();
    layer.purger().purge_tags(["b"]).await.unwrap();
    for app in &apps {
        let reloaded = eventually(app, &tagged, &[], version).await;
        assert!(!reloaded.headers.contains_key("surrogate-key"));
        eventually(app, &varied, &gzip, version).await;
        eventually(app, &varied, &[], version).await;
        let kept = get(app, &other).await;
        assert_eq!(kept.x_cache(), "HIT", "not tagged b");
        assert!(at_version(kept.body(), "/other", 1));
    }
}

store_test!(cache_tag_is_read_and_tag_fields_may_be_kept);
/// `Cache-Tag` (comma-separated) tags a response too; with `keep_tag_headers(true)` the tag
/// fields reach clients, from the origin and from the cache alike. Tag fields are read from
/// the configured fields only.
async fn cache_tag_is_read_and_tag_fields_may_be_kept(shared: Shared) {
    let origin = Origin::new();
    let keep = |cache| StampedeLayer::new(cache).keep_tag_headers(true);
    let (app, layer) = instance(&shared, &origin, keep).await;
    let uri = url("/cache-tag?cache-tag=x,y");
    for mark in ["MISS", "HIT"] {
        let answer = get(&app, &uri).await;
        assert_eq!(answer.x_cache(), mark);
        assert_eq!(answer.headers["cache-tag"], "x,y", "kept");
    }
    let version = origin.move_on();
    layer.purger().purge_tags(["y"]).await.unwrap();
    eventually(&app, &uri, &[], version).await;

    // Only `Surrogate-Key` read: `Cache-Tag` is neither a tag nor removed.
    let only =
        |cache| StampedeLayer::new(cache).tag_headers([HeaderName::from_static("surrogate-key")]);
    let (app, layer) = instance(&shared, &origin, only).await;
    let uri = url("/only-surrogate?cache-tag=z");
    let first = get(&app, &uri).await;
    assert_eq!(first.headers["cache-tag"], "z");
    layer.purger().purge_tags(["z"]).await.unwrap();
    assert_eq!(get(&app, &uri).await.x_cache(), "HIT");
}

store_test!(tags_are_bounded);
/// What is accepted is bounded: a response with more than 128 tags (or a tag over 256
/// bytes) is passed through, not stored, since a purge could not reach it; a `PURGE` with
/// that many, or with a tag field that names none, is refused with a 400.
async fn tags_are_bounded(shared: Shared) {
    let origin = Origin::new();
    let (app, _) = instance(&shared, &origin, purging).await;
    let many: Vec<String> = (0..129).map(|i| format!("t{i}")).collect();
    let long = "x".repeat(257);
    for tags in [many.join("+"), long.clone()] {
        let uri = url(&format!("/many?tags={tags}"));
        for _ in 0..2 {
            let answer = get(&app, &uri).await;
            assert_eq!(answer.x_cache(), "BYPASS");
            assert!(!answer.headers.contains_key("surrogate-key"));
        }
    }
    let fine = url(&format!("/fine?tags={}", many[..128].join("+")));
    assert_eq!(get(&app, &fine).await.x_cache(), "MISS");
    assert_eq!(get(&app, &fine).await.x_cache(), "HIT");
    let headers = [
        ("authorization", "Bearer let-me"),
        ("surrogate-key", &many.join(" ")),
    ];
    let refused = send(&app, "PURGE", &fine, &headers).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let none = [("authorization", "Bearer let-me"), ("surrogate-key", " ")];
    let refused = send(&app, "PURGE", &fine, &none).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "no tag");
    assert_eq!(get(&app, &fine).await.x_cache(), "HIT");
}

store_test!(the_purge_endpoint_purges_tags_when_asked);
/// The `PURGE` endpoint with a `Surrogate-Key` field purges those tags instead of the URL
/// (as Varnish's xkey does), and only when authorized.
async fn the_purge_endpoint_purges_tags_when_asked(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, purging).await;
    let tagged = url("/tagged?tags=a+b");
    let untagged = url("/untagged");
    cached_in_both(&apps, &tagged, &[]).await;
    cached_in_both(&apps, &untagged, &[]).await;
    let version = origin.move_on();
    let refused = send(&apps[0], "PURGE", &untagged, &[("surrogate-key", "b")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(get(&apps[0], &tagged).await.x_cache(), "HIT");
    let headers = [("authorization", "Bearer let-me"), ("surrogate-key", "x b")];
    let purged = send(&apps[0], "PURGE", &untagged, &headers).await;
    assert_eq!(purged.status, StatusCode::OK);
    for app in &apps {
        eventually(app, &tagged, &[], version).await;
        let kept = get(app, &untagged).await;
        assert_eq!(kept.x_cache(), "HIT", "tags, not the URL");
    }
}

/// Commands the Redis server behind `shared` has run since its stats were reset, by name
/// (`INFO commandstats`), but for those of the test itself (`info`, `config`); none for the
/// embedded store.
/// The commands the Redis server behind `shared` has run since its stats were reset, but the
/// test's own (`INFO`, `CONFIG`) and the subscriber's liveness `PING`s (one a second, see
/// `store/redis/liveness.rs`), which a run longer than a second meets whatever it does.
async fn commands(shared: &Shared) -> Vec<(String, u64)> {
    let info = shared.info("commandstats").await.unwrap_or_default();
    command_calls(&info)
        .filter(|(name, _)| name != "ping")
        .collect()
}

/// The calls of each command in an `INFO commandstats` answer, but `INFO` and `CONFIG`.
fn command_calls(info: &str) -> impl Iterator<Item = (String, u64)> + '_ {
    info.lines().filter_map(|line| {
        let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
        let calls = rest.split(',').next()?.parse().ok()?;
        (!name.starts_with("info") && !name.starts_with("config")).then(|| (name.to_owned(), calls))
    })
}

/// The reads from clients' sockets the Redis server behind `shared` has processed since its
/// stats were reset (`total_reads_processed` of `INFO stats`): a pipeline sent in one write is
/// one read, so this counts round trips; 0 for the embedded store. Less the subscriber's
/// liveness `PING`s, one read each, counted in the same answer (`INFO all`).
async fn reads(shared: &Shared) -> u64 {
    let info = shared.info("all").await.unwrap_or_default();
    let reads: u64 = info
        .lines()
        .find_map(|line| line.strip_prefix("total_reads_processed:"))
        .map_or(0, |reads| reads.trim().parse().unwrap());
    let pings = command_calls(&info)
        .find(|(name, _)| name == "ping")
        .map_or(0, |(_, calls)| calls);
    reads - pings
}

store_test!(unsafe_invalidation_is_a_choice_and_one_round_trip);
/// Invalidation on unsafe methods is the layer's choice (RFC 9111 §4.4 asks for it, and it
/// stays on by default), for services where every call is a `POST` (gRPC, GraphQL,
/// JSON-RPC). Off, 1,000 `POST`s cost the store nothing (not one call, not one Redis
/// command) and the stored page stays. On, and with no interval between invalidations (RFC
/// 9111 §4.4 to the letter), each `POST` is one store call, one round trip on Redis (one read
/// of the server's, `INFO stats`), however many keys it invalidates: here eight, its URL and
/// its `Location`, each with and without credentials and with and without forwarding headers
/// (eight `EVALSHA`s in its pipeline, `INFO commandstats`).
async fn unsafe_invalidation_is_a_choice_and_one_round_trip(shared: Shared) {
    const POSTS: usize = 1_000;
    // The reads of the test's own connections to Redis (its INFO and CONFIG calls), as
    // the run without invalidation counts them.
    let mut own_reads = 0;
    for on in [false, true] {
        let what = format!("invalidation {}", if on { "on" } else { "off" });
        let origin = Origin::new();
        let observed = support::observed::Observed::new(&shared.store, Duration::ZERO);
        let cache = Cache::builder_shared(observed.clone())
            .namespace(if on { "rpc-on" } else { "rpc-off" })
            .build();
        let layer = StampedeLayer::new(cache)
            .invalidate_on_unsafe(on)
            .invalidation_interval(Duration::ZERO);
        let app = origin.router().layer(layer);
        let rpc = url("/rpc?location=/created/7");
        assert_eq!(get(&app, &rpc).await.x_cache(), "MISS", "{what}");
        assert_eq!(get(&app, &rpc).await.x_cache(), "HIT", "{what}");
        shared.reset_stats().await;
        let calls = observed.calls();
        for _ in 0..POSTS {
            let answer = send(&app, "POST", &rpc, &[]).await;
            assert_eq!(answer.status, StatusCode::OK, "{what}");
        }
        let calls = observed.calls() - calls;
        let commands = commands(&shared).await;
        let reads = reads(&shared).await;
        let count = |command: &str| {
            commands
                .iter()
                .find(|(name, _)| name == command)
                .map_or(0, |(_, calls)| *calls)
        };
        // The first pipeline met a server without the script: its calls were refused,
        // the script loaded and the pipeline sent again.
        let evalsha = count("evalsha") - 8 * count("script|load");
        if on {
            assert_eq!(calls, POSTS, "{what}: one store call per POST");
            if shared.name == "redis" {
                assert_eq!(evalsha, 8 * POSTS as u64, "{what}: {commands:?}");
                // The first pipeline's two more: the script's load, and the pipeline again.
                let round_trips = reads - own_reads - 2 * count("script|load");
                assert_eq!(round_trips, POSTS as u64, "{what}: one round trip per POST");
            }
            assert_eq!(get(&app, &rpc).await.x_cache(), "MISS", "{what}");
        } else {
            assert_eq!(calls, 0, "{what}: no store call");
            own_reads = reads;
            assert!(commands.is_empty(), "{what}: {commands:?}");
            assert_eq!(get(&app, &rpc).await.x_cache(), "HIT", "{what}: kept");
        }
    }
}

store_test!(a_predicate_picks_the_unsafe_requests_that_invalidate);
/// A predicate picks the unsafe requests that invalidate (RFC 9111 §4.4 for those): a
/// `POST /graphql` leaves the stored `GET /graphql` as it was, a `POST /page` invalidates.
async fn a_predicate_picks_the_unsafe_requests_that_invalidate(shared: Shared) {
    let origin = Origin::new();
    let picked = |cache| {
        StampedeLayer::new(cache).invalidate_on_unsafe_if(|request: &http::request::Parts| {
            request.uri.path() != "/graphql"
        })
    };
    let apps = apps(&shared, &origin, picked).await;
    let (graphql, page) = (url("/graphql"), url("/page"));
    let kept = cached_in_both(&apps, &graphql, &[]).await;
    cached_in_both(&apps, &page, &[]).await;
    let version = origin.move_on();
    assert_eq!(
        send(&apps[0], "POST", &graphql, &[]).await.body(),
        "changed"
    );
    assert_eq!(send(&apps[0], "POST", &page, &[]).await.body(), "changed");
    let next = get(&apps[0], &page).await;
    assert_eq!(next.x_cache(), "MISS");
    assert!(at_version(next.body(), "/page", version));
    eventually(&apps[1], &page, &[], version).await;
    for app in &apps {
        let graphql = get(app, &graphql).await;
        assert_eq!((graphql.x_cache(), graphql.body()), ("HIT", kept.as_str()));
    }
}

store_test!(a_purge_that_returns_ok_removed_the_page_under_either_scheme);
/// Behind a load balancer that ends TLS, the layer sees `GET /p/5` with `Host: shop.example`,
/// and the app's code names the page as its users do, `https://shop.example/p/5`. A purge that
/// returns `Ok` has removed the page from every instance, whichever scheme it names; a purge
/// of a path alone, which the layer could never have stored a page under (no authority), is
/// an error and removes nothing.
async fn a_purge_that_returns_ok_removed_the_page_under_either_scheme(shared: Shared) {
    let origin = Origin::new();
    let (apps, purger) = apps_and_purger(&shared, &origin).await;
    let host = [("host", "shop.example")];
    let kept = cached_in_both(&apps, "/p/5", &host).await;
    let error = purger
        .purge_url(&"/p/5".parse().unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), tower_stampede::ErrorKind::Url);
    for app in &apps {
        let answer = send(app, "GET", "/p/5", &host).await;
        assert_eq!((answer.x_cache(), answer.body()), ("HIT", kept.as_str()));
    }
    for purged in ["https://shop.example/p/5", "http://shop.example/p/5"] {
        for app in &apps {
            let answer = send(app, "GET", "/p/5", &host).await;
            assert!(at_version(
                answer.body(),
                "/p/5",
                origin.version.load(Ordering::SeqCst)
            ));
        }
        let version = origin.move_on();
        purger.purge_url(&purged.parse().unwrap()).await.unwrap();
        for app in &apps {
            eventually(app, "/p/5", &host, version).await;
        }
    }
    // Requests in absolute form with `https` (a client-side layer) are purged alike.
    let secure = "https://shop.example/q/1";
    cached_in_both(&apps, secure, &[]).await;
    let version = origin.move_on();
    purger
        .purge_url(&"http://shop.example/q/1".parse().unwrap())
        .await
        .unwrap();
    for app in &apps {
        eventually(app, secure, &[], version).await;
    }
}

store_test!(a_purge_reaches_the_page_under_any_spelling_of_its_authority);
/// A purge that returns `Ok` removed the page however its authority is spelled, in the purge
/// or in the `Host` the page was requested with: a host's case and a scheme's default port
/// do not change the URL (RFC 3986 §6.2.2.1, §6.2.3; RFC 9110 §4.2.3), so
/// `https://SHOP.example:443/p` names the page that `Host: shop.example` stored.
async fn a_purge_reaches_the_page_under_any_spelling_of_its_authority(shared: Shared) {
    let origin = Origin::new();
    let (apps, purger) = apps_and_purger(&shared, &origin).await;
    for (i, (stored_with, purged)) in [
        ("Shop.Example", "https://shop.example/p"),
        ("shop.example:80", "https://shop.example/p"),
        ("shop.example:443", "https://shop.example/p"),
        ("shop.example", "https://SHOP.EXAMPLE:443/p"),
        ("shop.example", "http://shop.example:80/p"),
    ]
    .into_iter()
    .enumerate()
    {
        let (path, host) = (format!("/p/{i}"), [("host", stored_with)]);
        cached_in_both(&apps, &path, &host).await;
        let version = origin.move_on();
        let purged = format!("{purged}/{i}");
        purger.purge_url(&purged.parse().unwrap()).await.unwrap();
        for app in &apps {
            eventually(app, &path, &host, version).await;
        }
    }
}

store_test!(instances_keyed_by_one_authority_share_one_cache);
/// Two instances behind a load balancer that forwards each request with the instance's own
/// address as `Host`, keyed by one configured authority (`DefaultKey::authority`), share one
/// cache: a cold stampede over both costs one load, and a `POST` through one is seen by the
/// other's next `GET` (RFC 9111 §4.4 across instances).
async fn instances_keyed_by_one_authority_share_one_cache(shared: Shared) {
    use tower_stampede::http::DefaultKey;
    let origin = Origin::new();
    let site = |cache| {
        let key = DefaultKey.authority(http::uri::Authority::from_static("shop.example"));
        StampedeLayer::new(cache).make_key(key)
    };
    let apps = apps(&shared, &origin, site).await;
    let hosts = [[("host", "10.0.0.1:8080")], [("host", "10.0.0.2:8080")]];
    let sent = Counter::default();
    let mut requests = Vec::new();
    for i in 0..40 {
        let (app, host, sent) = (apps[i % 2].clone(), hosts[i % 2], sent.clone());
        requests.push(tokio::spawn(async move {
            sent.hit();
            send(&app, "GET", "/hot?held", &host).await
        }));
    }
    // The first load is held until every request has been sent.
    support::wait_until(shared.name, || origin.calls.get() > 0 && sent.get() == 40).await;
    origin.release.add_permits(40);
    for request in requests {
        let answer = request.await.unwrap();
        assert!(at_version(answer.body(), "/hot", 1));
    }
    assert_eq!(origin.calls.get(), 1, "one load for both");

    cached_in_both(&apps, "/p/2", &hosts[0]).await;
    let version = origin.move_on();
    assert_eq!(
        send(&apps[0], "POST", "/p/2", &hosts[0]).await.body(),
        "changed"
    );
    let next = send(&apps[0], "GET", "/p/2", &hosts[0]).await;
    assert_eq!(next.x_cache(), "MISS");
    let seen = eventually(&apps[1], "/p/2", &hosts[1], version).await;
    assert_eq!(seen.x_cache(), "HIT", "a's reload");
}

store_test!(a_flood_of_unsafe_requests_reloads_a_hot_page_once_an_interval);
/// Issue 52: invalidation by unsafe requests (RFC 9111 §4.4) is no way to turn the cache off.
/// 1,000 anonymous `POST`s and 1,000 `GET`s carrying `X-HTTP-Method-Override: DELETE`,
/// interleaved with 2,000 `GET`s of a stored hot page in two instances, all within one
/// interval: the first invalidates at once (its client reads the change next), every other
/// is coalesced into one more invalidation at the interval's end, and each says which in
/// `Cache-Status`. The origin loads the page three times in all (the first load, the reload
/// after the first `POST`, the reload after the coalesced invalidation), not 2,000. The
/// interval is a minute here so that the flood fits in it on any machine (on Redis, real
/// time); on paused time the test then waits for it, and the change the coalesced
/// invalidation carries is read in both instances.
async fn a_flood_of_unsafe_requests_reloads_a_hot_page_once_an_interval(shared: Shared) {
    const FLOOD: usize = 1_000;
    const INTERVAL: Duration = Duration::from_secs(60);
    let origin = Origin::new();
    let apps = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).invalidation_interval(INTERVAL)
    })
    .await;
    let uri = url("/hot");
    cached_in_both(&apps, &uri, &[]).await;
    let (mut now, mut coalesced) = (0, 0);
    for i in 0..2 * FLOOD {
        let unsafe_request = if i % 2 == 0 {
            send(&apps[i % 2], "POST", &uri, &[]).await
        } else {
            let delete = [("x-http-method-override", "DELETE")];
            send(&apps[i % 2], "GET", &uri, &delete).await
        };
        let said = &unsafe_request.headers["cache-status"];
        match said.to_str().unwrap() {
            "tower-stampede; fwd=method; fwd-status=200; detail=invalidated" => now += 1,
            "tower-stampede; fwd=method; fwd-status=200; detail=invalidation-coalesced" => {
                coalesced += 1
            }
            other => panic!("{other}"),
        }
        for app in &apps {
            let page = get(app, &uri).await;
            assert_eq!(page.status, StatusCode::OK);
        }
    }
    // One invalidation now per instance (each keeps its own interval), the rest coalesced.
    assert_eq!((now, coalesced), (2, 2 * FLOOD - 2));
    let loads = origin.calls.get() - 2 * FLOOD;
    assert!(loads <= 3, "{loads} loads of the page");
    if shared.name == "memory" {
        let version = origin.move_on();
        tokio::time::sleep(INTERVAL).await;
        for app in &apps {
            eventually(app, &uri, &[], version).await;
        }
        // One reload after the coalesced invalidations, or two: each instance has one, and
        // the second may land after the first's reload.
        let loads = origin.calls.get() - 2 * FLOOD;
        assert!((4..=5).contains(&loads), "{loads} loads");
    }
}

store_test!(a_coalesced_invalidation_is_read_once_its_interval_ends);
/// Issue 52: an unsafe request coalesced into the end of its URL's interval still invalidates
/// (no change goes unseen for longer than the interval), over a real Redis too, where the
/// interval is real time: the page changed by the second `POST` is read once the interval of
/// the first has passed. Real time on Redis: the interval is a timer against a real server.
async fn a_coalesced_invalidation_is_read_once_its_interval_ends(shared: Shared) {
    let origin = Origin::new();
    let apps = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).invalidation_interval(Duration::from_millis(500))
    })
    .await;
    let uri = url("/edited");
    cached_in_both(&apps, &uri, &[]).await;
    let first = origin.move_on();
    assert_eq!(
        send(&apps[0], "POST", &uri, &[]).await.status,
        StatusCode::OK
    );
    let read = get(&apps[0], &uri).await;
    assert!(at_version(read.body(), "/edited", first), "{}", read.body());
    let second = origin.move_on();
    let coalesced = send(&apps[0], "POST", &uri, &[]).await;
    assert_eq!(
        coalesced.headers["cache-status"],
        "tower-stampede; fwd=method; fwd-status=200; detail=invalidation-coalesced"
    );
    // Until the interval ends, the page of the first change may still be served; then the
    // second change is read everywhere.
    for app in &apps {
        eventually(app, &uri, &[], second).await;
    }
}
