//! Cost as the fleet grows: what one stampede asks of the store per process, however long its
//! load takes, and a busy process that does not take its own scheduling for a slow store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::observed::Observed;
use support::{timed_test, wait_until, Counter, Shared};
use tokio::sync::Notify;
use tower_stampede::store::Store;
use tower_stampede::{Cache, Outcome};

use crate::never_called;

/// A leader's load that runs until `gate` is notified: counts its call on `loads`.
fn gated_load(
    loads: &Counter,
    gate: &Arc<Notify>,
) -> impl FnOnce() -> crate::futures_ready::Load + Send + 'static {
    let (loads, gate) = (loads.clone(), Arc::clone(gate));
    move || {
        Box::pin(async move {
            loads.hit();
            gate.notified().await;
            Ok(Bytes::from_static(b"loaded once"))
        })
    }
}

/// A leader (in `cache`'s process) whose load of `key` runs until the returned gate is
/// notified; returns once the load has begun, with the count of loads.
async fn gated_leader(
    cache: &Cache,
    key: &'static str,
) -> (
    tokio::task::JoinHandle<Result<Bytes, tower_stampede::Error>>,
    Counter,
    Arc<Notify>,
) {
    let (loads, gate) = (Counter::default(), Arc::new(Notify::new()));
    let leading = tokio::spawn({
        let (cache, load) = (cache.clone(), gated_load(&loads, &gate));
        async move { cache.get_or_load(key, load).await }
    });
    wait_until("the leader loads", || loads.get() == 1).await;
    (leading, loads, gate)
}

