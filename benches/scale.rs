//! Cost as the fleet grows: P processes (real OS processes, each a small instance of the
//! engine with default settings over its own `RedisStore`) share one `redis-server`, or with
//! `--cluster` a Redis Cluster of three masters (`--classic`: the stores publish with classic
//! pub/sub, `sharded_notifications(false)`); each stampedes K cold keys with C concurrent
//! callers per key, released together. Per cell:
//!
//! - origin loads across every process (must be K);
//! - Redis commands per stampede, from `INFO commandstats` before and after (calls made from
//!   scripts included; summed over a cluster's masters), per process and key, and the
//!   breakdown by command;
//! - pub/sub: publishes per fill, and messages delivered per fill (each publish times its
//!   channel's subscribers, see `shared/deployment.rs`); on a cluster, the pub/sub messages
//!   sent over the cluster bus per fill;
//! - the callers' latency past the origin's own time (p50/p99), against an all-hit burst of
//!   the same width made right after (the same calls, answered from L1);
//! - `MEMORY USAGE` of each of a value's Redis keys (value, lock slot with its fresh marker,
//!   waiters' slot), and the engine's L1 bytes per entry;
//! - store errors the processes counted (timeouts included), and the loads of the all-hit
//!   burst (must be 0).
//!
//! `SCALE_LOG=1` prints the workers' warnings on stderr (why a cell loaded a key twice).
//!
//! ```sh
//! ./scripts/scale.sh                     # the grid in invocations of under ten minutes
//! ./scripts/scale.sh cluster             # on a Redis Cluster, sharded then classic pub/sub
//! cargo bench --bench scale -- --p 1,4 --k 1,100 --c 10 --origin-ms 100 --value 100
//! ```
//!
//! The same binary is the worker (`--worker`): the coordinator starts it P times per cell.
//! Latency figures come from a machine whose cores the processes (and other work) share;
//! the counts are what the bench is for.

#[path = "shared/deployment.rs"]
mod deployment;
#[path = "shared/percentile.rs"]
mod percentile;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use deployment::Deployment;
use percentile::percentile_ms;
use tower_stampede::store::RedisStore;
use tower_stampede::Cache;

/// How many latency quantiles a worker reports (its samples, evenly spaced by rank).
const QUANTILES: usize = 1000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--worker") {
        worker(&args[at + 1..]);
        return;
    }
    let grid = Grid::from_args(&args);
    let redis = Deployment::from_args(&args);
    println!(
        "scale on {}: origin {} ms, value {} B, store timeout (ms) {}, commit {}, {} cores",
        redis.describe(),
        grid.origin_ms,
        grid.value,
        grid.store_timeout_ms.as_deref().unwrap_or("default"),
        std::env::var("SCALE_COMMIT").unwrap_or_else(|_| "(set SCALE_COMMIT)".into()),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    // A cluster adds the messages its bus carried.
    let (bus, bus_rule) = if redis.is_cluster() {
        (" bus messages per fill |", " --- |")
    } else {
        ("", "")
    };
    println!("| P | K | C | origin loads | commands | per process and key | publishes per fill | delivered per fill |{bus} added p50 / p99 ms | all-hit p50 / p99 ms | store errors | all-hit loads |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |{bus_rule} --- | --- | --- | --- |");
    let mut breakdowns = Vec::new();
    let mut memory = None;
    for &p in &grid.p {
        for &k in &grid.k {
            for &c in &grid.c {
                let cell = run_cell(&redis, &grid, p, k, c);
                println!("{}", cell.row);
                breakdowns.push((p, k, c, cell.breakdown));
                memory = memory.or(Some(cell.memory));
            }
        }
    }
    println!();
    for (p, k, c, breakdown) in breakdowns {
        println!("P={p} K={k} C={c}: {breakdown}");
    }
    if let Some(memory) = memory {
        println!("{memory}");
    }
}

/// The cells to run and the origin.
struct Grid {
    p: Vec<usize>,
    k: Vec<usize>,
    c: Vec<usize>,
    origin_ms: u64,
    value: usize,
    /// The processes' `store_timeout`, if not the default.
    store_timeout_ms: Option<String>,
}

impl Grid {
    fn from_args(args: &[String]) -> Self {
        let value_of = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .and_then(|at| args.get(at + 1))
        };
        let list = |name: &str, default: &[usize]| {
            value_of(name).map_or_else(
                || default.to_vec(),
                |v| v.split(',').map(|n| n.parse().expect("a number")).collect(),
            )
        };
        Grid {
            p: list("--p", &[1, 4, 16, 32]),
            k: list("--k", &[1, 100, 10_000]),
            c: list("--c", &[10]),
            origin_ms: value_of("--origin-ms").map_or(100, |v| v.parse().expect("ms")),
            value: value_of("--value").map_or(100, |v| v.parse().expect("bytes")),
            store_timeout_ms: value_of("--store-timeout-ms").cloned(),
        }
    }
}

