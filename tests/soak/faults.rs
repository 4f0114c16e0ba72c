//! The fault injector: at random times drawn from the seed, one fault at a time against the
//! shared Redis (one server, a Cluster's nodes, or a Sentinel topology's), the origin or an
//! instance, each written to the time line with the span during which the bounds of a healthy
//! system are not checked.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::RngExt;

use crate::backend::{on_each_node, on_node, Backend, Topology};
#[cfg(feature = "sentinel")]
use crate::failover;
use crate::instances::{LOAD_TIMEOUT, LOCK_TTL};
use crate::kills::Kill;
use crate::origin::Mode;
use crate::workload::Workload;
use support::fault_proxy::{Fault, Kind};
use tower_stampede::store::RedisStore;

/// The faults drawn on one server, before the others.
const SERVER_FAULTS: [&str; 2] = ["redis-kill-restart", "redis-sigstop"];

/// The faults drawn on a Cluster, before the others: a master killed instead of the server's
/// kill and pause.
const CLUSTER_FAULTS: [&str; 1] = ["master-killed"];

/// The faults drawn on a Sentinel topology, before the others: the primary killed (restarted
/// later, plainly or as a replica), paused, or switched over ([`failover`](crate::failover)).
const SENTINEL_FAULTS: [&str; 3] = ["primary-killed", "primary-paused", "switchover"];

/// The faults on one instance's paths to its store's nodes (`SOAK_PATH_FAULTS=1`), drawn
/// beside the others: a partition (every byte held, the connections left open) of 0.3 to 5 s
/// while the others go on changing keys; a link slower than the store timeout (200 ms) for a
/// while; the subscriber silent while commands flow; replies stalled while requests go out.
const PATH_FAULTS: [&str; 4] = [
    "path-partition",
    "path-slow",
    "path-silent-subscriber",
    "path-replies-stalled",
];

/// The faults after which a replica may hold the primary's role, having missed the last
/// changes acknowledged by the old primary (replication is asynchronous): near one, the checks
/// allow the failover bound.
pub const FAILOVERS: [&str; 4] = [
    "master-killed",
    "primary-killed",
    "primary-paused",
    "switchover",
];

/// How long a failover fault may last on a busy machine: the switch (about 2.3 s), its
/// length, then the dead node's restart (an empty master for about 11 s before the sentinels
/// demote it, and up to 10 s more until each sentinel has seen it linked) or the old
/// primary's demotion (about 11 s after a switchover); 24 s seen.
const FAILOVER_LENGTH: Duration = Duration::from_secs(30);

/// The faults drawn in every mode; on a Cluster or a Sentinel topology, those of Redis are
/// sent to every data node (and `client-kill-pubsub` to the sentinels too).
const FAULTS: [&str; 9] = [
    "client-kill-pubsub",
    "client-kill-normal",
    "flushall",
    "maxmemory-full",
    "evict-random-keys",
    "origin-failing",
    "origin-hanging",
    "instance-restart",
    "instance-killed-mid-load",
];

/// How long after an instance is killed a call of the key it was loading may still run: the
/// lock TTL, then a follower's longest pause between polls (200 ms), a store round trip and
/// the load, with room for a busy machine.
pub const KILL_MARGIN: Duration = Duration::from_secs(1);

