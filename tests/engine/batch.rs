//! Batches (`Cache::get_many_or_load`): L1 first, one store round trip for the lookup of the
//! whole batch with the locks of the missing keys taken in it, one loader call with exactly
//! the keys this call leads, fenced fills, and every key answered, whatever the loader does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{store_test, Counter, Shared, PATIENT};
use tokio::sync::Notify;
use tower_stampede::store::Store;
use tower_stampede::{Cache, ErrorKind};

use crate::slow_value;

/// The keys `from..to`, as a batch names them.
fn keys(from: usize, to: usize) -> Vec<String> {
    (from..to).map(|i| format!("item:{i}")).collect()
}

/// The value a loader gives `key`.
fn value_of(key: &str) -> Bytes {
    Bytes::from(format!("value of {key}"))
}

/// A batch loader that records each call's keys and answers each key's value.
type Calls = Arc<Mutex<Vec<Vec<String>>>>;

fn recording(
    calls: &Calls,
) -> impl Fn(Vec<String>) -> std::future::Ready<Result<HashMap<String, Bytes>, std::io::Error>>
       + Send
       + Sync
       + 'static {
    let calls = Arc::clone(calls);
    move |keys: Vec<String>| {
        calls.lock().unwrap().push(keys.clone());
        std::future::ready(Ok(keys
            .into_iter()
            .map(|k| {
                let v = value_of(&k);
                (k, v)
            })
            .collect()))
    }
}

/// Checks that each of `keys` was answered its [`value_of`].
fn each_its_value(
    name: &str,
    found: &HashMap<String, Result<Bytes, tower_stampede::Error>>,
    keys: &[String],
) {
    for key in keys {
        assert_eq!(
            found[key].as_ref().unwrap(),
            &value_of(key),
            "{name}: {key}"
        );
    }
}

/// Fills `keys` through `cache`, one at a time.
async fn warm(cache: &Cache, keys: &[String]) {
    let loads = Counter::default();
    for key in keys {
        let value = value_of(key);
        cache
            .get_or_load(key, {
                let loads = loads.clone();
                move || async move {
                    loads.hit();
                    Ok::<_, std::io::Error>(value)
                }
            })
            .await
            .unwrap();
    }
}

/// A batch of `keys` through `cache`, in a task, whose load has begun and waits for the
/// returned gate; it loads each key's [`value_of`].
async fn gated_batch(
    cache: &Cache,
    keys: &[&'static str],
) -> (
    tokio::task::JoinHandle<HashMap<&'static str, Result<Bytes, tower_stampede::Error>>>,
    Arc<Notify>,
) {
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let batch = tokio::spawn({
        let (cache, keys, started, gate) =
            (cache.clone(), keys.to_vec(), started.clone(), gate.clone());
        async move {
            cache
                .get_many_or_load(keys, move |keys: Vec<&'static str>| {
                    let (started, gate) = (started.clone(), gate.clone());
                    async move {
                        started.notify_one();
                        gate.notified().await;
                        let values = keys.into_iter().map(|k| (k, value_of(k)));
                        Ok::<_, std::io::Error>(values.collect::<HashMap<_, _>>())
                    }
                })
                .await
        }
    });
    started.notified().await;
    (batch, gate)
}

