//! Revalidation and a value's own stale windows in the engine, over the embedded `MemoryStore`
//! and (feature `redis`) a real `redis-server`: a revalidating loader is handed the value the
//! store still keeps and may answer "not modified", which renews the value for every process
//! without its bytes; a value may carry its own stale-while-revalidate and stale-if-error
//! windows (RFC 5861) or forbid being served stale (RFC 9111 §4.2.4).
//!
//! Tests that depend on timing are `timed_test!`s (paused time over memory); each instance is
//! a `Cache` of its own (its own L1), so no L1 holds what the test made stale.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{stale_while_one_refreshes, store_test, timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::store::StoreExt;
use tower_stampede::store::{LockState, LockToken, LockWhen, Renewal};
use tower_stampede::{Cache, ErrorKind, Loaded, Outcome, Previous, WaitTimeoutPolicy};

/// An instance that keeps values a minute past their freshness, to revalidate them.
fn keeping(shared: &Shared) -> tower_stampede::CacheBuilder {
    shared
        .cache()
        .keep_for_revalidation(Duration::from_secs(60))
}

/// Fills `key` with `loaded` (whose payload is `value`) through an instance of its own that
/// keeps it for revalidation, then waits until it is stale (values here are fresh for 200 ms).
async fn stale_value(shared: &Shared, key: &str, value: &'static str, loaded: Loaded) {
    let cache = keeping(shared).build();
    let fetched = cache
        .fetch(key, move || async move { Ok::<_, std::io::Error>(loaded) })
        .await
        .unwrap();
    assert_eq!(fetched.value().unwrap(), value);
    tokio::time::sleep(Duration::from_millis(400)).await;
}

fn short(value: &'static str) -> Loaded {
    Loaded::value_with_ttl(
        Bytes::from_static(value.as_bytes()),
        Duration::from_millis(200),
    )
}

async fn never_called() -> Result<Loaded, std::io::Error> {
    panic!("the value was fresh: no load expected")
}

/// Holds the reload of `key` (through `cache`) until the returned notify is notified; returns
/// once the load has begun, with the load's task.
async fn hold_reload(
    cache: Cache,
    key: &'static str,
    value: &'static str,
) -> (
    Arc<Notify>,
    tokio::task::JoinHandle<Result<tower_stampede::Fetched, tower_stampede::Error>>,
) {
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let leading = tokio::spawn({
        let (started, release) = (started.clone(), release.clone());
        async move {
            cache
                .fetch(key, move || async move {
                    started.notify_one();
                    release.notified().await;
                    Ok::<_, std::io::Error>(short(value))
                })
                .await
        }
    });
    started.notified().await;
    (release, leading)
}

/// What a follower gets while another instance reloads: a stale value at once, or (when it
/// may not have one) a wait that ends in `WaitTimeout` after 300 ms.
async fn follow(cache: Cache, key: &str) -> Result<tower_stampede::Fetched, tower_stampede::Error> {
    cache.fetch(key, never_called).await
}

timed_test!(one_not_modified_renews_the_value_for_every_process);
async fn one_not_modified_renews_the_value_for_every_process(stores: Vec<Shared>) {
    for shared in stores {
        stale_value(&shared, "doc", "v1", short("v1")).await;
        // Two instances on this store's connections, one on another process's (for Redis its
        // own connections and subscriber); no stale window: everybody waits for the reload.
        let mut instances: Vec<Cache> = (0..2).map(|_| keeping(&shared).build()).collect();
        instances.push(
            Cache::builder_shared(shared.other_process().await)
                .namespace("test")
                .keep_for_revalidation(Duration::from_secs(60))
                .build(),
        );
        let (loads, seen) = (
            Counter::default(),
            Arc::new(std::sync::Mutex::new(Vec::new())),
        );
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let mut callers = Vec::new();
        for i in 0..30 {
            let cache = instances[i % 3].clone();
            let (loads, seen) = (loads.clone(), seen.clone());
            let (started, release) = (started.clone(), release.clone());
            callers.push(tokio::spawn(async move {
                cache
                    .fetch_revalidating("doc", move |previous: Option<Previous>| async move {
                        loads.hit();
                        seen.lock()
                            .unwrap()
                            .push(previous.map(|p| p.value().clone()));
                        started.notify_one();
                        release.notified().await;
                        Ok::<_, std::io::Error>(Loaded::not_modified_with_ttl(Duration::from_secs(
                            60,
                        )))
                    })
                    .await
            }));
        }
        started.notified().await;
        release.notify_one();
        let mut revalidated = 0;
        for caller in callers {
            let fetched = caller.await.unwrap().unwrap();
            assert_eq!(fetched.value().unwrap(), "v1");
            revalidated += usize::from(fetched.outcome() == Outcome::Revalidated);
        }
        assert_eq!(loads.get(), 1, "one conditional load");
        assert_eq!(revalidated, 1, "one caller ran it");
        assert_eq!(
            *seen.lock().unwrap(),
            [Some(Bytes::from_static(b"v1"))],
            "the loader saw the stored value"
        );
        // Fresh again for 60 s, in every process: a new instance's read is an L2 hit.
        let later = shared.cache().build();
        let fetched = later.fetch("doc", never_called).await.unwrap();
        assert_eq!(
            (fetched.value().unwrap().as_ref(), fetched.outcome()),
            (&b"v1"[..], Outcome::L2Hit)
        );
    }
}

