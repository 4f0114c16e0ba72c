//! A cache stampede, four ways: N concurrent requests for ONE cold key, spread round-robin
//! over K "app instances" (simulated in this process), in front of a slow origin.
//!
//! 1. `no cache`: every request calls the origin, so the origin sees N loads.
//! 2. `L1 only (moka, per instance)`: each instance has its own `moka` cache whose
//!    `get_with` coalesces concurrent misses, so the origin sees one load per instance (K).
//! 3. `tower-stampede`: each instance is its own [`tower_stampede::Cache`] (with its own L1),
//!    all of them over ONE shared store; the store's reload lock lets one request of one
//!    instance load while every other request waits for its fill: one load in all. The
//!    followers are woken by the store's "filled" notification.
//! 4. `tower-stampede, polling only`: the same with
//!    [`notifications(false)`](tower_stampede::CacheBuilder::notifications): the followers
//!    find the fill by re-reading the store on their jittered backoff (5 ms growing to 200 ms).
//!
//! For each scenario the demo prints the origin's load count, the requests' latency
//! percentiles (nearest rank) and the number of errors (failed calls, panicked tasks or wrong
//! bodies). For the two `tower-stampede` scenarios it also prints how late the followers were:
//! the p99 of each follower's completion minus the end of the origin's load (every request but
//! the one that loaded is a follower). It then checks that both `tower-stampede` scenarios
//! loaded the origin exactly once and answered every request; if not, it prints a warning and
//! exits with code 1, so it can serve as a smoke test.
//!
//! Run it (no Redis needed: the instances share one in-process `MemoryStore`):
//!
//! ```sh
//! cargo run --release --example demo
//! cargo run --release --example demo -- --requests 200 --instances 2 --delay-ms 50
//! ```
//!
//! To share a real Redis instead (each run uses a fresh namespace, so the key is always cold):
//!
//! ```sh
//! cargo run --release --example demo -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! Options: `--requests N` (default 1000), `--instances K` (default 4), `--delay-ms MS`
//! (the origin's delay, default 100), `--redis URL`, `--help`. Exit codes: 0 success,
//! 1 the check failed or Redis is unreachable, 2 bad arguments.

use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Barrier;
use tower_stampede::store::{MemoryStore, Store};
use tower_stampede::Cache;

const USAGE: &str = "\
usage: cargo run --release --example demo -- [OPTIONS]

Simulates a cache stampede: N concurrent requests for one cold key, spread over K app
instances, against a slow origin, with no cache, a per-instance moka cache, and tower-stampede
(with fill notifications, then with polling only).

