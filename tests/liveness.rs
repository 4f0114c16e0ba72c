//! A subscriber connection that goes silent without closing (a half-open TCP connection: a NAT
//! or a firewall that dropped an idle flow) is noticed, its notifications counted as lost, and
//! replaced by itself.
//!
//! These tests run on real time: the silence is a real TCP relay's (the bytes wait in the
//! kernel's sockets), which paused tokio time cannot drive (it would jump over every deadline
//! while the relay's bytes are on their way). Their bounds are generous, and none is below a
//! second.
#![cfg(feature = "redis")]

use std::time::Duration;

use bytes::Bytes;
use support::relay::Relay;
use support::{until_health, RedisServer};
use tokio::time::Instant;
use tower_stampede::store::RedisStore;
use tower_stampede::{Cache, Loaded, Outcome};

/// The slow poll of the muted process's followers: a follower that believed notifications
/// live would wait half of it at least.
const SLOW_POLL: Duration = Duration::from_secs(10);

async fn read(cache: &Cache, key: &str) -> (Bytes, Outcome) {
    let fetched = cache
        .fetch(key, || async {
            Ok::<_, std::io::Error>(Loaded::value(Bytes::from_static(b"loaded here")))
        })
        .await
        .unwrap();
    (fetched.value().cloned().unwrap(), fetched.outcome())
}

/// The subscriber muted for 10 s (its connection open, no byte delivered either way; the
/// store's data connection flows): `health()` says notifications are lost within 3 s; the
/// entry L1 read before the mute is not served after another process changed it; a follower
/// is answered well within the slow poll; and within 3 s of the connection flowing again, the
/// cache is healthy and hears the other process's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscriber_counts_as_lost_notifications_until_replaced() {
    let server = RedisServer::start();
    let relay = Relay::start(server.port()).await;
    let cache = Cache::builder(RedisStore::connect(relay.url()).await.unwrap())
        .namespace("liveness")
        .store_timeout(Duration::from_secs(1))
        .poll_while_notified(SLOW_POLL)
        .build();
    let other = Cache::builder(RedisStore::connect(server.url()).await.unwrap())
        .namespace("liveness")
        .store_timeout(Duration::from_secs(1))
        .build();
    until_health(&cache, "subscribed", |health| health.is_healthy()).await;
    let old = (Bytes::from("loaded here"), Outcome::Leader);
    assert_eq!(read(&cache, "k").await, old);
    let old = (Bytes::from("loaded here"), Outcome::L1Hit);
    assert_eq!(read(&cache, "k").await, old);

    relay.mute_subscribers(true);
    let muted = Instant::now();
    other
        .set("k", "new", Duration::from_secs(60))
        .await
        .unwrap();
    let noticed = until_health(&cache, "the silence noticed", |health| {
        health.notifications_live() == Some(false)
    })
    .await;
    assert!(
        noticed < Duration::from_secs(3),
        "noticed after {noticed:?}"
    );
    let health = cache.health().await;
    assert!(!health.is_healthy() && health.store_answers(), "{health:?}");
    assert_eq!(
        read(&cache, "k").await.0,
        "new",
        "the entry read before the mute, changed elsewhere since, is not served"
    );

    // The other process leads a load of 2 s; this one follows, woken by no message.
    let (started, start) = tokio::sync::oneshot::channel();
    let leader = tokio::spawn({
        let other = other.clone();
        async move {
            let loaded = other
                .get_or_load("f", || async move {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok::<_, std::io::Error>(Bytes::from_static(b"filled"))
                })
                .await
                .unwrap();
            (loaded, Instant::now())
        }
    });
    start.await.unwrap();
    let (value, outcome) = read(&cache, "f").await;
    let answered = Instant::now();
    let (loaded, filled) = leader.await.unwrap();
    assert_eq!(loaded, "filled");
    assert_eq!((value, outcome), (Bytes::from("filled"), Outcome::Follower));
    // Believing notifications live, it would have slept half the slow poll at least.
    let after_fill = answered.saturating_duration_since(filled);
    assert!(
        after_fill < Duration::from_secs(2),
        "the follower polls on its backoff, not the slow poll: answered {after_fill:?} after the fill"
    );

    tokio::time::sleep_until(muted + Duration::from_secs(10)).await;
    let health = cache.health().await;
    assert_eq!(health.notifications_live(), Some(false), "{health:?}");
    relay.mute_subscribers(false);
    let recovered = until_health(&cache, "recovered", |health| {
        health.is_healthy() && health.notifications_live() == Some(true)
    })
    .await;
    assert!(
        recovered < Duration::from_secs(3),
        "recovered after {recovered:?}"
    );
    eprintln!("noticed after {noticed:?}, followed {after_fill:?} after the fill, recovered after {recovered:?}");

    // Heard again: an entry L1 keeps is dropped when the other process changes it.
    assert_eq!(read(&cache, "k").await.0, "new");
    assert_eq!(
        read(&cache, "k").await,
        (Bytes::from("new"), Outcome::L1Hit)
    );
    other
        .set("k", "newer", Duration::from_secs(60))
        .await
        .unwrap();
    let changed = Instant::now();
    while read(&cache, "k").await.0 != "newer" {
        assert!(
            changed.elapsed() < Duration::from_secs(3),
            "the change was not heard"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
