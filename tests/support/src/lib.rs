//! What the tests and benches of tower-stampede share: a counting backend, the stores a test
//! runs over ([`Shared`]: the embedded `MemoryStore`, and a real `redis-server` with the
//! `redis` feature), and a leader caught in the middle of its load. The Redis processes
//! themselves (servers, clusters, TLS files, free ports) are in [`redis`](self::redis).
//!
//! | file | holds |
//! | --- | --- |
//! | `lib.rs` | [`Shared`] stores, [`Counter`], [`Logs`], [`report`], the test macros, waiting helpers |
//! | `fault_proxy.rs` | a TCP proxy between a store and its server that delays, partitions, resets or stalls replies |
//! | `path_proxies.rs` | a process's fault proxies, one per node, made as its store's resolver meets them (feature `redis`) |
//! | `http.rs` | requests sent through an app in process, answers read to the end |
//! | `observed.rs` | a store wrapper that counts, slows, fails or stalls its calls |
//! | `redis.rs` | `redis-server` processes on free ports (feature `redis`) |
//! | `relay.rs` | a loopback TCP relay whose subscribers' connections can fall silent |
//! | `redis/cluster.rs` | a three-master Redis Cluster |
//! | `redis/sentinel/` | a primary and two replicas under three Redis Sentinels, with TLS if asked |
//! | `redis/tls.rs` | a throwaway certificate authority for TLS |
//!
//! A workspace member of its own (`publish = false`), so that the tests and the benches reach it
//! as a dev-dependency (named `support`); its `redis` feature follows the crate's.
#![forbid(unsafe_code)]

pub mod fault_proxy;
pub mod http;
pub mod observed;
#[cfg(feature = "redis")]
pub mod path_proxies;
pub mod relay;

/// The store timeout of the tests' caches ([`Shared::cache`]): far beyond a busy machine's
/// round trip, far below anything a test waits for.
pub const PATIENT: Duration = Duration::from_secs(2);
#[cfg(feature = "redis")]
mod redis;

/// `timed_test!(name)` runs `async fn name(stores: Vec<Shared>)`, a test that depends on
/// timing, twice: as `name::memory` over `MemoryStore` on paused tokio time, which the store's
/// expiries, L1's expiry and the engine's timers and wall clock follow, so the run is instant
/// and its timing exact; and, with the `redis` feature, as `name::redis` over a real
/// `redis-server` on real time.
///
/// The `redis` half is compiled where the calling test is built with the `redis` feature.
#[macro_export]
macro_rules! timed_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test(start_paused = true)]
            async fn memory() {
                super::$name(vec![$crate::Shared::memory()]).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name(vec![$crate::Shared::redis().await]).await;
            }
        }
    };
}

