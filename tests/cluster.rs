//! The engine and the store on a real three-master Redis Cluster (feature `cluster`): each test
//! starts its own cluster on free ports.
#![cfg(feature = "cluster")]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{free_port, stampede_of_200, start_leader, Counter, RedisCluster};
use tokio::sync::Notify;
use tower_stampede::store::StoreExt;
use tower_stampede::store::{CallLimit, LockState, LockToken, LockWhen, RedisStore, Store};
use tower_stampede::{Cache, CacheBuilder, Loaded, Outcome};

/// A process's view of the cluster: a store with connections (and a subscriber) of its own.
async fn instance(cluster: &RedisCluster) -> RedisStore {
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    assert!(store.is_cluster());
    store
}

fn cache(store: RedisStore) -> CacheBuilder {
    Cache::builder(store)
        .namespace("test")
        .store_timeout(support::PATIENT)
}

async fn never_called() -> Result<Loaded, std::io::Error> {
    panic!("this loader must not run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_over_four_instances_on_a_cluster_cost_one_load() {
    let cluster = RedisCluster::start();
    let mut instances = Vec::new();
    for _ in 0..4 {
        instances.push(cache(instance(&cluster).await).build());
    }
    let loads = Counter::default();
    let mut callers = Vec::new();
    for i in 0..1000 {
        let (cache, loads) = (instances[i % 4].clone(), loads.clone());
        callers.push(tokio::spawn(async move {
            cache
                .get_or_load("hot", move || async move {
                    loads.hit();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(b"the value"))
                })
                .await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "the value");
    }
    assert_eq!(loads.get(), 1, "backend loads");
    let loads_per_instance: u64 = instances.iter().map(|c| c.stats().loads).sum();
    assert_eq!(loads_per_instance, 1);
    let store_errors: u64 = instances.iter().map(|c| c.stats().store_errors).sum();
    assert_eq!(store_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_every_node_and_each_is_shared() {
    let cluster = RedisCluster::start();
    let writer = cache(instance(&cluster).await).build();
    let reader = cache(instance(&cluster).await).build();
    let keys: Vec<String> = (0..50).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        let value = Bytes::from(format!("value of {key}"));
        let fetched = writer
            .fetch(key, move || async move {
                Ok::<_, std::io::Error>(Loaded::value(value))
            })
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Leader, "{key}");
    }
    for key in &keys {
        let fetched = reader.fetch(key, never_called).await.unwrap();
        assert_eq!(fetched.outcome(), Outcome::L2Hit, "{key}");
        assert_eq!(fetched.value().unwrap(), format!("value of {key}").as_str());
    }
    // Two keys per logical key (the value, and the `fresh` marker that replaced the lock),
    // on every node, and the namespace's tag state (a process's first load reads the tag
    // clock, which starts it).
    let per_node = cluster.keys_per_node();
    assert_eq!(
        per_node.iter().sum::<usize>(),
        2 * keys.len() + 1,
        "{per_node:?}"
    );
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");

    // Every node forgets its scripts: the next calls load them again (NOSCRIPT) and work.
    cluster.flush_scripts();
    let late = cache(instance(&cluster).await).build();
    for key in &keys {
        let fetched = late.fetch(key, never_called).await.unwrap();
        assert_eq!(fetched.outcome(), Outcome::L2Hit, "{key}");
    }
    let fresh = late
        .fetch("after the flush", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded")))
        })
        .await
        .unwrap();
    assert_eq!(fresh.outcome(), Outcome::Leader);
    assert_eq!(late.stats().store_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_call_works_on_every_node() {
    let cluster = RedisCluster::start();
    let store = instance(&cluster).await;
    let cache = cache(store.clone()).build();
    let keys = keys_on_each_node(&cluster, &cache, "key");
    let ttl = Duration::from_secs(60);
    for key in keys {
        let key = cache.store_key(key);
        let (token, other) = (LockToken::random(), LockToken::random());
        let lookup = store
            .lookup(&key, token, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!((lookup.value, lookup.lock), (None, LockState::Acquired));
        let lookup = store
            .lookup(&key, other, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::HeldElsewhere);
        assert!(!store.extend(&[(key.clone(), other)], ttl).await.unwrap()[0]);
        assert!(store.extend(&[(key.clone(), token)], ttl).await.unwrap()[0]);
        assert!(!store.release(&key, other).await.unwrap());
        assert!(!store.fill(&key, other, "x".into(), ttl).await.unwrap());
        assert!(store.fill(&key, token, "filled".into(), ttl).await.unwrap());
        let stored = store.get(&key).await.unwrap().unwrap();
        assert_eq!(stored.bytes, "filled");
        assert!(stored.ttl.is_some_and(|left| left <= ttl));
        store.put(&key, "put".into(), ttl).await.unwrap();
        assert_eq!(store.get(&key).await.unwrap().unwrap().bytes, "put");
        // A load's answer for its waiters goes beside the value (a third key in its slot).
        let lookup = store
            .lookup(&key, token, ttl, LockWhen::LifeAtMost(ttl))
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Acquired);
        assert!(!store
            .answer_waiters(&key, other, "x".into(), ttl)
            .await
            .unwrap());
        assert!(store
            .answer_waiters(&key, token, "answer".into(), ttl)
            .await
            .unwrap());
        let answer = store.waiters_answer(&key).await.unwrap().unwrap();
        assert_eq!(answer.bytes, "answer");
        assert_eq!(store.get(&key).await.unwrap().unwrap().bytes, "put");
        // Nobody holds the lock now: a stale-enough value lets a lookup take it again.
        let lookup = store
            .lookup(&key, token, ttl, LockWhen::LifeAtMost(ttl))
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Acquired);
        assert_eq!(lookup.value.unwrap().bytes, "put");
        assert!(store.fail(&key, token, ttl).await.unwrap());
        let lookup = store
            .lookup(&key, other, ttl, LockWhen::LifeAtMost(ttl))
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Failed);
        assert!(!store.release(&key, token).await.unwrap());
    }
}

/// Three logical keys (`{prefix}-{i}`) whose entries live on three different masters.
fn keys_on_each_node(cluster: &RedisCluster, cache: &Cache, prefix: &str) -> Vec<String> {
    let mut nodes = HashSet::new();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("{prefix}-{i}");
        if nodes.insert(cluster.node_of(&RedisStore::value_name(&cache.store_key(&key)))) {
            keys.push(key);
        }
        if nodes.len() == 3 {
            return keys;
        }
    }
    unreachable!("some key lands on every node")
}

