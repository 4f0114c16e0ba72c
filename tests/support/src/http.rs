//! Requests sent through an app in process, and the answers read to the end, for the tests of
//! the HTTP layer.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;

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
