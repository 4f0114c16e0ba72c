//! Faults on the path between one process and its store, while the other processes reach the
//! same `redis-server` directly: a partition (every byte held, the connections left open, no
//! reset: nothing errors until a timeout), a link slower than `store_timeout`, a subscriber
//! that falls silent while commands still work, replies that stall while requests still go
//! out. Each goes through [`FaultProxy`], in front of one instance.
//!
//! These tests run on real time: the faults are a real TCP proxy's (held bytes wait in the
//! kernel's sockets and the proxy's buffers), which paused tokio time cannot drive (it would
//! jump over every store timeout while the bytes are on their way). Their bounds are the
//! promise plus a margin for a busy machine; none is below a second where a scheduler could
//! miss it.
#![cfg(feature = "redis")]

use std::time::Duration;

use bytes::Bytes;
use support::fault_proxy::{Fault, FaultProxy, Kind};
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use support::path_proxies::PathProxies;
use support::{calls, until_health, Counter, RedisServer};
use tokio::time::Instant;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Health, Loaded, Outcome};

/// The failure guard on anything that waits: far beyond what a healthy run needs.
const LIMIT: Duration = Duration::from_secs(30);

/// The instances' store timeout: a call the store does not answer within it fails.
const STORE_TIMEOUT: Duration = Duration::from_millis(200);

/// How long each load takes.
const LOAD: Duration = Duration::from_millis(300);

/// The lock's TTL: what a partitioned leader's lock lapses after.
const LOCK_TTL: Duration = Duration::from_secs(1);

/// Scheduling and connection set-up on a busy 2-core machine, on top of a bound; a second, so
/// that no bound asserted is below one (tests/README.md).
const MARGIN: Duration = Duration::from_secs(1);

/// The breaker of every instance: open after 3 store calls in a row fail, for 1 s.
const BREAKER_FAILURES: u32 = 3;

/// An instance over `url`, in the tests' namespace, with a breaker that opens after
/// `breaker_failures` failed calls in a row (0: none).
async fn instance(url: String, breaker_failures: u32) -> Cache {
    Cache::builder(RedisStore::connect(url).await.unwrap())
        .namespace("network")
        .store_timeout(STORE_TIMEOUT)
        .lock_ttl(LOCK_TTL)
        .circuit_breaker(breaker_failures, Duration::from_secs(1))
        .build()
}

/// One instance behind a proxy, and two that reach the server directly.
struct Fleet {
    server: RedisServer,
    proxy: FaultProxy,
    /// `[behind the proxy, direct, direct]`.
    caches: Vec<Cache>,
}

impl Fleet {
    /// The instance behind the proxy with a breaker after `breaker_failures` (0: none).
    async fn start(breaker_failures: u32) -> Fleet {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port(), 54).await;
        let mut caches = vec![instance(proxy.url(), breaker_failures).await];
        for _ in 0..2 {
            caches.push(instance(server.url(), BREAKER_FAILURES).await);
        }
        let fleet = Fleet {
            server,
            proxy,
            caches,
        };
        for cache in &fleet.caches {
            until_health(cache, "subscribed", Health::is_healthy).await;
        }
        fleet
    }
}

/// What a stampede of one instance saw.
#[derive(Debug, Default)]
struct Seen {
    errors: Vec<String>,
    slowest: Duration,
    outcomes: Vec<Outcome>,
}

