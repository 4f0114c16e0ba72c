//! Locks and fenced writes: a lock is released and extended by its owner alone, and no write
//! (a late fill, a write after a wait timeout, a fill after a lost lock) puts an older value over
//! a newer one.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{store_test, timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::store::{load_start, LockState, LockToken, LockWhen};
use tower_stampede::{Cache, Loaded, Outcome};

use crate::loader;
use tower_stampede::store::StoreExt;

store_test!(locks_are_released_and_extended_only_by_their_owner);
async fn locks_are_released_and_extended_only_by_their_owner(shared: Shared) {
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
    assert_eq!(first.lock, LockState::Acquired);
    let second = store
        .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(second.lock, LockState::HeldElsewhere);
    assert!(!store.release(&key, intruder).await.unwrap());
    assert!(!store.extend(&[(key.clone(), intruder)], ttl).await.unwrap()[0]);
    assert!(!store
        .fill(&key, intruder, Bytes::from_static(b"x"), ttl)
        .await
        .unwrap());
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "intruder's fill refused"
    );
    // Still the owner's lock.
    let third = store
        .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(third.lock, LockState::HeldElsewhere);
    assert!(store.extend(&[(key.clone(), owner)], ttl).await.unwrap()[0]);
    assert!(store.release(&key, owner).await.unwrap());
    assert!(!store.release(&key, owner).await.unwrap(), "already gone");
    let fourth = store
        .lookup(&key, intruder, ttl, LockWhen::LifeAtMost(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(fourth.lock, LockState::Acquired, "free again");
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
            LockState::Acquired
        );
        assert!(store
            .fill(&key, newer, Bytes::from_static(b"newer"), ttl)
            .await
            .unwrap());
        // The late leader's fill is refused and the newer value stays.
        assert!(!store
            .fill(&key, late, Bytes::from_static(b"stale"), ttl)
            .await
            .unwrap());
        let stored = store.get(&key).await.unwrap().unwrap();
        assert_eq!(stored.bytes, "newer");
        assert!(stored.ttl.unwrap() > Duration::from_secs(50));
    }
}

/// Starts `cache.get_or_load(key)` with a load that runs until the returned sender is used
/// (or dropped), then answers `value`; returns once the load has begun.
async fn held_load(
    cache: &tower_stampede::Cache,
    key: &str,
    value: &'static str,
) -> (
    tokio::task::JoinHandle<Result<Bytes, tower_stampede::Error>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let (end, ends) = tokio::sync::oneshot::channel::<()>();
    let load = tokio::spawn({
        let (cache, key, started) = (cache.clone(), key.to_owned(), started.clone());
        async move {
            cache
                .get_or_load(key, move || async move {
                    started.notify_one();
                    let _ = ends.await;
                    Ok::<_, std::io::Error>(Bytes::from_static(value.as_bytes()))
                })
                .await
        }
    });
    started.notified().await;
    (load, end)
}

/// The later writer in [`a_follower_that_gave_up_never_overwrites_a_newer_value`].
#[derive(Clone, Copy, Debug)]
enum LaterWriter {
    /// A leader of a later stampede (the first leader's lock voided by an invalidation).
    Leader,
    /// The application's write-through `set`.
    Set,
}

store_test!(a_follower_that_gave_up_never_overwrites_a_newer_value);
/// A write after a wait timeout is fenced by its load's start (issue 16 #6). A follower B
/// gives up waiting for a slow leader A and loads itself (`WaitTimeoutPolicy::LoadAndCache`);
/// its load is slow too. Meanwhile a later writer C stores a newer value: the leader of a
/// later stampede, or the application's `set`. When B's load ends, its write is refused, as
/// the stored value's load started later (the load start is in the entry's header), and C's
/// value stays.
async fn a_follower_that_gave_up_never_overwrites_a_newer_value(shared: Shared) {
    use tower_stampede::WaitTimeoutPolicy;
    for writer in [LaterWriter::Leader, LaterWriter::Set] {
        let case = format!("{writer:?}");
        let key = format!("k-{writer:?}");
        // A leads, and its load hangs: its lock stands (the watchdog renews it).
        let a = shared.cache().build();
        let (a_leader, _a_hangs) = held_load(&a, &key, "a").await;
        // B follows, gives up after 100 ms and loads "old" itself, until told to end.
        let b = tower_stampede::Cache::builder_shared(shared.other_process().await)
            .namespace("test")
            .wait_timeout(Duration::from_millis(100))
            .on_wait_timeout(WaitTimeoutPolicy::LoadAndCache)
            .build();
        let (b_follower, b_end) = held_load(&b, &key, "old").await;
        // Load starts are ordered on the wall clock, to the millisecond: let it move on (on
        // paused time, by exactly that; a thread's sleep would not move it).
        tokio::time::sleep(Duration::from_millis(3)).await;
        // C writes "new", later than B's load started.
        let c = shared.cache().build();
        match writer {
            LaterWriter::Leader => {
                c.invalidate(&key).await.unwrap();
                let loads = Counter::default();
                let filled = c.fetch(&key, loader(&loads, Ok("new"))).await.unwrap();
                assert_eq!(filled.outcome(), Outcome::Leader, "{case}");
            }
            LaterWriter::Set => {
                c.set(&key, "new", Duration::from_secs(60)).await.unwrap();
            }
        }
        // B's load ends: B's callers get their own load's value...
        b_end.send(()).unwrap();
        let answered = b_follower.await.unwrap().unwrap();
        assert_eq!(answered, "old", "{case}");
        // ...but the store keeps the newer one, as every other process sees.
        let d = shared.cache().build();
        let loads = Counter::default();
        let read = d.fetch(&key, loader(&loads, Ok("reloaded"))).await.unwrap();
        assert_eq!(
            read.value().unwrap(),
            "new",
            "{case}: overwritten by an older load"
        );
        assert_eq!(read.outcome(), Outcome::L2Hit, "{case}");
        // B's own L1 does not keep the older value either.
        let again = b.fetch(&key, loader(&loads, Ok("reloaded"))).await.unwrap();
        assert_eq!(
            again.value().unwrap(),
            "new",
            "{case}: B kept its older value"
        );
        a_leader.abort();
    }
}

