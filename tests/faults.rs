//! Redis failing under the engine: killed in the middle of a stampede, paused and resumed,
//! restarted empty. The store is an optimisation: every request must still be answered, and
//! protection across processes must come back by itself.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::{Counter, RedisServer};
use tower_stampede::store::{LockState, LockToken, LockWhen, RedisStore};
use tower_stampede::{Cache, Loaded, Outcome};

/// The failure guard on anything that waits: far beyond what a healthy run needs.
const LIMIT: Duration = Duration::from_secs(20);

/// `count` app instances, each with its own connections to the server, and a short store
/// timeout (50 ms), so that a Redis that answers nothing is found out quickly.
async fn instances(server: &RedisServer, count: usize) -> Vec<Cache> {
    let mut instances = Vec::new();
    for _ in 0..count {
        let store = RedisStore::connect(server.url()).await.unwrap();
        let cache = Cache::builder(store)
            .namespace("faults")
            .store_timeout(Duration::from_millis(50));
        instances.push(cache.build());
    }
    instances
}

/// What a stampede saw: answers by outcome, errors, the slowest answer, and backend loads.
#[derive(Debug)]
struct Seen {
    outcomes: HashMap<Outcome, usize>,
    errors: Vec<String>,
    slowest: Duration,
    loads: usize,
}

/// Starts `requests` concurrent calls for `key` over `instances` (round robin), each load
/// taking `load`; `during` runs once they are all started (to break Redis mid-stampede).
async fn stampede(
    instances: &[Cache],
    key: &str,
    requests: usize,
    load: Duration,
    during: impl std::future::Future<Output = ()>,
) -> Seen {
    let loads = Counter::default();
    let callers: Vec<_> = (0..requests)
        .map(|i| {
            let cache = instances[i % instances.len()].clone();
            let (key, loads) = (key.to_owned(), loads.clone());
            tokio::spawn(async move {
                let asked = Instant::now();
                let fetched = cache
                    .fetch(key, move || async move {
                        loads.hit();
                        tokio::time::sleep(load).await;
                        Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"the value")))
                    })
                    .await;
                (fetched, asked.elapsed())
            })
        })
        .collect();
    during.await;
    let mut seen = Seen {
        outcomes: HashMap::new(),
        errors: Vec::new(),
        slowest: Duration::ZERO,
        loads: 0,
    };
    for caller in callers {
        let (fetched, latency) = tokio::time::timeout(LIMIT, caller)
            .await
            .expect("every request is answered")
            .unwrap();
        seen.slowest = seen.slowest.max(latency);
        match fetched {
            Ok(fetched) if fetched.value().is_some_and(|v| v == "the value") => {
                *seen.outcomes.entry(fetched.outcome()).or_default() += 1;
            }
            Ok(fetched) => seen.errors.push(format!("wrong answer {fetched:?}")),
            Err(error) => seen.errors.push(error.to_string()),
        }
    }
    seen.loads = loads.get();
    eprintln!("{key}: {seen:?}");
    seen
}

/// A stampede of 300 calls on a cold `key` over `instances` (loads of 200 ms): every call is
/// answered, and the backend is loaded once across the instances.
async fn one_load_across(instances: &[Cache], key: &str) {
    let seen = stampede(instances, key, 300, Duration::from_millis(200), async {}).await;
    assert!(seen.errors.is_empty(), "{:?}", seen.errors);
    assert_eq!(seen.loads, 1, "one load across the instances: {seen:?}");
}

