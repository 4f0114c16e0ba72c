//! The shared-cache rules of the HTTP layer, one test per rule, each through the real
//! middleware over `MemoryStore` and (feature `redis`) a real `redis-server`.
//!
//! The origin is programmable: `/any/path?status=404&h=cache-control:max-age%3D60&echo=accept`
//! answers with that status and header, and a body naming the request and its origin call, so
//! a test tells a cached answer (same call number) from a fresh one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use axum::Router;
use bytes::Bytes;
use support::http::{get, send, send_raw, Answer};
use support::{store_test, Counter, Shared};
use tower_stampede::http::{Decision, DefaultKey, Policy, RfcPolicy};
use tower_stampede::store::StoreExt;
use tower_stampede::{Cache, StampedeLayer};

/// The origin: answers what each request's query asks for, and records what it received.
#[derive(Clone, Default)]
struct Origin {
    calls: Counter,
    seen: Arc<Mutex<Vec<(Method, HeaderMap)>>>,
    /// While set, every answer is `503` with `no-store`.
    failing: Arc<AtomicBool>,
}

impl Origin {
    fn router(&self) -> Router {
        let origin = self.clone();
        Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
            let origin = origin.clone();
            async move {
                // `first-delay=MS`: the first call is that slow (a load time for early refresh).
                let delay = query(&uri)
                    .into_iter()
                    .find(|(name, _)| name == "first-delay")
                    .map(|(_, ms)| String::from_utf8(ms).unwrap().parse().unwrap());
                if let (Some(ms), 0) = (delay, origin.calls()) {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                origin.answer(method, &uri, headers)
            }
        })
    }

    fn answer(&self, method: Method, uri: &Uri, headers: HeaderMap) -> Response<Body> {
        let n = self.calls.hit();
        self.seen
            .lock()
            .unwrap()
            .push((method.clone(), headers.clone()));
        if self.failing.load(Ordering::SeqCst) {
            let mut response = Response::new(Body::from("down"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
                .headers_mut()
                .insert("cache-control", HeaderValue::from_static("no-store"));
            return response;
        }
        let mut response = Response::new(Body::empty());
        let mut body = format!("{} {} #{n}", method, uri.path()).into_bytes();
        for (name, value) in query(uri) {
            match name.as_str() {
                "status" => {
                    *response.status_mut() =
                        StatusCode::from_bytes(&value).expect("a status in the query");
                }
                "h" => {
                    let colon = value.iter().position(|&b| b == b':').expect("h=name:value");
                    let name = HeaderName::from_bytes(&value[..colon]).expect("a header name");
                    let value = HeaderValue::from_bytes(&value[colon + 1..]).expect("a value");
                    response.headers_mut().append(name, value);
                }
                "echo" => {
                    // The request's values of a header, so variants show.
                    for v in headers.get_all(HeaderName::from_bytes(&value).unwrap()) {
                        body.extend_from_slice(b" ");
                        body.extend_from_slice(v.as_bytes());
                    }
                }
                _ => {}
            }
        }
        *response.body_mut() = Body::from(body);
        response
    }

    fn calls(&self) -> usize {
        self.calls.get()
    }

    fn last_seen(&self) -> (Method, HeaderMap) {
        self.seen.lock().unwrap().last().cloned().expect("a call")
    }
}

/// The query's pairs, percent-decoded to bytes.
fn query(uri: &Uri) -> Vec<(String, Vec<u8>)> {
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        out
    };
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (String::from_utf8(decode(name)).unwrap(), decode(value))
        })
        .collect()
}

/// A URL on the origin: `path`, then the query pairs, percent-encoded.
fn url(path: &str, pairs: &[(&str, &[u8])]) -> String {
    let mut url = format!("http://app.test{path}");
    for (i, (name, value)) in pairs.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(name);
        url.push('=');
        for &b in *value {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                url.push(char::from(b));
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
    }
    url
}

/// A query pair, its value not yet encoded.
type Pair = (&'static str, Vec<u8>);

/// `h=name:value`, the query pair that makes the origin send a header.
fn h(name: &str, value: &str) -> Vec<u8> {
    format!("{name}:{value}").into_bytes()
}

/// Two apps (two caches, so two L1s) over one store: the second app's hits come from the store.
fn apps(shared: &Shared, origin: &Origin, layer: impl Fn(Cache) -> StampedeLayer) -> [Router; 2] {
    [
        origin.router().layer(layer(shared.cache().build())),
        origin.router().layer(layer(shared.cache().build())),
    ]
}

/// Sends `uri` three times (to the first app, then to both) and returns what `x-cache` said.
async fn three_times(apps: &[Router; 2], uri: &str) -> [String; 3] {
    let mut marks = Vec::new();
    for app in [&apps[0], &apps[0], &apps[1]] {
        marks.push(get(app, uri).await.x_cache().to_owned());
    }
    marks.try_into().unwrap()
}

const CACHED: [&str; 3] = ["MISS", "HIT", "HIT"];
const PASSED: [&str; 3] = ["BYPASS", "BYPASS", "BYPASS"];

store_test!(statuses_are_stored_with_explicit_freshness_or_a_default_ttl);
async fn statuses_are_stored_with_explicit_freshness_or_a_default_ttl(shared: Shared) {
    let origin = Origin::default();
    let strict = apps(&shared, &origin, StampedeLayer::new);
    let heuristic = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).policy(RfcPolicy::new().default_ttl(Duration::from_secs(60)))
    });
    let fresh = h("cache-control", "max-age=60");
    for status in [
        "200", "203", "204", "300", "301", "308", "404", "405", "410", "414", "501",
    ] {
        let s = status.as_bytes();
        let bare = url(&format!("/strict/{status}"), &[("status", s)]);
        assert_eq!(three_times(&strict, &bare).await, PASSED, "{status}");
        let with = url(&format!("/fresh/{status}"), &[("status", s), ("h", &fresh)]);
        assert_eq!(three_times(&strict, &with).await, CACHED, "{status}");
        let default = url(&format!("/default/{status}"), &[("status", s)]);
        assert_eq!(
            three_times(&heuristic, &default).await,
            CACHED,
            "{status} with a default TTL"
        );
    }
    // Other statuses: only with explicit freshness, never by default.
    for status in ["302", "307", "400", "403"] {
        let s = status.as_bytes();
        let default = url(&format!("/default/{status}"), &[("status", s)]);
        assert_eq!(three_times(&heuristic, &default).await, PASSED, "{status}");
        let with = url(&format!("/fresh/{status}"), &[("status", s), ("h", &fresh)]);
        assert_eq!(three_times(&strict, &with).await, CACHED, "{status}");
    }
    // Never: answers for one request.
    for status in ["206", "304"] {
        let with = url(
            &format!("/fresh/{status}"),
            &[("status", status.as_bytes()), ("h", &fresh)],
        );
        assert_eq!(three_times(&heuristic, &with).await, PASSED, "{status}");
    }
    // A server error with explicit freshness is stored like any response.
    let error = url("/fresh/503", &[("status", b"503"), ("h", &fresh)]);
    assert_eq!(
        three_times(&strict, &error).await,
        CACHED,
        "503 with max-age"
    );
}

