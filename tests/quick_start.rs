//! The README's quick start (`examples/quick_start.rs`), deployed as users deploy it: two
//! instances over one real `redis-server`, probes beside the pages, Redis that goes away.

#![cfg(feature = "redis")]

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use support::http::get as send_get;
use support::Counter;
use support::RedisServer;
use tower_stampede::store::RedisStore;
use tower_stampede::Cache;

#[allow(dead_code)]
#[path = "../examples/quick_start.rs"]
mod quick_start;

/// Pages that count their renders, behind the quick start's layer.
fn counted_app(cache: Cache, renders: &Counter) -> Router {
    let renders = renders.clone();
    let pages = Router::new().route(
        "/slow",
        get(move || async move {
            renders.hit();
            tokio::time::sleep(Duration::from_millis(50)).await;
            "rendered once, served to everyone"
        }),
    );
    quick_start::app(cache, pages)
}

/// The README shows the quick start as the example has it, word for word, so what users
/// copy is what this file tests.
#[test]
fn the_readme_shows_the_quick_start_example() {
    let example = include_str!("../examples/quick_start.rs");
    let begin = example.find("// quick start: begin\n").unwrap() + "// quick start: begin\n".len();
    let end = example.find("// quick start: end").unwrap();
    let readme = include_str!("../README.md");
    assert!(
        readme.contains(&example[begin..end]),
        "README.md's quick start differs from examples/quick_start.rs"
    );
}

/// While Redis is down the app serves and stays ready (a load balancer that pulled every
/// instance would turn the outage the cache survives into a full one); the store's state is
/// reported beside it, for dashboards; neither probe may be cached by anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_stays_ready_while_redis_is_down() {
    let mut server = RedisServer::start();
    server.kill();
    let store = RedisStore::open(server.url()).unwrap();
    let cache = Cache::builder(store).namespace("quick-start").build();
    let renders = Counter::default();
    let app = counted_app(cache, &renders);

    let ready = send_get(&app, "/ready").await;
    assert_eq!(ready.status, 200, "ready while Redis is down");
    assert_eq!(ready.headers["cache-control"], "no-store");
    let health = send_get(&app, "/health/cache").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.headers["cache-control"], "no-store");
    // Redis is down: the store never answered.
    let body = health.body();
    assert!(
        body.starts_with("healthy=false store_answers=false last_answer_ago_ms=never "),
        "{body}"
    );
    for _ in 0..3 {
        let page = send_get(&app, "/slow").await;
        assert_eq!(page.status, 200, "pages are served while Redis is down");
        assert_eq!(page.body(), "rendered once, served to everyone");
    }
    assert_eq!(renders.get(), 1, "kept in L1 while Redis is down");
    // The probes pass the layer: never an entry of the cache.
    for _ in 0..2 {
        assert_eq!(send_get(&app, "/ready").await.x_cache(), "");
    }
}

/// The header fields of a burst's request, by its client's number.
type HeadersOf = fn(usize) -> Vec<(String, String)>;

/// Two instances of the quick start over one Redis, and 200 concurrent requests of one page,
/// as a load balancer sends them: each with `X-Forwarded-Proto`, `X-Forwarded-Port` and its
/// client's own `X-Forwarded-For`; then, as browsers send them, each with analytics cookies.
/// Each burst is one render over both instances (issue 40: each was 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_load_balancer_with_analytics_cookies_a_burst_renders_once() {
    let server = RedisServer::start();
    let renders = Counter::default();
    let apps: Vec<Router> = server
        .stores(2)
        .await
        .into_iter()
        .map(|store| {
            let cache = Cache::builder_shared(store)
                .namespace("quick-start")
                .store_timeout(Duration::from_secs(2))
                .build();
            counted_app(cache, &renders)
        })
        .collect();
    let bursts: [(&str, HeadersOf); 2] = [
        ("/slow?balancer", |client| {
            vec![
                ("x-forwarded-proto".into(), "https".into()),
                ("x-forwarded-port".into(), "443".into()),
                (
                    "x-forwarded-for".into(),
                    format!("203.0.113.{}", client % 250),
                ),
            ]
        }),
        ("/slow?analytics", |client| {
            let cookie = format!("_ga=GA1.2.{client}; _gid=GA1.2.4");
            vec![("cookie".into(), cookie)]
        }),
    ];
    for (uri, headers) in bursts {
        let before = renders.get();
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(200));
        let burst: Vec<_> = (0..200)
            .map(|client| {
                let (app, barrier) = (apps[client % 2].clone(), barrier.clone());
                let headers = headers(client);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let headers: Vec<(&str, &str)> = headers
                        .iter()
                        .map(|(n, v)| (n.as_str(), v.as_str()))
                        .collect();
                    support::http::send(&app, "GET", uri, &headers).await
                })
            })
            .collect();
        for answer in burst {
            let answer = answer.await.unwrap();
            assert_eq!(answer.status, 200, "{uri}");
            assert_eq!(answer.body(), "rendered once, served to everyone", "{uri}");
        }
        assert_eq!(renders.get() - before, 1, "{uri}: one render for the burst");
    }
}