/// A call of `key` in `cache`'s process that must be answered without loading.
fn spawn_follower(
    cache: &Cache,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<tower_stampede::Fetched, tower_stampede::Error>> {
    let cache = cache.clone();
    tokio::spawn(async move { cache.fetch(key, never_called).await })
}

timed_test!(followers_do_not_poll_while_notifications_are_received);
/// Four follower processes (ten callers each) wait for another process's load, which runs for
/// 400 ms: while the store's notifications are received, each process looks the key up twice
/// (once to find the lock held, once when the fill is notified), whatever the load's length,
/// where a backoff poll (5 ms growing to 200 ms) would look it up about nine times. The
/// followers' slow poll (`poll_while_notified`) is set to a minute, so it cannot come before
/// the load ends: at its default (1 s, jittered down to half) it came 100 ms after the load's
/// end on paper, and on Redis, on real time, a busy machine that ran the 400 ms late let it
/// come first, a third lookup.
async fn followers_do_not_poll_while_notifications_are_received(stores: Vec<Shared>) {
    for shared in stores {
        let leader = shared.cache().build();
        let (leading, loads, gate) = gated_leader(&leader, "fleet").await;
        let mut processes = Vec::new();
        for _ in 0..4 {
            let observed = Observed::new(&shared.other_process().await, Duration::ZERO);
            let cache = Cache::builder_shared(observed.clone())
                .namespace("test")
                .store_timeout(support::PATIENT)
                .poll_while_notified(Duration::from_secs(60))
                .wait_timeout(Duration::from_secs(120))
                .build();
            processes.push((observed, cache));
        }
        let mut callers = Vec::new();
        for (_, cache) in &processes {
            for _ in 0..10 {
                callers.push(spawn_follower(cache, "fleet"));
            }
        }
        wait_until("every process found the lock held", || {
            processes
                .iter()
                .all(|(observed, _)| observed.lookups() >= 1)
        })
        .await;
        // The load's length: real time on Redis, paused time on the embedded store.
        tokio::time::sleep(Duration::from_millis(400)).await;
        gate.notify_one();
        for caller in callers {
            let fetched = caller.await.unwrap().unwrap();
            assert_eq!(fetched.value().unwrap(), "loaded once");
            assert_eq!(fetched.outcome(), Outcome::Follower);
        }
        assert_eq!(leading.await.unwrap().unwrap(), "loaded once");
        assert_eq!(loads.get(), 1);
        let lookups: Vec<_> = processes.iter().map(|(o, _)| o.lookups()).collect();
        assert_eq!(lookups, [2; 4], "lookups per process");
    }
}

/// Polling stays the fallback: a follower waiting while notifications are received (its slow
/// poll a minute away) polls on its backoff as soon as they are lost (a subscriber's
/// connection dropped), before the load it waits for ends. Paused time, the embedded store:
/// the loss is told to its notifier as `RedisStore`'s subscriber tells it.
#[tokio::test(start_paused = true)]
async fn a_follower_polls_once_notifications_are_lost() {
    let shared = Shared::memory();
    let leader = shared.cache().build();
    let (leading, loads, gate) = gated_leader(&leader, "lost").await;
    let observed = Observed::new(&shared.store, Duration::ZERO);
    let follower = Cache::builder_shared(observed.clone())
        .namespace("test")
        .poll_while_notified(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
        .build();
    let following = spawn_follower(&follower, "lost");
    wait_until("the follower found the lock held", || {
        observed.lookups() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        observed.lookups(),
        1,
        "no poll while notifications are received"
    );
    let notifier = shared.store.notifier().unwrap();
    notifier.lost();
    // The backoff: 5 ms, growing by half, to 200 ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let polled = observed.lookups();
    assert!(
        polled >= 4,
        "{polled} lookups: the follower polls once they are lost"
    );
    notifier.restored();
    gate.notify_one();
    let fetched = following.await.unwrap().unwrap();
    assert_eq!(fetched.value().unwrap(), "loaded once");
    assert_eq!(leading.await.unwrap().unwrap(), "loaded once");
    assert_eq!(loads.get(), 1);
}

/// A follower whose process does not run for four times the store timeout (its thread held
/// for 2 s just after its lookup was sent, as on a machine with more busy processes than
/// cores), while Redis answers at once, is not a store error: the follower waits for the
/// leader's load instead of loading alone. Redis only (the embedded store answers within its
/// call); a current-thread runtime, so nothing of the process runs while the thread is held.
/// Real time: a 500 ms store timeout, which Redis on loopback could miss only if it did not
/// run for half a second while this process did (with the 50 ms it had before, a busy
/// machine could starve Redis that long, a store error).
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_busy_process_does_not_take_itself_for_a_slow_store() {
    let shared = Shared::redis().await;
    let leader = shared.cache().build();
    let (leading, loads, gate) = gated_leader(&leader, "busy").await;
    let other = shared.other_process().await;
    let observed = Observed::stalling_first_lookup(&other, Duration::from_secs(2));
    let follower = Cache::builder_shared(observed.clone())
        .namespace("test")
        .store_timeout(Duration::from_millis(500))
        .build();
    let following = spawn_follower(&follower, "busy");
    wait_until("the follower found the lock held", || {
        observed.lookups() >= 1
    })
    .await;
    gate.notify_one();
    let fetched = following.await.unwrap().unwrap();
    assert_eq!(fetched.value().unwrap(), "loaded once");
    // Woken by the fill, or (if the fill went out before the held lookup) reading it.
    assert!(
        matches!(fetched.outcome(), Outcome::Follower | Outcome::L2Hit),
        "{:?}",
        fetched.outcome()
    );
    assert_eq!(follower.stats().store_errors, 0);
    assert_eq!(leading.await.unwrap().unwrap(), "loaded once");
    assert_eq!(loads.get(), 1);
}

/// A cold start: one process asks for 1,000 keys at once (each its own flight, so its own
/// lookup), over a store whose lookups take 10 ms. At most 256 lookups are out at once, the
/// others wait in the process, and none counts as a store timeout: a lookup's timeout runs
/// from when it is sent, not from when its caller asked. (Without the bound, all 1,000 were
/// out at once; over Redis, 10,000 cold keys in one process queued 30,000 commands in its
/// connection, and nine lookups in ten timed out behind the others.) Paused time, the
/// embedded store behind a wrapper that answers late.
#[tokio::test(start_paused = true)]
async fn a_burst_of_cold_keys_sends_at_most_256_lookups_at_once() {
    let shared = Shared::memory();
    let observed = Observed::new(&shared.store, Duration::from_millis(10));
    let cache = Cache::builder_shared(observed.clone())
        .namespace("test")
        .store_timeout(Duration::from_millis(50))
        .build();
    let loads = Counter::default();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..1_000 {
        let (cache, load) = (
            cache.clone(),
            crate::slow_value(&loads, Duration::ZERO, "v"),
        );
        calls.spawn(async move { cache.get_or_load(format!("cold-{key}"), load).await });
    }
    while let Some(call) = calls.join_next().await {
        assert_eq!(call.unwrap().unwrap(), "v");
    }
    assert_eq!(loads.get(), 1_000);
    assert_eq!(observed.most_lookups_out(), 256);
    let stats = cache.stats();
    assert_eq!(
        (stats.store_errors, stats.breaker_opened),
        (0, 0),
        "{stats:?}"
    );
}

/// Two caches over one `RedisStore` (two namespaces of one app, say) ask for 500 cold keys
/// each at once, over lookups that take 10 ms: together they keep at most 256 lookups out, the
/// store's limit, not 256 each, which would queue twice as many calls in the store's client as
/// it takes before their timeouts run there. (Several caches over one `MemoryStore` stand for
/// several processes, each with a client of its own: each keeps a limit of its own.)
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caches_over_one_store_share_its_limit_of_calls_in_flight() {
    let shared = Shared::redis().await;
    let observed = Observed::new(&shared.store, Duration::from_millis(10));
    let caches = ["one", "two"].map(|namespace| {
        Cache::builder_shared(observed.clone())
            .namespace(namespace)
            .store_timeout(support::PATIENT)
            .build()
    });
    let loads = Counter::default();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..1_000 {
        let (cache, load) = (
            caches[key % 2].clone(),
            crate::slow_value(&loads, Duration::ZERO, "v"),
        );
        calls.spawn(async move { cache.get_or_load(format!("cold-{key}"), load).await });
    }
    while let Some(call) = calls.join_next().await {
        assert_eq!(call.unwrap().unwrap(), "v");
    }
    assert_eq!(loads.get(), 1_000);
    assert_eq!(observed.most_lookups_out(), 256);
}

/// A cold start over 2,000 keys in one process, over a store whose lookups answer 50 ms late:
/// 256 lookups go out at a time, so the burst's lookups take eight rounds, 400 ms. Each
/// leader's fill (and the tag clock it reads before its load) goes in a lane of its own, not
/// behind the lookups still waiting: the first round's keys are filled 50 ms in, every key
/// within its 150 ms lock, and another process finds all 2,000 without loading. (Behind the
/// lookups, a leader waited up to 350 ms and its lock ran out: its fill was refused wherever
/// another process had taken the lock, which loaded the key again; on two cores shared by 32
/// processes, 2,507 of 10,000 keys loaded twice.) Paused time, the embedded store behind a
/// wrapper that answers late, so the durations are exact. The same burst over Redis, on real
/// time, is a benchmark (`benches/cold_burst.rs`): there 150 ms locks race the machine's
/// scheduler, which a busy machine loses.
#[tokio::test(start_paused = true)]
async fn a_burst_of_cold_keys_fills_before_its_locks_run_out() {
    let shared = Shared::memory();
    let observed = Observed::new(&shared.store, Duration::from_millis(50));
    let cache = Cache::builder_shared(observed.clone())
        .namespace("test")
        .store_timeout(support::PATIENT)
        .lock_ttl(Duration::from_millis(150))
        .build();
    let loads = Counter::default();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..2_000 {
        let (cache, load) = (
            cache.clone(),
            crate::slow_value(&loads, Duration::ZERO, "v"),
        );
        calls.spawn(async move { cache.get_or_load(format!("cold-{key}"), load).await });
    }
    // The first 256 lookups are answered 50 ms in; their leaders' clock read and fill go out
    // at once, while 1,744 lookups still wait. (Behind them, no key was filled before 350 ms;
    // its lock lapsed, and only because nobody took it did the fill still land.)
    tokio::time::sleep(Duration::from_millis(60)).await;
    let mut filled = 0;
    for key in 0..2_000 {
        let key = cache.store_key(format!("cold-{key}"));
        filled += usize::from(shared.store.get(&key).await.unwrap().is_some());
    }
    assert_eq!(filled, 256, "filled while the burst's later lookups wait");
    while let Some(call) = calls.join_next().await {
        assert_eq!(call.unwrap().unwrap(), "v");
    }
    assert_eq!(loads.get(), 2_000);
    let other = shared.cache().build();
    for key in 0..2_000 {
        let fetched = other
            .fetch(format!("cold-{key}"), never_called)
            .await
            .unwrap();
        assert_eq!(fetched.value().unwrap(), "v", "cold-{key}");
    }
}

timed_test!(a_process_reads_the_namespace_generation_once);
/// Every stored value carries its namespace's generation, checked when it is read from the
/// store. A new process reading 100 values another process filled, all at once, reads the
/// generation once or twice (a read sent before a value was read cannot vouch for it), not
/// once per value; a process whose load
/// checked its value against the generation (lookup, clock, fill, generation) reads it no more
/// for the next 100 values; and 100 loads that start together in a new process read the clock
/// once. Before, 10,000 cold keys over 4 processes cost 23,953 reads of the generation,
/// nearly one per follower, and over 32 processes 890 reads of the clock.
async fn a_process_reads_the_namespace_generation_once(stores: Vec<Shared>) {
    for shared in stores {
        let filler = shared.cache().build();
        for key in 0..100 {
            filler
                .get_or_load(format!("filled-{key}"), || async {
                    Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                })
                .await
                .unwrap();
        }
        let reads_all = |cache: &Cache| {
            let mut reads = tokio::task::JoinSet::new();
            for key in 0..100 {
                let cache = cache.clone();
                reads
                    .spawn(async move { cache.fetch(format!("filled-{key}"), never_called).await });
            }
            reads.join_all()
        };
        let observed = listening(&shared).await;
        let reader = Cache::builder_shared(observed.clone())
            .namespace("test")
            .store_timeout(support::PATIENT)
            .build();
        for fetched in reads_all(&reader).await {
            assert_eq!(fetched.unwrap().outcome(), Outcome::L2Hit);
        }
        // The first read of the generation may have been sent before some of the values were
        // read: those wait for a second.
        let others = observed.calls() - observed.lookups();
        assert!(
            (1..=2).contains(&others),
            "a new reader read it {others} times"
        );

        let observed = listening(&shared).await;
        let loader = Cache::builder_shared(observed.clone())
            .namespace("test")
            .store_timeout(support::PATIENT)
            .build();
        loader
            .get_or_load("its own", || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"own"))
            })
            .await
            .unwrap();
        assert_eq!(observed.calls(), 4, "a load");
        for fetched in reads_all(&loader).await {
            assert_eq!(fetched.unwrap().outcome(), Outcome::L2Hit);
        }
        assert_eq!(observed.calls(), 4 + 100, "a loader");

        // Loads that start together read the tag clock (and with it the generation) once.
        let observed = listening(&shared).await;
        let loaders = Cache::builder_shared(observed.clone())
            .namespace("test")
            .store_timeout(support::PATIENT)
            .build();
        let mut loads = tokio::task::JoinSet::new();
        for key in 0..100 {
            let loaders = loaders.clone();
            loads.spawn(async move {
                let load = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"new")) };
                loaders.get_or_load(format!("new-{key}"), load).await
            });
        }
        for loaded in loads.join_all().await {
            assert_eq!(loaded.unwrap(), "new");
        }
        assert_eq!((observed.lookups(), observed.fills()), (100, 100));
        // The clock once, and the generation (to check the values) once or twice.
        let others = observed.calls() - observed.lookups() - observed.fills();
        assert!(
            (2..=3).contains(&others),
            "loads read the tag state {others} times"
        );
    }
}

