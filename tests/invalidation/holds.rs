//! Invalidation that holds (issue 29, defects 1 and 2): a change reaches the flights of the
//! instance that made it, and an invalidated value is never served again, stale or not, by
//! key or by tag. Over both stores, as the rest of this suite.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;

use super::*;

/// The changes an instance can make to a key it has a load of in flight.
#[derive(Clone, Copy, Debug)]
enum Change {
    Invalidate,
    Set,
    InvalidateTag,
    Expire,
}

impl Change {
    /// Makes the change on `cache`: afterwards the key reads `v2`.
    async fn make(self, cache: &Cache, key: &str) {
        match self {
            Change::Invalidate => cache.invalidate(key).await.unwrap(),
            Change::Set => cache
                .set(key, Bytes::from_static(b"v2"), Duration::from_secs(60))
                .await
                .unwrap(),
            Change::InvalidateTag => cache.invalidate_tag("users").await.unwrap(),
            // Without a stale window, an expired value is reloaded before it is served.
            Change::Expire => cache.expire(key).await.unwrap(),
        }
    }
}

store_test!(a_read_after_a_change_never_joins_a_load_from_before_it);
/// Defect 1: instance A has a load of `row` in flight that has read version 1; A changes `row`
/// (`invalidate`, `set`, or `invalidate_tag` of a tag the load returns), and the change
/// returns; then a new read of `row` in A. It must not join the flight from before the
/// change (which answers version 1 to the callers it had): it starts or follows a new load.
/// The read is polled once before the old load ends, so that on the old code it had joined
/// that flight; then the old load ends, and the read answers version 2.
async fn a_read_after_a_change_never_joins_a_load_from_before_it(shared: Shared) {
    for change in [Change::Invalidate, Change::Set, Change::InvalidateTag] {
        let cache = instances(&shared, 1, as_is).await.remove(0);
        let key: &'static str = match change {
            Change::Invalidate => "row-invalidated",
            Change::Set => "row-set",
            _ => "row-tagged",
        };
        let db = Database::at(1);
        let (slow, finish) = slow_load(&cache, &db, key, &["users"]).await;
        db.move_to(2);
        change.make(&cache, key).await;
        let read = as_the_load_ends(db.read_tagged(&cache, key, &["users"]), &finish).await;
        assert_eq!(
            read, "v2",
            "{change:?}: a read after the change joined the load from before it"
        );
        assert_eq!(slow.await.unwrap(), "v1", "its own caller");
    }
}

store_test!(a_read_after_a_change_heard_from_elsewhere_never_takes_a_load_from_before_it);
/// Defect 1, from another instance: instance A has a load of a key (tagged `users`) in
/// flight that has read version 1; instance B invalidates, sets or expires the key, or
/// invalidates `users`, and A hears of it (its notifier's stamp of the key, or of the tag,
/// moves on). A read in A after that must not be answered by A's flight from before the
/// change (which answers version 1 to the callers it had): by key, it starts or follows a new
/// load, as after a change A made itself; by tag (which A cannot know the flight's value
/// carries until it is loaded), the flight's value turns out outdated once loaded, and the
/// read fetches again instead of taking it.
async fn a_read_after_a_change_heard_from_elsewhere_never_takes_a_load_from_before_it(
    shared: Shared,
) {
    for change in [
        Change::Invalidate,
        Change::Set,
        Change::Expire,
        Change::InvalidateTag,
    ] {
        let caches = instances(&shared, 2, as_is).await;
        let (a, b) = (&caches[0], &caches[1]);
        let key: &'static str = match change {
            Change::Invalidate => "heard-invalidated",
            Change::Set => "heard-set",
            Change::Expire => "heard-expired",
            Change::InvalidateTag => "heard-tagged",
        };
        let db = Database::at(1);
        let (slow, finish) = slow_load(a, &db, key, &["users"]).await;
        let digest = match change {
            Change::InvalidateTag => tower_stampede::store::KeyDigest::of_tag(b"users"),
            _ => *a.store_key(key).digest(),
        };
        let notifier = a.store().notifier().unwrap();
        let before = notifier.stamp_anyway(&digest);
        db.move_to(2);
        change.make(b, key).await;
        support::wait_until("A hears of the change", || {
            notifier.stamp_anyway(&digest) != before
        })
        .await;
        let read = as_the_load_ends(db.read_tagged(a, key, &["users"]), &finish).await;
        assert_eq!(
            read, "v2",
            "{change:?}: a read after the change was heard took the load from before it"
        );
        assert_eq!(slow.await.unwrap(), "v1", "its own caller");
    }
}

