//! Protocol defects found by an adversarial review (issue 16), each a scenario that failed
//! before its fix: over the embedded `MemoryStore` on paused time, and (feature `redis`) a real
//! `redis-server` where the defect is the store's.

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

/// In-process joiners got a stale value far past the `stale` window. A leader that finds a
/// stale value within the window posts it as its flight's early answer, and every later
/// caller in that process joined the flight and took it, unchecked, for as long as the load
/// ran (ttl 100 ms, stale 300 ms, a load that hangs: 1550 ms past freshness a caller still got
/// `Stale("old")`). The early answer now has a deadline: the end of the window.
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

/// An early refresh shortened the `fresh` marker. The refresh's lookup stored its own
/// threshold (the life left when it ran, not the stale period) in the lock, and the fill
/// measured the marker from it: the refreshed value's marker ended early (PTTL 1395 ms against
/// the value's 1999 ms), and a hit in the gap took the lock, ran the release script and
/// published to every process. The marker now lasts as long as the value is fresh.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_refresh_marks_the_value_fresh_for_all_its_freshness() {
    use redis::AsyncCommands;
    use tower_stampede::store::RedisStore;
    let shared = Shared::redis().await;
    let cache = shared
        .cache()
        .ttl(Duration::from_secs(2))
        .early_refresh(1e6)
        .build();
    let loads = Counter::default();
    cache.fetch("k", loader(&loads, Ok("v1"))).await.unwrap();
    // An L1 hit refreshes at once (β this large); wait for its fill.
    cache.fetch("k", loader(&loads, Ok("v2"))).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while loads.get() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no early refresh");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let key = cache.store_key("k");
    let mut conn = shared.connection().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let value: Option<Vec<u8>> = conn.get(RedisStore::value_name(&key)).await.unwrap();
        if value.is_some_and(|v| v.ends_with(b"v2")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refresh never filled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let marker: Option<String> = conn.get(RedisStore::lock_name(&key)).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"));
    let marker_ttl: i64 = conn.pttl(RedisStore::lock_name(&key)).await.unwrap();
    let value_ttl: i64 = conn.pttl(RedisStore::value_name(&key)).await.unwrap();
    assert!(
        marker_ttl >= value_ttl - 100,
        "marker {marker_ttl} ms, value {value_ttl} ms"
    );
}

/// Bytes this crate never wrote, in a lock key, stalled every request for the whole
/// `wait_timeout` (30 s): a foreign string was taken for a live lock (issue 15). Such bytes
/// now count as no lock: the lookup takes the lock in their place and loads at once.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_bytes_in_a_lock_key_never_make_anyone_wait() {
    use tower_stampede::store::RedisStore;
    let shared = Shared::redis().await;
    let cache = shared.cache().build();
    let mut conn = shared.connection().await;
    let blob: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let foreign: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"hello".to_vec(),
        b"fresh-ish".to_vec(),
        vec![b'x'; 200],
        [&[b'g'; 32][..], b":123"].concat(),
        blob,
    ];
    let loads = Counter::default();
    for (i, bytes) in foreign.iter().enumerate() {
        let key = format!("k{i}");
        let _: () = redis::cmd("SET")
            .arg(RedisStore::lock_name(&cache.store_key(&key)))
            .arg(bytes)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        // A failure guard only: the defect waited the whole 30 s wait timeout.
        let fetched = tokio::time::timeout(
            Duration::from_secs(10),
            cache.fetch(&key, loader(&loads, Ok("v"))),
        )
        .await
        .unwrap_or_else(|_| panic!("waited on foreign bytes {i}"))
        .unwrap();
        assert_eq!(fetched.outcome(), Outcome::Leader, "foreign bytes {i}");
        assert_eq!(fetched.value().unwrap(), "v");
    }
    assert_eq!(loads.get(), foreign.len());
}