store_test!(a_batch_of_100_with_10_cold_costs_one_lookup_and_one_load_of_those_10);
/// A batch of 100 keys, 90 of them in the store and 10 cold, from a process whose L1 holds
/// none: one store round trip for the lookup of all 100 (the locks of the 10 taken in it),
/// and one loader call, with exactly those 10; every key answered its value.
async fn a_batch_of_100_with_10_cold_costs_one_lookup_and_one_load_of_those_10(shared: Shared) {
    let all = keys(0, 100);
    warm(&shared.cache().build(), &all[..90]).await;
    let observed = Observed::new(&shared.store, Duration::ZERO);
    let store: Arc<dyn Store> = observed.clone();
    let cache = Cache::builder_shared(store)
        .namespace("test")
        .store_timeout(PATIENT)
        .build();
    let calls = Calls::default();
    let found = cache.get_many_or_load(all.clone(), recording(&calls)).await;
    assert_eq!(observed.lookups(), 1, "one lookup round trip");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "one loader call");
    let mut loaded = calls[0].clone();
    loaded.sort();
    let mut cold = all[90..].to_vec();
    cold.sort();
    assert_eq!(loaded, cold, "exactly the cold keys");
    assert_eq!(found.len(), 100);
    each_its_value(shared.name, &found, &all);
    assert_eq!(observed.fills(), 10, "a fenced fill per key");
    // Now all in L1 (but an entry that shares its bucket of notifications with a key
    // filled since, which L1 no longer trusts): no load, at most the one lookup.
    let (lookups, second) = (observed.lookups(), Calls::default());
    let again = cache
        .get_many_or_load(all.clone(), recording(&second))
        .await;
    assert!(again.values().all(Result::is_ok));
    assert!(second.lock().unwrap().is_empty(), "no load");
    assert!(observed.lookups() <= lookups + 1);
    // On Redis, the one lookup is one pipeline: a process that has none of the 100 in its
    // L1 costs the server the reads of one write of 300 commands (about 30 KB, which it
    // reads 16 KB at a time), where a lookup per key would cost 100. The server counts
    // every client's reads: a fresh cache first reads what it reads once (the namespace's
    // generation, with a stored key of its own), and the least of three tries is taken,
    // as another task's call may land in one of them.
    if shared.info("stats").await.is_some() {
        warm(&shared.cache().build(), &keys(100, 101)).await;
        let mut least = u64::MAX;
        for _ in 0..3 {
            let fresh = shared.cache().build();
            let ready = fresh
                .get_many_or_load(keys(100, 101), recording(&Calls::default()))
                .await;
            assert!(ready.values().all(Result::is_ok));
            let (first, second) = (reads(&shared).await, reads(&shared).await);
            let before = reads(&shared).await;
            let found = fresh
                .get_many_or_load(all.clone(), recording(&Calls::default()))
                .await;
            let after = reads(&shared).await;
            assert!(found.values().all(Result::is_ok));
            let asking = second - first;
            least = least.min((after - before).saturating_sub(asking));
        }
        assert!(least <= 3, "redis: {least} reads for the batch");
    }
}

/// The reads from clients the Redis server has processed (`total_reads_processed`).
async fn reads(shared: &Shared) -> u64 {
    let info = shared.info("stats").await.unwrap();
    info.lines()
        .find_map(|line| line.trim().strip_prefix("total_reads_processed:"))
        .and_then(|reads| reads.parse().ok())
        .unwrap()
}