/// `requests` concurrent calls of `key` on each of `caches`, each load taking [`LOAD`] and
/// counted in `loads[i]` for the instance `i`; what each instance saw.
async fn stampede(caches: &[&Cache], key: &str, requests: usize, loads: &[Counter]) -> Vec<Seen> {
    let mut callers = Vec::new();
    for (i, cache) in caches.iter().enumerate() {
        for _ in 0..requests {
            let (cache, key, loads) = ((*cache).clone(), key.to_owned(), loads[i].clone());
            callers.push((
                i,
                tokio::spawn(async move {
                    let asked = Instant::now();
                    let fetched = cache
                        .fetch(key, move || async move {
                            loads.hit();
                            tokio::time::sleep(LOAD).await;
                            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded")))
                        })
                        .await;
                    (fetched, asked.elapsed())
                }),
            ));
        }
    }
    let mut seen: Vec<Seen> = caches.iter().map(|_| Seen::default()).collect();
    for (i, caller) in callers {
        let (fetched, took) = tokio::time::timeout(LIMIT, caller)
            .await
            .expect("every call is answered")
            .unwrap();
        seen[i].slowest = seen[i].slowest.max(took);
        match fetched {
            Ok(fetched) => seen[i].outcomes.push(fetched.outcome()),
            Err(error) => seen[i].errors.push(error.to_string()),
        }
    }
    seen
}

/// Reads `key` on `cache`, loading `value` if it must.
async fn read(cache: &Cache, key: &str, value: &'static str) -> (Bytes, Outcome) {
    let fetched = cache
        .fetch(key, move || async move {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(value.as_bytes())))
        })
        .await
        .unwrap();
    (fetched.value().cloned().unwrap(), fetched.outcome())
}

/// The partition and the slow link, in front of the first instance: each row a fault of every
/// connection of it.
const DEGRADING: &[(&str, Fault)] = &[
    ("partition", Fault::Blackhole),
    ("replies stalled", Fault::StallReplies),
    (
        "link slower than the store timeout",
        Fault::Delay {
            fixed: Duration::from_millis(300),
            jitter: Duration::from_millis(100),
        },
    ),
];

/// Issue 54, item 2: while one instance's path to the store is partitioned (or its replies
/// stall, or it is slower than `store_timeout`), every call of a stampede on it is answered,
/// none with an error, within `store_timeout` plus a load; it loads once for itself; the two
/// instances that reach the store keep one load among themselves; its breaker opens. Healed,
/// it recovers by itself, and the next stampede is one load across all three, with no
/// connection left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_path_answers_from_its_own_load_and_recovers() {
    let fleet = Fleet::start(BREAKER_FAILURES).await;
    let [cut, a, b] = [&fleet.caches[0], &fleet.caches[1], &fleet.caches[2]];
    let connections = fleet.proxy.open(Kind::All);
    for (round, (name, fault)) in DEGRADING.iter().enumerate() {
        fleet.proxy.set(Kind::All, *fault);
        let loads = [Counter::default(), Counter::default(), Counter::default()];
        let key = format!("degraded-{round}");
        let seen = stampede(&[cut, a, b], &key, 10, &loads).await;
        assert!(
            seen.iter().all(|seen| seen.errors.is_empty()),
            "{name}: {seen:?}"
        );
        let bound = STORE_TIMEOUT + LOAD + MARGIN;
        assert!(seen[0].slowest < bound, "{name}: {:?}", seen[0]);
        assert_eq!(
            loads[0].get(),
            1,
            "{name}: the degraded instance loads once"
        );
        assert_eq!(
            loads[1].get() + loads[2].get(),
            1,
            "{name}: one load among the others"
        );
        // Its calls keep failing: the breaker opens, and then costs no store timeout.
        let mut calls = 0;
        while cut.health().await.breaker_closed() {
            calls += 1;
            assert!(
                calls <= BREAKER_FAILURES * 2,
                "{name}: the breaker stays closed"
            );
            let asked = Instant::now();
            read(cut, &format!("{key}-{calls}"), "alone").await;
            assert!(asked.elapsed() < STORE_TIMEOUT + MARGIN, "{name}");
        }
        let health = cut.health().await;
        assert!(!health.is_healthy(), "{name}: {health:?}");

        fleet.proxy.heal();
        let recovered = until_health(cut, "healed", Health::is_healthy).await;
        eprintln!("{name}: breaker open after {calls} calls, healthy {recovered:?} after healing");
        let loads = [Counter::default(), Counter::default(), Counter::default()];
        let seen = stampede(&[cut, a, b], &format!("{key}-healed"), 10, &loads).await;
        assert!(
            seen.iter().all(|seen| seen.errors.is_empty()),
            "{name}: {seen:?}"
        );
        let total: usize = loads.iter().map(Counter::get).sum();
        assert_eq!(
            total, 1,
            "{name}: after healing, one load across the instances"
        );
        let held = locks_held(&fleet.server).await;
        assert!(held.is_empty(), "{name}: locks left behind: {held:?}");
        // A connection replaced during the fault is closed, not left beside its successor.
        let open = fleet.proxy.open(Kind::All);
        assert!(
            open <= connections,
            "{name}: {open} connections open, {connections} before"
        );
    }
    drop(fleet.server);
}