/// `store_test!(name)` runs `async fn name(shared: Shared)`, a test of one behaviour, once per
/// store: as `name::memory` over `MemoryStore` and, with the `redis` feature, as `name::redis`
/// over a real `redis-server` of its own, each a test of its own, so that a failure names its
/// store.
///
/// The `memory` case runs on paused tokio time, on one thread (all paused time allows): the
/// store's expiries, L1's expiry, the engine's timers and its wall clock follow it, and while
/// every task waits the runtime jumps to the next timer, so a sleep costs no real time and a
/// timing rule holds exactly, run after run. The `redis` case runs on real time on two
/// threads: Redis keeps its own clock, and a paused runtime waiting on a socket would jump to
/// its next timer and fire store timeouts.
///
/// `store_test!(name, real_time = "why")` runs the `memory` case on real time on two threads
/// too, for a test that needs it (real sockets, a thread held or of its own, a blocking task);
/// the reason is its attribute, so that it stays with the test (`#[doc]` on the case).
///
/// `store_test!(name, current_thread)` runs the `redis` case on one thread as well
/// (`#[tokio::test]`), for a test written for one thread.
///
/// `store_test!(name, block_on)` runs `fn name(runtime: &Runtime, shared: Shared)`, a plain
/// `#[test]` given a one-thread runtime of its own (the store made on it; paused for the
/// `memory` case), for a test that wraps its own `runtime.block_on` calls in something of its
/// thread: a thread-local metrics recorder, which then sees every task of the run.
///
/// `store_test!(name, ignore = "why")` runs both cases on real time on two threads, `#[ignore]`d
/// with that reason: a load run, started by hand with `-- --ignored`, that times itself.
#[macro_export]
macro_rules! store_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test(start_paused = true)]
            async fn memory() {
                super::$name($crate::Shared::memory()).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name($crate::Shared::redis().await).await;
            }
        }
    };
    ($name:ident, real_time = $why:literal) => {
        mod $name {
            #[doc = concat!("On real time: ", $why)]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$name($crate::Shared::memory()).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name($crate::Shared::redis().await).await;
            }
        }
    };
    ($name:ident, current_thread) => {
        mod $name {
            #[tokio::test(start_paused = true)]
            async fn memory() {
                super::$name($crate::Shared::memory()).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test]
            async fn redis() {
                super::$name($crate::Shared::redis().await).await;
            }
        }
    };
    ($name:ident, ignore = $why:literal) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn memory() {
                super::$name($crate::Shared::memory()).await;
            }

            #[cfg(feature = "redis")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = $why]
            async fn redis() {
                super::$name($crate::Shared::redis().await).await;
            }
        }
    };
    ($name:ident, block_on) => {
        mod $name {
            #[test]
            fn memory() {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .start_paused(true)
                    .build()
                    .unwrap();
                let shared = runtime.block_on(async { $crate::Shared::memory() });
                super::$name(&runtime, shared);
            }

            #[cfg(feature = "redis")]
            #[test]
            fn redis() {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let shared = runtime.block_on($crate::Shared::redis());
                super::$name(&runtime, shared);
            }
        }
    };
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tower_stampede::store::{MemoryStore, Store};
use tower_stampede::{Cache, CacheBuilder};

#[cfg(feature = "redis")]
pub use self::redis::{
    app_clients, calls, client_list, free_port, is_valkey, node_role, query_node, server_name,
    RedisCluster, RedisSentinel, RedisServer, TlsFiles, SERVER_VARIABLE,
};

/// Collects what a `tracing` subscriber writes (its writer is a clone), as text.
#[derive(Clone, Default)]
pub struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Sends what this thread traces, at debug level and with each span's fields when it
    /// closes, here, until the guard is dropped.
    pub fn capture(&self) -> tracing::subscriber::DefaultGuard {
        every_subscriber_asked();
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Like [`capture`](Self::capture), as a default `fmt` subscriber would write: `INFO` and
    /// above, spans shown only as the context of the events inside them.
    pub fn capture_default(&self) -> tracing::subscriber::DefaultGuard {
        every_subscriber_asked();
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Makes every callsite ask each subscriber whether it is wanted.
fn every_subscriber_asked() {
    // While exactly one subscriber exists, tracing-core decides a callsite's interest, at
    // its first use, from the subscriber of the thread that uses it alone: a callsite
    // first reached by another test's thread, which has none, would be cached as "never",
    // and this thread's subscriber would miss it (one run in seven of a test here). A
    // second subscriber, kept for the life of the test binary, makes every registration
    // ask all of them.
    static SECOND: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
    });
    std::sync::LazyLock::force(&SECOND);
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts calls to a backend.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A signal for [`signal`]: `Signal::STOP` freezes a process (it keeps its sockets open and
/// answers nothing, as a host cut off by a partition does), `Signal::CONT` thaws it.
pub use rustix::process::Signal;

/// Sends `signal` to the process `pid` (a child the test started).
pub fn signal(pid: u32, signal: Signal) {
    let raw = i32::try_from(pid).expect("a process id");
    let process = rustix::process::Pid::from_raw(raw).expect("a process id is not 0");
    rustix::process::kill_process(process, signal)
        .unwrap_or_else(|e| panic!("cannot send {signal:?} to process {pid}: {e}"));
}

/// An error and every cause after it, as a report prints them (`anyhow`'s `{:#}`):
/// `message: cause: its cause`.
pub fn report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        shown.push_str(": ");
        shown.push_str(&next.to_string());
        cause = next.source();
    }
    shown
}

