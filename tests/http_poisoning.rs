//! Cache poisoning: one attacker's request, then one plain request for the same URL; the plain
//! one never gets the attacker's response. Through the real middleware over `MemoryStore` and
//! (feature `redis`) a real `redis-server`, two instances each.
//!
//! The origin behaves as common frameworks do: it obeys a method override, reads the body of
//! a `GET`, builds its links from the forwarding headers and routes by the rewrite headers,
//! and says every answer is fresh for a minute.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use support::http::{send, Answer};
use support::{Counter, Shared};
use tower::ServiceExt;
use tower_stampede::StampedeLayer;

/// The origin; see the file's docs.
fn origin(calls: &Counter) -> Router {
    let calls = calls.clone();
    Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        calls.hit();
        async move {
            // As CGI, WSGI and Rack servers name headers (`HTTP_X_FORWARDED_HOST`), an
            // underscore spells a hyphen.
            let header = |name: &str| {
                let underscored = name.replace('-', "_");
                (headers
                    .get(name)
                    .or_else(|| headers.get(underscored.as_str())))
                .and_then(|v| v.to_str().ok())
            };
            let page = if let Some(method) = header("x-http-method-override")
                .or_else(|| header("x-http-method"))
                .or_else(|| header("x-method-override"))
            {
                format!("{method} done")
            } else if let Some(path) = header("x-original-url").or_else(|| header("x-rewrite-url"))
            {
                format!("the page at {path}")
            } else {
                let forwarded = header("forwarded").unwrap_or("");
                let forwarded_host = forwarded
                    .split(';')
                    .find_map(|pair| pair.trim().strip_prefix("host="));
                let host = header("x-forwarded-host")
                    .or_else(|| header("x-host"))
                    .or(forwarded_host)
                    .or_else(|| header("host"))
                    .unwrap_or("app.test");
                let scheme = header("x-forwarded-proto")
                    .or_else(|| header("x-forwarded-scheme"))
                    .or_else(|| (header("x-forwarded-ssl") == Some("on")).then_some("https"))
                    .unwrap_or("http");
                let port = header("x-forwarded-port").map_or(String::new(), |p| format!(":{p}"));
                let prefix = header("x-forwarded-prefix").unwrap_or("");
                let query = String::from_utf8_lossy(&body);
                let link = format!("{scheme}://{host}{port}{prefix}/next");
                format!("<a href=\"{link}\"> {} {query}", uri.path())
            };
            let mut response: Response = page.into_response();
            response
                .headers_mut()
                .insert("cache-control", HeaderValue::from_static("max-age=60"));
            response
        }
    })
}

/// Two instances (two L1s) over one store.
fn instances(
    shared: &Shared,
    calls: &Counter,
    layer: impl Fn(StampedeLayer) -> StampedeLayer,
) -> [Router; 2] {
    [0, 1].map(|_| origin(calls).layer(layer(StampedeLayer::new(shared.cache().build()))))
}

/// `GET uri` with `headers` and, if not empty, a body with its `Content-Length` (as an
/// HTTP/1.1 client sends it).
async fn get_with(app: &Router, uri: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut request = Request::get(uri).body(Body::from(body.to_owned())).unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    if !body.is_empty() {
        request
            .headers_mut()
            .insert("content-length", HeaderValue::from(body.len()));
    }
    let (parts, body) = app.clone().oneshot(request).await.unwrap().into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Each vector of the issue: the attacker's request is passed (its answer, which the origin
/// made from what the key leaves out, is neither stored nor answered from the cache), and the
/// victim's plain request, on either instance, gets the page the URL names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attackers_request_never_becomes_the_victims_page() {
    let vectors: [(&[(&str, &str)], &str); 16] = [
        (&[("x-http-method-override", "DELETE")], ""),
        (&[("x-http-method", "DELETE")], ""),
        (&[("x-method-override", "DELETE")], ""),
        (&[], "q=POISON"),
        (&[("x-forwarded-host", "evil.example")], ""),
        (&[("x-host", "evil.example")], ""),
        (&[("x-forwarded-proto", "javascript")], ""),
        (&[("x-forwarded-scheme", "javascript")], ""),
        (&[("forwarded", "for=1.2.3.4;host=evil.example")], ""),
        (&[("x-original-url", "/admin")], ""),
        (&[("x-rewrite-url", "/admin")], ""),
        // Honoured by Spring, Symfony, Werkzeug's ProxyFix, Django and Rack.
        (&[("x-forwarded-port", "1337")], ""),
        (&[("x-forwarded-prefix", "/evil")], ""),
        (&[("x-forwarded-ssl", "on")], ""),
        // The same headers spelled with underscores, as a server that names them the CGI
        // way reads them.
        (&[("x_forwarded_host", "evil.example")], ""),
        (&[("X_HTTP_Method_Override", "DELETE")], ""),
    ];
    for shared in Shared::both().await {
        for (i, (headers, body)) in vectors.iter().enumerate() {
            let calls = Counter::default();
            let [one, two] = instances(&shared, &calls, |layer| layer);
            let uri = format!("http://app.test/page/{i}");
            let attack = get_with(&one, &uri, headers, body).await;
            // Passed: a bypass, or, for an override to an unsafe method, unmarked as the
            // method it names would be.
            assert!(
                matches!(attack.x_cache(), "BYPASS" | ""),
                "{} {headers:?} {body}: {}",
                shared.name,
                attack.x_cache()
            );
            let honest = format!("<a href=\"http://app.test/next\"> /page/{i} ");
            for app in [&two, &one, &two] {
                let victim = send(app, "GET", &uri, &[]).await;
                assert_eq!(victim.body(), honest, "{} {headers:?} {body}", shared.name);
            }
            assert_eq!(
                calls.get(),
                2,
                "{}: the victim's page is cached",
                shared.name
            );
        }
    }
}

