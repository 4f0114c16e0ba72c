//! Revalidation and the stale rules of responses, through the real middleware over
//! `MemoryStore` and (feature `redis`) a real `redis-server`: each test sends requests, then
//! checks what reached the origin and which conditional header fields it saw. Each cites the
//! RFC section it checks.
//!
//! The origin serves one document with an `ETag` of its version (or, dated, a `Last-Modified`
//! of it) and answers `304` to an `If-None-Match` (`If-Modified-Since`) that names it. Responses are fresh for one second: the tests wait for
//! that second to pass (there is no faster way to make a Redis value stale).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use axum::Router;
use support::http::{send, Answer};
use support::{store_test, wait_until, Counter, Shared};
use tower_stampede::{Cache, StampedeLayer};

/// Long enough for a response fresh for one second to be stale.
const PAST_FRESHNESS: Duration = Duration::from_millis(1100);

/// The origin of one document.
#[derive(Clone)]
struct Origin {
    version: Arc<AtomicU32>,
    cache_control: Arc<Mutex<&'static str>>,
    calls: Counter,
    /// The `If-None-Match` of each request that reached the origin.
    conditions: Arc<Mutex<Vec<Option<HeaderValue>>>>,
    /// The `If-Modified-Since` of each request that reached the origin.
    since: Arc<Mutex<Vec<Option<HeaderValue>>>>,
    /// Whether the document's validator is its `Last-Modified` (no `ETag`).
    dated: bool,
    /// While set, every answer is `503`.
    failing: Arc<AtomicBool>,
    /// How long each answer takes.
    delay: Duration,
    /// While set, each answer waits for a permit of `gate`.
    gated: Arc<AtomicBool>,
    /// Requests that reached the origin, counted before the gate.
    arrived: Counter,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Origin {
    fn new(cache_control: &'static str) -> Self {
        Origin {
            version: Arc::new(AtomicU32::new(1)),
            cache_control: Arc::new(Mutex::new(cache_control)),
            calls: Counter::default(),
            conditions: Arc::default(),
            since: Arc::default(),
            dated: false,
            failing: Arc::default(),
            delay: Duration::ZERO,
            gated: Arc::default(),
            arrived: Counter::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    fn router(&self) -> Router {
        let origin = self.clone();
        Router::new().fallback(move |headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                origin.arrived.hit();
                tokio::time::sleep(origin.delay).await;
                if origin.gated.load(Ordering::SeqCst) {
                    origin.gate.acquire().await.unwrap().forget();
                }
                origin.answer(&headers)
            }
        })
    }

    fn answer(&self, headers: &HeaderMap) -> Response<Body> {
        let n = self.calls.hit();
        let asked = headers.get("if-none-match").cloned();
        self.conditions.lock().unwrap().push(asked.clone());
        if self.failing.load(Ordering::SeqCst) {
            let mut response = Response::new(Body::from("down"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return response;
        }
        let since = headers.get("if-modified-since").cloned();
        self.since.lock().unwrap().push(since.clone());
        let version = self.version.load(Ordering::SeqCst);
        let (validator, etag) = if self.dated {
            // One date per version (a Wednesday, the 1st or later, of November 2023).
            let modified = format!("Wed, {:02} Nov 2023 00:00:00 GMT", 1 + 7 * (version - 1));
            ("last-modified", modified)
        } else {
            ("etag", format!("\"v{version}\""))
        };
        let asked = if self.dated { since } else { asked };
        let unchanged = asked.is_some_and(|asked| asked.as_bytes() == etag.as_bytes());
        let mut response = if unchanged {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            response
        } else {
            Response::new(Body::from(format!("v{version} #{n}")))
        };
        let headers = response.headers_mut();
        headers.insert(validator, HeaderValue::from_str(&etag).unwrap());
        let cache_control = *self.cache_control.lock().unwrap();
        headers.insert("cache-control", HeaderValue::from_static(cache_control));
        headers.insert("x-answer", HeaderValue::from_str(&n.to_string()).unwrap());
        response
    }

    fn conditions(&self) -> Vec<Option<HeaderValue>> {
        self.conditions.lock().unwrap().clone()
    }

    fn since(&self) -> Vec<Option<HeaderValue>> {
        self.since.lock().unwrap().clone()
    }
}

async fn get_with(app: &Router, headers: &[(&'static str, &'static str)]) -> Answer {
    send(app, "GET", "http://app.test/doc", headers).await
}

async fn get(app: &Router) -> Answer {
    get_with(app, &[]).await
}

/// A cache that keeps values a minute past their freshness, to revalidate them, with a store
/// timeout that a busy machine does not reach (a timed-out store call loads on its own).
/// A cache that keeps entries for revalidation. Without early refresh: these tests count the
/// origin's requests, and responses fresh for a second, loaded slowly, would be refreshed
/// early by almost any hit.
fn keeping(shared: &Shared) -> tower_stampede::CacheBuilder {
    shared
        .cache()
        .keep_for_revalidation(Duration::from_secs(60))
        .store_timeout(Duration::from_secs(2))
        .early_refresh(0.0)
}

fn layered(origin: &Origin, cache: Cache) -> Router {
    origin.router().layer(StampedeLayer::new(cache))
}

store_test!(a_stale_response_is_revalidated_and_a_304_refreshes_it);
async fn a_stale_response_is_revalidated_and_a_304_refreshes_it(shared: Shared) {
    let origin = Origin::new("max-age=1");
    let app = layered(&origin, keeping(&shared).build());
    // The client's own conditional is answered by the layer, never sent on: the load
    // asks for the full response (RFC 9111 §4.3.1 is for the cache's own validators).
    let first = get_with(&app, &[("if-none-match", "\"client\"")]).await;
    assert_eq!((first.x_cache(), first.body()), ("MISS", "v1 #1"));
    tokio::time::sleep(PAST_FRESHNESS).await;
    // RFC 9111 §4.3.1: the reload of the stale response carries its `ETag`; §4.3.4: the
    // `304` updates the stored header fields (`x-answer`), and the stored body is served.
    let revalidated = get(&app).await;
    assert_eq!(revalidated.status, StatusCode::OK);
    assert_eq!(revalidated.body(), "v1 #1");
    assert_eq!(revalidated.headers["x-answer"], "2");
    // RFC 9211 §2.2, §2.3, §2.5: a forward for a stale entry, answered `304`, stored again.
    let cache_status = revalidated.headers["cache-status"].to_str().unwrap();
    assert!(
        cache_status.starts_with("tower-stampede; fwd=stale; fwd-status=304; stored; ttl="),
        "{cache_status}"
    );
    assert_eq!(
        origin.conditions(),
        [None, Some(HeaderValue::from_static("\"v1\""))]
    );
    // Fresh again: a hit, in another instance too.
    let other = app_over(&origin, &shared).await;
    for app in [&app, &other] {
        let hit = get(app).await;
        assert_eq!((hit.x_cache(), hit.body()), ("HIT", "v1 #1"));
        assert_eq!(hit.headers["x-answer"], "2");
    }
    assert_eq!(origin.calls.get(), 2);
    // A changed document: the conditional reload gets a `200`, which replaces the entry.
    origin.version.store(2, Ordering::SeqCst);
    tokio::time::sleep(PAST_FRESHNESS).await;
    let changed = get(&app).await;
    assert_eq!(changed.body(), "v2 #3");
    // RFC 9211 §2.2: still a forward for a stale entry, though the origin sent a new one.
    let cache_status = changed.headers["cache-status"].to_str().unwrap();
    assert!(
        cache_status.starts_with("tower-stampede; fwd=stale; fwd-status=200; stored; ttl="),
        "{cache_status}"
    );
    assert_eq!(
        origin.conditions()[2],
        Some(HeaderValue::from_static("\"v1\""))
    );
    assert_eq!(get(&other).await.body(), "v2 #3");
}

store_test!(a_response_dated_by_last_modified_is_revalidated_with_if_modified_since);
async fn a_response_dated_by_last_modified_is_revalidated_with_if_modified_since(shared: Shared) {
    let mut origin = Origin::new("max-age=1");
    origin.dated = true;
    let app = layered(&origin, keeping(&shared).build());
    let first = get(&app).await;
    assert_eq!((first.x_cache(), first.body()), ("MISS", "v1 #1"));
    assert!(!first.headers.contains_key("etag"));
    tokio::time::sleep(PAST_FRESHNESS).await;
    // RFC 9111 §4.3.1: without an entity tag, the reload carries `If-Modified-Since` with
    // the stored `Last-Modified`; §4.3.4: the `304` refreshes the entry, whose body is
    // served with the updated fields.
    let revalidated = get(&app).await;
    assert_eq!(
        (revalidated.status, revalidated.body()),
        (StatusCode::OK, "v1 #1")
    );
    assert_eq!(revalidated.headers["x-answer"], "2");
    let modified = HeaderValue::from_static("Wed, 01 Nov 2023 00:00:00 GMT");
    assert_eq!(origin.since(), [None, Some(modified)]);
    assert_eq!(origin.conditions(), [None, None]);
    assert_eq!(get(&app).await.x_cache(), "HIT");
    assert_eq!(origin.calls.get(), 2);
}

/// Another instance (its own L1; for Redis its own connections) over the same store.
async fn app_over(origin: &Origin, shared: &Shared) -> Router {
    let cache = Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .keep_for_revalidation(Duration::from_secs(60))
        .store_timeout(Duration::from_secs(2))
        .early_refresh(0.0)
        .build();
    layered(origin, cache)
}

store_test!(no_cache_is_stored_and_revalidated_before_each_use);
async fn no_cache_is_stored_and_revalidated_before_each_use(shared: Shared) {
    // RFC 9111 §5.2.2.4: stored, but never served without a successful revalidation.
    let origin = Origin::new("no-cache, max-age=60");
    let app = layered(&origin, keeping(&shared).build());
    assert_eq!(get(&app).await.body(), "v1 #1");
    for n in 2..=3 {
        let answer = get(&app).await;
        assert_eq!(answer.body(), "v1 #1", "the stored body");
        assert_eq!(origin.calls.get(), n, "revalidated each time");
        assert_eq!(
            origin.conditions().last().cloned().flatten(),
            Some(HeaderValue::from_static("\"v1\""))
        );
    }
    // A cache that keeps nothing past freshness cannot revalidate: it passes `no-cache`.
    let plain = Origin::new("no-cache");
    let bare = layered(&plain, shared.cache().namespace("bare").build());
    for _ in 0..2 {
        assert_eq!(get(&bare).await.x_cache(), "BYPASS");
    }
    assert_eq!(plain.conditions(), [None, None]);
}

store_test!(must_revalidate_is_never_served_stale_even_within_the_operator_s_window);
async fn must_revalidate_is_never_served_stale_even_within_the_operator_s_window(shared: Shared) {
    for (directive, stale_served) in [
        ("max-age=1", true),
        // RFC 9111 §5.2.2.2, §5.2.2.8, §5.2.2.10 (and §4.2.4).
        ("max-age=1, must-revalidate", false),
        ("max-age=1, proxy-revalidate", false),
        ("s-maxage=1", false),
    ] {
        let origin = Origin::new(directive);
        // The operator serves anything stale for a minute, in place of an error too.
        let cache = shared
            .cache()
            .namespace(directive)
            .stale(Duration::from_secs(60))
            .store_timeout(Duration::from_secs(2))
            .build();
        let app = layered(&origin, cache);
        assert_eq!(get(&app).await.body(), "v1 #1");
        tokio::time::sleep(PAST_FRESHNESS).await;
        origin.failing.store(true, Ordering::SeqCst);
        let answer = get(&app).await;
        assert_eq!(
            answer.body() == "v1 #1",
            stale_served,
            "{directive}: {} {}",
            answer.status,
            answer.body()
        );
        if !stale_served {
            assert!(answer.status.is_server_error(), "{directive}");
        }
    }
}

store_test!(a_response_s_own_stale_windows_apply_where_the_operator_set_none);
async fn a_response_s_own_stale_windows_apply_where_the_operator_set_none(shared: Shared) {
    // RFC 5861 §3: served stale at once while one reload revalidates it. The reload
    // waits at the origin's gate until the stale answer is in: a reload that ends in the
    // poll that starts it (an origin that answers without waiting, over the embedded
    // store) rightly answers with its fresh result instead.
    let origin = Origin::new("max-age=1, stale-while-revalidate=60");
    let app = layered(&origin, keeping(&shared).namespace("swr").build());
    assert_eq!(get(&app).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    origin.gated.store(true, Ordering::SeqCst);
    let stale = get(&app).await;
    assert_eq!((stale.x_cache(), stale.body()), ("STALE", "v1 #1"));
    origin.gated.store(false, Ordering::SeqCst);
    origin.gate.add_permits(1);
    // The background revalidation lands: fresh again (bounded wait).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(&app).await.x_cache() != "HIT" {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.calls.get(), 2, "one revalidation");
    // RFC 5861 §4: served in place of a failed reload.
    let origin = Origin::new("max-age=1, stale-if-error=60");
    let app = layered(&origin, keeping(&shared).namespace("sie").build());
    assert_eq!(get(&app).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    origin.failing.store(true, Ordering::SeqCst);
    let stood_in = get(&app).await;
    assert_eq!(
        (stood_in.status, stood_in.body()),
        (StatusCode::OK, "v1 #1")
    );
    // RFC 5861 §4, within the operator's maximum: capped at 0, the response's window
    // serves nothing.
    let origin = Origin::new("max-age=1, stale-if-error=60");
    let capped = StampedeLayer::new(keeping(&shared).namespace("capped").build())
        .max_response_stale(Duration::ZERO);
    let app = origin.router().layer(capped);
    assert_eq!(get(&app).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    origin.failing.store(true, Ordering::SeqCst);
    assert!(get(&app).await.status.is_server_error());
    // Without them, the operator's (none) decides: a failed reload is no stale answer.
    let origin = Origin::new("max-age=1");
    let app = layered(&origin, keeping(&shared).namespace("none").build());
    assert_eq!(get(&app).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    origin.failing.store(true, Ordering::SeqCst);
    assert!(get(&app).await.status.is_server_error());
}

store_test!(one_conditional_request_per_stampede_over_four_instances);
async fn one_conditional_request_per_stampede_over_four_instances(shared: Shared) {
    // RFC 9111 §4.3.1, coalesced: a stale response is revalidated once, cluster-wide.
    let mut origin = Origin::new("max-age=1");
    origin.delay = Duration::from_millis(200);
    let mut apps = vec![layered(&origin, keeping(&shared).build())];
    for _ in 0..3 {
        apps.push(app_over(&origin, &shared).await);
    }
    assert_eq!(get(&apps[0]).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    let requests: Vec<_> = (0..200)
        .map(|i| {
            let app = apps[i % 4].clone();
            tokio::spawn(async move { get(&app).await })
        })
        .collect();
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!((answer.status, answer.body()), (StatusCode::OK, "v1 #1"));
    }
    assert_eq!(
        origin.conditions(),
        [None, Some(HeaderValue::from_static("\"v1\""))],
        "one conditional request"
    );
}

store_test!(a_server_error_for_the_waiters_keeps_the_entry_for_the_next_revalidation);
async fn a_server_error_for_the_waiters_keeps_the_entry_for_the_next_revalidation(shared: Shared) {
    // RFC 9111 §4.3.1: a stale response (never served stale: no window) is reloaded with
    // its validator; the origin answers `503` without freshness to that reload.
    let origin = Origin::new("max-age=1");
    let apps = [
        layered(&origin, keeping(&shared).build()),
        app_over(&origin, &shared).await,
    ];
    assert_eq!(get(&apps[0]).await.body(), "v1 #1");
    tokio::time::sleep(PAST_FRESHNESS).await;
    origin.failing.store(true, Ordering::SeqCst);
    origin.gated.store(true, Ordering::SeqCst);
    let sent = Counter::default();
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let (app, sent) = (apps[i % 2].clone(), sent.clone());
            tokio::spawn(async move {
                sent.hit();
                get(&app).await
            })
        })
        .collect();
    // The reload is held until every request has been sent.
    wait_until(shared.name, || origin.arrived.get() > 1 && sent.get() == 20).await;
    origin.gated.store(false, Ordering::SeqCst);
    origin.gate.add_permits(20);
    for request in requests {
        // The requests that waited for the reload get the origin's own answer, and say
        // they went forward for a stale entry (RFC 9211 §2.2), as the reload's own does.
        let answer = request.await.unwrap();
        assert_eq!(
            (answer.status, answer.body()),
            (StatusCode::SERVICE_UNAVAILABLE, "down")
        );
        let cache_status = answer.headers["cache-status"].to_str().unwrap();
        assert!(
            cache_status.starts_with("tower-stampede; fwd=stale; fwd-status=503"),
            "{cache_status}"
        );
    }
    // The `503` was for those requests only, and the stale response is still kept: the
    // next request revalidates it again (§4.3.1), the origin answers `304`, and the kept
    // body is served, refreshed (§4.3.4).
    origin.failing.store(false, Ordering::SeqCst);
    let calls = origin.calls.get();
    let revalidated = get(&apps[1]).await;
    assert_eq!(
        (revalidated.status, revalidated.body()),
        (StatusCode::OK, "v1 #1")
    );
    assert_eq!(origin.calls.get(), calls + 1);
    let conditions = origin.conditions();
    assert!(
        conditions[1..]
            .iter()
            .all(|asked| asked.as_ref().is_some_and(|v| v == "\"v1\"")),
        "every reload after the first load was conditional: {conditions:?}"
    );
    let cache_status = revalidated.headers["cache-status"].to_str().unwrap();
    assert!(
        cache_status.starts_with("tower-stampede; fwd=stale; fwd-status=304; stored; ttl="),
        "{cache_status}"
    );
    let hit = get(&apps[0]).await;
    assert_eq!((hit.x_cache(), hit.body()), ("HIT", "v1 #1"));
}

store_test!(requests_collapsed_onto_a_revalidation_say_fwd_stale_and_the_origin_s_status);
async fn requests_collapsed_onto_a_revalidation_say_fwd_stale_and_the_origin_s_status(
    shared: Shared,
) {
    // RFC 9211 §2.2, §2.3: a request that waited for the reload of its stale entry went
    // forward because the entry was stale, and the next hop answered what it answered:
    // `304`, or a new `200`; in every instance, not only the reload's own.
    let origin = Origin::new("max-age=1");
    let mut apps = vec![layered(&origin, keeping(&shared).build())];
    for _ in 0..2 {
        apps.push(app_over(&origin, &shared).await);
    }
    assert_eq!(get(&apps[0]).await.body(), "v1 #1");
    for (version, body, fwd_status) in [(1, "v1 #1", 304), (2, "v2 #3", 200)] {
        origin.version.store(version, Ordering::SeqCst);
        tokio::time::sleep(PAST_FRESHNESS).await;
        origin.gated.store(true, Ordering::SeqCst);
        let (arrived, sent) = (origin.arrived.get(), Counter::default());
        let requests: Vec<_> = (0..30)
            .map(|i| {
                let (app, sent) = (apps[i % 3].clone(), sent.clone());
                tokio::spawn(async move {
                    sent.hit();
                    (i % 3, get(&app).await)
                })
            })
            .collect();
        // The reload is held until every request has been sent.
        wait_until(shared.name, || {
            origin.arrived.get() > arrived && sent.get() == 30
        })
        .await;
        // Every request has been sent, but a task may not have reached its wait yet (it
        // would then come after the reload, a hit): a pause lets them get there.
        tokio::time::sleep(Duration::from_millis(300)).await;
        origin.gated.store(false, Ordering::SeqCst);
        // A permit for each request held at the gate, and no more: a permit left over
        // would let the next round's reload through at once, before anyone waits on it.
        origin.gate.add_permits(origin.arrived.get() - arrived);
        let collapsed = format!("tower-stampede; fwd=stale; fwd-status={fwd_status}; collapsed");
        let own = format!("tower-stampede; fwd=stale; fwd-status={fwd_status}; stored; ttl=");
        let (mut reloads, mut collapsed_in) = (0, [0; 3]);
        for request in requests {
            let (app, answer) = request.await.unwrap();
            assert_eq!((answer.status, answer.body()), (StatusCode::OK, body));
            let cache_status = answer.headers["cache-status"].to_str().unwrap();
            if cache_status == collapsed {
                collapsed_in[app] += 1;
            } else if cache_status.starts_with(&own) {
                reloads += 1;
            } else {
                // Sent after the reload ended: a hit.
                let (rest, _) = support::http::split_ttl(cache_status);
                assert_eq!(rest, "tower-stampede; hit");
            }
        }
        assert_eq!(reloads, 1, "one reload");
        assert_eq!(origin.arrived.get(), arrived + 1, "one conditional request");
        assert!(
            collapsed_in.iter().sum::<usize>() > 15 && collapsed_in.iter().all(|n| *n > 0),
            "most of the stampede, in each instance, waited for the reload: \
             {collapsed_in:?}"
        );
    }
}
