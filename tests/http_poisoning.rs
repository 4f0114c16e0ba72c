//! Cache poisoning: one attacker's request, then one plain request for the same URL; the plain
//! one never gets the attacker's response. Through the real middleware over `MemoryStore` and
//! (feature `redis`) a real `redis-server`, two instances each.
//!
//! The origin behaves as common frameworks do: it obeys a method override, reads the body of
//! a `GET`, builds its links from the forwarding headers and routes by the rewrite headers,
//! and says every answer is fresh for a minute (but under `/unstored`, which says nothing of
//! its freshness, and `/error`, a server error).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use support::http::{send, Answer};
use support::{store_test, Counter, Shared};
use tower::ServiceExt;
use tower_stampede::StampedeLayer;

/// The origin; see the file's docs.
fn origin(calls: &Counter) -> Router {
    let calls = calls.clone();
    Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        calls.hit();
        async move {
            if uri.path().starts_with("/slow") {
                // A slow origin, so that the requests of a burst arrive while it loads.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
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
            if uri.path().contains("/unstored") {
                // Shared with the requests that waited for it, not stored (issue 40).
                return response;
            }
            if uri.path().contains("/error") {
                // A server error: handed to the requests that waited for it, not stored.
                *response.status_mut() = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                return response;
            }
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

store_test!(an_attackers_request_never_becomes_the_victims_page);
/// Each vector of the issue: the attacker's request is passed (its answer, which the origin
/// made from what the key leaves out, is neither stored nor answered from the cache) or, for
/// a forwarding header, which is part of the key (issue 40), stored as a variant that only
/// requests with that same header read; and the victim's plain request, on either instance,
/// gets the page the URL names.
async fn an_attackers_request_never_becomes_the_victims_page(shared: Shared) {
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
    for (i, (headers, body)) in vectors.iter().enumerate() {
        let calls = Counter::default();
        let [one, two] = instances(&shared, &calls, |layer| layer);
        let uri = format!("http://app.test/page/{i}");
        let attack = get_with(&one, &uri, headers, body).await;
        // The hyphenated forwarding headers are keyed: the attacker's page is stored for
        // them alone. The others pass: a bypass, or, for an override to an unsafe method,
        // unmarked as the method it names would be.
        let keyed = (4..=13).contains(&i);
        if keyed {
            assert_eq!(attack.x_cache(), "MISS", "{headers:?}");
        } else {
            assert!(
                matches!(attack.x_cache(), "BYPASS" | ""),
                "{headers:?} {body}: {}",
                attack.x_cache()
            );
        }
        let honest = format!("<a href=\"http://app.test/next\"> /page/{i} ");
        for app in [&two, &one, &two] {
            let victim = send(app, "GET", &uri, &[]).await;
            assert_eq!(victim.body(), honest, "{headers:?} {body}");
        }
        if keyed {
            // The variant only the attacker's own value reads.
            let again = get_with(&two, &uri, headers, body).await;
            assert_eq!(
                (again.x_cache(), again.body()),
                ("HIT", attack.body()),
                "{headers:?}"
            );
        }
        assert_eq!(calls.get(), 2, "the victim's page is cached");
    }
}

store_test!(trusted_headers_are_cached_and_named_headers_pass);
/// A header the operator's own load balancer sets on every request is trusted: requests with
/// it are cached again (the first stored, the next a hit). A header the application reflects
/// is named, and requests with it pass.
async fn trusted_headers_are_cached_and_named_headers_pass(shared: Shared) {
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
    assert_eq!([first.x_cache(), second.x_cache()], ["MISS", "HIT"]);
    for _ in 0..2 {
        let themed = get_with(&one, "http://app.test/themed", &[("x-theme", "dark")], "").await;
        assert_eq!(themed.x_cache(), "BYPASS");
    }
    // Only the named one is trusted: another forwarding header is part of the key, so
    // the attacker's page is a variant of its own (issue 40), never the balancer's page.
    let evil = get_with(&one, uri, &[("x-forwarded-host", "evil.example")], "").await;
    assert_eq!(evil.x_cache(), "MISS");
    assert!(evil.body().contains("evil.example"));
    let third = get_with(&two, uri, &proto, "").await;
    assert_eq!(
        (third.x_cache(), third.body()),
        ("HIT", first.body()),
        "only the named one is trusted"
    );
    // The load balancer overwrites the hyphenated field, not a client's underscored one.
    let smuggled = get_with(&one, uri, &[("x_forwarded_proto", "https")], "").await;
    assert_eq!(smuggled.x_cache(), "BYPASS");
}

store_test!(a_200_kb_header_block_is_not_stored);
/// Response header bytes are bounded: a 200 KB header block is passed to its caller intact
/// and not stored (under a limit raised above it, the same response is stored).
async fn a_200_kb_header_block_is_not_stored(shared: Shared) {
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
    let calls = Counter::default();
    let app = huge(&calls).layer(StampedeLayer::new(shared.cache().build()));
    for _ in 0..2 {
        let answer = send(&app, "GET", "http://app.test/huge", &[]).await;
        assert_eq!(answer.x_cache(), "BYPASS");
        let big = (0..20).filter(|i| answer.headers[format!("x-big-{i}")].len() == 10_000);
        assert_eq!(big.count(), 20, "intact");
    }
    assert_eq!(calls.get(), 2);
    let raised =
        huge(&calls).layer(StampedeLayer::new(shared.cache().build()).max_header_bytes(1 << 20));
    let marks = [
        send(&raised, "GET", "http://app.test/huge-allowed", &[]).await,
        send(&raised, "GET", "http://app.test/huge-allowed", &[]).await,
    ]
    .map(|answer| answer.x_cache().to_owned());
    assert_eq!(marks, ["MISS", "HIT"]);
}

store_test!(a_method_override_invalidates_as_the_method_it_names);
/// A `GET` whose method override names an unsafe method is run by the origin as that method
/// (the override exists for clients that cannot send `DELETE` or `PUT`): it is passed, and
/// its non-error response invalidates the URL as the named method's would (RFC 9111 §4.4),
/// so the next plain `GET` loads the changed page instead of the one stored before.
async fn a_method_override_invalidates_as_the_method_it_names(shared: Shared) {
    let calls = Counter::default();
    // Each override invalidates at once: no interval between invalidations (their bound is
    // `http_invalidation`'s to test).
    let [one, _] = instances(&shared, &calls, |layer| {
        layer.invalidation_interval(Duration::ZERO)
    });
    let uri = "http://app.test/item/9";
    let stored = send(&one, "GET", uri, &[]).await;
    assert_eq!(stored.x_cache(), "MISS");
    for (name, method) in [
        ("x-http-method-override", "DELETE"),
        ("x-http-method", "PUT"),
        ("x-method-override", "PATCH"),
    ] {
        let changed = get_with(&one, uri, &[(name, method)], "").await;
        assert_eq!(changed.body(), format!("{method} done"));
        let next = send(&one, "GET", uri, &[]).await;
        assert_eq!(next.x_cache(), "MISS", "{name}");
    }
    let safe = get_with(&one, uri, &[("x-http-method-override", "GET")], "").await;
    assert_eq!(safe.x_cache(), "BYPASS");
    let next = send(&one, "GET", uri, &[]).await;
    assert_eq!(next.x_cache(), "HIT", "a safe override changes nothing");
}

/// The cache status member of the layer (the last one).
fn ours(answer: &Answer) -> &str {
    answer
        .headers
        .get_all("cache-status")
        .iter()
        .next_back()
        .map_or("", |v| v.to_str().unwrap())
}

/// The headers a load balancer sets on every request: the same scheme and port, and each
/// client's own address.
fn from_the_balancer(client: usize) -> Vec<(String, String)> {
    vec![
        ("x-forwarded-proto".to_owned(), "https".to_owned()),
        ("x-forwarded-port".to_owned(), "443".to_owned()),
        (
            "x-forwarded-for".to_owned(),
            format!(
                "10.{}.{}.{}",
                client / 65536,
                client / 256 % 256,
                client % 256
            ),
        ),
    ]
}

async fn get_owned(app: &Router, uri: &str, headers: &[(String, String)]) -> Answer {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    get_with(app, uri, &headers, "").await
}

store_test!(a_load_balancers_forwarding_headers_make_one_entry_loaded_once);
/// Issue 40: behind a load balancer every request carries its `X-Forwarded-Proto` and
/// `X-Forwarded-Port` (the same values) and its own `X-Forwarded-For`. The forwarding headers
/// are part of the key (the origin builds its links from them), the client's address is not:
/// 200 concurrent `GET`s over two instances load the origin once, and all get its page.
/// The origin takes 200 ms (of paused time on the embedded store), so that the burst arrives
/// while it loads.
async fn a_load_balancers_forwarding_headers_make_one_entry_loaded_once(shared: Shared) {
    let calls = Counter::default();
    let apps = instances(&shared, &calls, |layer| layer);
    let uri = "http://app.test/slow/behind-the-balancer";
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(200));
    let burst: Vec<_> = (0..200)
        .map(|client| {
            let (app, barrier) = (apps[client % 2].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                get_owned(&app, uri, &from_the_balancer(client)).await
            })
        })
        .collect();
    for answer in burst {
        let answer = answer.await.unwrap();
        assert_eq!(
            answer.body(),
            "<a href=\"https://app.test:443/next\"> /slow/behind-the-balancer "
        );
        assert!(
            matches!(answer.x_cache(), "MISS" | "HIT"),
            "{}",
            ours(&answer)
        );
    }
    assert_eq!(calls.get(), 1, "one origin load");
}

store_test!(an_attackers_forwarding_header_makes_a_variant_only_it_reads);
/// Issue 40: an attacker's `X-Forwarded-Host` makes a variant that only requests with that
/// same value read (the attacker's second request is a hit on it); a plain request and one
/// with the load balancer's own values, on either instance, never get the attacker's page.
/// `Forwarded` is keyed without its `for=` (each client's address). An unsafe request, and a
/// purge by URL, reach every variant.
async fn an_attackers_forwarding_header_makes_a_variant_only_it_reads(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, |layer| layer);
    let uri = "http://app.test/page/variants";
    let evil = [("x-forwarded-host", "evil.example")];
    let attack = get_with(&one, uri, &evil, "").await;
    assert!(attack.body().contains("evil.example"));
    let again = get_with(&two, uri, &evil, "").await;
    assert_eq!(
        (again.x_cache(), again.body()),
        ("HIT", attack.body()),
        "cached, for that value"
    );
    let balancer = [("x-forwarded-proto", "https"), ("x-forwarded-port", "443")];
    for app in [&two, &one] {
        let plain = get_with(app, uri, &[], "").await;
        assert_eq!(
            plain.body(),
            "<a href=\"http://app.test/next\"> /page/variants "
        );
        let behind = get_with(app, uri, &balancer, "").await;
        assert_eq!(
            behind.body(),
            "<a href=\"https://app.test:443/next\"> /page/variants "
        );
    }
    assert_eq!(calls.get(), 3, "three pages, each loaded once");

    // `for=` names the client: two clients of one proxy share the page.
    let forwarded = |client: &str| format!("for={client};proto=https");
    let first = get_with(&one, uri, &[("forwarded", &forwarded("192.0.2.1"))], "").await;
    let second = get_with(&two, uri, &[("forwarded", &forwarded("192.0.2.2"))], "").await;
    assert_eq!([first.x_cache(), second.x_cache()], ["MISS", "HIT"]);

    // RFC 9111 §4.4: a POST to the URL invalidates every variant.
    let posted = send(&one, "POST", uri, &[]).await;
    assert!(posted.status.is_success());
    for (app, headers) in [(&two, &evil[..]), (&one, &balancer[..])] {
        let reloaded = get_with(app, uri, headers, "").await;
        assert_eq!(reloaded.x_cache(), "MISS", "{headers:?}");
    }
}