/// Calls every instance until each has the store back (its circuit breaker closed, and a
/// lookup answered by the store); each call may be the one that probes.
async fn until_protected(instances: &[Cache]) {
    let deadline = Instant::now() + LIMIT;
    let mut attempt = 0;
    for (n, cache) in instances.iter().enumerate() {
        loop {
            // A new key each time: a key answered from L1 would not ask the store.
            attempt += 1;
            let fetched = cache
                .fetch(format!("scratch-{attempt}"), || async {
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"scratch")))
                })
                .await
                .unwrap();
            let from_store = matches!(
                fetched.outcome(),
                Outcome::L2Hit | Outcome::Leader | Outcome::Follower
            );
            if cache.store_available() && from_store {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "instance {n} never got Redis back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_stampede_every_request_is_answered() {
    let mut server = RedisServer::start();
    let instances = instances(&server, 4).await;
    let seen = stampede(
        &instances,
        "killed",
        1000,
        Duration::from_millis(300),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.kill();
        },
    )
    .await;
    assert!(seen.errors.is_empty(), "errors: {:?}", seen.errors);
    assert!(
        seen.loads <= instances.len(),
        "{} loads for {} instances",
        seen.loads,
        instances.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_then_resumed_answers_throughout_and_protection_returns() {
    let server = RedisServer::start();
    let instances = instances(&server, 4).await;
    server.pause();

    // While Redis answers nothing, requests are answered by in-process protection: the first
    // store calls pay the store timeout (50 ms), then the breaker spares them even that.
    let seen = stampede(
        &instances,
        "paused",
        400,
        Duration::from_millis(100),
        async {},
    )
    .await;
    assert!(seen.errors.is_empty(), "errors: {:?}", seen.errors);
    assert!(seen.loads <= instances.len(), "{} loads", seen.loads);
    let before = instances[0].stats();
    for i in 0..20 {
        let value = instances[0]
            .get_or_load(format!("paused-{i}"), || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
            })
            .await
            .unwrap();
        assert_eq!(value, "v");
    }
    let after = instances[0].stats();
    assert!(after.breaker_opened >= 1, "{after:?}");
    assert_eq!(
        after.breaker_opened, 1,
        "the breaker stays open while Redis is paused: {after:?}"
    );
    assert!(
        after.store_calls_skipped - before.store_calls_skipped >= 15,
        "requests stopped paying the store timeout: {before:?} -> {after:?}"
    );
    assert!(!instances[0].store_available());

    server.resume();
    until_protected(&instances).await;
    let seen = stampede(
        &instances,
        "resumed",
        400,
        Duration::from_millis(100),
        async {},
    )
    .await;
    assert!(seen.errors.is_empty(), "errors: {:?}", seen.errors);
    assert_eq!(seen.loads, 1, "protection across processes is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_leaves_no_lock_behind() {
    let mut server = RedisServer::start();
    let instances = instances(&server, 4).await;
    let seen = stampede(
        &instances,
        "before",
        400,
        Duration::from_millis(50),
        async {},
    )
    .await;
    assert_eq!(seen.loads, 1);
    // A leader elsewhere holds a lock for a minute when Redis goes down.
    let held = instances[0].store_key("held");
    let lookup = instances[0]
        .store()
        .lookup(
            &held,
            LockToken::random(),
            Duration::from_secs(60),
            LockWhen::Always,
        )
        .await
        .unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);

    server.restart();
    until_protected(&instances).await;
    // Nobody waits for the lost lock: one load, at once.
    let seen = stampede(&instances, "held", 400, Duration::from_millis(50), async {}).await;
    assert!(seen.errors.is_empty(), "errors: {:?}", seen.errors);
    assert_eq!(seen.loads, 1, "back to one load");
    assert!(
        seen.slowest < Duration::from_secs(30),
        "nobody waited for the lost lock"
    );
}

