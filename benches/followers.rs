//! How late followers are after the leader's load: woken by Redis pub/sub "filled"
//! notifications, against the backoff polls alone.
//!
//! The bench starts its own `redis-server` on a free loopback port and builds three "app
//! instances": three [`Cache`]s, each over its own [`RedisStore`] (its own connections and its
//! own pub/sub subscriber) to that one server. Each round asks for a fresh key: 300 concurrent
//! requests (100 per instance), released together, call [`Cache::fetch`] with a loader that
//! takes 300 ms and notes the instant its load ended. One request leads; every other one is a
//! follower, in the leader's instance or another. A follower's **lateness** is its completion
//! instant minus the load's end: the leader's fill, the notification (or the poll that finds
//! the value), the follower's re-read, and waking the instance's callers.
//!
//! Two configurations, interleaved round by round (each goes first every other round):
//!
//! - `notifications on`: the default, followers are woken by the fill's notification (and poll
//!   as a fallback);
//! - `polling only`: [`CacheBuilder::notifications(false)`](tower_stampede::CacheBuilder::notifications),
//!   followers re-read on the default jittered backoff (5 ms growing ×1.5 to 200 ms).
//!
//! Each configuration first runs one warm-up round that is not counted (script loading,
//! subscribing to the namespace's channel). Every round must make exactly one backend load
//! and answer every request with the round's value; the bench panics otherwise.
//!
//! ```sh
//! cargo bench --bench followers                 # 20 rounds per configuration
//! ROUNDS=50 cargo bench --bench followers
//! cargo bench --bench followers -- --rounds 50
//! ```
//!
//! Percentiles are nearest rank, over the followers of every round of a configuration. The
//! followers of one instance are woken together, so a run's p99 is about its worst round's
//! lateness: one round whose fill or notification was held up (a descheduled thread on a busy
//! machine) sets it, while p50 is the steady figure. A second table splits the lateness by
//! where the follower ran: in the leader's instance (woken by the leader's own flight, so
//! after the fill's round trip) or in another one (after the fill, the notification or poll,
//! and a re-read).

#[path = "shared/percentile.rs"]
mod percentile;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use percentile::percentile_ms;
use tokio::sync::Barrier;
use tower_stampede::store::Store;
use tower_stampede::{Cache, Loaded, Outcome};

/// Simulated app instances, each with its own `RedisStore`.
const INSTANCES: usize = 3;

/// Concurrent requests per instance and round.
const REQUESTS_PER_INSTANCE: usize = 100;

/// How long the backend takes to load.
const LOAD_TIME: Duration = Duration::from_millis(300);

/// Counted rounds per configuration, unless `ROUNDS` or `--rounds` says otherwise.
const DEFAULT_ROUNDS: usize = 20;

/// The lateness the notifications should keep the p99 under.
const TARGET_P99: Duration = Duration::from_millis(5);

/// How followers learn of the fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    Notified,
    Polling,
}

impl Wake {
    fn name(self) -> &'static str {
        match self {
            Wake::Notified => "notifications on",
            Wake::Polling => "polling only",
        }
    }
}

/// One configuration: its instances and what its counted rounds measured.
struct Bench {
    wake: Wake,
    instances: Vec<Cache>,
    rounds: usize,
    requests: usize,
    loads: usize,
    /// Every follower's lateness, over every counted round.
    lateness: Vec<Duration>,
    /// The same, split by where the follower ran: in the leader's instance (woken by the
    /// leader's own flight) or in another one (woken through the store).
    by_instance: [Vec<Duration>; 2],
}

impl Bench {
    fn new(wake: Wake, stores: &[Arc<dyn Store>], namespace: &str) -> Self {
        let instances = stores
            .iter()
            .map(|store| {
                Cache::builder_shared(Arc::clone(store))
                    .namespace(namespace)
                    .notifications(wake == Wake::Notified)
                    .build()
            })
            .collect();
        Bench {
            wake,
            instances,
            rounds: 0,
            requests: 0,
            loads: 0,
            lateness: Vec::new(),
            by_instance: [Vec::new(), Vec::new()],
        }
    }

    /// Runs round `round` and, unless it is the warm-up, counts it.
    async fn run(&mut self, round: usize, counted: bool) {
        let measured = stampede(&self.instances, self.wake, round).await;
        if counted {
            self.rounds += 1;
            self.requests += measured.requests;
            self.loads += measured.loads;
            for (late, in_leaders_instance) in measured.lateness {
                self.lateness.push(late);
                self.by_instance[usize::from(!in_leaders_instance)].push(late);
            }
        }
    }

    /// The nearest-rank percentile `p` (1..=100) of the lateness, in ms.
    fn percentile_ms(&self, p: usize) -> f64 {
        percentile_ms(&self.lateness, p)
    }

    fn row(&self) -> String {
        format!(
            "{:<20}{:>8}{:>10}{:>7}{:>11}{:>9.1}{:>9.1}{:>9.1}",
            self.wake.name(),
            self.rounds,
            self.requests,
            self.loads,
            self.lateness.len(),
            self.percentile_ms(50),
            self.percentile_ms(99),
            self.percentile_ms(100),
        )
    }

    fn split_row(&self) -> String {
        let [local, remote] = &self.by_instance;
        format!(
            "{:<20}{:>11}{:>9.1}{:>9.1}{:>11}{:>9.1}{:>9.1}",
            self.wake.name(),
            local.len(),
            percentile_ms(local, 50),
            percentile_ms(local, 99),
            remote.len(),
            percentile_ms(remote, 50),
            percentile_ms(remote, 99),
        )
    }
}

/// What one round measured.
struct Round {
    requests: usize,
    loads: usize,
    /// Each follower's lateness, and whether it ran in the leader's instance.
    lateness: Vec<(Duration, bool)>,
}

