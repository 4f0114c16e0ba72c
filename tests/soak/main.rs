//! The soak: several engine instances (each a `Cache` over a `RedisStore` of its own, on a
//! runtime of its own) on one real redis-server, a Redis Cluster with replicas or a primary
//! with replicas under Redis Sentinel, under continuous load over hot and cold keys with short
//! TTLs, stale windows on some and tags on some, while a writer changes keys and tags and a
//! fault injector ([`faults`]) kills, pauses, fails over and flushes Redis, kills instances
//! mid-load and makes the origin fail or hang, all at random times drawn from a seed; the
//! last part of a run is left without faults. It checks, from the callers' side, the origin's
//! counters and the resources held, what the README promises (see [`checks`], [`resources`],
//! [`recovery`]), and fails with the seed and the time line around each violation.
//!
//! Ignored, so the suite skips it; `./scripts/soak.sh` runs it (its flags are the `SOAK_*`
//! variables of [`Settings`]). See `docs/soak.md`.
//!
//! | file | holds |
//! | --- | --- |
//! | `main.rs` | settings, the run, the report |
//! | `workload.rs` | the callers (each answer checked) and the writer |
//! | `backend.rs` | the shared Redis (a server, a Cluster, Sentinel) and commands to its nodes |
//! | `origin.rs` | the origin: versions, stamped values, load counters, failing/hanging |
//! | `instances.rs` | the engine instances, each restartable and killable |
//! | `faults.rs` | the fault injector |
//! | `failover.rs` | the faults of a Sentinel topology: the primary killed, paused, switched over |
//! | `timeline.rs` | the time line: events, fault spans, counts |
//! | `checks.rs` | what each answer and the load counts are checked against |
//! | `kills.rs` | what an instance killed mid-load may cost the others |
//! | `resources.rs` | connections, tasks and memory, sampled, with their bounds |
//! | `recovery.rs` | health and loads once the faults are over |
#![cfg(feature = "redis")]

mod backend;
mod checks;
#[cfg(feature = "sentinel")]
mod failover;
mod faults;
mod instances;
mod kills;
mod origin;
mod recovery;
mod resources;
mod timeline;
mod workload;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use backend::{Backend, Topology};
use checks::{Bounds, Checks};
use instances::{Instances, LOAD_TIMEOUT};
use origin::Origin;
use support::path_proxies::PathProxies;
use timeline::Timeline;
use workload::{write, Workload, CALLERS, STALE_WINDOW};

/// `url` with its port replaced by that of `path`'s proxy to it.
async fn proxied(url: &str, path: &PathProxies) -> String {
    let (head, port) = url
        .trim_end_matches('/')
        .rsplit_once(':')
        .expect("a URL with a port");
    let proxy = path.proxy(port.parse().expect("a port")).await;
    format!("{head}:{proxy}/")
}

/// What a run is made of, from `SOAK_*` environment variables.
struct Settings {
    secs: u64,
    seed: u64,
    /// One server, a Redis Cluster with replicas, or Sentinel.
    topology: Topology,
    instances: usize,
    keys: usize,
    /// Requests per second, per instance.
    rate: u64,
    /// Changes (set, invalidate, tag invalidation) per second, across instances.
    writes: u64,
    /// Mean seconds between faults; 0 for none.
    fault_gap: f64,
    /// Whether each instance reaches every node (and sentinel) through fault proxies of its
    /// own, and the faults on the path are drawn too (`SOAK_PATH_FAULTS=1`).
    path_faults: bool,
    ttl: Duration,
    l1_ttl_cap: Duration,
}

