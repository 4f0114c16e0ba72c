//! Protocol defects found by an adversarial review (issue 16), each a scenario that failed
//! before its fix: over the embedded `MemoryStore` on paused time, and (feature `redis`) a real
//! `redis-server` where the defect is the store's.

mod support;

use std::time::Duration;

use bytes::Bytes;
use support::{Counter, Shared};
use tower_stampede::{ErrorKind, Loaded, Outcome};

fn loader(
    loads: &Counter,
    answer: Result<&'static str, &'static str>,
) -> impl FnOnce() -> std::future::Ready<Result<Loaded, std::io::Error>> + Send + 'static {
    let loads = loads.clone();
    move || {
        loads.hit();
        std::future::ready(
            answer
                .map(|v| Loaded::value(Bytes::from_static(v.as_bytes())))
                .map_err(std::io::Error::other),
        )
    }
}

/// A failed early refresh must not make every other process fail. An early (XFetch) refresh
/// is speculative: the value is still fresh and nobody waits for it. With the default
/// settings (no stale window), a refresh whose loader failed wrote the shared failure marker;
/// the value then expired while the marker stood, and every other process's callers got
/// `RecentFailure` for `failure_ttl` although none of their loads had been tried. A failed
/// early refresh now only releases its lock.
#[tokio::test(start_paused = true)]
async fn a_failed_early_refresh_does_not_fail_other_processes() {
    let shared = Shared::memory();
    let ttl = Duration::from_millis(200);
    // β this large refreshes at the first hit.
    let a = shared.cache().ttl(ttl).early_refresh(1e6).build();
    let b = shared.cache().ttl(ttl).early_refresh(1e6).build();
    let (a_loads, b_loads) = (Counter::default(), Counter::default());
    a.fetch("k", loader(&a_loads, Ok("v"))).await.unwrap();
    // An L1 hit that starts an early refresh, whose loader fails.
    let hit = a
        .fetch("k", loader(&a_loads, Err("backend down")))
        .await
        .unwrap();
    assert_eq!(hit.outcome(), Outcome::L1Hit);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(a.stats().early_refreshes, 1);
    assert_eq!(a_loads.get(), 2, "the refresh ran and failed");
    // The value expires; the other process's caller loads instead of failing.
    tokio::time::sleep(ttl).await;
    let fetched = b.fetch("k", loader(&b_loads, Ok("w"))).await;
    let fetched = fetched.unwrap_or_else(|e| panic!("{e:?}: the failed refresh failed b"));
    assert_eq!(fetched.outcome(), Outcome::Leader);
    assert_eq!(fetched.value().unwrap(), "w");
    assert_eq!(b_loads.get(), 1);
}

/// A foreground load that fails still tells everyone (the failure marker), as before: the
/// fix above is for speculative refreshes only.
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

/// A full Redis under `noeviction` (its default policy) refuses `SET … NX … GET` with `OOM`
/// even where it would write nothing. The lookup threw away the `GET` and `PTTL` replies,
/// which did answer, so every lookup was a store error and every caller loaded (8 fresh
/// instances: 8 `Degraded` loads of a value fresh for a minute). A fresh value is now a hit;
/// only a miss, which needs the lock, is a store error.
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
