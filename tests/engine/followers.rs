//! The leader and its followers: one load for a stampede over many callers and processes, a
//! follower that takes over from a leader that died or failed, followers woken by the fill, and
//! what a follower does when its wait times out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{start_leader, store_test, timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::store::{LockState, LockToken, LockWhen, MemoryStore, Store};
use tower_stampede::{Cache, ErrorKind, Loaded, Outcome, WaitTimeoutPolicy};

use crate::{deaf_to_polls, hold_lock, never_called, slow_value};
use tower_stampede::store::StoreExt;

store_test!(thousand_callers_over_four_instances_cost_one_load);
async fn thousand_callers_over_four_instances_cost_one_load(shared: Shared) {
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
        assert_eq!(caller.await.unwrap().unwrap(), "the value");
    }
    assert_eq!(loads.get(), 1, "backend loads");
    let loads_per_instance: u64 = instances.iter().map(|c| c.stats().loads).sum();
    assert_eq!(loads_per_instance, 1);
}

store_test!(a_dropped_leader_still_fills_the_cache);
async fn a_dropped_leader_still_fills_the_cache(shared: Shared) {
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
        assert_eq!(follower.await.unwrap().unwrap(), "filled anyway");
    }
    assert_eq!(loads.get(), 1);
    let stored = shared.store.get(&other.store_key("dropped")).await.unwrap();
    assert!(stored.is_some(), "the value was stored");
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
            assert_eq!(follower.await.unwrap().unwrap(), "recovered");
        }
        assert_eq!(loads.get(), 1);
        // The dead leader's token no longer opens anything.
        assert!(!shared.store.release(&key, dead).await.unwrap());
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
            assert_eq!(caller.await.unwrap().unwrap(), "finally");
        }
        assert_eq!(loads.get(), 1);
    }
}

/// A load three times as long as the lock's TTL is still one load: the leader's watchdog
/// renews its lock while it loads, so the followers of the other instances, which look the key
/// up every 5 to 10 ms, never find it free. Paused time over the embedded store. The same rule
/// over Redis, with seconds to spare on real time, is
/// `a_six_second_load_under_default_settings_is_one_load` (5 s locks, a 6 s load).
#[tokio::test(start_paused = true)]
async fn a_load_longer_than_the_lock_ttl_is_still_one_load() {
    let shared = Shared::memory();
    let instances: Vec<Cache> = (0..3)
        .map(|_| {
            shared
                .cache()
                .lock_ttl(Duration::from_millis(150))
                .backoff(Duration::from_millis(10), Duration::from_millis(10))
                .poll_while_notified(Duration::from_millis(10))
                .build()
        })
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
        assert_eq!(caller.await.unwrap().unwrap(), "slow");
    }
    assert_eq!(loads.get(), 1, "the watchdog kept the lock");
}

store_test!(concurrent_misses_in_one_process_cost_one_store_lookup);
async fn concurrent_misses_in_one_process_cost_one_store_lookup(shared: Shared) {
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
        assert_eq!(caller.await.unwrap().unwrap(), "once");
    }
    assert_eq!(counting.lookups(), 1);
    assert_eq!(loads.get(), 1);
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
                .unwrap_or_else(|_| panic!("follower not woken by the fill"))
                .unwrap()
                .unwrap();
            assert_eq!(fetched.value().unwrap(), "filled");
            assert_eq!(fetched.outcome(), Outcome::Follower);
        }
        assert_eq!(leading.await.unwrap().unwrap(), "filled");
        assert_eq!(loads.get(), 1);
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
            .unwrap_or_else(|_| panic!("follower not woken by the release"))
            .unwrap()
            .unwrap();
        assert_eq!(value, "second try");
        assert_eq!(loads.get(), 1);
    }
}

/// With `backoff(0, 0)` a follower does not spin on the store (issue 16, configuration
/// hazards). Paused time: a leader loads for 100 ms while a follower (notifications off, so it
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

store_test!(a_pass_tells_followers_not_to_wait);
async fn a_pass_tells_followers_not_to_wait(shared: Shared) {
    let a = shared.cache().build();
    let b = shared.cache().build();
    let fetched = a
        .fetch("huge", || async { Ok::<_, std::io::Error>(Loaded::pass()) })
        .await
        .unwrap();
    assert_eq!(fetched.outcome(), Outcome::Pass);
    assert!(fetched.value().is_none());
    let follower = b.fetch("huge", never_called).await.unwrap();
    assert_eq!(follower.outcome(), Outcome::Pass);
    let error = b
        .get_or_load("huge", || async { Ok::<_, std::io::Error>(Bytes::new()) })
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Pass);
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
            assert_eq!(fetched.value().unwrap(), "direct");
            outcomes.push(fetched.outcome());
        }
        assert_eq!(loads.get(), 1, "one uncached load per process");
        assert_eq!(
            outcomes.iter().filter(|o| **o == Outcome::Uncached).count(),
            1
        );
        assert_eq!(
            shared.store.get(&uncached.store_key("busy")).await.unwrap(),
            None,
            "not stored"
        );

        let strict = shared
            .cache()
            .wait_timeout(Duration::from_millis(100))
            .on_wait_timeout(WaitTimeoutPolicy::Error)
            .build();
        let error = strict.fetch("busy", never_called).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WaitTimeout);

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
        assert_eq!(loads.get(), 1);
        let hit = second.fetch("busy", never_called).await.unwrap();
        assert_eq!(hit.value().unwrap(), "cached anyway");
        assert_eq!(hit.outcome(), Outcome::L2Hit);
    }
}

#[test]
fn a_flight_dropped_with_its_runtime_does_not_poison_the_key() {
    let cache = Cache::builder(MemoryStore::new()).build();
    {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
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
        .start_paused(true)
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