/// A header the operator's own load balancer sets on every request is trusted: requests with
/// it are cached again (the first stored, the next a hit). A header the application reflects
/// is named, and requests with it pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_headers_are_cached_and_named_headers_pass() {
    for shared in Shared::both().await {
        let calls = Counter::default();
        let [one, two] = instances(&shared, &calls, |layer| {
            layer
                .trust_header(HeaderName::from_static("x-forwarded-proto"))
                .pass_header(HeaderName::from_static("x-theme"))
        });
        let uri = "http://app.test/behind-the-balancer";
        let proto = [("x-forwarded-proto", "https")];
        let first = get_with(&one, uri, &proto, "").await;
        let second = get_with(&two, uri, &proto, "").await;
        assert_eq!(
            [first.x_cache(), second.x_cache()],
            ["MISS", "HIT"],
            "{}",
            shared.name
        );
        for _ in 0..2 {
            let themed = get_with(&one, "http://app.test/themed", &[("x-theme", "dark")], "").await;
            assert_eq!(themed.x_cache(), "BYPASS", "{}", shared.name);
        }
        let evil = get_with(&one, uri, &[("x-forwarded-host", "evil.example")], "").await;
        assert_eq!(
            evil.x_cache(),
            "BYPASS",
            "{}: only the named one is trusted",
            shared.name
        );
        // The load balancer overwrites the hyphenated field, not a client's underscored one.
        let smuggled = get_with(&one, uri, &[("x_forwarded_proto", "https")], "").await;
        assert_eq!(smuggled.x_cache(), "BYPASS", "{}", shared.name);
    }
}

/// Response header bytes are bounded: a 200 KB header block is passed to its caller intact
/// and not stored (under a limit raised above it, the same response is stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_kb_header_block_is_not_stored() {
    let huge = |calls: &Counter| {
        let calls = calls.clone();
        Router::new().fallback(move || {
            calls.hit();
            async move {
                let mut response: Response = "small body".into_response();
                let block = HeaderValue::from_str(&"x".repeat(10_000)).unwrap();
                for i in 0..20 {
                    let name = HeaderName::from_bytes(format!("x-big-{i}").as_bytes()).unwrap();
                    response.headers_mut().insert(name, block.clone());
                }
                response
                    .headers_mut()
                    .insert("cache-control", HeaderValue::from_static("max-age=60"));
                response
            }
        })
    };
    for shared in Shared::both().await {
        let calls = Counter::default();
        let app = huge(&calls).layer(StampedeLayer::new(shared.cache().build()));
        for _ in 0..2 {
            let answer = send(&app, "GET", "http://app.test/huge", &[]).await;
            assert_eq!(answer.x_cache(), "BYPASS", "{}", shared.name);
            let big = (0..20).filter(|i| answer.headers[format!("x-big-{i}")].len() == 10_000);
            assert_eq!(big.count(), 20, "{}: intact", shared.name);
        }
        assert_eq!(calls.get(), 2, "{}", shared.name);
        let raised = huge(&calls)
            .layer(StampedeLayer::new(shared.cache().build()).max_header_bytes(1 << 20));
        let marks = [
            send(&raised, "GET", "http://app.test/huge-allowed", &[]).await,
            send(&raised, "GET", "http://app.test/huge-allowed", &[]).await,
        ]
        .map(|answer| answer.x_cache().to_owned());
        assert_eq!(marks, ["MISS", "HIT"], "{}", shared.name);
    }
}

/// A `GET` whose method override names an unsafe method is run by the origin as that method
/// (the override exists for clients that cannot send `DELETE` or `PUT`): it is passed, and
/// its non-error response invalidates the URL as the named method's would (RFC 9111 §4.4),
/// so the next plain `GET` loads the changed page instead of the one stored before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_invalidates_as_the_method_it_names() {
    for shared in Shared::both().await {
        let calls = Counter::default();
        let [one, _] = instances(&shared, &calls, |layer| layer);
        let uri = "http://app.test/item/9";
        let stored = send(&one, "GET", uri, &[]).await;
        assert_eq!(stored.x_cache(), "MISS", "{}", shared.name);
        for (name, method) in [
            ("x-http-method-override", "DELETE"),
            ("x-http-method", "PUT"),
            ("x-method-override", "PATCH"),
        ] {
            let changed = get_with(&one, uri, &[(name, method)], "").await;
            assert_eq!(changed.body(), format!("{method} done"), "{}", shared.name);
            let next = send(&one, "GET", uri, &[]).await;
            assert_eq!(next.x_cache(), "MISS", "{} {name}", shared.name);
        }
        let safe = get_with(&one, uri, &[("x-http-method-override", "GET")], "").await;
        assert_eq!(safe.x_cache(), "BYPASS", "{}", shared.name);
        let next = send(&one, "GET", uri, &[]).await;
        assert_eq!(
            next.x_cache(),
            "HIT",
            "{}: a safe override changes nothing",
            shared.name
        );
    }
}