options:
  --requests N     concurrent requests per scenario (default 1000, at least 1)
  --instances K    simulated app instances (default 4, at least 1)
  --delay-ms MS    how long the origin takes to answer, in ms (default 100)
  --redis URL      share a Redis at URL (e.g. redis://127.0.0.1:6379/) instead of one
                   in-process MemoryStore
  --help           print this message";

/// The one key every request asks for.
const KEY: &str = "page:/home";

/// Size of the origin's page.
const PAGE_LEN: usize = 2048;

/// The demo's settings, from the command line.
#[derive(Debug)]
struct Args {
    requests: usize,
    instances: usize,
    delay: Duration,
    redis: Option<String>,
}

/// What the command line asks for.
enum Command {
    Run(Args),
    Help,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut parsed = Args {
        requests: 1000,
        instances: 4,
        delay: Duration::from_millis(100),
        redis: None,
    };
    while let Some(arg) = args.next() {
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone().or_else(|| args.next()) {
                Some(value) => Ok(value),
                None => Err(format!("{name} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--requests" => parsed.requests = positive("--requests", &value("--requests")?)?,
            "--instances" => parsed.instances = positive("--instances", &value("--instances")?)?,
            "--delay-ms" => {
                let raw = value("--delay-ms")?;
                let ms: u64 = raw.trim().parse().map_err(|_| {
                    format!("--delay-ms expects a whole number of milliseconds, got {raw:?}")
                })?;
                parsed.delay = Duration::from_millis(ms);
            }
            "--redis" => {
                let url = value("--redis")?;
                if url.trim().is_empty() {
                    return Err("--redis expects a URL such as redis://127.0.0.1:6379/".into());
                }
                parsed.redis = Some(url);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Command::Run(parsed))
}

/// A count of at least one.
fn positive(name: &str, raw: &str) -> Result<usize, String> {
    match raw.trim().parse::<usize>() {
        Ok(0) => Err(format!("{name} must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{name} expects a positive whole number, got {raw:?}"
        )),
    }
}

/// The slow backend: counts its loads and takes `delay` to answer each one.
struct Origin {
    loads: AtomicU64,
    /// The request whose load ended last, and when it ended.
    last_load: Mutex<Option<(usize, Instant)>>,
    delay: Duration,
    page: Bytes,
}

impl Origin {
    fn new(delay: Duration) -> Arc<Self> {
        let mut page = b"<!doctype html><html><body><h1>Home</h1><p>".to_vec();
        let tail = b"</p></body></html>\n";
        page.resize(PAGE_LEN - tail.len(), b'.');
        page.extend_from_slice(tail);
        Arc::new(Origin {
            loads: AtomicU64::new(0),
            last_load: Mutex::new(None),
            delay,
            page: Bytes::from(page),
        })
    }

    /// Loads the page for request `request`.
    async fn load(&self, request: usize) -> Bytes {
        self.loads.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        *self
            .last_load
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((request, Instant::now()));
        self.page.clone()
    }

    fn loads(&self) -> u64 {
        self.loads.load(Ordering::SeqCst)
    }

    fn last_load(&self) -> Option<(usize, Instant)> {
        *self
            .last_load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one scenario measured.
struct Report {
    name: &'static str,
    loads: u64,
    /// Latencies of the requests that completed, sorted.
    latencies: Vec<Duration>,
    /// For the one-load scenarios: how long after the end of the load each follower completed,
    /// sorted.
    lateness: Option<Vec<Duration>>,
    errors: usize,
}

/// The nearest-rank percentile `p` (1..=100) of sorted `samples`, in ms.
fn percentile_ms(samples: &[Duration], p: usize) -> Option<f64> {
    let n = samples.len();
    if n == 0 {
        return None;
    }
    let rank = (p * n).div_ceil(100).clamp(1, n);
    Some(samples[rank - 1].as_secs_f64() * 1000.0)
}

/// A table cell for a figure in ms, `-` when there is none.
fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

impl Report {
    fn row(&self) -> String {
        format!(
            "{:<30}{:>15}{:>9}{:>9}{:>9}{:>9}{:>11}",
            self.name,
            self.loads,
            ms(percentile_ms(&self.latencies, 50)),
            ms(percentile_ms(&self.latencies, 99)),
            ms(percentile_ms(&self.latencies, 100)),
            self.errors,
            ms(self.lateness_p99()),
        )
    }

    /// The followers' p99 lateness, in ms.
    fn lateness_p99(&self) -> Option<f64> {
        self.lateness.as_deref().and_then(|l| percentile_ms(l, 99))
    }
}

/// What a stampede measured.
struct Timings {
    /// Latencies of the requests that completed, sorted.
    latencies: Vec<Duration>,
    /// When each request completed, by request number (`None` if it failed).
    completed: Vec<Option<Instant>>,
    errors: usize,
}

/// Spawns `requests` tasks, one future each from `request(i)`, releases them all at the same
/// moment and times each one. A request fails if it errs, its task panics, or its body is not
/// `expected`.
async fn stampede<F, Fut, E>(requests: usize, expected: &Bytes, request: F) -> Timings
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(requests));
    let tasks: Vec<_> = (0..requests)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let call = request(i);
            tokio::spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let result = call.await;
                (started, Instant::now(), result.ok())
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(requests);
    let mut completed = Vec::with_capacity(requests);
    let mut errors = 0;
    for task in tasks {
        match task.await {
            Ok((started, ended, body)) => {
                latencies.push(ended - started);
                if body.as_ref() == Some(expected) {
                    completed.push(Some(ended));
                } else {
                    completed.push(None);
                    errors += 1;
                }
            }
            Err(_) => {
                completed.push(None);
                errors += 1;
            }
        }
    }
    latencies.sort_unstable();
    Timings {
        latencies,
        completed,
        errors,
    }
}

/// Scenario 1: every request goes to the origin.
async fn no_cache(args: &Args) -> Report {
    let origin = Origin::new(args.delay);
    let timings = stampede(args.requests, &origin.page, |i| {
        let origin = Arc::clone(&origin);
        async move { Ok::<_, ()>(origin.load(i).await) }
    })
    .await;
    Report {
        name: "no cache",
        loads: origin.loads(),
        latencies: timings.latencies,
        lateness: None,
        errors: timings.errors,
    }
}

/// Scenario 2: one moka cache per instance; `get_with` coalesces each instance's misses.
async fn l1_only(args: &Args) -> Report {
    let origin = Origin::new(args.delay);
    let instances: Vec<moka::future::Cache<String, Bytes>> = (0..args.instances)
        .map(|_| moka::future::Cache::new(1024))
        .collect();
    let timings = stampede(args.requests, &origin.page, |i| {
        let (origin, l1) = (Arc::clone(&origin), instances[i % instances.len()].clone());
        async move {
            let value = l1
                .get_with(KEY.to_owned(), async move { origin.load(i).await })
                .await;
            Ok::<_, ()>(value)
        }
    })
    .await;
    Report {
        name: "L1 only (moka, per instance)",
        loads: origin.loads(),
        latencies: timings.latencies,
        lateness: None,
        errors: timings.errors,
    }
}

/// Scenarios 3 and 4: one `tower_stampede::Cache` per instance, all over one shared store;
/// followers are woken by fill notifications, or (`notifications` false) only by their polls.
async fn guarded(args: &Args, store: &Arc<dyn Store>, notifications: bool) -> Report {
    let origin = Origin::new(args.delay);
    // A namespace of its own, so the key is cold even on a Redis shared with earlier runs.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let namespace = format!("demo-{}-{}", std::process::id(), since_epoch.as_nanos());
    // Followers must outwait the origin, however slow it was told to be.
    let patience = Duration::from_secs(30).max(args.delay.saturating_mul(2));
    let instances: Vec<Cache> = (0..args.instances)
        .map(|_| {
            Cache::builder_shared(Arc::clone(store))
                .namespace(&namespace)
                .load_timeout(patience)
                .wait_timeout(patience)
                .notifications(notifications)
                .build()
        })
        .collect();
    let timings = stampede(args.requests, &origin.page, |i| {
        let (origin, cache) = (Arc::clone(&origin), instances[i % instances.len()].clone());
        async move {
            cache
                .get_or_load(KEY, move || async move {
                    Ok::<_, std::convert::Infallible>(origin.load(i).await)
                })
                .await
        }
    })
    .await;
    // With one load, the request that ran it is the leader and every other one a follower.
    let lateness = match (origin.loads(), origin.last_load()) {
        (1, Some((leader, load_end))) => {
            let mut lateness: Vec<Duration> = (timings.completed.iter().enumerate())
                .filter(|&(i, _)| i != leader)
                .filter_map(|(_, completed)| *completed)
                .map(|completed| completed.saturating_duration_since(load_end))
                .collect();
            lateness.sort_unstable();
            Some(lateness)
        }
        _ => None,
    };
    Report {
        name: if notifications {
            "tower-stampede"
        } else {
            "tower-stampede, polling only"
        },
        loads: origin.loads(),
        latencies: timings.latencies,
        lateness,
        errors: timings.errors,
    }
}

/// The shared store: Redis if asked for, else one in-process `MemoryStore`; and how to name it.
async fn open_store(redis: Option<&str>) -> Result<(Arc<dyn Store>, String), String> {
    let Some(url) = redis else {
        return Ok((Arc::new(MemoryStore::new()), "memory".to_owned()));
    };
    connect_redis(url).await
}

#[cfg(feature = "redis")]
async fn connect_redis(url: &str) -> Result<(Arc<dyn Store>, String), String> {
    let store = tower_stampede::store::RedisStore::connect(url)
        .await
        .map_err(|e| format!("cannot use Redis: {e}"))?;
    let name = format!("redis ({})", store.address());
    Ok((Arc::new(store), name))
}

#[cfg(not(feature = "redis"))]
async fn connect_redis(_url: &str) -> Result<(Arc<dyn Store>, String), String> {
    Err("--redis needs the crate's `redis` feature (on by default)".to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(args)) => args,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (store, store_name) = match open_store(args.redis.as_deref()).await {
        Ok(opened) => opened,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };

    println!(
        "tower-stampede demo: {} concurrent requests for one cold key, {} app instances, origin {} ms, store: {}",
        args.requests,
        args.instances,
        args.delay.as_millis(),
        store_name,
    );
    println!(
        "{:<30}{:>15}{:>9}{:>9}{:>9}{:>9}{:>11}",
        "scenario", "backend loads", "p50 ms", "p99 ms", "max ms", "errors", "late p99"
    );
    println!("{}", no_cache(&args).await.row());
    println!("{}", l1_only(&args).await.row());
    let notified = guarded(&args, &store, true).await;
    println!("{}", notified.row());
    let polling = guarded(&args, &store, false).await;
    println!("{}", polling.row());
    println!("(late p99: the p99 of a follower's completion minus the end of the load, in ms)");

    let plural = if notified.loads == 1 { "" } else { "s" };
    println!(
        "\ntower-stampede: {} backend load{plural} for {} requests (expected 1)",
        notified.loads, args.requests
    );
    println!(
        "followers done {} ms after the load (p99) when woken by the fill's notification, {} ms when polling only",
        ms(notified.lateness_p99()),
        ms(polling.lateness_p99()),
    );
    let mut passed = true;
    for report in [&notified, &polling] {
        if report.loads != 1 || report.errors > 0 {
            eprintln!(
                "warning: {}: the stampede got through: {} backend loads and {} errors, expected 1 load and 0 errors",
                report.name, report.loads, report.errors
            );
            passed = false;
        }
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
