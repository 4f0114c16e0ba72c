//! The soak: several engine instances (each a `Cache` over a `RedisStore` of its own, on a
//! runtime of its own) on one real redis-server or a Redis Cluster with replicas, under
//! continuous load over hot and cold keys with short TTLs, stale windows on some and tags on
//! some, while a writer changes keys and tags and a fault injector ([`faults`]) kills, pauses
//! and flushes Redis, kills instances mid-load and makes the origin fail or hang, all at
//! random times drawn from a seed; the last part of a run is left without faults. It checks,
//! from the callers' side, the origin's counters and the resources held, what the README
//! promises (see [`checks`], [`resources`], [`recovery`]), and fails with the seed and the
//! time line around each violation.
//!
//! Ignored, so the suite skips it; `./scripts/soak.sh` runs it (its flags are the `SOAK_*`
//! variables of [`Settings`]). See `docs/soak.md`.
//!
//! | file | holds |
//! | --- | --- |
//! | `main.rs` | settings, the workload: callers and the writer, the report |
//! | `backend.rs` | the shared Redis (a server or a Cluster) and commands to its nodes |
//! | `origin.rs` | the origin: versions, stamped values, load counters, failing/hanging |
//! | `instances.rs` | the engine instances, each restartable and killable |
//! | `faults.rs` | the fault injector |
//! | `timeline.rs` | the time line: events, fault spans, counts |
//! | `checks.rs` | what each answer and the load counts are checked against |
//! | `kills.rs` | what an instance killed mid-load may cost the others |
//! | `resources.rs` | connections, tasks and memory, sampled, with their bounds |
//! | `recovery.rs` | health and loads once the faults are over |
#![cfg(feature = "redis")]

mod backend;
mod checks;
mod faults;
mod instances;
mod kills;
mod origin;
mod recovery;
mod resources;
mod timeline;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tower_stampede::Loaded;

use backend::Backend;
use checks::{Bounds, Checks};
use instances::{Instances, LOAD_TIMEOUT};
use origin::{key_name, stamp, Origin};
use timeline::Timeline;

