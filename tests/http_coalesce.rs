//! What is not stored is still coalesced: the requests that arrive while a load of their key is
//! in flight share its response when it may go to another user at all (RFC 9111 §4: a cache
//! "can use a response that is stored or storable to satisfy multiple requests"), even when it
//! declares no freshness, and it is not stored; a body over `max_body_bytes` is relayed to the
//! requests of the process that waited for its load. Through the real middleware over
//! `MemoryStore` and (feature `redis`) a real `redis-server`, two instances each, as two
//! processes.
//!
//! The memory cases run on paused time, the redis cases on real time (`store_test!`). The
//! origin holds its first load until every request of a stampede has been sent, then a moment
//! more (see [`stampede`]); no assertion is on a duration.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use support::http::{send, stampede, Answer, Held};
use support::{store_test, wait_until, Counter, Shared};
use tower::ServiceExt;
use tower_stampede::StampedeLayer;

/// An app over the shared store, its own `Cache` (so its own L1 and flights, as a process),
/// with `handler` at every path behind `layer` made of that cache.
fn app<H, T>(shared: &Shared, handler: H, layer: impl Fn(StampedeLayer) -> StampedeLayer) -> Router
where
    H: axum::handler::Handler<T, ()> + Clone,
    T: 'static,
{
    Router::new()
        .fallback(handler)
        .layer(layer(StampedeLayer::new(shared.cache().build())))
}

/// How many answers carry each body.
fn bodies(answers: &[Answer]) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for answer in answers {
        *seen.entry(answer.body().to_owned()).or_default() += 1;
    }
    seen
}

store_test!(an_uncached_shareable_response_goes_to_the_requests_that_waited_for_it);
/// A handler without `Cache-Control`, `Expires` or a default TTL: RFC 9111 §4.2.2 lets a cache
/// give it heuristic freshness, and the layer stores none; the requests that waited for its
/// load get it (`fwd=uri-miss; fwd-status=200; collapsed`), in either process, and it is not
/// stored: a later request, and a later stampede, load once again.
async fn an_uncached_shareable_response_goes_to_the_requests_that_waited_for_it(shared: Shared) {
    const REQUESTS: usize = 40;
    let origin = Held::default();
    let handler = {
        let origin = origin.clone();
        move || async move { format!("page #{}", origin.load().await) }
    };
    let apps = [
        app(&shared, handler.clone(), |l| l),
        app(&shared, handler, |l| l),
    ];
    let answers = stampede(&origin, &apps, REQUESTS, "http://app.test/bare", |_| vec![]).await;
    let seen = bodies(&answers);
    let first = seen.get("page #1").copied().unwrap_or(0);
    assert!(
        first > REQUESTS / 2,
        "{first} of {REQUESTS} got the first load ({seen:?})"
    );
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::OK);
        let status = answer.headers["cache-status"].to_str().unwrap();
        assert!(!status.contains("stored"), "{status}");
        if answer.body() == "page #1" && answer.x_cache() != "BYPASS" {
            assert_eq!(
                status,
                "tower-stampede; fwd=uri-miss; fwd-status=200; collapsed"
            );
        }
    }
    assert!(
        origin.loads.get() < REQUESTS / 4,
        "{} origin loads for {REQUESTS}",
        origin.loads.get()
    );
    // Not stored: a request after the load loads again, in either process.
    for app in &apps {
        let before = origin.loads.get();
        let answer = send(app, "GET", "http://app.test/bare", &[]).await;
        assert_eq!(answer.body(), format!("page #{}", before + 1));
        assert_eq!(answer.x_cache(), "BYPASS");
    }
}

store_test!(a_response_that_may_not_be_shared_goes_only_to_its_own_request);
/// What may not go to another user still goes only to its own request, while others wait for
/// its load: `private`, `no-store`, `no-cache` (without a validator, so not stored), a
/// `Set-Cookie`, `Vary: *`, and a freshness of 0 (stale at once: RFC 9111 §4.2 forbids using
/// it without validation). Every request gets the body of its own load.
async fn a_response_that_may_not_be_shared_goes_only_to_its_own_request(shared: Shared) {
    const REQUESTS: usize = 8;
    let cases: [(&str, &str); 6] = [
        ("cache-control", "private"),
        ("cache-control", "no-store"),
        ("cache-control", "no-cache"),
        ("set-cookie", "session=secret"),
        ("vary", "*"),
        ("cache-control", "max-age=0"),
    ];
    for (name, value) in cases {
        let origin = Held::default();
        let handler = {
            let origin = origin.clone();
            move || async move {
                let n = origin.load().await;
                ([(name, value)], format!("page #{n}"))
            }
        };
        let apps = [
            app(&shared, handler.clone(), |l| l),
            app(&shared, handler, |l| l),
        ];
        let answers = stampede(&origin, &apps, REQUESTS, "http://app.test/own", |_| vec![]).await;
        let seen = bodies(&answers);
        assert_eq!(seen.len(), REQUESTS, "{name}: {value}: {seen:?}");
        assert_eq!(origin.loads.get(), REQUESTS, "{name}: {value}");
        for answer in &answers {
            assert_eq!(answer.x_cache(), "BYPASS", "{name}: {value}");
        }
    }
}

