//! The `proxy` example behind a load balancer, black-box: every request carries the
//! balancer's `X-Forwarded-Proto` and `X-Forwarded-Port` (the same on each) and its client's
//! own `X-Forwarded-For`, and each response shape costs the origin what it costs without a
//! balancer: one load per burst over two proxies for whatever may be shared (stored or not),
//! one per proxy for a body over `--max-body-bytes` (relayed within its process), one per
//! request for what is private to its request or too large to relay (`--max-relay-bytes`). The burst is released at once (a barrier), and
//! the origin takes 300 ms per request, so every request of it arrives while the first load is
//! in flight.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use hyper::StatusCode;
use support::{Counter, RedisServer};

use super::{burst_with, large_body, proxy_args, start_origin, start_proxies, Headers};

/// The origin's answer for `/shape/{shape}`, load `n`.
pub(super) fn shape(shape: &str, n: usize) -> Response {
    let body = format!("{shape} load {n}");
    let fresh = (header::CACHE_CONTROL, "max-age=60");
    match shape {
        "max-age" => ([fresh], body).into_response(),
        "s-maxage" => ([(header::CACHE_CONTROL, "s-maxage=60")], body).into_response(),
        "no-freshness" => body.into_response(),
        "failing" => (StatusCode::SERVICE_UNAVAILABLE, body).into_response(),
        "failing-fresh" => (StatusCode::SERVICE_UNAVAILABLE, [fresh], body).into_response(),
        "vary" => ([fresh, (header::VARY, "accept-encoding")], body).into_response(),
        "set-cookie" => ([fresh, (header::SET_COOKIE, "id=1")], body).into_response(),
        "private" => ([(header::CACHE_CONTROL, "private, max-age=60")], body).into_response(),
        "large" => ([fresh], large_body()).into_response(),
        "huge" => ([fresh], large_body().repeat(2)).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Each response shape, and the origin loads a burst of it costs over two proxies.
const SHAPES: [(&str, usize); 10] = [
    ("max-age", 1),
    ("s-maxage", 1),
    ("no-freshness", 1),
    ("failing", 1),
    ("failing-fresh", 1),
    ("vary", 1),
    ("set-cookie", BURST),
    ("private", BURST),
    // Over the proxy's default 1 MiB `--max-body-bytes`: relayed in each proxy.
    ("large", 2),
    // Over the test's 3 MiB `--max-relay-bytes`: each waiter is sent to the origin.
    ("huge", BURST),
];

/// Requests per burst.
const BURST: usize = 20;

/// The balancer's fields on the `i`-th request.
fn balancer(i: usize) -> Headers {
    vec![
        ("x-forwarded-proto", "https".to_owned()),
        ("x-forwarded-port", "443".to_owned()),
        ("x-forwarded-for", format!("203.0.113.{i}")),
        ("accept-encoding", "gzip".to_owned()),
    ]
}

/// Issue 52: behind a balancer, each shape costs what it costs without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_a_balancer_each_response_shape_loads_as_without_one() {
    let redis = RedisServer::start();
    let origin_requests = Counter::default();
    let origin = start_origin(origin_requests.clone()).await;
    let args = ["--redis", &redis.url(), "--max-relay-bytes", "3145728"].map(str::to_owned);
    let args = proxy_args(origin, "balancer", args);
    let proxies = start_proxies(2, args).await;
    let mut failures = Vec::new();
    for (shape, loads) in SHAPES {
        let before = origin_requests.get();
        let path = format!("/shape/{shape}");
        let answers = burst_with(&proxies, BURST, &path, balancer).await;
        let loaded = origin_requests.get() - before;
        if loaded != loads {
            failures.push(format!("{shape}: {loaded} origin loads, not {loads}"));
        }
        let mut relay_full = 0;
        for answer in answers {
            let answer = answer.unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert!(
                answer.status == StatusCode::OK || shape.starts_with("failing"),
                "{shape}: {}",
                answer.status
            );
            let status = answer.headers.get("cache-status");
            let status = status.and_then(|v| v.to_str().ok()).unwrap_or_default();
            relay_full += usize::from(status.contains("detail=relay-full"));
        }
        // The two leaders say `too-large`; every request that waited for one, why it loaded.
        if shape == "huge" && relay_full != BURST - 2 {
            failures.push(format!(
                "huge: {relay_full} waiters said relay-full, not 18"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
