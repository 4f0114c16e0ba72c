//! A batch against single calls, same keys: a list page of 100 keys, 10 of them cold (the
//! store has the other 90; L1 is off, so every call goes to the store, as in a process that
//! has not seen these keys yet). Three contestants, in turns (the order rotated every
//! block), over a `redis-server` this bench starts:
//!
//! - `batch`: one `Cache::get_many_or_load` of the 100 keys (one loader call for the 10);
//! - `singles`: 100 `Cache::get_or_load` calls one after the other (10 loader calls);
//! - `joined`: the same 100 calls all at once, a task each.
//!
//! Before each turn, the 10 cold keys are invalidated (not timed). Prints each contestant's
//! median time per turn and store calls per turn, and the median of the per-block ratios of
//! `singles` and `joined` to `batch`, with their quartiles.
//!
//! ```sh
//! cargo bench --bench batch           # 200 blocks
//! cargo bench --bench batch -- 50     # 50 blocks
//! ```

#[path = "shared/percentile.rs"]
mod percentile;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::observed::Observed;
use tower_stampede::store::{RedisStore, Store};
use tower_stampede::Cache;

const KEYS: usize = 100;
const COLD: usize = 10;

fn value_of(key: &str) -> Bytes {
    Bytes::from(format!("value of {key}"))
}

/// One contestant's turn: how long it took, over the `keys`.
async fn turn(contestant: usize, cache: &Cache, keys: &[String]) -> Duration {
    let started = Instant::now();
    match contestant {
        0 => {
            let found = cache
                .get_many_or_load(keys.to_vec(), |missing: Vec<String>| async move {
                    let values = missing.into_iter().map(|k| {
                        let v = value_of(&k);
                        (k, v)
                    });
                    Ok::<_, std::io::Error>(values.collect::<HashMap<_, _>>())
                })
                .await;
            assert!(found.values().all(Result::is_ok));
        }
        1 => {
            for key in keys {
                let value = value_of(key);
                cache
                    .get_or_load(key, move || async move { Ok::<_, std::io::Error>(value) })
                    .await
                    .expect("a value");
            }
        }
        _ => {
            let calls: Vec<_> = keys
                .iter()
                .map(|key| {
                    let (cache, key, value) = (cache.clone(), key.clone(), value_of(key));
                    tokio::spawn(async move {
                        cache
                            .get_or_load(key, move || async move { Ok::<_, std::io::Error>(value) })
                            .await
                    })
                })
                .collect();
            for call in calls {
                call.await.expect("a call").expect("a value");
            }
        }
    }
    started.elapsed()
}

const NAMES: [&str; 3] = ["batch", "singles", "joined"];

fn main() {
    let blocks = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(200)
        .max(3);
    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let redis: Arc<dyn Store> =
            Arc::new(RedisStore::connect(server.url()).await.expect("connect"));
        let observed = Observed::new(&redis, Duration::ZERO);
        let store: Arc<dyn Store> = observed.clone();
        let cache = Cache::builder_shared(store).l1_capacity(0).build();
        let keys: Vec<String> = (0..KEYS).map(|i| format!("product:{i}")).collect();
        let mut times: [Vec<Duration>; 3] = Default::default();
        let mut calls = [0usize; 3];
        let mut ratios: [Vec<f64>; 2] = Default::default();
        // A first turn of each readies the connection and the scripts.
        for contestant in 0..3 {
            cache
                .invalidate_many(&keys[..COLD])
                .await
                .expect("invalidated");
            turn(contestant, &cache, &keys).await;
        }
        for block in 0..blocks {
            let mut took = [Duration::ZERO; 3];
            for step in 0..3 {
                let contestant = (block + step) % 3;
                cache
                    .invalidate_many(&keys[..COLD])
                    .await
                    .expect("invalidated");
                let before = observed.calls();
                took[contestant] = turn(contestant, &cache, &keys).await;
                calls[contestant] += observed.calls() - before;
                times[contestant].push(took[contestant]);
            }
            for (ratio, other) in ratios.iter_mut().zip([1, 2]) {
                ratio.push(took[other].as_secs_f64() / took[0].as_secs_f64());
            }
        }
        println!(
            "{KEYS} keys, {COLD} cold, L1 off, over Redis on loopback; {blocks} blocks in turns"
        );
        for (contestant, name) in NAMES.iter().enumerate() {
            println!(
                "{name:>8}: median {:.2} ms per turn, {:.1} store calls per turn",
                percentile::percentile_ms(&times[contestant], 50),
                calls[contestant] as f64 / blocks as f64,
            );
        }
        for (ratio, name) in ratios.iter_mut().zip(&NAMES[1..]) {
            ratio.sort_by(f64::total_cmp);
            let at = |q: usize| ratio[(ratio.len() - 1) * q / 4];
            println!(
                "{name:>8} / batch: median {:.1}x (quartiles {:.1}x to {:.1}x)",
                at(2),
                at(1),
                at(3)
            );
        }
    });
}