store_test!(forwarding_variants_per_url_are_bounded);
/// Issue 40: the forwarding variants of one URL are bounded (16 per URL in each process);
/// past the bound a new value is not stored, and says why, while the values seen are still
/// served. Issue 52: it takes a place once more requests carry it than the least used set.
async fn forwarding_variants_per_url_are_bounded(shared: Shared) {
    let calls = Counter::default();
    let [one, _] = instances(&shared, &calls, |layer| layer);
    let uri = "http://app.test/page/bounded";
    for i in 0..16 {
        let prefix = format!("/p{i}");
        let answer = get_with(&one, uri, &[("x-forwarded-prefix", &prefix)], "").await;
        assert_eq!(answer.x_cache(), "MISS", "{prefix}");
    }
    let past = get_with(&one, uri, &[("x-forwarded-prefix", "/p16")], "").await;
    assert_eq!(past.x_cache(), "BYPASS");
    assert_eq!(
        ours(&past),
        "tower-stampede; fwd=uri-miss; fwd-status=200; detail=too-many-variants"
    );
    let seen = get_with(&one, uri, &[("x-forwarded-prefix", "/p3")], "").await;
    assert_eq!(seen.x_cache(), "HIT");
    // Its second request makes it the more used: stored, in the place of a set used once.
    let again = get_with(&one, uri, &[("x-forwarded-prefix", "/p16")], "").await;
    assert_eq!(
        ours(&again),
        "tower-stampede; fwd=uri-miss; fwd-status=200; stored; ttl=60"
    );
    let hit = get_with(&one, uri, &[("x-forwarded-prefix", "/p16")], "").await;
    assert_eq!(hit.x_cache(), "HIT");
}