store_test!(a_slow_leader_never_overwrites_a_newer_value_put_after_a_wait_timeout);
/// A leader's fill is fenced by its load's start as well as by its lock (issue 29, item 8).
/// Leader A (a slow load, its lock renewed) starts first; follower B gives up waiting, loads
/// "new" itself, later, and stores it (`LoadAndCache`). When A's older load ends, its fill,
/// still holding the lock, is refused, as the stored value's load started later: B's value
/// stays, the lock is freed all the same, and followers are told.
async fn a_slow_leader_never_overwrites_a_newer_value_put_after_a_wait_timeout(shared: Shared) {
    use tower_stampede::WaitTimeoutPolicy;
    let case = shared.name;
    // A leads, and its load hangs until told to end: its lock stands.
    let a = shared.cache().build();
    let (a_leader, a_end) = held_load(&a, "k", "old").await;
    // Load starts are ordered on the wall clock, to the millisecond: let it move on (on
    // paused time, by exactly that; a thread's sleep would not move it).
    tokio::time::sleep(Duration::from_millis(3)).await;
    // B follows, gives up after 100 ms, loads "new" itself and stores it.
    let b = tower_stampede::Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .wait_timeout(Duration::from_millis(100))
        .on_wait_timeout(WaitTimeoutPolicy::LoadAndCache)
        .build();
    let loads = Counter::default();
    let put = b.fetch("k", loader(&loads, Ok("new"))).await.unwrap();
    assert_eq!(put.value().unwrap(), "new", "{case}");
    // A's load ends: its callers get their own load's value...
    a_end.send(()).unwrap();
    assert_eq!(a_leader.await.unwrap().unwrap(), "old", "{case}");
    // ...but the store keeps the newer one, and nobody waits for A's lock.
    let c = shared.cache().build();
    let read = c.fetch("k", loader(&loads, Ok("reloaded"))).await.unwrap();
    assert_eq!(
        (read.value().unwrap().as_ref(), read.outcome()),
        (&b"new"[..], Outcome::L2Hit),
        "{case}: overwritten by an older load"
    );
}

/// A lost lock (evicted while its leader loads, issue 16 #5) lets a second leader start,
/// and the first leader's fill is then refused: one load too many, never an older value
/// over a newer one. The first leader's callers get its own value; the store and every
/// other process the second leader's.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_means_a_refused_fill_not_a_wrong_value() {
    use redis::AsyncCommands;
    use tower_stampede::store::RedisStore;
    let shared = Shared::redis().await;
    let a = shared.cache().build();
    let (first, end) = held_load(&a, "k", "first").await;
    let mut conn = shared.connection().await;
    let _: () = conn
        .del(RedisStore::lock_name(&a.store_key("k")))
        .await
        .unwrap();
    let b = tower_stampede::Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .build();
    let loads = Counter::default();
    let second = b.fetch("k", loader(&loads, Ok("second"))).await.unwrap();
    assert_eq!(second.outcome(), Outcome::Leader, "a second leader");
    end.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), "first", "its own callers");
    for cache in [&a, &b] {
        let read = cache.fetch("k", loader(&loads, Ok("third"))).await.unwrap();
        assert_eq!(read.value().unwrap(), "second");
    }
    assert_eq!(loads.get(), 1);
}

