//! A batch's stale values (issue 41, 3): the keys a batch leads honour the stale windows as
//! `get_or_load` does. Within the stale window the stale value answers at once while the
//! reload runs; within `stale_if_error` it stands in for a failed reload, and answers once a
//! slow reload has taken the soft timeout. Paused time on the embedded store, real time on
//! Redis (`timed_test!`); each reload is held by a `Notify` the test opens when it is done.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{timed_test, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::{Cache, CacheBuilder};

/// Far beyond any answer that does not wait for the reload.
const LIMIT: Duration = Duration::from_secs(5);

type Answers = HashMap<&'static str, Result<Bytes, tower_stampede::Error>>;

/// A cache over `shared` tuned by `tune`, whose key "a" holds "old", made stale.
async fn stale_a(shared: &Shared, tune: fn(CacheBuilder) -> CacheBuilder) -> Cache {
    let cache = tune(shared.cache().ttl(Duration::from_secs(60))).build();
    cache
        .get_or_load("a", || async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"old"))
        })
        .await
        .unwrap();
    cache.expire("a").await.unwrap();
    cache
}

/// A batch of `keys` on `cache`, in a task, whose load (counted on `loads`) answers "new"
/// for each key, or fails (`fails`), once the returned gate is opened.
fn gated_batch(
    cache: &Cache,
    keys: &'static [&'static str],
    loads: &Counter,
    fails: bool,
) -> (tokio::task::JoinHandle<Answers>, Arc<Notify>) {
    let gate = Arc::new(Notify::new());
    let batch = tokio::spawn({
        let (cache, gate, loads) = (cache.clone(), gate.clone(), loads.clone());
        async move {
            cache
                .get_many_or_load(keys.to_vec(), move |keys: Vec<&'static str>| {
                    let (gate, loads) = (gate.clone(), loads.clone());
                    async move {
                        loads.hit();
                        gate.notified().await;
                        if fails {
                            return Err(std::io::Error::other("the backend is down"));
                        }
                        let values = keys.into_iter().map(|k| (k, Bytes::from_static(b"new")));
                        Ok(values.collect::<HashMap<_, _>>())
                    }
                })
                .await
        }
    });
    (batch, gate)
}

/// Reads "a" on `cache` until it answers "new" (the reload's fill), within [`LIMIT`].
async fn reloaded(cache: &Cache, name: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while cache.get("a").await.unwrap().as_deref() != Some(&b"new"[..]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

timed_test!(a_batch_answers_a_stale_key_at_once_while_it_reloads);
/// Within the stale window (`stale`), a key the batch leads is answered its stale value at
/// once, while its reload (held until the test opens it) runs on and fills the cache.
async fn a_batch_answers_a_stale_key_at_once_while_it_reloads(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let cache = stale_a(&shared, |b| b.stale(Duration::from_secs(30))).await;
        let loads = Counter::default();
        let (batch, gate) = gated_batch(&cache, &["a"], &loads, false);
        let answered = tokio::time::timeout(LIMIT, batch)
            .await
            .unwrap_or_else(|_| panic!("{name}: the batch waited for the reload"))
            .unwrap();
        assert_eq!(answered["a"].as_ref().unwrap(), "old", "{name}");
        support::wait_until("the reload", || loads.get() == 1).await;
        gate.notify_one();
        reloaded(&cache, name).await;
        assert_eq!(loads.get(), 1, "{name}: one reload");
    }
}

timed_test!(a_batch_answers_a_stale_key_in_place_of_a_failed_reload);
/// Within `stale_if_error` (and no stale window), a key whose reload fails is answered its
/// stale value instead of the error.
async fn a_batch_answers_a_stale_key_in_place_of_a_failed_reload(stores: Vec<Shared>) {
    for shared in stores {
        let name = shared.name;
        let cache = stale_a(&shared, |b| b.stale_if_error(Duration::from_secs(3600))).await;
        let loads = Counter::default();
        let (batch, gate) = gated_batch(&cache, &["a"], &loads, true);
        support::wait_until("the reload", || loads.get() == 1).await;
        gate.notify_one();
        let answered = batch.await.unwrap();
        assert_eq!(
            answered["a"].as_ref().unwrap(),
            "old",
            "{name}: stale-if-error"
        );
    }
}

timed_test!(a_batch_answers_a_stale_key_once_its_reload_takes_the_soft_timeout);
/// With a soft timeout, a key whose reload is slow is answered its stale value (within
/// `stale_if_error`) once the reload has taken that long; the reload goes on and fills.
async fn a_batch_answers_a_stale_key_once_its_reload_takes_the_soft_timeout(stores: Vec<Shared>) {
    fn soft(builder: CacheBuilder) -> CacheBuilder {
        builder
            .stale_if_error(Duration::from_secs(3600))
            .soft_timeout(Duration::from_millis(100))
    }
    for shared in stores {
        let name = shared.name;
        let cache = stale_a(&shared, soft).await;
        let loads = Counter::default();
        let (batch, gate) = gated_batch(&cache, &["a"], &loads, false);
        let answered = tokio::time::timeout(LIMIT, batch)
            .await
            .unwrap_or_else(|_| panic!("{name}: the batch waited past its soft timeout"))
            .unwrap();
        assert_eq!(answered["a"].as_ref().unwrap(), "old", "{name}");
        gate.notify_one();
        reloaded(&cache, name).await;
        assert_eq!(loads.get(), 1, "{name}: one reload");
    }
}