store_test!(a_request_with_credentials_never_gets_another_s_unstored_response);
/// RFC 9111 §3.5: a request with credentials never gets the unstored response of another
/// request, nor does its own go to others. The origin greets whoever asks by the credentials it
/// was sent, and says nothing of freshness; a stampede of users with cookies or
/// `Authorization` (keyed apart from anonymous requests, and sharing one key among them) and
/// anonymous requests behind an anonymous leader: each user gets their own greeting.
async fn a_request_with_credentials_never_gets_another_s_unstored_response(shared: Shared) {
    const REQUESTS: usize = 24;
    for leader in ["anonymous", "session=user0"] {
        let origin = Held::default();
        let handler = {
            let origin = origin.clone();
            move |headers: HeaderMap| async move {
                let n = origin.load().await;
                let who = ["cookie", "authorization"]
                    .iter()
                    .find_map(|name| headers.get(*name))
                    .map_or("anonymous", |v| v.to_str().unwrap())
                    .to_owned();
                format!("hello {who} #{n}")
            }
        };
        let apps = [
            app(&shared, handler.clone(), |l| l),
            app(&shared, handler, |l| l),
        ];
        let who = |i: usize| match (i, leader) {
            (0, "anonymous") => None,
            (0, cookie) => Some(("cookie", cookie.to_owned())),
            (i, _) if i % 3 == 0 => None,
            (i, _) if i % 3 == 1 => Some(("cookie", format!("session=user{i}"))),
            (i, _) => Some(("authorization", format!("Bearer user{i}"))),
        };
        let answers = stampede(&origin, &apps, REQUESTS, "http://app.test/hello", |i| {
            who(i).into_iter().collect()
        })
        .await;
        for (i, answer) in answers.iter().enumerate() {
            let expected = who(i).map_or("anonymous".to_owned(), |(_, v)| v);
            assert!(
                answer.body().starts_with(&format!("hello {expected} #")),
                "leader {leader}: request {i} ({expected}) got {:?}",
                answer.body()
            );
            if expected != "anonymous" {
                assert_eq!(answer.x_cache(), "BYPASS", "{expected}");
            }
        }
    }
}

store_test!(a_waiter_gets_an_unstored_response_only_if_it_matches_its_vary);
/// RFC 9111 §4.1: a response with `Vary` goes only to the waiters whose request matches the
/// loading request in every field it names; the others go to the origin. The origin answers
/// in the language asked for, without freshness, with `Vary: Accept-Language`.
async fn a_waiter_gets_an_unstored_response_only_if_it_matches_its_vary(shared: Shared) {
    const REQUESTS: usize = 30;
    let origin = Held::default();
    let handler = {
        let origin = origin.clone();
        move |headers: HeaderMap| async move {
            let n = origin.load().await;
            let language = headers
                .get("accept-language")
                .map_or("none", |v| v.to_str().unwrap())
                .to_owned();
            ([("vary", "accept-language")], format!("{language} #{n}"))
        }
    };
    let apps = [
        app(&shared, handler.clone(), |l| l),
        app(&shared, handler, |l| l),
    ];
    let language = |i: usize| ["en", "fr", "en, fr"][i % 3];
    let answers = stampede(&origin, &apps, REQUESTS, "http://app.test/hello", |i| {
        vec![("accept-language", language(i).to_owned())]
    })
    .await;
    let mut first = 0;
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            answer.body().starts_with(&format!("{} #", language(i))),
            "request {i} ({}) got {:?}",
            language(i),
            answer.body()
        );
        first += usize::from(answer.body() == "en #1");
    }
    assert!(
        first > REQUESTS / 6,
        "{first} requests in English got the first load"
    );
}

/// The body of the large response: bytes that differ from position to position, so a lost or
/// reordered chunk shows.
fn large_body(len: usize) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// A body that yields its data in chunks, letting the runtime run between them, as a body
/// streamed from the network does.
struct Trickle {
    data: Bytes,
    chunk: usize,
    yielded: bool,
}

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.data.is_empty() {
            return Poll::Ready(None);
        }
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.yielded = false;
        let take = self.chunk.min(self.data.len());
        let chunk = self.data.split_to(take);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }
}

/// A `GET uri` through `app`, its body read one frame at a time with a pause between frames:
/// a client slower than the others.
async fn read_slowly(app: &Router, uri: &str) -> (HeaderMap, Bytes) {
    let request = Request::get(uri).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, mut body) = response.into_parts();
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            read.extend_from_slice(&data);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (parts.headers, read.into())
}

