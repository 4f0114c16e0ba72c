//! What the store holds and how it is read: foreign or corrupt bytes are a miss and overwritten,
//! the `fresh` marker follows the value, and an L2 hit or a miss decision is one round trip.

use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "redis")]
use redis::AsyncCommands;
use support::observed::Observed;
use support::{store_test, timed_test, Backing, Counter, Shared};
#[cfg(feature = "redis")]
use tower_stampede::store::RedisStore;
use tower_stampede::store::StoreExt;
#[cfg(feature = "redis")]
use tower_stampede::Loaded;
use tower_stampede::{Cache, Outcome};

#[cfg(feature = "redis")]
use crate::{deaf_to_polls, loader};
use crate::{never_called, slow_value};

/// Bytes written behind the engine's back.
trait WriteRaw {
    /// Writes raw bytes under a key's value name.
    async fn write_raw(&self, cache: &Cache, key: &str, bytes: &[u8]);
}

impl WriteRaw for Shared {
    async fn write_raw(&self, cache: &Cache, key: &str, bytes: &[u8]) {
        let store_key = cache.store_key(key);
        match &self.backing {
            #[cfg(feature = "redis")]
            Backing::Redis(server) => {
                let mut conn = server
                    .client()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let _: () = conn
                    .set_ex(RedisStore::value_name(&store_key), bytes, 60)
                    .await
                    .unwrap();
            }
            Backing::Memory(memory) => memory
                .put(
                    &store_key,
                    Bytes::copy_from_slice(bytes),
                    Duration::from_secs(60),
                )
                .await
                .map(drop)
                .unwrap(),
        }
    }
}

store_test!(corrupt_and_foreign_bytes_are_a_counted_miss_and_overwritten);
async fn corrupt_and_foreign_bytes_are_a_counted_miss_and_overwritten(shared: Shared) {
    let cache = shared.cache().build();
    for (i, garbage) in [&b"not ours"[..], b"", b"TS\x01\x09\x00\x00\x00\x00"]
        .iter()
        .enumerate()
    {
        let key = format!("corrupt-{i}");
        shared.write_raw(&cache, &key, garbage).await;
        let loads = Counter::default();
        let value = cache
            .get_or_load(&key, slow_value(&loads, Duration::ZERO, "clean"))
            .await
            .unwrap();
        assert_eq!(value, "clean");
        assert_eq!(loads.get(), 1);
        // Overwritten: another instance now reads the clean value from the store.
        let other = shared.cache().build();
        let read = other.fetch(&key, never_called).await.unwrap();
        assert_eq!(read.outcome(), Outcome::L2Hit);
        assert_eq!(read.value().unwrap(), "clean");
    }
    assert_eq!(cache.stats().corrupt_entries, 3);
}

store_test!(a_corrupt_entry_is_overwritten_by_one_load);
async fn a_corrupt_entry_is_overwritten_by_one_load(shared: Shared) {
    let instances: Vec<Cache> = (0..2).map(|_| shared.cache().build()).collect();
    shared
        .write_raw(&instances[0], "garbage", b"\x00\x01 not an entry")
        .await;
    let loads = Counter::default();
    let mut callers = Vec::new();
    for i in 0..40 {
        let cache = instances[i % 2].clone();
        let load = slow_value(&loads, Duration::from_millis(100), "clean");
        callers.push(tokio::spawn(async move {
            cache.get_or_load("garbage", load).await
        }));
    }
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "clean");
    }
    assert_eq!(loads.get(), 1);
}

