//! The engine and the store on a Redis Sentinel service (feature `sentinel`, issue 44): each
//! test starts its own primary, two replicas and three sentinels on free ports
//! ([`RedisSentinel`]), and app instances that find the primary through the sentinels.
//!
//! Every test here runs on real time: the processes are real, and the sentinels' own clocks
//! decide when a primary is down (after 1 s of silence) and when a failover ends, which paused
//! tokio time cannot move. Every wait is bounded by [`LIMIT`]; no test asserts a duration.
#![cfg(feature = "sentinel")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{app_clients, client_list, stampede_of_200, Counter, RedisSentinel};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower_stampede::store::{RedisStore, RedisStoreBuilder};
use tower_stampede::Cache;

/// The failure guard on anything that waits: far beyond what a failover needs on an idle
/// machine (about 2.3 s from a kill until every sentinel names the promoted replica), and
/// below the values' 60 s life in L1, so a change that never reaches an instance fails a test.
const LIMIT: Duration = Duration::from_secs(30);

/// A builder for the topology's service: over TLS, trusting its authority, if it was started
/// with TLS.
fn builder(topology: &RedisSentinel) -> RedisStoreBuilder {
    let builder = RedisStore::sentinel_builder(topology.sentinel_urls(), topology.service());
    #[cfg(feature = "tls")]
    if let Some(files) = topology.tls() {
        return builder.tls_root_certificates(std::fs::read(&files.ca_cert).unwrap());
    }
    builder
}

/// A process's view of the service: a store with connections (and a subscriber) of its own.
async fn instance(topology: &RedisSentinel) -> RedisStore {
    let store = builder(topology).connect().await.unwrap();
    assert!(!store.is_cluster());
    store
}

/// A cache over `store` whose L1 keeps a value its whole 60 s life (not the default 10 s cap),
/// so only a notification makes another instance's change visible within [`LIMIT`].
fn cache(store: RedisStore) -> Cache {
    Cache::builder(store)
        .namespace("test")
        .store_timeout(support::PATIENT)
        .l1_ttl_cap(Duration::from_secs(120))
        .build()
}

async fn instances(topology: &RedisSentinel, count: usize) -> Vec<Cache> {
    let mut instances = Vec::new();
    for _ in 0..count {
        instances.push(cache(instance(topology).await));
    }
    instances
}

/// Loads per instance so far.
fn per_instance(loads: &[Counter]) -> Vec<usize> {
    loads.iter().map(Counter::get).collect()
}

/// Store errors of every instance so far.
fn errors(instances: &[Cache]) -> u64 {
    instances.iter().map(|c| c.stats().store_errors).sum()
}

/// A stampede of `key` that must cost exactly one load across the instances.
async fn one_load(instances: &[Cache], key: &str, loads: &[Counter]) {
    let before: usize = per_instance(loads).iter().sum();
    stampede_of_200(instances, key, loads, &Arc::new(Notify::new())).await;
    let added = per_instance(loads).iter().sum::<usize>() - before;
    assert_eq!(added, 1, "{key}: loads across the instances");
}

/// A stampede of `key` that may cost one load per instance (each on its own while the store
/// fails), no more.
async fn at_most_one_load_each(instances: &[Cache], key: &str, loads: &[Counter]) {
    let before = per_instance(loads);
    stampede_of_200(instances, key, loads, &Arc::new(Notify::new())).await;
    for (n, (b, a)) in before.iter().zip(per_instance(loads)).enumerate() {
        assert!(a - b <= 1, "{key}: instance {n} loaded {} times", a - b);
    }
}

