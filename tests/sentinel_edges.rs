//! Redis Sentinel at its edges (feature `sentinel`): hosts cut off (a process stopped: no
//! answer, no reset), every sentinel gone, settings that cannot work, and sentinels that
//! answer garbage or hang up. `sentinel.rs` holds the failovers themselves.
//!
//! Most tests start a real topology ([`RedisSentinel`]: a primary, two replicas, three
//! sentinels). A few need no server at all (bad input). One module, `fake`, holds a tiny TCP
//! listener that speaks just enough RESP to answer like a broken sentinel: it is NOT a
//! stand-in for Redis, only a source of garbage answers and a counter of connection attempts.
#![cfg(feature = "sentinel")]

use std::time::Duration;

use bytes::Bytes;
use support::{app_clients, node_role as role, query_node as query, RedisSentinel, Signal};
use tokio::time::Instant;
use tower_stampede::store::{RedisStore, RedisStoreBuilder, StoreErrorKind};
use tower_stampede::Cache;

/// The failure guard on anything that waits (as in `tests/sentinel.rs`).
const LIMIT: Duration = Duration::from_secs(30);

fn builder(topology: &RedisSentinel) -> RedisStoreBuilder {
    RedisStore::sentinel_builder(topology.sentinel_urls(), topology.service())
}

fn cache(store: RedisStore) -> Cache {
    Cache::builder(store)
        .namespace("edges")
        .store_timeout(support::PATIENT)
        .build()
}

/// The process id of the server or sentinel on `port` (`INFO server`).
fn pid_of(port: u16) -> u32 {
    let info: String = query(port, redis::cmd("INFO").arg("server")).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("process_id in INFO server")
}

/// The port of the primary the sentinel on `sentinel` names, if it answers.
fn named_by(sentinel: u16, service: &str) -> Option<u16> {
    let mut command = redis::cmd("SENTINEL");
    command.arg("GET-MASTER-ADDR-BY-NAME").arg(service);
    let address: Vec<String> = query(sentinel, &command).ok()?;
    address.get(1)?.parse().ok()
}