/// Injects faults until `until`, one every `gap` on average; `settle` is how long after a
/// fault its effects may last. Returns when the last fault ended.
pub async fn inject(
    backend: Arc<Mutex<Backend>>,
    workload: Arc<Workload>,
    mut rng: StdRng,
    until: Instant,
    gap: Duration,
    settle: Duration,
) -> Option<Instant> {
    let timeline = &workload.timeline;
    let (topology, sentinels) = {
        let backend = backend.lock().unwrap();
        (backend.topology(), backend.sentinel_ports())
    };
    let own: &[&str] = match topology {
        Topology::Server => &SERVER_FAULTS,
        Topology::Cluster => &CLUSTER_FAULTS,
        Topology::Sentinel => &SENTINEL_FAULTS,
    };
    let path: &[&str] = if workload.paths.is_empty() {
        &[]
    } else {
        &PATH_FAULTS
    };
    let faults: Vec<&'static str> = own.iter().chain(&FAULTS).chain(path).copied().collect();
    let mut last = None;
    // Whether the last failover's old master is a replica again, so that another may fail.
    let mut masters_replicated = true;
    loop {
        let wait = gap.mul_f64(rng.random_range(0.2..1.8));
        if Instant::now() + wait >= until {
            return last;
        }
        tokio::time::sleep(wait).await;
        let mut fault = faults[rng.random_range(0..faults.len())];
        // A failover's old master must be a replica again before another fails over, and
        // a failover (with the restart of a dead node, or the demotion of an old primary)
        // takes seconds: none begins that could run into the quiet part.
        if FAILOVERS.contains(&fault)
            && (!masters_replicated || Instant::now() + FAILOVER_LENGTH > until)
        {
            fault = "client-kill-normal";
        }
        // A partition lasts up to 5 s, as a network blip may; every other fault up to 2.5 s.
        // One draw either way, so a seed's time line without path faults is unchanged.
        let longest = if fault == "path-partition" {
            5000
        } else {
            2500
        };
        let length = Duration::from_millis(rng.random_range(300..longest));
        let from = Instant::now();
        timeline.event(format!("fault {fault} begins ({} ms)", length.as_millis()));
        timeline.count(fault);
        let span = timeline.begin(fault, from);
        let ports = backend.lock().unwrap().live_ports();
        match fault {
            "redis-kill-restart" => {
                server(&backend, |s| s.kill());
                tokio::time::sleep(length).await;
                let backend = Arc::clone(&backend);
                tokio::task::spawn_blocking(move || server(&backend, |s| s.restart()))
                    .await
                    .unwrap();
            }
            "redis-sigstop" => {
                server(&backend, |s| s.pause());
                tokio::time::sleep(length).await;
                server(&backend, |s| s.resume());
            }
            "master-killed" => {
                let marker = format!("fault-{}", rng.random::<u32>());
                masters_replicated = master_killed(&backend, &workload, marker, length).await;
            }
            #[cfg(feature = "sentinel")]
            "primary-killed" => {
                let as_replica = rng.random_bool(0.5);
                masters_replicated =
                    failover::primary_killed(&backend, &workload, length, as_replica).await;
            }
            #[cfg(feature = "sentinel")]
            "primary-paused" => {
                masters_replicated = failover::primary_paused(&backend, &workload, length).await;
            }
            #[cfg(feature = "sentinel")]
            "switchover" => masters_replicated = failover::switchover(&backend, &workload).await,
            // The sentinels' pub/sub clients are the stores' `+switch-master` listeners.
            "client-kill-pubsub" => {
                let nodes: Vec<u16> = ports.iter().chain(&sentinels).copied().collect();
                on_each_node(&nodes, &client_kill("pubsub")).await;
            }
            "client-kill-normal" => on_each_node(&ports, &client_kill("normal")).await,
            "flushall" => on_each_node(&ports, &redis::cmd("FLUSHALL")).await,
            // Under the default `noeviction` policy, a full server refuses every write.
            "maxmemory-full" => {
                on_each_node(&ports, &config_set_maxmemory("1")).await;
                tokio::time::sleep(length).await;
                on_each_node(&ports, &config_set_maxmemory("0")).await;
            }
            "evict-random-keys" => {
                for _ in 0..rng.random_range(10..100) {
                    evict_one(ports[rng.random_range(0..ports.len())]).await;
                }
            }
            "origin-failing" | "origin-hanging" => {
                workload.origin.set_mode(if fault == "origin-failing" {
                    Mode::Failing
                } else {
                    Mode::Hanging
                });
                tokio::time::sleep(length).await;
                workload.origin.set_mode(Mode::Normal);
            }
            "path-partition" | "path-slow" | "path-silent-subscriber" | "path-replies-stalled" => {
                let instance = rng.random_range(0..workload.paths.len());
                let (kind, fault, length) = match fault {
                    "path-partition" => (Kind::All, Fault::Blackhole, length),
                    "path-slow" => (
                        Kind::All,
                        Fault::Delay {
                            fixed: Duration::from_millis(250),
                            jitter: Duration::from_millis(200),
                        },
                        length,
                    ),
                    "path-silent-subscriber" => (Kind::Subscriber, Fault::Blackhole, length),
                    _ => (Kind::All, Fault::StallReplies, length),
                };
                timeline.event(format!(
                    "instance {instance}'s path: {fault:?} on {kind:?} for {} ms",
                    length.as_millis()
                ));
                workload.paths[instance].set(kind, fault);
                tokio::time::sleep(length).await;
                workload.paths[instance].heal();
            }
            "instance-restart" => {
                let instance = rng.random_range(0..workload.instances.len());
                timeline.event(format!("instance {instance} restarts"));
                workload.instances.restart(instance);
            }
            "instance-killed-mid-load" => {
                // After the last fault's effects, so that the others owe the dead instance
                // what the checks say, with no excuse.
                if let Some(last) = last {
                    tokio::time::sleep_until((last + settle).into()).await;
                }
                let instance = rng.random_range(0..workload.instances.len());
                kill_mid_load(&backend, &workload, instance, from, &mut rng).await;
            }
            // A Sentinel fault is drawn only on a Sentinel topology (feature `sentinel`).
            _ => unreachable!(),
        }
        timeline.event(format!("fault {fault} ends"));
        let ended = Instant::now();
        timeline.end(span, ended + settle);
        last = Some(ended);
    }
}

