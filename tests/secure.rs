//! Secure connections against real servers: an ACL user and password in the URL, and TLS
//! (feature `tls`) with a throwaway certificate authority; no password ever shows.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use support::{Counter, Logs, RedisServer};
use tokio::sync::Notify;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Loaded, Outcome};

const PASSWORD: &str = "s3cret-pw";

/// `alice` may do anything with her password; the `default` user is off, so a connection
/// without credentials may do nothing.
const ACL: [&str; 10] = [
    "--user",
    "default",
    "off",
    "--user",
    "alice",
    "on",
    ">s3cret-pw",
    "~*",
    "&*",
    "+@all",
];

fn alice_url(scheme: &str, port: u16) -> String {
    format!("{scheme}://alice:{PASSWORD}@127.0.0.1:{port}/")
}

async fn never_called() -> Result<Loaded, std::io::Error> {
    panic!("this loader must not run")
}

/// Two instances, the follower deaf to polls: one load, and the follower answered by the fill's
/// notification, which only an authenticated (and, for TLS, verified) subscriber can receive.
async fn one_load_and_a_notified_follower(leader: RedisStore, follower: RedisStore) {
    // A TLS handshake on a loaded machine can outlast the default 50 ms store timeout, which
    // would make a call degrade (and run the loader that must not run): what is tested here
    // is who may connect, not how fast.
    let patient = Duration::from_secs(5);
    let leader = Cache::builder(leader)
        .namespace("secure")
        .store_timeout(patient)
        .build();
    let follower = Cache::builder(follower)
        .namespace("secure")
        .store_timeout(patient)
        .backoff(Duration::from_secs(60), Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(120))
        .build();
    let (loads, started) = (Counter::default(), Arc::new(Notify::new()));
    let leading = tokio::spawn({
        let (leader, loads, started) = (leader.clone(), loads.clone(), started.clone());
        async move {
            leader
                .get_or_load("key", move || async move {
                    loads.hit();
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(b"filled"))
                })
                .await
        }
    });
    started.notified().await;
    // A failure guard only: a poll would come after 30 s at the earliest.
    let fetched =
        tokio::time::timeout(Duration::from_secs(20), follower.fetch("key", never_called))
            .await
            .expect("the follower is woken by the fill")
            .unwrap();
    assert_eq!(fetched.value().unwrap(), "filled");
    assert_eq!(fetched.outcome(), Outcome::Follower);
    assert_eq!(leading.await.unwrap().unwrap(), "filled");
    assert_eq!(loads.get(), 1);
    assert_eq!(
        leader.stats().store_errors + follower.stats().store_errors,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_in_the_url_authenticates_every_connection() {
    let server = RedisServer::start_with(&ACL);
    let url = alice_url("redis", server.port());
    let leader = RedisStore::connect(&url).await.unwrap();
    let follower = RedisStore::connect(&url).await.unwrap();
    let shown = format!("{leader:?} {}", leader.address());
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(
        shown.contains(&format!("redis://***@127.0.0.1:{}/", server.port())),
        "{shown}"
    );
    one_load_and_a_notified_follower(leader, follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_credentials_fail_without_showing_the_password() {
    let server = RedisServer::start_with(&ACL);
    let port = server.port();

    let wrong = format!("redis://alice:hunter2-wrong@127.0.0.1:{port}/");
    let error = RedisStore::connect(&wrong).await.unwrap_err();
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("hunter2-wrong"), "{shown}");
    assert!(
        shown.contains(&format!("redis://***@127.0.0.1:{port}/")),
        "{shown}"
    );
    assert!(shown.contains("authentication failed"), "{shown}");

    let builder = RedisStore::builder(&wrong);
    assert!(!format!("{builder:?}").contains("hunter2-wrong"));

    // Without credentials the server refuses every command: either connecting fails, or the
    // engine degrades to loading in-process; either way the store's error says why.
    match RedisStore::connect(format!("redis://127.0.0.1:{port}/")).await {
        Err(error) => {
            let shown = support::report(&error);
            assert!(shown.contains("NOAUTH"), "{shown}");
        }
        Ok(store) => {
            let cache = Cache::builder(store).namespace("secure").build();
            let fetched = cache
                .fetch("key", || async {
                    Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded")))
                })
                .await
                .unwrap();
            assert_eq!(fetched.outcome(), Outcome::Degraded);
            let key = cache.store_key("key");
            let error = cache.store().get(&key).await.unwrap_err();
            let shown = support::report(&error);
            assert!(shown.contains("NOAUTH"), "{shown}");
        }
    }
}

/// One thread (`current_thread`), so the thread-local log subscriber sees every task.
#[tokio::test]
async fn passwords_never_reach_the_logs() {
    let logs = Logs::default();
    let _guard = logs.capture();

    let mut server = RedisServer::start_with(&ACL);
    let store = RedisStore::connect(alice_url("redis", server.port()))
        .await
        .unwrap();
    let cache = Cache::builder(store)
        .namespace("secure")
        .store_timeout(Duration::from_secs(2))
        .build();
    let load = |value: &'static [u8]| {
        move || async move { Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(value))) }
    };
    let fetched = cache.fetch("before", load(b"a")).await.unwrap();
    assert_eq!(fetched.outcome(), Outcome::Leader);

    // Redis goes away: the lookup fails, the engine logs the store's error and loads anyway.
    server.kill();
    let fetched = cache.fetch("after", load(b"b")).await.unwrap();
    assert_eq!(fetched.outcome(), Outcome::Degraded);

    let logs = logs.text();
    assert!(
        logs.contains(&format!("redis://***@127.0.0.1:{}/", server.port())),
        "the store's failure is logged with its address: {logs}"
    );
    assert!(!logs.contains(PASSWORD), "{logs}");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use support::TlsFiles;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rediss_with_a_trusted_ca_and_an_acl_user() {
        let files = TlsFiles::generate();
        let server = RedisServer::start_tls(&files, &ACL);
        let ca = std::fs::read(&files.ca_cert).unwrap();
        let url = alice_url("rediss", server.port());
        let connect = || {
            RedisStore::builder(&url)
                .tls_root_certificates(ca.clone())
                .connect()
        };
        let (leader, follower) = (connect().await.unwrap(), connect().await.unwrap());
        let shown = format!("{leader:?} {:?}", RedisStore::builder(&url));
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(shown.contains("rediss://***@127.0.0.1"), "{shown}");
        one_load_and_a_notified_follower(leader, follower).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_certificate_or_a_plain_url_is_refused() {
        let files = TlsFiles::generate();
        let server = RedisServer::start_tls(&files, &[]);
        let port = server.port();

        // The system's roots do not know the throwaway CA.
        let error = RedisStore::connect(format!("rediss://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        let error = support::report(&error);
        assert!(error.contains("certificate"), "{error}");

        // Root certificates are for rediss:// only, and must be certificates.
        let ca = std::fs::read(&files.ca_cert).unwrap();
        let error = RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
            .tls_root_certificates(ca)
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("must be rediss://"), "{error}");
        let error = RedisStore::builder(format!("rediss://127.0.0.1:{port}/"))
            .tls_root_certificates(b"not a certificate".to_vec())
            .connect()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    /// TLS and an ACL user on a cluster: the seeds' URLs carry the credentials, the root
    /// certificates reach every node's connection, the subscriber's included.
    #[cfg(feature = "cluster")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_over_tls_with_an_acl_user() {
        let files = TlsFiles::generate();
        let cluster = support::RedisCluster::start_secure(&files, "alice", PASSWORD);
        let ca = std::fs::read(&files.ca_cert).unwrap();
        let connect = || {
            RedisStore::cluster_builder(cluster.urls())
                .tls_root_certificates(ca.clone())
                .connect()
        };
        let (leader, follower) = (connect().await.unwrap(), connect().await.unwrap());
        assert!(leader.is_cluster());
        let shown = format!(
            "{leader:?} {:?}",
            RedisStore::cluster_builder(cluster.urls())
        );
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(shown.contains("rediss://***@127.0.0.1"), "{shown}");
        one_load_and_a_notified_follower(leader, follower).await;

        let wrong: Vec<String> = cluster
            .urls()
            .iter()
            .map(|url| url.replace(PASSWORD, "hunter2-wrong"))
            .collect();
        let error = RedisStore::cluster_builder(wrong)
            .tls_root_certificates(ca.clone())
            .connect()
            .await
            .unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("hunter2-wrong"), "{shown}");
        assert!(shown.contains("rediss://***@127.0.0.1"), "{shown}");
    }
}
