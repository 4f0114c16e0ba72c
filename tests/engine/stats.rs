//! What `Cache::stats` counts of the answers (lookups, hits in L1 and the store, waits,
//! passes, stale answers), and what `Health` shows.

use std::time::Duration;

use bytes::Bytes;
use support::{store_test, Counter, Shared};
use tower_stampede::{Loaded, Stats};

use crate::slow_value;

/// The answer counts of `stats`, in the order `lookups, loads, l1_hits, store_hits, waits,
/// passes, stale_answers`.
fn answers(stats: Stats) -> [u64; 7] {
    [
        stats.lookups,
        stats.loads,
        stats.l1_hits,
        stats.store_hits,
        stats.waits,
        stats.passes,
        stats.stale_answers,
    ]
}

store_test!(the_answer_counts_follow_each_outcome);
async fn the_answer_counts_follow_each_outcome(shared: Shared) {
    let one = shared.cache().build();
    let two = shared.cache().build();
    let loads = Counter::default();
    let slow = Duration::from_millis(200);

    // Ten callers of one cold key in one process: one loads, nine wait for it.
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let (one, load) = (one.clone(), slow_value(&loads, slow, "v"));
            tokio::spawn(async move { one.get_or_load("hot", load).await })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), "v");
    }
    assert_eq!(answers(one.stats()), [10, 1, 0, 0, 9, 0, 0]);

    // Then a hit in L1 here, and one in the store for the other process.
    one.get_or_load("hot", slow_value(&loads, slow, "v"))
        .await
        .unwrap();
    two.get_or_load("hot", slow_value(&loads, slow, "v"))
        .await
        .unwrap();
    assert_eq!(answers(one.stats()), [11, 1, 1, 0, 9, 0, 0]);
    assert_eq!(answers(two.stats()), [1, 0, 0, 1, 0, 0, 0]);

    // A load that is not cacheable leaves a pass marker: the next caller is told to pass.
    let pass = || async { Ok::<_, std::io::Error>(Loaded::<Bytes>::pass()) };
    one.fetch("uncacheable", pass).await.unwrap();
    two.fetch("uncacheable", pass).await.unwrap();
    assert_eq!(answers(two.stats()), [2, 0, 0, 1, 0, 1, 0]);
    assert_eq!(loads.get(), 1);
}

store_test!(health_shows_what_it_measures_by_name);
async fn health_shows_what_it_measures_by_name(shared: Shared) {
    let cache = shared.cache().build();
    // Over Redis the subscriber connects in the background, after the build: its
    // notifications are live once it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let health = loop {
        let health = cache.health().await;
        if health.is_healthy() || tokio::time::Instant::now() > deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(health.is_healthy(), "{health}");
    let shown = health.to_string();
    let names: Vec<&str> = shown
        .split(' ')
        .filter_map(|pair| pair.split('=').next())
        .collect();
    assert_eq!(
        names,
        [
            "healthy",
            "store_answers",
            "last_answer_ago_ms",
            "notifications_live",
            "breaker_closed"
        ],
        "{shown}"
    );
    assert!(
        shown.starts_with("healthy=true store_answers=true "),
        "{shown}"
    );
    assert!(
        shown.ends_with(" notifications_live=true breaker_closed=true"),
        "{shown}"
    );
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_value(&health).unwrap();
        assert_eq!(json["healthy"], true, "{json}");
        assert_eq!(json["notifications_live"], true, "{json}");
        assert_eq!(json["breaker_closed"], true, "{json}");
        let ago = json["last_answer_ago_ms"].as_u64().expect("a number");
        assert_eq!(
            Some(ago),
            health.last_answer_ago().map(|ago| ago.as_millis() as u64),
            "{json}"
        );
    }
}