timed_test!(a_corrupt_entry_overwritten_meanwhile_is_not_loaded_again);
async fn a_corrupt_entry_overwritten_meanwhile_is_not_loaded_again(stores: Vec<Shared>) {
    for shared in stores {
        let fast = shared.cache().build();
        // This instance's first lookup answers late, after the other has overwritten the entry.
        let late = Cache::builder_shared(Observed::new(&shared.store, Duration::from_millis(300)))
            .namespace("test")
            .store_timeout(Duration::from_secs(5))
            .build();
        shared.write_raw(&fast, "repaired", b"\xff garbage").await;
        let loads = Counter::default();
        let slow_reader = tokio::spawn({
            let (late, load) = (late.clone(), slow_value(&loads, Duration::ZERO, "late"));
            async move { late.get_or_load("repaired", load).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let repaired = fast
            .get_or_load("repaired", slow_value(&loads, Duration::ZERO, "clean"))
            .await
            .unwrap();
        assert_eq!(repaired, "clean");
        assert_eq!(slow_reader.await.unwrap().unwrap(), "clean");
        assert_eq!(loads.get(), 1);
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_a_foreign_redis_type_is_a_miss() {
    let shared = Shared::redis().await;
    let cache = shared.cache().build();
    let name = RedisStore::value_name(&cache.store_key("typed"));
    let mut conn = shared.connection().await;
    let _: () = conn.hset(&name, "field", "value").await.unwrap();
    let loads = Counter::default();
    let value = cache
        .get_or_load("typed", slow_value(&loads, Duration::ZERO, "replaced"))
        .await
        .unwrap();
    assert_eq!(value, "replaced");
    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
}

/// Bytes this crate never wrote, in a lock key, count as no lock (issue 15): the lookup takes
/// the lock in their place and loads at once, instead of waiting the whole `wait_timeout`
/// (30 s) for a live lock that is not there.
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

/// What the server ran since the last [`reset_stats`]: commands by name (the test's own
/// `INFO` and `CONFIG` left out; commands run by scripts included), and round trips: the
/// reads of client requests it processed, less the `INFO` that asks.
#[cfg(feature = "redis")]
async fn server_work(
    conn: &mut redis::aio::MultiplexedConnection,
) -> (std::collections::BTreeMap<String, u64>, u64) {
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(conn)
        .await
        .unwrap();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?.split(',').next()?.parse().ok()
    };
    let commands = info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = field(stats, "calls=")?;
            let by_test = name == "info" || name.starts_with("config");
            (!by_test).then(|| (name.to_owned(), calls))
        })
        .collect();
    let reads = info
        .lines()
        .find_map(|line| field(line, "total_reads_processed:"))
        .unwrap();
    (commands, reads - 1)
}

#[cfg(feature = "redis")]
async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_l2_hit_and_per_miss_decision() {
    let shared = Shared::redis().await;
    let server = shared.server();
    let leader = shared.cache().build();
    let reader = deaf_to_polls(shared.other_process().await).build();
    let loads = Counter::default();
    // Warm up: scripts loaded, the reader's subscription to the namespace in place.
    for key in ["warm-1", "warm-2"] {
        leader
            .get_or_load(key, slow_value(&loads, Duration::ZERO, "w"))
            .await
            .unwrap();
        reader.fetch(key, never_called).await.unwrap();
    }
    leader
        .get_or_load("hot", slow_value(&loads, Duration::ZERO, "v"))
        .await
        .unwrap();
    // A process's first load reads the tag clock, once in its life (for its loads before a
    // loader returns tags; see the `tags` module).
    reader
        .get_or_load("reader's first", slow_value(&loads, Duration::ZERO, "f"))
        .await
        .unwrap();

    let mut stats = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    reset_stats(&mut stats).await;
    let hit = reader.fetch("hot", never_called).await.unwrap();
    assert_eq!(hit.outcome(), Outcome::L2Hit);
    let (commands, round_trips) = server_work(&mut stats).await;
    // Three plain commands in one pipeline: `SET lock NX GET` (refused by the `fresh` marker
    // the fill left), `GET` and `PTTL` of the value; no script.
    let expected: std::collections::BTreeMap<String, u64> = [("get", 1), ("pttl", 1), ("set", 1)]
        .map(|(name, calls)| (name.to_owned(), calls))
        .into();
    assert_eq!(commands, expected, "an L2 hit");
    assert_eq!(round_trips, 1, "an L2 hit is one round trip: {commands:?}");

    reset_stats(&mut stats).await;
    let fetched = reader
        .fetch("cold", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"c")))
        })
        .await
        .unwrap();
    assert_eq!(fetched.outcome(), Outcome::Leader);
    let (commands, round_trips) = server_work(&mut stats).await;
    // The miss decision (value or lock) is one round trip, the fill the second and last.
    assert_eq!(
        round_trips, 2,
        "a miss is a lookup and a fill: {commands:?}"
    );
    assert_eq!(commands.get("evalsha"), Some(&1), "the fill: {commands:?}");
}

