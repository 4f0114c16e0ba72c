//! This process's own change is never undone in its L1 by a read or load already in flight
//! (issue 41, 7): "this process's own L1 forgets the key before the call returns, even when
//! the store fails" holds over a store without notifications, for a clear while the circuit
//! breaker is open, and for values loaded alone while the store is down, tags included.
//!
//! Each test holds a read or a load in flight across the change: a store reply held back
//! (`Observed`'s late lookups) or a loader gated by a `Notify`. Paused time on the embedded
//! store, real time on Redis (`timed_test!`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::{Cache, ErrorKind, Loaded, Outcome};

/// How late the held-back lookups answer: long after the change they straddle is made.
const LATE: Duration = Duration::from_millis(1500);

/// A loader that counts its call and answers `value` tagged `tags`.
fn loader(
    loads: &Counter,
    value: &'static str,
    tags: &'static [&'static str],
) -> impl FnOnce() -> std::future::Ready<Result<Loaded, std::io::Error>> + Send + 'static {
    let loads = loads.clone();
    move || {
        loads.hit();
        std::future::ready(Ok(
            Loaded::value(Bytes::from_static(value.as_bytes())).tags(tags)
        ))
    }
}

/// A loader that answers `value` tagged `tags` once the returned gate is opened, and says
/// when it has started.
#[allow(clippy::type_complexity)]
fn gated(
    value: &'static str,
    tags: &'static [&'static str],
) -> (
    impl FnOnce() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Loaded, std::io::Error>> + Send>,
        > + Send
        + 'static,
    Arc<Notify>,
    Arc<Notify>,
) {
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let load = {
        let (started, gate) = (started.clone(), gate.clone());
        move || {
            Box::pin(async move {
                started.notify_one();
                gate.notified().await;
                Ok(Loaded::value(Bytes::from_static(value.as_bytes())).tags(tags))
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>
        }
    };
    (load, started, gate)
}

timed_test!(an_invalidation_holds_over_a_store_without_notifications);
/// A read of "row" whose lookup found "old" and answers late straddles `invalidate` (the
/// same with `set` and `clear`): its own caller gets "old", but L1 does not keep it, over a
/// store that sends no notifications (a third-party store) and with `notifications(false)`.
async fn an_invalidation_holds_over_a_store_without_notifications(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        for (deaf, change) in [(true, "invalidate"), (false, "set"), (false, "clear")] {
            let observed = if deaf {
                Observed::deaf(&shared.store, LATE)
            } else {
                Observed::new(&shared.store, LATE)
            };
            let cache = Cache::builder_shared(observed.clone())
                .namespace(change)
                .store_timeout(LATE * 2)
                .notifications(deaf)
                .l1_ttl_cap(Duration::from_secs(120))
                .build();
            let writer = Cache::builder_shared(shared.other_process().await)
                .namespace(change)
                .build();
            let minute = Duration::from_secs(60);
            writer.set("row", "old", minute).await.unwrap();
            let loads = Counter::default();
            let read = tokio::spawn({
                let (cache, load) = (cache.clone(), loader(&loads, "loaded", &[]));
                async move { cache.fetch("row", load).await.unwrap() }
            });
            // The lookup has been made; its answer is on its way back.
            support::wait_until("the lookup", || observed.most_lookups_out() >= 1).await;
            match change {
                "invalidate" => cache.invalidate("row").await.unwrap(),
                "set" => cache.set("row", "new", minute).await.unwrap(),
                _ => cache.clear().await.unwrap(),
            }
            let read = read.await.unwrap();
            let after = cache.get("row").await.unwrap();
            if change == "clear" {
                // The value's generation is checked after the read: outdated, it may be
                // loaded again for the caller too.
                assert!(loads.get() <= 1, "{name} {change}");
                assert_ne!(after.as_deref(), Some(&b"old"[..]), "{name} {change}");
                continue;
            }
            assert_eq!(
                read.value().unwrap(),
                "old",
                "{name} {change}: its own caller"
            );
            let want = if change == "set" {
                Some(&b"new"[..])
            } else {
                None
            };
            assert_eq!(
                after.as_deref(),
                want,
                "{name} {change}: the read from before the change is not kept"
            );
            assert_eq!(loads.get(), 0, "{name} {change}");
        }
    }
}

/// A cache over `shared` whose store hangs: its first lookup times out and opens the
/// breaker; and the switch of its store.
fn hanging(shared: &Shared) -> (Cache, Arc<Observed>) {
    let observed = Observed::new(&shared.store, Duration::ZERO);
    let cache = Cache::builder_shared(observed.clone())
        .namespace("down")
        .store_timeout(Duration::from_millis(50))
        .circuit_breaker(1, Duration::from_secs(600))
        .l1_ttl_cap(Duration::from_secs(120))
        .build();
    observed.hang(true);
    (cache, observed)
}

timed_test!(a_clear_while_the_breaker_is_open_holds_in_this_process);
/// A load made alone (the store down, the breaker open) is in flight when `clear` is called:
/// the clear is an error (the store call is skipped), its own caller gets "old", but L1 does
/// not keep it, and the next read loads again.
async fn a_clear_while_the_breaker_is_open_holds_in_this_process(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let (cache, _observed) = hanging(&shared);
        let (load, started, gate) = gated("old", &[]);
        let read = tokio::spawn({
            let cache = cache.clone();
            async move { cache.fetch("row", load).await.unwrap() }
        });
        started.notified().await;
        assert!(!cache.store_available(), "{name}: the breaker is open");
        let error = cache.clear().await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Store, "{name}");
        gate.notify_one();
        let read = read.await.unwrap();
        assert_eq!(read.outcome(), Outcome::Degraded, "{name}");
        assert_eq!(read.value().unwrap(), "old", "{name}: its own caller");
        let loads = Counter::default();
        let again = cache
            .fetch("row", loader(&loads, "new", &[]))
            .await
            .unwrap();
        assert_eq!(
            again.value().unwrap(),
            "new",
            "{name}: not the value from before"
        );
        assert_eq!(loads.get(), 1, "{name}");
    }
}

timed_test!(a_tag_invalidation_while_the_store_is_down_holds_in_this_process);
/// Values loaded alone while the store is down keep their tags: `invalidate_tag` (an error,
/// the store being down) drops one already in L1, and one whose load is in flight does not
/// enter; both are loaded again.
async fn a_tag_invalidation_while_the_store_is_down_holds_in_this_process(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let (cache, _observed) = hanging(&shared);
        let loads = Counter::default();
        let held = cache
            .fetch("held", loader(&loads, "old", &["t"]))
            .await
            .unwrap();
        assert_eq!(held.outcome(), Outcome::Degraded, "{name}");
        let hit = cache
            .fetch("held", loader(&loads, "new", &["t"]))
            .await
            .unwrap();
        assert_eq!(
            hit.outcome(),
            Outcome::L1Hit,
            "{name}: kept while the store is down"
        );
        let (load, started, gate) = gated("old", &["t"]);
        let read = tokio::spawn({
            let cache = cache.clone();
            async move { cache.fetch("flying", load).await.unwrap() }
        });
        started.notified().await;
        let error = cache.invalidate_tag("t").await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Store, "{name}");
        gate.notify_one();
        assert_eq!(
            read.await.unwrap().value().unwrap(),
            "old",
            "{name}: its own caller"
        );
        for key in ["held", "flying"] {
            let again = cache
                .fetch(key, loader(&loads, "new", &["t"]))
                .await
                .unwrap();
            assert_eq!(again.value().unwrap(), "new", "{name}: {key}");
        }
        assert_eq!(loads.get(), 3, "{name}");
    }
}