store_test!(overlapping_batches_over_four_instances_load_each_cold_key_once);
/// 50 batches of 100 keys, overlapping (each the same 100 keys, in its own order), over 4
/// instances sharing the store, 30 of the keys cold: each cold key is loaded once in all,
/// by whichever batch took its lock; the others wait for its fill. Nobody hangs.
async fn overlapping_batches_over_four_instances_load_each_cold_key_once(shared: Shared) {
    let all = keys(0, 100);
    warm(&shared.cache().build(), &all[30..]).await;
    let mut instances = vec![shared.cache().build()];
    for _ in 0..3 {
        let store = shared.other_process().await;
        instances.push(
            Cache::builder_shared(store)
                .namespace("test")
                .store_timeout(PATIENT)
                .build(),
        );
    }
    let loads: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut batches = Vec::new();
    for b in 0..50 {
        let cache = instances[b % 4].clone();
        let mut batch = all.clone();
        batch.rotate_left(b * 7 % 100);
        let loads = Arc::clone(&loads);
        batches.push(tokio::spawn(async move {
            cache
                .get_many_or_load(batch, move |keys: Vec<String>| {
                    let loads = Arc::clone(&loads);
                    async move {
                        for key in &keys {
                            *loads.lock().unwrap().entry(key.clone()).or_default() += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, std::io::Error>(
                            keys.into_iter()
                                .map(|k| {
                                    let v = value_of(&k);
                                    (k, v)
                                })
                                .collect::<HashMap<_, _>>(),
                        )
                    }
                })
                .await
        }));
    }
    for batch in batches {
        let found = tokio::time::timeout(Duration::from_secs(30), batch)
            .await
            .unwrap_or_else(|_| panic!("a batch hangs"))
            .unwrap();
        each_its_value(shared.name, &found, &all);
    }
    let loads = loads.lock().unwrap().clone();
    let mut loaded: Vec<_> = loads.keys().cloned().collect();
    loaded.sort();
    let mut cold = all[..30].to_vec();
    cold.sort();
    assert_eq!(loaded, cold, "the cold keys alone were loaded");
    assert!(
        loads.values().all(|n| *n == 1),
        "each cold key loaded once: {loads:?}"
    );
}

store_test!(a_key_the_loader_omits_is_an_error_for_it_alone);
/// A key the loader leaves out is an error for that key alone, and its lock is released at
/// once: the next caller loads it without waiting for the lock's TTL.
async fn a_key_the_loader_omits_is_an_error_for_it_alone(shared: Shared) {
    let cache = shared.cache().lock_ttl(Duration::from_secs(60)).build();
    let found = cache
        .get_many_or_load(["a", "b", "gone"], |keys: Vec<&'static str>| async move {
            Ok::<_, std::io::Error>(
                keys.into_iter()
                    .filter(|k| *k != "gone")
                    .map(|k| (k, value_of(k)))
                    .collect::<HashMap<_, _>>(),
            )
        })
        .await;
    assert_eq!(found["a"].as_ref().unwrap(), &value_of("a"));
    assert_eq!(found["b"].as_ref().unwrap(), &value_of("b"));
    let error = found["gone"].as_ref().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Load);
    let loads = Counter::default();
    let other = shared.cache().wait_timeout(Duration::from_secs(30)).build();
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        other.get_or_load("gone", slow_value(&loads, Duration::ZERO, "found")),
    )
    .await
    .unwrap_or_else(|_| panic!("the lock was not released"))
    .unwrap();
    assert_eq!((got.as_ref(), loads.get()), (&b"found"[..], 1));
}

store_test!(a_failed_or_panicking_batch_load_fails_each_key_and_frees_its_locks);
/// A failed or panicking load is the error of each key it was to load, and frees their
/// locks (here failures are not remembered, so the next caller loads at once).
async fn a_failed_or_panicking_batch_load_fails_each_key_and_frees_its_locks(shared: Shared) {
    let cache = shared
        .cache()
        .lock_ttl(Duration::from_secs(60))
        .failure_ttl(Duration::ZERO)
        .build();
    let failed = cache
        .get_many_or_load(["f1", "f2"], |_: Vec<&'static str>| async {
            Err::<HashMap<&'static str, Bytes>, _>(std::io::Error::other("database down"))
        })
        .await;
    for key in ["f1", "f2"] {
        assert_eq!(failed[key].as_ref().unwrap_err().kind(), ErrorKind::Load);
    }
    let panicked = cache
        .get_many_or_load(["p1"], |_: Vec<&'static str>| async {
            if true {
                panic!("a loader that panics");
            }
            Ok::<HashMap<&'static str, Bytes>, std::io::Error>(HashMap::new())
        })
        .await;
    assert_eq!(
        panicked["p1"].as_ref().unwrap_err().kind(),
        ErrorKind::LoadPanicked
    );
    let loads = Counter::default();
    let other = shared.cache().build();
    for key in ["f1", "f2", "p1"] {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            other.get_or_load(key, slow_value(&loads, Duration::ZERO, "later")),
        )
        .await
        .unwrap_or_else(|_| panic!("the lock of {key} was not freed"));
        assert_eq!(got.unwrap(), "later");
    }
    assert_eq!(loads.get(), 3);
}