timed_test!(a_changed_value_replaces_the_previous_one);
async fn a_changed_value_replaces_the_previous_one(stores: Vec<Shared>) {
    for shared in stores {
        stale_value(&shared, "row", "v1", short("v1")).await;
        let cache = keeping(&shared).build();
        let fetched = cache
            .fetch_revalidating("row", |previous| async move {
                assert_eq!(previous.unwrap().value(), "v1");
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v2")))
            })
            .await
            .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Leader);
        let later = shared.cache().build();
        assert_eq!(
            later
                .fetch("row", never_called)
                .await
                .unwrap()
                .value()
                .unwrap(),
            "v2"
        );
    }
}

store_test!(without_a_previous_value_not_modified_is_a_failed_load);
async fn without_a_previous_value_not_modified_is_a_failed_load(shared: Shared) {
    let cache = shared.cache().failure_ttl(Duration::ZERO).build();
    let loads = Counter::default();
    let error = cache
        .fetch_revalidating("cold", {
            let loads = loads.clone();
            move |previous| async move {
                loads.hit();
                assert!(previous.is_none());
                Ok::<_, std::io::Error>(Loaded::not_modified())
            }
        })
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Load);
    // Nothing was stored and the lock is free: the next load runs and fills.
    let fetched = cache
        .fetch_revalidating("cold", |_| async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded")))
        })
        .await
        .unwrap();
    assert_eq!(fetched.outcome(), Outcome::Leader);
    assert_eq!(loads.get(), 1);
}

store_test!(renew_is_fenced_and_keeps_the_bytes);
/// The store's renewal: fenced by the lock's token, it makes the value fresh again without
/// rewriting it, frees the lock, and says when there is no value to renew.
async fn renew_is_fenced_and_keeps_the_bytes(shared: Shared) {
    let store = &shared.store;
    let cache = shared.cache().build();
    let key = cache.store_key("renewed");
    let (ours, theirs) = (LockToken::random(), LockToken::random());
    let ttl = Duration::from_secs(1);
    let stale_below = Duration::from_secs(600);
    // No value: the lock is taken, renewal says there is nothing to renew and keeps it.
    let lookup = store
        .lookup(&key, ours, ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    let renewed = store.renew(&key, ours, Duration::from_secs(60)).await;
    assert_eq!(renewed.unwrap(), Renewal::NoValue);
    assert!(store.extend(&[(key.clone(), ours)], ttl).await.unwrap()[0]);
    // A value (stale under the bound): another token cannot renew it, ours can.
    let bytes = Bytes::from_static(b"kept as it is");
    assert!(store
        .fill(&key, ours, bytes.clone(), Duration::from_secs(60))
        .await
        .unwrap());
    let lookup = store
        .lookup(&key, ours, ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    let refused = store.renew(&key, theirs, Duration::from_secs(900)).await;
    assert_eq!(refused.unwrap(), Renewal::LockLost);
    let renewed = store.renew(&key, ours, Duration::from_secs(900)).await;
    assert_eq!(renewed.unwrap(), Renewal::Renewed);
    let stored = store.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.bytes, bytes);
    assert!(stored.ttl.unwrap() > stale_below, "{:?}", stored.ttl);
    // Fresh again: the next lookup does not take the lock (on Redis, the `fresh` marker
    // the renewal left turns the pipelined `SET NX` away).
    let lookup = store
        .lookup(&key, theirs, ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::NotRequested);
    // The renewal freed the lock: it is ours no more.
    assert!(!store.release(&key, ours).await.unwrap());
}

timed_test!(a_value_s_own_windows_replace_the_cache_s);
/// RFC 5861 §3 and §4, RFC 9111 §4.2.4: a value's own windows decide, whatever the cache's.
async fn a_value_s_own_windows_replace_the_cache_s(stores: Vec<Shared>) {
    for shared in stores {
        // The cache would serve anything stale for 60 s; these values say otherwise.
        let generous = || {
            shared
                .cache()
                .stale(Duration::from_secs(60))
                .refresh_in_background(false)
                .build()
        };
        stale_value(&shared, "strict", "s", short("s").must_revalidate()).await;
        stale_value(
            &shared,
            "no-error",
            "e",
            short("e").stale_if_error(Duration::ZERO),
        )
        .await;
        // Must revalidate: a follower waits for the reload instead of taking the stale value
        // (and, with the reload held, its wait times out).
        let (release, leading) = hold_reload(generous(), "strict", "s2").await;
        let follower = shared
            .cache()
            .stale(Duration::from_secs(60))
            .wait_timeout(Duration::from_millis(300))
            .on_wait_timeout(WaitTimeoutPolicy::Error)
            .build();
        let waited = follow(follower.clone(), "strict").await.unwrap_err();
        assert_eq!(waited.kind(), ErrorKind::WaitTimeout, "never served stale");
        release.notify_one();
        let led = leading.await.unwrap().unwrap();
        assert_eq!(led.value().unwrap(), "s2");
        // The same follower, for a value that says nothing: the cache's window serves it.
        stale_value(&shared, "lenient", "l", short("l")).await;
        let (release, leading) = hold_reload(generous(), "lenient", "l2").await;
        let served = follow(follower, "lenient").await.unwrap();
        assert_eq!(
            (served.value().unwrap().as_ref(), served.outcome()),
            (&b"l"[..], Outcome::Stale)
        );
        release.notify_one();
        leading.await.unwrap().unwrap();
        // No stale-if-error window: a failed reload is an error, not the stale value.
        let error = generous()
            .fetch("no-error", || async {
                Err::<Loaded, _>(std::io::Error::other("backend down"))
            })
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Load);
    }
}