/// Waits (bounded) until every instance's health check says healthy: its store answers, its
/// notifications are live, its breaker is closed.
async fn wait_healthy(instances: &[Cache]) {
    for (n, cache) in instances.iter().enumerate() {
        let deadline = Instant::now() + LIMIT;
        loop {
            let health = cache.health().await;
            if health.is_healthy() {
                break;
            }
            assert!(Instant::now() < deadline, "instance {n}: still {health:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Reads `key` in `cache` (loading `version` on a miss) until it answers `want`; panics after
/// [`LIMIT`].
async fn until_reads(
    cache: &Cache,
    key: &str,
    want: &str,
    version: &Arc<std::sync::Mutex<String>>,
) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let version = Arc::clone(version);
        let read = cache
            .get_or_load(key, move || async move {
                let value = version.lock().unwrap().clone();
                Ok::<_, std::io::Error>(Bytes::from(value))
            })
            .await;
        if read.as_ref().is_ok_and(|value| value == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key}: still {read:?}, never {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks `done` every 20 ms until it holds; panics saying `what` after [`LIMIT`].
async fn wait_for<F: std::future::Future<Output = bool>>(what: &str, done: impl Fn() -> F) {
    let deadline = Instant::now() + LIMIT;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the data node on `port` holds `key` (read behind the store's back).
async fn holds(port: u16, key: &str) -> bool {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<bool>(&mut connection)
        .await
        .unwrap()
}

/// Issue 44, "Done when" #1: before any failover, a 200-caller stampede over three instances,
/// each asking the sentinels for the primary, costs one load, with no store errors, and the
/// value is on the primary the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_over_three_instances_through_the_sentinels_is_one_load() {
    let topology = RedisSentinel::start();
    let instances = instances(&topology, 3).await;
    let loads: Vec<Counter> = (0..3).map(|_| Counter::default()).collect();
    one_load(&instances, "hot", &loads).await;
    assert_eq!(errors(&instances), 0);
    let value = RedisStore::value_name(&instances[0].store_key("hot"));
    assert!(holds(topology.primary_port(), &value).await);
}

/// Issue 44, "Done when" #2 and #3: the primary killed (SIGKILL) while a stampede loads, and
/// stampedes until every sentinel names the promoted replica: no caller gets an error, and
/// each instance loads at most once per stampede (the store fails meanwhile, and the engine
/// falls back to in-process protection). Once every instance is healthy, the first stampede
/// of a new key is one load again, and an `invalidate` made after the promotion reaches every
/// instance's L1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_during_stampedes_fails_over_without_errors() {
    killed_during_stampedes(RedisSentinel::start()).await;
}

async fn killed_during_stampedes(mut topology: RedisSentinel) {
    let instances = instances(&topology, 3).await;
    let loads: Vec<Counter> = (0..3).map(|_| Counter::default()).collect();
    let mut keys = (0..).map(|i| format!("key-{i}"));
    one_load(&instances, &keys.next().unwrap(), &loads).await;

    // A value every instance holds in L1, to invalidate after the promotion.
    let version = Arc::new(std::sync::Mutex::new("v1".to_owned()));
    for cache in &instances {
        until_reads(cache, "shared", "v1", &version).await;
    }

    // The primary is killed while a stampede's leader loads.
    let key = keys.next().unwrap();
    let before = per_instance(&loads);
    let started = Arc::new(Notify::new());
    let running = tokio::spawn({
        let (instances, key, loads) = (instances.clone(), key.clone(), loads.clone());
        let started = Arc::clone(&started);
        async move { stampede_of_200(&instances, &key, &loads, &started).await }
    });
    started.notified().await;
    let killed = topology.kill_primary();
    eprintln!("killed the primary on port {killed} while {key} loaded");
    running.await.unwrap();
    for (n, (b, a)) in before.iter().zip(per_instance(&loads)).enumerate() {
        assert!(a - b <= 1, "{key}: instance {n} loaded {} times", a - b);
    }

    // Stampedes until the sentinels name the promoted replica: no errors, at most one load per
    // instance each.
    let promoting = tokio::task::spawn_blocking(move || {
        let promoted = topology.wait_promoted(LIMIT);
        (topology, promoted)
    });
    let mut during = 0;
    while !promoting.is_finished() {
        at_most_one_load_each(&instances, &keys.next().unwrap(), &loads).await;
        during += 1;
    }
    let (topology, promoted) = promoting.await.unwrap();
    let promoted = promoted.expect("no replica promoted within the limit");
    eprintln!("port {promoted} promoted after {during} stampedes meanwhile");
    assert_ne!(promoted, killed);
    assert!(during > 0, "no stampede ran during the failover");

    // Every instance on the promoted primary: one load per stampede, no store errors.
    wait_healthy(&instances).await;
    let errors_before = errors(&instances);
    one_load(&instances, &keys.next().unwrap(), &loads).await;
    assert_eq!(
        errors(&instances),
        errors_before,
        "store errors once healthy"
    );

    // A change after the promotion reaches every instance's L1 (a copy L1 would keep 60 s).
    *version.lock().unwrap() = "v2".to_owned();
    instances[0].invalidate("shared").await.unwrap();
    for cache in &instances {
        until_reads(cache, "shared", "v2", &version).await;
    }

    // The questions that failed while the primary was down moved each store on to other
    // sentinels: it still holds one connection to each, and its listener's.
    settles_at_most(&topology, SENTINEL_CONNECTIONS * instances.len()).await;
    drop(topology);
}

/// A store's connections to the sentinels: one for its questions to each of the three, and
/// its `+switch-master` listener. (A redis-rs client of several sentinels keeps a connection to
/// each it asks: a client per order of the three would hold ten once questions failed.)
const SENTINEL_CONNECTIONS: usize = 4;

/// Waits (within [`LIMIT`]) until the app holds at most `bound` connections to the sentinels
/// (a connection given up may take a moment to close).
async fn settles_at_most(topology: &RedisSentinel, bound: usize) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let held = app_clients_on_sentinels(topology).await;
        if held <= bound {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stores hold {held} connections to the sentinels (bound {bound})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 44, item 2: a planned failover (`SENTINEL FAILOVER`, no node killed). The demoted
/// primary keeps answering writes until the sentinels turn it into a replica (about 11 s), and
/// then drops them in its resync: each instance must move to the new primary on its own (the
/// sentinels' `+switch-master`), and a `set` and an `invalidate` made once it has moved hold,
/// in every instance's L1 and for a process started afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_moves_every_instance_and_keeps_later_changes() {
    planned_failover(RedisSentinel::start()).await;
}

async fn planned_failover(topology: RedisSentinel) {
    let instances = instances(&topology, 3).await;
    let ttl = Duration::from_secs(60);
    let version = Arc::new(std::sync::Mutex::new("v1".to_owned()));
    instances[0]
        .set("kept", Bytes::from_static(b"before"), ttl)
        .await
        .unwrap();
    for cache in &instances {
        until_reads(cache, "kept", "before", &version).await;
        until_reads(cache, "gone", "v1", &version).await;
    }

    let switching = tokio::task::spawn_blocking(move || {
        let (old, new) = topology.switch_over(LIMIT);
        (topology, old, new)
    });
    let (topology, old, new) = switching.await.unwrap();
    let new = new.expect("no replica promoted within the limit");
    eprintln!("switched from port {old} to port {new}");

    // Each instance writes to the new primary, within the limit (its writes before that may
    // land on the old one, and be lost: the loss window of a switchover).
    for (n, cache) in instances.iter().enumerate() {
        let deadline = Instant::now() + LIMIT;
        for attempt in 0.. {
            let key = format!("moved-{n}-{attempt}");
            let set = cache.set(key.as_str(), Bytes::from_static(b"x"), ttl).await;
            let value = RedisStore::value_name(&cache.store_key(&key));
            if set.is_ok() && holds(new, &value).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "instance {n} never wrote to {new}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Changes once moved; then the old primary is a replica of the new one, and whatever it
    // took meanwhile is gone.
    instances[1]
        .set("kept", Bytes::from_static(b"after"), ttl)
        .await
        .unwrap();
    *version.lock().unwrap() = "v2".to_owned();
    instances[2].invalidate("gone").await.unwrap();
    let demoted = tokio::task::spawn_blocking(move || {
        let demoted = topology.wait_replica(old, LIMIT);
        (topology, demoted)
    });
    let (topology, demoted) = demoted.await.unwrap();
    assert!(demoted, "the old primary never became a replica");

    // A process started now reads them from the store (its loader would give "v2").
    let late = cache(instance(&topology).await);
    for cache in instances.iter().chain([&late]) {
        until_reads(cache, "kept", "after", &version).await;
        until_reads(cache, "gone", "v2", &version).await;
    }
}

/// Issue 44, item 1 ("starting degraded like `RedisStore::open`"): stores opened while the
/// sentinels still name a primary that was just killed are returned at once, and answer with
/// in-process protection meanwhile (at most one load per instance); once a replica is
/// promoted, each connects by itself (its health check turns healthy), and a stampede over
/// the three is one load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opened_while_the_primary_is_down_connect_once_one_is_promoted() {
    let mut topology = RedisSentinel::start();
    let killed = topology.kill_primary();
    let instances: Vec<Cache> = (0..3)
        .map(|_| cache(builder(&topology).open().unwrap()))
        .collect();
    let loads: Vec<Counter> = (0..3).map(|_| Counter::default()).collect();
    at_most_one_load_each(&instances, "while-down", &loads).await;

    let promoting = tokio::task::spawn_blocking(move || {
        let promoted = topology.wait_promoted(LIMIT);
        (topology, promoted)
    });
    let (topology, promoted) = promoting.await.unwrap();
    let promoted = promoted.expect("no replica promoted within the limit");
    eprintln!("port {promoted} promoted after port {killed} was killed");
    wait_healthy(&instances).await;
    one_load(&instances, "opened", &loads).await;
    drop(topology);
}

/// The old primary restarted without `--replicaof`, after a replica was promoted: it answers
/// as an empty primary for about 11 s, until the sentinels turn it into a replica. A store
/// must keep to the promoted primary (a connection that went back to the old address would
/// split the instances, each loading on its own, and see no fill of the others): every
/// stampede meanwhile is one load across the instances, with no store errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_primary_restarted_empty_is_not_used() {
    let mut topology = RedisSentinel::start();
    let instances = instances(&topology, 3).await;
    let loads: Vec<Counter> = (0..3).map(|_| Counter::default()).collect();
    let mut keys = (0..).map(|i| format!("key-{i}"));
    let killed = topology.kill_primary();
    let promoting = tokio::task::spawn_blocking(move || {
        let promoted = topology.wait_promoted(LIMIT);
        (topology, promoted)
    });
    let (mut topology, promoted) = promoting.await.unwrap();
    let promoted = promoted.expect("no replica promoted within the limit");
    wait_healthy(&instances).await;
    one_load(&instances, &keys.next().unwrap(), &loads).await;

    let restarting = tokio::task::spawn_blocking(move || {
        let back = topology.restart_killed(LIMIT, false);
        (topology, back)
    });
    let errors_before = errors(&instances);
    let mut during = 0;
    while !restarting.is_finished() {
        one_load(&instances, &keys.next().unwrap(), &loads).await;
        during += 1;
    }
    let (topology, back) = restarting.await.unwrap();
    assert!(back, "port {killed} never came back as a replica");
    eprintln!("port {killed} back as a replica of {promoted} after {during} stampedes");
    assert_eq!(errors(&instances), errors_before, "store errors");
    one_load(&instances, &keys.next().unwrap(), &loads).await;
    assert_eq!(topology.primary_port(), promoted);
}

/// `primary_credentials` are what the store gives the data nodes: with an ACL user of theirs,
/// its connections there are that user's; with a wrong password, `connect` fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_credentials_reach_the_data_nodes() {
    let acl = ["--user", "app", "on", ">s3cret", "~*", "&*", "+@all"];
    let topology = RedisSentinel::start_with(&acl);
    let builder = || RedisStore::sentinel_builder(topology.sentinel_urls(), topology.service());
    let wrong = builder().primary_credentials(Some("app"), "wrong");
    assert!(wrong.connect().await.is_err(), "a wrong password connects");
    let mut instances = Vec::new();
    for _ in 0..2 {
        let store = builder().primary_credentials(Some("app"), "s3cret");
        instances.push(cache(store.connect().await.unwrap()));
    }
    let loads = [Counter::default(), Counter::default()];
    one_load(&instances, "hot", &loads).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", topology.primary_port()));
    let mut connection = client
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(clients.contains(" user=app "), "{clients}");
}

/// The app's connections to the sentinels, all together.
async fn app_clients_on_sentinels(topology: &RedisSentinel) -> usize {
    let mut count = 0;
    for port in topology.sentinel_ports() {
        count += app_clients(port, &[]).await;
    }
    count
}

/// A store dropped leaves nothing on the sentinels: its listener for `+switch-master` and the
/// sentinel client's own connections go with it, though no announcement comes to wake the
/// listener. (A listener that outlived its store would hold a sentinel connection and two
/// tasks per store until the next failover.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_store_leaves_no_connection_to_the_sentinels() {
    let topology = RedisSentinel::start();
    for round in 0..3 {
        let store = instance(&topology).await;
        let listened = || async { app_clients_on_sentinels(&topology).await > 0 };
        wait_for(
            &format!("round {round}: the store never listened"),
            listened,
        )
        .await;
        drop(store);
    }
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = app_clients_on_sentinels(&topology).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} connections to the sentinels outlived their stores"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The stores' `+switch-master` listeners dropped by the sentinels (`CLIENT KILL TYPE
/// pubsub`, as the soak does) listen again, each on the next sentinel; a switchover after
/// that still moves every instance off the old primary while it answers as a master (before
/// the sentinels demote it, about 10 s later), not only once it is demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_the_sentinels_dropped_still_hear_a_switchover() {
    listeners_dropped_then_switched_over(RedisSentinel::start()).await;
}

async fn listeners_dropped_then_switched_over(topology: RedisSentinel) {
    let instances = instances(&topology, 3).await;
    let sentinels = topology.sentinel_ports();
    let listening = || async {
        let mut count = 0;
        for port in &sentinels {
            count += app_clients(*port, &["TYPE", "pubsub"]).await;
        }
        count
    };
    let all_listen = || async { listening().await >= instances.len() };
    wait_for("the stores never listened", all_listen).await;
    for port in &sentinels {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let _: redis::Value = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "pubsub"][..])
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    wait_for("the listeners never came back", all_listen).await;

    let (topology, old, new) = tokio::task::spawn_blocking(move || {
        let (old, new) = topology.switch_over(LIMIT);
        (topology, old, new)
    })
    .await
    .unwrap();
    let new = new.expect("no replica promoted within the limit");
    let moved = || async {
        app_clients(old, &[]).await == 0 && app_clients(new, &[]).await >= 2 * instances.len()
    };
    wait_for(&format!("the instances never moved to {new}"), moved).await;
    assert!(
        !topology.wait_replica(old, Duration::ZERO),
        "the instances left the old primary only once it was demoted"
    );
}

/// Issue 44, item 1: the sentinels' credentials come in their URLs, apart from the data
/// nodes': a store whose sentinel URLs carry a sentinel ACL user talks to the sentinels as that
/// user (its listener and the lookups of the primary), and one with a wrong password cannot
/// find the primary, so `connect` fails, saying so without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_credentials_come_from_the_sentinel_urls() {
    let topology =
        RedisSentinel::start_with_sentinels(&[], "user watcher on >s3ntinel ~* &* +@all");
    let with = |password: &str| -> Vec<String> {
        topology
            .sentinel_urls()
            .iter()
            .map(|url| url.replace("redis://", &format!("redis://watcher:{password}@")))
            .collect()
    };
    let store = RedisStore::sentinel_builder(with("s3ntinel"), topology.service())
        .connect()
        .await
        .unwrap();
    let as_watcher = || async {
        let mut count = 0;
        for port in topology.sentinel_ports() {
            let list = client_list(port, &[]).await;
            count += list
                .iter()
                .filter(|line| line.contains(" user=watcher "))
                .count();
        }
        count
    };
    let connected = || async { as_watcher().await > 0 };
    wait_for("no connection to a sentinel as its user", connected).await;
    let health = cache(store).health().await;
    assert!(health.store_answers(), "{health:?}");

    let refused = RedisStore::sentinel_builder(with("wrong-one"), topology.service())
        .connect()
        .await
        .expect_err("a wrong sentinel password finds no primary");
    let refused = support::report(&refused);
    assert!(!refused.contains("wrong-one"), "{refused}");
}