store_test!(a_read_after_a_tag_invalidation_never_takes_a_load_after_a_wait_timeout_from_before_it);
/// Defect 1, by tag, after a wait timeout (`WaitTimeoutPolicy::LoadAndCache`, and
/// `LoadUncached`): instance B leads a load of a key tagged `users` that hangs; instance A
/// follows, gives up waiting and loads the key itself, reading version 1. B invalidates
/// `users`, and A hears of it. A read in A after that joins A's flight (its tags unknown until
/// loaded); once loaded, the value turns out outdated, and the read must fetch again (version
/// 2), not take it.
async fn a_read_after_a_tag_invalidation_never_takes_a_load_after_a_wait_timeout_from_before_it(
    shared: Shared,
) {
    use tower_stampede::WaitTimeoutPolicy;
    fn gives_up(builder: CacheBuilder) -> CacheBuilder {
        as_is(builder).wait_timeout(Duration::from_millis(100))
    }
    fn and_caches(builder: CacheBuilder) -> CacheBuilder {
        gives_up(builder).on_wait_timeout(WaitTimeoutPolicy::LoadAndCache)
    }
    fn uncached(builder: CacheBuilder) -> CacheBuilder {
        gives_up(builder).on_wait_timeout(WaitTimeoutPolicy::LoadUncached)
    }
    type Tune = fn(CacheBuilder) -> CacheBuilder;
    for (key, tune) in [
        ("gave-up-and-cached", and_caches as Tune),
        ("gave-up-uncached", uncached),
    ] {
        let caches = instances(&shared, 2, tune).await;
        let (a, b) = (&caches[0], &caches[1]);
        let db = Database::at(1);
        // B holds the lock with a load that never ends before the read is answered.
        let (leader, _hangs) = slow_load(b, &db, key, &["users"]).await;
        let (slow, finish) = slow_load(a, &db, key, &["users"]).await;
        let read = read_after_a_heard_tag_invalidation(&db, (a, b), key, &finish).await;
        assert_eq!(
            read, "v2",
            "{key}: a read after the invalidation was heard took the load from before it"
        );
        assert_eq!(slow.await.unwrap(), "v1", "{key}: its own caller");
        leader.abort();
    }
}

store_test!(a_read_after_a_tag_invalidation_never_takes_a_renewal_from_before_it);
/// Defect 1, by tag, through a renewal: instance A revalidates a stale value tagged `users`
/// (version 1) and its loader, handed it, finds it unchanged ("not modified") but is held
/// before it answers. B invalidates `users`, and A hears of it. A read in A after that joins
/// A's flight; the renewed value is outdated by the invalidation, and the read must fetch
/// again (version 2), not take the renewal.
async fn a_read_after_a_tag_invalidation_never_takes_a_renewal_from_before_it(shared: Shared) {
    let caches = instances(&shared, 2, reloads_in_the_foreground).await;
    let (a, b) = (&caches[0], &caches[1]);
    let key = "renewed";
    let db = Database::at(1);
    assert_eq!(db.read_tagged(a, key, &["users"]).await, "v1");
    a.expire(key).await.unwrap();
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let renewal = tokio::spawn({
        let (a, db, started, finish) = (a.clone(), db.clone(), started.clone(), finish.clone());
        async move {
            a.fetch_revalidating(key, move |previous| async move {
                let version = db.version.load(Ordering::SeqCst);
                started.notify_one();
                finish.notified().await;
                Ok::<_, std::io::Error>(match previous {
                    Some(previous) if previous.value() == &format!("v{version}") => {
                        tower_stampede::Loaded::not_modified()
                    }
                    _ => tower_stampede::Loaded::value(Bytes::from(format!("v{version}")))
                        .tags(["users"]),
                })
            })
            .await
            .unwrap()
        }
    });
    started.notified().await;
    let read = read_after_a_heard_tag_invalidation(&db, (a, b), key, &finish).await;
    assert_eq!(
        read, "v2",
        "a read after the invalidation was heard took the renewal from before it"
    );
    let renewed = renewal.await.unwrap();
    assert_eq!(
        (renewed.outcome(), renewed.value().cloned()),
        (Outcome::Revalidated, Some(Bytes::from_static(b"v1"))),
        "its own caller"
    );
}

/// A stale window, and no refresh in the background: a reload's callers wait for its answer.
fn reloads_in_the_foreground(builder: CacheBuilder) -> CacheBuilder {
    as_is(builder)
        .stale(Duration::from_secs(30))
        .refresh_in_background(false)
}

