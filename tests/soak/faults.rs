//! The fault injector: at random times drawn from the seed, one fault at a time against the
//! shared redis-server or the origin, each written to the time line with the span during which
//! the load bound is not checked.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use support::RedisServer;

use crate::instances::Instances;
use crate::origin::{Mode, Origin};

/// What happened when, for the report around a violation, and when Redis was not healthy.
#[derive(Default)]
pub struct Timeline {
    start: Option<Instant>,
    events: Mutex<Vec<(Instant, String)>>,
    unhealthy: Mutex<Vec<(Instant, Instant)>>,
    pub counts: Mutex<std::collections::BTreeMap<&'static str, usize>>,
}

impl Timeline {
    pub fn new(start: Instant) -> Self {
        Timeline {
            start: Some(start),
            ..Timeline::default()
        }
    }

    pub fn event(&self, text: String) {
        self.events.lock().unwrap().push((Instant::now(), text));
    }

    /// Whether any fault span overlaps `from..to`.
    pub fn unhealthy_during(&self, from: Instant, to: Instant) -> bool {
        self.unhealthy
            .lock()
            .unwrap()
            .iter()
            .any(|(a, b)| *a <= to && from <= *b)
    }

    pub fn since_start(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start.unwrap_or(at))
            .as_secs_f64()
    }

    /// The events within `around` of `at`, one per line.
    pub fn around(&self, at: Instant, around: Duration) -> String {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(when, _)| {
                when.saturating_duration_since(at) <= around
                    && at.saturating_duration_since(*when) <= around
            })
            .map(|(when, text)| format!("    {:8.3}s {text}\n", self.since_start(*when)))
            .collect()
    }
}

/// The faults the injector draws from.
const FAULTS: [&str; 10] = [
    "redis-kill-restart",
    "redis-sigstop",
    "client-kill-pubsub",
    "client-kill-normal",
    "flushall",
    "maxmemory-full",
    "evict-random-keys",
    "origin-failing",
    "origin-hanging",
    "instance-restart",
];

/// Injects faults until `until`, one every `gap` on average; `settle` is how long after a
/// fault loads are not counted against the bound.
#[allow(clippy::too_many_arguments)]
pub async fn inject(
    server: Arc<Mutex<RedisServer>>,
    instances: Arc<Instances>,
    origin: Arc<Origin>,
    timeline: Arc<Timeline>,
    mut rng: StdRng,
    until: Instant,
    gap: Duration,
    settle: Duration,
) {
    loop {
        let wait = gap.mul_f64(rng.random_range(0.2..1.8));
        if Instant::now() + wait >= until {
            return;
        }
        tokio::time::sleep(wait).await;
        let fault = FAULTS[rng.random_range(0..FAULTS.len())];
        let length = Duration::from_millis(rng.random_range(300..2500));
        let from = Instant::now();
        timeline.event(format!("fault {fault} begins ({} ms)", length.as_millis()));
        *timeline.counts.lock().unwrap().entry(fault).or_default() += 1;
        match fault {
            "redis-kill-restart" => {
                let server = Arc::clone(&server);
                server.lock().unwrap().kill();
                tokio::time::sleep(length).await;
                tokio::task::spawn_blocking(move || server.lock().unwrap().restart())
                    .await
                    .unwrap();
            }
            "redis-sigstop" => {
                server.lock().unwrap().pause();
                tokio::time::sleep(length).await;
                server.lock().unwrap().resume();
            }
            "client-kill-pubsub" => client_kill(&server, "pubsub").await,
            "client-kill-normal" => client_kill(&server, "normal").await,
            "flushall" => admin(&server, redis::cmd("FLUSHALL")).await,
            // Under the default `noeviction` policy, a full server refuses every write.
            "maxmemory-full" => {
                config_set_maxmemory(&server, "1").await;
                tokio::time::sleep(length).await;
                config_set_maxmemory(&server, "0").await;
            }
            "evict-random-keys" => {
                for _ in 0..rng.random_range(10..100) {
                    evict_one(&server).await;
                }
            }
            "origin-failing" | "origin-hanging" => {
                origin.set_mode(if fault == "origin-failing" {
                    Mode::Failing
                } else {
                    Mode::Hanging
                });
                tokio::time::sleep(length).await;
                origin.set_mode(Mode::Normal);
            }
            "instance-restart" => {
                let instance = rng.random_range(0..instances.len());
                timeline.event(format!("instance {instance} restarts"));
                instances.restart(instance);
            }
            _ => unreachable!(),
        }
        timeline.event(format!("fault {fault} ends"));
        timeline
            .unhealthy
            .lock()
            .unwrap()
            .push((from, Instant::now() + settle));
    }
}

async fn client_kill(server: &Mutex<RedisServer>, kind: &str) {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .arg("SKIPME")
        .arg("yes");
    admin(server, cmd).await;
}

async fn config_set_maxmemory(server: &Mutex<RedisServer>, bytes: &str) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET").arg("maxmemory").arg(bytes);
    admin(server, cmd).await;
}

/// Removes one random key (a value, a lock, a `fresh` marker or the tag hash), as an
/// eviction would.
async fn evict_one(server: &Mutex<RedisServer>) {
    let client = server.lock().unwrap().client();
    let run = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let key: Option<Vec<u8>> = redis::cmd("RANDOMKEY").query_async(&mut conn).await?;
        if let Some(key) = key {
            redis::cmd("DEL")
                .arg(key)
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok::<_, redis::RedisError>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), run).await;
}

/// Runs one command on a connection of its own (the injector's own connection would be
/// killed with the others).
async fn admin(server: &Mutex<RedisServer>, cmd: redis::Cmd) {
    let client = server.lock().unwrap().client();
    let run = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        cmd.query_async::<redis::Value>(&mut conn).await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), run).await;
}