store_test!(a_pass_names_its_rule_in_cache_status);
/// Issue 40: a pass says which rule made it, in `Cache-Status`'s `detail` (RFC 9211 §2.8: a
/// Token).
async fn a_pass_names_its_rule_in_cache_status(shared: Shared) {
    let calls = Counter::default();
    let [one, _] = instances(&shared, &calls, |layer| {
        layer.pass_header(HeaderName::from_static("x-theme"))
    });
    let uri = "http://app.test/page/why";
    for (headers, body, detail) in [
        (
            &[("x-http-method-override", "GET")][..],
            "",
            "method-override",
        ),
        (&[], "q=1", "body"),
        (&[("x-theme", "dark")], "", "pass-header:x-theme"),
        (
            &[("x_forwarded_host", "evil.example")],
            "",
            "forwarding-header:x_forwarded_host",
        ),
    ] {
        let answer = get_with(&one, uri, headers, body).await;
        assert_eq!(
            ours(&answer),
            // RFC 9211 §2.2: "configured to not handle this request".
            format!("tower-stampede; fwd=bypass; fwd-status=200; detail={detail}"),
            "{headers:?}"
        );
    }
}

store_test!(a_purge_by_url_reaches_every_forwarding_variant);
/// Issue 40: a purge by URL reaches the URL's forwarding variants, in every process.
async fn a_purge_by_url_reaches_every_forwarding_variant(shared: Shared) {
    let calls = Counter::default();
    let layers = [0, 1].map(|_| StampedeLayer::new(shared.cache().build()));
    let purger = layers[0].purger();
    let [one, two] = layers.map(|layer| origin(&calls).layer(layer));
    let uri = "http://app.test/page/purged";
    let variants: [&[(&str, &str)]; 3] = [
        &[],
        &[("x-forwarded-host", "evil.example")],
        &[("x-forwarded-proto", "https"), ("x-forwarded-port", "443")],
    ];
    for headers in variants {
        for (app, mark) in [(&one, "MISS"), (&two, "HIT")] {
            let answer = get_with(app, uri, headers, "").await;
            assert_eq!(answer.x_cache(), mark, "{headers:?}");
        }
    }
    purger.purge_url(&uri.parse().unwrap()).await.unwrap();
    for headers in variants {
        let answer = get_with(&two, uri, headers, "").await;
        assert_eq!(answer.x_cache(), "MISS", "{headers:?}");
    }
}