timed_test!(a_value_s_own_window_serves_it_stale_where_the_cache_would_not);
/// RFC 5861 §3: `stale-while-revalidate` of the value's own, in a cache without a stale
/// window (it keeps values for revalidation): served stale while one reload runs.
async fn a_value_s_own_window_serves_it_stale_where_the_cache_would_not(stores: Vec<Shared>) {
    for shared in stores {
        stale_value(
            &shared,
            "feed",
            "old",
            short("old").stale_while_revalidate(Duration::from_secs(30)),
        )
        .await;
        let instances: Vec<Cache> = (0..2).map(|_| keeping(&shared).build()).collect();
        let (release, _) =
            stale_while_one_refreshes(shared.name, &instances, "feed", 20, "old", "new").await;
        release.notify_one();
        // Without a window of its own, the cache's (none) decides: a follower waits.
        stale_value(&shared, "plain", "p", short("p")).await;
        let (release, leading) = hold_reload(instances[0].clone(), "plain", "p2").await;
        let follower = keeping(&shared)
            .wait_timeout(Duration::from_millis(300))
            .on_wait_timeout(WaitTimeoutPolicy::Error)
            .build();
        let waited = follow(follower, "plain").await.unwrap_err();
        assert_eq!(waited.kind(), ErrorKind::WaitTimeout);
        release.notify_one();
        assert_eq!(leading.await.unwrap().unwrap().value().unwrap(), "p2");
    }
}