impl Settings {
    fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        }
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Settings {
            secs: var("SOAK_SECS", 60),
            seed: var("SOAK_SEED", clock),
            topology: Topology::from_env(),
            instances: var("SOAK_INSTANCES", 3),
            keys: var("SOAK_KEYS", 200),
            rate: var("SOAK_RATE", 200),
            writes: var("SOAK_WRITES", 5),
            fault_gap: var("SOAK_FAULT_GAP", 4.0),
            path_faults: var("SOAK_PATH_FAULTS", 0) == 1,
            ttl: Duration::from_millis(var("SOAK_TTL_MS", 1000)),
            l1_ttl_cap: Duration::from_millis(var("SOAK_L1_CAP_MS", 2000)),
        }
    }

    /// The last part of a run, without faults: a fifth, at least 15 s (half of a short run).
    fn quiet(&self) -> Duration {
        let secs = Duration::from_secs(self.secs);
        (secs / 5).max(Duration::from_secs(15)).min(secs / 2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: run it with ./scripts/soak.sh"]
async fn soak() {
    let settings = Settings::from_env();
    println!(
        "soak: seed {} for {} s on {} ({}), {} instances, {} keys, {} req/s each, {} changes/s, a fault every {} s but in the last {} s",
        settings.seed,
        settings.secs,
        settings.topology.describe(),
        support::server_name(),
        settings.instances,
        settings.keys,
        settings.rate,
        settings.writes,
        settings.fault_gap,
        settings.quiet().as_secs()
    );
    let backend = Backend::start(settings.topology, settings.instances);
    let mut paths = Vec::new();
    let mut urls: Vec<Vec<String>> = (0..settings.instances).map(|i| backend.urls(i)).collect();
    if settings.path_faults {
        // The URLs an instance is given go to its proxies; the nodes a Cluster's slots or the
        // sentinels name are proxied as its store's resolver meets them.
        for (i, urls) in urls.iter_mut().enumerate() {
            let path = PathProxies::new(settings.seed ^ i as u64);
            if !matches!(settings.topology, Topology::Cluster) {
                for url in urls.iter_mut() {
                    *url = proxied(url, &path).await;
                }
            }
            paths.push(path);
        }
    }
    let instances = Arc::new(Instances::start(
        urls,
        paths.clone(),
        (settings.topology, backend.service()),
        settings.ttl,
        settings.l1_ttl_cap,
    ));
    let backend = Arc::new(Mutex::new(backend));
    // Each instance opens its store in the background (`RedisStore::open`) and, until the
    // store answers, loads alone, as the README says: the run starts once every instance is
    // healthy, so that this window is not taken for a double load (an instance restarted by a
    // fault opens it again, inside the fault's span).
    recovery::ready(&instances).await;
    let start = Instant::now();
    let until = start + Duration::from_secs(settings.secs);
    let settle = recovery::recovery(settings.ttl);
    let workload = Arc::new(Workload {
        instances: Arc::clone(&instances),
        origin: Arc::new(Origin::new(settings.keys, Duration::from_secs(2))),
        timeline: Arc::new(Timeline::new(start)),
        checks: Arc::new(Checks::new(Bounds {
            lost_notification: settings.l1_ttl_cap,
            failover: LOAD_TIMEOUT + settings.ttl + STALE_WINDOW,
        })),
        until,
        pause: Duration::from_secs_f64(CALLERS as f64 / settings.rate.max(1) as f64),
        keys: settings.keys,
        paths,
    });
    let mut seeds = StdRng::seed_from_u64(settings.seed);

    let faults = (settings.fault_gap > 0.0).then(|| {
        tokio::spawn(faults::inject(
            Arc::clone(&backend),
            Arc::clone(&workload),
            StdRng::seed_from_u64(seeds.random()),
            until - settings.quiet(),
            Duration::from_secs_f64(settings.fault_gap),
            settle,
        ))
    });
    let writer = tokio::spawn(write(
        Arc::clone(&workload),
        StdRng::seed_from_u64(seeds.random()),
        settings.writes,
        settings.ttl,
    ));
    let sampler = tokio::spawn(resources::sample(
        Arc::clone(&backend),
        Arc::clone(&workload),
    ));
    for instance in 0..instances.len() {
        workload.spawn_callers(instance, &mut seeds);
    }

    let last_fault = match faults {
        Some(faults) => faults.await.unwrap(),
        None => None,
    };
    let recovered = last_fault.unwrap_or(start) + settle;
    recovery::check_health(&workload, recovered).await;
    writer.await.unwrap();
    sampler.await.unwrap();
    for instance in 0..instances.len() {
        for caller in instances.take_callers(instance) {
            caller.await.unwrap();
        }
    }
    let (nodes, sentinels) = {
        let backend = backend.lock().unwrap();
        (backend.connected_nodes(), backend.sentinel_ports())
    };
    resources::check_idle(&workload, nodes, &sentinels).await;

    let checks = &workload.checks;
    checks.check_loads(
        &workload.origin,
        &workload.timeline,
        settings.ttl,
        Some(recovered),
    );
    println!(
        "recovered {:.3}s after the start, the last fault ended at {:.3}s",
        workload.timeline.since_start(recovered),
        last_fault.map_or(0.0, |at| workload.timeline.since_start(at))
    );
    println!(
        "time line (the writer's changes left out):\n{}",
        workload.timeline.log()
    );
    let report = checks.report(&workload.timeline, &workload.origin);
    println!("{report}");
    for instance in 0..instances.len() {
        println!(
            "instance {instance} (since its last start): {:?}",
            instances.get(instance).stats()
        );
    }
    assert!(
        checks.violations() == 0,
        "soak: {} violation(s) with SOAK_SEED={}{} on {} (see above)",
        checks.violations(),
        settings.seed,
        settings.topology.env(),
        support::server_name()
    );
}
