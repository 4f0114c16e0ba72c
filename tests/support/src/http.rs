//! Requests sent through an app in process, and the answers read to the end, for the tests of
//! the HTTP layer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::{wait_until, Counter};

/// One response, read to the end.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Its `x-cache`, or `""` without one.
    pub fn x_cache(&self) -> &str {
        self.headers
            .get("x-cache")
            .map_or("", |v| v.to_str().unwrap())
    }

    /// Its `Age`, if it has one (two fail the test).
    pub fn age(&self) -> Option<u64> {
        let mut ages = self.headers.get_all("age").iter();
        let age = ages.next()?.to_str().unwrap().parse().unwrap();
        assert!(ages.next().is_none(), "one Age");
        Some(age)
    }

    /// Its body, as text.
    pub fn body(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

/// Sends `method uri` with `headers` (any bytes) through `app`.
pub async fn send_raw(
    app: &Router,
    method: impl AsRef<str>,
    uri: &str,
    headers: &[(&str, &[u8])],
) -> Answer {
    let method = Method::from_bytes(method.as_ref().as_bytes()).unwrap();
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    let (parts, body) = app.clone().oneshot(request).await.unwrap().into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Sends `method uri` with text `headers` through `app`.
pub async fn send(
    app: &Router,
    method: impl AsRef<str>,
    uri: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    send_raw(app, method, uri, &headers).await
}

/// `GET uri` through `app`.
pub async fn get(app: &Router, uri: &str) -> Answer {
    send(app, "GET", uri, &[]).await
}

/// The `x-cache` that tells what a `Cache-Status` member tells (`docs/http.md`): `HIT` from
/// the cache, `STALE` from a stale entry, `BYPASS` where a rule kept the cache out (a
/// `detail` naming it), `MISS` for a request forwarded for its own load or collapsed onto
/// another's (RFC 9211 §3 calls both a miss), or answered by the layer itself.
pub fn told_by(cache_status: &str) -> &'static str {
    let params: Vec<&str> = cache_status.split("; ").skip(1).collect();
    let detail = params.iter().find_map(|p| p.strip_prefix("detail="));
    match (params.contains(&"hit"), detail) {
        (true, Some("stale")) => "STALE",
        (true, _) => "HIT",
        (false, None | Some("no-origin-response" | "timeout")) => "MISS",
        (false, Some(_)) => "BYPASS",
    }
}

/// A `Cache-Status` member without its `ttl` parameter (RFC 9211 §2.4), and that `ttl`: the
/// rest can be compared whole while the clock moves the `ttl`.
#[allow(dead_code)]
pub fn split_ttl(member: &str) -> (String, Option<i64>) {
    let mut ttl = None;
    let rest: Vec<&str> = member
        .split("; ")
        .filter(|parameter| match parameter.strip_prefix("ttl=") {
            Some(value) => {
                ttl = Some(value.parse().expect("an integer ttl"));
                false
            }
            None => true,
        })
        .collect();
    (rest.join("; "), ttl)
}

/// An origin's loads, counted, the first (or every one) held until released: what a
/// stampede test needs to have every request reach the cache while the first load is in
/// flight (see [`stampede`]).
#[derive(Clone)]
pub struct Held {
    pub loads: Counter,
    release: Arc<Semaphore>,
    /// Whether every load is held until the release, not only the first.
    all: bool,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            loads: Counter::default(),
            release: Arc::new(Semaphore::new(0)),
            all: false,
        }
    }
}

impl Held {
    /// Every load held until the release: for a burst whose processes may each load, so
    /// that none ends before every request of the burst joined it.
    pub fn all() -> Self {
        Held {
            all: true,
            ..Held::default()
        }
    }

    /// Counts a load, and holds it if it is the first (or if every load is held, until the
    /// release); returns its number.
    pub async fn load(&self) -> usize {
        let n = self.loads.hit();
        if n == 1 || self.all {
            self.release.acquire().await.unwrap().forget();
        }
        n
    }

    /// Lets the first load go on (and, if every load is held, every load from now on).
    pub fn release(&self) {
        let permits = if self.all {
            Semaphore::MAX_PERMITS / 2
        } else {
            1
        };
        self.release.add_permits(permits);
    }
}

/// `requests` concurrent `GET uri`s, over `apps` in turn, the i-th with `headers(i)`: the
/// origin's first load is held until every request has been sent and a moment more, so that
/// they reach the cache while it is in flight (a task counts as sent when it starts, and on a
/// busy machine may take a while to reach the cache; the moment is a bound for that, no
/// assertion is made on it). Each answer, in the order sent.
pub async fn stampede(
    origin: &Held,
    apps: &[Router],
    requests: usize,
    uri: &str,
    headers: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<Answer> {
    let moment = Duration::from_millis(300);
    stampede_held(moment, origin, apps, requests, uri, headers).await
}

/// [`stampede`], the first load held `moment` past the last request's start.
pub async fn stampede_held(
    moment: Duration,
    origin: &Held,
    apps: &[Router],
    requests: usize,
    uri: &str,
    headers: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<Answer> {
    let sent = Counter::default();
    let mut tasks = Vec::new();
    for i in 0..requests {
        let (app, sent, uri) = (apps[i % apps.len()].clone(), sent.clone(), uri.to_owned());
        let headers = headers(i);
        tasks.push(tokio::spawn(async move {
            sent.hit();
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send(&app, "GET", &uri, &headers).await
        }));
        if i == 0 {
            // The first request leads.
            wait_until("the first load", || origin.loads.get() > 0).await;
        }
    }
    wait_until("every request sent", || sent.get() == requests).await;
    tokio::time::sleep(moment).await;
    origin.release();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}
