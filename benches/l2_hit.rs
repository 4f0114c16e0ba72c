//! An L2 hit (the value from Redis, L1 off) against a plain `GET` of a value of the same size
//! with the redis crate, both over loopback to a `redis-server` this bench starts: the
//! engine's L2 hit is one round trip (`SET lock NX GET`, refused by the value's `fresh`
//! marker, then `GET` and `PTTL`, pipelined), so it should cost about what a `GET` costs.
//!
//! ```sh
//! cargo bench --bench l2_hit
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use redis::AsyncCommands;
use support::RedisServer;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Outcome};

fn l2_hit(c: &mut Criterion) {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let value = Bytes::from(vec![b'v'; 2048]);
    let (cache, mut plain) = runtime.block_on(async {
        let store = RedisStore::connect(server.url())
            .await
            .expect("connect the store");
        let cache = Cache::builder(store).l1_capacity(0).build();
        let value = value.clone();
        cache
            .get_or_load(
                "page",
                move || async move { Ok::<_, std::io::Error>(value) },
            )
            .await
            .expect("the first load");
        let plain = server
            .client()
            .get_connection_manager()
            .await
            .expect("a plain connection");
        (cache, plain)
    });
    runtime.block_on(async {
        let _: () = plain
            .set("plain-page", value.as_ref())
            .await
            .expect("SET the plain value");
        let fetched = cache
            .fetch("page", || async {
                Err::<tower_stampede::Loaded, _>(std::io::Error::other("not called"))
            })
            .await
            .expect("an L2 hit");
        assert_eq!(fetched.outcome(), Outcome::L2Hit);
    });

    let mut group = c.benchmark_group("l2_hit");
    group.bench_function("plain GET (redis crate)", |b| {
        b.to_async(&runtime).iter(|| {
            let mut plain = plain.clone();
            async move {
                let bytes: Vec<u8> = plain.get("plain-page").await.expect("GET");
                bytes.len()
            }
        });
    });
    group.bench_function("tower-stampede L2 hit", |b| {
        b.to_async(&runtime).iter(|| async {
            let fetched = cache
                .fetch("page", || async {
                    Err::<tower_stampede::Loaded, _>(std::io::Error::other("not called"))
                })
                .await
                .expect("an L2 hit");
            fetched.value().map_or(0, Bytes::len)
        });
    });
    group.finish();
}

criterion_group!(benches, l2_hit);
criterion_main!(benches);