/// Another process's store, seen through [`Observed`], once its notifications are received
/// (what a process reads before its subscription is in place cannot be kept).
async fn listening(shared: &Shared) -> Arc<Observed> {
    let observed = Observed::new(&shared.other_process().await, Duration::ZERO);
    let key = shared.cache().build().store_key("subscribe");
    {
        let _watch = observed.subscribe(&key);
        if let Some(notifier) = observed.notifier() {
            wait_until("notifications are received", || notifier.receiving()).await;
        }
    }
    observed
}

timed_test!(a_leader_keeps_its_lock_until_its_fill_lands);
/// A leader whose fill takes 3 s to reach the store (a busy process, a store far behind), with
/// 2 s locks: its watchdog renews the lock from the lead's start until the fill is done, not
/// only while the load runs, so a follower in another process, looking the key up every 50 ms
/// meanwhile, never finds the lock free: it waits for the fill, and nothing loads twice.
/// (Renewed during the load alone, the lock ran out before the fill; whoever took it loaded
/// again, and the fill was refused: on two cores shared by 32 processes and a Redis Cluster,
/// 4,603 of 10,000 keys loaded twice.) Paused time on the embedded store; real time on Redis
/// (3 s), where the lock could lapse only if its renewals, due every 667 ms, all stalled for
/// over 1.3 s.
async fn a_leader_keeps_its_lock_until_its_fill_lands(stores: Vec<Shared>) {
    for shared in stores {
        let slow = Observed::slow_fills(&shared.store, Duration::from_secs(3));
        let leader = Cache::builder_shared(slow.clone())
            .namespace("test")
            // Longer than the fill takes: the fill must land, not time out.
            .store_timeout(Duration::from_secs(10))
            .lock_ttl(Duration::from_secs(2))
            .build();
        let loads = Counter::default();
        let leading = tokio::spawn({
            let (leader, load) = (
                leader.clone(),
                crate::slow_value(&loads, Duration::ZERO, "v"),
            );
            async move { leader.get_or_load("slow fill", load).await }
        });
        wait_until("the fill is on its way", || slow.fills() == 1).await;
        // Looks the key up every 25 to 50 ms, notifications or not: a lock that lapsed would
        // be its at once.
        let other = Cache::builder_shared(shared.other_process().await)
            .namespace("test")
            .store_timeout(support::PATIENT)
            .backoff(Duration::from_millis(50), Duration::from_millis(50))
            .poll_while_notified(Duration::from_millis(50))
            .build();
        let fetched = other.fetch("slow fill", never_called).await.unwrap();
        assert_eq!(fetched.value().unwrap(), "v");
        assert_eq!(leading.await.unwrap().unwrap(), "v");
        assert_eq!(loads.get(), 1);
        assert_eq!(slow.fills(), 1);
    }
}
