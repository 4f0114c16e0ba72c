//! The workload: the callers of each instance, each answer checked, and the writer that
//! changes keys and tags; what they, the faults and the checks share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tower_stampede::Loaded;

use crate::checks::Checks;
use crate::instances::Instances;
use crate::origin::{key_name, stamp, Origin};
use crate::timeline::Timeline;

/// Every key with a tag is a multiple of 4; its tag is one of 8.
fn tag_of(key: usize) -> Option<String> {
    key.is_multiple_of(4).then(|| format!("t{}", (key / 4) % 8))
}

/// Every third key has a stale-while-revalidate window as long as its TTL.
fn has_stale_window(key: usize) -> bool {
    key.is_multiple_of(3)
}

/// The stale-while-revalidate window of the keys that have one.
pub const STALE_WINDOW: Duration = Duration::from_secs(1);

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
pub const CALLERS: u64 = 4;

/// What the callers, the writer, the faults and the checks share.
pub struct Workload {
    pub instances: Arc<Instances>,
    pub origin: Arc<Origin>,
    pub timeline: Arc<Timeline>,
    pub checks: Arc<Checks>,
    /// When the callers and the writer stop.
    pub until: Instant,
    /// A caller's pause between two calls.
    pub pause: Duration,
    pub keys: usize,
    /// Each instance's path to its store, where the faults on the path are injected (one
    /// server with `SOAK_PATH_FAULTS=1`; none otherwise).
    pub paths: Vec<support::path_proxies::PathProxies>,
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
pub async fn write(workload: Arc<Workload>, mut rng: StdRng, writes: u64, ttl: Duration) {
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
        timeline.change(format!(
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
