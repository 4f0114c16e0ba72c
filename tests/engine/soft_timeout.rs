//! Soft timeouts: a caller that has a stale value within its window gets it once the reload
//! has taken the soft timeout, while the reload goes on; its fill lands for everyone, and it
//! is still one load.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::{Cache, Fetched, Loaded, Outcome};

use crate::never_called;

const SOFT: Duration = Duration::from_millis(50);

/// A cache whose values may stand in for a failed load for a minute (so a stale value is
/// there to answer with), but are never served while a reload runs (`stale` is zero).
fn cache(shared: &Shared) -> tower_stampede::CacheBuilder {
    shared.cache().stale_if_error(Duration::from_secs(60))
}

/// Stores `old` under `key` and makes it stale (kept for the stale-if-error window).
async fn stale_entry(cache: &Cache, key: &str) {
    cache
        .fetch(key, || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"old")))
        })
        .await
        .unwrap();
    cache.expire(key).await.unwrap();
}

/// A loader that counts its call, says it started, and answers `new` once `gate` opens.
fn gated(
    loads: &Counter,
    started: &Arc<Notify>,
    gate: &Arc<Notify>,
) -> impl FnOnce() -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Loaded, std::io::Error>> + Send>,
> + Send
       + 'static {
    let (loads, started, gate) = (loads.clone(), started.clone(), gate.clone());
    move || {
        Box::pin(async move {
            loads.hit();
            started.notify_one();
            gate.notified().await;
            Ok(Loaded::value(Bytes::from_static(b"new")))
        })
    }
}

/// The answer of `fetch`, or a failure if it waits for the whole (gated) load: the gate
/// stays shut for far longer than any soft timeout here.
async fn answered(name: &str, fetch: impl std::future::Future<Output = Fetched>) -> Fetched {
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .unwrap_or_else(|_| panic!("{name}: the caller waited for the whole load"))
}

/// Fetches `key` until it answers `new` (the reload's fill landed).
async fn eventually_new(name: &str, cache: &Cache, key: &str) {
    for _ in 0..1000 {
        let fetched = cache.fetch(key, never_called).await.unwrap();
        if fetched.value().unwrap() == "new" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}: the reload's fill never landed");
}

timed_test!(a_leader_answers_stale_after_its_soft_timeout_and_its_load_fills);
/// The leader's own caller finds the value stale and takes the lock; its load hangs on a
/// gate. After the soft timeout it is answered the stale value (`Outcome::Stale`); the load
/// goes on, and once the gate opens its fill is what every process reads, with one load.
async fn a_leader_answers_stale_after_its_soft_timeout_and_its_load_fills(stores: Vec<Shared>) {
    for shared in stores {
        let cache = cache(&shared).soft_timeout(SOFT).build();
        let other = shared.cache().build();
        stale_entry(&cache, "soft-leader").await;
        let (loads, started, gate) = (Counter::default(), Arc::default(), Arc::new(Notify::new()));
        let fetch = cache.fetch("soft-leader", gated(&loads, &started, &gate));
        let fetched = answered(shared.name, async { fetch.await.unwrap() }).await;
        assert_eq!(
            (fetched.value().unwrap().as_ref(), fetched.outcome()),
            (&b"old"[..], Outcome::Stale)
        );
        assert_eq!(loads.get(), 1, "the load runs on");
        gate.notify_one();
        eventually_new(shared.name, &other, "soft-leader").await;
        eventually_new(shared.name, &cache, "soft-leader").await;
        assert_eq!(loads.get(), 1, "one load");
    }
}

timed_test!(a_follower_answers_stale_after_its_own_soft_timeout);
/// Another process leads the reload (without a soft timeout, so it waits for it); a
/// follower that asks for a soft timeout on its call gets the stale value after it, and the
/// leader's fill lands for everyone: one load in all.
async fn a_follower_answers_stale_after_its_own_soft_timeout(stores: Vec<Shared>) {
    for shared in stores {
        let leader = cache(&shared).refresh_in_background(false).build();
        let follower = cache(&shared).build();
        stale_entry(&leader, "soft-follower").await;
        let (loads, started, gate) = (
            Counter::default(),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        let leading = tokio::spawn({
            let (leader, load) = (leader.clone(), gated(&loads, &started, &gate));
            async move { leader.fetch("soft-follower", load).await }
        });
        started.notified().await;
        let fetch = follower.fetch_with_soft_timeout("soft-follower", SOFT, never_called);
        let fetched = answered(shared.name, async { fetch.await.unwrap() }).await;
        assert_eq!(
            (fetched.value().unwrap().as_ref(), fetched.outcome()),
            (&b"old"[..], Outcome::Stale)
        );
        gate.notify_one();
        let led = leading.await.unwrap().unwrap();
        assert_eq!(led.outcome(), Outcome::Leader);
        eventually_new(shared.name, &follower, "soft-follower").await;
        assert_eq!(loads.get(), 1, "one load");
    }
}

timed_test!(without_a_stale_value_a_soft_timeout_waits_for_the_load);
/// A soft timeout needs a value to answer with: a caller of a key with no value waits for
/// its load.
async fn without_a_stale_value_a_soft_timeout_waits_for_the_load(stores: Vec<Shared>) {
    for shared in stores {
        let cache = cache(&shared)
            .soft_timeout(Duration::from_millis(1))
            .build();
        let loaded = cache
            .fetch("soft-cold", || async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
            })
            .await
            .unwrap();
        assert_eq!(
            (loaded.value().unwrap().as_ref(), loaded.outcome()),
            (&b"v"[..], Outcome::Leader)
        );
    }
}