/// `invalidate_many` of keys on every master (and two keys in one slot's pipeline) removes
/// each, and another instance's L1 copies go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_many_reaches_keys_on_every_node() {
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let b = cache(instance(&cluster).await).build();
    let mut keys = keys_on_each_node(&cluster, &a, "many");
    keys.push(keys[0].clone());
    let loads = Counter::default();
    let read = |cache: &Cache, key: &str| {
        let (cache, key, loads) = (cache.clone(), key.to_owned(), loads.clone());
        async move {
            cache
                .get_or_load(&key, move || async move {
                    Ok::<_, std::io::Error>(Bytes::from(format!("load {}", loads.hit())))
                })
                .await
                .unwrap()
        }
    };
    for key in &keys[..3] {
        read(&a, key).await;
        read(&b, key).await;
    }
    assert_eq!(loads.get(), 3);
    a.invalidate_many(&keys).await.unwrap();
    for key in &keys[..3] {
        read(&a, key).await;
    }
    assert_eq!(loads.get(), 6, "each key gone from the store");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for key in &keys[..3] {
        // Loads 1 to 3 were before the invalidation.
        while read(&b, key).await.as_ref() <= b"load 3".as_slice() {
            assert!(tokio::time::Instant::now() < deadline, "{key}: still held");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(loads.get(), 6, "b reads a's reloads");
}

/// `clear` on a cluster: one store call (the namespace's tag state lives in one slot of its
/// own), after which keys on every master are misses for every instance, whose L1 copies go
/// through the cluster's pub/sub; each key is loaded once again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_reaches_keys_on_every_node_and_every_instance() {
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let b = cache(instance(&cluster).await).build();
    let keys = keys_on_each_node(&cluster, &a, "clear");
    let loads = Counter::default();
    for key in &keys {
        read_counted(&a, key, &loads).await;
        read_counted(&b, key, &loads).await;
    }
    assert_eq!(loads.get(), keys.len());
    let before = loads.get() as u64;
    a.clear().await.unwrap();
    for key in &keys {
        assert_eq!(a.get(key).await.unwrap(), None, "{key}: a miss at once");
    }
    reloaded_after(&b, &keys, &loads, before).await;
    reloaded_after(&a, &keys, &loads, before).await;
    assert_eq!(loads.get(), 2 * keys.len(), "each key reloaded once");
}

/// Reads `key` through `cache`, loading `load {n}` (n counted by `loads`) on a miss.
async fn read_counted(cache: &Cache, key: &str, loads: &Counter) -> Bytes {
    let loads = loads.clone();
    cache
        .get_or_load(key, move || async move {
            Ok::<_, std::io::Error>(Bytes::from(format!("load {}", loads.hit())))
        })
        .await
        .unwrap()
}