/// The lock key of a filled value holds the `fresh` marker for as long as the value is fresh,
/// so a plain `SET lock NX` cannot take it; the pipelined lookup depends on it. What breaks
/// the marker's agreement with the value (an evicted value, a deleted marker, a lock key of a
/// foreign type) costs at most one more round trip, never a wrong answer or a second load.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fresh_marker_follows_the_value_and_heals() {
    let shared = Shared::redis().await;
    let mut conn = shared.connection().await;
    let builder = || {
        shared
            .cache()
            .ttl(Duration::from_secs(60))
            .stale(Duration::from_secs(30))
    };
    let cache = builder().build();
    let loads = Counter::default();
    let key = cache.store_key("marked");
    let (value_name, lock_name) = (RedisStore::value_name(&key), RedisStore::lock_name(&key));
    cache
        .get_or_load("marked", slow_value(&loads, Duration::ZERO, "v1"))
        .await
        .unwrap();
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"));
    let (marker_ttl, value_ttl): (i64, i64) = (
        conn.pttl(&lock_name).await.unwrap(),
        conn.pttl(&value_name).await.unwrap(),
    );
    assert!((59_000..=60_000).contains(&marker_ttl), "{marker_ttl}");
    assert!((89_000..=90_000).contains(&value_ttl), "{value_ttl}");

    // The marker deleted behind the engine's back: the next lookup is still a hit, and it
    // puts the marker back for the value's remaining freshness.
    let _: () = conn.del(&lock_name).await.unwrap();
    let hit = builder()
        .build()
        .fetch("marked", never_called)
        .await
        .unwrap();
    assert_eq!(hit.outcome(), Outcome::L2Hit);
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"), "the marker is back");
    let marker_ttl: i64 = conn.pttl(&lock_name).await.unwrap();
    assert!((58_000..=60_000).contains(&marker_ttl), "{marker_ttl}");

    // The value evicted while its marker stands: the next lookup takes the lock anyway, and
    // one load refills it.
    let _: () = conn.del(&value_name).await.unwrap();
    let refilled = builder()
        .build()
        .fetch("marked", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v2")))
        })
        .await
        .unwrap();
    assert_eq!(refilled.outcome(), Outcome::Leader);
    assert_eq!(refilled.value().unwrap(), "v2");

    // A lock key of a foreign type counts as free: one load, and the marker replaces it.
    let _: () = conn.del(&value_name).await.unwrap();
    let _: () = conn.del(&lock_name).await.unwrap();
    let _: () = conn.hset(&lock_name, "field", "value").await.unwrap();
    let loaded = builder()
        .build()
        .fetch("marked", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v3")))
        })
        .await
        .unwrap();
    assert_eq!(loaded.outcome(), Outcome::Leader);
    let marker: Option<String> = conn.get(&lock_name).await.unwrap();
    assert_eq!(marker.as_deref(), Some("fresh"));
    assert_eq!(loads.get(), 1, "only the first load used this counter");
}

/// A lost `fresh` marker (issue 16 #5: under `volatile-ttl`, and the LRU/LFU policies of a
/// full server, Redis evicts short-lived keys first) costs the next hit one more round trip,
/// the marker put back, and nothing else: no "filled" notification, which would make every
/// process drop the key from its L1 and read the store again although nothing changed.
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

/// Past its freshness, the marker is gone while the stale value stays: exactly one lookup
/// takes the lock (`SET NX`) and one load refreshes the value.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_has_no_marker_and_one_lookup_takes_the_lock() {
    let shared = Shared::redis().await;
    let build = || {
        shared
            .cache()
            .ttl(Duration::from_secs(1))
            .stale(Duration::from_secs(30))
            .l1_capacity(0)
            .build()
    };
    let first = build();
    first
        .get_or_load("stale-one", || async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"old"))
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let loads = Counter::default();
    let mut lookups = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (cache, loads) = (build(), loads.clone());
        lookups.spawn(async move {
            cache
                .fetch("stale-one", move || async move {
                    loads.hit();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"new")))
                })
                .await
                .unwrap()
                .outcome()
        });
    }
    let outcomes = lookups.join_all().await;
    // The leader serves the stale value too, while its load refreshes it.
    assert_eq!(outcomes, [Outcome::Stale; 4]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(loads.get(), 1);
    let fresh = build().fetch("stale-one", never_called).await.unwrap();
    assert_eq!(fresh.outcome(), Outcome::L2Hit);
    assert_eq!(fresh.value().unwrap(), "new");
}