/// What one cell printed.
struct Cell {
    row: String,
    breakdown: String,
    memory: String,
}

/// One worker process and its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(address: &str, namespace: &str, grid: &Grid, k: usize, c: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .args(["--worker", address, namespace])
            .args([k, c].map(|n| n.to_string()))
            .args([grid.origin_ms.to_string(), grid.value.to_string()])
            .args(grid.store_timeout_ms.as_deref())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Worker {
            child,
            stdin,
            stdout,
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("a worker's line");
        assert!(!line.is_empty(), "a worker ended early");
        line.trim_end().to_owned()
    }

    fn tell(&mut self, word: &str) {
        writeln!(self.stdin, "{word}").expect("tell a worker");
    }
}

/// A worker's report of one burst: loads, store errors, its latency quantiles (ms), L1 bytes.
struct Report {
    loads: u64,
    errors: u64,
    l1_bytes: u64,
    quantiles: Vec<f64>,
}

impl Report {
    fn parse(line: &str) -> Self {
        let mut words = line.split(' ');
        let mut next = || words.next().expect("a field");
        let (loads, errors, l1_bytes) = (next().parse(), next().parse(), next().parse());
        let quantiles = next()
            .split(',')
            .filter(|q| !q.is_empty())
            .map(|q| q.parse().expect("ms"))
            .collect();
        Report {
            loads: loads.expect("loads"),
            errors: errors.expect("errors"),
            l1_bytes: l1_bytes.expect("bytes"),
            quantiles,
        }
    }
}

/// p50 and p99 of the pooled quantiles of every worker (each worker made as many calls).
fn pooled(reports: &[Report], less_ms: f64) -> (f64, f64) {
    let samples: Vec<Duration> = reports
        .iter()
        .flat_map(|r| r.quantiles.iter())
        .map(|ms| Duration::from_secs_f64((ms - less_ms).max(0.0) / 1000.0))
        .collect();
    (percentile_ms(&samples, 50), percentile_ms(&samples, 99))
}

fn run_cell(redis: &Deployment, grid: &Grid, p: usize, k: usize, c: usize) -> Cell {
    let namespace = format!("scale-p{p}-k{k}-c{c}");
    let address = redis.address();
    let mut workers: Vec<Worker> = (0..p)
        .map(|_| Worker::start(&address, &namespace, grid, k, c))
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(), "ready");
    }
    let before = redis.counts();
    let stampede = burst(&mut workers);
    let after = redis.counts();
    let hits = burst(&mut workers);
    let cost = redis.cost(&namespace, &before, &after);
    let memory = memory_of(redis, &namespace);
    for mut worker in workers {
        worker.tell("quit");
        let _ = worker.child.wait();
    }
    let commands: u64 = cost.calls.values().sum();
    let loads: u64 = stampede.iter().map(|r| r.loads).sum();
    let hit_loads: u64 = hits.iter().map(|r| r.loads).sum();
    let errors: u64 = stampede.iter().chain(&hits).map(|r| r.errors).sum();
    let (added50, added99) = pooled(&stampede, grid.origin_ms as f64);
    let (hit50, hit99) = pooled(&hits, 0.0);
    // Each worker's L1 also holds its warm-up entry.
    let l1 = hits.iter().map(|r| r.l1_bytes).max().unwrap_or(0) / (k as u64 + 1);
    let fills = loads.max(1) as f64;
    let bus = cost
        .bus
        .map_or(String::new(), |bus| format!(" {:.2} |", bus as f64 / fills));
    let row = format!(
        "| {p} | {k} | {c} | {loads} | {commands} | {:.2} | {:.2} | {:.2} |{bus} {added50:.1} / {added99:.1} | {hit50:.3} / {hit99:.3} | {errors} | {hit_loads} |",
        commands as f64 / (p * k) as f64,
        cost.publishes as f64 / fills,
        cost.delivered as f64 / fills,
    );
    let breakdown = cost.breakdown();
    Cell {
        row,
        breakdown,
        memory: format!("{memory}; L1 {l1} B per entry"),
    }
}

/// One burst in every worker, released together: their reports.
fn burst(workers: &mut [Worker]) -> Vec<Report> {
    for worker in workers.iter_mut() {
        worker.tell("go");
    }
    workers
        .iter_mut()
        .map(|w| Report::parse(&w.line()))
        .collect()
}

