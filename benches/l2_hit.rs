//! An L2 hit (the value from Redis, L1 off) against a plain `GET` of a value of the same size
//! with the redis crate, both over loopback to a `redis-server` this bench starts: the
//! engine's L2 hit is one round trip (`SET lock NX GET`, refused by the value's `fresh`
//! marker, then `GET` and `PTTL`, pipelined), so it should cost about what a `GET` costs.
//!
//! A tagged value's L2 hit also needs its tags' versions: read from the store (one more round
//! trip) the first time, then known in-process while notifications say nothing of the tags.
//! The `tagged` cases measure both against the untagged hit: `versions known` (the engine as
//! built), `versions read` (a cache without notifications, which must read them every time).
//!
//! Criterion runs each case for seconds on end, and a shared machine's speed drifts by more
//! than the gap between the two over that long: four runs of one build, within an hour, put
//! the 2 KiB L2 hit from 1.072 to 1.121 of the `GET`, and the 64 KiB one from 0.988 to 1.113.
//! For their ratio, read `l2_turns`, which takes them in turns, one call each.
//!
//! ```sh
//! cargo bench --bench l2_hit
//! ```

#[path = "shared/redis_bench.rs"]
mod redis_bench;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use redis::AsyncCommands;
use tower_stampede::{Cache, Outcome};

fn l2_hit(c: &mut Criterion) {
    let redis_bench::Bench {
        server: _server,
        runtime,
        store,
        plain,
    } = redis_bench::start();
    let unnotified = Cache::builder(store.clone())
        .l1_capacity(0)
        .notifications(false)
        .build();
    let cache = Cache::builder(store).l1_capacity(0).build();
    // A small value (a database row, a fragment) and a page-sized one.
    for (label, size) in [("2 KiB", 2048), ("64 KiB", 64 * 1024)] {
        let value = Bytes::from(vec![b'v'; size]);
        let (key, plain_key) = (format!("page-{size}"), format!("plain-page-{size}"));
        runtime.block_on(async {
            let loaded = value.clone();
            cache
                .get_or_load(&key, move || async move { Ok::<_, std::io::Error>(loaded) })
                .await
                .expect("the first load");
            let _: () = plain
                .clone()
                .set(&plain_key, value.as_ref())
                .await
                .expect("SET the plain value");
            let fetched = cache.fetch(&key, not_called).await.expect("an L2 hit");
            assert_eq!(fetched.outcome(), Outcome::L2Hit);
            assert_eq!(fetched.value(), Some(&value));
        });

        let mut group = c.benchmark_group(format!("l2_hit/{label}"));
        group.bench_function("plain GET (redis crate)", |b| {
            b.to_async(&runtime).iter(|| {
                let (mut plain, plain_key) = (plain.clone(), &plain_key);
                async move {
                    let bytes: Vec<u8> = plain.get(plain_key).await.expect("GET");
                    bytes.len()
                }
            });
        });
        group.bench_function("tower-stampede L2 hit", |b| {
            b.to_async(&runtime).iter(|| async {
                let fetched = cache.fetch(&key, not_called).await.expect("an L2 hit");
                fetched.value().map_or(0, Bytes::len)
            });
        });
        let tagged_key = format!("tagged-{size}");
        runtime.block_on(async {
            let loaded = tower_stampede::Loaded::value(value.clone()).tags(["a", "b", "c"]);
            cache
                .fetch(&tagged_key, move || async move {
                    Ok::<_, std::io::Error>(loaded)
                })
                .await
                .expect("the first load");
            let fetched = cache.fetch(&tagged_key, not_called).await.expect("a hit");
            assert_eq!(fetched.outcome(), Outcome::L2Hit);
        });
        for (case, cache) in [("versions known", &cache), ("versions read", &unnotified)] {
            group.bench_function(
                format!("tower-stampede L2 hit, tagged (3 tags), {case}"),
                |b| {
                    b.to_async(&runtime).iter(|| async {
                        let fetched = cache
                            .fetch(&tagged_key, not_called)
                            .await
                            .expect("an L2 hit");
                        fetched.value().map_or(0, Bytes::len)
                    });
                },
            );
        }
        group.finish();
    }
}

async fn not_called() -> Result<tower_stampede::Loaded, std::io::Error> {
    Err(std::io::Error::other("not called"))
}

criterion_group!(benches, l2_hit);
criterion_main!(benches);
