//! TTL jitter: keys written together do not all expire in the same second.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use support::{store_test, Shared};
use tower_stampede::{Cache, Loaded};

const TTL: Duration = Duration::from_secs(60);
const JITTER: Duration = Duration::from_secs(10);

/// Loads `keys` keys one after the other and answers how many of them the store will expire
/// in each second from now (by their remaining life in the store, read at once).
async fn expiries_per_second(cache: &Cache, keys: usize) -> BTreeMap<u64, usize> {
    for i in 0..keys {
        cache
            .get_or_load(format!("k{i}"), || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
            })
            .await
            .unwrap();
    }
    let mut seconds = BTreeMap::new();
    for i in 0..keys {
        let stored = cache.store().get(&cache.store_key(format!("k{i}"))).await;
        let ttl = stored.unwrap().unwrap().ttl.unwrap();
        *seconds.entry(ttl.as_secs()).or_insert(0) += 1;
    }
    seconds
}

/// 10,000 keys written at once (paused time: the same instant) with a 60 s TTL: without
/// jitter all of them expire in the same second, and their reloads come together. With 10 s
/// of jitter they spread over the ten seconds after the TTL, about a thousand a second.
#[tokio::test(start_paused = true)]
async fn ten_thousand_keys_written_together_expire_over_the_jitter() {
    let shared = Shared::memory();
    let plain = shared.cache().namespace("plain").ttl(TTL).build();
    let together = expiries_per_second(&plain, 10_000).await;
    assert_eq!(together.values().max(), Some(&10_000), "{together:?}");

    let jittered = shared
        .cache()
        .namespace("jittered")
        .ttl(TTL)
        .ttl_jitter(JITTER)
        .build();
    let spread = expiries_per_second(&jittered, 10_000).await;
    let most = *spread.values().max().unwrap();
    println!("most expiries in one second: {most} of 10000, by second {spread:?}");
    // Binomial, 10,000 draws at p = 1/10: 1,000 ± 30 a second; 1,300 is ten deviations out.
    assert!(most < 1_300, "{spread:?}");
    assert_eq!(
        spread.keys().copied().collect::<Vec<_>>(),
        (60..70).collect::<Vec<_>>()
    );
}

store_test!(the_store_keeps_each_value_for_its_ttl_and_a_share_of_the_jitter);
/// Over both stores, the jitter lengthens the value's life in the store, within the bound, and
/// a loader may keep its value's TTL exact.
async fn the_store_keeps_each_value_for_its_ttl_and_a_share_of_the_jitter(shared: Shared) {
    let cache = shared.cache().ttl(TTL).ttl_jitter(JITTER).build();
    let seconds = expiries_per_second(&cache, 200).await;
    let (first, last) = (seconds.keys().next(), seconds.keys().last());
    assert!(first >= Some(&50), "{seconds:?}");
    assert!(last < Some(&70), "{seconds:?}");
    assert!(seconds.len() >= 5, "spread {seconds:?}");

    cache
        .fetch("exact", || async {
            Ok::<_, std::io::Error>(
                Loaded::value(Bytes::from_static(b"v")).ttl_jitter(Duration::ZERO),
            )
        })
        .await
        .unwrap();
    let stored = cache.store().get(&cache.store_key("exact")).await.unwrap();
    let ttl = stored.unwrap().ttl.unwrap();
    assert!(ttl <= TTL && ttl > TTL - Duration::from_secs(5), "{ttl:?}");
}
