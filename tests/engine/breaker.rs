//! The store failing: a dead, full, hanging or restarted store degrades to in-process
//! protection, and the circuit breaker's probes close it once the store answers again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
#[cfg(feature = "redis")]
use support::start_leader;
use support::{timed_test, Counter, Shared};
use tower_stampede::store::{MemoryStore, Store};
use tower_stampede::{Cache, Loaded, Outcome};

use crate::{deaf_to_polls, slow_value};
#[cfg(feature = "redis")]
use crate::{loader, never_called};

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

/// A full Redis under `noeviction` (its default policy) refuses `SET … NX … GET` with `OOM`
/// even where it would write nothing, while the `GET` and `PTTL` of the same lookup answer.
/// 8 fresh instances read a value fresh for a minute: each gets an L2 hit, with no store error
/// and no load; only a miss, which needs the lock, is a store error (`Degraded`).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_still_answers_fresh_hits() {
    let shared = Shared::redis().await;
    let loads = Counter::default();
    let filler = shared.cache().build();
    filler.fetch("k", loader(&loads, Ok("v"))).await.unwrap();
    let mut conn = shared.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..8 {
        let cache = tower_stampede::Cache::builder_shared(shared.other_process().await)
            .namespace("test")
            .build();
        let fetched = cache
            .fetch("k", loader(&loads, Ok("loaded")))
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::L2Hit);
        assert_eq!(fetched.value().unwrap(), "v");
        assert_eq!(cache.stats().store_errors, 0);
    }
    assert_eq!(loads.get(), 1, "no load but the first");
    // A miss needs the lock, which a full server cannot give: in-process protection.
    let cache = shared.cache().build();
    let fetched = cache.fetch("other", loader(&loads, Ok("w"))).await.unwrap();
    assert_eq!(fetched.outcome(), Outcome::Degraded);
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
        assert_eq!(fetched.outcome(), Outcome::Degraded);
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
        .unwrap_or_else(|_| panic!("the lock was left behind"))
        .unwrap();
        assert_eq!(led.outcome(), Outcome::Leader);
    }
}

/// A probe that never completes does not leave the breaker open for good (issue 16,
/// configuration hazards). Every lookup and read of the store hangs: the breaker opens, and its probes
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