/// The first stampede after Redis comes back is protected across processes, even when the
/// processes stayed idle past `open_for` (issue 15): once `open_for` has passed, the next store
/// call is a real trial (the flight that makes it keeps its answer), and a timer probes while
/// the breaker is open. Before, the probe only started when a request found the breaker open,
/// and that request (and its whole burst) skipped the store: one load per process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_stampede_after_redis_returns_is_one_load() {
    let mut server = RedisServer::start();
    let instances = instances(&server, 3).await;
    server.kill();
    // Enough failing calls to open every instance's breaker.
    for (n, cache) in instances.iter().enumerate() {
        let deadline = Instant::now() + LIMIT;
        let mut attempt = 0;
        while cache.store_available() {
            attempt += 1;
            let _ = cache
                .fetch(format!("down-{n}-{attempt}"), || async {
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"x")))
                })
                .await;
            assert!(Instant::now() < deadline, "the breaker never opened");
        }
    }
    server.restart();
    // Idle for longer than `open_for` (1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    one_load_across(&instances, "after").await;
}

/// How long the instances stay idle after Redis is back before the stampede: longer than the
/// store's reconnect backoff (at most 1 s between attempts, plus as much jitter), so a
/// reconnection that runs by itself has had its chance; an idle spell, not a wait for speed.
const IDLE_AFTER_RESTART: Duration = Duration::from_secs(3);

/// A blip of Redis with fewer failed calls than the circuit breaker's threshold (issue 29):
/// three instances, Redis killed, one request per instance while it is down (the breaker stays
/// closed, so its probe never runs), Redis restarted empty on the same port, the instances
/// idle; then a stampede must be one load across them. Before, the connection kept the failed
/// result of its one reconnect attempt and handed it to the next call, however much later:
/// each instance's first lookup failed, and the stampede cost one load per instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_with_fewer_failures_than_the_threshold_then_idle_is_one_load() {
    let mut server = RedisServer::start();
    let instances = instances(&server, 3).await;
    server.kill();
    for (n, cache) in instances.iter().enumerate() {
        let value = cache
            .get_or_load(format!("during-{n}"), || async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"x"))
            })
            .await
            .unwrap();
        assert_eq!(value, "x");
        assert!(cache.store_available(), "fewer failures than the threshold");
    }
    // The reconnect attempt that the failed call started gives up while Redis is down.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart();
    tokio::time::sleep(IDLE_AFTER_RESTART).await;
    one_load_across(&instances, "after-blip").await;
}

/// Redis killed and restarted empty while the instances are idle, with no call at all in
/// between (issue 29): the next stampede is one load across them. Before, each instance's
/// connection was still the one Redis had closed; the first lookup on it failed, and the
/// stampede cost one load per instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_while_idle_the_next_stampede_is_one_load() {
    let mut server = RedisServer::start();
    let instances = instances(&server, 3).await;
    one_load_across(&instances, "before-idle").await;
    server.restart();
    tokio::time::sleep(IDLE_AFTER_RESTART).await;
    one_load_across(&instances, "after-idle").await;
}

/// Calls made while Redis is dead, at most this many connection attempts (against one per
/// call, were each call to reconnect): the background reconnection's own attempts only.
const CALLS_WHILE_DEAD: usize = 200;
const ATTEMPTS_AT_MOST: usize = 20;

