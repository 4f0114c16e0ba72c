//! The engine and the store on a real three-master Redis Cluster (feature `cluster`): each test
//! starts its own cluster on free ports.
#![cfg(feature = "cluster")]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use support::{start_leader, Counter, RedisCluster};
use tower_stampede::store::{LockState, LockToken, LockWhen, RedisStore, Store};
use tower_stampede::{Cache, CacheBuilder, Loaded, Outcome};

/// A process's view of the cluster: a store with connections (and a subscriber) of its own.
async fn instance(cluster: &RedisCluster) -> RedisStore {
    let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
    assert!(store.is_cluster());
    store
}

fn cache(store: RedisStore) -> CacheBuilder {
    Cache::builder(store).namespace("test")
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
    // on every node.
    let per_node = cluster.keys_per_node();
    assert_eq!(
        per_node.iter().sum::<usize>(),
        2 * keys.len(),
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
    let keys = keys_on_each_node(&cluster, &cache);
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
        assert!(!store.extend(&key, other, ttl).await.unwrap());
        assert!(store.extend(&key, token, ttl).await.unwrap());
        assert!(!store.release(&key, other).await.unwrap());
        assert!(!store.fill(&key, other, "x".into(), ttl).await.unwrap());
        assert!(store.fill(&key, token, "filled".into(), ttl).await.unwrap());
        let stored = store.get(&key).await.unwrap().unwrap();
        assert_eq!(stored.bytes, "filled");
        assert!(stored.ttl.is_some_and(|left| left <= ttl));
        store.put(&key, "put".into(), ttl).await.unwrap();
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

/// Three logical keys whose entries live on three different nodes.
fn keys_on_each_node(cluster: &RedisCluster, cache: &Cache) -> Vec<String> {
    let mut nodes = HashSet::new();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("key-{i}");
        if nodes.insert(cluster.node_of(&RedisStore::value_name(&cache.store_key(&key)))) {
            keys.push(key);
        }
        if nodes.len() == 3 {
            return keys;
        }
    }
    unreachable!("some key lands on every node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_on_a_cluster_are_woken_by_fills_on_any_node() {
    let cluster = RedisCluster::start();
    let leader = cache(instance(&cluster).await).build();
    // Polls would take a minute: only a notification can wake these followers in time.
    let follower = cache(instance(&cluster).await)
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
        .build();
    // The subscriber listens on one node; the fills happen on each of the three.
    for key in keys_on_each_node(&cluster, &leader) {
        let loads = Counter::default();
        let leading = start_leader(&leader, &key, &loads, "filled").await;
        let mut followers = Vec::new();
        for _ in 0..10 {
            let (follower, key) = (follower.clone(), key.clone());
            followers.push(tokio::spawn(async move {
                follower.fetch(key, never_called).await
            }));
        }
        for waiting in followers {
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
}

/// Invalidation on a cluster: `invalidate`, `set` and `invalidate_tag` (whose clock and
/// versions share a slot of their own) reach another instance's L1 through the cluster's
/// pub/sub, and a load overtaken by an invalidation cannot fill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_on_a_cluster_reaches_every_instance() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
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
