//! How soon the other app instances serve a corrected value: after [`Cache::invalidate`],
//! [`Cache::set`] or [`Cache::clear`] in one instance, with the store's notifications evicting the key from every
//! L1, against [`l1_ttl_cap`](tower_stampede::CacheBuilder::l1_ttl_cap) without them.
//!
//! The bench starts its own `redis-server` on a free loopback port and builds three "app
//! instances" A, B and C: three [`Cache`]s, each over its own `RedisStore` (its own
//! connections and its own pub/sub subscriber) to that one server. Each round takes a fresh
//! key, at version 1 in a shared "database" that the loader reads, and makes every instance
//! hold it in L1 (each reads until [`Cache::fetch`] answers [`Outcome::L1Hit`]). Then B and C
//! poll the key ([`Cache::fetch`] in a loop), the database moves to version 2, and A calls
//! `invalidate` (the next read loads version 2), `set` (writes version 2 through) or `clear`
//! (the whole namespace: the next read loads version 2). A round's
//! **lateness** is the time from just before A's call until the last of B and C served
//! version 2.
//!
//! Four configurations take turns round by round (their order rotates every round):
//!
//! - `invalidate`, `set` and `clear`, `notifications on` (the default): the change's
//!   notification evicts the key from B's and C's L1 (a clear's, every key);
//! - `invalidate` and `set`, `notifications off`
//!   ([`CacheBuilder::notifications(false)`](tower_stampede::CacheBuilder::notifications), with
//!   `l1_ttl_cap` 1 s): B and C keep their copy until it leaves L1 at the cap. Each round's
//!   copies were read just before the change, so the lateness is about the whole cap (the
//!   worst case: a copy read earlier goes sooner). A round costs about the cap, so these run
//!   fewer rounds, spread evenly among the others.
//!
//! Each configuration first runs one warm-up round that is not counted (script loading,
//! subscribing to the namespace's channel). The `loads` column counts the backend loads after
//! the change: one per round for `invalidate` and `clear` (B or C reloads, the other follows
//! it), none for `set`. The bench panics if a round does not converge within 10 s with notifications
//! (the cap + 5 s without), or if an instance serves anything but the old or the new version:
//! a broken protocol cannot print a table.
//!
//! B and C each poll from a thread of their own (a blocking task that drives each read on the
//! runtime), sleeping [`POLL`] (50 µs) between reads, so the lateness is exact to about a
//! tenth of a millisecond. They do not spin: an earlier version spun (`yield_now` between
//! reads) on a runtime worker for the first 50 ms after the change, and that spinning thread,
//! `redis-server` and A (which calls from the bench's main thread) were three runnable threads
//! on the 2-core machine, so one of them sometimes waited out a scheduler time slice: the p99
//! (6.7 ms) was the scheduler's, not the notification's. The instances' tasks (connections,
//! the pub/sub subscriber) run on one core fewer than the machine has (at least one).
//!
//! ```sh
//! cargo bench --bench invalidation                  # 200 rounds with notifications, 20 without
//! cargo bench --bench invalidation -- --quick       # a smoke run: 20 and 2
//! cargo bench --bench invalidation -- --rounds 500 --rounds-off 30   # or ROUNDS=500
//! ```
//!
//! Percentiles are nearest rank, over the counted rounds of a configuration.

#[path = "shared/percentile.rs"]
mod percentile;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use percentile::percentile_ms;
use tokio::runtime::Handle;
use tokio::sync::Barrier;
use tokio::time::Instant;
use tower_stampede::store::Store;
use tower_stampede::{Cache, Error, Fetched, Loaded, Outcome};

/// Simulated app instances: A changes the key, the others poll it.
const INSTANCES: usize = 3;

/// Counted rounds per configuration with notifications, unless `--rounds` (`ROUNDS`) says.
const DEFAULT_ROUNDS: usize = 200;

/// Counted rounds per configuration without notifications (each costs about [`CAP`]).
const DEFAULT_ROUNDS_OFF: usize = 20;

/// The rounds of `--quick`: with notifications, and without.
const QUICK_ROUNDS: (usize, usize) = (20, 2);

/// `l1_ttl_cap` of the instances without notifications: how long they keep their copy.
const CAP: Duration = Duration::from_secs(1);

/// The TTL of the values loaded and set.
const TTL: Duration = Duration::from_secs(60);