/// Returns once `cache`'s store has seen a lookup after `before` (the pipelined lookup's
/// `SET … NX` on Redis), so that a follower just started is waiting for the load; over
/// memory (paused time) a step of time lets it look up.
async fn until_looked_up(shared: &Shared, before: u64) {
    #[cfg(feature = "redis")]
    if shared.name == "redis" {
        let mut conn = shared.connection().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while support::calls(&mut conn, "set").await <= before {
            assert!(tokio::time::Instant::now() < deadline, "no lookup in 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        return;
    }
    let _ = (shared, before);
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// `SET` calls the Redis server has run (0 over memory).
async fn sets(shared: &Shared) -> u64 {
    #[cfg(feature = "redis")]
    if shared.name == "redis" {
        return support::calls(&mut shared.connection().await, "set").await;
    }
    let _ = shared;
    0
}

timed_test!(a_result_for_waiters_keeps_the_value_kept_for_revalidation);
/// RFC 9111 §4.3.1 and §4.3.4, in the engine: a load whose result is for its waiters only
/// (`Loaded::for_waiters`, what the HTTP layer answers for an origin's `5xx`) gives it to the
/// call that waited for it, in another process, and leaves the value kept for revalidation:
/// the next load's loader is handed it, and "not modified" renews it.
async fn a_result_for_waiters_keeps_the_value_kept_for_revalidation(stores: Vec<Shared>) {
    for shared in stores {
        // Never served stale: the follower waits for the reload.
        stale_value(&shared, "page", "v1", short("v1").must_revalidate()).await;
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let leading = tokio::spawn({
            let cache = keeping(&shared).build();
            let (seen, started, release) = (seen.clone(), started.clone(), release.clone());
            async move {
                cache
                    .fetch_revalidating("page", move |previous: Option<Previous>| async move {
                        seen.lock()
                            .unwrap()
                            .push(previous.map(|p| p.value().clone()));
                        started.notify_one();
                        release.notified().await;
                        Ok::<_, std::io::Error>(Loaded::for_waiters(Bytes::from_static(b"503")))
                    })
                    .await
            }
        });
        started.notified().await;
        let before = sets(&shared).await;
        let other = Cache::builder_shared(shared.other_process().await)
            .namespace("test")
            .keep_for_revalidation(Duration::from_secs(60))
            .store_timeout(support::PATIENT)
            .build();
        let following = tokio::spawn(async move { other.fetch("page", never_called).await });
        until_looked_up(&shared, before).await;
        // The answer goes to the calls that started before it was written, which the engine
        // tells by the store's clock (in milliseconds, read a round trip late): one that
        // joined a moment before the load ended may load again instead. This one joined well
        // before.
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.notify_one();
        let led = leading.await.unwrap().unwrap();
        assert_eq!(
            (led.value().unwrap().as_ref(), led.outcome()),
            (&b"503"[..], Outcome::Leader)
        );
        let followed = following.await.unwrap().unwrap();
        assert_eq!(
            (followed.value().unwrap().as_ref(), followed.outcome()),
            (&b"503"[..], Outcome::Follower),
            "the waiter got the load's result"
        );
        // The next load is a revalidation of the kept value, which "not modified" renews.
        let next = keeping(&shared).build();
        let revalidated = next
            .fetch_revalidating("page", {
                let seen = seen.clone();
                move |previous| async move {
                    seen.lock()
                        .unwrap()
                        .push(previous.map(|p| p.value().clone()));
                    Ok::<_, std::io::Error>(Loaded::not_modified_with_ttl(Duration::from_secs(60)))
                }
            })
            .await;
        let v1 = Some(Bytes::from_static(b"v1"));
        assert_eq!(
            *seen.lock().unwrap(),
            [v1.clone(), v1],
            "both loads were handed the kept value"
        );
        let revalidated = revalidated.unwrap();
        assert_eq!(
            (revalidated.value().unwrap().as_ref(), revalidated.outcome()),
            (&b"v1"[..], Outcome::Revalidated)
        );
        let later = shared.cache().build();
        let hit = later.fetch("page", never_called).await.unwrap();
        assert_eq!(
            (hit.value().unwrap().as_ref(), hit.outcome()),
            (&b"v1"[..], Outcome::L2Hit),
            "fresh again for every process"
        );
    }
}

store_test!(answer_waiters_is_fenced_and_keeps_the_value);
/// The store's answer for waiters: fenced by the lock's token, it keeps the answer beside the
/// value (which stays, bytes and life), frees the lock, and the answer can be read back.
async fn answer_waiters_is_fenced_and_keeps_the_value(shared: Shared) {
    let store = &shared.store;
    let cache = shared.cache().build();
    let key = cache.store_key("answered");
    let (ours, theirs) = (LockToken::random(), LockToken::random());
    let (lock_ttl, stale_below) = (Duration::from_secs(5), Duration::from_secs(600));
    let kept = Bytes::from_static(b"kept for revalidation");
    // A value stale under the bound, and our lock on it.
    let lookup = store
        .lookup(&key, ours, lock_ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    assert!(store
        .fill(&key, ours, kept.clone(), Duration::from_secs(60))
        .await
        .unwrap());
    let lookup = store
        .lookup(&key, ours, lock_ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    let answer = Bytes::from_static(b"503 for the waiters");
    let ttl = Duration::from_secs(3);
    // Another token's answer changes nothing.
    assert!(!store
        .answer_waiters(&key, theirs, answer.clone(), ttl)
        .await
        .unwrap());
    assert_eq!(store.waiters_answer(&key).await.unwrap(), None);
    assert!(store
        .answer_waiters(&key, ours, answer.clone(), ttl)
        .await
        .unwrap());
    let read = store.waiters_answer(&key).await.unwrap().unwrap();
    assert_eq!(read.bytes, answer);
    assert!(read.ttl.is_some_and(|t| t <= ttl));
    let value = store.get(&key).await.unwrap().unwrap();
    assert_eq!(value.bytes, kept, "the value stays");
    assert!(
        value
            .ttl
            .is_some_and(|t| t > ttl && t <= Duration::from_secs(60)),
        "with its life"
    );
    // The lock is free (ours no more): the next lookup of the stale value takes it.
    assert!(!store.release(&key, ours).await.unwrap());
    let lookup = store
        .lookup(&key, theirs, lock_ttl, LockWhen::LifeAtMost(stale_below))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    assert_eq!(lookup.value.unwrap().bytes, kept);
}
