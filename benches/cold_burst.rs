//! A cold start over real Redis, on real time: one process asks for 2,000 cold keys at once
//! (each its own flight, so its own lookup), over lookups answered 50 ms late (the store
//! wrapped in `support`'s `Observed`), with 150 ms locks. At most 256 lookups are out at a
//! time, so the burst's lookups take about eight rounds (400 ms); each leader's tag clock read
//! and fill go in a lane of their own, ahead of the lookups still waiting, so every key should
//! be filled while its lock holds. Then another process (a `RedisStore` with connections of
//! its own) reads every key: one it has to load again is a key whose lock ran out before its
//! fill (the fill was refused).
//!
//! Each round uses a namespace of its own, so every key is cold. Prints, per round: the keys
//! loaded, the keys the other process had to load again (must be 0), the store errors of
//! both processes, and how long the burst took; then the totals. Exits with status 1 if a key
//! was loaded twice (by either process).
//!
//! The rule itself (a leader's calls past its lookup do not wait behind the burst's lookups)
//! is tested on paused time over the embedded store
//! (`fleet::a_burst_of_cold_keys_fills_before_its_locks_run_out`); this is that test's former
//! Redis case, whose real-time 150 ms locks ran out on a busy 2-core machine (2 of 3 runs).
//!
//! ```sh
//! cargo bench --bench cold_burst                        # 5 rounds of 2,000 keys
//! cargo bench --bench cold_burst -- --rounds 20 --keys 10000 --lock-ms 150 --delay-ms 50
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::observed::Observed;
use tower_stampede::store::Store;
use tower_stampede::{Cache, Loaded};

/// The bench's settings, from the command line.
struct Options {
    /// Cold keys asked at once (`--keys`, default 2,000).
    keys: usize,
    /// How late the burst's lookups are answered (`--delay-ms`, default 50).
    delay: Duration,
    /// The locks' TTL (`--lock-ms`, default 150).
    lock_ttl: Duration,
    /// Bursts, each over a namespace of its own (`--rounds`, default 5).
    rounds: usize,
}

/// Reads `--keys N`, `--delay-ms MS`, `--lock-ms MS` and `--rounds N` (or `--flag=value`).
/// Other arguments (such as the `--bench` that `cargo bench` passes) are ignored.
fn options() -> Result<Options, String> {
    let mut options = Options {
        keys: 2_000,
        delay: Duration::from_millis(50),
        lock_ttl: Duration::from_millis(150),
        rounds: 5,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        if !["--keys", "--delay-ms", "--lock-ms", "--rounds"].contains(&flag.as_str()) {
            continue;
        }
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| format!("{flag} needs a value"))?;
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: not a number: {value:?}"))?;
        match flag.as_str() {
            "--keys" => options.keys = usize::try_from(number).map_err(|e| e.to_string())?,
            "--delay-ms" => options.delay = Duration::from_millis(number),
            "--lock-ms" => options.lock_ttl = Duration::from_millis(number),
            _ => options.rounds = usize::try_from(number).map_err(|e| e.to_string())?,
        }
    }
    if options.keys == 0 || options.rounds == 0 || options.lock_ttl.is_zero() {
        return Err("--keys, --rounds and --lock-ms must be positive".into());
    }
    Ok(options)
}

/// What one burst did.
#[derive(Default)]
struct Round {
    /// Loads by the bursting process.
    loaded: usize,
    /// Keys the other process had to load again.
    again: usize,
    /// Store errors of both processes.
    errors: u64,
    /// From the first call of the burst to the last answer.
    took: Duration,
}

/// A loader that counts its call on `loads` and answers `value` at once.
fn counted(
    loads: &Arc<AtomicUsize>,
    value: &'static str,
) -> impl FnOnce() -> std::future::Ready<Result<Loaded, std::io::Error>> + Send + 'static {
    let loads = Arc::clone(loads);
    move || {
        loads.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Loaded::value(Bytes::from_static(value.as_bytes()))))
    }
}

/// One burst of `options.keys` cold keys in `namespace`, from a process over `burst`, read
/// back by another over `other`.
async fn round(
    options: &Options,
    namespace: &str,
    burst: &Arc<dyn Store>,
    other: &Arc<dyn Store>,
) -> Round {
    let late = Observed::new(burst, options.delay);
    let cache = Cache::builder_shared(late)
        .namespace(namespace)
        .store_timeout(support::PATIENT)
        .lock_ttl(options.lock_ttl)
        .build();
    let loads = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..options.keys {
        let (cache, load) = (cache.clone(), counted(&loads, "v"));
        calls.spawn(async move { cache.fetch(format!("cold-{key}"), load).await });
    }
    while let Some(call) = calls.join_next().await {
        let fetched = call.expect("a burst call").expect("a value");
        assert_eq!(fetched.value().expect("a value"), "v");
    }
    let took = started.elapsed();
    let reader = Cache::builder_shared(Arc::clone(other))
        .namespace(namespace)
        .store_timeout(support::PATIENT)
        .build();
    let again = Arc::new(AtomicUsize::new(0));
    for key in 0..options.keys {
        reader
            .fetch(format!("cold-{key}"), counted(&again, "again"))
            .await
            .expect("a value");
    }
    Round {
        loaded: loads.load(Ordering::SeqCst),
        again: again.load(Ordering::SeqCst),
        errors: cache.stats().store_errors + reader.stats().store_errors,
        took,
    }
}

/// Runs the rounds and prints them; whether every key was loaded once.
async fn run(options: &Options, server: &support::RedisServer) -> bool {
    let mut stores = server.stores(2).await;
    let (burst, other) = (stores.remove(0), stores.remove(0));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "cold burst: {} cold keys at once in one process, lookups answered {} ms late, locks {} ms, store timeout {} ms, over a redis-server on loopback; {} rounds; {cores} cores",
        options.keys,
        options.delay.as_millis(),
        options.lock_ttl.as_millis(),
        support::PATIENT.as_millis(),
        options.rounds,
    );
    println!("round   keys loaded   loaded again elsewhere   store errors   burst ms");
    let mut total = Round::default();
    for n in 0..options.rounds {
        let done = round(options, &format!("burst-{n}"), &burst, &other).await;
        println!(
            "{:>5}   {:>11}   {:>22}   {:>12}   {:>8.0}",
            n + 1,
            done.loaded,
            done.again,
            done.errors,
            done.took.as_secs_f64() * 1000.0
        );
        total.loaded += done.loaded;
        total.again += done.again;
        total.errors += done.errors;
        total.took += done.took;
    }
    let keys = options.keys * options.rounds;
    let twice = total.loaded.saturating_sub(keys) + total.again;
    println!(
        "total: {} of {keys} keys loaded by the burst, {} loaded again elsewhere, {} store errors, a burst took {:.0} ms on average",
        total.loaded,
        total.again,
        total.errors,
        total.took.as_secs_f64() * 1000.0 / options.rounds as f64
    );
    if twice == 0 {
        println!("every key loaded once");
    } else {
        println!("FAILED: {twice} loads of keys already loaded (a lock ran out before its fill)");
    }
    twice == 0
}

fn main() {
    let options = options().unwrap_or_else(|message| panic!("bad arguments: {message}"));
    let server = support::RedisServer::start();
    // Two worker threads, as the suite's Redis tests run on.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let once = runtime.block_on(run(&options, &server));
    // The connections close before the server goes away; `exit` would skip both.
    drop(runtime);
    drop(server);
    if !once {
        std::process::exit(1);
    }
}
