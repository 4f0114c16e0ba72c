//! The price of a typed L1 hit (`Cache::typed`, feature `serde`) against a raw one: the typed
//! hit hands out the `Arc<T>` decoded when the value entered L1, so it should cost about what
//! the raw hit costs, and far less than a raw hit followed by a decode (what it would cost
//! without keeping decoded values).
//!
//! ```sh
//! cargo bench --features serde --bench typed_hit
//! ```

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use serde::{Deserialize, Serialize};
use tower_stampede::cache::{Codec, Postcard};
use tower_stampede::store::MemoryStore;
use tower_stampede::Cache;

/// A row of about 1 KiB once encoded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct User {
    id: u64,
    name: String,
    email: String,
    roles: Vec<String>,
    friends: Vec<u64>,
}

fn user() -> User {
    User {
        id: 42,
        name: "Ada Lovelace".into(),
        email: "ada@example.org".into(),
        roles: vec!["admin".into(), "editor".into()],
        friends: (0..300).map(|i| i * 7919).collect(),
    }
}

fn never<T>() -> std::future::Ready<Result<T, std::io::Error>> {
    std::future::ready(Err(std::io::Error::other("not in L1")))
}

fn typed_hit(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let cache = Cache::builder(MemoryStore::new()).build();
    let users = cache.typed::<User>().schema_version(1);
    let mut encoded = Vec::new();
    Postcard.encode(&user(), &mut encoded).expect("encoded");
    let raw = Bytes::from(encoded);
    println!("encoded size: {} bytes", raw.len());
    // Warm L1 for both keys.
    runtime.block_on(async {
        let value = raw.clone();
        cache
            .get_or_load("raw", move || async move { Ok::<_, std::io::Error>(value) })
            .await
            .expect("loaded");
        users
            .get_or_load("typed", || async { Ok::<_, std::io::Error>(user()) })
            .await
            .expect("loaded");
    });

    let mut group = c.benchmark_group("typed_hit");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("raw L1 hit", |b| {
        b.to_async(&runtime)
            .iter(|| async { cache.get_or_load("raw", never).await.expect("a hit").len() });
    });
    group.bench_function("typed L1 hit", |b| {
        b.to_async(&runtime).iter(|| async {
            let user: Arc<User> = users.get_or_load("typed", never).await.expect("a hit");
            user.friends.len()
        });
    });
    group.bench_function("raw L1 hit, then decode", |b| {
        b.to_async(&runtime).iter(|| async {
            let bytes = cache.get_or_load("raw", never).await.expect("a hit");
            let user: User = Postcard.decode(&bytes).expect("decoded");
            user.friends.len()
        });
    });
    group.finish();
}

criterion_group!(benches, typed_hit);
criterion_main!(benches);
