//! Stale values: served while one leader refreshes (stale-while-revalidate), when the load fails
//! (stale-if-error) or a wait times out, and never past their window.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{stale_while_one_refreshes, timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::{Cache, ErrorKind, Loaded, Outcome, WaitTimeoutPolicy};

use crate::{hold_lock, loader, never_called, slow_value};

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
        assert_eq!(loads.get(), 1);
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
            (&b"old"[..], Outcome::Stale)
        );
        release.notify_one();
        let led = leading.await.unwrap().unwrap();
        assert_eq!(
            (led.value().unwrap().as_ref(), led.outcome()),
            (&b"new"[..], Outcome::Leader)
        );
    }
}

/// In-process joiners get no stale value past the `stale` window. A leader that finds a
/// stale value within the window posts it as its flight's early answer, and later callers in
/// that process join the flight and take it; the early answer has a deadline, the end of the
/// window, so with ttl 100 ms, stale 300 ms and a load that hangs, a caller 1550 ms past
/// freshness does not get `Stale("old")`: it waits for the load, which times out.
#[tokio::test(start_paused = true)]
async fn joiners_get_no_stale_value_past_the_window() {
    let shared = Shared::memory();
    let cache = shared
        .cache()
        .ttl(Duration::from_millis(100))
        .stale(Duration::from_millis(300))
        .load_timeout(Duration::from_secs(5))
        .build();
    let loads = Counter::default();
    cache.fetch("k", loader(&loads, Ok("old"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let hangs = || async {
        std::future::pending::<()>().await;
        Ok::<Loaded, std::io::Error>(Loaded::pass())
    };
    let first = cache.fetch("k", hangs).await.unwrap();
    assert_eq!(first.outcome(), Outcome::Stale, "within the window");
    assert_eq!(first.value().unwrap(), "old");
    tokio::time::sleep(Duration::from_millis(1400)).await;
    // 1550 ms past freshness: the joiner waits for the load, which times out.
    let late = cache.fetch("k", hangs).await;
    match late {
        Ok(fetched) => panic!(
            "{:?} {:?}: stale past the window",
            fetched.outcome(),
            fetched.value()
        ),
        Err(error) => assert_eq!(error.kind(), ErrorKind::LoadTimeout),
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
        assert_eq!(fetched.value().unwrap(), "yesterday");
        assert_eq!(fetched.outcome(), Outcome::Stale);
        assert!(
            asked.elapsed() >= Duration::from_millis(200),
            "without a stale-while-updating window, it waited first"
        );
        // Nothing stale to serve: the wait timeout is an error, and nothing loads.
        hold_lock(&shared, &cache, "never-cached").await;
        let error = cache.fetch("never-cached", never_called).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WaitTimeout);
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
        assert_eq!(fetched.value().unwrap(), "old but good");
        assert_eq!(fetched.outcome(), Outcome::Stale);
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
            assert_eq!(fetched.value().unwrap(), "last good", "#{i}");
            assert_eq!(fetched.outcome(), Outcome::Stale, "#{i}");
        }
        assert_eq!(calls.get(), 1, "the failure was shared");
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
        assert_eq!(error.kind(), ErrorKind::Load);
        let tolerant = shared
            .cache()
            .stale(Duration::from_millis(100))
            .stale_if_error(Duration::from_secs(60))
            .refresh_in_background(false)
            .build();
        assert_eq!(tolerant.get_or_load("aging", failing).await.unwrap(), "old");
    }
}