store_test!(ttl_comes_from_s_maxage_then_max_age_then_expires_then_the_default);
async fn ttl_comes_from_s_maxage_then_max_age_then_expires_then_the_default(shared: Shared) {
    let origin = Origin::default();
    let cache = shared.cache().build();
    let policy = RfcPolicy::new().default_ttl(Duration::from_secs(45));
    let app = origin
        .router()
        .layer(StampedeLayer::new(cache.clone()).policy(policy));
    let date = "Sun, 06 Nov 1994 08:49:37 GMT";
    let in_an_hour = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    let cases: [(&str, Vec<Pair>, u64); 6] = [
        (
            "s-maxage",
            vec![("h", h("cache-control", "max-age=600, s-maxage=300"))],
            300,
        ),
        (
            "max-age",
            vec![("h", h("cache-control", "max-age=600"))],
            600,
        ),
        (
            "max-age over Expires",
            vec![
                ("h", h("cache-control", "max-age=600")),
                ("h", h("expires", date)),
            ],
            600,
        ),
        // Expires less Date: 30 s, though both are long past by our clock.
        (
            "Expires - Date",
            vec![
                ("h", h("date", date)),
                ("h", h("expires", "Sun, 06 Nov 1994 08:50:07 GMT")),
            ],
            30,
        ),
        (
            "Expires - now",
            vec![("h", h("expires", &in_an_hour))],
            3600,
        ),
        ("default", vec![], 45),
    ];
    for (name, pairs, want) in cases {
        let path = format!("/ttl/{}", name.replace(' ', "-"));
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let uri = url(&path, &pairs);
        assert_eq!(get(&app, &uri).await.x_cache(), "MISS", "{name}");
        let key = DefaultKey.key(&Request::get(&uri).body(()).unwrap().into_parts().0);
        let stored = shared
            .store
            .get(&cache.store_key(key))
            .await
            .unwrap()
            .expect("stored");
        let ttl = stored.ttl.expect("a TTL").as_secs_f64();
        let want = want as f64;
        // The store rounds down; the test may take a few seconds on a busy machine.
        assert!(
            ttl <= want && ttl > want - 30.0,
            "{name}: {ttl} s, want {want} s"
        );
    }
    // An Expires that is not a date is in the past, and already expired is not stored.
    for expires in ["0", date] {
        let uri = url("/ttl/expired", &[("h", &h("expires", expires))]);
        assert_eq!(get(&app, &uri).await.x_cache(), "BYPASS", "{expires}");
    }
}

store_test!(what_is_never_stored);
async fn what_is_never_stored(shared: Shared) {
    let origin = Origin::default();
    let policy = RfcPolicy::new().default_ttl(Duration::from_secs(60));
    let apps = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).policy(policy.clone())
    });
    for (i, header) in [
        h("cache-control", "no-store, max-age=60"),
        h("cache-control", "private, max-age=60"),
        h("cache-control", "private=\"x-user\", max-age=60"),
        h("cache-control", "no-cache, max-age=60"),
        h("cache-control", "no-cache=\"set-cookie\", max-age=60"),
        h("set-cookie", "session=secret"),
        h("vary", "*"),
        h("vary", "accept, *"),
    ]
    .iter()
    .enumerate()
    {
        let uri = url(
            &format!("/never/{i}"),
            &[("h", header), ("h", &h("cache-control", "public"))],
        );
        let before = origin.calls();
        assert_eq!(
            three_times(&apps, &uri).await,
            PASSED,
            "{}",
            String::from_utf8_lossy(header)
        );
        assert_eq!(
            origin.calls() - before,
            3,
            "every request reaches the origin"
        );
    }
}

store_test!(authorization_needs_the_response_to_allow_it_and_is_keyed_apart);
async fn authorization_needs_the_response_to_allow_it_and_is_keyed_apart(shared: Shared) {
    let origin = Origin::default();
    let app = origin
        .router()
        .layer(StampedeLayer::new(shared.cache().build()));
    let as_ = |user: &'static str| [("authorization", user)];
    // Not allowed by the response: every authorized request reaches the origin, and
    // anonymous requests for the URL are cached all the same (not held up by a pass).
    let private = url("/auth/plain", &[("h", &h("cache-control", "max-age=60"))]);
    for _ in 0..2 {
        let answer = send(&app, Method::GET, &private, &as_("Bearer a")).await;
        assert_eq!(answer.x_cache(), "BYPASS");
    }
    assert_eq!(get(&app, &private).await.x_cache(), "MISS");
    assert_eq!(get(&app, &private).await.x_cache(), "HIT");
    assert_eq!(origin.calls(), 3);
    // Allowed by `public`, `s-maxage` or `must-revalidate`: shared among authorized
    // requests, never given to anonymous ones.
    for cc in [
        "public, max-age=60",
        "s-maxage=60",
        "must-revalidate, max-age=60",
    ] {
        let uri = url("/auth/allowed", &[("h", &h("cache-control", cc))]);
        let first = send(&app, Method::GET, &uri, &as_("Bearer a")).await;
        assert_eq!(first.x_cache(), "MISS", "{cc}");
        let other = send(&app, Method::GET, &uri, &as_("Bearer b")).await;
        assert_eq!(
            (other.x_cache(), other.body()),
            ("HIT", first.body()),
            "{cc}"
        );
        let anonymous = get(&app, &uri).await;
        assert_eq!(anonymous.x_cache(), "MISS", "{cc}");
        assert_ne!(anonymous.body(), first.body(), "{cc}");
    }
    // Opted in: authorized responses are stored without the response's permission.
    let shared_app = origin.router().layer(
        StampedeLayer::new(shared.cache().build()).policy(RfcPolicy::new().share_authorized(true)),
    );
    let uri = url(
        "/auth/opted-in",
        &[("h", &h("cache-control", "max-age=60"))],
    );
    let first = send(&shared_app, Method::GET, &uri, &as_("Bearer a")).await;
    let second = send(&shared_app, Method::GET, &uri, &as_("Bearer b")).await;
    assert_eq!([first.x_cache(), second.x_cache()], ["MISS", "HIT"]);
    assert_eq!(get(&shared_app, &uri).await.x_cache(), "MISS");
}

