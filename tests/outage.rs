//! The engine while its store is down (issue 29): what L1 keeps then, what it forgets once the
//! store answers again, and what the health check says. Over the embedded store seen through
//! a wrapper that stops answering (on paused time), and over a real `redis-server` killed and
//! restarted (`tests/faults.rs` has the stampedes across processes).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::Counter;
use tower_stampede::store::{MemoryStore, Store};
use tower_stampede::{Cache, Loaded, Outcome};

/// One call of `key` that counts its loads, answered with `value`.
async fn call(cache: &Cache, key: &str, loads: &Counter, value: &'static str) -> Outcome {
    let loads = loads.clone();
    let fetched = cache
        .fetch(key, move || async move {
            loads.hit();
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(value.as_bytes())))
        })
        .await
        .unwrap();
    fetched.outcome()
}

/// The value of `k`, "reloaded" if it loads.
async fn read_k(cache: &Cache) -> Bytes {
    let reload = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"reloaded")) };
    cache.get_or_load("k", reload).await.unwrap()
}

/// Another process stores its value of `k`, "shared".
async fn store_shared(other: &Cache) {
    let loads = Counter::default();
    assert_eq!(call(other, "k", &loads, "shared").await, Outcome::Leader);
}

/// The embedded store behind a wrapper that can stop answering, and a cache over it with a
/// 50 ms store timeout, a 60 s TTL and a 10 s L1 cap.
fn stopping_store() -> (MemoryStore, Arc<Observed>, Cache) {
    let memory = MemoryStore::new();
    let inner: Arc<dyn Store> = Arc::new(memory.clone());
    let observed = Observed::new(&inner, Duration::ZERO);
    let cache = Cache::builder_shared(Arc::clone(&observed) as Arc<dyn Store>)
        .store_timeout(Duration::from_millis(50))
        .ttl(Duration::from_secs(60))
        .l1_ttl_cap(Duration::from_secs(10))
        .build();
    (memory, observed, cache)
}

/// While the store does not answer and its notifications are lost (a Redis whose subscriber
/// dropped), 20 sequential calls for one key cost one load: the value loaded with in-process
/// protection stays in L1, for the L1 cap at most. Before, L1 trusted nothing while
/// notifications were lost, and each call loaded again (20 loads).
#[tokio::test(start_paused = true)]
async fn while_the_store_is_down_one_load_per_key_per_l1_ttl() {
    let (memory, observed, cache) = stopping_store();
    observed.hang(true);
    memory.notifier().unwrap().lost();
    let loads = Counter::default();
    for _ in 0..20 {
        call(&cache, "k", &loads, "v1").await;
    }
    assert_eq!(loads.get(), 1, "one load while the store is down");
    // The L1 cap bounds how long the value is kept.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(call(&cache, "k", &loads, "v1").await, Outcome::Degraded);
    assert_eq!(loads.get(), 2, "loaded again once the L1 cap has passed");
}

/// Once the store answers again, L1 no longer serves what was loaded while it was down: no
/// notification vouches for it (the store may hold another value, filled by another process),
/// so the next call asks the store, even though notifications were never lost (a Redis that
/// stopped answering but kept its connections). Before, L1 served it until its TTL.
#[tokio::test(start_paused = true)]
async fn once_the_store_answers_again_l1_forgets_what_it_loaded_alone() {
    let (memory, observed, cache) = stopping_store();
    // Another process has stored its value (this one never read it).
    store_shared(&Cache::builder(memory.clone()).build()).await;
    observed.hang(true);
    let loads = Counter::default();
    assert_eq!(call(&cache, "k", &loads, "alone").await, Outcome::Degraded);
    assert_eq!(call(&cache, "k", &loads, "alone").await, Outcome::L1Hit);
    observed.hang(false);
    // Without traffic, the store is found answering again (a background check).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        read_k(&cache).await,
        "shared",
        "the store's value, not the one loaded alone"
    );
    assert_eq!(loads.get(), 1);
}