/// Waits until `cache` reads a load of each key newer than load `before` (its L1 copy gone
/// with the invalidation's notification), for at most 10 s.
async fn reloaded_after(cache: &Cache, keys: &[String], loads: &Counter, before: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for key in keys {
        loop {
            let read = read_counted(cache, key, loads).await;
            let n: u64 = std::str::from_utf8(&read)
                .ok()
                .and_then(|read| read.strip_prefix("load "))
                .and_then(|n| n.parse().ok())
                .unwrap();
            if n > before {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{key}: still held");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// 60 keys named after `prefix`, which land on every master (many slots on each).
fn sixty_on_every_master(cluster: &RedisCluster, cache: &Cache, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = (0..60).map(|i| format!("{prefix}-{i}")).collect();
    let masters: HashSet<u16> = keys
        .iter()
        .map(|key| cluster.node_of(&RedisStore::value_name(&cache.store_key(key))))
        .collect();
    assert_eq!(masters.len(), 3, "the keys are on every master");
    keys
}

/// What `call` answers, and the reads each master made while it ran less what asking costs
/// (a connection's handshake and the `INFO`), with the figures for a failure's message.
async fn reads_during<T>(
    cluster: &RedisCluster,
    call: impl std::future::Future<Output = T>,
) -> (T, Vec<u64>, String) {
    let reads_between = |before: &[u64], after: &[u64]| -> Vec<u64> {
        after.iter().zip(before).map(|(a, b)| a - b).collect()
    };
    let (first, second) = (cluster.reads_per_node(), cluster.reads_per_node());
    let asking = reads_between(&first, &second);
    let before = cluster.reads_per_node();
    let answer = call.await;
    let after = cluster.reads_per_node();
    let reads = reads_between(&before, &after);
    let pipelines = reads.iter().zip(&asking).map(|(r, a)| r - a).collect();
    (answer, pipelines, format!("{reads:?}, asking {asking:?}"))
}

/// Issue 28, item 3: an `invalidate_many` of 60 keys spread over every master (many slots on
/// each) costs each master exactly one read: one pipeline per node, not one per slot. Each
/// key is gone from the store (the next read loads) and from another instance's L1 (the
/// notifications went out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_many_sends_one_pipeline_per_master() {
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let b = cache(instance(&cluster).await).build();
    let keys = sixty_on_every_master(&cluster, &a, "per-node");
    let loads = Counter::default();
    // A first invalidation readies what a store learns once (scripts, the cluster's layout).
    a.invalidate_many(&keys).await.unwrap();
    for key in &keys {
        read_counted(&a, key, &loads).await;
        read_counted(&b, key, &loads).await;
    }
    assert_eq!(loads.get(), 60);
    let (invalidated, pipelines, detail) = reads_during(&cluster, a.invalidate_many(&keys)).await;
    invalidated.unwrap();
    assert_eq!(pipelines, vec![1, 1, 1], "reads per master ({detail})");
    for key in &keys {
        read_counted(&a, key, &loads).await;
    }
    assert_eq!(loads.get(), 120, "each key gone from the store");
    reloaded_after(&b, &keys, &loads, 60).await;
    assert_eq!(loads.get(), 120, "b reads a's reloads");
}

/// Issue 28, item 3: a store whose idea of the cluster's layout is stale (a slot moved to
/// another master after it last looked) still invalidates every key: the master it sends a
/// pipeline to serves some of its keys and answers `MOVED` for the one whose slot moved
/// (redis-rs follows it with the whole pipeline, which the new master refuses in part, until
/// it gives up with the `MOVED`), and the store sends those calls again, each on its own, to
/// where its slot now is, and returns `Ok`. Another instance fills the keys
/// after the move, so the moved key's value is on its new master, and must be gone from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_many_lands_after_a_slot_moved() {
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let keys: Vec<String> = (0..30).map(|i| format!("moved-{i}")).collect();
    a.invalidate_many(&keys).await.unwrap();
    let node_of = |key: &str| cluster.node_of(&RedisStore::value_name(&a.store_key(key)));
    let from = node_of(&keys[0]);
    let staying = keys[1..].iter().filter(|key| node_of(key) == from).count();
    assert!(staying > 0, "the moved key shares its pipeline with others");
    let to = *cluster.ports().iter().find(|port| **port != from).unwrap();
    let moved = RedisStore::value_name(&a.store_key(&keys[0]));
    cluster.move_empty_slot(cluster.slot_of(&moved), to);
    assert_eq!(cluster.node_of(&moved), to);
    let b = cache(instance(&cluster).await).build();
    let loads = Counter::default();
    for key in &keys {
        read_counted(&b, key, &loads).await;
    }
    assert_eq!(loads.get(), 30);
    a.invalidate_many(&keys).await.unwrap();
    reloaded_after(&b, &keys, &loads, 30).await;
    assert_eq!(
        loads.get(),
        60,
        "each key invalidated once, the moved one too"
    );
}

/// Issue 29, item 6: an app can start while its Redis Cluster is down. Stores made with
/// `open` before any node runs are returned at once; their calls fail at once, so the engine
/// loads with in-process protection (one load per key per instance); once the cluster is up,
/// each store connects by itself (its health check turns healthy), and a stampede over two
/// instances is one load. `connect` still fails fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opened_before_the_cluster_starts_connect_when_it_does() {
    let ports = [free_port(), free_port(), free_port()];
    let urls: Vec<String> = ports
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}/"))
        .collect();
    assert!(
        RedisStore::connect_cluster(urls.clone()).await.is_err(),
        "connect fails fast"
    );
    let instances: Vec<Cache> = (0..2)
        .map(|_| {
            let store = RedisStore::cluster_builder(urls.clone()).open().unwrap();
            assert!(store.is_cluster());
            cache(store).build()
        })
        .collect();
    let loads = Counter::default();
    for cache in &instances {
        for _ in 0..5 {
            read_counted(cache, "while-down", &loads).await;
        }
        assert!(!cache.health().await.is_healthy());
    }
    assert_eq!(
        loads.get(),
        2,
        "one load per instance while the cluster is down"
    );

    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_on(ports))
        .await
        .unwrap();
    for (n, cache) in instances.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !cache.health().await.is_healthy() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "instance {n} never connected"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let loads = [Counter::default(), Counter::default()];
    stampede_of_200(&instances, "opened", &loads, &Arc::new(Notify::new())).await;
    assert_eq!(
        loads[0].get() + loads[1].get(),
        1,
        "one load across the instances"
    );
    drop(cluster);
}