/// A current-thread runtime: a worker's, as an instance with a core of its own would run.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `MEMORY USAGE` of each Redis key of the cell's first key, and the value's own bytes.
fn memory_of(redis: &Deployment, namespace: &str) -> String {
    let runtime = current_thread();
    let key = runtime.block_on(async {
        let store = Deployment::connect(&redis.address()).await;
        Cache::builder(store)
            .namespace(namespace)
            .build()
            .store_key("key-0")
    });
    // The key's names share a hash tag: one node holds them all.
    let mut node = redis.connection_for(&RedisStore::value_name(&key));
    let mut parts = Vec::new();
    for (what, name) in [
        ("value", RedisStore::value_name(&key)),
        ("lock slot (fresh marker)", RedisStore::lock_name(&key)),
        ("waiters' slot", RedisStore::waiters_name(&key)),
    ] {
        let usage: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&name)
            .query(&mut node)
            .expect("MEMORY USAGE");
        parts.push(match usage {
            Some(bytes) => format!("{what} {bytes} B"),
            None => format!("{what} absent"),
        });
    }
    let stored: u64 = redis::cmd("STRLEN")
        .arg(RedisStore::value_name(&key))
        .query(&mut node)
        .expect("STRLEN");
    format!(
        "MEMORY USAGE of one entry: {} (the value's string: {stored} B)",
        parts.join(", ")
    )
}

/// A worker: `ADDRESS NAMESPACE K C ORIGIN_MS VALUE_BYTES [STORE_TIMEOUT_MS]` (the address
/// from [`Deployment::address`]). Prints `ready` once subscribed, then for each `go` on stdin
/// one burst of K×C calls and its report line; ends on `quit`.
fn worker(args: &[String]) {
    let Some([address, namespace, k, c, origin_ms, value]) = args.first_chunk() else {
        panic!("worker: ADDRESS NAMESPACE K C ORIGIN_MS VALUE_BYTES [STORE_TIMEOUT_MS]");
    };
    let store_timeout = args.get(6);
    let (k, c): (usize, usize) = (k.parse().expect("K"), c.parse().expect("C"));
    let origin = Duration::from_millis(origin_ms.parse().expect("ms"));
    let value = Bytes::from(vec![b'x'; value.parse().expect("bytes")]);
    if std::env::var_os("SCALE_LOG").is_some() {
        // The engine's warnings (a store call that failed, a lock lost) say why a cell loaded
        // more than once per key.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .init();
    }
    let runtime = current_thread();
    let cache = runtime.block_on(async {
        let store = Deployment::connect(address).await;
        let mut builder = Cache::builder(store).namespace(namespace);
        if let Some(ms) = store_timeout {
            builder = builder.store_timeout(Duration::from_millis(ms.parse().expect("ms")));
        }
        let cache = builder.build();
        // Subscribes to the namespace's channel (and loads the scripts) before the count.
        let warm = format!("warm-up-{}", std::process::id());
        let value = value.clone();
        cache
            .get_or_load(warm, move || async move { Ok::<_, std::io::Error>(value) })
            .await
            .expect("the warm-up");
        cache
    });
    let loads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    println!("ready");
    let mut lines = std::io::stdin().lock().lines();
    let mut errors_before = cache.stats().store_errors;
    while let Some(Ok(line)) = lines.next() {
        if line != "go" {
            return;
        }
        let loads_before = loads.load(std::sync::atomic::Ordering::SeqCst);
        let latencies = runtime.block_on(async {
            let mut calls = tokio::task::JoinSet::new();
            for key in 0..k {
                for _ in 0..c {
                    let (cache, loads, value) = (cache.clone(), Arc::clone(&loads), value.clone());
                    calls.spawn(async move {
                        let started = Instant::now();
                        let loader = move || async move {
                            loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            tokio::time::sleep(origin).await;
                            Ok::<_, std::io::Error>(value)
                        };
                        let got = cache.get_or_load(format!("key-{key}"), loader).await;
                        got.expect("an answer");
                        started.elapsed()
                    });
                }
            }
            let mut latencies = Vec::with_capacity(k * c);
            while let Some(latency) = calls.join_next().await {
                latencies.push(latency.expect("a call"));
            }
            latencies
        });
        let stats = cache.stats();
        let loaded = loads.load(std::sync::atomic::Ordering::SeqCst) - loads_before;
        println!(
            "{loaded} {} {} {}",
            stats.store_errors - errors_before,
            stats.l1_bytes,
            quantiles(latencies)
        );
        errors_before = stats.store_errors;
    }
}

/// At most [`QUANTILES`] of `samples`, evenly spaced by rank, in ms, comma-separated.
fn quantiles(mut samples: Vec<Duration>) -> String {
    samples.sort_unstable();
    let n = samples.len();
    let step = n.div_ceil(QUANTILES).max(1);
    samples
        .iter()
        .step_by(step)
        .map(|d| format!("{:.3}", d.as_secs_f64() * 1000.0))
        .collect::<Vec<_>>()
        .join(",")
}
