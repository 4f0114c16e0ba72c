//! Failed loads: a failure is shared with the callers that waited and, for `failure_ttl`, with
//! every process (the failure marker); a panicking or timed-out loader frees its lock.

use std::time::Duration;

use bytes::Bytes;
use support::{store_test, timed_test, Counter, Shared};
use tower_stampede::store::{LockState, LockToken, LockWhen};
use tower_stampede::{Cache, ErrorKind};

use crate::{loader, slow_value};

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
            assert_eq!(error.kind(), ErrorKind::Load);
            // `Display` says what failed; the cause, the loader's own error, is `source`.
            assert_eq!(error.to_string(), "the load failed");
            let cause = error.get_ref().expect("the loader's error");
            assert!(cause.downcast_ref::<std::io::Error>().is_some());
            let source = std::error::Error::source(&error).expect("the loader's error");
            assert_eq!(source.to_string(), "backend down");
            assert!(source.downcast_ref::<std::io::Error>().is_some());
        }
        assert_eq!(loads.get(), 1);
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
        assert_eq!(lookup.lock, LockState::Failed);
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
        assert_eq!(lookup.lock, LockState::Acquired);
    }
}

/// A foreground load that fails tells everyone (the failure marker): another process's call
/// fails with `RecentFailure` without loading. Only a speculative early refresh leaves no
/// marker (`early_refresh::a_failed_early_refresh_does_not_fail_other_processes`).
#[tokio::test(start_paused = true)]
async fn a_failed_foreground_load_is_still_shared() {
    let shared = Shared::memory();
    let (a, b) = (shared.cache().build(), shared.cache().build());
    let loads = Counter::default();
    let error = a.fetch("k", loader(&loads, Err("down"))).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Load);
    let error = b.fetch("k", loader(&loads, Ok("v"))).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::RecentFailure);
    assert_eq!(loads.get(), 1);
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
        assert_eq!(calls.get(), 1, "one backend call, kinds {kinds:?}");
        assert_eq!(kinds.values().sum::<usize>(), 1000);
        assert!(kinds
            .keys()
            .all(|k| matches!(k, ErrorKind::Load | ErrorKind::RecentFailure)));
        // Within the window: failing at once, no call.
        let error = instances[0]
            .get_or_load("down", failing(&calls))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::RecentFailure);
        assert_eq!(calls.get(), 1);
        // After it: one call retries.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let error = instances[1]
            .get_or_load("down", failing(&calls))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load);
        assert_eq!(calls.get(), 2);
    }
}

store_test!(a_panicking_loader_is_an_error_and_releases_the_lock);
async fn a_panicking_loader_is_an_error_and_releases_the_lock(shared: Shared) {
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
    assert_eq!(error.kind(), ErrorKind::LoadPanicked);
    assert_eq!(error.to_string(), "the load panicked: loader bug");
    let loads = Counter::default();
    let value = cache
        .get_or_load("panics", slow_value(&loads, Duration::ZERO, "ok"))
        .await
        .unwrap();
    assert_eq!(value, "ok");
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
        assert_eq!(error.kind(), ErrorKind::LoadTimeout);
        assert_eq!(
            error.to_string(),
            "the load timed out: abandoned after 100ms"
        );
        assert!(std::error::Error::source(&error).is_none());
        let value = cache
            .get_or_load("hangs", slow_value(&loads, Duration::ZERO, "next"))
            .await
            .unwrap();
        assert_eq!(value, "next", "the lock was released");
        assert_eq!(loads.get(), 2);
    }
}

/// A loader's own error type, as an application has one (a database's).
#[derive(Debug)]
struct RowLocked {
    row: u64,
}

impl std::fmt::Display for RowLocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "row {} is locked", self.row)
    }
}

impl std::error::Error for RowLocked {}

store_test!(a_report_shows_the_loaders_error_once_and_finds_its_type);
async fn a_report_shows_the_loaders_error_once_and_finds_its_type(shared: Shared) {
    let cache = shared.cache().build();
    let error = cache
        .get_or_load("row:42", || async {
            Err::<Bytes, _>(RowLocked { row: 42 })
        })
        .await
        .unwrap_err();
    let report = anyhow::Error::from(error);
    let shown = format!("{report:#}");
    assert_eq!(shown, "the load failed: row 42 is locked");
    assert_eq!(shown.matches("row 42 is locked").count(), 1, "{shown}");
    let row = report
        .chain()
        .find_map(|cause| cause.downcast_ref::<RowLocked>())
        .map(|locked| locked.row);
    assert_eq!(row, Some(42));
}
