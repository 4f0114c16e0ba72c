//! The stampede that the demo and the `stampede` bench measure: N concurrent requests for ONE
//! cold key, spread round-robin over K "app instances" (simulated in this process), in front
//! of an origin whose load takes a fixed time, in the scenarios of [`Scenario`].
//!
//! A run measures the origin's load count, each request's latency, the errors (failed calls,
//! panicked tasks or wrong bodies) and, when the origin loaded once, how late the followers
//! were: each follower's completion minus the end of the load (every request but the one that
//! loaded is a follower). Percentiles are nearest rank.
//!
//! `examples/demo/main.rs` and `benches/stampede.rs` both include this file as a module.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Barrier;
use tower_stampede::store::Store;
use tower_stampede::Cache;

/// The one key every request asks for.
const KEY: &str = "page:/home";

/// Size of the origin's page.
const PAGE_LEN: usize = 2048;

/// The concurrencies of the ladder: requests for the key at once.
const LADDER: [usize; 5] = [1, 10, 100, 1_000, 10_000];

/// What the `late p99` column means, printed under every table.
pub const LATE_NOTE: &str =
    "(late p99: the p99 of a follower's completion minus the end of the load, in ms)";

/// How the instances protect the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Every request calls the origin: N loads.
    NoCache,
    /// One `moka` cache per instance, whose `get_with` coalesces the instance's concurrent
    /// misses: one load per instance (K).
    L1Only,
    /// One [`tower_stampede::Cache`] per instance (with its own L1), all over the shared store,
    /// whose reload lock lets one request of one instance load while every other one waits for
    /// its fill: one load in all. The followers are woken by the store's "filled"
    /// notification or, with `notifications` false, find the fill by re-reading the store on
    /// their jittered backoff (5 ms growing to 200 ms).
    Guarded { notifications: bool },
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::NoCache => "no cache",
            Scenario::L1Only => "L1 only (moka, per instance)",
            Scenario::Guarded {
                notifications: true,
            } => "tower-stampede",
            Scenario::Guarded {
                notifications: false,
            } => "tower-stampede, polling only",
        }
    }
}

/// Where a run happens.
pub struct Setup {
    /// The shared store as each instance reaches it, one entry per instance: the same
    /// `MemoryStore`, or each instance's own connections to one Redis.
    pub stores: Vec<Arc<dyn Store>>,
    /// How long the origin takes to load.
    pub load: Duration,
}

/// The slow backend: counts its loads and takes `load` to answer each one.
struct Origin {
    loads: AtomicU64,
    /// The request whose load ended last, and when it ended.
    last_load: Mutex<Option<(usize, Instant)>>,
    load: Duration,
    page: Bytes,
}

impl Origin {
    fn new(load: Duration) -> Arc<Self> {
        let mut page = b"<!doctype html><html><body><h1>Home</h1><p>".to_vec();
        let tail = b"</p></body></html>\n";
        page.resize(PAGE_LEN - tail.len(), b'.');
        page.extend_from_slice(tail);
        Arc::new(Origin {
            loads: AtomicU64::new(0),
            last_load: Mutex::new(None),
            load,
            page: Bytes::from(page),
        })
    }

    /// Loads the page for request `request`.
    async fn load(&self, request: usize) -> Bytes {
        self.loads.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.load).await;
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
pub fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// The two tables: one run per scenario, or the ladder (with a concurrency column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    OneRun,
    Ladder,
}

impl Table {
    pub fn header(self) -> String {
        self.line(
            "scenario",
            "concurrency",
            [
                "backend loads",
                "p50 ms",
                "p99 ms",
                "max ms",
                "errors",
                "late p99",
            ],
        )
    }

    fn line(self, scenario: &str, concurrency: &str, figures: [&str; 6]) -> String {
        let [loads, p50, p99, max, errors, late] = figures;
        let concurrency = match self {
            Table::OneRun => String::new(),
            Table::Ladder => format!("{concurrency:>12}"),
        };
        format!(
            "{scenario:<30}{concurrency}{loads:>15}{p50:>9}{p99:>9}{max:>9}{errors:>9}{late:>11}"
        )
    }
}

/// What one run measured.
pub struct Report {
    pub scenario: Scenario,
    /// Concurrent requests.
    pub requests: usize,
    pub loads: u64,
    pub errors: usize,
    /// Latencies of the requests that completed, sorted.
    latencies: Vec<Duration>,
    /// When the origin loaded once: how long after the end of the load each follower
    /// completed, sorted.
    lateness: Option<Vec<Duration>>,
}

impl Report {
    /// The nearest-rank percentile `p` (1..=100) of the latencies, in ms.
    pub fn latency_ms(&self, p: usize) -> Option<f64> {
        percentile_ms(&self.latencies, p)
    }