/// What a boxed handler answers with.
type Answering = Pin<Box<dyn std::future::Future<Output = axum::response::Response> + Send>>;

/// A handler for `origin` that answers a `len`-byte body, fresh for a minute, a few KiB at a
/// time.
fn trickling(
    origin: &Held,
    len: usize,
) -> impl FnOnce() -> Answering + Clone + Send + Sync + 'static {
    let origin = origin.clone();
    move || {
        Box::pin(async move {
            origin.load().await;
            let body = Trickle {
                data: large_body(len),
                chunk: 7919,
                yielded: false,
            };
            ([("cache-control", "max-age=60")], Body::new(body)).into_response()
        })
    }
}

store_test!(a_body_over_the_limit_is_relayed_to_the_waiters_of_its_process);
/// A body over `max_body_bytes` is not stored, but the requests of a process that waited for
/// its load get it from that load (every byte, in order), a client slower than the others and
/// a `HEAD` too: one origin load per process per stampede, not one per request. The other
/// process's waiters get the pass marker, and load it once for their process.
async fn a_body_over_the_limit_is_relayed_to_the_waiters_of_its_process(shared: Shared) {
    const REQUESTS: usize = 20;
    const LEN: usize = 600_000;
    let origin = Held::default();
    let handler = trickling(&origin, LEN);
    let limit = |l: StampedeLayer| l.max_body_bytes(64 * 1024);
    let apps = [
        app(&shared, handler.clone(), limit),
        app(&shared, handler, limit),
    ];
    let uri = "http://app.test/large";
    // The first request leads; the others wait for its load, a slow client and a `HEAD`
    // among them in each process.
    let leader = {
        let app = apps[0].clone();
        tokio::spawn(async move { send(&app, "GET", uri, &[]).await })
    };
    wait_until("the first load", || origin.loads.get() > 0).await;
    let sent = Counter::default();
    let mut waiters = Vec::new();
    for i in 0..REQUESTS + 4 {
        let (app, sent) = (apps[i % 2].clone(), sent.clone());
        waiters.push(tokio::spawn(async move {
            sent.hit();
            match i {
                // Read slowly.
                0 | 1 => {
                    let (headers, body) = read_slowly(&app, uri).await;
                    (StatusCode::OK, headers, body)
                }
                2 | 3 => {
                    let answer = send(&app, "HEAD", uri, &[]).await;
                    (answer.status, answer.headers, answer.body)
                }
                _ => {
                    let answer = send(&app, "GET", uri, &[]).await;
                    (answer.status, answer.headers, answer.body)
                }
            }
        }));
    }
    // A bound for a busy machine (see the module docs), not an assertion.
    wait_until("every request sent", || sent.get() == REQUESTS + 4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    origin.release();
    let want = large_body(LEN);
    let leader = leader.await.unwrap();
    assert!(leader.body == want, "the leader got every byte");
    for (i, waiter) in waiters.into_iter().enumerate() {
        let (status, headers, body) = waiter.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["cache-control"], "max-age=60");
        if i == 2 || i == 3 {
            assert!(body.is_empty(), "a HEAD has no body");
        } else {
            assert!(body == want, "request {i} got every byte, in order");
        }
    }
    assert!(
        origin.loads.get() <= apps.len(),
        "{} origin loads for {} requests over {} processes",
        origin.loads.get(),
        REQUESTS + 4,
        apps.len()
    );
    // Not stored: a later request loads it again.
    let before = origin.loads.get();
    let answer = send(&apps[0], "GET", uri, &[]).await;
    assert!(answer.body == want);
    assert_eq!(origin.loads.get(), before + 1);
}

store_test!(a_body_over_the_relay_bound_sends_its_waiters_to_the_origin);
/// Memory stays bounded: a body over the relay's bound (`max_relay_bytes`) is not kept for the
/// waiters, who go to the origin themselves (each gets every byte all the same).
async fn a_body_over_the_relay_bound_sends_its_waiters_to_the_origin(shared: Shared) {
    const REQUESTS: usize = 6;
    const LEN: usize = 600_000;
    let origin = Held::default();
    let handler = trickling(&origin, LEN);
    let small = |l: StampedeLayer| l.max_body_bytes(64 * 1024).max_relay_bytes(256 * 1024);
    let apps = [app(&shared, handler, small)];
    let answers = stampede(
        &origin,
        &apps,
        REQUESTS,
        "http://app.test/large",
        |_| vec![],
    )
    .await;
    let want = large_body(LEN);
    for answer in &answers {
        assert!(answer.body == want, "every byte, in order");
    }
    assert_eq!(origin.loads.get(), REQUESTS);
}