/// How long a round may take to converge with notifications; without, the cap plus this.
const BOUND: Duration = Duration::from_secs(10);
const BOUND_PAST_CAP: Duration = Duration::from_secs(5);

/// How long the pollers sleep between reads (a thread's sleep, not the runtime's timer, whose
/// resolution is a millisecond).
const POLL: Duration = Duration::from_micros(50);

/// The lateness the notifications should keep the p99 under.
const TARGET_P99: Duration = Duration::from_millis(5);

/// How A corrects the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Invalidate,
    Set,
    Clear,
}

impl Change {
    fn name(self) -> &'static str {
        match self {
            Change::Invalidate => "invalidate",
            Change::Set => "set",
            Change::Clear => "clear",
        }
    }
}

/// A test "database": the version of the round's row, and how many times it was loaded.
#[derive(Default)]
struct Database {
    version: AtomicU32,
    loads: AtomicUsize,
}

/// The row at `version`, as the loader and `set` give it.
fn row(version: u32) -> Bytes {
    Bytes::from(format!("row at version {version}"))
}

/// Reads `key` on `cache`, loading it from `db` on a miss.
async fn read(cache: &Cache, db: &Arc<Database>, key: &str) -> Result<Fetched, Error> {
    let db = Arc::clone(db);
    cache
        .fetch(key, move || async move {
            db.loads.fetch_add(1, Ordering::SeqCst);
            let version = db.version.load(Ordering::SeqCst);
            Ok::<_, Infallible>(Loaded::value(row(version)))
        })
        .await
}

/// One configuration: its instances and what its counted rounds measured.
struct Bench {
    name: String,
    change: Change,
    notified: bool,
    instances: Vec<Cache>,
    /// How long a round may take to converge.
    bound: Duration,
    /// The counted rounds it is to run.
    planned: usize,
    rounds: usize,
    /// Backend loads after the change, over the counted rounds.
    loads: usize,
    /// Each counted round's lateness.
    lateness: Vec<Duration>,
}

impl Bench {
    fn new(change: Change, notified: bool, planned: usize, stores: &[Arc<dyn Store>]) -> Self {
        let (name, bound) = if notified {
            (format!("{}, notifications on", change.name()), BOUND)
        } else {
            let cap = CAP.as_secs();
            let name = format!("{}, notifications off (cap {cap} s)", change.name());
            (name, CAP + BOUND_PAST_CAP)
        };
        // A namespace of this run's own, so every key starts cold.
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let namespace = format!(
            "invalidation-{}-{}-{}-{}",
            std::process::id(),
            since_epoch.as_nanos(),
            change.name(),
            if notified { "on" } else { "off" },
        );
        let instances = stores
            .iter()
            .map(|store| {
                let builder = Cache::builder_shared(Arc::clone(store)).namespace(&namespace);
                if notified {
                    builder.build()
                } else {
                    builder.notifications(false).l1_ttl_cap(CAP).build()
                }
            })
            .collect();
        Bench {
            name,
            change,
            notified,
            instances,
            bound,
            planned,
            rounds: 0,
            loads: 0,
            lateness: Vec::new(),
        }
    }

    /// Whether the bench runs a counted round of this configuration at `step` of `steps`: its
    /// rounds spread evenly over the steps.
    fn runs_at(&self, step: usize, steps: usize) -> bool {
        step * self.planned / steps > (step - 1) * self.planned / steps
    }

    /// Runs round `round` and, unless it is the warm-up, counts it.
    async fn run(&mut self, round: usize, counted: bool) {
        let what = format!("{}, round {round}", self.name);
        let key = format!("row-{round}");
        let (late, loads) = correct(&self.instances, self.change, &key, self.bound, &what).await;
        if counted {
            self.rounds += 1;
            self.loads += loads;
            self.lateness.push(late);
        }
    }

    fn row(&self) -> String {
        format!(
            "{:<42}{:>8}{:>7}{:>10.1}{:>10.1}{:>10.1}",
            self.name,
            self.rounds,
            self.loads,
            percentile_ms(&self.lateness, 50),
            percentile_ms(&self.lateness, 99),
            percentile_ms(&self.lateness, 100),
        )
    }
}