/// Runs `what` on the one server (the server faults are not drawn on a Cluster).
fn server(backend: &Mutex<Backend>, what: impl FnOnce(&mut support::RedisServer)) {
    match &mut *backend.lock().unwrap() {
        Backend::Server(server) => what(server),
        #[allow(unreachable_patterns)]
        _ => unreachable!("a server fault on a cluster or Sentinel"),
    }
}

/// Kills (SIGKILL) the master of `marker`'s slot, waits for its replica to take over, and
/// after `length` restarts the dead node, which rejoins as the new master's replica. Returns
/// whether it did (else no other master may be killed: its shard would have no replica).
#[cfg(feature = "cluster")]
async fn master_killed(
    backend: &Arc<Mutex<Backend>>,
    workload: &Workload,
    marker: String,
    length: Duration,
) -> bool {
    let timeline = &workload.timeline;
    let kill = Arc::clone(backend);
    let promoted = tokio::task::spawn_blocking(move || {
        let mut backend = kill.lock().unwrap();
        let Backend::Cluster(cluster) = &mut *backend else {
            unreachable!("a cluster fault on a server")
        };
        let killed = cluster.kill_master_of(&marker);
        (
            killed,
            cluster.wait_promoted(&marker, Duration::from_secs(30)),
        )
    })
    .await;
    let Ok((killed, promoted)) = promoted else {
        workload.checks.violation(
            timeline,
            Instant::now(),
            None,
            "no replica took over in 30 s".into(),
        );
        return false;
    };
    timeline.event(format!(
        "master on port {killed} killed, {promoted} took over"
    ));
    tokio::time::sleep(length).await;
    let restart = Arc::clone(backend);
    let rejoined = tokio::task::spawn_blocking(move || {
        let mut backend = restart.lock().unwrap();
        let Backend::Cluster(cluster) = &mut *backend else {
            unreachable!("a cluster fault on a server")
        };
        cluster.restart_killed(Duration::from_secs(30))
    })
    .await
    .unwrap_or(false);
    timeline.event(format!(
        "node on port {killed} restarted, {}",
        if rejoined {
            "a replica again"
        } else {
            "not a replica in 30 s"
        }
    ));
    if !rejoined {
        timeline.count("master-killed: node not back as a replica");
    }
    rejoined
}

#[cfg(not(feature = "cluster"))]
async fn master_killed(_: &Arc<Mutex<Backend>>, _: &Workload, _: String, _: Duration) -> bool {
    unreachable!("a cluster fault without the `cluster` feature")
}

