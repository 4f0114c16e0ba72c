//! The engine end to end, over both stores: the embedded `MemoryStore` and (feature `redis`) a
//! real `redis-server`. Tests that depend on timing run over `MemoryStore` on paused tokio
//! time (`timed_test!`); Redis keeps its own clock, so its runs take real time.

mod defects;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "redis")]
use redis::AsyncCommands;
use support::observed::Observed;
use support::{
    stale_while_one_refreshes, start_leader, timed_test, wait_until, Backing, Counter, Shared,
};
use tokio::sync::Notify;
#[cfg(feature = "redis")]
use tower_stampede::store::RedisStore;
use tower_stampede::store::{LockState, LockToken, LockWhen, MemoryStore, Store};
use tower_stampede::{Cache, ErrorKind, Loaded, Outcome, WaitTimeoutPolicy};

/// Bytes written behind the engine's back.
trait WriteRaw {
    /// Writes raw bytes under a key's value name.
    async fn write_raw(&self, cache: &Cache, key: &str, bytes: &[u8]);
}

impl WriteRaw for Shared {
    async fn write_raw(&self, cache: &Cache, key: &str, bytes: &[u8]) {
        let store_key = cache.store_key(key);
        match &self.backing {
            #[cfg(feature = "redis")]
            Backing::Redis(server) => {
                let mut conn = server
                    .client()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let _: () = conn
                    .set_ex(RedisStore::value_name(&store_key), bytes, 60)
                    .await
                    .unwrap();
            }
            Backing::Memory(memory) => memory
                .put(
                    &store_key,
                    Bytes::copy_from_slice(bytes),
                    Duration::from_secs(60),
                )
                .await
                .map(drop)
                .unwrap(),
        }
    }
}

fn slow_value(
    counter: &Counter,
    delay: Duration,
    value: &'static str,
) -> impl FnOnce() -> futures_ready::Load + Send + 'static {
    let counter = counter.clone();
    move || {
        Box::pin(async move {
            counter.hit();
            tokio::time::sleep(delay).await;
            Ok(Bytes::from_static(value.as_bytes()))
        })
    }
}

mod futures_ready {
    use std::future::Future;
    use std::pin::Pin;

