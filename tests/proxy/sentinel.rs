//! Three `proxy` processes behind Redis Sentinel (`--redis-sentinel`, `--sentinel-master`): a
//! primary and two replicas under three sentinels, the primary killed or switched over while
//! the proxies serve, counted at the origin.
//!
//! Real time throughout: the failover is the sentinels' (a node is down after 1 s of silence),
//! and the proxies are processes. Every wait is bounded by [`LIMIT`]; no duration is asserted.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use support::{app_clients, Counter, RedisSentinel};

use super::{
    burst, cached_everywhere, client, eventually, get, origin_body, proxy_args, request, send,
    start_origin, start_proxies, Proxy, LIMIT,
};

/// How many requests a stampede sends, round robin over the proxies.
const REQUESTS: usize = 200;

/// Three proxies over `sentinel`'s primary, in front of an origin counted by `loads`; returns
/// once each holds its two connections (commands, subscriber) to the primary.
async fn three_proxies(sentinel: &RedisSentinel, loads: &Counter, test: &str) -> Vec<Proxy> {
    let origin = start_origin(loads.clone()).await;
    let args = proxy_args(
        origin,
        test,
        [
            "--redis-sentinel".to_owned(),
            sentinel.sentinel_urls().join(","),
            "--sentinel-master".to_owned(),
            sentinel.service().to_owned(),
            // As the other stampede tests: a proxy's runtime starved on two cores must not turn
            // a slow store call into in-process protection.
            "--store-timeout-ms".to_owned(),
            "2000".to_owned(),
        ],
    );
    let proxies = start_proxies(3, args).await;
    on_the_primary(sentinel.primary_port(), None, proxies.len()).await;
    // Connections alone do not say that every proxy's store is up (a re-dial checks the
    // primary's role on a connection of its own): until a page one proxy loads is a hit in
    // the others, one of them may still serve alone.
    let client = client(4);
    let deadline = Instant::now() + LIMIT;
    for round in 0.. {
        let path = format!("/warm-{round}");
        send(&client, get(&proxies[0].url(&path))).await.unwrap();
        let mut shared = true;
        for proxy in &proxies[1..] {
            let answer = send(&client, get(&proxy.url(&path))).await.unwrap();
            shared &= answer.x_cache.as_deref() == Some("HIT");
        }
        if shared {
            break;
        }
        assert!(Instant::now() < deadline, "the proxies never shared a page");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxies
}

/// Waits until `proxies` proxies hold their two connections each to the server on `port`,
/// and none is left on the server on `old` (if given).
async fn on_the_primary(port: u16, old: Option<u16>, proxies: usize) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = match old {
            Some(old) => app_clients(old, &[]).await,
            None => 0,
        };
        if left == 0 && app_clients(port, &[]).await >= 2 * proxies {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the proxies never all connected to {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stampede of `path` over the proxies: every request answered `200` with the origin's
/// page; returns the origin loads it cost.
async fn stampede(proxies: &[Proxy], loads: &Counter, path: &str) -> usize {
    let before = loads.get();
    let expected = origin_body(path);
    for answer in burst(proxies, REQUESTS, path).await {
        let answer = answer.unwrap_or_else(|error| panic!("{path}: {error}"));
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{path}: {:?}",
            answer.x_cache
        );
        assert!(answer.body == expected, "{path}: a body differs");
    }
    loads.get() - before
}

/// Stampedes of fresh paths until one costs a single load (the proxies share the new
/// primary), within [`LIMIT`]; every request of every stampede answered meanwhile.
async fn until_shared(proxies: &[Proxy], loads: &Counter, name: &str) {
    let deadline = Instant::now() + LIMIT;
    for round in 0.. {
        let path = format!("/{name}-{round}");
        if stampede(proxies, loads, &path).await == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "{name}: never one load again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The figure over HTTP: a stampede over 3 proxies before a failover is 1 origin load;
/// with the primary SIGKILLed, stampedes every few hundred milliseconds until a replica is
/// promoted get no error (each proxy protects itself meanwhile: at most one load per proxy);
/// afterwards one load per stampede again, three times in a row; and a `POST` through one proxy
/// after the promotion evicts the page from the others' memory (the invalidation reached the
/// new primary and its notifications every proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_fails_over_under_three_proxies_without_errors() {
    let mut sentinel = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap();
    let loads = Counter::default();
    let proxies = three_proxies(&sentinel, &loads, "sentinel-kill").await;
    assert_eq!(stampede(&proxies, &loads, "/before").await, 1, "before");

    let killed = sentinel.kill_primary();
    let promoted = {
        let waiting = tokio::task::spawn_blocking(move || {
            let promoted = sentinel.wait_promoted(LIMIT);
            (sentinel, promoted)
        });
        tokio::pin!(waiting);
        let mut round = 0;
        loop {
            let path = format!("/during-{round}");
            tokio::select! {
                done = &mut waiting => break done.unwrap(),
                loaded = stampede(&proxies, &loads, &path) => {
                    assert!(loaded <= proxies.len(), "during {round}: {loaded} loads");
                    round += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let (sentinel, promoted) = promoted;
    let promoted = promoted.expect("a replica promoted");
    assert_ne!(promoted, killed);

    on_the_primary(promoted, None, proxies.len()).await;
    until_shared(&proxies, &loads, "after").await;
    for round in 0..3 {
        let path = format!("/shared-{round}");
        assert_eq!(stampede(&proxies, &loads, &path).await, 1, "{path}");
    }

    let client = client(8);
    let page = cached_everywhere(&client, &proxies, "/counted").await;
    let posted = send(&client, request("POST", &proxies[0].url("/counted"), &[]))
        .await
        .unwrap();
    assert_eq!(posted.status, StatusCode::OK);
    let reloaded = {
        let want = format!("load {}", loads.get() + 1);
        eventually(&client, &proxies[1], "/counted", &want).await
    };
    assert_ne!(reloaded.body, page);
    let from_third = send(&client, get(&proxies[2].url("/counted")))
        .await
        .unwrap();
    assert_eq!(
        from_third.body, reloaded.body,
        "the third proxy forgot it too"
    );
    drop(sentinel);
}

/// A planned failover (`SENTINEL FAILOVER`): no connection drops, and the old primary answers
/// as a master until the sentinels demote it (about 11 s), so proxies that stayed on it would
/// lock and fill where nobody else reads. Once the switch is announced, stampedes are one
/// load again, and the values are on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switchover_moves_three_proxies_to_the_new_primary() {
    let sentinel = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap();
    let loads = Counter::default();
    let proxies = three_proxies(&sentinel, &loads, "sentinel-switch").await;
    assert_eq!(stampede(&proxies, &loads, "/before").await, 1, "before");

    let (sentinel, old, new) = tokio::task::spawn_blocking(move || {
        let (old, new) = sentinel.switch_over(LIMIT);
        (sentinel, old, new)
    })
    .await
    .unwrap();
    let new = new.expect("a replica promoted");
    // Every proxy moves on the sentinels' announcement (or on `READONLY`), each in its own
    // time: until the last has, two proxies may lock on different servers.
    on_the_primary(new, Some(old), proxies.len()).await;
    // They moved on the announcement, not on the old primary's demotion: that comes about 11 s
    // after the switch here, long after the announcement (about 1 s after it).
    assert_eq!(
        sentinel.role_of(old).as_deref(),
        Some("master"),
        "the proxies left the old primary only once it was demoted"
    );
    until_shared(&proxies, &loads, "after").await;
    for round in 0..3 {
        let path = format!("/shared-{round}");
        assert_eq!(stampede(&proxies, &loads, &path).await, 1, "{path}");
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{new}/")).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let keys: usize = redis::cmd("DBSIZE")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(keys > 0, "the proxies fill the new primary");
    drop(sentinel);
}

/// `--redis-sentinel` needs `--sentinel-master` (and the other way round), and is not with
/// `--redis` or `--redis-cluster`: each a usage error (exit code 2) that says why.
#[test]
fn sentinel_arguments_are_checked() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(super::proxy_binary())
            .args(["--listen", "127.0.0.1:0", "--origin", "http://127.0.0.1:1"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the proxy example");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let sentinels = [
        "--redis-sentinel",
        "redis://127.0.0.1:1/,redis://127.0.0.1:2/",
    ];
    let without_master = run(&sentinels);
    assert!(
        without_master.contains("--sentinel-master"),
        "{without_master}"
    );
    let without_sentinels = run(&["--sentinel-master", "mymaster"]);
    assert!(
        without_sentinels.contains("--redis-sentinel"),
        "{without_sentinels}"
    );
    let with_redis = run(&[
        sentinels[0],
        sentinels[1],
        "--sentinel-master",
        "mymaster",
        "--redis",
        "redis://127.0.0.1:3/",
    ]);
    assert!(
        with_redis.contains("--redis-sentinel is not with --redis or --redis-cluster"),
        "{with_redis}"
    );
}