/// One round: a fresh key, every request released at once; panics unless the round made
/// exactly one load and every request got the round's value.
async fn stampede(instances: &[Cache], wake: Wake, round: usize) -> Round {
    let key = format!("round-{round}");
    let value = Bytes::from(format!("value of round {round}"));
    let total = instances.len() * REQUESTS_PER_INSTANCE;
    let loads = Arc::new(AtomicUsize::new(0));
    let load_end: Arc<Mutex<Option<Instant>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(total));
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let cache = instances[i % instances.len()].clone();
            let (key, value) = (key.clone(), value.clone());
            let (loads, load_end, barrier) = (
                Arc::clone(&loads),
                Arc::clone(&load_end),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let fetched = cache
                    .fetch(key, move || async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(LOAD_TIME).await;
                        *load_end.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some(Instant::now());
                        Ok::<_, Infallible>(Loaded::value(value))
                    })
                    .await;
                (Instant::now(), fetched)
            })
        })
        .collect();

    let what = format!("{}, round {round}", wake.name());
    let mut leaders = Vec::new();
    let mut completions = Vec::with_capacity(total);
    for (i, task) in tasks.into_iter().enumerate() {
        let (completed, fetched) = task
            .await
            .unwrap_or_else(|e| panic!("{what}: a request's task failed: {e}"));
        let fetched = fetched.unwrap_or_else(|e| panic!("{what}: a request failed: {e}"));
        assert_eq!(
            fetched.value(),
            Some(&value),
            "{what}: a request got the wrong value"
        );
        let instance = i % instances.len();
        if fetched.outcome() == Outcome::Leader {
            leaders.push(instance);
        } else {
            completions.push((completed, instance));
        }
    }
    let loads = loads.load(Ordering::SeqCst);
    assert_eq!(
        loads, 1,
        "{what}: {loads} backend loads, expected exactly 1"
    );
    let [leader] = leaders[..] else {
        panic!("{what}: {} leaders, expected exactly 1", leaders.len());
    };
    let load_end = load_end
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or_else(|| panic!("{what}: the load never ended"));
    let lateness = completions
        .into_iter()
        .map(|(completed, instance)| {
            let late = completed
                .checked_duration_since(load_end)
                .unwrap_or_else(|| panic!("{what}: a follower completed before the load ended"));
            (late, instance == leader)
        })
        .collect();
    Round {
        requests: total,
        loads,
        lateness,
    }
}

/// Counted rounds: `--rounds N` (or `--rounds=N`), else `ROUNDS`, else 20. Other arguments
/// (such as the `--bench` that `cargo bench` passes) are ignored.
fn rounds() -> usize {
    let mut args = std::env::args().skip(1);
    let mut from_args = None;
    while let Some(arg) = args.next() {
        if arg == "--rounds" {
            from_args = args.next();
        } else if let Some(value) = arg.strip_prefix("--rounds=") {
            from_args = Some(value.to_owned());
        }
    }
    match from_args.or_else(|| std::env::var("ROUNDS").ok()) {
        None => DEFAULT_ROUNDS,
        Some(raw) => match raw.trim().parse() {
            Ok(n) if n > 0 => n,
            _ => panic!("the number of rounds must be a positive whole number, got {raw:?}"),
        },
    }
}

async fn run(server: &support::RedisServer, rounds: usize) {
    let stores = server.stores(INSTANCES).await;
    // Namespaces of this run's own, so every key starts cold.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let run = format!(
        "followers-{}-{}",
        std::process::id(),
        since_epoch.as_nanos()
    );
    let mut benches = [
        Bench::new(Wake::Notified, &stores, &format!("{run}-notified")),
        Bench::new(Wake::Polling, &stores, &format!("{run}-polling")),
    ];

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "followers: {INSTANCES} instances x {REQUESTS_PER_INSTANCE} concurrent requests for one cold key per round, \
         load {} ms, {rounds} rounds per configuration (+1 warm-up), redis-server on loopback, {cores} cores",
        LOAD_TIME.as_millis(),
    );
    for round in 0..=rounds {
        // Alternate which configuration goes first; round 0 is the warm-up.
        if round % 2 == 1 {
            benches.reverse();
        }
        for bench in &mut benches {
            bench.run(round, round > 0).await;
        }
        if round % 2 == 1 {
            benches.reverse();
        }
    }

    println!(
        "lateness = a follower's completion - the end of the load (every request but the leader's)"
    );
    println!(
        "{:<20}{:>8}{:>10}{:>7}{:>11}{:>9}{:>9}{:>9}",
        "configuration", "rounds", "requests", "loads", "followers", "p50 ms", "p99 ms", "max ms"
    );
    for bench in &benches {
        println!("{}", bench.row());
    }
    println!("\nthe same lateness, by where the follower ran");
    println!(
        "{:<20}{:>11}{:>9}{:>9}{:>11}{:>9}{:>9}",
        "configuration", "leader's", "p50 ms", "p99 ms", "others'", "p50 ms", "p99 ms"
    );
    for bench in &benches {
        println!("{}", bench.split_row());
    }
    let notified = &benches[0];
    let p99 = notified.percentile_ms(99);
    let verdict = if p99 < TARGET_P99.as_secs_f64() * 1000.0 {
        "yes"
    } else {
        "NO"
    };
    println!(
        "\np99 lateness with notifications: {p99:.1} ms; under {} ms: {verdict}",
        TARGET_P99.as_millis()
    );
}

fn main() {
    let rounds = rounds();
    let server = support::RedisServer::start();
    // Dropped before the server, so the connections close before it goes away.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(&server, rounds));
}