store_test!(request_no_store_bypasses_and_client_no_cache_is_honoured_only_when_configured);
async fn request_no_store_bypasses_and_client_no_cache_is_honoured_only_when_configured(
    shared: Shared,
) {
    let origin = Origin::default();
    let uri = url("/client", &[("h", &h("cache-control", "max-age=60"))]);
    let plain = origin
        .router()
        .layer(StampedeLayer::new(shared.cache().build()));
    let honouring = origin
        .router()
        .layer(StampedeLayer::new(shared.cache().build()).honor_client_no_cache(true));
    assert_eq!(get(&plain, &uri).await.x_cache(), "MISS");
    let no_store = send(&plain, Method::GET, &uri, &[("cache-control", "no-store")]).await;
    assert_eq!(no_store.x_cache(), "BYPASS");
    for reload in [
        [("cache-control", "no-cache")],
        [("cache-control", "max-age=0")],
        [("pragma", "no-cache")],
    ] {
        let ignored = send(&plain, Method::GET, &uri, &reload).await;
        assert_eq!(ignored.x_cache(), "HIT", "{reload:?} ignored");
        let honoured = send(&honouring, Method::GET, &uri, &reload).await;
        assert_eq!(honoured.x_cache(), "BYPASS", "{reload:?} honoured");
    }
    // Honoured reloads went to the origin and left the entry alone.
    assert_eq!(origin.calls(), 5);
    assert_eq!(get(&honouring, &uri).await.x_cache(), "HIT");
}

store_test!(head_is_answered_from_the_get_entry_and_a_miss_loads_with_get);
async fn head_is_answered_from_the_get_entry_and_a_miss_loads_with_get(shared: Shared) {
    let origin = Origin::default();
    let [a, b] = apps(&shared, &origin, StampedeLayer::new);
    let uri = url("/head", &[("h", &h("cache-control", "max-age=60"))]);
    let head = send(&a, Method::HEAD, &uri, &[]).await;
    assert_eq!((head.status, head.x_cache()), (StatusCode::OK, "MISS"));
    assert!(head.body.is_empty(), "no body");
    assert_eq!(origin.last_seen().0, Method::GET, "loaded with GET");
    let get_answer = get(&b, &uri).await;
    assert_eq!(get_answer.x_cache(), "HIT", "the HEAD filled the GET entry");
    assert_eq!(get_answer.body(), "GET /head #1");
    let without_marks = |mut headers: HeaderMap| {
        headers.remove("x-cache");
        headers.remove("cache-status");
        headers.remove("age");
        headers
    };
    assert_eq!(
        without_marks(head.headers.clone()),
        without_marks(get_answer.headers.clone()),
        "HEAD has the GET's headers"
    );
    let again = send(&b, Method::HEAD, &uri, &[]).await;
    assert_eq!(again.x_cache(), "HIT");
    assert!(again.body.is_empty());
    assert_eq!(origin.calls(), 1);
    // A HEAD whose response is not stored: passed, still without a body.
    let uncacheable = url("/head-private", &[("h", &h("cache-control", "private"))]);
    let head = send(&a, Method::HEAD, &uncacheable, &[]).await;
    assert_eq!(head.x_cache(), "BYPASS");
    assert!(head.body.is_empty());
}

store_test!(vary_keys_variants_by_the_named_request_headers);
async fn vary_keys_variants_by_the_named_request_headers(shared: Shared) {
    let origin = Origin::default();
    let [a, b] = apps(&shared, &origin, StampedeLayer::new);
    let uri = url(
        "/vary",
        &[
            ("h", &h("cache-control", "max-age=60")),
            ("h", &h("vary", "Accept-Encoding")),
            ("echo", b"accept-encoding"),
        ],
    );
    let ask = |app: &Router, encoding: Option<&'static str>| {
        let (app, uri) = (app.clone(), uri.clone());
        async move {
            let headers: Vec<(&str, &str)> = encoding
                .map(|e| ("accept-encoding", e))
                .into_iter()
                .collect();
            let answer = send(&app, Method::GET, &uri, &headers).await;
            (answer.x_cache().to_owned(), answer.body().to_owned())
        }
    };
    let gzip = ("MISS".to_owned(), "GET /vary #1 gzip".to_owned());
    assert_eq!(ask(&a, Some("gzip")).await, gzip);
    let identity = ask(&a, Some("identity")).await;
    assert_eq!(
        identity,
        ("MISS".to_owned(), "GET /vary #2 identity".to_owned())
    );
    let hit = |(_, body): (String, String)| ("HIT".to_owned(), body);
    for app in [&a, &b] {
        assert_eq!(ask(app, Some("gzip")).await, hit(gzip.clone()));
        assert_eq!(
            ask(app, Some("  gzip ")).await,
            hit(gzip.clone()),
            "trimmed"
        );
        assert_eq!(ask(app, Some("identity")).await, hit(identity.clone()));
    }
    let none = ask(&b, None).await;
    assert_eq!(
        none,
        ("MISS".to_owned(), "GET /vary #3".to_owned()),
        "absent"
    );
    let empty = ask(&b, Some("")).await;
    assert_eq!(empty.0, "MISS", "empty differs from absent");
    assert_eq!(origin.calls(), 4);
}

store_test!(a_stampede_on_a_varying_url_loads_once_per_variant);
async fn a_stampede_on_a_varying_url_loads_once_per_variant(shared: Shared) {
    let origin = Origin::default();
    let apps = apps(&shared, &origin, StampedeLayer::new);
    let uri = url(
        "/vary-stampede",
        &[
            ("h", &h("cache-control", "max-age=60")),
            ("h", &h("vary", "accept-encoding")),
            ("echo", b"accept-encoding"),
        ],
    );
    let mut requests = Vec::new();
    for i in 0..200 {
        let (app, uri) = (apps[i % 2].clone(), uri.clone());
        let encoding = if i % 3 == 0 { "gzip" } else { "identity" };
        requests.push(tokio::spawn(async move {
            let answer = send(&app, Method::GET, &uri, &[("accept-encoding", encoding)]).await;
            (
                encoding,
                answer.x_cache().to_owned(),
                answer.body().to_owned(),
            )
        }));
    }
    for request in requests {
        let (encoding, mark, body) = request.await.unwrap();
        assert!(matches!(mark.as_str(), "MISS" | "HIT"), "{mark}");
        assert!(
            body.ends_with(&format!(" {encoding}")),
            "{body} for {encoding}"
        );
    }
    assert_eq!(origin.calls(), 2, "one load per variant");
}