/// A follower is woken by a fill on any node, published with sharded pub/sub (the default) or
/// by a store that does not shard (as an older release, or `sharded_notifications(false)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_on_a_cluster_are_woken_by_fills_on_any_node() {
    let cluster = RedisCluster::start();
    let sharded = cache(instance(&cluster).await).build();
    let classic = RedisStore::cluster_builder(cluster.urls())
        .sharded_notifications(false)
        .connect()
        .await
        .unwrap();
    let classic = cache(classic).build();
    // Polls would take a minute: only a notification can wake these followers in time.
    let follower = cache(instance(&cluster).await)
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
        .build();
    // The fills happen on each of the three nodes, from each leader.
    let keys = keys_on_each_node(&cluster, &sharded, "key")
        .into_iter()
        .map(|key| (key, &sharded))
        .chain(
            keys_on_each_node(&cluster, &sharded, "classic")
                .into_iter()
                .map(|key| (key, &classic)),
        );
    for (key, leader) in keys {
        fill_wakes_followers(leader, &[&follower], &key).await;
    }
}

/// A fill of `key` by `leader` (a 300 ms load) wakes followers in each of `followers` (whose
/// polls are a minute apart), which answer with the filled value.
async fn fill_wakes_followers(leader: &Cache, followers: &[&Cache], key: &str) {
    let loads = Counter::default();
    let leading = start_leader(leader, key, &loads, "filled").await;
    let mut waiting = Vec::new();
    for follower in followers {
        for _ in 0..10 {
            let (follower, key) = ((*follower).clone(), key.to_owned());
            waiting.push(tokio::spawn(async move {
                follower.fetch(key, never_called).await
            }));
        }
    }
    for waiting in waiting {
        // A failure guard only: a poll would come after 30 s at the earliest.
        let fetched = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .unwrap_or_else(|_| panic!("{key}: follower not woken by the fill"))
            .unwrap()
            .unwrap();
        assert_eq!(fetched.value().unwrap(), "filled", "{key}");
        assert_eq!(fetched.outcome(), Outcome::Follower, "{key}");
    }
    assert_eq!(leading.await.unwrap().unwrap(), "filled");
    assert_eq!(loads.get(), 1, "{key}");
}