/// The row moves to version 2 and `b` invalidates the tag `users`; once `a` has heard of it,
/// what a read of `key` in `a` answers, polled once before the load in flight ends (see
/// [`as_the_load_ends`]).
async fn read_after_a_heard_tag_invalidation(
    db: &Database,
    (a, b): (&Cache, &Cache),
    key: &str,
    finish: &Notify,
) -> Bytes {
    let notifier = a.store().notifier().unwrap();
    let tag = tower_stampede::store::KeyDigest::of_tag(b"users");
    let before = notifier.stamp_anyway(&tag);
    db.move_to(2);
    b.invalidate_tag("users").await.unwrap();
    support::wait_until("A hears of the invalidation", || {
        notifier.stamp_anyway(&tag) != before
    })
    .await;
    as_the_load_ends(db.read_tagged(a, key, &["users"]), finish).await
}

/// What `read` answers when it is polled once before the load in flight ends (so that, where
/// the engine lets it, it joins that load) and then the load is let `finish`.
async fn as_the_load_ends(read: impl Future<Output = Bytes>, finish: &Notify) -> Bytes {
    let mut read = pin!(read);
    let first = poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
    finish.notify_one();
    match first {
        Poll::Ready(read) => read,
        Poll::Pending => tokio::time::timeout(LIMIT, read).await.unwrap(),
    }
}

store_test!(a_value_whose_tag_was_invalidated_is_never_served_stale);
/// Defect 2, by tag: a tagged value past its freshness (`expire`), within the stale window;
/// its tag is invalidated. The next read takes the lock and reloads: it must not answer the
/// invalidated value as its early stale answer (nor hand it to a revalidating loader), and if
/// the reload fails, it must not stand in for it (stale-if-error).
async fn a_value_whose_tag_was_invalidated_is_never_served_stale(shared: Shared) {
    fn stale(builder: CacheBuilder) -> CacheBuilder {
        as_is(builder).stale(Duration::from_secs(30))
    }
    let cache = instances(&shared, 1, stale).await.remove(0);
    let db = Database::at(1);
    for key in ["reloads", "fails"] {
        assert_eq!(db.read_tagged(&cache, key, &["users"]).await, "v1");
        cache.expire(key).await.unwrap();
    }
    db.move_to(2);
    cache.invalidate_tag("users").await.unwrap();
    let reloaded = cache
        .fetch_revalidating("reloads", |previous| async move {
            assert!(previous.is_none(), "an invalidated value is no previous");
            Ok::<_, std::io::Error>(
                tower_stampede::Loaded::value(Bytes::from_static(b"v2")).tags(["users"]),
            )
        })
        .await
        .unwrap();
    assert_eq!(
        (reloaded.outcome(), reloaded.value().cloned()),
        (Outcome::Leader, Some(Bytes::from_static(b"v2"))),
        "the early stale answer was the invalidated value"
    );
    let failed = cache
        .fetch("fails", || async {
            Err::<tower_stampede::Loaded, _>(std::io::Error::other("the backend is down"))
        })
        .await;
    assert!(
        failed.is_err(),
        "the invalidated value stood in for a failed reload: {:?}",
        failed.map(|f| f.value().cloned())
    );
}

store_test!(a_value_invalidated_during_its_reload_does_not_stand_in_for_a_failure);
/// Defect 2, by key and by tag during the reload: a stale value is being reloaded (no
/// refresh in the background, so the caller waits for the load); while the load runs, the key
/// is invalidated (or its tag); then the load fails. The value the change removed must not
/// stand in for the failed load.
async fn a_value_invalidated_during_its_reload_does_not_stand_in_for_a_failure(shared: Shared) {
    for change in [Change::Invalidate, Change::InvalidateTag] {
        let cache = instances(&shared, 1, reloads_in_the_foreground)
            .await
            .remove(0);
        let db = Database::at(1);
        let key = match change {
            Change::Invalidate => "by-key",
            _ => "by-tag",
        };
        assert_eq!(db.read_tagged(&cache, key, &["users"]).await, "v1");
        cache.expire(key).await.unwrap();
        let (started, fail) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let reload = tokio::spawn({
            let (cache, started, fail) = (cache.clone(), started.clone(), fail.clone());
            async move {
                cache
                    .fetch(key, move || async move {
                        started.notify_one();
                        fail.notified().await;
                        Err::<tower_stampede::Loaded, _>(std::io::Error::other("down"))
                    })
                    .await
            }
        });
        started.notified().await;
        change.make(&cache, key).await;
        fail.notify_one();
        let answer = reload.await.unwrap();
        assert!(
            answer.is_err(),
            "{change:?}: served {:?} after the change",
            answer.map(|f| f.value().cloned())
        );
    }
}

