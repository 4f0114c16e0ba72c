//! The price of an L1 hit through the engine (`Cache::get_or_load`), and through `CacheLayer`
//! (a tower service whose inner service is never called), against a bare
//! `moka::future::Cache::get` of the same value: the engine's own work on its hottest path
//! (hashing the key, the L1 trust check, the answer), beside the cheapest cache read there is.
//! Each is awaited the same way, one call after the other, a 100-byte value under a short
//! key. They take turns, block by block (the order rotated), and each block's ratios to the
//! moka read are kept: the median ratios and their quartiles are printed.
//!
//! ```sh
//! cargo bench --bench engine_hit              # 200 blocks of 5000 calls
//! cargo bench --bench engine_hit -- 50 20000  # 50 blocks of 20 000
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use tower::{service_fn, BoxError};
use tower_stampede::service::{CacheLayer, ServiceCodec};
use tower_stampede::store::MemoryStore;
use tower_stampede::Cache;

/// Values as they are: the layer's codec of `Bytes`.
#[derive(Clone)]
struct Raw;

impl ServiceCodec<Bytes, BoxError> for Raw {
    fn encode(&self, response: &Bytes) -> Result<Bytes, BoxError> {
        Ok(response.clone())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Bytes, BoxError> {
        Ok(Bytes::copy_from_slice(bytes))
    }
}

#[path = "shared/service_calls.rs"]
mod service_calls;

use service_calls::{blocks_and_calls, timed_calls};

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
    let (blocks, calls) = blocks_and_calls((200, 5000));
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
    let layer_cache = Cache::builder(MemoryStore::new())
        .ttl(Duration::from_secs(3600))
        .l1_ttl_cap(Duration::from_secs(3600))
        .early_refresh(0.0)
        .build();
    let page = value.clone();
    let inner = service_fn(move |_: u64| {
        let page = page.clone();
        async move { Ok::<_, BoxError>(page) }
    });
    let cache_layer = CacheLayer::with_codec(layer_cache, |id: &u64| Some(id.to_be_bytes()), Raw);
    let mut layered = tower::Layer::layer(&cache_layer, inner);
    let (mut bare_ns, mut engine_ns, mut layer_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ratios, mut layer_ratios) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        let filled = value.clone();
        cache
            .get_or_load(KEY, || async move { Ok::<_, std::io::Error>(filled) })
            .await
            .expect("loaded");
        moka.insert(KEY.to_owned(), value).await;
        // Fills the layer's L1, and warms all three.
        timed_calls(&mut layered, 42, calls).await;
        engine(&cache, calls).await;
        bare(&moka, calls).await;
        for turn in 0..blocks {
            let (mut plain, mut through, mut layered_took) = Default::default();
            for step in 0..3 {
                match (turn + step) % 3 {
                    0 => plain = bare(&moka, calls).await,
                    1 => through = engine(&cache, calls).await,
                    _ => layered_took = timed_calls(&mut layered, 42, calls).await,
                }
            }
            let per_call = |took: Duration| took.as_nanos() as f64 / f64::from(calls);
            bare_ns.push(per_call(plain));
            engine_ns.push(per_call(through));
            layer_ns.push(per_call(layered_took));
            ratios.push(through.as_secs_f64() / plain.as_secs_f64());
            layer_ratios.push(layered_took.as_secs_f64() / plain.as_secs_f64());
        }
    });
    let stats = cache.stats();
    assert_eq!(stats.loads, 1, "every call after the first was a hit");
    for list in [
        &mut bare_ns,
        &mut engine_ns,
        &mut layer_ns,
        &mut ratios,
        &mut layer_ratios,
    ] {
        list.sort_by(f64::total_cmp);
    }
    let at = |list: &[f64], q: f64| list[((list.len() - 1) as f64 * q).round() as usize];
    println!("{blocks} blocks of {calls} calls each, in turns; per call, median of the blocks");
    println!("moka::future::Cache::get: {:8.1} ns", at(&bare_ns, 0.5));
    println!("Cache::get_or_load (L1):  {:8.1} ns", at(&engine_ns, 0.5));
    println!("CacheLayer hit (L1):      {:8.1} ns", at(&layer_ns, 0.5));
    for (name, list) in [("engine", &ratios), ("layer ", &layer_ratios)] {
        println!(
            "ratio {name} / moka:      {:8.2} (quartiles {:.2} .. {:.2})",
            at(list, 0.5),
            at(list, 0.25),
            at(list, 0.75)
        );
    }
}