/// Waits until `done` holds, looking every 5 ms; panics, saying `what`, after 30 s (a bound for
/// a busy machine, not an assertion on time).
pub async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still waiting after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asks `cache` for its health every 50 ms until `done` holds; how long that took. Panics,
/// saying `what` and the last health, after 30 s (a bound for a busy machine).
pub async fn until_health(
    cache: &tower_stampede::Cache,
    what: &str,
    done: impl Fn(&tower_stampede::Health) -> bool,
) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        let health = cache.health().await;
        if done(&health) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: still {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store shared by the app instances of one test, and what keeps its data.
pub struct Shared {
    /// `"memory"` or `"redis"`, for assertion messages.
    pub name: &'static str,
    pub store: Arc<dyn Store>,
    pub backing: Backing,
}

/// Where a [`Shared`] store keeps its data, to look behind the engine's back.
pub enum Backing {
    /// The embedded store: another handle on the maps of [`Shared::store`].
    Memory(MemoryStore),
    /// A `redis-server` of the test's own, killed with the `Shared`.
    #[cfg(feature = "redis")]
    Redis(RedisServer),
}

impl Shared {
    /// The embedded store.
    pub fn memory() -> Self {
        let memory = MemoryStore::new();
        Shared {
            name: "memory",
            store: Arc::new(memory.clone()),
            backing: Backing::Memory(memory),
        }
    }

    /// A store on a fresh `redis-server`.
    #[cfg(feature = "redis")]
    pub async fn redis() -> Self {
        let server = RedisServer::start();
        let store = tower_stampede::store::RedisStore::connect(server.url())
            .await
            .unwrap();
        Shared {
            name: "redis",
            store: Arc::new(store),
            backing: Backing::Redis(server),
        }
    }

    /// Every store this build can test: the embedded one, and with the `redis` feature one on
    /// a fresh `redis-server`. Every engine and HTTP rule is tested on each.
    pub async fn both() -> Vec<Self> {
        vec![
            Self::memory(),
            #[cfg(feature = "redis")]
            Self::redis().await,
        ]
    }

    /// A cache of its own (so its own L1) over the shared store, to configure and build.
    ///
    /// Its store calls may take [`PATIENT`]: the suite runs tests side by side on two cores,
    /// and a call that waited longer than the default 250 ms for a CPU would count as a store
    /// error and load with in-process protection only, so a test counting one load per
    /// stampede would see one per process. Tests of slow stores set their own timeout.
    pub fn cache(&self) -> CacheBuilder {
        Cache::builder_shared(Arc::clone(&self.store))
            .namespace("test")
            .store_timeout(PATIENT)
    }

    /// Another process's view of the same store: for Redis a store with connections of its
    /// own (its own subscriber), for memory the same store.
    pub async fn other_process(&self) -> Arc<dyn Store> {
        match &self.backing {
            Backing::Memory(_) => Arc::clone(&self.store),
            #[cfg(feature = "redis")]
            Backing::Redis(server) => server.stores(1).await.remove(0),
        }
    }

    /// The Redis server behind the store; panics for the embedded store.
    #[cfg(feature = "redis")]
    pub fn server(&self) -> &RedisServer {
        match &self.backing {
            Backing::Redis(server) => server,
            Backing::Memory(_) => panic!("{}: not a Redis-backed store", self.name),
        }
    }

    /// The Redis server behind the store, to kill or restart; panics for the embedded store.
    #[cfg(feature = "redis")]
    pub fn server_mut(&mut self) -> &mut RedisServer {
        match &mut self.backing {
            Backing::Redis(server) => server,
            Backing::Memory(_) => panic!("{}: not a Redis-backed store", self.name),
        }
    }

    /// A section of the Redis server's `INFO` (`stats`, `commandstats`); `None` for the
    /// embedded store.
    pub async fn info(&self, section: &str) -> Option<String> {
        #[cfg(feature = "redis")]
        if let Backing::Redis(_) = self.backing {
            let mut connection = self.connection().await;
            let info: String = ::redis::cmd("INFO")
                .arg(section)
                .query_async(&mut connection)
                .await
                .unwrap();
            return Some(info);
        }
        let _ = section;
        None
    }

    /// Resets the Redis server's statistics (`CONFIG RESETSTAT`), as [`info`](Self::info)
    /// reads them; nothing for the embedded store.
    pub async fn reset_stats(&self) {
        #[cfg(feature = "redis")]
        if let Backing::Redis(_) = self.backing {
            let mut connection = self.connection().await;
            let () = ::redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    }

    /// A plain connection to the Redis server, to look behind the engine's back.
    #[cfg(feature = "redis")]
    pub async fn connection(&self) -> ::redis::aio::MultiplexedConnection {
        self.server()
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

/// Starts a leader whose load takes 300 ms; returns once the load has begun.
pub async fn start_leader(
    cache: &Cache,
    key: &str,
    loads: &Counter,
    value: &'static str,
) -> tokio::task::JoinHandle<Result<Bytes, tower_stampede::Error>> {
    let started = Arc::new(Notify::new());
    let leader = tokio::spawn({
        let (cache, key, loads, started) = (
            cache.clone(),
            key.to_owned(),
            loads.clone(),
            started.clone(),
        );
        async move {
            cache
                .get_or_load(key, move || async move {
                    loads.hit();
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(value.as_bytes()))
                })
                .await
        }
    });
    started.notified().await;
    leader
}

/// 200 callers of `key` over `instances` (in turn), each load taking 100 ms and counted in
/// its instance's `loads` (and notifying `started`). Returns once every caller has its answer;
/// panics if one got an error or a wrong value.
pub async fn stampede_of_200(
    instances: &[Cache],
    key: &str,
    loads: &[Counter],
    started: &Arc<Notify>,
) {
    let mut callers = Vec::new();
    for i in 0..200 {
        let instance = i % instances.len();
        let (cache, key) = (instances[instance].clone(), key.to_owned());
        let (loads, started) = (loads[instance].clone(), Arc::clone(started));
        callers.push(tokio::spawn(async move {
            let value = format!("value of {key}");
            let answer = cache
                .get_or_load(&key, move || async move {
                    loads.hit();
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Bytes::from(value))
                })
                .await;
            (key, answer)
        }));
    }
    for caller in callers {
        let (key, answer) = caller.await.unwrap();
        let value = answer.unwrap_or_else(|e| panic!("{key}: an error reached a caller: {e}"));
        assert_eq!(value, format!("value of {key}").as_str());
    }
}

/// A stampede of `callers` fetches of `key` spread over `instances`, where the stored value
/// (`stale`) may be served stale: each caller gets it at once (`Outcome::Stale`) and one
/// refresh starts, held until the returned notify is notified (it then loads `fresh`).
/// Returns that notify and the count of loads, once every caller has its answer and exactly
/// one load has begun.
pub async fn stale_while_one_refreshes(
    name: &str,
    instances: &[Cache],
    key: &'static str,
    callers: usize,
    stale: &str,
    fresh: &'static str,
) -> (Arc<Notify>, Counter) {
    let loads = Counter::default();
    let release = Arc::new(Notify::new());
    let fetches: Vec<_> = (0..callers)
        .map(|i| {
            let (cache, loads, release) = (
                instances[i % instances.len()].clone(),
                loads.clone(),
                release.clone(),
            );
            tokio::spawn(async move {
                cache
                    .fetch(key, move || async move {
                        loads.hit();
                        // The refresh takes as long as the test wants: nobody may wait for it.
                        release.notified().await;
                        Ok::<_, std::io::Error>(tower_stampede::Loaded::value(Bytes::from_static(
                            fresh.as_bytes(),
                        )))
                    })
                    .await
            })
        })
        .collect();
    for fetch in fetches {
        let fetched = fetch.await.unwrap().unwrap();
        assert_eq!(
            (fetched.value().unwrap().as_ref(), fetched.outcome()),
            (stale.as_bytes(), tower_stampede::Outcome::Stale),
            "{name}"
        );
    }
    // The refresh runs in the background: a caller answered stale may return before its
    // loader is first polled.
    wait_until(&format!("{name}: the refresh"), || loads.get() >= 1).await;
    assert_eq!(loads.get(), 1, "{name}: one refresh");
    (release, loads)
}
