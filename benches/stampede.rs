//! Backend loads and request latency against concurrency, in a stampede on one cold key: 1,
//! 10, 100, 1000 and 10 000 concurrent requests, spread round-robin over 4 app instances, in
//! front of an origin whose load takes 100 ms, in three scenarios:
//!
//! - `no cache`: every request loads;
//! - `L1 only (moka, per instance)`: a `moka::future::Cache` per instance, whose `get_with`
//!   coalesces the instance's misses: one load per instance;
//! - `tower-stampede`: a [`Cache`](tower_stampede::Cache) per instance over the shared store:
//!   one load in all, the followers woken by the fill's notification.
//!
//! Each row gives the origin's loads, the requests' latency percentiles (nearest rank), the
//! errors and, where the origin loaded once, the followers' p99 lateness: a follower's
//! completion minus the end of the load. The bench panics unless `tower-stampede` made
//! exactly one load, and answered every request, at every concurrency.
//!
//! The shared store is a `redis-server` the bench starts on a free loopback port, each
//! instance over its own [`RedisStore`] (its own connections and pub/sub subscriber, shared
//! by all of that instance's requests); or, with `--store memory`, one in-process
//! `MemoryStore`. Every run of a scenario uses a fresh namespace, so the key is always cold.
//! The scenarios and their measurement are the demo's (`examples/demo/stampede.rs`), which
//! also charts them (`--svg`).
//!
//! ```sh
//! cargo bench --bench stampede
//! cargo bench --bench stampede -- --max 1000 --load-ms 50
//! cargo bench --bench stampede -- --store memory
//! ```

#[path = "../examples/demo/stampede.rs"]
#[expect(
    dead_code,
    reason = "the bench prints the ladder's table, not the demo's one-run table"
)]
mod stampede;

use std::sync::Arc;
use std::time::Duration;

use stampede::{Scenario, Setup};
use tower_stampede::store::{MemoryStore, Store};

/// Simulated app instances.
const INSTANCES: usize = 4;

/// The three scenarios, in the order of the table.
const SCENARIOS: [Scenario; 3] = [
    Scenario::NoCache,
    Scenario::L1Only,
    Scenario::Guarded {
        notifications: true,
    },
];

/// The bench's settings, from the command line.
struct Options {
    /// How long the origin takes to load (`--load-ms`, default 100).
    load: Duration,
    /// The highest concurrency (`--max`, default 10 000).
    max: usize,
    /// Whether the store is Redis (`--store redis`, the default) or memory.
    redis: bool,
}

/// Reads `--load-ms MS`, `--max N` and `--store redis|memory` (or `--flag=value`). Other
/// arguments (such as the `--bench` that `cargo bench` passes) are ignored.
fn options() -> Result<Options, String> {
    let mut options = Options {
        load: Duration::from_millis(100),
        max: 10_000,
        redis: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        if !["--load-ms", "--max", "--store"].contains(&flag.as_str()) {
            continue;
        }
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--load-ms" => options.load = stampede::millis(&flag, &value)?,
            "--max" => options.max = stampede::positive(&flag, &value)?,
            _ => match value.as_str() {
                "redis" => options.redis = true,
                "memory" => options.redis = false,
                other => return Err(format!("--store is redis or memory, got {other:?}")),
            },
        }
    }
    Ok(options)
}

async fn run(options: &Options, server: Option<&support::RedisServer>) {
    let (stores, store_name): (Vec<Arc<dyn Store>>, _) = match server {
        Some(server) => (
            server.stores(INSTANCES).await,
            "redis-server on loopback, a RedisStore per instance",
        ),
        None => (
            vec![Arc::new(MemoryStore::new()) as Arc<dyn Store>; INSTANCES],
            "one MemoryStore",
        ),
    };
    let setup = Setup {
        stores,
        load: options.load,
    };
    let steps = stampede::steps(options.max);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "stampede: concurrency {steps:?} for one cold key over {INSTANCES} instances, load {} ms, store: {store_name}, {cores} cores",
        options.load.as_millis(),
    );
    let reports = stampede::ladder(&setup, &SCENARIOS, options.max).await;

    let failures: Vec<String> = reports.iter().filter_map(|r| r.check().err()).collect();
    assert!(
        failures.is_empty(),
        "tower-stampede must make exactly 1 backend load and answer every request at every concurrency:\n{}",
        failures.join("\n")
    );
    println!(
        "\ntower-stampede: exactly 1 backend load at every concurrency, every request answered"
    );
}

fn main() {
    let options = options().unwrap_or_else(|message| panic!("bad arguments: {message}"));
    let server = options.redis.then(support::RedisServer::start);
    // Dropped before the server, so the connections close before it goes away.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(&options, server.as_ref()));
}
