//! Redis eviction policies (issue 16 #5), measured rather than asserted: a full server, kept
//! full by another tenant's writes, under each `maxmemory-policy`, with four instances over
//! it. For each policy it prints, per stampede, the loads (more than one: a second leader
//! started because the first one's lock was evicted) and, per hit, the store's extra round
//! trips (a lost `fresh` marker costs the hit a repair script) and the notifications sent.
//!
//! ```sh
//! cargo bench --bench eviction
//! EVICTION_PAUSE_MS=20 cargo bench --bench eviction
//! ```
//!
//! The behaviour it measures is tested deterministically in `tests/engine/` (a lost lock in
//! `fences.rs`, a lost marker in `wire.rs`); `benches/README.md` gives the figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{calls, Counter, RedisServer};
use tower_stampede::{Cache, Outcome};

const POLICIES: [&str; 8] = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-ttl",
    "volatile-random",
];
const INSTANCES: usize = 4;
const STAMPEDES: usize = 20;
const HOT_KEYS: usize = 20;
const HITS_PER_KEY: usize = 25;

/// Another tenant: 1 KiB values living an hour, 50 of them every `EVICTION_PAUSE_MS`
/// (default 2: 25 MB/s, the 4 MB server's whole memory every 160 ms), written until `stop`,
/// refused or not.
fn tenant(server: &RedisServer, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let pause = std::env::var("EVICTION_PAUSE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(2);
    let client = server.client();
    tokio::spawn(async move {
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let blob = vec![b'x'; 1024];
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut pipe = redis::pipe();
            for _ in 0..50 {
                pipe.cmd("SET")
                    .arg(format!("tenant:{i}"))
                    .arg(&blob)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
                i += 1;
            }
            let _: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    })
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("| policy | loads per stampede | stampedes with a second leader | store errors | L2 hits of {} reads | extra round trips per hit | notifications per hit |", HOT_KEYS * HITS_PER_KEY);
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for policy in POLICIES {
        let server = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", policy]);
        let mut conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let stores = server.stores(INSTANCES).await;
        let caches: Vec<Cache> = stores
            .iter()
            .map(|store| {
                Cache::builder_shared(Arc::clone(store))
                    .namespace("m")
                    .l1_capacity(0)
                    .ttl(Duration::from_secs(600))
                    .store_timeout(Duration::from_secs(1))
                    .build()
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let tenant = tenant(&server, Arc::clone(&stop));
        // Full: at the limit (or refusing writes, under noeviction).
        while used_memory(&mut conn).await < 4 * 1024 * 1024 - 64 * 1024 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Stampedes: 4 instances x 8 callers on a new key, a 200 ms load.
        let (mut loads_total, mut second_leaders) = (0, 0);
        for round in 0..STAMPEDES {
            let loads = Counter::default();
            let mut callers = Vec::new();
            for i in 0..INSTANCES * 8 {
                let cache = caches[i % INSTANCES].clone();
                let loads = loads.clone();
                callers.push(tokio::spawn(async move {
                    cache
                        .get_or_load(format!("stampede-{round}"), move || async move {
                            loads.hit();
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                        })
                        .await
                }));
            }
            for caller in callers {
                caller.await.unwrap().unwrap();
            }
            loads_total += loads.get();
            second_leaders += usize::from(loads.get() > 1);
        }

        // Hits: hot keys filled once, then read through the instances (L1 off: each read is
        // an L2 lookup); misses (evicted values) reload.
        for key in 0..HOT_KEYS {
            caches[0]
                .get_or_load(format!("hot-{key}"), || async {
                    Ok::<_, std::io::Error>(Bytes::from_static(b"hot"))
                })
                .await
                .unwrap();
        }
        let (scripts, publishes) = (
            calls(&mut conn, "evalsha").await,
            calls(&mut conn, "publish").await,
        );
        let mut hits = 0u64;
        for round in 0..HITS_PER_KEY {
            for key in 0..HOT_KEYS {
                let cache = &caches[(round + key) % INSTANCES];
                let fetched = cache
                    .fetch(format!("hot-{key}"), || async {
                        Ok::<_, std::io::Error>(tower_stampede::Loaded::value(Bytes::from_static(
                            b"hot",
                        )))
                    })
                    .await
                    .unwrap();
                hits += u64::from(fetched.outcome() == Outcome::L2Hit);
            }
        }
        let scripts = calls(&mut conn, "evalsha").await - scripts;
        let publishes = calls(&mut conn, "publish").await - publishes;
        stop.store(true, Ordering::Relaxed);
        tenant.await.unwrap();
        let degraded: u64 = caches.iter().map(|c| c.stats().store_errors).sum();
        println!(
            "| `{policy}` | {:.2} | {second_leaders} of {STAMPEDES} | {degraded} | {hits} | {:.2} | {:.2} |",
            loads_total as f64 / STAMPEDES as f64,
            scripts as f64 / hits.max(1) as f64,
            publishes as f64 / hits.max(1) as f64,
        );
    }
}