    pub type Load = Pin<Box<dyn Future<Output = Result<bytes::Bytes, std::io::Error>> + Send>>;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_callers_over_four_instances_cost_one_load() {
    for shared in Shared::both().await {
        let instances: Vec<Cache> = (0..4).map(|_| shared.cache().build()).collect();
        let loads = Counter::default();
        let mut callers = Vec::new();
        for i in 0..1000 {
            let cache = instances[i % 4].clone();
            let load = slow_value(&loads, Duration::from_millis(100), "the value");
            callers.push(tokio::spawn(
                async move { cache.get_or_load("hot", load).await },
            ));
        }
        for caller in callers {
            assert_eq!(
                caller.await.unwrap().unwrap(),
                "the value",
                "{}",
                shared.name
            );
        }
        assert_eq!(loads.get(), 1, "{}: backend loads", shared.name);
        let loads_per_instance: u64 = instances.iter().map(|c| c.stats().loads).sum();
        assert_eq!(loads_per_instance, 1, "{}", shared.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_come_from_l1_then_from_the_store() {
    for shared in Shared::both().await {
        let a = shared.cache().build();
        let b = shared.cache().build();
        let loads = Counter::default();
        let first = a
            .fetch("k", {
                let loads = loads.clone();
                move || async move {
                    loads.hit();
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
                }
            })
            .await
            .unwrap();
        assert_eq!(first.outcome(), Outcome::Leader, "{}", shared.name);
        let again = a.fetch("k", never_called).await.unwrap();
        assert_eq!(again.outcome(), Outcome::L1Hit, "{}", shared.name);
        let other = b.fetch("k", never_called).await.unwrap();
        assert_eq!(other.outcome(), Outcome::L2Hit, "{}", shared.name);
        assert_eq!(other.value().unwrap(), "v");
        assert_eq!(loads.get(), 1);
    }
}

async fn never_called() -> Result<Loaded, std::io::Error> {
    panic!("this loader must not run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_leader_still_fills_the_cache() {
    for shared in Shared::both().await {
        let leader_cache = shared.cache().build();
        let other = shared.cache().build();
        let loads = Counter::default();
        let leader = start_leader(&leader_cache, "dropped", &loads, "filled anyway").await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        // Followers in the leader's process and in another one.
        let mut followers = Vec::new();
        for i in 0..20 {
            let cache = if i % 2 == 0 {
                leader_cache.clone()
            } else {
                other.clone()
            };
            let load = slow_value(&loads, Duration::ZERO, "a second load");
            followers.push(tokio::spawn(async move {
                cache.get_or_load("dropped", load).await
            }));
        }
        for follower in followers {
            assert_eq!(
                follower.await.unwrap().unwrap(),
                "filled anyway",
                "{}",
                shared.name
            );
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
        let stored = shared.store.get(&other.store_key("dropped")).await.unwrap();
        assert!(stored.is_some(), "{}: the value was stored", shared.name);
    }
}

timed_test!(a_follower_takes_over_from_a_leader_that_died_holding_the_lock);
async fn a_follower_takes_over_from_a_leader_that_died_holding_the_lock(stores: Vec<Shared>) {
    for shared in stores {
        let cache = shared.cache().lock_ttl(Duration::from_millis(300)).build();
        let key = cache.store_key("orphan");
        // A leader in a process that then crashed: it took the lock and never came back.
        let dead = LockToken::random();
        let lookup = shared
            .store
            .lookup(
                &key,
                dead,
                Duration::from_millis(300),
                LockWhen::LifeAtMost(Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Acquired);
        let loads = Counter::default();
        let mut followers = Vec::new();
        for _ in 0..50 {
            let cache = cache.clone();
            let load = slow_value(&loads, Duration::from_millis(10), "recovered");
            followers.push(tokio::spawn(async move {
                cache.get_or_load("orphan", load).await
            }));
        }
        for follower in followers {
            assert_eq!(
                follower.await.unwrap().unwrap(),
                "recovered",
                "{}",
                shared.name
            );
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
        // The dead leader's token no longer opens anything.
        assert!(!shared.store.release(&key, dead).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_released_and_extended_only_by_their_owner() {
    for shared in Shared::both().await {
        let store = &shared.store;
        let key = Cache::builder_shared(store.clone())
            .build()
            .store_key("owned");
        let (owner, intruder) = (LockToken::random(), LockToken::random());
        let ttl = Duration::from_secs(10);
        let first = store
            .lookup(&key, owner, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(first.lock, LockState::Acquired, "{}", shared.name);
        let second = store
            .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(second.lock, LockState::HeldElsewhere, "{}", shared.name);
        assert!(
            !store.release(&key, intruder).await.unwrap(),
            "{}",
            shared.name
        );
        assert!(
            !store.extend(&key, intruder, ttl).await.unwrap(),
            "{}",
            shared.name
        );
        assert!(!store
            .fill(&key, intruder, Bytes::from_static(b"x"), ttl)
            .await
            .unwrap());
        assert_eq!(
            store.get(&key).await.unwrap(),
            None,
            "{}: intruder's fill refused",
            shared.name
        );
        // Still the owner's lock.
        let third = store
            .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(third.lock, LockState::HeldElsewhere, "{}", shared.name);
        assert!(
            store.extend(&key, owner, ttl).await.unwrap(),
            "{}",
            shared.name
        );
        assert!(store.release(&key, owner).await.unwrap(), "{}", shared.name);
        assert!(
            !store.release(&key, owner).await.unwrap(),
            "{}: already gone",
            shared.name
        );
        let fourth = store
            .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(
            fourth.lock,
            LockState::Acquired,
            "{}: free again",
            shared.name
        );
    }
}

timed_test!(a_late_fill_cannot_overwrite_a_newer_value);
async fn a_late_fill_cannot_overwrite_a_newer_value(stores: Vec<Shared>) {
    for shared in stores {
        let store = &shared.store;
        let key = Cache::builder_shared(store.clone())
            .build()
            .store_key("late");
        let ttl = Duration::from_secs(60);
        let (late, newer) = (LockToken::random(), LockToken::random());
        let lock_ttl = Duration::from_millis(50);
        assert_eq!(
            store
                .lookup(&key, late, lock_ttl, LockWhen::LifeAtMost(Duration::ZERO))
                .await
                .unwrap()
                .lock,
            LockState::Acquired
        );
        // The late leader's lock expires while it loads; a newer leader takes over and fills.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            store
                .lookup(&key, newer, lock_ttl, LockWhen::LifeAtMost(Duration::ZERO))
                .await
                .unwrap()
                .lock,
            LockState::Acquired,
            "{}",
            shared.name
        );
        assert!(store
            .fill(&key, newer, Bytes::from_static(b"newer"), ttl)
            .await
            .unwrap());
        // The late leader's fill is refused and the newer value stays.
        assert!(
            !store
                .fill(&key, late, Bytes::from_static(b"stale"), ttl)
                .await
                .unwrap(),
            "{}",
            shared.name
        );
        let stored = store.get(&key).await.unwrap().unwrap();
        assert_eq!(stored.bytes, "newer", "{}", shared.name);
        assert!(stored.ttl.unwrap() > Duration::from_secs(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_and_foreign_bytes_are_a_counted_miss_and_overwritten() {
    for shared in Shared::both().await {
        let cache = shared.cache().build();
        for (i, garbage) in [&b"not ours"[..], b"", b"TS\x01\x09\x00\x00\x00\x00"]
            .iter()
            .enumerate()
        {
            let key = format!("corrupt-{i}");
            shared.write_raw(&cache, &key, garbage).await;
            let loads = Counter::default();
            let value = cache
                .get_or_load(&key, slow_value(&loads, Duration::ZERO, "clean"))
                .await
                .unwrap();
            assert_eq!(value, "clean", "{}", shared.name);
            assert_eq!(loads.get(), 1);
            // Overwritten: another instance now reads the clean value from the store.
            let other = shared.cache().build();
            let read = other.fetch(&key, never_called).await.unwrap();
            assert_eq!(read.outcome(), Outcome::L2Hit, "{}", shared.name);
            assert_eq!(read.value().unwrap(), "clean");
        }
        assert_eq!(cache.stats().corrupt_entries, 3, "{}", shared.name);
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_a_foreign_redis_type_is_a_miss() {
    let shared = Shared::redis().await;
    let cache = shared.cache().build();
    let name = RedisStore::value_name(&cache.store_key("typed"));
    let mut conn = shared.connection().await;
    let _: () = conn.hset(&name, "field", "value").await.unwrap();
    let loads = Counter::default();
    let value = cache
        .get_or_load("typed", slow_value(&loads, Duration::ZERO, "replaced"))
        .await
        .unwrap();
    assert_eq!(value, "replaced");
    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
}

timed_test!(a_failed_load_is_shared_and_releases_the_lock);
async fn a_failed_load_is_shared_and_releases_the_lock(stores: Vec<Shared>) {
    for shared in stores {
        let cache = shared.cache().build();
        let loads = Counter::default();
        let mut callers = Vec::new();
        for _ in 0..50 {
            let (cache, loads) = (cache.clone(), loads.clone());
            callers.push(tokio::spawn(async move {
                cache
                    .get_or_load("failing", move || async move {
                        loads.hit();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err::<Bytes, _>(std::io::Error::other("backend down"))
                    })
                    .await
            }));
        }
        for caller in callers {
            let error = caller.await.unwrap().unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Load, "{}", shared.name);
            // The loader's own error is the source, and `Display` does not repeat it.
            let source = std::error::Error::source(&error).expect("the loader's error");
            assert!(source.to_string().contains("backend down"));
            assert!(!error.to_string().contains("backend down"), "{error}");
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
        // The lock became a failure marker: nobody reloads until it expires (1 s by default).
        let lookup = shared
            .store
            .lookup(
                &cache.store_key("failing"),
                LockToken::random(),
                Duration::from_secs(5),
                LockWhen::LifeAtMost(Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Failed, "{}", shared.name);
        // Without failure markers, the lock goes with the failure: the next call leads at once.
        let forgetful = shared.cache().failure_ttl(Duration::ZERO).build();
        let error = forgetful
            .get_or_load("failing-again", || async {
                Err::<Bytes, _>(std::io::Error::other("backend down"))
            })
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load);
        let lookup = shared
            .store
            .lookup(
                &cache.store_key("failing-again"),
                LockToken::random(),
                Duration::from_secs(5),
                LockWhen::LifeAtMost(Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(lookup.lock, LockState::Acquired, "{}", shared.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_loader_is_an_error_and_releases_the_lock() {
    for shared in Shared::both().await {
        let cache = shared.cache().failure_ttl(Duration::ZERO).build();
        let error = cache
            .get_or_load("panics", || async {
                if true {
                    panic!("loader bug");
                }
                Ok::<_, std::io::Error>(Bytes::new())
            })
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::LoadPanicked, "{}", shared.name);
        let loads = Counter::default();
        let value = cache
            .get_or_load("panics", slow_value(&loads, Duration::ZERO, "ok"))
            .await
            .unwrap();
        assert_eq!(value, "ok", "{}", shared.name);
    }
}

/// Holds the lock of `key` for a long time, as a live leader elsewhere would.
async fn hold_lock(shared: &Shared, cache: &Cache, key: &str) -> LockToken {
    let token = LockToken::random();
    let lookup = shared
        .store
        .lookup(
            &cache.store_key(key),
            token,
            Duration::from_secs(60),
            LockWhen::Always,
        )
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    token
}

timed_test!(wait_timeout_policies);
async fn wait_timeout_policies(stores: Vec<Shared>) {
    for shared in stores {
        let uncached = shared
            .cache()
            .wait_timeout(Duration::from_millis(200))
            .build();
        hold_lock(&shared, &uncached, "busy").await;
        let loads = Counter::default();
        let mut callers = Vec::new();
        for _ in 0..20 {
            let (cache, load) = (
                uncached.clone(),
                slow_value(&loads, Duration::from_millis(10), "direct"),
            );
            callers.push(tokio::spawn(async move {
                cache
                    .fetch(
                        "busy",
                        move || async move { load().await.map(Loaded::value) },
                    )
                    .await
            }));
        }
        let mut outcomes = Vec::new();
        for caller in callers {
            let fetched = caller.await.unwrap().unwrap();
            assert_eq!(fetched.value().unwrap(), "direct", "{}", shared.name);
            outcomes.push(fetched.outcome());
        }
        assert_eq!(
            loads.get(),
            1,
            "{}: one uncached load per process",
            shared.name
        );
        assert_eq!(
            outcomes.iter().filter(|o| **o == Outcome::Uncached).count(),
            1
        );
        assert_eq!(
            shared.store.get(&uncached.store_key("busy")).await.unwrap(),
            None,
            "{}: not stored",
            shared.name
        );

        let strict = shared
            .cache()
            .wait_timeout(Duration::from_millis(100))
            .on_wait_timeout(WaitTimeoutPolicy::Error)
            .build();
        let error = strict.fetch("busy", never_called).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WaitTimeout, "{}", shared.name);

        // Load and cache: one load per process, stored for everyone despite the held lock.
        let caching = || {
            shared
                .cache()
                .wait_timeout(Duration::from_millis(100))
                .on_wait_timeout(WaitTimeoutPolicy::LoadAndCache)
                .build()
        };
        let (first, second) = (caching(), caching());
        let loads = Counter::default();
        let mut callers = Vec::new();
        for _ in 0..10 {
            let (cache, load) = (
                first.clone(),
                slow_value(&loads, Duration::from_millis(10), "cached anyway"),
            );
            callers.push(tokio::spawn(async move {
                cache.get_or_load("busy", load).await
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), "cached anyway");
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
        let hit = second.fetch("busy", never_called).await.unwrap();
        assert_eq!(hit.value().unwrap(), "cached anyway", "{}", shared.name);
        assert_eq!(hit.outcome(), Outcome::L2Hit, "{}", shared.name);
    }
}

timed_test!(serve_stale_after_a_wait_timeout);
async fn serve_stale_after_a_wait_timeout(stores: Vec<Shared>) {
    for shared in stores {
        // No serve-while-updating, but stale data is welcome when the leader is too slow.
        let cache = shared
            .cache()
            .stale(Duration::ZERO)
            .stale_if_error(Duration::from_secs(60))
            .wait_timeout(Duration::from_millis(200))
            .on_wait_timeout(WaitTimeoutPolicy::ServeStale)
            .build();
        stale_entry(&shared, "slow-leader", "yesterday").await;
        hold_lock(&shared, &cache, "slow-leader").await;
        let asked = tokio::time::Instant::now();
        let fetched = cache.fetch("slow-leader", never_called).await.unwrap();
        assert_eq!(fetched.value().unwrap(), "yesterday", "{}", shared.name);
        assert_eq!(fetched.outcome(), Outcome::Stale, "{}", shared.name);
        assert!(
            asked.elapsed() >= Duration::from_millis(200),
            "{}: without a stale-while-updating window, it waited first",
            shared.name
        );
        // Nothing stale to serve: the wait timeout is an error, and nothing loads.
        hold_lock(&shared, &cache, "never-cached").await;
        let error = cache.fetch("never-cached", never_called).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WaitTimeout, "{}", shared.name);
    }
}

timed_test!(stale_if_error_has_a_maximum_staleness);
async fn stale_if_error_has_a_maximum_staleness(stores: Vec<Shared>) {
    for shared in stores {
        // The entry is about 200 ms stale: too old for 100 ms, fine for 60 s.
        stale_entry(&shared, "aging", "old").await;
        let failing = || async { Err::<Bytes, _>(std::io::Error::other("backend down")) };
        let picky = shared
            .cache()
            .stale(Duration::from_secs(60))
            .stale_if_error(Duration::from_millis(100))
            .refresh_in_background(false)
            .failure_ttl(Duration::ZERO)
            .build();
        let error = picky.get_or_load("aging", failing).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load, "{}", shared.name);
        let tolerant = shared
            .cache()
            .stale(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(60))
            .refresh_in_background(false)
            .build();
        assert_eq!(
            tolerant.get_or_load("aging", failing).await.unwrap(),
            "old",
            "{}",
            shared.name
        );
    }
}

timed_test!(a_six_second_load_under_default_settings_is_one_load);
async fn a_six_second_load_under_default_settings_is_one_load(stores: Vec<Shared>) {
    // nginx's defaults (a 5 s lock timeout) would send every waiting client to the origin;
    // here followers wait as long as the leader's watchdog keeps its lock alive.
    for shared in stores {
        let instances: Vec<Cache> = (0..4).map(|_| shared.cache().build()).collect();
        let loads = Counter::default();
        let mut callers = Vec::new();
        for i in 0..100 {
            let cache = instances[i % 4].clone();
            let load = slow_value(&loads, Duration::from_secs(6), "finally");
            callers.push(tokio::spawn(async move {
                cache.get_or_load("six-seconds", load).await
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), "finally", "{}", shared.name);
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

timed_test!(a_corrupt_entry_overwritten_meanwhile_is_not_loaded_again);
async fn a_corrupt_entry_overwritten_meanwhile_is_not_loaded_again(stores: Vec<Shared>) {
    for shared in stores {
        let fast = shared.cache().build();
        // This instance's first lookup answers late, after the other has overwritten the entry.
        let late = Cache::builder_shared(Observed::new(&shared.store, Duration::from_millis(300)))
            .namespace("test")
            .store_timeout(Duration::from_secs(5))
            .build();
        shared.write_raw(&fast, "repaired", b"\xff garbage").await;
        let loads = Counter::default();
        let slow_reader = tokio::spawn({
            let (late, load) = (late.clone(), slow_value(&loads, Duration::ZERO, "late"));
            async move { late.get_or_load("repaired", load).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let repaired = fast
            .get_or_load("repaired", slow_value(&loads, Duration::ZERO, "clean"))
            .await
            .unwrap();
        assert_eq!(repaired, "clean", "{}", shared.name);
        assert_eq!(
            slow_reader.await.unwrap().unwrap(),
            "clean",
            "{}",
            shared.name
        );
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

timed_test!(a_load_longer_than_the_lock_ttl_is_still_one_load);
async fn a_load_longer_than_the_lock_ttl_is_still_one_load(stores: Vec<Shared>) {
    for shared in stores {
        let instances: Vec<Cache> = (0..3)
            .map(|_| shared.cache().lock_ttl(Duration::from_millis(150)).build())
            .collect();
        let loads = Counter::default();
        let mut callers = Vec::new();
        for i in 0..60 {
            let cache = instances[i % 3].clone();
            let load = slow_value(&loads, Duration::from_millis(450), "slow");
            callers.push(tokio::spawn(async move {
                cache.get_or_load("slow", load).await
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), "slow", "{}", shared.name);
        }
        assert_eq!(
            loads.get(),
            1,
            "{}: the watchdog kept the lock",
            shared.name
        );
    }
}

timed_test!(a_load_over_the_load_timeout_is_abandoned_and_unlocked);
async fn a_load_over_the_load_timeout_is_abandoned_and_unlocked(stores: Vec<Shared>) {
    for shared in stores {
        let cache = shared
            .cache()
            .load_timeout(Duration::from_millis(100))
            .failure_ttl(Duration::ZERO)
            .build();
        let loads = Counter::default();
        let error = cache
            .get_or_load(
                "hangs",
                slow_value(&loads, Duration::from_secs(3600), "never"),
            )
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::LoadTimeout, "{}", shared.name);
        let value = cache
            .get_or_load("hangs", slow_value(&loads, Duration::ZERO, "next"))
            .await
            .unwrap();
        assert_eq!(value, "next", "{}: the lock was released", shared.name);
        assert_eq!(loads.get(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_tells_followers_not_to_wait() {
    for shared in Shared::both().await {
        let a = shared.cache().build();
        let b = shared.cache().build();
        let fetched = a
            .fetch("huge", || async { Ok::<_, std::io::Error>(Loaded::pass()) })
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Pass, "{}", shared.name);
        assert!(fetched.value().is_none());
        let follower = b.fetch("huge", never_called).await.unwrap();
        assert_eq!(follower.outcome(), Outcome::Pass, "{}", shared.name);
        let error = b
            .get_or_load("huge", || async { Ok::<_, std::io::Error>(Bytes::new()) })
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Pass);
    }
}

// Real time over both stores: the test waits for L1 to expire, and L1 follows moka's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loader_sets_the_ttl_and_l1_never_outlives_it() {
    for shared in Shared::both().await {
        let a = shared.cache().build();
        a.fetch("short", || async {
            Ok::<_, std::io::Error>(Loaded::value_with_ttl(
                Bytes::from_static(b"v1"),
                Duration::from_millis(200),
            ))
        })
        .await
        .unwrap();
        let stored = shared
            .store
            .get(&a.store_key("short"))
            .await
            .unwrap()
            .unwrap();
        assert!(
            stored.ttl.unwrap() <= Duration::from_millis(200),
            "{}",
            shared.name
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let loads = Counter::default();
        let fetched = a
            .fetch("short", move || async move {
                loads.hit();
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v2")))
            })
            .await
            .unwrap();
        assert_eq!(
            fetched.outcome(),
            Outcome::Leader,
            "{}: expired in L1 and the store",
            shared.name
        );
        assert_eq!(fetched.value().unwrap(), "v2");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_degrades_to_in_process_protection() {
    let mut shared = Shared::redis().await;
    let instances: Vec<Cache> = (0..2).map(|_| shared.cache().build()).collect();
    shared.server_mut().kill();
    let loads = Counter::default();
    let mut callers = Vec::new();
    for i in 0..200 {
        let cache = instances[i % 2].clone();
        let load = slow_value(&loads, Duration::from_millis(100), "still served");
        callers.push(tokio::spawn(async move {
            cache.get_or_load("down", load).await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "still served");
    }
    assert!(
        loads.get() <= 2,
        "one load per instance at most, got {}",
        loads.get()
    );
    assert!(instances[0].stats().store_errors >= 1);
}

/// Followers whose polls would take a minute: only a notification can wake them in time.
fn deaf_to_polls(store: Arc<dyn Store>) -> tower_stampede::CacheBuilder {
    Cache::builder_shared(store)
        .namespace("test")
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
}

timed_test!(followers_are_woken_by_the_fill_not_by_their_polls);
async fn followers_are_woken_by_the_fill_not_by_their_polls(stores: Vec<Shared>) {
    for shared in stores {
        let leader = shared.cache().build();
        let follower = deaf_to_polls(shared.other_process().await).build();
        let loads = Counter::default();
        let leading = start_leader(&leader, "notified", &loads, "filled").await;
        let mut followers = Vec::new();
        for _ in 0..10 {
            let follower = follower.clone();
            followers.push(tokio::spawn(async move {
                follower.fetch("notified", never_called).await
            }));
        }
        for waiting in followers {
            // A failure guard only: a poll would come after 30 s at the earliest.
            let fetched = tokio::time::timeout(Duration::from_secs(20), waiting)
                .await
                .unwrap_or_else(|_| panic!("{}: follower not woken by the fill", shared.name))
                .unwrap()
                .unwrap();
            assert_eq!(fetched.value().unwrap(), "filled", "{}", shared.name);
            assert_eq!(fetched.outcome(), Outcome::Follower, "{}", shared.name);
        }
        assert_eq!(leading.await.unwrap().unwrap(), "filled");
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

timed_test!(a_failed_leader_wakes_its_followers_to_take_over);
async fn a_failed_leader_wakes_its_followers_to_take_over(stores: Vec<Shared>) {
    for shared in stores {
        let leader = shared.cache().failure_ttl(Duration::ZERO).build();
        let follower = deaf_to_polls(shared.other_process().await).build();
        let started = Arc::new(Notify::new());
        let failing = tokio::spawn({
            let (leader, started) = (leader.clone(), started.clone());
            async move {
                leader
                    .get_or_load("fails-once", move || async move {
                        started.notify_one();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Err::<Bytes, _>(std::io::Error::other("first load fails"))
                    })
                    .await
            }
        });
        started.notified().await;
        let loads = Counter::default();
        let load = slow_value(&loads, Duration::ZERO, "second try");
        let taking_over =
            tokio::spawn(async move { follower.get_or_load("fails-once", load).await });
        assert!(failing.await.unwrap().is_err());
        let value = tokio::time::timeout(Duration::from_secs(20), taking_over)
            .await
            .unwrap_or_else(|_| panic!("{}: follower not woken by the release", shared.name))
            .unwrap()
            .unwrap();
        assert_eq!(value, "second try", "{}", shared.name);
        assert_eq!(loads.get(), 1);
    }
}

/// One rule for keeping a loaded value in L1 after its write, whether the write succeeded or
/// failed (review of issue 16): a tagged value whose tag was invalidated during its load is
/// not kept. A leader whose fill failed kept it with fresh tag stamps, unchecked, so its
/// process served the outdated value from L1, while a write after a wait timeout checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fill_keeps_no_value_outdated_during_its_load() {
    for shared in Shared::both().await {
        let failing = Observed::failing_fills(&shared.store);
        let cache = Cache::builder_shared(failing).namespace("test").build();
        let purger = shared.cache().build();
        let loads = Counter::default();
        let started = Arc::new(Notify::new());
        let (go, going) = tokio::sync::oneshot::channel::<()>();
        let leader = tokio::spawn({
            let (cache, loads, started) = (cache.clone(), loads.clone(), started.clone());
            async move {
                cache
                    .fetch("tagged", move || async move {
                        loads.hit();
                        started.notify_one();
                        let _ = going.await;
                        let value = Loaded::value(Bytes::from_static(b"outdated"));
                        Ok::<_, std::io::Error>(value.tags(["t"]))
                    })
                    .await
            }
        });
        started.notified().await;
        purger.invalidate_tag("t").await.unwrap();
        go.send(()).unwrap();
        let first = leader.await.unwrap().unwrap();
        assert_eq!(first.value().unwrap(), "outdated", "{}", shared.name);
        let loads_again = loads.clone();
        let second = cache
            .fetch("tagged", move || async move {
                loads_again.hit();
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"current")).tags(["t"]))
            })
            .await
            .unwrap();
        assert_ne!(
            second.outcome(),
            Outcome::L1Hit,
            "{}: kept in L1",
            shared.name
        );
        assert_eq!(second.value().unwrap(), "current", "{}", shared.name);
        assert_eq!(loads.get(), 2, "{}", shared.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_in_one_process_cost_one_store_lookup() {
    for shared in Shared::both().await {
        let counting = Observed::new(&shared.store, Duration::ZERO);
        let cache = Cache::builder_shared(counting.clone())
            .namespace("test")
            .build();
        let loads = Counter::default();
        let mut callers = Vec::new();
        for _ in 0..500 {
            let cache = cache.clone();
            let load = slow_value(&loads, Duration::from_millis(50), "once");
            callers.push(tokio::spawn(async move {
                cache.get_or_load("local", load).await
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), "once", "{}", shared.name);
        }
        assert_eq!(counting.lookups(), 1, "{}", shared.name);
        assert_eq!(loads.get(), 1);
    }
}

/// Fills `key` with `value`, fresh for 200 ms and kept 60 s longer as stale, then waits until
/// it is stale.
async fn stale_entry(shared: &Shared, key: &str, value: &'static str) {
    let cache = shared
        .cache()
        .ttl(Duration::from_millis(200))
        .stale(Duration::from_secs(60))
        .build();
    let loads = Counter::default();
    cache
        .get_or_load(key, slow_value(&loads, Duration::ZERO, value))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
}

/// Fetches `key` until it answers `want` (the refresh landed); a failure guard of 10 s.
async fn eventually(cache: &Cache, key: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fetched = cache.fetch(key, never_called).await.unwrap();
        if fetched.value().unwrap() == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

timed_test!(stale_values_are_served_while_one_leader_refreshes);
async fn stale_values_are_served_while_one_leader_refreshes(stores: Vec<Shared>) {
    for shared in stores {
        stale_entry(&shared, "swr", "old").await;
        let instances: Vec<Cache> = (0..2)
            .map(|_| {
                shared
                    .cache()
                    .ttl(Duration::from_secs(60))
                    .stale(Duration::from_secs(60))
                    .build()
            })
            .collect();
        let (release, loads) =
            stale_while_one_refreshes(shared.name, &instances, "swr", 40, "old", "new").await;
        release.notify_one();
        eventually(&instances[1], "swr", "new").await;
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

timed_test!(a_foreground_refresh_waits_for_its_leader_only);
async fn a_foreground_refresh_waits_for_its_leader_only(stores: Vec<Shared>) {
    for shared in stores {
        stale_entry(&shared, "fg", "old").await;
        let leader = shared
            .cache()
            .stale(Duration::from_secs(60))
            .refresh_in_background(false)
            .build();
        let other = shared.cache().stale(Duration::from_secs(60)).build();
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let leading = tokio::spawn({
            let (leader, started, release) = (leader.clone(), started.clone(), release.clone());
            async move {
                leader
                    .fetch("fg", move || async move {
                        started.notify_one();
                        release.notified().await;
                        Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"new")))
                    })
                    .await
            }
        });
        started.notified().await;
        let meanwhile = other.fetch("fg", never_called).await.unwrap();
        assert_eq!(
            (meanwhile.value().unwrap().as_ref(), meanwhile.outcome()),
            (&b"old"[..], Outcome::Stale),
            "{}",
            shared.name
        );
        release.notify_one();
        let led = leading.await.unwrap().unwrap();
        assert_eq!(
            (led.value().unwrap().as_ref(), led.outcome()),
            (&b"new"[..], Outcome::Leader),
            "{}",
            shared.name
        );
    }
}

timed_test!(a_failed_refresh_serves_the_stale_value);
async fn a_failed_refresh_serves_the_stale_value(stores: Vec<Shared>) {
    for shared in stores {
        stale_entry(&shared, "sie", "old but good").await;
        let cache = shared
            .cache()
            .stale(Duration::from_secs(60))
            .refresh_in_background(false)
            .build();
        let fetched = cache
            .fetch("sie", || async {
                Err::<Loaded, _>(std::io::Error::other("backend down"))
            })
            .await
            .unwrap();
        assert_eq!(fetched.value().unwrap(), "old but good", "{}", shared.name);
        assert_eq!(fetched.outcome(), Outcome::Stale, "{}", shared.name);
        // Without a stale window, the same failure is an error.
        let strict = shared.cache().build();
        let error = strict
            .get_or_load("no-stale", || async {
                Err::<Bytes, _>(std::io::Error::other("backend down"))
            })
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_entry_is_overwritten_by_one_load() {
    for shared in Shared::both().await {
        let instances: Vec<Cache> = (0..2).map(|_| shared.cache().build()).collect();
        shared
            .write_raw(&instances[0], "garbage", b"\x00\x01 not an entry")
            .await;
        let loads = Counter::default();
        let mut callers = Vec::new();
        for i in 0..40 {
            let cache = instances[i % 2].clone();
            let load = slow_value(&loads, Duration::from_millis(100), "clean");
            callers.push(tokio::spawn(async move {
                cache.get_or_load("garbage", load).await
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap().unwrap(), "clean", "{}", shared.name);
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

timed_test!(a_timed_out_lookup_does_not_leave_its_lock_behind);
async fn a_timed_out_lookup_does_not_leave_its_lock_behind(stores: Vec<Shared>) {
    for shared in stores {
        let late = Cache::builder_shared(Observed::new(&shared.store, Duration::from_secs(5)))
            .namespace("test")
            .store_timeout(Duration::from_millis(50))
            .lock_ttl(Duration::from_secs(60))
            .build();
        let loads = Counter::default();
        let fetched = late
            .fetch("late", {
                let loads = loads.clone();
                move || async move {
                    loads.hit();
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"degraded")))
                }
            })
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Degraded, "{}", shared.name);
        // Another process is not held up by the lock the timed-out lookup took.
        let healthy = deaf_to_polls(shared.other_process().await)
            .lock_ttl(Duration::from_secs(60))
            .build();
        let led = tokio::time::timeout(
            Duration::from_secs(20),
            healthy.fetch("late", || async {
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"led")))
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("{}: the lock was left behind", shared.name))
        .unwrap();
        assert_eq!(led.outcome(), Outcome::Leader, "{}", shared.name);
    }
}

#[test]
fn a_flight_dropped_with_its_runtime_does_not_poison_the_key() {
    let cache = Cache::builder(MemoryStore::new()).build();
    {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cache = cache.clone();
        first.block_on(async move {
            // Start a flight, then let the runtime go before its task ever runs.
            let fetch = cache.get_or_load("orphaned", || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"never"))
            });
            let _ = futures_poll_once(fetch).await;
        });
    }
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let value = second
        .block_on(cache.get_or_load("orphaned", || async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"fine"))
        }))
        .unwrap();
    assert_eq!(value, "fine");
}

/// Polls a future once and drops it.
async fn futures_poll_once<F: std::future::Future>(future: F) {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        let _ = future.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_resume_after_redis_restarts() {
    let mut shared = Shared::redis().await;
    let leader = shared.cache().build();
    let follower = deaf_to_polls(shared.other_process().await).build();
    // Notifications work, then Redis goes away and comes back empty.
    for round in ["before", "after"] {
        let key = format!("restart-{round}");
        let leading = start_leader(&leader, &key, &Counter::default(), "filled").await;
        let fetched =
            tokio::time::timeout(Duration::from_secs(20), follower.fetch(&key, never_called))
                .await
                .unwrap_or_else(|_| panic!("{round} the restart: the follower was not woken"))
                .unwrap();
        assert_eq!(fetched.value().unwrap(), "filled", "{round}");
        leading.await.unwrap().unwrap();
        if round == "before" {
            shared.server_mut().restart();
            // Both stores reconnect by themselves: wait until each answers and hears.
            for cache in [&leader, &follower] {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                while !cache.health().await.is_healthy() {
                    assert!(tokio::time::Instant::now() < deadline, "never reconnected");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

timed_test!(a_failing_backend_is_called_once_per_failure_window);
async fn a_failing_backend_is_called_once_per_failure_window(stores: Vec<Shared>) {
    for shared in stores {
        let instances: Vec<Cache> = (0..4)
            .map(|_| {
                shared
                    .cache()
                    .failure_ttl(Duration::from_millis(500))
                    .build()
            })
            .collect();
        let calls = Counter::default();
        let failing = |calls: &Counter| {
            let calls = calls.clone();
            move || async move {
                calls.hit();
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err::<Bytes, _>(std::io::Error::other("backend down"))
            }
        };
        let mut callers = Vec::new();
        for i in 0..1000 {
            let (cache, load) = (instances[i % 4].clone(), failing(&calls));
            callers.push(tokio::spawn(async move {
                cache.get_or_load("down", load).await
            }));
        }
        let mut kinds = std::collections::HashMap::new();
        for caller in callers {
            let error = caller.await.unwrap().unwrap_err();
            *kinds.entry(error.kind()).or_insert(0) += 1;
        }
        assert_eq!(
            calls.get(),
            1,
            "{}: one backend call, kinds {kinds:?}",
            shared.name
        );
        assert_eq!(kinds.values().sum::<usize>(), 1000);
        assert!(kinds
            .keys()
            .all(|k| matches!(k, ErrorKind::Load | ErrorKind::RecentFailure)));
        // Within the window: failing at once, no call.
        let error = instances[0]
            .get_or_load("down", failing(&calls))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RecentFailure, "{}", shared.name);
        assert_eq!(calls.get(), 1);
        // After it: one call retries.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let error = instances[1]
            .get_or_load("down", failing(&calls))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load, "{}", shared.name);
        assert_eq!(calls.get(), 2, "{}", shared.name);
    }
}

timed_test!(a_recent_failure_serves_the_stale_value_everywhere);
async fn a_recent_failure_serves_the_stale_value_everywhere(stores: Vec<Shared>) {
    for shared in stores {
        stale_entry(&shared, "stale-down", "last good").await;
        let calls = Counter::default();
        for i in 0..3 {
            let cache = shared
                .cache()
                .stale(Duration::from_secs(60))
                .refresh_in_background(false)
                .build();
            let calls = calls.clone();
            let fetched = cache
                .fetch("stale-down", move || async move {
                    calls.hit();
                    Err::<Loaded, _>(std::io::Error::other("backend down"))
                })
                .await
                .unwrap();
            assert_eq!(
                fetched.value().unwrap(),
                "last good",
                "{} #{i}",
                shared.name
            );
            assert_eq!(fetched.outcome(), Outcome::Stale, "{} #{i}", shared.name);
        }
        assert_eq!(calls.get(), 1, "{}: the failure was shared", shared.name);
    }
}

/// A loader whose first load is slow (`first` long, answering "v1") and whose later loads are
/// quick ("v2", "v3", ...): early refresh uses the last load's time, so the first one sets
/// how early the next refresh may come.
fn first_slow_then_quick(
    loads: &Counter,
    first: Duration,
) -> impl FnOnce() -> futures_ready::Load + Send + 'static {
    let loads = loads.clone();
    move || {
        Box::pin(async move {
            let n = loads.hit();
            let delay = if n == 1 {
                first
            } else {
                Duration::from_millis(10)
            };
            tokio::time::sleep(delay).await;
            Ok(Bytes::from(format!("v{n}")))
        })
    }
}

timed_test!(a_hot_key_is_refreshed_early_by_one_load_and_nobody_waits);
async fn a_hot_key_is_refreshed_early_by_one_load_and_nobody_waits(stores: Vec<Shared>) {
    for shared in stores {
        // δ = 300 ms: each instance's refresh point is drawn at least δ before expiry (with
        // β = 3, 4δ on average), so hits for 800 ms reach it, and the quick refresh lands long
        // before the value expires; the refreshed value's own point (δ = 10 ms) is not reached.
        let builder = || {
            shared
                .cache()
                .ttl(Duration::from_secs(1))
                .early_refresh(3.0)
        };
        let instances = [builder().build(), builder().build()];
        let loads = Counter::default();
        let first = instances[0]
            .get_or_load(
                "hot",
                first_slow_then_quick(&loads, Duration::from_millis(300)),
            )
            .await
            .unwrap();
        assert_eq!(first, "v1");
        let mut seen_v2 = false;
        let hitting = tokio::time::Instant::now();
        for i in 0.. {
            if hitting.elapsed() >= Duration::from_millis(800) {
                break;
            }
            let fetched = instances[i % 2]
                .fetch("hot", {
                    let load = first_slow_then_quick(&loads, Duration::ZERO);
                    move || async move { load().await.map(Loaded::value) }
                })
                .await
                .unwrap();
            assert!(
                matches!(fetched.outcome(), Outcome::L1Hit | Outcome::L2Hit),
                "{}: hit {i} waited: {:?}",
                shared.name,
                fetched.outcome()
            );
            seen_v2 |= fetched.value().unwrap() == "v2";
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            seen_v2,
            "{}: the refresh landed before the value expired",
            shared.name
        );
        let early: u64 = instances.iter().map(|c| c.stats().early_refreshes).sum();
        assert!(early >= 1, "{}", shared.name);
        // One load refreshed it, whichever instances tried: the next refresh is due only
        // about 30 ms (δ·β) before the new value expires.
        assert_eq!(loads.get(), 2, "{}", shared.name);

        // Without early refresh, the same hits never load.
        let plain = shared
            .cache()
            .ttl(Duration::from_secs(1))
            .early_refresh(0.0)
            .build();
        let loads = Counter::default();
        plain
            .get_or_load(
                "cold",
                first_slow_then_quick(&loads, Duration::from_millis(300)),
            )
            .await
            .unwrap();
        for _ in 0..20 {
            let value = plain
                .get_or_load("cold", first_slow_then_quick(&loads, Duration::ZERO))
                .await
                .unwrap();
            assert_eq!(value, "v1");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(loads.get(), 1, "{}", shared.name);
    }
}

/// Issue 16, configuration hazards: with `backoff(0, 0)` a follower must not spin on the
/// store. Paused time: a leader loads for 100 ms while a follower (notifications off, so it
/// only polls) waits; its pauses are at least half a millisecond, so it looks the key up at
/// most about 200 times, where a zero pause would look it up without end.
#[tokio::test(start_paused = true)]
async fn a_zero_backoff_does_not_spin_on_the_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let leader = Cache::builder_shared(Arc::clone(&store)).build();
    let observed = Observed::new(&store, Duration::ZERO);
    let follower = Cache::builder_shared(observed.clone())
        .backoff(Duration::ZERO, Duration::ZERO)
        .notifications(false)
        .build();
    let (leader_loads, follower_loads) = (Counter::default(), Counter::default());
    let loading = tokio::spawn({
        let load = slow_value(&leader_loads, Duration::from_millis(100), "filled");
        async move { leader.get_or_load("zero-backoff", load).await }
    });
    while leader_loads.get() == 0 {
        tokio::task::yield_now().await;
    }
    let load = slow_value(&follower_loads, Duration::ZERO, "not loaded");
    let followed = follower.get_or_load("zero-backoff", load).await.unwrap();
    assert_eq!(followed, "filled");
    assert_eq!(loading.await.unwrap().unwrap(), "filled");
    assert_eq!(follower_loads.get(), 0);
    let lookups = observed.lookups();
    assert!((2..=210).contains(&lookups), "{lookups} lookups in 100 ms");
}

/// Issue 16, configuration hazards: a probe that never completes must not leave the breaker
/// open for good. Every lookup and read of the store hangs: the breaker opens, and its probes
/// (the timer's reads, and the trial of a request's lookup) hang too, each cut short by the
/// store timeout; once the store answers again, the next probe closes the breaker with no
/// request in between. Paused time.
#[tokio::test(start_paused = true)]
async fn a_probe_that_never_completes_does_not_keep_the_breaker_open() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let observed = Observed::new(&store, Duration::ZERO);
    let open_for = Duration::from_secs(1);
    let cache = Cache::builder_shared(observed.clone())
        .store_timeout(Duration::from_millis(50))
        .circuit_breaker(2, open_for)
        .build();
    observed.hang(true);
    let loads = Counter::default();
    for n in 0..3 {
        let key = format!("hanging-{n}");
        let value = cache
            .get_or_load(&key, slow_value(&loads, Duration::ZERO, "loaded"))
            .await
            .unwrap();
        assert_eq!(value, "loaded");
    }
    assert!(!cache.store_available(), "two timeouts open the breaker");
    // Several periods of hanging probes (and a request whose lookup is a hanging trial).
    tokio::time::sleep(open_for * 3).await;
    cache
        .get_or_load(
            "hanging-trial",
            slow_value(&loads, Duration::ZERO, "loaded"),
        )
        .await
        .unwrap();
    tokio::time::sleep(open_for * 2).await;
    assert!(!cache.store_available(), "the store still hangs");
    observed.hang(false);
    tokio::time::sleep(open_for * 2 + Duration::from_millis(100)).await;
    assert!(
        cache.store_available(),
        "a probe after the store answers again closes the breaker"
    );
}

#[tokio::test(start_paused = true)]
async fn early_refresh_keeps_a_hot_key_fresh_at_about_one_load_per_ttl() {
    // Paused time: 10 s of continuous traffic (8 clients out of step, one request each per
    // 10 ms on average) on a key
    // with a 1 s TTL and a 20 ms load. L1 is off, so every request asks the store, whose
    // freshness paused time drives.
    let cache = Cache::builder(MemoryStore::new())
        .ttl(Duration::from_secs(1))
        .early_refresh(2.0)
        .l1_capacity(0)
        .build();
    let loads = Counter::default();
    let started = tokio::time::Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (cache, loads) = (cache.clone(), loads.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i)).await;
                let mut outcomes = Vec::new();
                while started.elapsed() < Duration::from_secs(10) {
                    let loads = loads.clone();
                    let fetched = cache
                        .fetch("hot", move || async move {
                            let n = loads.hit();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, std::io::Error>(Loaded::value(Bytes::from(format!("v{n}"))))
                        })
                        .await
                        .unwrap();
                    outcomes.push((started.elapsed(), fetched.outcome()));
                    // Out of step with each other, as real clients are: 10 ms on average.
                    let pause = rand::random_range(5..=15);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                outcomes
            })
        })
        .collect();
    let mut waited = Vec::new();
    for client in clients {
        for (at, outcome) in client.await.unwrap() {
            let waited_for_a_load = matches!(
                outcome,
                Outcome::Leader | Outcome::Follower | Outcome::Uncached
            );
            if waited_for_a_load && at > Duration::from_millis(100) {
                waited.push((at, outcome));
            }
        }
    }
    assert!(waited.is_empty(), "requests waited for a load: {waited:?}");
    // Refreshes come a little (δ·(1.1 + β·(−ln u)), about 62 ms on average) before each expiry.
    let loads = loads.get();
    assert!((10..=13).contains(&loads), "{loads} loads in 10 s");
}

/// What the server ran since the last [`reset_stats`]: commands by name (the test's own
/// `INFO` and `CONFIG` left out; commands run by scripts included), and round trips: the
/// reads of client requests it processed, less the `INFO` that asks.
#[cfg(feature = "redis")]
async fn server_work(
    conn: &mut redis::aio::MultiplexedConnection,
) -> (std::collections::BTreeMap<String, u64>, u64) {
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(conn)
        .await
        .unwrap();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?.split(',').next()?.parse().ok()
    };
    let commands = info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = field(stats, "calls=")?;
            let by_test = name == "info" || name.starts_with("config");
            (!by_test).then(|| (name.to_owned(), calls))
        })
        .collect();
    let reads = info
        .lines()
        .find_map(|line| field(line, "total_reads_processed:"))
        .unwrap();
    (commands, reads - 1)
}

#[cfg(feature = "redis")]
async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_l2_hit_and_per_miss_decision() {
    let shared = Shared::redis().await;
    let server = shared.server();
    let leader = shared.cache().build();
    let reader = deaf_to_polls(shared.other_process().await).build();
    let loads = Counter::default();
    // Warm up: scripts loaded, the reader's subscription to the namespace in place.
    for key in ["warm-1", "warm-2"] {
        leader
            .get_or_load(key, slow_value(&loads, Duration::ZERO, "w"))
            .await
            .unwrap();
        reader.fetch(key, never_called).await.unwrap();
    }
    leader
        .get_or_load("hot", slow_value(&loads, Duration::ZERO, "v"))
        .await
        .unwrap();
    // A process's first load reads the tag clock, once in its life (for its loads before a
    // loader returns tags; see the `tags` module).
    reader
        .get_or_load("reader's first", slow_value(&loads, Duration::ZERO, "f"))
        .await
        .unwrap();

    let mut stats = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    reset_stats(&mut stats).await;
    let hit = reader.fetch("hot", never_called).await.unwrap();
    assert_eq!(hit.outcome(), Outcome::L2Hit);
    let (commands, round_trips) = server_work(&mut stats).await;
    // Three plain commands in one pipeline: `SET lock NX GET` (refused by the `fresh` marker
    // the fill left), `GET` and `PTTL` of the value; no script.
    let expected: std::collections::BTreeMap<String, u64> = [("get", 1), ("pttl", 1), ("set", 1)]
        .map(|(name, calls)| (name.to_owned(), calls))
        .into();
    assert_eq!(commands, expected, "an L2 hit");
    assert_eq!(round_trips, 1, "an L2 hit is one round trip: {commands:?}");

    reset_stats(&mut stats).await;
    let fetched = reader
        .fetch("cold", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"c")))
        })
        .await
        .unwrap();
    assert_eq!(fetched.outcome(), Outcome::Leader);
    let (commands, round_trips) = server_work(&mut stats).await;
    // The miss decision (value or lock) is one round trip, the fill the second and last.
    assert_eq!(
        round_trips, 2,
        "a miss is a lookup and a fill: {commands:?}"
    );
    assert_eq!(commands.get("evalsha"), Some(&1), "the fill: {commands:?}");
}

/// The lock key of a filled value holds the `fresh` marker for as long as the value is fresh,
/// so a plain `SET lock NX` cannot take it; the pipelined lookup depends on it. What breaks
/// the marker's agreement with the value (an evicted value, a deleted marker, a lock key of a
/// foreign type) costs at most one more round trip, never a wrong answer or a second load.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fresh_marker_follows_the_value_and_heals() {
    let shared = Shared::redis().await;
    let mut conn = shared.connection().await;
    let builder = || {
        shared
            .cache()
            .ttl(Duration::from_secs(60))
            .stale(Duration::from_secs(30))
    };
    let cache = builder().build();
    let loads = Counter::default();
    let key = cache.store_key("marked");
    let (value_name, lock_name) = (RedisStore::value_name(&key), RedisStore::lock_name(&key));
    cache
        .get_or_load("marked", slow_value(&loads, Duration::ZERO, "v1"))
        .await
        .unwrap();
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"));
    let (marker_ttl, value_ttl): (i64, i64) = (
        conn.pttl(&lock_name).await.unwrap(),
        conn.pttl(&value_name).await.unwrap(),
    );
    assert!((59_000..=60_000).contains(&marker_ttl), "{marker_ttl}");
    assert!((89_000..=90_000).contains(&value_ttl), "{value_ttl}");

    // The marker deleted behind the engine's back: the next lookup is still a hit, and it
    // puts the marker back for the value's remaining freshness.
    let _: () = conn.del(&lock_name).await.unwrap();
    let hit = builder()
        .build()
        .fetch("marked", never_called)
        .await
        .unwrap();
    assert_eq!(hit.outcome(), Outcome::L2Hit);
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"), "the marker is back");
    let marker_ttl: i64 = conn.pttl(&lock_name).await.unwrap();
    assert!((58_000..=60_000).contains(&marker_ttl), "{marker_ttl}");

    // The value evicted while its marker stands: the next lookup takes the lock anyway, and
    // one load refills it.
    let _: () = conn.del(&value_name).await.unwrap();
    let refilled = builder()
        .build()
        .fetch("marked", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v2")))
        })
        .await
        .unwrap();
    assert_eq!(refilled.outcome(), Outcome::Leader);
    assert_eq!(refilled.value().unwrap(), "v2");

    // A lock key of a foreign type counts as free: one load, and the marker replaces it.
    let _: () = conn.del(&value_name).await.unwrap();
    let _: () = conn.del(&lock_name).await.unwrap();
    let _: () = conn.hset(&lock_name, "field", "value").await.unwrap();
    let loaded = builder()
        .build()
        .fetch("marked", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v3")))
        })
        .await
        .unwrap();
    assert_eq!(loaded.outcome(), Outcome::Leader);
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"));
    assert_eq!(loads.get(), 1, "only the first load used this counter");
}

/// Past its freshness, the marker is gone while the stale value stays: exactly one lookup
/// takes the lock (`SET NX`) and one load refreshes the value.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_has_no_marker_and_one_lookup_takes_the_lock() {
    let shared = Shared::redis().await;
    let build = || {
        shared
            .cache()
            .ttl(Duration::from_secs(1))
            .stale(Duration::from_secs(30))
            .l1_capacity(0)
            .build()
    };
    let first = build();
    first
        .get_or_load("stale-one", || async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"old"))
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let loads = Counter::default();
    let mut lookups = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (cache, loads) = (build(), loads.clone());
        lookups.spawn(async move {
            cache
                .fetch("stale-one", move || async move {
                    loads.hit();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"new")))
                })
                .await
                .unwrap()
                .outcome()
        });
    }
    let outcomes = lookups.join_all().await;
    // The leader serves the stale value too, while its load refreshes it.
    assert_eq!(outcomes, [Outcome::Stale; 4]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(loads.get(), 1);
    let fresh = build().fetch("stale-one", never_called).await.unwrap();
    assert_eq!(fresh.outcome(), Outcome::L2Hit);
    assert_eq!(fresh.value().unwrap(), "new");
}

timed_test!(an_answer_written_before_a_call_began_is_not_its_answer);
/// `Loaded::for_waiters` answers the calls that began before the answer was written, however
/// late the store's replies come and however the writer was configured: a call that began just
/// after it, then waited for another holder of the lock (as another process's follower holds
/// it a moment to read the answer), loads. First its lookups answer 50 ms after they take
/// effect, so that the answer's age, read from the store, is less than the call's wait by the
/// time the reply is in; then the answer's writer keeps it far longer than the call's cache
/// would (a longer backoff), so that its age is not what that cache's own setting says.
async fn an_answer_written_before_a_call_began_is_not_its_answer(stores: Vec<Shared>) {
    for shared in stores {
        let late_replies = shared.cache().build();
        answer_then_call(&shared, &late_replies, "late", Duration::from_millis(50)).await;
        let longer_life = shared
            .cache()
            .backoff(Duration::from_millis(10), Duration::from_secs(10))
            .build();
        answer_then_call(&shared, &longer_life, "long", Duration::ZERO).await;
    }
}

/// `writer` answers the waiters of `key` (nobody waits); another holder takes the lock, a call
/// over a store whose lookups answer `late` begins and waits, and the lock is freed: the call
/// must load.
async fn answer_then_call(shared: &Shared, writer: &Cache, key: &'static str, late: Duration) {
    let answered = writer
        .fetch(key, || async {
            Ok::<_, std::io::Error>(Loaded::for_waiters(Bytes::from_static(b"503")))
        })
        .await
        .unwrap();
    assert_eq!(answered.outcome(), Outcome::Leader, "{}", shared.name);
    let store_key = writer.store_key(key);
    let holder = LockToken::random();
    let taken = shared
        .store
        .lookup(&store_key, holder, Duration::from_secs(5), LockWhen::Always)
        .await
        .unwrap();
    assert_eq!(taken.lock, LockState::Acquired, "{}", shared.name);
    let call = Cache::builder_shared(Observed::new(&shared.store, late))
        .namespace("test")
        .store_timeout(support::PATIENT)
        .build();
    let loads = Counter::default();
    let calling = tokio::spawn({
        let loads = loads.clone();
        async move {
            call.fetch(key, move || async move {
                loads.hit();
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"new")))
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(shared.store.release(&store_key, holder).await.unwrap());
    let fetched = calling.await.unwrap().unwrap();
    assert_eq!(
        (
            fetched.value().unwrap().as_ref(),
            fetched.outcome(),
            loads.get()
        ),
        (&b"new"[..], Outcome::Leader, 1),
        "{}: {key}",
        shared.name
    );
}

/// `Loaded::for_waiters`: the calls that waited for the load, in this process (one flight)
/// and in another (a follower of the lock), get its result; nothing is kept for the calls
/// that come after the load ended: each loads again, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_waiters_goes_to_them_and_is_not_reused() {
    for shared in Shared::both().await {
        let (a, b) = (shared.cache().build(), shared.cache().build());
        let loads = Counter::default();
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let loader = {
            let (loads, release) = (loads.clone(), Arc::clone(&release));
            move || {
                let (loads, release) = (loads.clone(), Arc::clone(&release));
                move || async move {
                    let n = loads.hit();
                    if n == 1 {
                        release.acquire().await.unwrap().forget();
                    }
                    Ok::<_, std::convert::Infallible>(Loaded::for_waiters(Bytes::from(format!(
                        "error {n}"
                    ))))
                }
            }
        };
        let (mut calls, started) = (Vec::new(), Counter::default());
        for i in 0..20 {
            let (cache, started) = (
                if i % 2 == 0 { a.clone() } else { b.clone() },
                started.clone(),
            );
            let loader = loader();
            calls.push(tokio::spawn(async move {
                started.hit();
                cache.fetch("k", loader).await
            }));
        }
        // The first load is held until every call has started.
        wait_until(shared.name, || loads.get() > 0 && started.get() == 20).await;
        release.add_permits(1);
        let mut first = 0;
        for call in calls {
            let fetched = call.await.unwrap().unwrap();
            let value = fetched.value().unwrap().clone();
            assert!(value.starts_with(b"error "), "{}: {value:?}", shared.name);
            if value == "error 1" {
                first += 1;
                assert!(
                    matches!(fetched.outcome(), Outcome::Leader | Outcome::Follower),
                    "{}: {:?}",
                    shared.name,
                    fetched.outcome()
                );
            }
        }
        assert!(
            first > 10,
            "{}: {first} calls waited for the first load",
            shared.name
        );
        for cache in [&a, &b] {
            let before = loads.get();
            let fetched = cache.fetch("k", loader()).await.unwrap();
            assert_eq!(fetched.outcome(), Outcome::Leader, "{}", shared.name);
            assert_eq!(
                fetched.value().unwrap(),
                &Bytes::from(format!("error {}", before + 1)),
                "{}",
                shared.name
            );
        }
    }
}

/// The span of each fetch (`stampede.fetch`) records its outcome, and for a call that did not
/// hit L1 how long it waited, for a subscriber that wants it. Without one the engine neither
/// enters, records nor times it (that cost an L2 hit about a point of a `GET`), and answers the
/// same. One thread, so the thread-local subscriber sees every task.
#[tokio::test]
async fn the_fetch_span_records_outcome_and_wait_for_a_subscriber() {
    let cache = Cache::builder(MemoryStore::new()).build();
    let load = || async { Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v"))) };
    let untraced = cache.fetch("untraced", load).await.unwrap();
    assert_eq!(untraced.outcome(), Outcome::Leader);
    assert_eq!(untraced.value().unwrap(), "v");

    let logs = support::Logs::default();
    let _guard = logs.capture();
    for expected in [Outcome::Leader, Outcome::L1Hit] {
        let fetched = cache.fetch("traced", load).await.unwrap();
        assert_eq!(fetched.outcome(), expected);
    }
    let text = logs.text();
    let closed: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("stampede.fetch{") && line.contains("close"))
        .collect();
    let outcome = |outcome: Outcome| format!("outcome=\"{}\"", outcome.label());
    assert_eq!(closed.len(), 2, "{text}");
    assert!(
        closed[0].contains(&outcome(Outcome::Leader)) && closed[0].contains("wait_ms="),
        "{text}"
    );
    assert!(
        closed[1].contains(&outcome(Outcome::L1Hit)) && !closed[1].contains("wait_ms="),
        "{text}"
    );
}