store_test!(hostile_vary_is_passed_and_thousands_of_request_values_are_keyed);
async fn hostile_vary_is_passed_and_thousands_of_request_values_are_keyed(shared: Shared) {
    let origin = Origin::default();
    let apps = apps(&shared, &origin, StampedeLayer::new);
    let fresh = h("cache-control", "max-age=60");
    // Thousands of names in one field, and thousands of fields: not keyable, passed.
    let names: Vec<String> = (0..3000).map(|i| format!("x-h{i}")).collect();
    let one_field = url(
        "/vary/many",
        &[("h", &fresh), ("h", &h("vary", &names.join(",")))],
    );
    assert_eq!(three_times(&apps, &one_field).await, PASSED);
    let fields: Vec<Vec<u8>> = names.iter().map(|n| h("vary", n)).collect();
    let mut pairs: Vec<(&str, &[u8])> = vec![("h", &fresh)];
    pairs.extend(fields.iter().map(|f| ("h", f.as_slice())));
    let many_fields = url("/vary/fields", &pairs);
    assert_eq!(three_times(&apps, &many_fields).await, PASSED);
    // 17 names is one too many; 16 are keyed.
    let seventeen = url(
        "/vary/17",
        &[("h", &fresh), ("h", &h("vary", &names[..17].join(",")))],
    );
    assert_eq!(three_times(&apps, &seventeen).await, PASSED);
    let sixteen = url(
        "/vary/16",
        &[("h", &fresh), ("h", &h("vary", &names[..16].join(",")))],
    );
    assert_eq!(three_times(&apps, &sixteen).await, CACHED);
    // A request with thousands of values of a varied field: one long key, hashed.
    let uri = url(
        "/vary/values",
        &[("h", &fresh), ("h", &h("vary", "accept"))],
    );
    let values: Vec<String> = (0..5000).map(|i| format!("type/{i}")).collect();
    let headers: Vec<(&str, &str)> = values.iter().map(|v| ("accept", v.as_str())).collect();
    let first = send(&apps[0], Method::GET, &uri, &headers).await;
    let second = send(&apps[1], Method::GET, &uri, &headers).await;
    assert_eq!([first.x_cache(), second.x_cache()], ["MISS", "HIT"]);
    let fewer = send(&apps[1], Method::GET, &uri, &headers[..4999]).await;
    assert_eq!(fewer.x_cache(), "MISS", "another variant");
}

store_test!(age_counts_from_generation_and_hop_by_hop_headers_are_not_stored);
async fn age_counts_from_generation_and_hop_by_hop_headers_are_not_stored(shared: Shared) {
    let origin = Origin::default();
    let cache = shared.cache().build();
    let [a, b] = [
        origin.router().layer(StampedeLayer::new(cache.clone())),
        origin
            .router()
            .layer(StampedeLayer::new(shared.cache().build())),
    ];
    // Arrived 100 s old, fresh for 600 s from generation: 500 s left, Age from 100.
    let uri = url(
        "/age",
        &[
            ("h", &h("cache-control", "max-age=600")),
            ("h", &h("age", "100")),
            ("h", &h("connection", "x-secret")),
            ("h", &h("x-secret", "1")),
            ("h", &h("keep-alive", "timeout=5")),
            ("h", &h("x-kept", "yes")),
        ],
    );
    let first = get(&a, &uri).await;
    assert_eq!(first.x_cache(), "MISS");
    for (answer, source) in [
        (first, "own load"),
        (get(&a, &uri).await, "L1"),
        (get(&b, &uri).await, "store"),
    ] {
        let age = answer.age().expect("Age");
        // Lower bound exact; the upper one only says it is not counted from 0 or 600.
        assert!((100..400).contains(&age), "{source}: Age {age}");
        for name in ["connection", "x-secret", "keep-alive"] {
            assert!(
                !answer.headers.contains_key(name),
                "{source}: {name} stored"
            );
        }
        assert_eq!(answer.headers["x-kept"], "yes");
    }
    let key = DefaultKey.key(&Request::get(&uri).body(()).unwrap().into_parts().0);
    let ttl = shared
        .store
        .get(&cache.store_key(key))
        .await
        .unwrap()
        .unwrap()
        .ttl
        .unwrap();
    assert!(ttl <= Duration::from_secs(500), "{ttl:?}");
    // Every answer from an entry carries Age; answers passed through do not get one.
    let plain = url("/age/plain", &[("h", &h("cache-control", "max-age=60"))]);
    assert!(get(&a, &plain).await.age().is_some());
    assert!(get(&b, &plain).await.age().is_some());
    let passed = url("/age/passed", &[("h", &h("cache-control", "no-store"))]);
    assert_eq!(get(&a, &passed).await.age(), None);
}

store_test!(make_key_and_policy_are_replaceable);
async fn make_key_and_policy_are_replaceable(shared: Shared) {
    let origin = Origin::default();
    let by_tenant = |request: &axum::http::request::Parts| {
        let tenant = request.headers.get("x-tenant")?.to_str().ok()?;
        Some(format!("{}\0tenant={tenant}", DefaultKey.key(request)))
    };
    let app = origin
        .router()
        .layer(StampedeLayer::new(shared.cache().build()).make_key(by_tenant));
    let uri = url("/tenant", &[("h", &h("cache-control", "max-age=60"))]);
    let tenant = |t: &'static str| [("x-tenant", t)];
    let a = send(&app, Method::GET, &uri, &tenant("a")).await;
    let b = send(&app, Method::GET, &uri, &tenant("b")).await;
    let a2 = send(&app, Method::GET, &uri, &tenant("a")).await;
    assert_eq!(
        [a.x_cache(), b.x_cache(), a2.x_cache()],
        ["MISS", "MISS", "HIT"]
    );
    assert_eq!(a2.body(), a.body());
    // No tenant: the key says None, the request bypasses.
    assert_eq!(get(&app, &uri).await.x_cache(), "BYPASS");

    // A policy that stores temporary redirects, and defers to the RFC otherwise.
    let rfc = RfcPolicy::new();
    let policy = move |request: &axum::http::request::Parts,
                       response: &axum::http::response::Parts| {
        if response.status == StatusCode::FOUND {
            Decision::Store(Duration::from_secs(30))
        } else {
            rfc.decide(request, response)
        }
    };
    let apps = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).policy(policy.clone())
    });
    let redirect = url(
        "/redirect",
        &[("status", b"302"), ("h", &h("location", "/elsewhere"))],
    );
    assert_eq!(three_times(&apps, &redirect).await, CACHED);
    let plain = url("/no-freshness", &[]);
    assert_eq!(three_times(&apps, &plain).await, PASSED);
}

