//! The price of the layer on its fastest path: a request answered from L1, against the bare
//! inner service answering the same request. Both read the whole body.
//!
//! Beside them, the engine's own work for an L2 hit: `Cache::fetch` with L1 off, over the
//! embedded store, whose lookup costs next to nothing, so what is left is the flight, the
//! breaker, the entry's decoding and the freshness checks that an L2 hit from Redis pays on top
//! of its round trip.
//!
//! ```sh
//! cargo bench --bench hit_path
//! ```

use std::convert::Infallible;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_stampede::store::MemoryStore;
use tower_stampede::{Cache, Loaded, Outcome, StampedeLayer};

/// A 2 KiB page, as an origin would answer it.
fn page() -> Bytes {
    Bytes::from(vec![b'p'; 2048])
}

fn request() -> Request<Full<Bytes>> {
    Request::get("http://app.test/page?id=42")
        .body(Full::default())
        .expect("a request")
}

fn hit_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let page = page();
    let bare = service_fn(move |_request: Request<Full<Bytes>>| {
        let page = page.clone();
        let response = Response::builder()
            .header("cache-control", "max-age=60")
            .body(Full::new(page));
        async move { Ok::<_, Infallible>(response.expect("a response")) }
    });
    let layered = ServiceBuilder::new()
        .layer(StampedeLayer::new(
            Cache::builder(MemoryStore::new()).build(),
        ))
        .service(bare.clone());

    let mut group = c.benchmark_group("hit_path");
    group.bench_function("bare service", |b| {
        b.to_async(&runtime).iter(|| async {
            let response = bare.clone().oneshot(request()).await.expect("answered");
            let body = response.into_body().collect().await.expect("a body");
            body.to_bytes().len()
        });
    });
    // Warm L1 with the first request.
    runtime.block_on(async {
        let response = layered.clone().oneshot(request()).await.expect("answered");
        assert_eq!(response.headers()["x-cache"], "MISS");
    });
    group.bench_function("layer, L1 hit", |b| {
        b.to_async(&runtime).iter(|| async {
            let response = layered.clone().oneshot(request()).await.expect("answered");
            let body = response.into_body().collect().await.expect("a body");
            body.to_bytes().len()
        });
    });
    let engine = Cache::builder(MemoryStore::new()).l1_capacity(0).build();
    runtime.block_on(async {
        let page = self::page();
        engine
            .get_or_load("page", move || async move { Ok::<_, Infallible>(page) })
            .await
            .expect("the first load");
    });
    group.bench_function("engine, L2 hit from the embedded store (L1 off)", |b| {
        b.to_async(&runtime).iter(|| async {
            let fetched = engine.fetch("page", not_called).await.expect("an L2 hit");
            assert_eq!(fetched.outcome(), Outcome::L2Hit);
            fetched.value().map_or(0, Bytes::len)
        });
    });
    group.finish();
}

async fn not_called() -> Result<Loaded, std::io::Error> {
    Err(std::io::Error::other("not called"))
}

criterion_group!(benches, hit_path);
criterion_main!(benches);