/// Early refresh fired earlier as traffic grew (issue 15): each L1 hit drew its own XFetch
/// coin, so with r hits per second the first coin that fired came about δ·β·ln(r·δ) before
/// expiry, and a hot key reloaded far more often than once per TTL. The refresh point is now
/// drawn once per value per process (when it enters L1), so the rate of hits does not matter:
/// here 10 000 hits per second for 10 TTLs of 1 s with a 100 ms load (paused time).
#[tokio::test(start_paused = true)]
async fn early_refresh_is_about_one_load_per_ttl_at_any_rate() {
    let shared = Shared::memory();
    let cache = shared.cache().ttl(Duration::from_secs(1)).build();
    let loads = Counter::default();
    let slow = |loads: &Counter| {
        let loads = loads.clone();
        move || async move {
            loads.hit();
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
        }
    };
    cache.fetch("hot", slow(&loads)).await.unwrap();
    let start = tokio::time::Instant::now();
    let mut waited = 0;
    while start.elapsed() < Duration::from_secs(10) {
        for _ in 0..10 {
            let fetched = cache.fetch("hot", slow(&loads)).await.unwrap();
            if !matches!(fetched.outcome(), Outcome::L1Hit | Outcome::L2Hit) {
                waited += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let per_ttl = loads.get() as f64 / 10.0;
    eprintln!("{per_ttl} loads per TTL");
    assert!(per_ttl <= 1.4, "{per_ttl} loads per TTL");
    assert_eq!(waited, 0, "nobody waits for an early refresh");
}

/// Hostile settings: TTLs and windows of `Duration::MAX` must not overflow a clock and panic.
#[tokio::test(start_paused = true)]
async fn durations_of_any_size_never_panic() {
    let shared = Shared::memory();
    let cache = shared
        .cache()
        .ttl(Duration::MAX)
        .stale(Duration::MAX)
        .l1_ttl_cap(Duration::MAX)
        .circuit_breaker(1, Duration::MAX)
        .build();
    let loads = Counter::default();
    for _ in 0..3 {
        let fetched = cache.fetch("k", loader(&loads, Ok("v"))).await.unwrap();
        assert_eq!(fetched.value().unwrap(), "v");
    }
    cache.expire("k").await.unwrap();
    let fetched = cache.fetch("k", loader(&loads, Ok("w"))).await.unwrap();
    assert!(fetched.value().is_some());
}

/// The later writer in [`a_follower_that_gave_up_never_overwrites_a_newer_value`].
#[derive(Clone, Copy, Debug)]
enum LaterWriter {
    /// A leader of a later stampede (the first leader's lock voided by an invalidation).
    Leader,
    /// The application's write-through `set`.
    Set,
}

/// `LoadAndCache` wrote without a fence (issue 16 #6). A follower B gave up waiting for a
/// slow leader A and loaded itself (`WaitTimeoutPolicy::LoadAndCache`); its load was slow
/// too. Meanwhile a later writer C stored a newer value: the leader of a later stampede,
/// or the application's `set`. When B's load ended, its unfenced write overwrote C's newer
/// value with B's older one, for a whole TTL. A write after a wait timeout is now refused
/// where the stored value's load started later (the load start is in the entry's header).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_gave_up_never_overwrites_a_newer_value() {
    use tower_stampede::WaitTimeoutPolicy;
    for shared in Shared::both().await {
        for writer in [LaterWriter::Leader, LaterWriter::Set] {
            let case = format!("{} {writer:?}", shared.name);
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
            // Load starts are ordered on the wall clock, to the millisecond: let it move on.
            std::thread::sleep(Duration::from_millis(3));
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
}

/// Issue 29, item 8: a leader's fill was fenced by its lock, not by its load's start. Leader A
/// (a slow load, its lock renewed) started first; follower B gave up waiting and loaded "new"
/// itself, later, and stored it (`LoadAndCache`: its write is fenced by load starts). When
/// A's older load ended, its fill, still holding the lock, overwrote B's newer value for a
/// whole TTL. A fill is now refused where the stored value's load started later (the lock is
/// freed all the same, and followers told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_leader_never_overwrites_a_newer_value_put_after_a_wait_timeout() {
    use tower_stampede::WaitTimeoutPolicy;
    for shared in Shared::both().await {
        let case = shared.name;
        // A leads, and its load hangs until told to end: its lock stands.
        let a = shared.cache().build();
        let (a_leader, a_end) = held_load(&a, "k", "old").await;
        // Load starts are ordered on the wall clock, to the millisecond: let it move on.
        std::thread::sleep(Duration::from_millis(3));
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
}

/// A lost `fresh` marker (issue 16 #5: under `volatile-ttl`, and the LRU/LFU policies of a
/// full server, Redis evicts short-lived keys first) costs the next hit one more round trip,
/// the marker put back, and nothing else. The repair was the release script, which published
/// "filled": every process dropped the key from its L1 although nothing had changed, and
/// each of them then read the store again.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_marker_costs_one_round_trip_and_no_notification() {
    use redis::AsyncCommands;
    use tower_stampede::store::RedisStore;
    let shared = Shared::redis().await;
    let a = shared.cache().build();
    let b = tower_stampede::Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .build();
    let loads = Counter::default();
    for key in ["k", "sentinel"] {
        a.fetch(key, loader(&loads, Ok("v"))).await.unwrap();
        let read = b.fetch(key, loader(&loads, Ok("v"))).await.unwrap();
        assert_eq!(read.outcome(), Outcome::L2Hit, "{key} in b's L1");
    }
    let lock = RedisStore::lock_name(&a.store_key("k"));
    let mut conn = shared.connection().await;
    let _: () = conn.del(&lock).await.unwrap();
    // A third process's hit finds the value without its marker.
    let c = tower_stampede::Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .build();
    let hit = c.fetch("k", loader(&loads, Ok("v"))).await.unwrap();
    assert_eq!(hit.outcome(), Outcome::L2Hit);
    let marker: Option<String> = conn.get(&lock).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"), "the marker is back");
    // A change published after the repair: once b has heard it, b has heard anything the
    // repair published (one channel, in order).
    a.invalidate("sentinel").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while b
        .fetch("sentinel", loader(&loads, Ok("v")))
        .await
        .unwrap()
        .outcome()
        == Outcome::L1Hit
    {
        assert!(tokio::time::Instant::now() < deadline, "b never heard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kept = b.fetch("k", loader(&loads, Ok("v"))).await.unwrap();
    assert_eq!(
        kept.outcome(),
        Outcome::L1Hit,
        "the repair dropped b's L1 entry"
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