/// Invalidation on a cluster: `invalidate`, `set` and `invalidate_tag` (whose clock and
/// versions share a slot of their own) reach another instance's L1 through the cluster's
/// pub/sub, and a load overtaken by an invalidation cannot fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_on_a_cluster_reaches_every_instance() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let b = cache(instance(&cluster).await).build();
    let version = Arc::new(AtomicU32::new(1));
    let read = |cache: &Cache, key: &'static str| {
        let (cache, version) = (cache.clone(), Arc::clone(&version));
        async move {
            cache
                .fetch(key, move || async move {
                    let v = version.load(Ordering::SeqCst);
                    Ok::<_, std::io::Error>(
                        Loaded::value(Bytes::from(format!("v{v}"))).tags(["group"]),
                    )
                })
                .await
                .unwrap()
                .into_value()
                .unwrap()
        }
    };
    let until = |cache: Cache, key: &'static str, want: &'static str| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while read(&cache, key).await != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key}: never {want}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    for key in ["one", "two"] {
        assert_eq!(read(&a, key).await, "v1");
        assert_eq!(read(&b, key).await, "v1");
    }
    version.store(2, Ordering::SeqCst);
    a.invalidate("one").await.unwrap();
    until(b.clone(), "one", "v2").await;
    b.set("one", Bytes::from_static(b"set"), Duration::from_secs(60))
        .await
        .unwrap();
    until(a.clone(), "one", "set").await;
    version.store(3, Ordering::SeqCst);
    b.invalidate_tag("group").await.unwrap();
    until(a.clone(), "two", "v3").await;
    until(b.clone(), "two", "v3").await;
}