/// A dead Redis costs no call a connection attempt (issue 29, item 5): Redis is killed, and a
/// listener that stands in for it on its port accepts each connection and closes it at once,
/// counting them. With the circuit breaker off (so that every call reaches the store's
/// connection), 200 calls for distinct keys are each answered by their own load, and cause
/// no more connection attempts than the background reconnection makes meanwhile: calls fail
/// at once while one task reconnects. The listener is then seen to be reached (the
/// reconnection's attempts), so the count is not vacuous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_costs_no_call_a_connection_attempt() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let cache = Cache::builder(store)
        .namespace("faults")
        .circuit_breaker(0, Duration::from_secs(1))
        .build();
    let loads = Counter::default();
    let load = |loads: Counter| {
        move || async move {
            loads.hit();
            Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
        }
    };
    assert_eq!(
        cache
            .get_or_load("alive", load(loads.clone()))
            .await
            .unwrap(),
        "v"
    );
    server.kill();
    let deadline = Instant::now() + LIMIT;
    let listener = loop {
        match tokio::net::TcpListener::bind(("127.0.0.1", server.port())).await {
            Ok(listener) => break listener,
            Err(error) => assert!(Instant::now() < deadline, "port never free: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let attempts = Counter::default();
    let accepting = tokio::spawn({
        let attempts = attempts.clone();
        async move {
            while let Ok((socket, _)) = listener.accept().await {
                attempts.hit();
                drop(socket);
            }
        }
    });
    let before = attempts.get();
    for n in 0..CALLS_WHILE_DEAD {
        let value = cache
            .get_or_load(format!("dead-{n}"), load(loads.clone()))
            .await
            .unwrap();
        assert_eq!(value, "v");
    }
    let during = attempts.get() - before;
    assert_eq!(loads.get(), 1 + CALLS_WHILE_DEAD, "each call loaded");
    assert!(
        during <= ATTEMPTS_AT_MOST,
        "{during} connection attempts for {CALLS_WHILE_DEAD} calls"
    );
    support::wait_until("the reconnection reaches the stand-in", || {
        attempts.get() > 0
    })
    .await;
    accepting.abort();
}

/// An app can start while Redis is down (issue 29): `RedisStore::open` returns the store at
/// once, calls are answered with in-process protection meanwhile (one load per key per
/// instance), and once Redis is up, the stores connect by themselves: the health check turns
/// healthy and a stampede is one load across the instances. `connect` still fails fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opened_while_redis_is_down_connect_when_it_comes_up() {
    let mut server = RedisServer::start();
    server.kill();
    assert!(
        RedisStore::connect(server.url()).await.is_err(),
        "connect fails fast"
    );
    let instances: Vec<Cache> = (0..3)
        .map(|_| {
            let store = RedisStore::open(server.url()).unwrap();
            Cache::builder(store).namespace("opened").build()
        })
        .collect();
    let loads = Counter::default();
    for cache in &instances {
        for _ in 0..5 {
            let loads = loads.clone();
            let value = cache
                .get_or_load("while-down", move || async move {
                    loads.hit();
                    Ok::<_, std::io::Error>(Bytes::from_static(b"v"))
                })
                .await
                .unwrap();
            assert_eq!(value, "v");
        }
        assert!(!cache.health().await.is_healthy());
    }
    assert_eq!(loads.get(), 3, "one load per instance while Redis is down");

    server.restart();
    for (n, cache) in instances.iter().enumerate() {
        let deadline = Instant::now() + LIMIT;
        while !cache.health().await.is_healthy() {
            assert!(Instant::now() < deadline, "instance {n} never connected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    one_load_across(&instances, "opened").await;
}

/// What no server can fix fails `open` at once: a malformed URL, TLS without the `tls`
/// feature, a cluster seed that is not a URL.
#[tokio::test(start_paused = true)]
async fn open_refuses_bad_configuration_at_once() {
    use tower_stampede::store::StoreErrorKind;
    let kind = |url: &str| RedisStore::open(url).map(|_| ()).unwrap_err().kind();
    assert_eq!(kind("not a url"), StoreErrorKind::Configuration);
    assert_eq!(
        kind("redis://127.0.0.1:notaport/"),
        StoreErrorKind::Configuration
    );
    #[cfg(not(feature = "tls"))]
    assert_eq!(
        kind("rediss://127.0.0.1:6379/"),
        StoreErrorKind::Configuration
    );
    #[cfg(feature = "cluster")]
    assert_eq!(
        RedisStore::cluster_builder(["redis://127.0.0.1:7000/", "not a url"])
            .open()
            .map(|_| ())
            .unwrap_err()
            .kind(),
        StoreErrorKind::Configuration
    );
}

/// Without a tokio runtime, `open` cannot connect in the background: an error, not a panic.
#[test]
fn open_without_a_runtime_is_an_error() {
    let error = RedisStore::open("redis://127.0.0.1:6379/")
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        error.kind(),
        tower_stampede::store::StoreErrorKind::Configuration
    );
}