/// Holds the next load of `instance` (its lock taken), kills the instance there, starts a
/// new one with new callers, and waits until the others had time to take over, recording
/// the kill for the checks.
async fn kill_mid_load(
    backend: &Mutex<Backend>,
    workload: &Arc<Workload>,
    instance: usize,
    from: Instant,
    rng: &mut StdRng,
) {
    let timeline = &workload.timeline;
    let held = workload.origin.hold_next(instance);
    let held = tokio::time::timeout(Duration::from_secs(3), held).await;
    workload.origin.cancel_hold();
    // Whether the held load is a leader's, under a lock the store holds: a load after a failed
    // lookup has none, and the others may load at once.
    let locked = match &held {
        Ok(Ok((key, _))) => Some(lock_held(backend, &workload.instances.get(instance), *key).await),
        _ => None,
    };
    workload.instances.kill(instance);
    let killed_at = Instant::now();
    workload.spawn_callers(instance, rng);
    match (held, locked) {
        (Ok(Ok((key, _))), Some(false)) => {
            timeline.event(format!(
                "instance {instance} killed while loading {} without its lock in the store (its lookup had failed)",
                crate::origin::key_name(key)
            ));
            timeline.count("instance-killed-mid-load: no lock in the store");
        }
        (Ok(Ok((key, load_started))), _) => {
            let answered =
                first_answer(&workload.instances.get(instance), LOCK_TTL + KILL_MARGIN).await;
            timeline.event(format!(
                "instance {instance} killed while loading {}; its replacement's store answered {}",
                crate::origin::key_name(key),
                answered.map_or("not within the check".to_owned(), |at| format!(
                    "{} ms after the kill",
                    at.saturating_duration_since(killed_at).as_millis()
                ))
            ));
            workload.checks.kill(Kill {
                instance,
                key,
                load_started,
                killed_at,
                fault_began: from,
                replacement_answered: answered,
            });
        }
        _ => {
            timeline.event(format!("instance {instance} killed, no load in flight"));
            timeline.count("instance-killed-mid-load: no load in flight");
        }
    }
    // No other fault while the others take over from the dead instance's lock.
    tokio::time::sleep(LOCK_TTL + KILL_MARGIN + LOAD_TIMEOUT).await;
}

/// Whether a data node holds a leader's lock on `key` (of `cache`'s namespace): the lock key
/// holds a token (32 hex digits) and `:`, where a `fresh` or `failed` marker holds other bytes.
/// A replica has the primary's copy; a Cluster's other masters answer `MOVED` (nothing).
async fn lock_held(backend: &Mutex<Backend>, cache: &tower_stampede::Cache, key: usize) -> bool {
    let lock = RedisStore::lock_name(&cache.store_key(crate::origin::key_name(key)));
    let ports = backend.lock().unwrap().live_ports();
    for port in ports {
        let value: Option<Option<Vec<u8>>> = on_node(port, redis::cmd("GET").arg(&lock)).await;
        if let Some(Some(value)) = value {
            if value.len() > 32
                && value[..32].iter().all(u8::is_ascii_hexdigit)
                && value[32] == b':'
            {
                return true;
            }
        }
    }
    false
}

/// When `cache`'s store first answers (its health check asks it), within `limit`.
async fn first_answer(cache: &tower_stampede::Cache, limit: Duration) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let health = cache.health().await;
        if let Some(ago) = health.last_answer_ago() {
            return Some(Instant::now() - ago);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

fn client_kill(kind: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .arg("SKIPME")
        .arg("yes");
    cmd
}

fn config_set_maxmemory(bytes: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET").arg("maxmemory").arg(bytes);
    cmd
}

/// Removes one random key of the node on `port` (a value, a lock, a `fresh` marker or the tag
/// hash), as an eviction would; a replica refuses, as it would not evict on its own.
async fn evict_one(port: u16) {
    if let Some(Some(key)) = on_node::<Option<Vec<u8>>>(port, &redis::cmd("RANDOMKEY")).await {
        let _ = on_node::<redis::Value>(port, redis::cmd("DEL").arg(key)).await;
    }
}
