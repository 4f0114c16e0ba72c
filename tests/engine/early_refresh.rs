//! Early refresh (XFetch): a hot key is reloaded by one load shortly before it expires, at about
//! one load per TTL whatever the request rate, and nobody waits for it.

use std::time::Duration;

use bytes::Bytes;
use support::{Counter, Shared};
use tower_stampede::store::MemoryStore;
use tower_stampede::{Cache, Loaded, Outcome};

use crate::{futures_ready, loader};

/// A loader whose first load is slow (`first` long, answering "v1") and whose later loads answer
/// at once ("v2", "v3", ...): early refresh uses the last load's time, so the first one sets how
/// early the next refresh may come.
fn first_slow_then_quick(
    loads: &Counter,
    first: Duration,
) -> impl FnOnce() -> futures_ready::Load + Send + 'static {
    let loads = loads.clone();
    move || {
        Box::pin(async move {
            let n = loads.hit();
            if n == 1 {
                tokio::time::sleep(first).await;
            }
            Ok(Bytes::from(format!("v{n}")))
        })
    }
}

/// Two instances hit a key with a 1 s TTL every 10 ms: one load refreshes it early, whichever
/// instances reach their refresh point, the refresh lands before the value expires, and no hit
/// waits. Paused time over the embedded store, so every duration below is exact and the
/// outcome depends on no draw: each instance's refresh point is drawn at random (XFetch), and
/// the test's windows hold for every draw. The same rule over Redis, on real time, is measured
/// by `benches/early_refresh.rs` (loads per TTL and requests that waited, three processes).
#[tokio::test(start_paused = true)]
async fn a_hot_key_is_refreshed_early_by_one_load_and_nobody_waits() {
    let shared = Shared::memory();
    // δ = 300 ms (the first load), β = 3: an instance's refresh point is drawn
    // δ·(1.1 + β·(−ln u)) before expiry, so at least 330 ms before it, and hits for 800 ms
    // after the fill reach it (the value expires 1 s after it). The refreshed value's load
    // took no time, counted as 1 ms: its point is at most 1 ms·(1.1 + 3·37) = 112 ms before
    // its expiry (−ln u is below 37 for every `u` rand can draw: `refreshes::MOST_NEG_LN`),
    // and it expires at least 1 s after the first fill, so the hits, which end 800 ms after
    // that fill, never reach it. (With a 10 ms refresh, as before, its point could come up to
    // 1.1 s early: about one run in 200 drew one within the hits and loaded a third time.)
    let builder = || {
        shared
            .cache()
            .ttl(Duration::from_secs(1))
            .early_refresh(3.0)
    };
    let instances = [builder().build(), builder().build()];
    let loads = Counter::default();
    let first = instances[0]
        .get_or_load(
            "hot",
            first_slow_then_quick(&loads, Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert_eq!(first, "v1");
    let mut seen_v2 = false;
    let hitting = tokio::time::Instant::now();
    for i in 0.. {
        if hitting.elapsed() >= Duration::from_millis(800) {
            break;
        }
        let fetched = instances[i % 2]
            .fetch("hot", {
                let load = first_slow_then_quick(&loads, Duration::ZERO);
                move || async move { load().await.map(Loaded::value) }
            })
            .await
            .unwrap();
        assert!(
            matches!(fetched.outcome(), Outcome::L1Hit | Outcome::L2Hit),
            "hit {i} waited: {:?}",
            fetched.outcome()
        );
        seen_v2 |= fetched.value().unwrap() == "v2";
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen_v2, "the refresh landed before the value expired");
    let early: u64 = instances.iter().map(|c| c.stats().early_refreshes).sum();
    assert!(early >= 1);
    // One load refreshed it, whichever instances tried.
    assert_eq!(loads.get(), 2);

    // Without early refresh, the same hits never load.
    let plain = shared
        .cache()
        .ttl(Duration::from_secs(1))
        .early_refresh(0.0)
        .build();
    let loads = Counter::default();
    plain
        .get_or_load(
            "cold",
            first_slow_then_quick(&loads, Duration::from_millis(300)),
        )
        .await
        .unwrap();
    for _ in 0..20 {
        let value = plain
            .get_or_load("cold", first_slow_then_quick(&loads, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(value, "v1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(loads.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn early_refresh_keeps_a_hot_key_fresh_at_about_one_load_per_ttl() {
    // Paused time: 10 s of continuous traffic (8 clients out of step, one request each per
    // 10 ms on average) on a key
    // with a 1 s TTL and a 20 ms load. L1 is off, so every request asks the store, whose
    // freshness paused time drives.
    let cache = Cache::builder(MemoryStore::new())
        .ttl(Duration::from_secs(1))
        .early_refresh(2.0)
        .l1_capacity(0)
        .build();
    let loads = Counter::default();
    let started = tokio::time::Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (cache, loads) = (cache.clone(), loads.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i)).await;
                let mut outcomes = Vec::new();
                while started.elapsed() < Duration::from_secs(10) {
                    let loads = loads.clone();
                    let fetched = cache
                        .fetch("hot", move || async move {
                            let n = loads.hit();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, std::io::Error>(Loaded::value(Bytes::from(format!("v{n}"))))
                        })
                        .await
                        .unwrap();
                    outcomes.push((started.elapsed(), fetched.outcome()));
                    // Out of step with each other, as real clients are: 10 ms on average.
                    let pause = rand::random_range(5..=15);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                outcomes
            })
        })
        .collect();
    let mut waited = Vec::new();
    for client in clients {
        for (at, outcome) in client.await.unwrap() {
            let waited_for_a_load = matches!(
                outcome,
                Outcome::Leader | Outcome::Follower | Outcome::Uncached
            );
            if waited_for_a_load && at > Duration::from_millis(100) {
                waited.push((at, outcome));
            }
        }
    }
    assert!(waited.is_empty(), "requests waited for a load: {waited:?}");
    // Refreshes come a little (δ·(1.1 + β·(−ln u)), about 62 ms on average) before each expiry.
    let loads = loads.get();
    assert!((10..=13).contains(&loads), "{loads} loads in 10 s");
}

/// The refresh point is drawn once per value per process (when it enters L1), so the rate of
/// hits does not move it earlier (issue 15: a coin per hit would fire about δ·β·ln(r·δ) before
/// expiry at r hits per second): 10 000 hits per second for 10 TTLs of 1 s with a 100 ms load
/// (paused time) cost at most 1.4 loads per TTL, and nobody waits for one.
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

/// A failed early refresh does not make every other process fail. An early (XFetch) refresh
/// is speculative: the value is still fresh and nobody waits for it, so its failure only
/// releases its lock and leaves no failure marker. With the default settings (no stale
/// window), the value then expires, and another process's caller loads (`Leader`) instead of
/// getting `RecentFailure` for a load nobody tried.
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

/// The `fresh` marker of a value filled by an early refresh lasts as long as the value is
/// fresh: the fill measures it from the stale period, not from the life the value had left
/// when the refresh's lookup ran. A marker that ended early would let a hit in the gap take
/// the lock, run the release script and publish to every process.
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
