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
//! bodies). When the origin loaded once, it also prints how late the followers were: the p99
//! of each follower's completion minus the end of the origin's load (every request but the
//! one that loaded is a follower). It then checks that both `tower-stampede` scenarios loaded
//! the origin exactly once and answered every request; if not, it prints a warning and exits
//! with code 1, so it can serve as a smoke test.
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
//! With `--svg PATH` it runs the four scenarios at each concurrency of the ladder 1, 10, 100,
//! 1000 and 10 000 (up to `--max N`) instead, prints that table, checks every `tower-stampede`
//! row the same way, and draws the backend loads (log scale) and the p99 latency against the
//! concurrency as an SVG chart at PATH (the README's `docs/stampede.svg`):
//!
//! ```sh
//! cargo run --release --example demo -- --svg docs/stampede.svg
//! ```
//!
//! Options: `--requests N` (default 1000), `--instances K` (default 4), `--delay-ms MS`
//! (the origin's delay, default 100), `--redis URL`, `--svg PATH`, `--max N` (default
//! 10000), `--help`. Exit codes: 0 success, 1 the check failed, Redis is unreachable or the
//! chart could not be written, 2 bad arguments.
//!
//! The scenarios and their measurement live in `stampede.rs`, shared with
//! `benches/stampede.rs`; the chart in `chart.rs`.

mod chart;
mod stampede;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use stampede::{Report, Scenario, Setup, Table, LATE_NOTE};
use tower_stampede::store::{MemoryStore, Store};

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
  --svg PATH       instead of one run of --requests, run every scenario at each concurrency
                   of 1, 10, 100, 1000 and 10000, print the table and chart it as SVG at PATH
  --max N          with --svg: the highest concurrency of that ladder (default 10000)
  --help           print this message";

/// The four scenarios, in the order of the tables.
const SCENARIOS: [Scenario; 4] = [
    Scenario::NoCache,
    Scenario::L1Only,
    Scenario::Guarded {
        notifications: true,
    },
    Scenario::Guarded {
        notifications: false,
    },
];

/// The demo's settings, from the command line.
#[derive(Debug)]
struct Args {
    requests: usize,
    instances: usize,
    delay: Duration,
    redis: Option<String>,
    svg: Option<PathBuf>,
    max: usize,
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
        svg: None,
        max: 10_000,
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
            "--requests" => {
                parsed.requests = stampede::positive("--requests", &value("--requests")?)?;
            }
            "--instances" => {
                parsed.instances = stampede::positive("--instances", &value("--instances")?)?;
            }
            "--delay-ms" => parsed.delay = stampede::millis("--delay-ms", &value("--delay-ms")?)?,
            "--redis" => {
                let url = value("--redis")?;
                if url.trim().is_empty() {
                    return Err("--redis expects a URL such as redis://127.0.0.1:6379/".into());
                }
                parsed.redis = Some(url);
            }
            "--svg" => {
                let path = value("--svg")?;
                if path.trim().is_empty() {
                    return Err("--svg expects a file path such as docs/stampede.svg".into());
                }
                parsed.svg = Some(PathBuf::from(path));
            }
            "--max" => parsed.max = stampede::positive("--max", &value("--max")?)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Command::Run(parsed))
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

/// Prints a warning for every report that fails its check; whether all passed.
fn checked<'a>(reports: impl IntoIterator<Item = &'a Report>) -> bool {
    let mut passed = true;
    for report in reports {
        if let Err(message) = report.check() {
            eprintln!("warning: {message}");
            passed = false;
        }
    }
    passed
}

/// One run of every scenario at `args.requests`, as the README's first command shows it.
async fn one_run(args: &Args, setup: &Setup, store_name: &str) -> bool {
    println!(
        "tower-stampede demo: {} concurrent requests for one cold key, {} app instances, origin {} ms, store: {}",
        args.requests,
        args.instances,
        args.delay.as_millis(),
        store_name,
    );
    println!("{}", Table::OneRun.header());
    let mut reports = Vec::with_capacity(SCENARIOS.len());
    for scenario in SCENARIOS {
        let report = stampede::run(scenario, setup, args.requests).await;
        println!("{}", report.row(Table::OneRun));
        reports.push(report);
    }
    println!("{LATE_NOTE}");

    let (notified, polling) = (&reports[2], &reports[3]);
    let plural = if notified.loads == 1 { "" } else { "s" };
    println!(
        "\ntower-stampede: {} backend load{plural} for {} requests (expected 1)",
        notified.loads, args.requests
    );
    println!(
        "followers done {} ms after the load (p99) when woken by the fill's notification, {} ms when polling only",
        stampede::ms(notified.lateness_p99()),
        stampede::ms(polling.lateness_p99()),
    );
    checked(&reports)
}

/// Every scenario at each concurrency of the ladder, then the chart at `svg`.
async fn ladder(args: &Args, setup: &Setup, store_name: &str, svg: &Path) -> bool {
    println!(
        "tower-stampede demo: concurrency 1 to {} for one cold key, {} app instances, origin {} ms, store: {}",
        stampede::steps(args.max).last().unwrap_or(&1),
        args.instances,
        args.delay.as_millis(),
        store_name,
    );
    let reports = stampede::ladder(setup, &SCENARIOS, args.max).await;
    let passed = checked(&reports);
    let caption = format!(
        "One cold key, {} app instances, {} ms load, store: {}",
        args.instances,
        args.delay.as_millis(),
        store_name
    );
    match chart::draw(svg, &caption, &SCENARIOS, &reports) {
        Ok(()) => {
            println!("\nwrote {}", svg.display());
            passed
        }
        Err(message) => {
            eprintln!(
                "error: cannot write the chart to {}: {message}",
                svg.display()
            );
            false
        }
    }
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
    // Every instance reaches the one store (or the one Redis connection) the demo opened.
    let setup = Setup {
        stores: vec![store; args.instances],
        load: args.delay,
    };
    let passed = match &args.svg {
        None => one_run(&args, &setup, &store_name).await,
        Some(svg) => ladder(&args, &setup, &store_name, svg).await,
    };
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