store_test!(an_early_stale_answer_is_withdrawn_once_a_change_elsewhere_is_heard);
/// Defect 2, from another instance: instance A reloads a stale tagged value (the load held),
/// its callers answered the stale value at once (the flight's early answer). Instance B
/// invalidates the value's tag (or the key). Once A has heard of it, a new read in A must not
/// take the early answer of A's reload: the value it stands for is invalidated.
async fn an_early_stale_answer_is_withdrawn_once_a_change_elsewhere_is_heard(shared: Shared) {
    fn stale(builder: CacheBuilder) -> CacheBuilder {
        as_is(builder).stale(Duration::from_secs(30))
    }
    for change in [Change::Invalidate, Change::InvalidateTag] {
        let caches = instances(&shared, 2, stale).await;
        let (a, b) = (&caches[0], &caches[1]);
        let key = match change {
            Change::Invalidate => "early-by-key",
            _ => "early-by-tag",
        };
        let db = Database::at(1);
        assert_eq!(db.read_tagged(a, key, &["users"]).await, "v1");
        a.expire(key).await.unwrap();
        db.move_to(2);
        // A's reload: its caller is answered the stale value at once; the load is held.
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let first = a
            .fetch(key, {
                let (db, started, finish) = (db.clone(), started.clone(), finish.clone());
                move || async move {
                    let version = db.version.load(Ordering::SeqCst);
                    started.notify_one();
                    finish.notified().await;
                    Ok::<_, std::io::Error>(
                        tower_stampede::Loaded::value(Bytes::from(format!("v{version}")))
                            .tags(["users"]),
                    )
                }
            })
            .await
            .unwrap();
        assert_eq!(first.outcome(), Outcome::Stale);
        started.notified().await;
        // B changes the key, and A hears of it.
        let digest = match change {
            Change::Invalidate => *a.store_key(key).digest(),
            _ => tower_stampede::store::KeyDigest::of_tag(b"users"),
        };
        let notifier = a.store().notifier().unwrap();
        let before = notifier.stamp_anyway(&digest);
        db.move_to(3);
        change.make(b, key).await;
        support::wait_until("A hears of the change", || {
            notifier.stamp_anyway(&digest) != before
        })
        .await;
        let mut read = pin!(db.read_tagged(a, key, &["users"]));
        let polled = poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await;
        if let Poll::Ready(value) = &polled {
            assert_ne!(
                value, "v1",
                "{change:?}: the early answer outlived the change"
            );
        }
        finish.notify_one();
        let value = match polled {
            Poll::Ready(value) => value,
            Poll::Pending => tokio::time::timeout(LIMIT, read).await.unwrap(),
        };
        // A change of the key heard from elsewhere detaches the reload; one of a tag
        // withdraws the stale value, and the reload may still answer.
        assert_ne!(value, "v1", "{change:?}");
    }
}

/// How a test loses the store's tag state behind the engine's back.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug)]
enum Lost {
    /// Before the invalidation that outdates the value.
    BeforeTheInvalidation,
    /// After it.
    AfterTheInvalidation,
}