/// What a run is made of, from `SOAK_*` environment variables.
struct Settings {
    secs: u64,
    seed: u64,
    /// A Redis Cluster with replicas instead of one server.
    cluster: bool,
    instances: usize,
    keys: usize,
    /// Requests per second, per instance.
    rate: u64,
    /// Changes (set, invalidate, tag invalidation) per second, across instances.
    writes: u64,
    /// Mean seconds between faults; 0 for none.
    fault_gap: f64,
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
            cluster: var("SOAK_CLUSTER", 0) == 1,
            instances: var("SOAK_INSTANCES", 3),
            keys: var("SOAK_KEYS", 200),
            rate: var("SOAK_RATE", 200),
            writes: var("SOAK_WRITES", 5),
            fault_gap: var("SOAK_FAULT_GAP", 4.0),
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

/// Every key with a tag is a multiple of 4; its tag is one of 8.
fn tag_of(key: usize) -> Option<String> {
    key.is_multiple_of(4).then(|| format!("t{}", (key / 4) % 8))
}

/// Every third key has a stale-while-revalidate window as long as its TTL.
fn has_stale_window(key: usize) -> bool {
    key.is_multiple_of(3)
}

/// The stale-while-revalidate window of the keys that have one.
const STALE_WINDOW: Duration = Duration::from_secs(1);

/// Callers pick a hot key (the first tenth) four times in five.
fn pick_key(rng: &mut StdRng, keys: usize) -> usize {
    let hot = (keys / 10).max(1);
    if rng.random_bool(0.8) {
        rng.random_range(0..hot)
    } else {
        rng.random_range(0..keys)
    }
}

/// Callers per instance.
const CALLERS: u64 = 4;

/// What the callers, the writer, the faults and the checks share.
pub struct Workload {
    instances: Arc<Instances>,
    origin: Arc<Origin>,
    timeline: Arc<Timeline>,
    checks: Arc<Checks>,
    /// When the callers and the writer stop.
    until: Instant,
    /// A caller's pause between two calls.
    pause: Duration,
    keys: usize,
}

impl Workload {
    /// Starts the callers of `instance` on its runtime.
    pub fn spawn_callers(self: &Arc<Self>, instance: usize, seeds: &mut StdRng) {
        let handle = self.instances.handle(instance);
        let callers = (0..CALLERS)
            .map(|_| {
                let rng = StdRng::seed_from_u64(seeds.random());
                handle.spawn(call(Arc::clone(self), instance, rng))
            })
            .collect();
        self.instances.add_callers(instance, callers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: run it with ./scripts/soak.sh"]
async fn soak() {
    let settings = Settings::from_env();
    println!(
        "soak: seed {} for {} s on {}, {} instances, {} keys, {} req/s each, {} changes/s, a fault every {} s but in the last {} s",
        settings.seed,
        settings.secs,
        if settings.cluster { "a Redis Cluster (3 masters, a replica each)" } else { "one redis-server" },
        settings.instances,
        settings.keys,
        settings.rate,
        settings.writes,
        settings.fault_gap,
        settings.quiet().as_secs()
    );
    let backend = Backend::start(settings.cluster, settings.instances);
    let instances = Arc::new(Instances::start(
        (0..settings.instances).map(|i| backend.urls(i)).collect(),
        settings.cluster,
        settings.ttl,
        settings.l1_ttl_cap,
    ));
    let backend = Arc::new(Mutex::new(backend));
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
    let nodes = backend.lock().unwrap().live_ports().len();
    resources::check_idle(&workload, nodes).await;

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
        "soak: {} violation(s) with SOAK_SEED={}{} (see above)",
        checks.violations(),
        settings.seed,
        if settings.cluster {
            " SOAK_CLUSTER=1"
        } else {
            ""
        }
    );
}

/// One caller of one instance: requests until the workload's end, each checked.
async fn call(workload: Arc<Workload>, instance: usize, mut rng: StdRng) {
    let Workload {
        instances,
        origin,
        timeline,
        checks,
        ..
    } = &*workload;
    while Instant::now() < workload.until {
        let key = pick_key(&mut rng, workload.keys);
        let delay = Duration::from_millis(rng.random_range(1..20));
        let loader_origin = Arc::clone(origin);
        let started = Instant::now();
        let answer = instances
            .get(instance)
            .fetch(key_name(key), move || async move {
                let bytes = loader_origin.load(key, delay, instance).await?;
                let mut loaded = Loaded::value(bytes);
                if let Some(tag) = tag_of(key) {
                    loaded = loaded.tags([tag]);
                }
                if has_stale_window(key) {
                    loaded = loaded.stale_while_revalidate(STALE_WINDOW);
                }
                Ok::<_, std::io::Error>(loaded)
            })
            .await;
        checks.answer(origin, timeline, instance, key, started, answer);
        tokio::time::sleep(workload.pause).await;
    }
}

/// The writer: one change at a time (so that changes of a key are acknowledged in the order
/// the origin made them), from a random instance, until the workload's end.
async fn write(workload: Arc<Workload>, mut rng: StdRng, writes: u64, ttl: Duration) {
    let Workload {
        instances,
        origin,
        timeline,
        until,
        keys,
        ..
    } = &*workload;
    let (until, keys) = (*until, *keys);
    if writes == 0 {
        return;
    }
    let pause = Duration::from_secs_f64(1.0 / writes as f64);
    while Instant::now() + pause < until {
        tokio::time::sleep(pause.mul_f64(rng.random_range(0.5..1.5))).await;
        let instance = rng.random_range(0..instances.len());
        let cache = instances.get(instance);
        let key = pick_key(&mut rng, keys);
        let (what, changed, result) = match rng.random_range(0..3) {
            // `set` writes an untagged value, which a tag's invalidation cannot reach: a
            // tagged key is changed by `invalidate` alone.
            0 if tag_of(key).is_none() => {
                let version = origin.bump(key);
                let result = cache.set(key_name(key), stamp(key, version), ttl).await;
                ("set", vec![(key, version)], result)
            }
            0 | 1 => {
                let version = origin.bump(key);
                let result = cache.invalidate(key_name(key)).await;
                ("invalidate", vec![(key, version)], result)
            }
            _ => {
                let tag = tag_of(key).unwrap_or_else(|| "t0".to_owned());
                let changed: Vec<(usize, u64)> = (0..keys)
                    .filter(|k| tag_of(*k).as_deref() == Some(tag.as_str()))
                    .map(|k| (k, origin.bump(k)))
                    .collect();
                let result = cache.invalidate_tag(&tag).await;
                ("invalidate_tag", changed, result)
            }
        };
        let acked = result.is_ok();
        if acked {
            for (key, version) in &changed {
                origin.ack(*key, *version);
            }
        }
        timeline.event(format!(
            "instance {instance} {what} {} -> {}",
            changed.first().map_or(String::new(), |(k, v)| format!(
                "{} v{v} (+{} keys)",
                key_name(*k),
                changed.len() - 1
            )),
            if acked {
                "ok".to_owned()
            } else {
                format!("{:?}", result.err().map(|e| e.kind()))
            }
        ));
        timeline.count(if acked {
            "writes acked"
        } else {
            "writes failed"
        });
    }
}
