//! The soak: several engine instances (each a `Cache` over a `RedisStore` of its own) on one
//! real redis-server, under continuous load over hot and cold keys with short TTLs, stale
//! windows on some and tags on some, while a writer changes keys and tags and a fault injector
//! ([`faults`]) kills, pauses and flushes Redis and makes the origin fail or hang, all at
//! random times drawn from a seed. It checks, from the callers' side and the origin's counters
//! only, what the README promises (see [`checks`]), and fails with the seed and the time line
//! around each violation.
//!
//! Ignored, so the suite skips it; `./scripts/soak.sh` runs it (its flags are the `SOAK_*`
//! variables of [`Settings`]). See `benches/README.md`.
//!
//! | file | holds |
//! | --- | --- |
//! | `main.rs` | settings, instances, callers, the writer, the report |
//! | `origin.rs` | the origin: versions, stamped values, load counters, failing/hanging |
//! | `instances.rs` | the engine instances, each restartable |
//! | `faults.rs` | the fault injector and the time line |
//! | `checks.rs` | what each answer and the load counts are checked against |
#![cfg(feature = "redis")]

mod checks;
mod faults;
mod instances;
mod origin;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::RedisServer;
use tower_stampede::Loaded;

use checks::Checks;
use faults::Timeline;
use instances::Instances;
use origin::{key_name, stamp, Origin};

/// What a run is made of, from `SOAK_*` environment variables.
struct Settings {
    secs: u64,
    seed: u64,
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
            instances: var("SOAK_INSTANCES", 3),
            keys: var("SOAK_KEYS", 200),
            rate: var("SOAK_RATE", 200),
            writes: var("SOAK_WRITES", 5),
            fault_gap: var("SOAK_FAULT_GAP", 4.0),
            ttl: Duration::from_millis(var("SOAK_TTL_MS", 1000)),
            l1_ttl_cap: Duration::from_millis(var("SOAK_L1_CAP_MS", 2000)),
        }
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

/// Callers pick a hot key (the first tenth) four times in five.
fn pick_key(rng: &mut StdRng, keys: usize) -> usize {
    let hot = (keys / 10).max(1);
    if rng.random_bool(0.8) {
        rng.random_range(0..hot)
    } else {
        rng.random_range(0..keys)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: run it with ./scripts/soak.sh"]
async fn soak() {
    let settings = Settings::from_env();
    println!(
        "soak: seed {} for {} s, {} instances, {} keys, {} req/s each, {} changes/s, a fault every {} s",
        settings.seed,
        settings.secs,
        settings.instances,
        settings.keys,
        settings.rate,
        settings.writes,
        settings.fault_gap
    );
    let server = RedisServer::start();
    let instances = Arc::new(Instances::start(
        server.url(),
        settings.instances,
        settings.ttl,
        settings.l1_ttl_cap,
    ));
    let server = Arc::new(Mutex::new(server));
    let start = Instant::now();
    let until = start + Duration::from_secs(settings.secs);
    let origin = Arc::new(Origin::new(settings.keys, Duration::from_secs(2)));
    let timeline = Arc::new(Timeline::new(start));
    let checks = Arc::new(Checks::new(settings.l1_ttl_cap));
    let mut seeds = StdRng::seed_from_u64(settings.seed);

    let mut tasks = Vec::new();
    if settings.fault_gap > 0.0 {
        tasks.push(tokio::spawn(faults::inject(
            Arc::clone(&server),
            Arc::clone(&instances),
            Arc::clone(&origin),
            Arc::clone(&timeline),
            StdRng::seed_from_u64(seeds.random()),
            until,
            Duration::from_secs_f64(settings.fault_gap),
            // A fault's effects (broken connections, a breaker open for 1 s, locks of 1 s,
            // values of one TTL loaded alone) are over after this.
            Duration::from_secs(3) + settings.ttl * 2,
        )));
    }
    tasks.push(tokio::spawn(write(
        Arc::clone(&instances),
        Arc::clone(&origin),
        Arc::clone(&timeline),
        StdRng::seed_from_u64(seeds.random()),
        until,
        settings.writes,
        settings.ttl,
        settings.keys,
    )));
    const CALLERS: u64 = 4;
    let pause = Duration::from_secs_f64(CALLERS as f64 / settings.rate.max(1) as f64);
    for instance in 0..instances.len() {
        for _ in 0..CALLERS {
            tasks.push(tokio::spawn(call(
                Arc::clone(&instances),
                instance,
                Arc::clone(&origin),
                Arc::clone(&timeline),
                Arc::clone(&checks),
                StdRng::seed_from_u64(seeds.random()),
                until,
                pause,
                settings.keys,
            )));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }

    checks.check_loads(&origin, &timeline, settings.ttl);
    let report = checks.report(&timeline, &origin);
    println!("{report}");
    for instance in 0..instances.len() {
        println!(
            "instance {instance} (since its last start): {:?}",
            instances.get(instance).stats()
        );
    }
    assert!(
        checks.violations() == 0,
        "soak: {} violation(s) with SOAK_SEED={} (see above)",
        checks.violations(),
        settings.seed
    );
}

/// One caller of one instance: requests until `until`, each checked.
#[allow(clippy::too_many_arguments)]
async fn call(
    instances: Arc<Instances>,
    instance: usize,
    origin: Arc<Origin>,
    timeline: Arc<Timeline>,
    checks: Arc<Checks>,
    mut rng: StdRng,
    until: Instant,
    pause: Duration,
    keys: usize,
) {
    while Instant::now() < until {
        let key = pick_key(&mut rng, keys);
        let delay = Duration::from_millis(rng.random_range(1..20));
        let loader_origin = Arc::clone(&origin);
        let started = Instant::now();
        let answer = instances
            .get(instance)
            .fetch(key_name(key), move || async move {
                let bytes = loader_origin.load(key, delay).await?;
                let mut loaded = Loaded::value(bytes);
                if let Some(tag) = tag_of(key) {
                    loaded = loaded.tags([tag]);
                }
                if has_stale_window(key) {
                    loaded = loaded.stale_while_revalidate(Duration::from_secs(1));
                }
                Ok::<_, std::io::Error>(loaded)
            })
            .await;
        checks.answer(&origin, &timeline, instance, key, started, answer);
        tokio::time::sleep(pause).await;
    }
}

/// The writer: one change at a time (so that changes of a key are acknowledged in the order
/// the origin made them), from a random instance, until `until`.
#[allow(clippy::too_many_arguments)]
async fn write(
    instances: Arc<Instances>,
    origin: Arc<Origin>,
    timeline: Arc<Timeline>,
    mut rng: StdRng,
    until: Instant,
    writes: u64,
    ttl: Duration,
    keys: usize,
) {
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
        *timeline
            .counts
            .lock()
            .unwrap()
            .entry(if acked {
                "writes acked"
            } else {
                "writes failed"
            })
            .or_default() += 1;
    }
}