store_test!(conditional_requests_are_answered_304_from_the_entry);
async fn conditional_requests_are_answered_304_from_the_entry(shared: Shared) {
    let origin = Origin::default();
    let [a, b] = apps(&shared, &origin, StampedeLayer::new);
    let modified = "Wed, 21 Oct 2015 07:28:00 GMT";
    let uri = url(
        "/conditional",
        &[
            ("h", &h("cache-control", "max-age=60")),
            ("h", &h("etag", "W/\"v1\"")),
            ("h", &h("last-modified", modified)),
        ],
    );
    // A cold conditional request loads the full response (without its precondition),
    // stores it, and is answered 304.
    let first = send(&a, Method::GET, &uri, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(
        (first.status, first.x_cache()),
        (StatusCode::NOT_MODIFIED, "MISS")
    );
    assert!(first.body.is_empty());
    assert_eq!(first.headers["etag"], "W/\"v1\"");
    assert_eq!(first.headers["cache-control"], "max-age=60");
    assert!(first.age().is_some());
    // The length the 200 has, as RFC 9110 §8.6 allows in a 304.
    assert_eq!(
        first.headers["content-length"],
        "GET /conditional #1".len().to_string()
    );
    let (_, sent) = origin.last_seen();
    assert!(
        !sent.contains_key("if-none-match"),
        "the origin got no precondition"
    );
    let cases: [(&[(&str, &str)], StatusCode); 8] = [
        (&[("if-none-match", "W/\"v1\"")], StatusCode::NOT_MODIFIED),
        (
            &[("if-none-match", "\"v0\", \"v1\"")],
            StatusCode::NOT_MODIFIED,
        ),
        (&[("if-none-match", "*")], StatusCode::NOT_MODIFIED),
        (&[("if-none-match", "\"v2\"")], StatusCode::OK),
        (&[("if-none-match", "v1")], StatusCode::OK),
        (&[("if-modified-since", modified)], StatusCode::NOT_MODIFIED),
        (
            &[("if-modified-since", "Tue, 20 Oct 2015 07:28:00 GMT")],
            StatusCode::OK,
        ),
        (
            &[("if-none-match", "\"v2\""), ("if-modified-since", modified)],
            StatusCode::OK,
        ),
    ];
    for (headers, want) in cases {
        for app in [&a, &b] {
            let answer = send(app, Method::GET, &uri, headers).await;
            assert_eq!(
                (answer.status, answer.x_cache()),
                (want, "HIT"),
                "{headers:?}"
            );
            if want == StatusCode::OK {
                assert_eq!(answer.body(), "GET /conditional #1");
            }
        }
    }
    let head = send(&b, Method::HEAD, &uri, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(head.status, StatusCode::NOT_MODIFIED);
    assert_eq!(origin.calls(), 1);
    // Ranges are the origin's to answer.
    let range = send(&a, Method::GET, &uri, &[("range", "bytes=0-3")]).await;
    assert_eq!(range.x_cache(), "BYPASS");
}

store_test!(corrupt_entries_are_a_counted_miss_and_overwritten);
async fn corrupt_entries_are_a_counted_miss_and_overwritten(shared: Shared) {
    let origin = Origin::default();
    let entries: [(&str, &[u8]); 4] = [
        ("foreign", b"hello, I am not yours"),
        // The engine's own framing around bytes that are not an HTTP entry.
        ("not-http", b"TS\x01\x00\x00\x00\x00\x07garbage"),
        // An entry of the codec's first version (status 200, no headers, no body).
        (
            "old-version",
            b"TS\x01\x00\x00\x00\x00\x07\x01\x00\xc8\x00\x00",
        ),
        // A truncated HTTP entry.
        ("truncated", b"TS\x01\x00\x00\x00\x00\x07\x02\x00\x00\x00"),
    ];
    for (name, bytes) in entries {
        let cache = shared.cache().build();
        let app = origin.router().layer(StampedeLayer::new(cache.clone()));
        let other = origin
            .router()
            .layer(StampedeLayer::new(shared.cache().build()));
        let uri = url(
            &format!("/corrupt/{name}"),
            &[("h", &h("cache-control", "max-age=60"))],
        );
        let key =
            cache.store_key(DefaultKey.key(&Request::get(&uri).body(()).unwrap().into_parts().0));
        shared
            .store
            .put(&key, Bytes::from_static(bytes), Duration::from_secs(60))
            .await
            .unwrap();
        let before = origin.calls();
        let answer = get(&app, &uri).await;
        assert_eq!(
            (answer.status, answer.x_cache()),
            (StatusCode::OK, "MISS"),
            "{name}"
        );
        assert_eq!(cache.stats().corrupt_entries, 1, "{name}: counted");
        assert_eq!(origin.calls() - before, 1, "{name}");
        // Overwritten: another process reads the new entry from the store.
        let again = get(&other, &uri).await;
        assert_eq!(
            (again.x_cache(), again.body()),
            ("HIT", answer.body()),
            "{name}"
        );
        let stored = shared.store.get(&key).await.unwrap().unwrap();
        assert_ne!(stored.bytes, Bytes::from_static(bytes), "{name}");
    }
}

store_test!(long_urls_and_invalid_header_bytes_have_a_clear_outcome);
async fn long_urls_and_invalid_header_bytes_have_a_clear_outcome(shared: Shared) {
    let origin = Origin::default();
    let apps = apps(&shared, &origin, StampedeLayer::new);
    let fresh = h("cache-control", "max-age=60");
    // The longest URL `http` holds (64 KB) is cached like any other.
    let long = format!(
        "{}&pad={}",
        url("/long", &[("h", &fresh)]),
        "x".repeat(66_000)
    );
    let long = &long[..65_534];
    assert_eq!(three_times(&apps, long).await, CACHED);

    // Request bytes that are not ASCII: a varied field, `Host`, `Cache-Control` and
    // `If-None-Match` are read as bytes or ignored, never a panic.
    let varied = url(
        "/bytes/vary",
        &[("h", &fresh), ("h", &h("vary", "accept-language"))],
    );
    let odd: &[u8] = b"fr\xff\x80";
    let first = send_raw(&apps[0], Method::GET, &varied, &[("accept-language", odd)]).await;
    let second = send_raw(&apps[1], Method::GET, &varied, &[("accept-language", odd)]).await;
    let plain = send_raw(
        &apps[1],
        Method::GET,
        &varied,
        &[("accept-language", b"fr")],
    )
    .await;
    assert_eq!(
        [first.x_cache(), second.x_cache(), plain.x_cache()],
        ["MISS", "HIT", "MISS"]
    );
    let origin_form = "/bytes/host?h=cache-control%3Amax-age%3D60";
    for (i, app) in [&apps[0], &apps[1]].into_iter().enumerate() {
        let answer = send_raw(app, Method::GET, origin_form, &[("host", b"h\xffst")]).await;
        assert_eq!(answer.x_cache(), ["MISS", "HIT"][i], "Host");
    }
    let cc = send_raw(
        &apps[0],
        Method::GET,
        long,
        &[("cache-control", b"no-store\xff")],
    )
    .await;
    assert_eq!(
        cc.x_cache(),
        "HIT",
        "an unreadable Cache-Control is ignored"
    );
    let inm = send_raw(
        &apps[0],
        Method::GET,
        long,
        &[("if-none-match", b"\"\xff\"")],
    )
    .await;
    assert_eq!((inm.status, inm.x_cache()), (StatusCode::OK, "HIT"));

    // Response bytes that are not ASCII in the fields that decide: not stored.
    let unreadable_cc = h("cache-control", "max-age=60, x=\u{ff}");
    let unreadable_vary = b"vary:accept\xff".to_vec();
    let not_a_date = h("expires", "the day after tomorrow");
    for (i, pairs) in [
        vec![("h", unreadable_cc.as_slice())],
        vec![("h", fresh.as_slice()), ("h", unreadable_vary.as_slice())],
        vec![("h", not_a_date.as_slice())],
    ]
    .iter()
    .enumerate()
    {
        let uri = url(&format!("/bytes/response/{i}"), pairs);
        assert_eq!(three_times(&apps, &uri).await, PASSED, "{i}");
    }
}

store_test!(
    a_100_kb_url_is_refused_by_the_server_before_the_layer,
    real_time = "the app is served by axum::serve on a loopback socket: on paused time, a wait \
                 on the socket lets the runtime jump to its next timer (store timeouts, the \
                 engine's waits), and the run would turn on when the kernel hands bytes over"
);
async fn a_100_kb_url_is_refused_by_the_server_before_the_layer(shared: Shared) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::default();
    let app = origin
        .router()
        .layer(StampedeLayer::new(shared.cache().build()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let exchange = |path: String| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8_lossy(&response).into_owned()
    };
    let long = format!("/long?pad={}", "x".repeat(100_000));
    let refused = exchange(long).await;
    assert!(
        refused.starts_with("HTTP/1.1 414"),
        "{}",
        &refused[..refused.len().min(80)]
    );
    assert_eq!(origin.calls(), 0);
    // The server and the layer go on serving.
    let ok = exchange("/after?h=cache-control%3Amax-age%3D60".to_owned()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.to_ascii_lowercase().contains("x-cache: miss"), "{ok}");
    server.abort();
}

store_test!(stale_variants_are_served_while_refreshing_and_in_place_of_errors);
async fn stale_variants_are_served_while_refreshing_and_in_place_of_errors(shared: Shared) {
    let origin = Origin::default();
    let cache = Cache::builder_shared(Arc::clone(&shared.store))
        .namespace("http-stale-vary")
        .stale(Duration::from_secs(60))
        .early_refresh(0.0)
        .build();
    let app = origin.router().layer(StampedeLayer::new(cache));
    let uri = url(
        "/stale-vary",
        &[
            ("h", &h("cache-control", "max-age=1")),
            ("h", &h("vary", "accept-encoding")),
            ("echo", b"accept-encoding"),
        ],
    );
    let gzip = [("accept-encoding", "gzip")];
    let first = send(&app, Method::GET, &uri, &gzip).await;
    assert_eq!(
        (first.x_cache(), first.body()),
        ("MISS", "GET /stale-vary #1 gzip")
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Stale at once, or (if the marker's refresh took this request) the refreshed one.
    let stale = send(&app, Method::GET, &uri, &gzip).await;
    assert!(
        matches!(
            (stale.x_cache(), stale.body()),
            ("STALE", "GET /stale-vary #1 gzip") | ("MISS", "GET /stale-vary #2 gzip")
        ),
        "{} {}",
        stale.x_cache(),
        stale.body()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let refreshed = loop {
        let answer = send(&app, Method::GET, &uri, &gzip).await;
        assert_eq!(answer.status, StatusCode::OK);
        // Refreshed: a later load's variant, from the cache (under a slow machine, its
        // one second of freshness may pass before this loop looks, and bring a third).
        if answer.body() != "GET /stale-vary #1 gzip" && answer.x_cache() == "HIT" {
            break answer.body().to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The origin fails: the stale variant stands in for it, never the 503.
    origin.failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for _ in 0..3 {
        let answer = send(&app, Method::GET, &uri, &gzip).await;
        assert_eq!(
            (answer.status, answer.x_cache(), answer.body()),
            (StatusCode::OK, "STALE", refreshed.as_str())
        );
    }
}

store_test!(a_marker_restored_while_the_store_stalls_its_read_waits_only_the_store_timeout);
/// A stale vary marker whose request went to its variant's load (the variant was not
/// stored) is stored again by the URL's loader without a request, after one store read: is
/// the marker still the one this request followed? That read is bounded as the engine's own
/// are: a store that never answers it (a Redis that froze between the lookup and the read)
/// costs `store_timeout`, then a new generation is stored, which is always safe. Unbounded,
/// the read hung the marker's refresh (its lock held and renewed) until `load_timeout`.
async fn a_marker_restored_while_the_store_stalls_its_read_waits_only_the_store_timeout(
    shared: Shared,
) {
    let origin = Origin::default();
    let observed = support::observed::Observed::new(&shared.store, Duration::ZERO);
    let store: Arc<dyn tower_stampede::store::Store> = observed.clone();
    let cache = Cache::builder_shared(store)
        .namespace("http-restore-stalled")
        .stale(Duration::from_secs(60))
        .early_refresh(0.0)
        .store_timeout(Duration::from_millis(500))
        .load_timeout(Duration::from_secs(600))
        .build();
    let app = origin.router().layer(StampedeLayer::new(cache));
    let uri = url(
        "/restore-stalled",
        &[
            ("h", &h("cache-control", "max-age=1")),
            ("h", &h("vary", "accept-encoding")),
            ("echo", b"accept-encoding"),
        ],
    );
    let gzip = [("accept-encoding", "gzip")];
    assert_eq!(send(&app, Method::GET, &uri, &gzip).await.x_cache(), "MISS");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // The marker is stale and this request's variant not stored: its load takes the
    // request, and the marker's refresh restores the marker, reading it first; the read
    // never answers.
    observed.hang_reads(true);
    let fills = observed.fills();
    let answer = send(&app, Method::GET, &uri, &[("accept-encoding", "br")]).await;
    assert_eq!(
        (answer.status, answer.body()),
        (StatusCode::OK, "GET /restore-stalled #2 br")
    );
    support::wait_until("the marker is stored again past its stalled read", || {
        observed.fills() >= fills + 2
    })
    .await;
    observed.hang_reads(false);
    assert_eq!(origin.calls.get(), 2, "the marker was restored, not loaded");
}

store_test!(a_varying_hot_page_is_refreshed_early_and_always_answered);
async fn a_varying_hot_page_is_refreshed_early_and_always_answered(shared: Shared) {
    let origin = Origin::default();
    // A slow first load (300 ms) and beta 3: refreshes come well before the second of
    // freshness ends, for the marker and for the variant.
    let cache = Cache::builder_shared(Arc::clone(&shared.store))
        .namespace("http-early-vary")
        .early_refresh(3.0)
        .build();
    let app = origin.router().layer(StampedeLayer::new(cache));
    let uri = url(
        "/early-vary",
        &[
            ("h", &h("cache-control", "max-age=1")),
            ("h", &h("vary", "accept-encoding")),
            ("echo", b"accept-encoding"),
            ("first-delay", b"300"),
        ],
    );
    let gzip = [("accept-encoding", "gzip")];
    let mut last = 0;
    // Past two freshness lifetimes of the first response.
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    while tokio::time::Instant::now() < until {
        let answer = send(&app, Method::GET, &uri, &gzip).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(
            matches!(answer.x_cache(), "MISS" | "HIT"),
            "{}",
            answer.x_cache()
        );
        let body = answer.body();
        assert!(body.ends_with(" gzip"), "{body}");
        let n: usize = body
            .trim_start_matches("GET /early-vary #")
            .trim_end_matches(" gzip")
            .parse()
            .unwrap();
        assert!(n >= last, "went back from #{last} to #{n}");
        last = n;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(last >= 2, "refreshed");
}

store_test!(targeted_fields_outrank_cache_control_rfc_9213);
/// RFC 9213 §2.1: the first targeted field on the cache's list that is valid and not empty
/// decides (the operator's own field, then `CDN-Cache-Control`), and `Cache-Control` and
/// `Expires` are then ignored for this cache; §2.2: an invalid one is ignored itself. The
/// targeted fields are forwarded downstream unchanged.
async fn targeted_fields_outrank_cache_control_rfc_9213(shared: Shared) {
    let origin = Origin::default();
    let strict = apps(&shared, &origin, StampedeLayer::new);
    let own = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).policy(
            RfcPolicy::new().targeted_field(HeaderName::from_static("stampede-cache-control")),
        )
    });
    let cdn = |value: &str| h("cdn-cache-control", value);
    let cc = |value: &str| h("cache-control", value);
    let cases: [(&str, Vec<Pair>, [&str; 3]); 5] = [
        (
            "/cdn-stores",
            vec![("h", cdn("max-age=60")), ("h", cc("no-store"))],
            CACHED,
        ),
        (
            "/cdn-forbids",
            vec![("h", cdn("no-store")), ("h", cc("max-age=60"))],
            PASSED,
        ),
        (
            "/cdn-invalid",
            vec![("h", cdn("max-age=\"60")), ("h", cc("max-age=60"))],
            CACHED,
        ),
        (
            "/cdn-private",
            vec![("h", cdn("private")), ("h", cc("public, max-age=60"))],
            PASSED,
        ),
        (
            "/cdn-ignores-expires",
            vec![
                ("h", cdn("public")),
                (
                    "h",
                    h(
                        "expires",
                        &httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(600)),
                    ),
                ),
            ],
            PASSED,
        ),
    ];
    for (path, pairs, want) in &cases {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let uri = url(path, &pairs);
        let calls = origin.calls();
        assert_eq!(three_times(&strict, &uri).await, *want, "{path}");
        let loads = if *want == CACHED { 1 } else { 3 };
        assert_eq!(origin.calls(), calls + loads, "{path}");
    }
    // The operator's own field outranks CDN-Cache-Control, for the caches told of it only.
    let both = url(
        "/own",
        &[
            ("h", &h("stampede-cache-control", "no-store")),
            ("h", &cdn("max-age=60")),
        ],
    );
    assert_eq!(three_times(&own, &both).await, PASSED);
    // (Another URL: the first one's key holds a "pass" marker now.)
    let elsewhere = url(
        "/own-not-listed",
        &[
            ("h", &h("stampede-cache-control", "no-store")),
            ("h", &cdn("max-age=60")),
        ],
    );
    let answer = get(&strict[0], &elsewhere).await;
    assert_eq!(answer.x_cache(), "MISS", "not on its list");
    assert_eq!(answer.headers["cdn-cache-control"], "max-age=60");
    assert_eq!(answer.headers["stampede-cache-control"], "no-store");
}

store_test!(age_and_expires_rfc_9111_5_1_and_5_3);
/// RFC 9111 §5.1: of a list-based `Age` the first member counts, an invalid one is ignored;
/// §5.3: an invalid `Expires` (`0`) is already expired; §4.2.1: several `Expires` that
/// disagree make the response stale (this cache's choice).
async fn age_and_expires_rfc_9111_5_1_and_5_3(shared: Shared) {
    let origin = Origin::default();
    let heuristic = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache).policy(RfcPolicy::new().default_ttl(Duration::from_secs(60)))
    });
    let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(600));
    let sooner = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(300));
    for (path, pairs) in [
        ("/expires-zero", vec![("h", h("expires", "0"))]),
        ("/expires-junk", vec![("h", h("expires", "next week"))]),
        (
            "/expires-twice",
            vec![("h", h("expires", &later)), ("h", h("expires", &sooner))],
        ),
    ] {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let uri = url(path, &pairs);
        assert_eq!(
            three_times(&heuristic, &uri).await,
            PASSED,
            "{path}: already expired, no heuristic freshness"
        );
    }
    let same = url(
        "/expires-same",
        &[("h", &h("expires", &later)), ("h", &h("expires", &later))],
    );
    assert_eq!(three_times(&heuristic, &same).await, CACHED);

    let fresh = h("cache-control", "max-age=60");
    let listed = url("/age-list", &[("h", &fresh), ("h", &h("age", "30, 50"))]);
    get(&heuristic[0], &listed).await;
    let hit = get(&heuristic[1], &listed).await;
    assert_eq!(hit.x_cache(), "HIT");
    let age = hit.age().unwrap();
    assert!((30..45).contains(&age), "Age {age}: the first member");
    let invalid = url("/age-invalid", &[("h", &fresh), ("h", &h("age", "-5"))]);
    get(&heuristic[0], &invalid).await;
    let hit = get(&heuristic[1], &invalid).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert!(hit.age().unwrap() < 15, "an invalid Age is ignored");
}