/// Issue 44, item 1 ("TLS with the `tls` feature"): the same service with every node and
/// sentinel on TLS ports only for the app (`rediss://` sentinel URLs, the data nodes' TLS
/// ports named by the sentinels, replication and the sentinels' links over TLS too), the
/// certificates signed by a throwaway authority the stores trust.
#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use support::TlsFiles;

    /// The kill of the primary during stampedes, over TLS: no caller error, then one load per
    /// stampede and an `invalidate` that reaches every L1.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_primary_killed_during_stampedes_fails_over_without_errors() {
        let topology = RedisSentinel::start_tls(&TlsFiles::generate());
        assert!(topology.sentinel_urls()[0].starts_with("rediss://"));
        killed_during_stampedes(topology).await;
    }

    /// A planned failover over TLS: the old primary keeps answering, so only the sentinels'
    /// `+switch-master`, heard over a TLS connection to a sentinel, moves the instances in time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_planned_failover_moves_every_instance_and_keeps_later_changes() {
        planned_failover(RedisSentinel::start_tls(&TlsFiles::generate())).await;
    }

    /// The listeners are on the sentinels' TLS ports, trusting the same authority: the
    /// instances leave the old primary while it still answers as a master, which only the
    /// sentinels' announcement can tell them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listeners_the_sentinels_dropped_still_hear_a_switchover() {
        listeners_dropped_then_switched_over(RedisSentinel::start_tls(&TlsFiles::generate())).await;
    }

    /// The certificates must be trusted: without the authority, `connect` fails, and says
    /// why; with it, the same URLs connect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_authority_is_refused() {
        let topology = RedisSentinel::start_tls(&TlsFiles::generate());
        let untrusted = RedisStore::sentinel_builder(topology.sentinel_urls(), topology.service())
            .connect()
            .await
            .unwrap_err();
        // The store's message says what failed, its source (the client's error) why.
        let untrusted = support::report(&untrusted);
        eprintln!("{untrusted}");
        assert!(untrusted.contains("certificate"), "{untrusted}");
        instance(&topology).await;
    }
}

/// Stores made from the sentinels' connection settings as the application's own clients hold
/// them (`redis::Client::get_connection_info`): one load for a stampede over two processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_from_the_apps_sentinel_settings_share_one_load() {
    let topology = RedisSentinel::start();
    let clients: Vec<redis::Client> = topology
        .sentinel_urls()
        .iter()
        .map(|url| redis::Client::open(url.as_str()).unwrap())
        .collect();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let infos = clients
            .iter()
            .map(|client| client.get_connection_info().clone());
        let store = RedisStore::sentinel_info_builder(infos, topology.service())
            .connect()
            .await
            .unwrap();
        instances.push(cache(store));
    }
    let loads = [Counter::default(), Counter::default()];
    one_load(&instances, "from-the-apps-settings", &loads).await;
}