/// Reads `key` on `cache`; panics unless it serves the row at `version`.
async fn read_row(
    cache: &Cache,
    db: &Arc<Database>,
    key: &str,
    version: u32,
    what: &str,
) -> Outcome {
    let fetched = read(cache, db, key)
        .await
        .unwrap_or_else(|e| panic!("{what}: a read failed: {e}"));
    assert_eq!(
        fetched.value(),
        Some(&row(version)),
        "{what}: a read did not serve the row at version {version}"
    );
    fetched.outcome()
}

/// Reads `key` on `cache` (the old row) until it is served from L1, within `bound`.
async fn hold_in_l1(cache: &Cache, db: &Arc<Database>, key: &str, bound: Duration, what: &str) {
    let deadline = Instant::now() + bound;
    loop {
        if read_row(cache, db, key, 1, what).await == Outcome::L1Hit {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the key never came to be held in L1 within {bound:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Reads `key` on `cache` until it serves the new row; returns when it first did. The first
/// read (before the change: the old row) is made before `ready` lets A change the key. Runs on
/// a blocking thread of its own, driving each read on `runtime` and sleeping [`POLL`] between
/// reads.
fn poll(
    runtime: &Handle,
    cache: &Cache,
    db: &Arc<Database>,
    key: &str,
    ready: &Barrier,
) -> Result<Instant, String> {
    let (old, new) = (row(1), row(2));
    let first = runtime.block_on(async {
        let first = read(cache, db, key).await;
        ready.wait().await;
        first
    });
    let first = first.map_err(|e| format!("a read before the change failed: {e}"))?;
    if first.value() != Some(&old) {
        return Err(format!(
            "a read before the change served {:?}",
            first.value()
        ));
    }
    loop {
        let fetched = runtime
            .block_on(read(cache, db, key))
            .map_err(|e| format!("a read after the change failed: {e}"))?;
        let served = Instant::now();
        match fetched.value() {
            Some(value) if *value == new => return Ok(served),
            Some(value) if *value == old => {}
            other => return Err(format!("a read served {other:?}")),
        }
        std::thread::sleep(POLL);
    }
}

/// One round on a fresh `key`: every instance holds version 1 in L1, the others poll it, the
/// database moves to version 2 and A (the first instance) changes the key. Returns
/// the lateness (from just before A's call until the last of the others served version 2)
/// and the backend loads after the change; panics unless every instance serves version 2
/// within `bound`.
async fn correct(
    instances: &[Cache],
    change: Change,
    key: &str,
    bound: Duration,
    what: &str,
) -> (Duration, usize) {
    let db = Arc::new(Database::default());
    db.version.store(1, Ordering::SeqCst);
    for cache in instances {
        hold_in_l1(cache, &db, key, bound, what).await;
    }
    let loads_before = db.loads.load(Ordering::SeqCst);

    let [a, others @ ..] = instances else {
        panic!("{what}: no instances");
    };
    let ready = Arc::new(Barrier::new(instances.len()));
    let pollers: Vec<_> = others
        .iter()
        .map(|cache| {
            let (cache, db, key) = (cache.clone(), Arc::clone(&db), key.to_owned());
            let (ready, runtime) = (Arc::clone(&ready), Handle::current());
            tokio::task::spawn_blocking(move || poll(&runtime, &cache, &db, &key, &ready))
        })
        .collect();
    ready.wait().await;

    // The database changes, then A tells the cache.
    db.version.store(2, Ordering::SeqCst);
    let start = Instant::now();
    let changed = match change {
        Change::Invalidate => a.invalidate(key).await,
        Change::Set => a.set(key, row(2), TTL).await,
        Change::Clear => a.clear().await,
    };
    changed.unwrap_or_else(|e| panic!("{what}: A's {} failed: {e}", change.name()));
    let deadline = start + bound;
    let mut last = start;
    for poller in pollers {
        let served = tokio::time::timeout_at(deadline, poller)
            .await
            .unwrap_or_else(|_| {
                panic!("{what}: an instance still served the old row after {bound:?}")
            })
            .unwrap_or_else(|e| panic!("{what}: a poller's task failed: {e}"))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        last = last.max(served);
    }
    // Every instance, A included, now serves the new row.
    for cache in instances {
        read_row(cache, &db, key, 2, what).await;
    }
    let loads = db.loads.load(Ordering::SeqCst) - loads_before;
    (last - start, loads)
}

/// The bench's settings, from the command line.
struct Options {
    /// Counted rounds per configuration with notifications.
    rounds: usize,
    /// Counted rounds per configuration without notifications.
    rounds_off: usize,
}

/// Reads `--rounds N` (else `ROUNDS`, else 200), `--rounds-off N` (else 20) and `--quick` (20
/// and 2, unless the others say otherwise), also as `--flag=N`. Other arguments (such as the
/// `--bench` that `cargo bench` passes) are ignored.
fn options() -> Result<Options, String> {
    let (mut rounds, mut rounds_off, mut quick) = (None, None, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        match flag.as_str() {
            "--quick" => quick = true,
            "--rounds" | "--rounds-off" => {
                let raw = inline
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{flag} needs a value"))?;
                let n = positive(&flag, &raw)?;
                if flag == "--rounds" {
                    rounds = Some(n);
                } else {
                    rounds_off = Some(n);
                }
            }
            _ => {}
        }
    }
    if rounds.is_none() {
        if let Ok(raw) = std::env::var("ROUNDS") {
            rounds = Some(positive("ROUNDS", &raw)?);
        }
    }
    let (default_rounds, default_rounds_off) = if quick {
        QUICK_ROUNDS
    } else {
        (DEFAULT_ROUNDS, DEFAULT_ROUNDS_OFF)
    };
    Ok(Options {
        rounds: rounds.unwrap_or(default_rounds),
        rounds_off: rounds_off.unwrap_or(default_rounds_off),
    })
}

fn positive(name: &str, raw: &str) -> Result<usize, String> {
    match raw.trim().parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{name} must be a whole number above 0, got {raw:?}"
        )),
    }
}

async fn run(server: &support::RedisServer, options: &Options) {
    let stores = server.stores(INSTANCES).await;
    let (on, off) = (options.rounds, options.rounds_off);
    let mut benches = [
        Bench::new(Change::Invalidate, true, on, &stores),
        Bench::new(Change::Set, true, on, &stores),
        Bench::new(Change::Clear, true, on, &stores),
        Bench::new(Change::Invalidate, false, off, &stores),
        Bench::new(Change::Set, false, off, &stores),
    ];

    let (cores, workers) = cores_and_workers();
    println!(
        "invalidation: {INSTANCES} instances each holding the round's key in L1, A invalidates, sets or clears it, \
         the others poll it; {on} rounds per configuration with notifications, {off} without \
         (l1_ttl_cap {} s), +1 warm-up each; redis-server on loopback, {cores} cores, {workers} runtime workers",
        CAP.as_secs(),
    );
    for bench in &mut benches {
        bench.run(0, false).await;
    }
    let steps = on.max(off);
    let configurations = benches.len();
    for step in 1..=steps {
        // Rotate which configuration goes first.
        for i in 0..configurations {
            let bench = &mut benches[(step + i) % configurations];
            if bench.runs_at(step, steps) {
                bench.run(step, true).await;
            }
        }
    }

    println!(
        "lateness = when the last other instance first served the new value - just before A's call"
    );
    println!(
        "{:<42}{:>8}{:>7}{:>10}{:>10}{:>10}",
        "configuration", "rounds", "loads", "p50 ms", "p99 ms", "max ms"
    );
    for bench in &benches {
        println!("{}", bench.row());
    }
    let p99s: Vec<_> = benches
        .iter()
        .filter(|b| b.notified)
        .map(|b| (b.change.name(), percentile_ms(&b.lateness, 99)))
        .collect();
    let under = p99s
        .iter()
        .all(|(_, p99)| *p99 < TARGET_P99.as_secs_f64() * 1000.0);
    let figures: Vec<_> = p99s
        .iter()
        .map(|(change, p99)| format!("{change} {p99:.1} ms"))
        .collect();
    println!(
        "\np99 under {} ms with notifications: {} ({})",
        TARGET_P99.as_millis(),
        if under { "yes" } else { "no" },
        figures.join(", "),
    );
}

/// The machine's cores, and the runtime's worker threads: one fewer (at least one), left to
/// `redis-server` and the main thread.
fn cores_and_workers() -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores, cores.saturating_sub(1).max(1))
}

fn main() {
    let options = options().unwrap_or_else(|message| panic!("bad arguments: {message}"));
    let server = support::RedisServer::start();
    // Dropped before the server, so the connections close before it goes away.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores_and_workers().1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(&server, &options));
}
