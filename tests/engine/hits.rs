//! Hits: from L1, then from the store; how long a value lives there; any duration as a setting;
//! and what the span of a fetch records.

use std::time::Duration;

use bytes::Bytes;
use std::sync::Arc;

use support::observed::Observed;
use support::{store_test, Counter, Shared};
use tower_stampede::store::{MemoryStore, Store};
use tower_stampede::{Cache, Loaded, Outcome};

use crate::{loader, never_called};

store_test!(hits_come_from_l1_then_from_the_store);
async fn hits_come_from_l1_then_from_the_store(shared: Shared) {
    let a = shared.cache().build();
    let b = shared.cache().build();
    let loads = Counter::default();
    let first = a
        .fetch("k", {
            let loads = loads.clone();
            move || async move {
                loads.hit();
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v")))
            }
        })
        .await
        .unwrap();
    assert_eq!(first.outcome(), Outcome::Leader);
    let again = a.fetch("k", never_called).await.unwrap();
    assert_eq!(again.outcome(), Outcome::L1Hit);
    let other = b.fetch("k", never_called).await.unwrap();
    assert_eq!(other.outcome(), Outcome::L2Hit);
    assert_eq!(other.value().unwrap(), "v");
    assert_eq!(loads.get(), 1);
}

// The test waits for L1 to expire: L1's expiry follows tokio's clock, so the memory case's
// waits take no real time.
store_test!(a_loader_sets_the_ttl_and_l1_never_outlives_it);
async fn a_loader_sets_the_ttl_and_l1_never_outlives_it(shared: Shared) {
    let a = shared.cache().build();
    a.fetch("short", || async {
        Ok::<_, std::io::Error>(Loaded::value_with_ttl(
            Bytes::from_static(b"v1"),
            Duration::from_millis(200),
        ))
    })
    .await
    .unwrap();
    let stored = shared
        .store
        .get(&a.store_key("short"))
        .await
        .unwrap()
        .unwrap();
    assert!(stored.ttl.unwrap() <= Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let loads = Counter::default();
    let fetched = a
        .fetch("short", move || async move {
            loads.hit();
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v2")))
        })
        .await
        .unwrap();
    assert_eq!(
        fetched.outcome(),
        Outcome::Leader,
        "expired in L1 and the store"
    );
    assert_eq!(fetched.value().unwrap(), "v2");
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

/// The span of each fetch (`stampede.fetch`) records its outcome, and for a call that did not
/// hit L1 how long it waited, for a subscriber that wants it. Without one the engine neither
/// enters, records nor times it (that cost an L2 hit about a point of a `GET`), and answers the
/// same. One thread, so the thread-local subscriber sees every task.
#[tokio::test(start_paused = true)]
async fn the_fetch_span_records_outcome_and_wait_for_a_subscriber() {
    let cache = Cache::builder(MemoryStore::new()).build();
    let load = || async { Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"v"))) };
    let untraced = cache.fetch("untraced", load).await.unwrap();
    assert_eq!(untraced.outcome(), Outcome::Leader);
    assert_eq!(untraced.value().unwrap(), "v");

    let logs = support::Logs::default();
    let _guard = logs.capture();
    for expected in [Outcome::Leader, Outcome::L1Hit] {
        let fetched = cache.fetch("traced", load).await.unwrap();
        assert_eq!(fetched.outcome(), expected);
    }
    let text = logs.text();
    let closed: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("stampede.fetch{") && line.contains("close"))
        .collect();
    let outcome = |outcome: Outcome| format!("outcome=\"{}\"", outcome.label());
    assert_eq!(closed.len(), 2, "{text}");
    assert!(
        closed[0].contains(&outcome(Outcome::Leader)) && closed[0].contains("wait_ms="),
        "{text}"
    );
    assert!(
        closed[1].contains(&outcome(Outcome::L1Hit)) && !closed[1].contains("wait_ms="),
        "{text}"
    );
}

/// With `readable_keys`, a warning logged inside a lookup (here: the store does not answer a
/// lookup in time) names the key as text under a default `fmt` subscriber (`INFO`, no span
/// events); without it, only the key's hash appears, as keys may hold what logs must not. A
/// key with a line break is escaped, so it cannot forge a log line.
#[tokio::test(start_paused = true)]
async fn readable_keys_name_the_key_in_warnings_only_when_asked() {
    let key = "user/42\nFORGED warning";
    for readable in [false, true] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let observed = Observed::new(&store, Duration::ZERO);
        observed.hang(true);
        let cache = Cache::builder_shared(observed.clone())
            .store_timeout(Duration::from_millis(20))
            .readable_keys(readable)
            .build();
        let logs = support::Logs::default();
        let _guard = logs.capture_default();
        let value = cache
            .get_or_load(key, || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
            })
            .await
            .unwrap();
        assert_eq!(value, "v");
        let text = logs.text();
        assert!(text.contains("WARN"), "readable {readable}: {text}");
        assert!(
            !text.lines().any(|line| line.starts_with("FORGED")),
            "readable {readable}: {text}"
        );
        if readable {
            assert!(
                text.contains(r#"key_text="user/42\nFORGED warning""#),
                "{text}"
            );
        } else {
            assert!(!text.contains("user/42"), "{text}");
        }
    }
}
