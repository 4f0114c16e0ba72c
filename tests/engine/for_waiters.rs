//! Results for waiters only (`Loaded::for_waiters`): the calls that waited for the load, in
//! this process and in others, get its result; a call that began after it was written loads.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{store_test, timed_test, wait_until, Counter, Shared};
use tower_stampede::store::StoreExt;
use tower_stampede::store::{LockState, LockToken, LockWhen};
use tower_stampede::{Cache, Loaded, Outcome};

store_test!(a_result_for_waiters_goes_to_them_and_is_not_reused);
/// `Loaded::for_waiters`: the calls that waited for the load, in this process (one flight)
/// and in another (a follower of the lock), get its result; nothing is kept for the calls
/// that come after the load ended: each loads again, one at a time.
async fn a_result_for_waiters_goes_to_them_and_is_not_reused(shared: Shared) {
    let (a, b) = (shared.cache().build(), shared.cache().build());
    let loads = Counter::default();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let loader = {
        let (loads, release) = (loads.clone(), Arc::clone(&release));
        move || {
            let (loads, release) = (loads.clone(), Arc::clone(&release));
            move || async move {
                let n = loads.hit();
                if n == 1 {
                    release.acquire().await.unwrap().forget();
                }
                Ok::<_, std::convert::Infallible>(Loaded::for_waiters(Bytes::from(format!(
                    "error {n}"
                ))))
            }
        }
    };
    let (mut calls, started) = (Vec::new(), Counter::default());
    for i in 0..20 {
        let (cache, started) = (
            if i % 2 == 0 { a.clone() } else { b.clone() },
            started.clone(),
        );
        let loader = loader();
        calls.push(tokio::spawn(async move {
            started.hit();
            cache.fetch("k", loader).await
        }));
    }
    // The first load is held until every call has started.
    wait_until(shared.name, || loads.get() > 0 && started.get() == 20).await;
    release.add_permits(1);
    let mut first = 0;
    for call in calls {
        let fetched = call.await.unwrap().unwrap();
        let value = fetched.value().unwrap().clone();
        assert!(value.starts_with(b"error "), "{value:?}");
        if value == "error 1" {
            first += 1;
            assert!(
                matches!(fetched.outcome(), Outcome::Leader | Outcome::Follower),
                "{:?}",
                fetched.outcome()
            );
        }
    }
    assert!(first > 10, "{first} calls waited for the first load");
    for cache in [&a, &b] {
        let before = loads.get();
        let fetched = cache.fetch("k", loader()).await.unwrap();
        assert_eq!(fetched.outcome(), Outcome::Leader);
        assert_eq!(
            fetched.value().unwrap(),
            &Bytes::from(format!("error {}", before + 1))
        );
    }
}

timed_test!(an_answer_written_before_a_call_began_is_not_its_answer);
/// `Loaded::for_waiters` answers the calls that began before the answer was written, however
/// late the store's replies come and however the writer was configured: a call that began just
/// after it, then waited for another holder of the lock (as another process's follower holds
/// it a moment to read the answer), loads. First its lookups answer 50 ms after they take
/// effect, so that the answer's age, read from the store, is less than the call's wait by the
/// time the reply is in; then the answer's writer keeps it far longer than the call's cache
/// would (a longer backoff), so that its age is not what that cache's own setting says.
async fn an_answer_written_before_a_call_began_is_not_its_answer(stores: Vec<Shared>) {
    for shared in stores {
        let late_replies = shared.cache().build();
        answer_then_call(&shared, &late_replies, "late", Duration::from_millis(50)).await;
        let longer_life = shared
            .cache()
            .backoff(Duration::from_millis(10), Duration::from_secs(10))
            .build();
        answer_then_call(&shared, &longer_life, "long", Duration::ZERO).await;
    }
}

/// `writer` answers the waiters of `key` (nobody waits); another holder takes the lock, a call
/// over a store whose lookups answer `late` begins and waits, and the lock is freed: the call
/// must load.
async fn answer_then_call(shared: &Shared, writer: &Cache, key: &'static str, late: Duration) {
    let answered = writer
        .fetch(key, || async {
            Ok::<_, std::io::Error>(Loaded::for_waiters(Bytes::from_static(b"503")))
        })
        .await
        .unwrap();
    assert_eq!(answered.outcome(), Outcome::Leader);
    let store_key = writer.store_key(key);
    let holder = LockToken::random();
    let taken = shared
        .store
        .lookup(&store_key, holder, Duration::from_secs(5), LockWhen::Always)
        .await
        .unwrap();
    assert_eq!(taken.lock, LockState::Acquired);
    let call = Cache::builder_shared(Observed::new(&shared.store, late))
        .namespace("test")
        .store_timeout(support::PATIENT)
        .build();
    let loads = Counter::default();
    let calling = tokio::spawn({
        let loads = loads.clone();
        async move {
            call.fetch(key, move || async move {
                loads.hit();
                Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"new")))
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(shared.store.release(&store_key, holder).await.unwrap());
    let fetched = calling.await.unwrap().unwrap();
    assert_eq!(
        (
            fetched.value().unwrap().as_ref(),
            fetched.outcome(),
            loads.get()
        ),
        (&b"new"[..], Outcome::Leader, 1),
        "{key}"
    );
}
