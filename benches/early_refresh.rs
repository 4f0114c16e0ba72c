//! Early refresh under continuous load: a key with a 1 s TTL, hammered for 10 s by many
//! clients over three instances that share one real `redis-server` (started here, on a free
//! loopback port). Without early refresh, every expiry makes the clients that arrive during
//! the reload wait for it; with XFetch (`CacheBuilder::early_refresh`), one request refreshes
//! the key shortly before it expires, and nobody waits.
//!
//! ```sh
//! cargo bench --bench early_refresh
//! cargo bench --bench early_refresh -- --seconds 5 --clients 32 --load-ms 50
//! cargo bench --bench early_refresh -- --fast --load-ms 100   # about 20 000 req/s in all
//! ```
//!
//! `--fast` makes each client pause 1 to 3 ms between requests instead of 5 to 15: with
//! one coin per hit, the hotter key refreshed earlier and more often; with one refresh point
//! per value, the rate should not matter.
//!
//! The key is loaded once before the clients start. For each configuration it prints the
//! requests served, the backend loads (and loads per TTL period), how many requests waited for
//! a load (answered as leader or follower rather than from a cache or with a stale value),
//! and latency percentiles (nearest rank).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use support::RedisServer;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Loaded, Outcome};

const TTL: Duration = Duration::from_secs(1);
const INSTANCES: usize = 3;

struct Settings {
    seconds: u64,
    clients: usize,
    load: Duration,
    /// Each client's pause between requests, in ms (drawn uniformly).
    pause_ms: (u64, u64),
}

fn settings() -> Settings {
    let mut settings = Settings {
        seconds: 10,
        clients: 48,
        load: Duration::from_millis(20),
        pause_ms: (5, 15),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a whole number"))
        };
        match arg.as_str() {
            "--seconds" => settings.seconds = number("--seconds").max(1),
            "--clients" => {
                settings.clients = usize::try_from(number("--clients")).unwrap_or(1).max(1)
            }
            "--load-ms" => settings.load = Duration::from_millis(number("--load-ms")),
            "--fast" => settings.pause_ms = (1, 3),
            // `cargo bench` passes `--bench`; ignore what is not ours.
            _ => {}
        }
    }
    settings
}

/// What one configuration measured.
struct Run {
    requests: usize,
    loads: u64,
    waited: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

async fn run(
    redis_url: &str,
    settings: &Settings,
    configure: fn(tower_stampede::CacheBuilder) -> tower_stampede::CacheBuilder,
) -> Run {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let namespace = format!("bench-early-{nanos}");
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::connect(redis_url)
            .await
            .expect("connect to the bench's redis-server");
        let builder = Cache::builder(store).namespace(&namespace).ttl(TTL);
        instances.push(configure(builder).build());
    }
    let loads = Arc::new(AtomicU64::new(0));
    // Warm the key first (with a load as slow as the others: early refresh learns the load
    // time from the last load): what is measured is the steady state, not the cold miss.
    let load_time = settings.load;
    instances[0]
        .get_or_load("hot-key", move || async move {
            tokio::time::sleep(load_time).await;
            Ok::<_, std::io::Error>(Bytes::from_static(b"v0"))
        })
        .await
        .expect("the warm-up load");
    let started = Instant::now();
    let until = started + Duration::from_secs(settings.seconds);
    let clients: Vec<_> = (0..settings.clients)
        .map(|i| {
            let cache = instances[i % INSTANCES].clone();
            let (loads, load_time) = (Arc::clone(&loads), settings.load);
            let (low, high) = settings.pause_ms;
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while Instant::now() < until {
                    let loads = Arc::clone(&loads);
                    let asked = Instant::now();
                    let fetched = cache
                        .fetch("hot-key", move || async move {
                            let n = loads.fetch_add(1, Ordering::Relaxed) + 1;
                            tokio::time::sleep(load_time).await;
                            Ok::<_, std::io::Error>(Loaded::value(Bytes::from(format!("v{n}"))))
                        })
                        .await
                        .expect("the key is always answered");
                    seen.push((asked.elapsed(), fetched.outcome()));
                    // About 100 (or, `--fast`, 500) requests per second per client, out of
                    // step with the others.
                    let pause = rand::random_range(low..=high);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                seen
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut waited = 0;
    for client in clients {
        for (latency, outcome) in client.await.expect("a client panicked") {
            latencies.push(latency);
            if matches!(
                outcome,
                Outcome::Leader | Outcome::Follower | Outcome::Uncached
            ) {
                waited += 1;
            }
        }
    }
    latencies.sort();
    Run {
        requests: latencies.len(),
        loads: loads.load(Ordering::Relaxed),
        waited,
        latencies,
        elapsed: started.elapsed(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn main() {
    let settings = settings();
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    println!(
        "early refresh: {} s of traffic, {} clients (pausing {}-{} ms) over {INSTANCES} instances \
         on one redis-server, TTL {} s, load {} ms",
        settings.seconds,
        settings.clients,
        settings.pause_ms.0,
        settings.pause_ms.1,
        TTL.as_secs(),
        settings.load.as_millis()
    );
    println!(
        "{:<34} {:>9} {:>6} {:>9} {:>7} {:>8} {:>8} {:>8}",
        "configuration", "requests", "loads", "per TTL", "waited", "p50 ms", "p99 ms", "max ms"
    );
    let configurations: [(&str, fn(_) -> _); 3] = [
        ("no early refresh", |b: tower_stampede::CacheBuilder| {
            b.early_refresh(0.0)
        }),
        ("early refresh, beta 1 (default)", |b| b.early_refresh(1.0)),
        ("stale window 1 s, no early refresh", |b| {
            b.early_refresh(0.0).stale(Duration::from_secs(1))
        }),
    ];
    for (name, configure) in configurations {
        let run = runtime.block_on(run(&redis.url(), &settings, configure));
        let periods = run.elapsed.as_secs_f64() / TTL.as_secs_f64();
        println!(
            "{:<34} {:>9} {:>6} {:>9.2} {:>7} {:>8.2} {:>8.2} {:>8.2}   ({:.0} req/s)",
            name,
            run.requests,
            run.loads,
            run.loads as f64 / periods,
            run.waited,
            percentile(&run.latencies, 50.0),
            percentile(&run.latencies, 99.0),
            percentile(&run.latencies, 100.0),
            run.requests as f64 / run.elapsed.as_secs_f64(),
        );
    }
}