store_test!(an_invalidation_during_a_batch_load_is_not_overtaken);
/// An invalidation of a batch's key while the batch's load is in flight is not overtaken:
/// the fill of that key is refused (the invalidation voided its lock), so the value loaded
/// before the change is never stored; the other keys are filled.
async fn an_invalidation_during_a_batch_load_is_not_overtaken(shared: Shared) {
    let cache = shared.cache().build();
    let (batch, gate) = gated_batch(&cache, &["x", "y"]).await;
    let other = shared.cache().build();
    other.invalidate("x").await.unwrap();
    gate.notify_one();
    let found = batch.await.unwrap();
    assert_eq!(
        found["x"].as_ref().unwrap(),
        &value_of("x"),
        "its caller's answer"
    );
    assert_eq!(
        shared.store.get(&cache.store_key("x")).await.unwrap(),
        None,
        "the fill after the invalidation was refused"
    );
    assert!(shared
        .store
        .get(&cache.store_key("y"))
        .await
        .unwrap()
        .is_some());
    let loads = Counter::default();
    let after = other
        .get_or_load("x", slow_value(&loads, Duration::ZERO, "after"))
        .await
        .unwrap();
    assert_eq!((after.as_ref(), loads.get()), (&b"after"[..], 1));
}

#[cfg(feature = "serde")]
store_test!(a_typed_batch_loads_the_missing_keys_once_and_decodes_every_value);
/// The typed form (feature `serde`): values of a type, one loader call with the key
/// missing; a key that holds another program's bytes is a miss, loaded on its own (as a
/// single key, which overwrites such bytes) and overwritten.
#[cfg(feature = "serde")]
async fn a_typed_batch_loads_the_missing_keys_once_and_decodes_every_value(shared: Shared) {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Price {
        cents: u64,
    }
    let cache = shared.cache().build();
    let prices = cache.typed::<Price>();
    prices
        .get_or_load("p1", || async {
            Ok::<_, std::io::Error>(Price { cents: 100 })
        })
        .await
        .unwrap();
    cache
        .set(
            "p2",
            Bytes::from_static(b"not a price"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let other = shared.cache().build().typed::<Price>();
    let asked: Arc<Mutex<Vec<Vec<&'static str>>>> = Arc::default();
    let found = other
        .get_many_or_load(["p1", "p2", "p3"], {
            let asked = Arc::clone(&asked);
            move |missing: Vec<&'static str>| {
                asked.lock().unwrap().push(missing.clone());
                async move {
                    let rows = missing.into_iter().map(|k| (k, Price { cents: 7 }));
                    Ok::<_, std::io::Error>(rows.collect::<HashMap<_, _>>())
                }
            }
        })
        .await;
    let mut asked = asked.lock().unwrap().clone();
    asked.sort_unstable();
    assert_eq!(asked, vec![vec!["p2"], vec!["p3"]]);
    assert_eq!(found["p1"].as_ref().unwrap().cents, 100);
    assert_eq!(found["p2"].as_ref().unwrap().cents, 7);
    assert_eq!(found["p3"].as_ref().unwrap().cents, 7);
}

store_test!(a_batch_dropped_mid_load_still_fills_its_keys);
/// A batch whose caller goes away mid-load: the load runs on in a task of its own and fills
/// every key (its locks go with the fills), so the next callers read the values, no load.
async fn a_batch_dropped_mid_load_still_fills_its_keys(shared: Shared) {
    let cache = shared.cache().build();
    let (batch, gate) = gated_batch(&cache, &["d1", "d2"]).await;
    batch.abort();
    assert!(batch.await.unwrap_err().is_cancelled());
    gate.notify_one();
    let other = shared.cache().build();
    let found = tokio::time::timeout(
        Duration::from_secs(10),
        other.get_many_or_load(["d1", "d2"], |_: Vec<&'static str>| async {
            Err::<HashMap<&'static str, Bytes>, _>(std::io::Error::other("no second load"))
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("a lock was left behind"));
    for key in ["d1", "d2"] {
        assert_eq!(found[key].as_ref().unwrap(), &value_of(key));
    }
}