store_test!(cache_status_says_how_each_response_was_served_rfc_9211);
/// RFC 9211: every response the layer handles carries its `Cache-Status` member, after the
/// origin's own (§2: the cache closest to the origin first), under a configurable name;
/// `x-cache` can be turned off.
async fn cache_status_says_how_each_response_was_served_rfc_9211(shared: Shared) {
    let origin = Origin::default();
    let [a, b] = apps(&shared, &origin, StampedeLayer::new);
    let cache_status = |answer: &Answer| -> Vec<String> {
        answer
            .headers
            .get_all("cache-status")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let fresh = url(
        "/status",
        &[
            ("h", &h("cache-control", "max-age=60")),
            ("h", &h("cache-status", "OriginCache; hit; ttl=30")),
        ],
    );
    let miss = get(&a, &fresh).await;
    assert_eq!(
        cache_status(&miss),
        [
            "OriginCache; hit; ttl=30",
            "tower-stampede; fwd=uri-miss; fwd-status=200; stored; ttl=60"
        ]
    );
    for app in [&a, &b] {
        // RFC 9211 §2.4: a hit says what is left of its freshness (max-age=60).
        let statuses = cache_status(&get(app, &fresh).await);
        assert_eq!(statuses[0], "OriginCache; hit; ttl=30");
        let (ours, ttl) = support::http::split_ttl(&statuses[1]);
        assert_eq!(ours, "tower-stampede; hit");
        assert!(
            ttl.is_some_and(|ttl| (50..=60).contains(&ttl)),
            "ttl {ttl:?}"
        );
        assert_eq!(statuses.len(), 2);
    }
    let no_store = send(&a, Method::GET, &fresh, &[("cache-control", "no-store")]).await;
    assert_eq!(
        cache_status(&no_store).last().unwrap(),
        "tower-stampede; fwd=request; fwd-status=200; detail=no-store-request"
    );
    let private = url(
        "/status-private",
        &[("status", b"404"), ("h", &h("cache-control", "private"))],
    );
    assert_eq!(
        cache_status(&get(&a, &private).await),
        ["tower-stampede; fwd=uri-miss; fwd-status=404; detail=private"]
    );
    let [named, _] = apps(&shared, &origin, |cache| {
        StampedeLayer::new(cache)
            .cache_status_name("edge-7")
            .x_cache(false)
    });
    let hit = get(&named, &fresh).await;
    let statuses = cache_status(&hit);
    assert_eq!(
        (
            statuses[0].as_str(),
            support::http::split_ttl(&statuses[1]).0
        ),
        ("OriginCache; hit; ttl=30", "edge-7; hit".to_owned())
    );
    assert!(!hit.headers.contains_key("x-cache"));
}

store_test!(layers_sharing_one_l1_mark_their_hits_with_their_own_names);
/// L1 keeps a response with the fields of a plain hit made ready, for the layer whose hit
/// made them: two layers over one cache (one L1) still mark their hits each with their own
/// name (RFC 9211 §2), and a `HEAD` or a conditional request on such a hit is answered as
/// from any entry (RFC 9110 §9.3.2, §13.1.1).
async fn layers_sharing_one_l1_mark_their_hits_with_their_own_names(shared: Shared) {
    let origin = Origin::default();
    let cache = shared.cache().build();
    let plain = origin.router().layer(StampedeLayer::new(cache.clone()));
    let named = origin.router().layer(
        StampedeLayer::new(cache)
            .cache_status_name("edge-7")
            .x_cache(false),
    );
    let uri = url(
        "/shared-l1",
        &[
            ("h", &h("cache-control", "max-age=60")),
            ("h", &h("etag", "\"v1\"")),
        ],
    );
    // Each member without its ttl, which must be there and within max-age=60.
    let marks = |answer: &Answer| {
        let status: Vec<_> = answer
            .headers
            .get_all("cache-status")
            .iter()
            .map(|v| {
                let (rest, ttl) = support::http::split_ttl(v.to_str().unwrap());
                assert!(ttl.is_some_and(|t| (50..=60).contains(&t)), "ttl {ttl:?}");
                rest
            })
            .collect();
        (answer.status, status, answer.x_cache().to_owned())
    };
    let miss = get(&plain, &uri).await;
    assert_eq!(miss.x_cache(), "MISS");
    let hit = get(&plain, &uri).await;
    assert_eq!(
        marks(&hit),
        (
            StatusCode::OK,
            vec!["tower-stampede; hit".to_owned()],
            "HIT".to_owned()
        )
    );
    assert_eq!(hit.body, miss.body);
    assert_eq!(
        hit.headers["content-length"],
        miss.body.len().to_string().as_str()
    );
    assert!(hit.headers.contains_key("age"));
    let other = get(&named, &uri).await;
    assert_eq!(
        marks(&other),
        (
            StatusCode::OK,
            vec!["edge-7; hit".to_owned()],
            String::new()
        )
    );
    let head = send(&plain, Method::HEAD, &uri, &[]).await;
    assert_eq!(
        (head.status, head.body.len(), head.x_cache()),
        (StatusCode::OK, 0, "HIT")
    );
    assert_eq!(
        head.headers["content-length"],
        miss.body.len().to_string().as_str()
    );
    let conditional = send(&plain, Method::GET, &uri, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(
        (
            conditional.status,
            conditional.body.len(),
            conditional.x_cache()
        ),
        (StatusCode::NOT_MODIFIED, 0, "HIT")
    );
    assert_eq!(origin.calls(), 1);
}
