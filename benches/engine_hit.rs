//! The price of an L1 hit through the engine (`Cache::get_or_load`) against a bare
//! `moka::future::Cache::get` of the same value: the engine's own work on its hottest path
//! (hashing the key, the L1 trust check, the answer), beside the cheapest cache read there is.
//! Both are awaited the same way, one call after the other, a 100-byte value under a
//! 10-byte key. They take turns, block by block (the order alternated), and each block's
//! ratio is kept: the median ratio and its quartiles are printed.
//!
//! ```sh
//! cargo bench --bench engine_hit              # 200 blocks of 5000 calls
//! cargo bench --bench engine_hit -- 50 20000  # 50 blocks of 20 000
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use tower_stampede::store::MemoryStore;
use tower_stampede::Cache;

const KEY: &str = "user:4242";

/// `calls` L1 hits of `KEY` through the engine; how long they took.
async fn engine(cache: &Cache, calls: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..calls {
        let value = cache
            .get_or_load(KEY, || async {
                Err::<Bytes, _>(std::io::Error::other("a hit never loads"))
            })
            .await
            .expect("a hit");
        std::hint::black_box(value);
    }
    started.elapsed()
}

/// `calls` reads of `KEY` from a bare moka cache; how long they took.
async fn bare(moka: &moka::future::Cache<String, Bytes>, calls: u32) -> Duration {
    let key = KEY.to_owned();
    let started = Instant::now();
    for _ in 0..calls {
        let value = moka.get(&key).await.expect("present");
        std::hint::black_box(value);
    }
    started.elapsed()
}

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let (blocks, calls) = match args[..] {
        [blocks, calls, ..] => (blocks, calls),
        _ => (200, 5000),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let value = Bytes::from("x".repeat(100));
    let cache = Cache::builder(MemoryStore::new())
        .ttl(Duration::from_secs(3600))
        .l1_ttl_cap(Duration::from_secs(3600))
        .early_refresh(0.0)
        .build();
    let moka = moka::future::Cache::new(1024);
    let (mut bare_ns, mut engine_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        let filled = value.clone();
        cache
            .get_or_load(KEY, || async move { Ok::<_, std::io::Error>(filled) })
            .await
            .expect("loaded");
        moka.insert(KEY.to_owned(), value).await;
        // Warms both.
        engine(&cache, calls).await;
        bare(&moka, calls).await;
        for turn in 0..blocks {
            let (plain, through) = if turn % 2 == 0 {
                let plain = bare(&moka, calls).await;
                (plain, engine(&cache, calls).await)
            } else {
                let through = engine(&cache, calls).await;
                (bare(&moka, calls).await, through)
            };
            bare_ns.push(plain.as_nanos() as f64 / f64::from(calls));
            engine_ns.push(through.as_nanos() as f64 / f64::from(calls));
            ratios.push(through.as_secs_f64() / plain.as_secs_f64());
        }
    });
    let stats = cache.stats();
    assert_eq!(stats.loads, 1, "every call after the first was a hit");
    for list in [&mut bare_ns, &mut engine_ns, &mut ratios] {
        list.sort_by(f64::total_cmp);
    }
    let at = |list: &[f64], q: f64| list[((list.len() - 1) as f64 * q).round() as usize];
    println!("{blocks} blocks of {calls} calls each, in turns; per call, median of the blocks");
    println!("moka::future::Cache::get: {:8.1} ns", at(&bare_ns, 0.5));
    println!("Cache::get_or_load (L1):  {:8.1} ns", at(&engine_ns, 0.5));
    println!(
        "ratio engine / moka:      {:8.2} (quartiles {:.2} .. {:.2})",
        at(&ratios, 0.5),
        at(&ratios, 0.25),
        at(&ratios, 0.75)
    );
}
