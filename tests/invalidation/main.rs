//! Correcting the cache: `invalidate`, `set` and `expire`, over the embedded `MemoryStore` and
//! (feature `redis`) a real `redis-server`, with several app instances, each a `Cache` of its
//! own (its own L1) over its own store connections (its own subscriber).
//!
//! Tests that wait for a notification poll with a bounded deadline; none sleeps and hopes.
//! `clear.rs` holds `Cache::clear`; `holds.rs` invalidation that holds (issue 29).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{store_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::{Cache, CacheBuilder, Outcome};

/// The failure guard on anything that waits for a notification: far beyond what it needs.
const LIMIT: Duration = Duration::from_secs(5);

/// A test "database": a row whose version the test moves on.
#[derive(Clone, Default)]
struct Database {
    version: Arc<AtomicU32>,
    loads: Counter,
}

impl Database {
    fn at(version: u32) -> Self {
        let db = Database::default();
        db.version.store(version, Ordering::SeqCst);
        db
    }

    fn move_to(&self, version: u32) {
        self.version.store(version, Ordering::SeqCst);
    }

    /// Reads the row as `instance` would: one load.
    async fn read(&self, cache: &Cache, key: &str) -> Bytes {
        let db = self.clone();
        cache
            .get_or_load(key, move || async move {
                db.loads.hit();
                let version = db.version.load(Ordering::SeqCst);
                Ok::<_, std::io::Error>(Bytes::from(format!("v{version}")))
            })
            .await
            .unwrap()
    }
}

/// `count` app instances over the shared store, each with its own connections, each
/// subscribed to the namespace's notifications (a first flight subscribes; the instances wait
/// until a change made by the first one reaches each of them, so no test races a subscription
/// still on its way).
async fn instances(
    shared: &Shared,
    count: usize,
    tune: fn(CacheBuilder) -> CacheBuilder,
) -> Vec<Cache> {
    let mut instances = Vec::new();
    for _ in 0..count {
        let store = shared.other_process().await;
        instances.push(tune(Cache::builder_shared(store).namespace("test")).build());
    }
    let probe = "subscription probe";
    for cache in &instances {
        let _ = cache
            .get_or_load(probe, || async { Ok::<_, std::io::Error>(Bytes::new()) })
            .await;
    }
    let deadline = tokio::time::Instant::now() + LIMIT;
    for cache in &instances {
        let Some(notifier) = cache.store().notifier() else {
            continue;
        };
        let digest = *cache.store_key(probe).digest();
        loop {
            let before = notifier.stamp_anyway(&digest);
            instances[0].invalidate(probe).await.unwrap();
            let heard = tokio::time::Instant::now() + Duration::from_millis(50);
            while notifier.stamp_anyway(&digest) == before && tokio::time::Instant::now() < heard {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if notifier.stamp_anyway(&digest) != before {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "never subscribed");
        }
    }
    instances
}

/// L1 copies that would outlive every deadline of these tests, were they not kept in step.
fn as_is(builder: CacheBuilder) -> CacheBuilder {
    builder.l1_ttl_cap(Duration::from_secs(120))
}

/// Reads `key` on `cache` until it answers `want` (a notification has been delivered and
/// acted on), within [`LIMIT`].
async fn eventually(db: &Database, cache: &Cache, key: &str, want: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        if db.read(cache, key).await == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never read {want} after the change"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Starts a load of `key` on `cache` that reads `db` at once and then waits: returns once it
/// has read, with its task and the switch that lets it finish (and fill).
async fn slow_load(
    cache: &Cache,
    db: &Database,
    key: &'static str,
    tags: &'static [&'static str],
) -> (tokio::task::JoinHandle<Bytes>, Arc<Notify>) {
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let task = tokio::spawn({
        let (cache, db, started, finish) =
            (cache.clone(), db.clone(), started.clone(), finish.clone());
        async move {
            cache
                .fetch(key, move || async move {
                    db.loads.hit();
                    let version = db.version.load(Ordering::SeqCst);
                    started.notify_one();
                    finish.notified().await;
                    let value = Bytes::from(format!("v{version}"));
                    Ok::<_, std::io::Error>(tower_stampede::Loaded::value(value).tags(tags))
                })
                .await
                .unwrap()
                .into_value()
                .unwrap()
        }
    });
    started.notified().await;
    (task, finish)
}

store_test!(a_load_that_started_before_an_invalidation_cannot_fill);
/// The race the fence is for: a loader reads version 1, the database moves to version 2 and
/// `invalidate` is called while that load still runs. The load answers its own caller with
/// version 1, but its fill is refused (the invalidation voided its lock), so afterwards every
/// instance reads version 2. Without the fence, the late fill would put version 1 back for a
/// whole TTL.
async fn a_load_that_started_before_an_invalidation_cannot_fill(shared: Shared) {
    overtaken_load(&shared, Reach::AtOnce, |cache| {
        Box::pin(async move { cache.invalidate("row").await.unwrap() })
    })
    .await;
}

/// When a change made in one instance holds in the others.
#[derive(Clone, Copy)]
enum Reach {
    /// As soon as the call returns: the store refuses the overtaken fill.
    AtOnce,
    /// Once the change's notification is delivered: until then another instance may hold
    /// what it read or filled before, in its L1 and in the generation it knows.
    OnceNotified,
}

/// A load of "row" in one of three instances reads version 1; the database moves to version
/// 2 and `change` is made in another instance while the load runs. The load answers its own
/// caller with version 1, and afterwards (as `reach` says) every instance reads version 2,
/// one reload in all.
async fn overtaken_load(
    shared: &Shared,
    reach: Reach,
    change: impl for<'a> Fn(&'a Cache) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>,
) {
    let caches = instances(shared, 3, as_is).await;
    let db = Database::at(1);
    let (slow, finish) = slow_load(&caches[0], &db, "row", &[]).await;
    db.move_to(2);
    change(&caches[1]).await;
    finish.notify_one();
    assert_eq!(slow.await.unwrap(), "v1", "its own caller");
    for cache in &caches {
        match reach {
            Reach::AtOnce => assert_eq!(db.read(cache, "row").await, "v2"),
            Reach::OnceNotified => eventually(&db, cache, "row", "v2").await,
        }
    }
    assert_eq!(db.loads.get(), 2, "the overtaken load and one reload");
}