store_test!(a_fill_that_keeps_a_newer_value_tells_this_process);
/// A fill refused because the stored value's load started later still frees the lock
/// (`Settle::Fill`'s `KeptNewer`), and a store notifies its own changes in this process
/// before the call returns (`Store::notifier`), as a release does: this process's followers
/// wake at once instead of at their next poll. On Redis, the script's own "filled" message
/// is skipped when it comes back, so only the store's answer can tell this process.
async fn a_fill_that_keeps_a_newer_value_tells_this_process(shared: Shared) {
    let case = shared.name;
    let store = &shared.store;
    let key = Cache::builder_shared(store.clone())
        .build()
        .store_key("kept");
    // A value of the engine's format, its load started at `start` (ms since the epoch).
    let loaded_at = |start: u64| {
        let mut bytes = b"TS\x02\0\0\0\0\0".to_vec();
        bytes.extend(start.to_be_bytes());
        bytes.extend(b"payload");
        Bytes::from(bytes)
    };
    assert_eq!(load_start(&loaded_at(7)), Some(7));
    let (older, newer) = (loaded_at(1_000), loaded_at(2_000));
    let ttl = Duration::from_secs(10);
    let leader = LockToken::random();
    let lookup = store
        .lookup(&key, leader, ttl, LockWhen::LifeAtMost(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired, "{case}");
    assert!(store.put(&key, newer.clone(), ttl).await.unwrap(), "{case}");
    let notifier = store.notifier().expect("a store with notifications");
    let before = notifier.stamp_anyway(key.digest());
    assert!(
        !store.fill(&key, leader, older, ttl).await.unwrap(),
        "{case}: an older load filled over a newer value"
    );
    assert_ne!(
        notifier.stamp_anyway(key.digest()),
        before,
        "{case}: the lock was freed and this process not told"
    );
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().bytes,
        newer,
        "{case}"
    );
    let next = store
        .lookup(&key, LockToken::random(), ttl, LockWhen::Always)
        .await
        .unwrap();
    assert_eq!(next.lock, LockState::Acquired, "{case}: the lock was kept");
}

store_test!(a_failed_fill_keeps_no_value_outdated_during_its_load);
/// One rule for keeping a loaded value in L1 after its write, whether the write succeeded or
/// failed (review of issue 16): a tagged value whose tag was invalidated during its load is
/// not kept. Here the leader's fill fails, its tag is invalidated while it loads, and the
/// next fetch in its process loads again instead of hitting the outdated value in L1.
async fn a_failed_fill_keeps_no_value_outdated_during_its_load(shared: Shared) {
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
    assert_eq!(first.value().unwrap(), "outdated");
    let loads_again = loads.clone();
    let second = cache
        .fetch("tagged", move || async move {
            loads_again.hit();
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"current")).tags(["t"]))
        })
        .await
        .unwrap();
    assert_ne!(second.outcome(), Outcome::L1Hit, "kept in L1");
    assert_eq!(second.value().unwrap(), "current");
    assert_eq!(loads.get(), 2);
}

store_test!(a_set_that_lands_after_a_newer_one_changes_nothing);

/// A `set` that reaches the store after a newer one (its caller timed out while the network
/// held its bytes, and they flowed once the path healed) changes nothing: the newer value
/// stands, and the late write still answers `Ok` (it was superseded, not lost). Replayed here
/// as the store would receive it: the older entry's own bytes, written again after the newer
/// `set`. Bytes that are not the engine's entries carry no write time and are not fenced.
async fn a_set_that_lands_after_a_newer_one_changes_nothing(shared: Shared) {
    let store = &shared.store;
    let cache = Cache::builder_shared(store.clone()).build();
    let key = cache.store_key("late");
    let ttl = Duration::from_secs(60);
    cache.set("late", "old", ttl).await.unwrap();
    let old = store
        .get(&key)
        .await
        .unwrap()
        .expect("the old set stored")
        .bytes;
    // Written a few milliseconds later by the clock the entries carry.
    tokio::time::sleep(Duration::from_millis(5)).await;
    cache.set("late", "new", ttl).await.unwrap();
    let new = store
        .get(&key)
        .await
        .unwrap()
        .expect("the new set stored")
        .bytes;
    assert!(
        load_start(&old) < load_start(&new),
        "the new set was written later"
    );

    store.set(&key, old.clone(), ttl, ttl).await.unwrap();
    let stored = store.get(&key).await.unwrap().expect("a value").bytes;
    assert_eq!(stored, new, "the late set undid the newer one");
    let read = cache
        .fetch("late", loader(&Counter::default(), Ok("loaded")))
        .await
        .unwrap();
    assert_eq!(read.value().map(|v| &v[..]), Some(&b"new"[..]));

    // Foreign bytes have no write time: they are written, and overwritten, as sent.
    store
        .set(&key, Bytes::from_static(b"foreign"), ttl, ttl)
        .await
        .unwrap();
    let stored = store.get(&key).await.unwrap().expect("a value").bytes;
    assert_eq!(stored, Bytes::from_static(b"foreign"));
    store.set(&key, old.clone(), ttl, ttl).await.unwrap();
    let stored = store.get(&key).await.unwrap().expect("a value").bytes;
    assert_eq!(stored, old, "an entry over foreign bytes is written");
}