/// The lock keys that hold a leader's lock (its token: 32 hex digits, then `:`), where a
/// `fresh` or `failed` marker holds other bytes.
async fn locks_held(server: &RedisServer) -> Vec<String> {
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let names: Vec<String> = redis::cmd("KEYS")
        .arg("*:l")
        .query_async(&mut connection)
        .await
        .unwrap();
    let mut held = Vec::new();
    for name in names {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&name)
            .query_async(&mut connection)
            .await
            .unwrap();
        let is_lock =
            |v: &[u8]| v.len() > 32 && v[32] == b':' && v[..32].iter().all(u8::is_ascii_hexdigit);
        if value.as_deref().is_some_and(is_lock) {
            held.push(name);
        }
    }
    held
}

/// The subscriber's faults: its connection open, its bytes held (or only the server's), while
/// the instance's commands flow.
const SILENT: &[(&str, Fault)] = &[
    ("silent subscriber", Fault::Blackhole),
    ("subscriber's replies stalled", Fault::StallReplies),
];

/// Issue 54, item 2: while an instance's subscriber is silent, `health()` says notifications
/// are lost within the documented bound (a `PING` unanswered for a second, checked every
/// second: 2 s, plus the margin), and from then on a change made by another instance is never
/// served from its L1. Healed, it hears changes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscriber_stops_l1_trust_within_the_bound() {
    let fleet = Fleet::start(BREAKER_FAILURES).await;
    let [cut, other] = [&fleet.caches[0], &fleet.caches[1]];
    for (round, (name, fault)) in SILENT.iter().enumerate() {
        let key = format!("silent-{round}");
        read(cut, &key, "old").await;
        assert_eq!(read(cut, &key, "old").await.1, Outcome::L1Hit, "{name}");
        fleet.proxy.set(Kind::Subscriber, *fault);
        let silenced = Instant::now();
        other
            .set(key.as_str(), "new", Duration::from_secs(60))
            .await
            .unwrap();
        // The bound: the change may be served from L1 only until the silence is noticed.
        let bound = Duration::from_secs(2) + MARGIN;
        loop {
            let (value, _) = read(cut, &key, "old").await;
            if value == "new" {
                break;
            }
            assert!(
                silenced.elapsed() < bound,
                "{name}: the old value served {:?} after the change",
                silenced.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let noticed = until_health(cut, "the silence noticed", |health| {
            health.notifications_live() == Some(false)
        })
        .await;
        assert!(
            silenced.elapsed() < bound,
            "{name}: noticed {noticed:?} late"
        );
        let health = cut.health().await;
        assert!(
            !health.is_healthy() && health.store_answers(),
            "{name}: {health:?}"
        );
        // Every later change elsewhere is seen at once: L1 keeps nothing meanwhile.
        for version in ["newer", "newest"] {
            other
                .set(key.as_str(), version, Duration::from_secs(60))
                .await
                .unwrap();
            assert_eq!(read(cut, &key, "old").await.0, version, "{name}");
        }

        fleet.proxy.heal();
        until_health(cut, "healed", |health| {
            health.is_healthy() && health.notifications_live() == Some(true)
        })
        .await;
        assert_eq!(read(cut, &key, "old").await.0, "newest", "{name}");
        assert_eq!(read(cut, &key, "old").await.1, Outcome::L1Hit, "{name}");
        other
            .set(key.as_str(), "after", Duration::from_secs(60))
            .await
            .unwrap();
        let changed = Instant::now();
        while read(cut, &key, "old").await.0 != "after" {
            assert!(
                changed.elapsed() < bound,
                "{name}: the change was not heard"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Issue 54, item 2: a leader partitioned in the middle of its load. Its lock lapses (it can
/// renew nothing), another instance loads and fills; the partitioned leader's own callers get
/// its value, and when the partition heals, its fill and release, held in the network all
/// along, reach the server late and are fenced: the newer value stays.
///
/// The partitioned instance has no breaker: an open one would skip the fill, and leave
/// nothing late to fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_partitioned_mid_load_is_fenced_when_it_heals() {
    let fleet = Fleet::start(0).await;
    let mut server = fleet
        .server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let [cut, other, third] = [&fleet.caches[0], &fleet.caches[1], &fleet.caches[2]];
    let (started, start) = tokio::sync::oneshot::channel();
    let leader = tokio::spawn({
        let cut = cut.clone();
        async move {
            cut.get_or_load("fenced", || async move {
                let _ = started.send(());
                tokio::time::sleep(LOCK_TTL * 2).await;
                Ok::<_, std::io::Error>(Bytes::from_static(b"late"))
            })
            .await
        }
    });
    start.await.unwrap();
    fleet.proxy.set(Kind::All, Fault::Blackhole);
    let partitioned = Instant::now();

    let loads = Counter::default();
    let fetched = tokio::time::timeout(LIMIT, {
        let loads = loads.clone();
        other.fetch("fenced", move || async move {
            loads.hit();
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"newer")))
        })
    })
    .await
    .expect("answered")
    .unwrap();
    let took_over = partitioned.elapsed();
    assert_eq!(fetched.value().unwrap(), "newer");
    assert_eq!(fetched.outcome(), Outcome::Leader, "the lock lapsed");
    assert!(
        took_over < LOCK_TTL + MARGIN * 2,
        "took over after {took_over:?}"
    );
    let late = tokio::time::timeout(LIMIT, leader).await.unwrap().unwrap();
    assert_eq!(
        late.unwrap(),
        "late",
        "the partitioned leader's callers get its load"
    );

    // The held fill goes out now; what it would overwrite is checked once it has arrived.
    let scripts = calls(&mut server, "evalsha").await;
    fleet.proxy.heal();
    until_health(cut, "healed", Health::is_healthy).await;
    let healed = Instant::now();
    while calls(&mut server, "evalsha").await == scripts {
        assert!(
            healed.elapsed() < LIMIT,
            "the late fill never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (value, outcome) = read(third, "fenced", "third").await;
    assert_eq!(
        value, "newer",
        "the late fill overwrote the newer value ({outcome:?})"
    );
    assert_eq!(loads.get(), 1);
    // Healed, the partitioned instance reads the newer value too.
    assert_eq!(read(cut, "fenced", "cut").await.0, "newer");
    drop(fleet.server);
}

/// An instance's store over `store`, as [`instance`]'s, with the breaker of [`BREAKER_FAILURES`],
/// once it is healthy (its subscriber subscribed).
#[cfg(any(feature = "cluster", feature = "sentinel"))]
async fn healthy(store: RedisStore) -> Cache {
    let cache = Cache::builder(store)
        .namespace("network")
        .store_timeout(STORE_TIMEOUT)
        .lock_ttl(LOCK_TTL)
        .circuit_breaker(BREAKER_FAILURES, Duration::from_secs(1))
        .build();
    until_health(&cache, "subscribed", Health::is_healthy).await;
    cache
}

/// Issue 54, items 2 and 3, where the store finds the nodes' addresses itself (a Cluster's
/// slots, the sentinels' answer): `cut` reaches every node through `path` (its store's
/// resolver, and the sentinels' URLs), all of it partitioned at once. Every call of a
/// stampede on it is answered, none with an error, within `store_timeout` plus a load, by
/// its own load; the two others keep one load among themselves; its breaker opens. Healed,
/// the next stampede is one load across the three.
#[cfg(any(feature = "cluster", feature = "sentinel"))]
async fn partitioned_then_healed(cut: &Cache, others: [&Cache; 2], path: &PathProxies) {
    let [a, b] = others;
    path.set(Kind::All, Fault::Blackhole);
    let loads = [Counter::default(), Counter::default(), Counter::default()];
    let seen = stampede(&[cut, a, b], "partitioned", 10, &loads).await;
    assert!(seen.iter().all(|seen| seen.errors.is_empty()), "{seen:?}");
    assert!(
        seen[0].slowest < STORE_TIMEOUT + LOAD + MARGIN,
        "{:?}",
        seen[0]
    );
    assert_eq!(loads[0].get(), 1, "the partitioned instance loads once");
    assert_eq!(
        loads[1].get() + loads[2].get(),
        1,
        "one load among the others"
    );
    let mut calls = 0;
    while cut.health().await.breaker_closed() {
        calls += 1;
        assert!(calls <= BREAKER_FAILURES * 2, "the breaker stays closed");
        read(cut, &format!("partitioned-{calls}"), "alone").await;
    }

    path.heal();
    until_health(cut, "healed", Health::is_healthy).await;
    let loads = [Counter::default(), Counter::default(), Counter::default()];
    let seen = stampede(&[cut, a, b], "healed", 10, &loads).await;
    assert!(seen.iter().all(|seen| seen.errors.is_empty()), "{seen:?}");
    let total: usize = loads.iter().map(Counter::get).sum();
    assert_eq!(total, 1, "after healing, one load across the instances");
}

/// On a Redis Cluster, the partitioned instance's store dials every node through its resolver
/// (`RedisStoreBuilder::dns_resolver`): without it, no node would be proxied (the first
/// assertion) and the partition would cut nothing.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_instance_on_a_cluster_answers_from_its_own_load_and_recovers() {
    let cluster = support::RedisCluster::start();
    let path = PathProxies::new(54);
    let cut = RedisStore::cluster_builder(cluster.urls()).dns_resolver(path.clone());
    let cut = healthy(cut.connect().await.unwrap()).await;
    let mut others = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
        others.push(healthy(store).await);
    }
    let mut nodes = cluster.ports();
    nodes.sort_unstable();
    assert_eq!(
        path.upstreams(),
        nodes,
        "every node is reached through the path"
    );
    partitioned_then_healed(&cut, [&others[0], &others[1]], &path).await;
}

/// Over Sentinel, the partitioned instance asks the sentinels through its proxies to them (the
/// URLs it is given) and dials the primary they name through its resolver: without it, the
/// primary would not be proxied (the first assertion) and its data and subscriber
/// connections would not be cut.
#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_instance_over_sentinel_answers_from_its_own_load_and_recovers() {
    let topology = support::RedisSentinel::start();
    let path = PathProxies::new(54);
    let mut sentinels = Vec::new();
    for port in topology.sentinel_ports() {
        sentinels.push(format!("redis://127.0.0.1:{}/", path.proxy(port).await));
    }
    let cut =
        RedisStore::sentinel_builder(sentinels, topology.service()).dns_resolver(path.clone());
    let cut = healthy(cut.connect().await.unwrap()).await;
    let mut others = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::sentinel_builder(topology.sentinel_urls(), topology.service());
        others.push(healthy(store.connect().await.unwrap()).await);
    }
    assert!(
        path.upstreams().contains(&topology.primary_port()),
        "the primary is reached through the path: {:?}",
        path.upstreams()
    );
    partitioned_then_healed(&cut, [&others[0], &others[1]], &path).await;
}