store_test!(followers_of_an_overtaken_load_load_again);
/// Followers waiting on a load that an invalidation overtakes load again: they are woken by
/// the invalidation, find the lock voided, and one of them leads with the new version.
async fn followers_of_an_overtaken_load_load_again(shared: Shared) {
    let caches = instances(&shared, 2, as_is).await;
    let db = Database::at(1);
    let (slow, finish) = slow_load(&caches[0], &db, "row", &[]).await;
    // A follower in the other instance, waiting for the slow load's fill.
    let follower = tokio::spawn({
        let (cache, db) = (caches[1].clone(), db.clone());
        async move { db.read(&cache, "row").await }
    });
    db.move_to(2);
    caches[0].invalidate("row").await.unwrap();
    assert_eq!(
        tokio::time::timeout(LIMIT, follower)
            .await
            .unwrap()
            .unwrap(),
        "v2",
        "the follower never receives the overtaken load's value"
    );
    finish.notify_one();
    assert_eq!(slow.await.unwrap(), "v1");
    assert_eq!(db.read(&caches[0], "row").await, "v2");
}

store_test!(invalidate_reaches_every_instances_l1);
/// `invalidate` in one instance: its own L1 forgets the key before the call returns, and every
/// other instance, whose reads were all L1 hits, reads the new version once the notification is
/// delivered: one load between them.
async fn invalidate_reaches_every_instances_l1(shared: Shared) {
    let caches = instances(&shared, 3, as_is).await;
    let db = Database::at(1);
    for cache in &caches {
        assert_eq!(db.read(cache, "row").await, "v1");
        // Wait until the value is held in L1 (the subscription confirmed).
        let deadline = tokio::time::Instant::now() + LIMIT;
        while cache.fetch("row", never_loads).await.unwrap().outcome() != Outcome::L1Hit {
            assert!(tokio::time::Instant::now() < deadline, "never in L1");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(db.loads.get(), 1);
    db.move_to(2);
    caches[0].invalidate("row").await.unwrap();
    assert_eq!(db.read(&caches[0], "row").await, "v2", "at once");
    for cache in &caches[1..] {
        eventually(&db, cache, "row", "v2").await;
    }
    assert_eq!(db.loads.get(), 2, "one reload for everyone");
}

store_test!(invalidate_many_fences_and_reaches_every_l1_for_each_key);
/// `invalidate_many` is `invalidate` for each key, in one store call: a load of one key in
/// flight cannot fill afterwards (the fence), and another key held in every instance's L1
/// is read again everywhere once the notification is delivered.
async fn invalidate_many_fences_and_reaches_every_l1_for_each_key(shared: Shared) {
    let caches = instances(&shared, 2, as_is).await;
    let (db, held) = (Database::at(1), Database::at(1));
    for cache in &caches {
        assert_eq!(held.read(cache, "held").await, "v1");
    }
    let (slow, finish) = slow_load(&caches[0], &db, "row", &[]).await;
    db.move_to(2);
    held.move_to(2);
    caches[1]
        .invalidate_many(["row", "held", "absent"])
        .await
        .unwrap();
    finish.notify_one();
    assert_eq!(slow.await.unwrap(), "v1", "its own caller");
    for cache in &caches {
        assert_eq!(db.read(cache, "row").await, "v2", "refused");
        eventually(&held, cache, "held", "v2").await;
    }
    assert_eq!(db.loads.get(), 2);
    assert_eq!(held.loads.get(), 2, "one reload");
    caches[0].invalidate_many(Vec::<&str>::new()).await.unwrap();
}

async fn never_loads() -> Result<tower_stampede::Loaded, std::io::Error> {
    panic!("this loader must not run")
}

store_test!(set_writes_through_to_every_instance);
/// `set` writes through: every instance reads the new value without a load.
async fn set_writes_through_to_every_instance(shared: Shared) {
    let caches = instances(&shared, 3, as_is).await;
    let db = Database::at(1);
    for cache in &caches {
        assert_eq!(db.read(cache, "row").await, "v1");
    }
    caches[0]
        .set("row", Bytes::from_static(b"v9"), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(db.read(&caches[0], "row").await, "v9", "at once");
    for cache in &caches[1..] {
        eventually(&db, cache, "row", "v9").await;
    }
    assert_eq!(db.loads.get(), 1, "no load after the set");
    let fetched = caches[2].fetch("row", never_loads).await.unwrap();
    assert_eq!(fetched.value().unwrap(), "v9");
}

store_test!(a_set_is_not_overwritten_by_a_load_in_flight);
/// A `set` overtakes a load in flight: the load's fill is refused, so the set value stays.
async fn a_set_is_not_overwritten_by_a_load_in_flight(shared: Shared) {
    let caches = instances(&shared, 2, as_is).await;
    let db = Database::at(1);
    let (slow, finish) = slow_load(&caches[0], &db, "row", &[]).await;
    caches[1]
        .set("row", Bytes::from_static(b"new"), Duration::from_secs(60))
        .await
        .unwrap();
    finish.notify_one();
    assert_eq!(slow.await.unwrap(), "v1");
    for cache in &caches {
        let fetched = cache.fetch("row", never_loads).await.unwrap();
        assert_eq!(fetched.value().unwrap(), "new");
    }
}

store_test!(expire_serves_stale_while_one_caller_reloads);
/// `expire` keeps the value for the stale window: the first read after it is answered with
/// the old value at once while one load refreshes it, and then everyone reads the new one.
async fn expire_serves_stale_while_one_caller_reloads(shared: Shared) {
    fn stale(builder: CacheBuilder) -> CacheBuilder {
        as_is(builder).stale(Duration::from_secs(30))
    }
    let caches = instances(&shared, 2, stale).await;
    let db = Database::at(1);
    for cache in &caches {
        assert_eq!(db.read(cache, "row").await, "v1");
    }
    db.move_to(2);
    caches[0].expire("row").await.unwrap();
    // The refresh waits for the test, so the stale answer cannot be overtaken by it.
    let (db2, finish) = (db.clone(), Arc::new(Notify::new()));
    let release = Arc::clone(&finish);
    let first = caches[0]
        .fetch("row", move || async move {
            db2.loads.hit();
            release.notified().await;
            Ok::<_, std::io::Error>(tower_stampede::Loaded::value(Bytes::from_static(b"v2")))
        })
        .await
        .unwrap();
    assert_eq!(first.outcome(), Outcome::Stale);
    assert_eq!(first.value().unwrap(), "v1");
    finish.notify_one();
    for cache in &caches {
        eventually(&db, cache, "row", "v2").await;
    }
    assert_eq!(db.loads.get(), 2, "one refresh");
}

/// Without notifications, another instance's L1 keeps its copy until `l1_ttl_cap`, and no
/// longer (paused time: the embedded store and L1 read tokio's clock).
#[tokio::test(start_paused = true)]
async fn without_notifications_l1_keeps_a_copy_no_longer_than_its_cap() {
    fn deaf(builder: CacheBuilder) -> CacheBuilder {
        builder
            .notifications(false)
            .l1_ttl_cap(Duration::from_secs(2))
    }
    let shared = Shared::memory();
    let caches = instances(&shared, 2, deaf).await;
    let db = Database::at(1);
    for cache in &caches {
        assert_eq!(db.read(cache, "row").await, "v1");
    }
    db.move_to(2);
    caches[0].invalidate("row").await.unwrap();
    assert_eq!(
        db.read(&caches[0], "row").await,
        "v2",
        "its own L1 forgot at once"
    );
    assert_eq!(
        db.read(&caches[1], "row").await,
        "v1",
        "the other's L1 is not told"
    );
    tokio::time::advance(Duration::from_millis(1900)).await;
    assert_eq!(db.read(&caches[1], "row").await, "v1");
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(db.read(&caches[1], "row").await, "v2", "gone at the cap");
}

/// A store that cannot be reached: `invalidate` and `set` are errors (the caller must know),
/// and this process's L1 forgets the key all the same.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_makes_invalidate_an_error_and_still_clears_l1() {
    let mut shared = Shared::redis().await;
    let caches = instances(&shared, 1, as_is).await;
    let cache = &caches[0];
    let db = Database::at(1);
    assert_eq!(db.read(cache, "row").await, "v1");
    shared.server_mut().kill();
    db.move_to(2);
    let started = std::time::Instant::now();
    let error = cache.invalidate("row").await.unwrap_err();
    assert_eq!(error.kind(), tower_stampede::ErrorKind::Store);
    assert!(std::error::Error::source(&error).is_some());
    assert!(started.elapsed() < LIMIT, "no long wait");
    let error = cache
        .set("row", Bytes::from_static(b"v9"), Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), tower_stampede::ErrorKind::Store);
    // Not an L1 hit of v1: the loader runs (with in-process protection only).
    assert_eq!(db.read(cache, "row").await, "v2");
}

/// When the subscriber's connection drops, L1 trusts nothing it held: the next reads go to
/// the store until the subscription is back, and then L1 serves again.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_subscription_stops_l1_hits_until_it_is_back() {
    let shared = Shared::redis().await;
    let caches = instances(&shared, 1, as_is).await;
    let cache = &caches[0];
    let db = Database::at(1);
    assert_eq!(db.read(cache, "row").await, "v1");
    let outcome = || async { cache.fetch("row", never_loads).await.unwrap().outcome() };
    let deadline = tokio::time::Instant::now() + LIMIT;
    while outcome().await != Outcome::L1Hit {
        assert!(tokio::time::Instant::now() < deadline, "never in L1");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut conn = shared.connection().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(killed >= 1, "a subscriber was connected");
    let deadline = tokio::time::Instant::now() + LIMIT;
    while outcome().await == Outcome::L1Hit {
        assert!(
            tokio::time::Instant::now() < deadline,
            "L1 still trusted after the drop"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The next flights subscribe again; then the value enters L1 once more.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while outcome().await != Outcome::L1Hit {
        assert!(
            tokio::time::Instant::now() < deadline,
            "L1 never trusted again"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(db.loads.get(), 1);
}

/// A namespace's first subscription is not in place at once: until it is, a message sent by
/// another process would be missed, so L1 must not trust what this process reads meanwhile
/// (else an invalidation sent in that gap leaves the old value in L1 for `l1_ttl_cap`). The
/// gap lasts milliseconds; here it is held open for good by an ACL user who may do anything
/// but `SUBSCRIBE`, so the test is deterministic: the reader's reads never enter L1, and
/// every change the writer makes is read at once. It fails if the first subscription is
/// trusted before it is in place (the reader then keeps `v1` from L1).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l1_trusts_nothing_before_the_namespace_subscription_is_in_place() {
    use support::RedisServer;
    use tower_stampede::store::RedisStore;

    let server = RedisServer::start_with(&[
        "--user",
        "writer",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "--user",
        "reader",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-subscribe",
        "-ssubscribe",
        "-psubscribe",
    ]);
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    let build = |store| as_is(Cache::builder(store).namespace("test")).build();
    let writer = build(RedisStore::connect(url("writer")).await.unwrap());
    let reader = build(RedisStore::connect(url("reader")).await.unwrap());
    let db = Database::at(1);
    assert_eq!(db.read(&reader, "row").await, "v1");
    for version in 2..=4 {
        // Reads that would be L1 hits, were the reader's L1 trusted.
        for _ in 0..3 {
            let fetched = reader.fetch("row", never_loads).await.unwrap();
            assert_ne!(fetched.outcome(), Outcome::L1Hit, "v{version}");
        }
        let value = Bytes::from(format!("v{version}"));
        writer
            .set("row", value.clone(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(db.read(&reader, "row").await, value, "read at once");
    }
    assert_eq!(db.loads.get(), 1);
}

impl Database {
    /// Reads the row with `tags` attached to it.
    async fn read_tagged(&self, cache: &Cache, key: &str, tags: &'static [&'static str]) -> Bytes {
        let db = self.clone();
        cache
            .fetch(key, move || async move {
                db.loads.hit();
                let version = db.version.load(Ordering::SeqCst);
                Ok::<_, std::io::Error>(
                    tower_stampede::Loaded::value(Bytes::from(format!("v{version}"))).tags(tags),
                )
            })
            .await
            .unwrap()
            .into_value()
            .unwrap()
    }
}

store_test!(invalidate_tag_reaches_every_tagged_value_everywhere);
/// `invalidate_tag` makes every value carrying the tag a miss in every instance, L1 included,
/// and leaves values without it alone.
async fn invalidate_tag_reaches_every_tagged_value_everywhere(shared: Shared) {
    let caches = instances(&shared, 3, as_is).await;
    let (tagged, untagged) = (Database::at(1), Database::at(1));
    for cache in &caches {
        assert_eq!(
            tagged.read_tagged(cache, "a", &["users", "page:1"]).await,
            "v1"
        );
        assert_eq!(tagged.read_tagged(cache, "b", &["users"]).await, "v1");
        assert_eq!(untagged.read_tagged(cache, "c", &["other"]).await, "v1");
    }
    assert_eq!(tagged.loads.get(), 2);
    tagged.move_to(2);
    untagged.move_to(2);
    caches[0].invalidate_tag("users").await.unwrap();
    for cache in &caches {
        let deadline = tokio::time::Instant::now() + LIMIT;
        while tagged.read_tagged(cache, "a", &["users", "page:1"]).await != "v2"
            || tagged.read_tagged(cache, "b", &["users"]).await != "v2"
        {
            assert!(tokio::time::Instant::now() < deadline, "still v1");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(untagged.read_tagged(cache, "c", &["other"]).await, "v1");
    }
    assert_eq!(tagged.loads.get(), 4, "one reload per value");
    assert_eq!(untagged.loads.get(), 1);
    // Invalidating a tag no value carries changes nothing.
    caches[1].invalidate_tags(["nobody", "none"]).await.unwrap();
    assert_eq!(tagged.read_tagged(&caches[2], "b", &["users"]).await, "v2");
    assert_eq!(tagged.loads.get(), 4);
}

store_test!(a_tagged_load_that_started_before_the_tag_invalidation_is_a_miss);
/// A load that read its data before `invalidate_tag` and fills after it: its value is stored,
/// but with a tag clock older than the invalidation, so it is a miss at once everywhere.
async fn a_tagged_load_that_started_before_the_tag_invalidation_is_a_miss(shared: Shared) {
    let caches = instances(&shared, 2, as_is).await;
    let db = Database::at(1);
    let (slow, finish) = slow_load(&caches[0], &db, "row", &["users"]).await;
    db.move_to(2);
    caches[1].invalidate_tag("users").await.unwrap();
    finish.notify_one();
    assert_eq!(slow.await.unwrap(), "v1", "its own caller");
    for cache in &caches {
        assert_eq!(db.read_tagged(cache, "row", &["users"]).await, "v2");
    }
    assert_eq!(db.loads.get(), 2, "the outdated load and one reload");
}

store_test!(a_value_with_too_many_tags_is_not_stored);
/// A value with more tags than an entry can carry is not stored: its callers get it, and the
/// next read loads again.
async fn a_value_with_too_many_tags_is_not_stored(shared: Shared) {
    let cache = instances(&shared, 1, as_is).await.remove(0);
    let loads = Counter::default();
    for _ in 0..2 {
        let loads = loads.clone();
        let fetched = cache
            .fetch("many", move || async move {
                loads.hit();
                let tags: Vec<String> = (0..2000).map(|i| format!("t{i}")).collect();
                Ok::<_, std::io::Error>(
                    tower_stampede::Loaded::value(Bytes::from_static(b"v")).tags(tags),
                )
            })
            .await
            .unwrap();
        assert_eq!(fetched.value().unwrap(), "v");
    }
    assert_eq!(loads.get(), 2);
}

/// A tagged value's L2 hit reads its tags' versions once; later hits use the versions this
/// process learnt (no second round trip) while nothing is heard of the tags; and an
/// `invalidate_tag` in another instance still reaches them, through its notification.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_tag_versions_save_a_round_trip_until_the_tag_is_invalidated() {
    let shared = Shared::redis().await;
    // No L1: every read is an L2 hit, which must check the tags.
    let caches = instances(&shared, 2, |b| as_is(b).l1_capacity(0)).await;
    let db = Database::at(1);
    assert_eq!(db.read_tagged(&caches[0], "row", &["users"]).await, "v1");
    assert_eq!(db.read_tagged(&caches[0], "row", &["users"]).await, "v1");
    let mut conn = shared.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..5 {
        let fetched = caches[0].fetch("row", never_loads).await.unwrap();
        assert_eq!(fetched.outcome(), Outcome::L2Hit);
    }
    assert_eq!(
        support::calls(&mut conn, "hmget").await,
        0,
        "versions were read again"
    );
    db.move_to(2);
    caches[1].invalidate_tag("users").await.unwrap();
    eventually_tagged(&db, &caches[0], "row", &["users"], "v2").await;
    assert_eq!(db.loads.get(), 2, "one load, one reload");
}

/// Reads tagged `key` on `cache` until it answers `want`, within [`LIMIT`].
#[cfg(feature = "redis")]
async fn eventually_tagged(
    db: &Database,
    cache: &Cache,
    key: &str,
    tags: &'static [&'static str],
    want: &str,
) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while db.read_tagged(cache, key, tags).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never read {want} after the change"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

store_test!(a_tagged_value_read_from_the_store_leaves_l1_when_its_tag_is_invalidated);
/// A tagged value that an instance read from the store (an L2 hit, not its own load) and
/// keeps in L1 is kept there with its tags' stamps: an `invalidate_tag` in another instance
/// reaches that L1 copy too.
async fn a_tagged_value_read_from_the_store_leaves_l1_when_its_tag_is_invalidated(shared: Shared) {
    let caches = instances(&shared, 2, as_is).await;
    let (writer, reader) = (&caches[0], &caches[1]);
    let db = Database::at(1);
    assert_eq!(db.read_tagged(writer, "row", &["users"]).await, "v1");
    let first = reader.fetch("row", never_loads).await.unwrap();
    assert_eq!(first.outcome(), Outcome::L2Hit);
    // The writer's fill notification may reach the reader after its L2 hit, and then
    // rightly makes it distrust that copy once: read until L1 keeps it (never a load).
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let again = reader.fetch("row", never_loads).await.unwrap();
        if again.outcome() == Outcome::L1Hit {
            break;
        }
        assert_eq!(again.outcome(), Outcome::L2Hit);
        assert!(tokio::time::Instant::now() < deadline, "never kept in L1");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    db.move_to(2);
    writer.invalidate_tag("users").await.unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while db.read_tagged(reader, "row", &["users"]).await != "v2" {
        assert!(tokio::time::Instant::now() < deadline, "L1 still serves v1");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(db.loads.get(), 2, "one load, one reload");
}

/// Issue 29: changes that reach this instance's flights, values never served once invalidated.
mod clear;
mod holds;
mod own_changes;