/// Issue 15 #4: a master killed (SIGKILL) during stampedes over 4 instances. While its slots
/// move, no caller gets an error and each instance loads at most once per stampede (the store
/// fails, so each falls back to in-process protection); once its replica is promoted, a
/// stampede costs exactly one load again, and a fill in one instance wakes followers in the
/// others (whose polls would come after a minute) on every master, the promoted one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_during_stampedes_fails_over_without_errors() {
    let mut cluster = RedisCluster::start_with_replicas();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(instance(&cluster).await);
    }
    // A store timeout for a busy machine: the failover, not the latency, is under test. Not
    // 250 ms: the first follower lookups on a just-promoted master run the lookup script,
    // which that master has never seen (NOSCRIPT, then the script itself), and on two cores
    // busy with the suite those round trips took longer, so followers loaded on their own
    // (3 loads after the promotion, 2 in about 20 runs).
    let instances: Vec<Cache> = stores
        .iter()
        .map(|store| cache(store.clone()).store_timeout(support::PATIENT).build())
        .collect();
    // The same processes (same stores, so the same subscribers), with followers that only a
    // notification can wake in time.
    let patient: Vec<Cache> = stores
        .iter()
        .map(|store| {
            cache(store.clone())
                .store_timeout(support::PATIENT)
                .backoff(Duration::from_secs(60), Duration::from_secs(60))
                .wait_timeout(Duration::from_secs(120))
                .build()
        })
        .collect();
    let value_name = |key: &str| RedisStore::value_name(&instances[0].store_key(key));
    let victim = cluster.node_of(&value_name("key-0"));
    // Keys whose slots the victim serves.
    let keys: Vec<String> = (0..)
        .map(|i| format!("key-{i}"))
        .filter(|key| cluster.node_of(&value_name(key)) == victim)
        .take(40)
        .collect();
    let mut keys = keys.into_iter();
    let loads: Vec<Counter> = (0..4).map(|_| Counter::default()).collect();
    let per_instance = |loads: &[Counter]| loads.iter().map(Counter::get).collect::<Vec<_>>();
    let started = Arc::new(Notify::new());

    // A stampede on the victim's slots, before anything fails: one load.
    stampede_of_200(&instances, &keys.next().unwrap(), &loads, &started).await;
    assert_eq!(per_instance(&loads).iter().sum::<usize>(), 1);

    // The victim is killed while a stampede's leader loads.
    let key = keys.next().unwrap();
    let before = per_instance(&loads);
    let running = tokio::spawn({
        let (instances, key, loads, started) = (
            instances.clone(),
            key.clone(),
            loads.clone(),
            Arc::clone(&started),
        );
        async move { stampede_of_200(&instances, &key, &loads, &started).await }
    });
    started.notified().await;
    let killed = cluster.kill_master_of(&value_name(&key));
    eprintln!("killed the master on port {killed} while {key} loaded");
    running.await.unwrap();
    let after = per_instance(&loads);
    for (instance, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(
            a - b <= 1,
            "{key}: instance {instance} loaded {} times",
            a - b
        );
    }

    // Stampedes while the slots move: no errors, at most one load per instance each.
    let promoting = {
        let (cluster, key) = (Arc::new(cluster), value_name(&key));
        let promoted = tokio::task::spawn_blocking({
            let cluster = Arc::clone(&cluster);
            move || cluster.wait_promoted(&key, Duration::from_secs(30))
        });
        (cluster, promoted)
    };
    let (cluster, promoted) = promoting;
    let mut during = 0;
    while !promoted.is_finished() {
        let key = keys
            .next()
            .expect("the failover took more than 38 stampedes");
        let before = per_instance(&loads);
        stampede_of_200(&instances, &key, &loads, &started).await;
        for (instance, (b, a)) in before.iter().zip(&per_instance(&loads)).enumerate() {
            assert!(
                a - b <= 1,
                "{key}: instance {instance} loaded {} times",
                a - b
            );
        }
        during += 1;
    }
    let new_master = promoted.await.unwrap();
    eprintln!("port {new_master} serves the slots after {during} stampedes meanwhile");
    assert_ne!(new_master, victim);
    assert!(during > 0, "no stampede ran during the failover");

    // Each instance finds the promoted master (its breaker closed, its slot map refreshed):
    // a load of a key of its own, on a slot the promoted master serves (a key on another
    // master would say nothing of the way to it), leads and fills. Bounded; it takes a few
    // calls at most.
    for (n, cache) in instances.iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let mut probes = (0..)
            .map(|attempt| format!("probe-{n}-{attempt}"))
            .filter(|probe| cluster.node_of(&value_name(probe)) == new_master);
        loop {
            let probe = probes.next().expect("keys without end");
            let fetched = cache
                .fetch(&probe, || async {
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"probe")))
                })
                .await
                .unwrap();
            if fetched.outcome() == Outcome::Leader {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "instance {n} never reached the promoted master"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    eprintln!("every instance reaches the promoted master");
    // After the promotion: one load per stampede, and no store errors.
    let errors = |caches: &[Cache]| caches.iter().map(|c| c.stats().store_errors).sum::<u64>();
    for _ in 0..3 {
        let key = keys.next().unwrap();
        let (before, errors_before) = (per_instance(&loads), errors(&instances));
        stampede_of_200(&instances, &key, &loads, &started).await;
        let added: usize =
            per_instance(&loads).iter().sum::<usize>() - before.iter().sum::<usize>();
        assert_eq!(added, 1, "{key}: loads after the promotion");
        assert_eq!(errors(&instances), errors_before, "{key}: store errors");
    }

    // Notifications work again, on every master: wait (bounded) until each instance's
    // subscriber is back in place, then a fill in instance 0 wakes followers in 1, 2 and 3.
    for key in keys_on_each_node(&cluster, &instances[0], "notified") {
        let digest = *instances[0].store_key(&key).digest();
        for (n, store) in stores.iter().enumerate() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            // A lookup (of a key not in L1) subscribes again where the subscription was lost.
            for attempt in 0.. {
                if store.notifier().unwrap().stamp(&digest).is_some() {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "instance {n}: notifications never came back"
                );
                let resubscribe = format!("resubscribe-{n}-{attempt}");
                instances[n]
                    .get_or_load(&resubscribe, || async {
                        Ok::<_, std::io::Error>(Bytes::from_static(b"x"))
                    })
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        eprintln!("{key}: every subscriber is in place");
        let followers: Vec<&Cache> = patient[1..].iter().collect();
        fill_wakes_followers(&patient[0], &followers, &key).await;
    }
}

/// Fills of 60 new keys, spread over `instances`, and the cluster-bus pub/sub messages they
/// cost, per fill. Every instance has subscribed first (a lookup watches its key).
async fn bus_messages_per_fill(cluster: &RedisCluster, instances: &[Cache]) -> f64 {
    for (n, cache) in instances.iter().enumerate() {
        cache
            .get_or_load(format!("warm-{n}"), || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"warm"))
            })
            .await
            .unwrap();
    }
    let settled = |cluster: &RedisCluster| {
        // The bus delivers asynchronously: read until two reads 200 ms apart agree (bounded).
        let mut last = cluster.bus_publish_messages();
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(200));
            let now = cluster.bus_publish_messages();
            if now == last {
                return now;
            }
            last = now;
        }
        panic!("the cluster bus never settled");
    };
    let before = settled(cluster);
    let fills = 60;
    for i in 0..fills {
        let fetched = instances[i % instances.len()]
            .fetch(format!("filled-{i}"), || async {
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
            })
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Leader);
    }
    let messages = settled(cluster) - before;
    messages as f64 / fills as f64
}

/// Four instances on `cluster`, publishing with sharded pub/sub or not.
async fn instances(cluster: &RedisCluster, sharded: bool, namespace: &str) -> Vec<Cache> {
    let mut instances = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::cluster_builder(cluster.urls())
            .sharded_notifications(sharded)
            .connect()
            .await
            .unwrap();
        instances.push(Cache::builder(store).namespace(namespace).build());
    }
    instances
}

