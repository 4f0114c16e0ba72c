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
    assert!(health.body().contains("Health"), "{}", health.body());
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
