//! A batch when the store does not answer (issue 41, 4 and 6): a caller that goes away during
//! the batch's lookup leaves none of the locks it took behind, and while the circuit breaker
//! is open a batch sends nothing to the store and calls its loader once for all its keys.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{timed_test, Counter, Shared};
use tower_stampede::{Cache, Outcome};

use crate::deaf_to_polls;

timed_test!(a_batch_dropped_during_its_lookup_leaves_no_lock_behind);
/// The caller of a batch goes away while its lookup's answer (which took the locks of "a" and
/// "b") is on its way back: the locks are released at once, as a single key's are, so another
/// process leads both keys without waiting for the lock's TTL (a minute) nor its own polls.
async fn a_batch_dropped_during_its_lookup_leaves_no_lock_behind(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let observed = Observed::new(&shared.store, Duration::from_secs(30));
        let cache = Cache::builder_shared(observed.clone())
            .namespace("test")
            .store_timeout(Duration::from_secs(60))
            .lock_ttl(Duration::from_secs(60))
            .build();
        let loads = Counter::default();
        let batch = tokio::spawn({
            let (cache, loads) = (cache.clone(), loads.clone());
            async move {
                cache
                    .get_many_or_load(["a", "b"], move |keys: Vec<&'static str>| {
                        loads.hit();
                        let values = keys.into_iter().map(|k| (k, Bytes::from_static(b"v")));
                        std::future::ready(Ok::<_, std::io::Error>(
                            values.collect::<HashMap<_, _>>(),
                        ))
                    })
                    .await
            }
        });
        support::wait_until("the lookup", || observed.most_lookups_out() >= 1).await;
        batch.abort();
        assert!(batch.await.unwrap_err().is_cancelled());
        let other = deaf_to_polls(shared.other_process().await)
            .lock_ttl(Duration::from_secs(60))
            .build();
        for key in ["a", "b"] {
            let led = tokio::time::timeout(
                Duration::from_secs(20),
                other.fetch(key, || async {
                    Ok::<_, std::io::Error>(tower_stampede::Loaded::value(Bytes::from_static(
                        b"led",
                    )))
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("{name}: the lock of {key} was left behind"))
            .unwrap();
            assert_eq!(led.outcome(), Outcome::Leader, "{name}: {key}");
        }
        assert_eq!(loads.get(), 0, "{name}: the dropped batch loaded nothing");
    }
}

timed_test!(a_batch_while_the_breaker_is_open_loads_once_and_sends_nothing);
/// While the breaker is open, a batch of 100 keys sends no call to the store (no lookup, no
/// release) and calls its loader once, with the 100 keys; what it loaded is kept in L1 while
/// the store is down, so the same batch again loads nothing.
async fn a_batch_while_the_breaker_is_open_loads_once_and_sends_nothing(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let observed = Observed::new(&shared.store, Duration::ZERO);
        let cache = Cache::builder_shared(observed.clone())
            .namespace("test")
            .store_timeout(Duration::from_millis(50))
            .circuit_breaker(1, Duration::from_secs(600))
            .build();
        observed.hang(true);
        let opened = cache
            .get_or_load("opens", || async { Ok::<_, std::io::Error>(Bytes::new()) })
            .await;
        assert!(opened.is_ok() && !cache.store_available(), "{name}: open");
        // The lookup that timed out may have taken the lock of "opens": the engine frees it
        // with a release of its own task, sent whatever the breaker (the lookup was sent before
        // it opened). Counted from here, that release would be a call of the batches whenever
        // its task ran after the count was read (on real time, one run in 30 with the test's
        // two threads on one busy core).
        support::wait_until("the release of the lookup that timed out", || {
            observed.calls() >= 2
        })
        .await;
        assert_eq!(observed.calls(), 2, "{name}: the lookup and its release");
        let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
        let calls = observed.calls();
        let loads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for _ in 0..2 {
            let loads = loads.clone();
            let found = cache
                .get_many_or_load(keys.clone(), move |keys: Vec<String>| {
                    loads.lock().unwrap().push(keys.len());
                    let values = keys.into_iter().map(|k| {
                        let v = Bytes::from(format!("value of {k}"));
                        (k, v)
                    });
                    std::future::ready(Ok::<_, std::io::Error>(values.collect::<HashMap<_, _>>()))
                })
                .await;
            for key in &keys {
                let want = format!("value of {key}");
                assert_eq!(found[key].as_ref().unwrap(), &want, "{name}");
            }
        }
        assert_eq!(*loads.lock().unwrap(), [100], "{name}: one loader call");
        assert_eq!(observed.calls() - calls, 0, "{name}: no store call");
    }
}