/// Issue 16 #9: how many messages a fill costs the cluster's nodes. Classic `PUBLISH` is
/// broadcast over the cluster bus to every other node (2 messages per fill on three masters,
/// 5 with a replica each); sharded `SPUBLISH` stays within the key's shard (none without
/// replicas, 1 with). Each instance's subscriber gets the fill once either way. Prints the
/// figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_is_not_broadcast_to_every_node() {
    for (cluster, nodes, classic_at_least, sharded_at_most) in [
        (RedisCluster::start(), 3, 2.0, 0.0),
        (RedisCluster::start_with_replicas(), 6, 5.0, 1.0),
    ] {
        let classic = bus_messages_per_fill(&cluster, &instances(&cluster, false, "c").await).await;
        let sharded = bus_messages_per_fill(&cluster, &instances(&cluster, true, "s").await).await;
        eprintln!("{nodes} nodes: cluster-bus messages per fill: classic {classic:.2}, sharded {sharded:.2}");
        assert!(
            classic >= classic_at_least,
            "{nodes} nodes: classic {classic:.2}"
        );
        assert!(
            sharded <= sharded_at_most,
            "{nodes} nodes: sharded {sharded:.2}"
        );
    }
}

/// A cluster without sharded pub/sub (as before Redis 7.0: `SPUBLISH` and `SSUBSCRIBE` renamed
/// away): the scripts fall back to `PUBLISH`, the subscriber to the classic channel, and a fill
/// on any node still wakes followers in another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sharded_pubsub_notifications_use_classic_pubsub() {
    let cluster = RedisCluster::start_without_sharded_pubsub();
    let leader = cache(instance(&cluster).await).build();
    let follower = cache(instance(&cluster).await)
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
        .build();
    for key in keys_on_each_node(&cluster, &leader, "key") {
        fill_wakes_followers(&leader, &[&follower], &key).await;
    }
    let classic = bus_messages_per_fill(&cluster, &instances(&cluster, true, "s").await).await;
    assert!(classic >= 2.0, "classic {classic:.2}");
}

/// Issue 34, item 1: the lookup of a batch of 60 keys spread over every master (many slots
/// on each) costs each master one read: one pipeline per node, not one per key or slot. And
/// the batch's loader is called once, with exactly the keys that are missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_looks_up_with_one_pipeline_per_master() {
    let cluster = RedisCluster::start();
    let a = cache(instance(&cluster).await).build();
    let b = cache(instance(&cluster).await).build();
    let keys = sixty_on_every_master(&cluster, &a, "batch");
    let loads = Counter::default();
    for key in &keys {
        read_counted(&b, key, &loads).await;
    }
    let no_load = |_: Vec<String>| async {
        Err::<std::collections::HashMap<String, Bytes>, _>(std::io::Error::other("no load"))
    };
    // A first batch readies what a store learns once (the layout, the subscription, and the
    // namespace's generation, which a stored value is checked against).
    read_counted(&b, "ready", &loads).await;
    let ready = a.get_many_or_load(["ready".to_owned()], no_load).await;
    assert!(ready["ready"].is_ok());
    let (found, pipelines, detail) =
        reads_during(&cluster, a.get_many_or_load(keys.clone(), no_load)).await;
    assert_eq!(pipelines, vec![1, 1, 1], "reads per master ({detail})");
    for key in &keys {
        assert_eq!(
            found[key].as_ref().unwrap(),
            &read_counted(&b, key, &loads).await
        );
    }
    // Ten of them gone: a third process's batch loads exactly those, once.
    b.invalidate_many(&keys[..10]).await.unwrap();
    let c = cache(instance(&cluster).await).build();
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let found = c
        .get_many_or_load(keys.clone(), {
            let asked = Arc::clone(&asked);
            move |missing: Vec<String>| {
                asked.lock().unwrap().push(missing.clone());
                async move {
                    let values = missing.into_iter().map(|k| (k, Bytes::from("reloaded")));
                    Ok::<_, std::io::Error>(values.collect::<std::collections::HashMap<_, _>>())
                }
            }
        })
        .await;
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "one loader call");
    let (mut loaded, mut gone) = (asked[0].clone(), keys[..10].to_vec());
    loaded.sort();
    gone.sort();
    assert_eq!(loaded, gone, "exactly the missing keys");
    for key in &keys[..10] {
        assert_eq!(found[key].as_ref().unwrap(), "reloaded");
    }
}