/// Waits (blocking, bounded by `limit`) until the sentinel on `sentinel` names a primary other
/// than `old` that says `ROLE` master.
fn wait_named_other_than(sentinel: u16, service: &str, old: u16, limit: Duration) -> Option<u16> {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if let Some(port) = named_by(sentinel, service) {
            if port != old && role(port).as_deref() == Some("master") {
                return Some(port);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Whether the data node on `port` holds `key` (read behind the store's back).
async fn holds(port: u16, key: &str) -> bool {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<bool>(&mut connection)
        .await
        .unwrap_or(false)
}

/// Writes through `cache` until a write lands on the data node on `port`; whether one did
/// within `limit`.
async fn writes_reach(cache: &Cache, port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    for attempt in 0.. {
        let key = format!("moved-{attempt}");
        let set = cache
            .set(
                key.as_str(),
                Bytes::from_static(b"x"),
                Duration::from_secs(60),
            )
            .await;
        let value = RedisStore::value_name(&cache.store_key(&key));
        if set.is_ok() && holds(port, &value).await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The primary's host cut off (its process stopped: no answer, no reset), while the other
/// sentinels promote a replica: the store's calls to the silent primary time out, which
/// takes no link down (a timeout is not an unrecoverable error), so only the `+switch-master`
/// listener can move the store. With the listener on a sentinel that answers, it does: the
/// control for the test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_primary_is_left_once_the_sentinels_promote_a_replica() {
    silent_primary(false).await;
}

/// The same, but the sentinel the store listens to (the first URL: every store listens there
/// first) is cut off with the primary, as when a sentinel runs on the primary's host, the
/// usual layout. A subscribed connection asks nothing, so only the listener's `PING` finds
/// the sentinel silent; the next sentinel is then listened to, and asked where the primary
/// is (the lookups starting past the silent one, which would hold up every lookup that asks
/// it first). Without that, the data link stayed on the silent primary for good (a timeout
/// takes no link down): every process loaded on its own until the old host came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_primary_is_left_even_when_the_listened_sentinel_is_silent_too() {
    silent_primary(true).await;
}

async fn silent_primary(listened_sentinel_too: bool) {
    let topology = RedisSentinel::start();
    let caches: Vec<Cache> = {
        let mut caches = Vec::new();
        for _ in 0..2 {
            caches.push(cache(builder(&topology).connect().await.unwrap()));
        }
        caches
    };
    let sentinels = topology.sentinel_ports();
    // Every store listens on the first sentinel.
    let listening = || async { app_clients(sentinels[0], &["TYPE", "pubsub"]).await };
    let deadline = Instant::now() + LIMIT;
    while listening().await < caches.len() {
        assert!(Instant::now() < deadline, "the stores never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old = topology.primary_port();
    assert!(writes_reach(&caches[0], old, LIMIT).await);

    let mut stopped = vec![pid_of(old)];
    if listened_sentinel_too {
        stopped.push(pid_of(sentinels[0]));
    }
    for pid in &stopped {
        support::signal(*pid, Signal::STOP);
    }
    let service = topology.service().to_owned();
    let witness = sentinels[1];
    let new =
        tokio::task::spawn_blocking(move || wait_named_other_than(witness, &service, old, LIMIT))
            .await
            .unwrap()
            .expect("the other sentinels promoted no replica");
    eprintln!("port {old} stopped, port {new} promoted");

    let mut moved = Vec::new();
    for cache in &caches {
        moved.push(writes_reach(cache, new, LIMIT).await);
    }
    for pid in &stopped {
        support::signal(*pid, Signal::CONT);
    }
    assert!(
        moved.iter().all(|m| *m),
        "stores whose writes reached the promoted primary {new}: {moved:?}"
    );
    drop(topology);
}

/// A database in the sentinels' URLs (`redis://host:26379/2`, which a user may write meaning
/// the data nodes' database) is refused as a configuration error, or works. A sentinel
/// refuses `SELECT`: a `+switch-master` listener made of such a URL never subscribed, and the
/// store, connected, never heard a failover announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_in_the_sentinel_urls_is_refused_or_harmless() {
    let topology = RedisSentinel::start();
    let sentinels = topology.sentinel_ports();
    let listeners = || async {
        let mut count = 0;
        for port in &sentinels {
            count += app_clients(*port, &["TYPE", "pubsub"]).await;
        }
        count
    };
    // The control: the same URLs without the database listen within the bound.
    let control = builder(&topology).connect().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while listeners().await == 0 {
        assert!(Instant::now() < deadline, "the control never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(control);
    let deadline = Instant::now() + LIMIT;
    while listeners().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the control's listener outlived it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let urls: Vec<String> = topology
        .sentinel_urls()
        .iter()
        .map(|url| format!("{url}/2"))
        .collect();
    let store = match RedisStore::sentinel_builder(urls, topology.service())
        .connect()
        .await
    {
        Err(error) => {
            assert_eq!(error.kind(), StoreErrorKind::Configuration, "{error}");
            return;
        }
        Ok(store) => store,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if listeners().await > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store connected, but no +switch-master listener ever subscribed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(store);
}

/// Sentinels all gone (stopped) while the primary stays up: the store keeps working on its
/// connection; once that connection drops, it does not go back to the last primary it knew
/// (on purpose, see `docs/operations.md`: an empty restarted master must never be used), so
/// it stays down, failing calls at once, until a sentinel answers again; then it is back.
/// The documented behaviour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_gone_keep_the_connection_but_do_not_reconnect_without_them() {
    let topology = RedisSentinel::start();
    let store = builder(&topology).connect().await.unwrap();
    let cache = cache(store);
    let primary = topology.primary_port();
    assert!(writes_reach(&cache, primary, LIMIT).await);

    let sentinels: Vec<u32> = topology.sentinel_ports().into_iter().map(pid_of).collect();
    for pid in &sentinels {
        support::signal(*pid, Signal::STOP);
    }
    assert!(
        writes_reach(&cache, primary, Duration::from_secs(5)).await,
        "the store stopped working when the sentinels went silent"
    );

    // The store's connections to the primary dropped (the test's own is skipped).
    let mut kill = redis::cmd("CLIENT");
    kill.arg(&["KILL", "TYPE", "normal"][..]);
    let _: redis::Value = query(primary, &kill).unwrap();
    let mut kill_pubsub = redis::cmd("CLIENT");
    kill_pubsub.arg(&["KILL", "TYPE", "pubsub"][..]);
    let _: redis::Value = query(primary, &kill_pubsub).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let health = cache.health().await;
    assert!(
        !health.store_answers(),
        "reconnected without a sentinel: {health:?}"
    );

    for pid in &sentinels {
        support::signal(*pid, Signal::CONT);
    }
    assert!(
        writes_reach(&cache, primary, LIMIT).await,
        "never back once the sentinels answered"
    );
    drop(topology);
}

/// Nothing leaks from a wrong primary password: neither the error's `Display` nor its
/// `Debug` (which an application may log with `{:?}`) holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_primary_password_is_not_in_the_error() {
    let acl = ["--user", "app", "on", ">s3cret", "~*", "&*", "+@all"];
    let topology = RedisSentinel::start_with(&acl);
    let urls: Vec<String> = topology
        .sentinel_urls()
        .iter()
        .map(|url| url.replace("redis://", "redis://:sentinel-pw-xyz@"))
        .collect();
    // The sentinels have no password: the URL's is refused by them, and the lookup fails.
    let error = RedisStore::sentinel_builder(urls, topology.service())
        .primary_credentials(Some("app"), "primary-pw-abc")
        .connect()
        .await
        .expect_err("the sentinels refuse the password");
    let text = format!("{error} / {error:?}");
    assert!(!text.contains("sentinel-pw-xyz"), "{text}");
    assert!(!text.contains("primary-pw-abc"), "{text}");

    let error = builder(&topology)
        .primary_credentials(Some("app"), "primary-pw-abc")
        .connect()
        .await
        .expect_err("a wrong primary password");
    let text = format!("{error} / {error:?}");
    eprintln!("{text}");
    assert!(!text.contains("primary-pw-abc"), "{text}");
}

/// Bad input, without any server: no URL, an unresolvable host, port 0, a closed port, an
/// empty service name. `connect` fails (bounded, no panic), `open` gives a store that fails
/// its calls at once, and `primary_*` settings on another target are refused clearly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_input_fails_cleanly() {
    let none: Vec<String> = Vec::new();
    let error = RedisStore::sentinel_builder(none, "mymaster")
        .open()
        .expect_err("no sentinel");
    assert_eq!(error.kind(), StoreErrorKind::Configuration, "{error}");

    let cases: [(&[&str], &str); 4] = [
        (&["redis://no-such-host.invalid:26379/"], "mymaster"),
        (&["redis://127.0.0.1:0/"], "mymaster"),
        (
            &["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"],
            "mymaster",
        ),
        (&["redis://127.0.0.1:1/"], ""),
    ];
    for (urls, service) in cases {
        let urls: Vec<String> = urls.iter().map(|u| (*u).to_owned()).collect();
        let started = Instant::now();
        let connect = RedisStore::sentinel_builder(urls.clone(), service)
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect()
            .await;
        assert!(connect.is_err(), "{urls:?} connected");
        assert!(started.elapsed() < Duration::from_secs(10), "{urls:?} hung");
        let store = RedisStore::sentinel_builder(urls, service).open().unwrap();
        let cache = cache(store);
        let read = cache
            .get_or_load("k", || async { Ok::<_, std::io::Error>(Bytes::from("v")) })
            .await
            .unwrap();
        assert_eq!(read, "v");
    }

    let error = RedisStore::builder("redis://127.0.0.1:1/")
        .primary_db(3)
        .connect()
        .await
        .expect_err("primary_db on one server");
    assert_eq!(error.kind(), StoreErrorKind::Configuration);
    assert!(error.to_string().contains("sentinel_builder"), "{error}");
}

/// The sentinels' URLs share one scheme (`RedisStore::sentinel_builder`'s docs: "each with
/// the same credentials and scheme"), in either order: `redis://` first and `rediss://` after
/// would talk TLS to some sentinels, plain to the others, and plain to the data nodes.
#[cfg(feature = "tls")]
// Nothing waits: the build is refused.
#[tokio::test(start_paused = true)]
async fn sentinel_urls_of_mixed_schemes_are_refused() {
    for urls in [
        ["rediss://127.0.0.1:1/", "redis://127.0.0.1:2/"],
        ["redis://127.0.0.1:1/", "rediss://127.0.0.1:2/"],
    ] {
        let error = RedisStore::sentinel_builder(urls, "mymaster")
            .open()
            .expect_err("mixed schemes");
        assert_eq!(
            error.kind(),
            StoreErrorKind::Configuration,
            "{urls:?}: {error}"
        );
    }
}

/// Plain sentinels with TLS root certificates (meant for TLS data nodes) is refused at build,
/// saying why: there is no way to ask for plain sentinels and TLS data nodes, and it is not
/// silently half-applied.
#[cfg(feature = "tls")]
// Nothing waits: the build is refused.
#[tokio::test(start_paused = true)]
async fn plain_sentinels_with_tls_roots_are_refused() {
    let error = RedisStore::sentinel_builder(["redis://127.0.0.1:1/"], "mymaster")
        .tls_root_certificates(b"not used".to_vec())
        .open()
        .expect_err("plain sentinel URL with TLS roots");
    assert_eq!(error.kind(), StoreErrorKind::Configuration);
    assert!(error.to_string().contains("rediss://"), "{error}");
}

/// A tiny RESP speaker for input hardening only (see the file's docs): NOT a Redis.
mod fake {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Listens on a free loopback port; each connection is answered by `answer`, given the
    /// command's words (uppercased name first), until it closes. Returns the port and the
    /// count of connections accepted.
    pub async fn listen(
        answer: impl Fn(&[String]) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(answer);
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let answer = Arc::clone(&answer);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some((words, used)) = parse(&buffer) {
                            buffer.drain(..used);
                            match answer(&words) {
                                Some(reply) => {
                                    if socket.write_all(&reply).await.is_err() {
                                        return;
                                    }
                                }
                                None => return,
                            }
                        }
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    /// One RESP array of bulk strings from the start of `buffer`: its words and length.
    fn parse(buffer: &[u8]) -> Option<(Vec<String>, usize)> {
        let text = std::str::from_utf8(buffer).ok()?;
        let (head, mut rest) = text.split_once("\r\n")?;
        let count: usize = head.strip_prefix('*')?.parse().ok()?;
        let mut words = Vec::new();
        for _ in 0..count {
            let (len, after) = rest.split_once("\r\n")?;
            let len: usize = len.strip_prefix('$')?.parse().ok()?;
            if after.len() < len + 2 {
                return None;
            }
            words.push(after[..len].to_owned());
            rest = &after[len + 2..];
        }
        if let Some(first) = words.first_mut() {
            *first = first.to_uppercase();
        }
        Some((words, text.len() - rest.len()))
    }

    pub fn bulk(items: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", items.len());
        for item in items {
            out += &format!("${}\r\n{item}\r\n", item.len());
        }
        out.into_bytes()
    }
}

/// A "sentinel" that says it is one (`ROLE`), then answers `SENTINEL MASTERS` with garbage of
/// several kinds, or names a master that is not one (itself, whose `ROLE` says sentinel), or
/// is at port 0, or at a host that does not resolve: `connect` fails with an error, never a
/// panic, and `open` serves with in-process protection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_answering_garbage_is_an_error_not_a_panic() {
    let masters = |fields: &[&str]| {
        let mut out = b"*1\r\n".to_vec();
        out.extend(fake::bulk(fields));
        out
    };
    // A master of the service, as a sentinel names one, at `ip` and `port`.
    let master_at = |ip: &str, port: &str| {
        masters(&[
            "name", "mymaster", "ip", ip, "port", port, "flags", "master",
        ])
    };
    let answers: Vec<Vec<u8>> = vec![
        b"+OK\r\n".to_vec(),
        b":42\r\n".to_vec(),
        b"*1\r\n$3\r\nodd\r\n".to_vec(),
        b"-ERR no\r\n".to_vec(),
        b"*0\r\n".to_vec(),
        masters(&["name", "mymaster", "ip"]),
        master_at("127.0.0.1", "99999"),
        master_at("127.0.0.1", "0"),
        master_at("no-such-host.invalid", "6379"),
        master_at("", "6379"),
        b"$-1\r\n".to_vec(),
        b"garbage\r\n".to_vec(),
    ];
    for (n, garbage) in answers.into_iter().enumerate() {
        let (port, _) = fake::listen(move |words| {
            let reply = match words.first().map(String::as_str) {
                Some("ROLE") => {
                    let mut out = b"*2\r\n$8\r\nsentinel\r\n".to_vec();
                    out.extend(fake::bulk(&["mymaster"]));
                    out
                }
                Some("SENTINEL") => garbage.clone(),
                _ => b"+OK\r\n".to_vec(),
            };
            Some(reply)
        })
        .await;
        let urls = [format!("redis://127.0.0.1:{port}/")];
        let connect = RedisStore::sentinel_builder(urls.clone(), "mymaster")
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect()
            .await;
        assert!(connect.is_err(), "case {n} connected");
        let store = RedisStore::sentinel_builder(urls, "mymaster")
            .open()
            .unwrap();
        let read = cache(store)
            .get_or_load("k", || async { Ok::<_, std::io::Error>(Bytes::from("v")) })
            .await
            .unwrap();
        assert_eq!(read, "v", "case {n}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// No reconnect storm: a sentinel that accepts and hangs up at once (as one out of
/// connections does) costs an opened store a few attempts a second (its keeper and its
/// listener each pause 250 ms), not a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_sentinel_is_not_hammered() {
    let (port, accepted) = fake::listen(|_| None).await;
    let store = RedisStore::sentinel_builder([format!("redis://127.0.0.1:{port}/")], "mymaster")
        .open()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let count = accepted.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("{count} connections in 3 s");
    assert!(count < 100, "{count} connections in 3 s");
    drop(store);
}