    /// The followers' p99 lateness, in ms.
    pub fn lateness_p99(&self) -> Option<f64> {
        self.lateness.as_deref().and_then(|l| percentile_ms(l, 99))
    }

    pub fn row(&self, table: Table) -> String {
        table.line(
            self.scenario.name(),
            &self.requests.to_string(),
            [
                &self.loads.to_string(),
                &ms(self.latency_ms(50)),
                &ms(self.latency_ms(99)),
                &ms(self.latency_ms(100)),
                &self.errors.to_string(),
                &ms(self.lateness_p99()),
            ],
        )
    }

    /// Whether a `tower-stampede` run held the stampede to exactly one load and answered every
    /// request; other scenarios pass.
    pub fn check(&self) -> Result<(), String> {
        if matches!(self.scenario, Scenario::Guarded { .. }) && (self.loads != 1 || self.errors > 0)
        {
            return Err(format!(
                "{}: the stampede got through at concurrency {}: {} backend loads and {} errors, expected 1 load and 0 errors",
                self.scenario.name(),
                self.requests,
                self.loads,
                self.errors
            ));
        }
        Ok(())
    }
}

/// Runs `scenario` once: `requests` concurrent requests for the cold key.
pub async fn run(scenario: Scenario, setup: &Setup, requests: usize) -> Report {
    let origin = Origin::new(setup.load);
    let timings = match scenario {
        Scenario::NoCache => {
            stampede(requests, &origin.page, |i| {
                let origin = Arc::clone(&origin);
                async move { Ok::<_, ()>(origin.load(i).await) }
            })
            .await
        }
        Scenario::L1Only => {
            let instances: Vec<moka::future::Cache<String, Bytes>> = (0..setup.stores.len())
                .map(|_| moka::future::Cache::new(1024))
                .collect();
            stampede(requests, &origin.page, |i| {
                let (origin, l1) = (Arc::clone(&origin), instances[i % instances.len()].clone());
                async move {
                    let value = l1
                        .get_with(KEY.to_owned(), async move { origin.load(i).await })
                        .await;
                    Ok::<_, ()>(value)
                }
            })
            .await
        }
        Scenario::Guarded { notifications } => {
            let instances = guarded_instances(setup, notifications);
            stampede(requests, &origin.page, |i| {
                let (origin, cache) = (Arc::clone(&origin), instances[i % instances.len()].clone());
                async move {
                    cache
                        .get_or_load(KEY, move || async move {
                            Ok::<_, std::convert::Infallible>(origin.load(i).await)
                        })
                        .await
                }
            })
            .await
        }
    };
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
        scenario,
        requests,
        loads: origin.loads(),
        errors: timings.errors,
        latencies: timings.latencies,
        lateness,
    }
}

/// One `tower_stampede::Cache` per instance, over that instance's store.
fn guarded_instances(setup: &Setup, notifications: bool) -> Vec<Cache> {
    // A namespace of its own, so the key is cold even on a Redis shared with earlier runs.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let namespace = format!("stampede-{}-{}", std::process::id(), since_epoch.as_nanos());
    // Followers must outwait the origin, however slow it was told to be.
    let patience = Duration::from_secs(30).max(setup.load.saturating_mul(2));
    (setup.stores.iter())
        .map(|store| {
            Cache::builder_shared(Arc::clone(store))
                .namespace(&namespace)
                .load_timeout(patience)
                .wait_timeout(patience)
                .notifications(notifications)
                .build()
        })
        .collect()
}

/// The concurrencies of the [`LADDER`] up to `max`.
pub fn steps(max: usize) -> Vec<usize> {
    LADDER.into_iter().filter(|&n| n <= max).collect()
}

/// Runs each scenario at each concurrency of the [`LADDER`] up to `max`, all scenarios at one
/// concurrency before the next, and prints the table as it goes; returns the reports in that
/// order.
pub async fn ladder(setup: &Setup, scenarios: &[Scenario], max: usize) -> Vec<Report> {
    println!("{}", Table::Ladder.header());
    let mut reports = Vec::new();
    for requests in steps(max) {
        for &scenario in scenarios {
            let report = run(scenario, setup, requests).await;
            println!("{}", report.row(Table::Ladder));
            reports.push(report);
        }
    }
    println!("{LATE_NOTE}");
    reports
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

/// A count of at least one, from the command line.
pub fn positive(name: &str, raw: &str) -> Result<usize, String> {
    match raw.trim().parse::<usize>() {
        Ok(0) => Err(format!("{name} must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{name} expects a positive whole number, got {raw:?}"
        )),
    }
}

/// A whole number of milliseconds, from the command line.
pub fn millis(name: &str, raw: &str) -> Result<Duration, String> {
    let ms: u64 = (raw.trim().parse())
        .map_err(|_| format!("{name} expects a whole number of milliseconds, got {raw:?}"))?;
    Ok(Duration::from_millis(ms))
}