/// A master stalls (`SIGSTOP`) while the other two answer: a call to one of its keys ends
/// (within ten store timeouts, since the cluster answers others meanwhile) and its flight
/// loads with in-process protection; keys on the other masters are loaded and answered all
/// along, and the breaker stays closed. Once the master is back, its key is shared again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_fails_its_calls_while_the_others_answer() {
    let cluster = RedisCluster::start();
    let filler = cache(instance(&cluster).await).build();
    let keys = keys_on_each_node(&cluster, &filler, "stall");
    for key in &keys {
        filler
            .get_or_load(key.as_str(), || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"stored"))
            })
            .await
            .unwrap();
    }
    let stalled = cluster.node_of(&RedisStore::value_name(&filler.store_key(&keys[0])));
    let stalling = Cache::builder(instance(&cluster).await)
        .namespace("test")
        .store_timeout(Duration::from_millis(100))
        .build();
    // Twenty keys on the other two masters, each asked once (no copy in L1 yet: from the store).
    let elsewhere: Vec<String> = (0..)
        .map(|i| format!("elsewhere-{i}"))
        .filter(|key| cluster.node_of(&RedisStore::value_name(&stalling.store_key(key))) != stalled)
        .take(20)
        .collect();
    cluster.pause(stalled, true);
    let others = async {
        for key in &elsewhere {
            let fetched = stalling.fetch(key.as_str(), || async {
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded")))
            });
            let fetched = fetched.await.unwrap();
            assert_eq!(fetched.outcome(), Outcome::Leader, "{key}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let held = stalling.fetch(keys[0].as_str(), || async {
        Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded alone")))
    });
    let (held, ()) = tokio::join!(held, others);
    let held = held.unwrap();
    assert_eq!(held.value().unwrap(), "loaded alone");
    assert_eq!(held.outcome(), Outcome::Degraded);
    let stats = stalling.stats();
    // The held call, and (on the master that holds the namespace's tag clock) the clock
    // reads of this new process's loads; never enough in a row to open the breaker.
    assert!(stats.store_errors >= 1, "{stats:?}");
    assert_eq!(stats.breaker_opened, 0, "{stats:?}");
    cluster.pause(stalled, false);
    let other = cache(instance(&cluster).await).build();
    let shared = other.fetch(keys[0].as_str(), never_called).await.unwrap();
    assert_eq!(shared.value().unwrap(), "stored");
}

/// On a cluster the client queues every call in one queue of 100 before it routes it, and a
/// call's store timeout would run while it waits there: a burst of 1,000 cold keys keeps at
/// most 48 lookups out at once (`RedisStore`'s `CallLimit`, 96, halved between lookups and
/// the calls of flights past their lookup), the others waiting in the engine, their timeout
/// not yet running. (With 256 out at once, 32 processes over 10,000 cold keys on two cores
/// loaded 14,000 to 28,000 times; with 48, 10,000.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_cluster_keeps_within_the_clients_queue() {
    let cluster = RedisCluster::start();
    let store: Arc<dyn Store> = Arc::new(instance(&cluster).await);
    assert_eq!(store.call_limit().map(CallLimit::calls), Some(96));
    let observed = Observed::new(&store, Duration::from_millis(5));
    let cache = Cache::builder_shared(observed.clone())
        .namespace("test")
        .store_timeout(support::PATIENT)
        .build();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..1_000 {
        let cache = cache.clone();
        calls.spawn(async move {
            let load = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"v")) };
            cache.get_or_load(format!("cold-{key}"), load).await
        });
    }
    for answer in calls.join_all().await {
        assert_eq!(answer.unwrap(), "v");
    }
    assert_eq!(observed.most_lookups_out(), 48);
    assert_eq!(cache.stats().loads, 1_000);
}

/// A store made from the nodes' connection settings as the application's own clients hold
/// them (`redis::Client::get_connection_info`): one load for a stampede over two processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_from_the_apps_connection_settings_share_one_load() {
    let cluster = RedisCluster::start();
    let clients: Vec<redis::Client> = cluster
        .urls()
        .iter()
        .map(|url| redis::Client::open(url.as_str()).unwrap())
        .collect();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let infos = clients
            .iter()
            .map(|client| client.get_connection_info().clone());
        let store = RedisStore::cluster_info_builder(infos)
            .connect()
            .await
            .unwrap();
        assert!(store.is_cluster());
        instances.push(cache(store).build());
    }
    let loads = Counter::default();
    let callers: Vec<_> = (0..100)
        .map(|i| {
            let (cache, loads) = (instances[i % 2].clone(), loads.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load("hot", move || async move {
                        loads.hit();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "v");
    }
    assert_eq!(loads.get(), 1);
}