/// Defect 3: losing the tag state (a key of it evicted under an `allkeys-*` policy, or
/// `DEL`eted alone) must never bring an invalidated value back, nor lose a later
/// invalidation. For each Redis key the store keeps for tags, alone: three invalidations of
/// `users` (clock 3), then `row` is read (`v1`, tagged `users`, clock 3); the key is deleted
/// before or after `users` is invalidated again with the row at `v2`; a new instance must read
/// `v2`. Before the fix, a lost versions hash read as 0 made `v1` valid again, and a lost
/// clock started again at 1 recorded the later invalidation below `v1`'s clock. Redis only:
/// `MemoryStore` never evicts its tag state.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_tag_state_never_brings_an_invalidated_value_back() {
    for lost in [Lost::BeforeTheInvalidation, Lost::AfterTheInvalidation] {
        // The names of the tag state, as a first instance leaves them.
        let names: Vec<String> = {
            let shared = Shared::redis().await;
            let cache = instances(&shared, 1, as_is).await.remove(0);
            let db = Database::at(1);
            cache.invalidate_tag("users").await.unwrap();
            db.read_tagged(&cache, "row", &["users"]).await;
            let mut redis = shared.connection().await;
            let mut names: Vec<String> = ::redis::cmd("KEYS")
                .arg("test:{tags}:*")
                .query_async(&mut redis)
                .await
                .unwrap();
            names.sort();
            names
        };
        assert!(!names.is_empty());
        for name in names {
            let shared = Shared::redis().await;
            let redis = shared.connection().await;
            let cache = instances(&shared, 1, as_is).await.remove(0);
            let db = Database::at(1);
            for _ in 0..3 {
                cache.invalidate_tag("users").await.unwrap();
            }
            assert_eq!(db.read_tagged(&cache, "row", &["users"]).await, "v1");
            let lose = || {
                let (name, mut redis) = (name.clone(), redis.clone());
                async move {
                    let _: () = ::redis::cmd("DEL")
                        .arg(&name)
                        .query_async(&mut redis)
                        .await
                        .unwrap();
                }
            };
            if let Lost::BeforeTheInvalidation = lost {
                lose().await;
            }
            db.move_to(2);
            cache.invalidate_tag("users").await.unwrap();
            if let Lost::AfterTheInvalidation = lost {
                lose().await;
            }
            let other = instances(&shared, 1, as_is).await.remove(0);
            assert_eq!(
                db.read_tagged(&other, "row", &["users"]).await,
                "v2",
                "{name} lost {lost:?}: an invalidated value came back"
            );
        }
    }
}

store_test!(a_first_tagged_load_of_a_tag_invalidated_before_is_valid_on_arrival);
/// Item 9: a process's first tagged load, of a tag invalidated before (in another process).
/// Its value must be valid on arrival: another process reads it from the store, no second
/// load. Before the fix, a process's loads before any loader of it returned tags stored
/// clock 0, which the past invalidation outdated at once, so that stampede loaded twice.
async fn a_first_tagged_load_of_a_tag_invalidated_before_is_valid_on_arrival(shared: Shared) {
    let caches = instances(&shared, 3, as_is).await;
    caches[0].invalidate_tag("users").await.unwrap();
    let db = Database::at(1);
    assert_eq!(db.read_tagged(&caches[1], "row", &["users"]).await, "v1");
    let read = caches[2].fetch("row", never_loads).await.unwrap();
    assert_eq!(read.outcome(), Outcome::L2Hit);
    assert_eq!(db.loads.get(), 1, "one load");
}

store_test!(tag_versions_are_bounded);
/// Item 10: tag versions were kept for every tag ever invalidated, never fewer. Past
/// `MAX_TAG_VERSIONS` tags, an invalidation now starts a new generation: the state shrinks to
/// the tags of that invalidation, and a value tagged before is outdated (one reload), never
/// valid again.
async fn tag_versions_are_bounded(shared: Shared) {
    use tower_stampede::store::{KeyDigest, MAX_TAG_VERSIONS};
    /// Invalidations of ten thousand tags at once take Redis more than the default timeout.
    fn patient(builder: CacheBuilder) -> CacheBuilder {
        as_is(builder).store_timeout(Duration::from_secs(10))
    }
    let cache = instances(&shared, 1, patient).await.remove(0);
    let db = Database::at(1);
    assert_eq!(db.read_tagged(&cache, "row", &["kept"]).await, "v1");
    let first = KeyDigest::of_tag(b"t0");
    let chunk = 10_000;
    for start in (0..MAX_TAG_VERSIONS).step_by(chunk) {
        let tags: Vec<String> = (start..start + chunk).map(|i| format!("t{i}")).collect();
        cache.invalidate_tags(&tags).await.unwrap();
    }
    let before = shared
        .store
        .tag_versions("test", &[first])
        .await
        .unwrap()
        .unwrap();
    assert!(before.versions[0] > 0);
    db.move_to(2);
    cache.invalidate_tag("one more").await.unwrap();
    let after = shared
        .store
        .tag_versions("test", &[first, KeyDigest::of_tag(b"one more")])
        .await
        .unwrap()
        .unwrap();
    assert_ne!(after.generation, before.generation);
    assert_eq!(after.versions, [0, 1], "a new generation");
    #[cfg(feature = "redis")]
    if shared.name == "redis" {
        let mut redis = shared.connection().await;
        let fields: usize = ::redis::cmd("HLEN")
            .arg("test:{tags}:h")
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(fields, 3, "the generation, the clock, one tag");
    }
    assert_eq!(
        db.read_tagged(&cache, "row", &["kept"]).await,
        "v2",
        "a value of the older generation is outdated"
    );
}
