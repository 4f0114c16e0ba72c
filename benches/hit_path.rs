//! The price of the layer on its fastest path: a request answered from L1, against the bare
//! inner service answering the same request. Both read the whole body.
//!
//! Beside them, the engine's own work for an L2 hit: `Cache::fetch` with L1 off, over the
//! embedded store, whose lookup costs next to nothing, so what is left is the flight, the
//! breaker, the entry's decoding and the freshness checks that an L2 hit from Redis pays on top
//! of its round trip.
//!
//! Each in four shapes of request, as behind a load balancer and on a page that compresses:
//! plain; with a balancer's fields (`X-Forwarded-Proto`, `X-Forwarded-Port`, `X-Forwarded-For`,
//! `X-Real-IP`: keyed by the forwarding values); with `Accept-Encoding` on a page that answers
//! `Vary: Accept-Encoding`; and both. The bare service gets the same requests, so what a shape
//! costs the layer is its time over plain less the bare service's.
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

/// Header fields, as names and values.
type Fields = &'static [(&'static str, &'static str)];

/// The shapes of request: a name, the path and the header fields.
const SHAPES: [(&str, &str, Fields); 4] = [
    ("plain", "/page?id=42", &[]),
    ("balancer", "/page?id=42", BALANCER),
    ("vary", "/vary?id=42", ENCODING),
    ("both", "/vary?id=42", BOTH),
];
const BALANCER: Fields = &[
    ("x-forwarded-proto", "https"),
    ("x-forwarded-port", "443"),
    ("x-forwarded-for", "198.51.100.7"),
    ("x-real-ip", "198.51.100.7"),
];
const ENCODING: Fields = &[("accept-encoding", "gzip, deflate, br")];
const BOTH: Fields = &[
    ("x-forwarded-proto", "https"),
    ("x-forwarded-port", "443"),
    ("x-forwarded-for", "198.51.100.7"),
    ("x-real-ip", "198.51.100.7"),
    ("accept-encoding", "gzip, deflate, br"),
];

fn request(path: &str, fields: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::get(format!("http://app.test{path}"));
    for (name, value) in fields {
        request = request.header(*name, *value);
    }
    request.body(Full::default()).expect("a request")
}

fn hit_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let page = page();
    let bare = service_fn(move |request: Request<Full<Bytes>>| {
        let page = page.clone();
        let mut response = Response::builder().header("cache-control", "max-age=60");
        if request.uri().path().starts_with("/vary") {
            response = response.header("vary", "accept-encoding");
        }
        let response = response.body(Full::new(page));
        async move { Ok::<_, Infallible>(response.expect("a response")) }
    });
    let layered = ServiceBuilder::new()
        .layer(StampedeLayer::new(
            Cache::builder(MemoryStore::new()).build(),
        ))
        .service(bare.clone());

    let mut group = c.benchmark_group("hit_path");
    for (shape, path, fields) in SHAPES {
        group.bench_function(format!("bare service, {shape}"), |b| {
            b.to_async(&runtime).iter(|| async {
                let response = bare.clone().oneshot(request(path, fields)).await;
                let body = response.expect("answered").into_body().collect().await;
                body.expect("a body").to_bytes().len()
            });
        });
        // Warm L1 with the first request.
        runtime.block_on(async {
            let response = layered.clone().oneshot(request(path, fields)).await;
            assert_eq!(response.expect("answered").headers()["x-cache"], "MISS");
            let response = layered.clone().oneshot(request(path, fields)).await;
            assert_eq!(response.expect("answered").headers()["x-cache"], "HIT");
        });
        group.bench_function(format!("layer, L1 hit, {shape}"), |b| {
            b.to_async(&runtime).iter(|| async {
                let response = layered.clone().oneshot(request(path, fields)).await;
                let body = response.expect("answered").into_body().collect().await;
                body.expect("a body").to_bytes().len()
            });
        });
    }
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