store_test!(an_unstored_answer_to_an_attacker_reaches_no_other_waiter);
/// Issue 40: requests with forwarding headers share one flight per URL, whatever their
/// values; a response that is not stored but handed to the requests that waited for its load
/// (one without freshness, a server error) goes only to those with the loading request's
/// forwarding values. The attacker's request leads; the balancer's requests, on both
/// instances, wait for it and never get the attacker's page.
async fn an_unstored_answer_to_an_attacker_reaches_no_other_waiter(shared: Shared) {
    for path in ["/slow/unstored", "/slow/error"] {
        let calls = Counter::default();
        let apps = instances(&shared, &calls, |layer| layer);
        let uri = format!("http://app.test{path}");
        let evil = vec![("x-forwarded-host".to_owned(), "evil.example".to_owned())];
        let attacker = {
            let (app, uri) = (apps[0].clone(), uri.clone());
            tokio::spawn(async move { get_owned(&app, &uri, &evil).await })
        };
        // The origin takes 200 ms, so the others arrive while it loads (on paused time the
        // attacker's request runs until its origin sleeps before the clock moves 50 ms).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let victims: Vec<_> = (0..10)
            .map(|client| {
                let (app, uri) = (apps[client % 2].clone(), uri.clone());
                tokio::spawn(async move { get_owned(&app, &uri, &from_the_balancer(client)).await })
            })
            .collect();
        let attacker = attacker.await.unwrap();
        assert!(attacker.body().contains("evil.example"));
        for victim in victims {
            let victim = victim.await.unwrap();
            assert!(
                !victim.body().contains("evil.example"),
                "{path}: {} {}",
                ours(&victim),
                victim.body()
            );
            assert!(victim.body().contains("https://app.test:443/next"));
        }
    }
}
