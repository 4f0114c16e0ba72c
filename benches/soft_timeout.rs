//! A soft timeout against a slow reload: a stale value is there, the reload takes 500 ms,
//! and the caller asks for a soft timeout of 50 ms. It should be answered the stale value
//! after the soft timeout plus a margin, while the reload goes on; the reload is one load,
//! and its value is what the next call reads once it lands.
//!
//! Each round, over a `redis-server` this bench starts: make the value stale
//! (`Cache::expire`), time a `fetch_with_soft_timeout` whose loader takes 500 ms, then wait
//! for the fresh value and count the loads. Prints the answer times' p50, p99 and max.
//!
//! ```sh
//! cargo bench --bench soft_timeout           # 20 rounds
//! cargo bench --bench soft_timeout -- 50     # 50 rounds
//! ```

#[path = "shared/percentile.rs"]
mod percentile;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Loaded, Outcome};

const SOFT: Duration = Duration::from_millis(50);
const LOAD: Duration = Duration::from_millis(500);

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(20)
        .max(1);
    let server = support::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let store = runtime
        .block_on(RedisStore::connect(server.url()))
        .expect("connect the store");
    let cache = Cache::builder(store)
        .stale_if_error(Duration::from_secs(60))
        .build();
    let loads = Arc::new(AtomicUsize::new(0));
    let answers = runtime.block_on(async {
        let mut answers = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let load = |value: Bytes, loads: Arc<AtomicUsize>| {
                move || async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(LOAD).await;
                    Ok::<_, std::io::Error>(Loaded::value(value))
                }
            };
            let old = Bytes::from(format!("v{round}"));
            let new = Bytes::from(format!("v{}", round + 1));
            if round == 0 {
                cache
                    .fetch("report", load(old.clone(), loads.clone()))
                    .await
                    .expect("first load");
            }
            cache.expire("report").await.expect("made stale");
            let before = loads.load(Ordering::SeqCst);
            let started = Instant::now();
            let answer = cache
                .fetch_with_soft_timeout("report", SOFT, load(new.clone(), loads.clone()))
                .await
                .expect("an answer");
            answers.push(started.elapsed());
            assert_eq!(answer.outcome(), Outcome::Stale, "the stale value answers");
            assert_eq!(answer.value(), Some(&old));
            // The reload goes on: its value lands, from one load.
            loop {
                let fetched = cache
                    .fetch("report", || async {
                        Err::<Loaded, _>(std::io::Error::other("no second load"))
                    })
                    .await;
                if matches!(&fetched, Ok(f) if f.value() == Some(&new)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                loads.load(Ordering::SeqCst),
                before + 1,
                "one load per round"
            );
        }
        answers
    });
    println!(
        "soft timeout {} ms, load {} ms, {rounds} rounds over Redis: answered stale after p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; one load per round, its value read next",
        SOFT.as_millis(),
        LOAD.as_millis(),
        percentile::percentile_ms(&answers, 50),
        percentile::percentile_ms(&answers, 99),
        percentile::percentile_ms(&answers, 100),
    );
}
