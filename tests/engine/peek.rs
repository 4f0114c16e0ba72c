//! Peeks (`Cache::get`): what is cached, from L1 then the store, never loaded, never locked,
//! and only what a lookup would answer as fresh.

use std::time::Duration;

use bytes::Bytes;
use support::{store_test, Counter, Shared};
use tower_stampede::store::{LockState, LockToken, LockWhen};
use tower_stampede::{Loaded, Outcome};

use crate::{hold_lock, loader};
use tower_stampede::store::StoreExt;

store_test!(a_peek_reads_l1_then_the_store_and_never_loads_or_locks);
/// A miss is `None` without a load or a lock: the next lookup still finds the lock free.
/// A value loaded by one process is then peeked by another (from the store) and by the loader
/// (from its L1).
async fn a_peek_reads_l1_then_the_store_and_never_loads_or_locks(shared: Shared) {
    let name = shared.name;
    let (a, b) = (shared.cache().build(), shared.cache().build());
    assert_eq!(a.get("k").await.unwrap(), None, "{name}");
    let lookup = shared
        .store
        .lookup(
            &a.store_key("k"),
            LockToken::random(),
            Duration::from_secs(5),
            LockWhen::Always,
        )
        .await
        .unwrap();
    assert_eq!(
        lookup.lock,
        LockState::Acquired,
        "{name}: the peek took no lock"
    );
    shared.store.invalidate(&a.store_key("k")).await.unwrap();

    let loads = Counter::default();
    a.fetch("k", loader(&loads, Ok("v"))).await.unwrap();
    assert_eq!(
        a.get("k").await.unwrap().as_deref(),
        Some(&b"v"[..]),
        "{name}"
    );
    assert_eq!(
        b.get("k").await.unwrap().as_deref(),
        Some(&b"v"[..]),
        "{name}"
    );
    // The store's value entered b's L1 as a lookup's would.
    let hit = b.fetch("k", crate::never_called).await.unwrap();
    assert_eq!(hit.outcome(), Outcome::L1Hit, "{name}");
    assert_eq!(loads.get(), 1, "{name}");
}

store_test!(a_peek_does_not_wait_for_a_load_in_progress);
/// While another process loads the key (it holds the lock), a peek answers `None` at once:
/// it neither waits for the load nor makes one.
async fn a_peek_does_not_wait_for_a_load_in_progress(shared: Shared) {
    let cache = shared.cache().build();
    hold_lock(&shared, &cache, "busy").await;
    let peeked = tokio::time::timeout(Duration::from_secs(30), cache.get("busy")).await;
    assert_eq!(peeked.unwrap().unwrap(), None);
}

store_test!(a_peek_answers_only_what_a_lookup_calls_fresh);
/// What a lookup would not answer as fresh, a peek does not answer: an invalidated key, a
/// value past its freshness (even within its stale window), a value of an invalidated tag,
/// a "pass" marker, foreign bytes.
async fn a_peek_answers_only_what_a_lookup_calls_fresh(shared: Shared) {
    let name = shared.name;
    let writer = shared.cache().stale(Duration::from_secs(60)).build();
    let fresh_reader = || shared.cache().stale(Duration::from_secs(60)).build();
    let loads = Counter::default();
    for key in ["gone", "expired"] {
        writer.fetch(key, loader(&loads, Ok("v"))).await.unwrap();
    }
    writer
        .fetch("tagged", || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"t")).tags(["users"]))
        })
        .await
        .unwrap();
    writer
        .fetch("passed", || async {
            Ok::<_, std::io::Error>(Loaded::pass())
        })
        .await
        .unwrap();
    shared
        .store
        .put(
            &writer.store_key("foreign"),
            Bytes::from_static(b"not ours"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let before = fresh_reader();
    assert_eq!(
        before.get("tagged").await.unwrap().as_deref(),
        Some(&b"t"[..]),
        "{name}"
    );
    assert!(before.get("expired").await.unwrap().is_some(), "{name}");

    writer.invalidate("gone").await.unwrap();
    writer.expire("expired").await.unwrap();
    writer.invalidate_tag("users").await.unwrap();
    for cache in [&writer, &fresh_reader()] {
        for key in ["gone", "expired", "tagged", "passed", "foreign"] {
            assert_eq!(cache.get(key).await.unwrap(), None, "{name}: {key}");
        }
    }
    // The value past its freshness is still there for a lookup to serve stale (while a
    // refresh that never ends here runs).
    let stale = fresh_reader()
        .fetch("expired", || {
            std::future::pending::<Result<Loaded, std::io::Error>>()
        })
        .await
        .unwrap();
    assert_eq!(stale.outcome(), Outcome::Stale, "{name}");
}

store_test!(a_peeking_process_hears_other_processes_changes);
/// A process that only peeks hears the other processes' changes as a lookup's would (issue
/// 41, 2): what its peeks keep in L1 is dropped once another process's `invalidate`, `set`
/// or `clear` is delivered, so its next peek reads the store again. On Redis its first peek
/// subscribes to the namespace's notifications (or nothing it read could be trusted).
async fn a_peeking_process_hears_other_processes_changes(shared: Shared) {
    /// Peeks `key` on `reader` until it answers `want`, within a bound far beyond a
    /// notification's delivery.
    async fn peeks(reader: &tower_stampede::Cache, key: &str, want: Option<&[u8]>, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while reader.get(key).await.unwrap().as_deref() != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: never heard"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let name = shared.name;
    let writer = shared.cache().build();
    let reader = tower_stampede::Cache::builder_shared(shared.other_process().await)
        .namespace("test")
        .store_timeout(support::PATIENT)
        .l1_ttl_cap(Duration::from_secs(120))
        .build();
    let minute = Duration::from_secs(60);
    writer
        .set("k", Bytes::from_static(b"v1"), minute)
        .await
        .unwrap();
    assert_eq!(reader.get("k").await.unwrap().as_deref(), Some(&b"v1"[..]));
    writer.invalidate("k").await.unwrap();
    peeks(&reader, "k", None, &format!("{name}: invalidate")).await;
    writer
        .set("k", Bytes::from_static(b"v2"), minute)
        .await
        .unwrap();
    peeks(&reader, "k", Some(b"v2"), &format!("{name}: first set")).await;
    writer
        .set("k", Bytes::from_static(b"v3"), minute)
        .await
        .unwrap();
    peeks(&reader, "k", Some(b"v3"), &format!("{name}: set")).await;
    writer.clear().await.unwrap();
    peeks(&reader, "k", None, &format!("{name}: clear")).await;
}