/// The same with a real Redis: killed, 20 sequential calls for one key load once; restarted,
/// the next call asks Redis again (and its value, written meanwhile by another process).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_one_load_per_key_and_back_l1_forgets_it() {
    use tower_stampede::store::RedisStore;
    let mut server = support::RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let cache = Cache::builder(store.clone())
        .namespace("outage")
        .store_timeout(Duration::from_millis(200))
        .build();
    let loads = Counter::default();
    // The subscription in place, as in a process that has been serving.
    call(&cache, "warm", &loads, "warm").await;
    let notifier = store.notifier().unwrap().clone();
    support::wait_until("notifications live", || notifier.receiving()).await;
    server.kill();
    support::wait_until("the subscriber saw Redis go", || !notifier.receiving()).await;
    let loads = Counter::default();
    for _ in 0..20 {
        call(&cache, "k", &loads, "alone").await;
    }
    assert_eq!(loads.get(), 1, "one load while Redis is down");

    server.restart();
    let other = RedisStore::connect(server.url()).await.unwrap();
    store_shared(&Cache::builder(other).namespace("outage").build()).await;
    support::wait_until("notifications back", || notifier.receiving()).await;
    let scratch = Counter::default();
    for attempt in 0.. {
        assert!(attempt < 400, "Redis never answered the cache again");
        let outcome = call(&cache, &format!("scratch-{attempt}"), &scratch, "x").await;
        if outcome != Outcome::Degraded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        read_k(&cache).await,
        "shared",
        "Redis's value, not the one loaded alone"
    );
}

/// The health check finds a store that stopped answering with no traffic at all: it asks the
/// store itself once the last answer is more than a second old. Then it finds it answering
/// again. `store_available()`, the breaker's state alone, stays `true` throughout.
#[tokio::test(start_paused = true)]
async fn the_health_check_finds_a_silent_store_without_traffic() {
    let (_memory, observed, cache) = stopping_store();
    let loads = Counter::default();
    call(&cache, "k", &loads, "v").await;
    assert!(cache.health().await.is_healthy());
    observed.hang(true);
    let health = cache.health().await;
    assert!(
        health.is_healthy(),
        "it answered within the second: {health:?}"
    );
    tokio::time::advance(Duration::from_millis(1500)).await;
    let health = cache.health().await;
    assert!(!health.is_healthy(), "{health:?}");
    assert!(!health.store_answers());
    assert!(health.last_answer_ago() >= Some(Duration::from_millis(1500)));
    assert_eq!(health.notifications_live(), Some(true));
    assert!(cache.store_available(), "the breaker alone does not know");
    observed.hang(false);
    let health = cache.health().await;
    assert!(health.is_healthy(), "{health:?}");
}

/// Lost notifications make the cache unhealthy, although the store answers.
#[tokio::test(start_paused = true)]
async fn lost_notifications_make_the_cache_unhealthy() {
    let (memory, _observed, cache) = stopping_store();
    memory.notifier().unwrap().lost();
    let health = cache.health().await;
    assert!(health.store_answers(), "{health:?}");
    assert_eq!(health.notifications_live(), Some(false));
    assert!(!health.is_healthy());
    memory.notifier().unwrap().restored();
    assert!(cache.health().await.is_healthy());
}

/// Redis killed while the cache is idle: the health check turns unhealthy, within a bounded
/// number of checks and with no other traffic; restarted, it turns healthy again by itself
/// (the subscription is made again and the connection is back).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_then_restarted_the_health_check_follows() {
    use tower_stampede::store::RedisStore;
    let mut server = support::RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let cache = Cache::builder(store)
        .namespace("health")
        .store_timeout(Duration::from_millis(200))
        .build();
    until_health(&cache, true).await;
    server.kill();
    until_health(&cache, false).await;
    server.restart();
    until_health(&cache, true).await;
}

/// Checks every 100 ms until the cache's health is `healthy`; panics after 30 s (a bound for
/// a busy machine, not an assertion on time).
#[cfg(feature = "redis")]
async fn until_health(cache: &Cache, healthy: bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let health = cache.health().await;
        if health.is_healthy() == healthy {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {health:?} after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
