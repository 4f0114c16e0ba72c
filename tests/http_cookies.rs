//! Requests with cookies are requests with credentials (RFC 9111 §3.5 applied to `Cookie` as
//! to `Authorization`): no user is served another user's page, through the real middleware
//! over `MemoryStore` and (feature `redis`) a real `redis-server`, two instances each.
//!
//! The origin greets the user from the request's `Cookie`, as a session-authenticated app
//! does, with the `Cache-Control` (and `Vary`) the query asks for: `/dash?cc=max-age%3D30`.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use support::http::{send, Answer};
use support::{store_test, Counter, Shared};
use tower_stampede::http::RfcPolicy;
use tower_stampede::StampedeLayer;

/// An origin that greets the user from the `Cookie` it was sent, and counts its calls.
fn origin(calls: &Counter) -> Router {
    let calls = calls.clone();
    Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let n = calls.hit();
        async move {
            if uri.path() == "/slow" {
                // A slow origin, so that the requests of a burst arrive while it loads.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let cookie = headers
                .get("cookie")
                .map_or("nobody", |c| c.to_str().unwrap_or("?"))
                .to_owned();
            let mut response: Response = format!("hello {cookie} #{n}").into_response();
            for pair in uri.query().unwrap_or("").split('&') {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                let value = value
                    .replace("%3D", "=")
                    .replace("%2C", ",")
                    .replace('+', " ");
                let name = match name {
                    "cc" => "cache-control",
                    "vary" => "vary",
                    _ => continue,
                };
                response
                    .headers_mut()
                    .insert(name, HeaderValue::from_str(&value).unwrap());
            }
            response
        }
    })
}

/// Two instances (two L1s) over one store, behind layers with the policy `policy` makes.
fn instances(shared: &Shared, calls: &Counter, policy: impl Fn() -> RfcPolicy) -> [Router; 2] {
    [0, 1].map(|_| origin(calls).layer(StampedeLayer::new(shared.cache().build()).policy(policy())))
}

async fn as_user(app: &Router, uri: &str, cookie: &str) -> Answer {
    send(app, "GET", uri, &[("cookie", cookie)]).await
}

async fn anonymous(app: &Router, uri: &str) -> Answer {
    send(app, "GET", uri, &[]).await
}

store_test!(a_page_for_one_cookie_is_never_served_for_another_rfc_9111_3_5);
/// The scenario: a handler that greets the user from a `session` cookie and sends no
/// `Cache-Control` (with a default TTL), or only `max-age=30` (meaning "the browser may keep
/// it"). RFC 9111 §3.5 lets a shared cache store neither for a request with `Authorization`;
/// the layer treats `Cookie` the same way, so each user gets their own page and nothing is
/// stored. With `public, max-age=30` the response says it may be shared, and is.
async fn a_page_for_one_cookie_is_never_served_for_another_rfc_9111_3_5(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new().default_ttl(Duration::from_secs(30))
    });
    for path in ["/dash", "/dash?cc=max-age%3D30"] {
        let before = calls.get();
        for (app, user) in [
            (&one, "alice"),
            (&one, "bob"),
            (&two, "bob"),
            (&one, "alice"),
        ] {
            let cookie = format!("session={user}");
            let answer = as_user(app, &format!("http://app.test{path}"), &cookie).await;
            assert!(
                answer.body().starts_with(&format!("hello {cookie} #")),
                "{path}: {user} got {:?}",
                answer.body()
            );
            assert_eq!(answer.x_cache(), "BYPASS", "{path}");
        }
        assert_eq!(calls.get() - before, 4, "{path}: nothing stored");
    }
    let public = "http://app.test/news?cc=public%2C+max-age%3D30";
    let alice = as_user(&one, public, "session=alice").await;
    assert_eq!(alice.x_cache(), "MISS");
    for app in [&one, &two] {
        let bob = as_user(app, public, "session=bob").await;
        assert_eq!(
            (bob.x_cache(), bob.body()),
            ("HIT", alice.body()),
            "the response said it may be shared"
        );
    }
}

store_test!(requests_with_and_without_cookies_never_share_an_entry);
/// Whether a page stored for a request without cookies answers one with cookies: it does
/// not. Requests with cookies are keyed apart (as those with `Authorization` are), so a
/// signed-in user never gets the anonymous page (which would show them signed out), and an
/// anonymous user never gets a page stored for a request with cookies.
async fn requests_with_and_without_cookies_never_share_an_entry(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new().default_ttl(Duration::from_secs(30))
    });
    let home = "http://app.test/home";
    let first = anonymous(&one, home).await;
    assert_eq!(first.x_cache(), "MISS");
    assert_eq!(anonymous(&two, home).await.body(), first.body());
    let signed_in = as_user(&two, home, "session=alice").await;
    assert!(
        signed_in.body().starts_with("hello session=alice #"),
        "{:?}",
        signed_in.body()
    );
    let public = "http://app.test/home2?cc=public%2C+max-age%3D30";
    let stored = as_user(&one, public, "session=alice").await;
    assert_eq!(stored.x_cache(), "MISS");
    let nobody = anonymous(&two, public).await;
    assert_eq!(nobody.x_cache(), "MISS");
    assert!(nobody.body().starts_with("hello nobody #"));
}

store_test!(ignored_cookies_do_not_prevent_sharing_and_others_do);
/// The way out for cookies that personalise nothing: an ignored cookie name does not
/// prevent sharing (such requests share one entry with those without cookies); any other
/// cookie does. `ignore_all_cookies` says the whole service is public.
async fn ignored_cookies_do_not_prevent_sharing_and_others_do(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new()
            .default_ttl(Duration::from_secs(30))
            .ignore_cookie("_ga")
            .ignore_cookie("consent")
    });
    let page = "http://app.test/page";
    let first = as_user(&one, page, "_ga=GA1.1; consent=yes").await;
    assert_eq!(first.x_cache(), "MISS");
    for answer in [
        as_user(&two, page, "_ga=GA1.2").await,
        anonymous(&one, page).await,
    ] {
        assert_eq!((answer.x_cache(), answer.body()), ("HIT", first.body()));
    }
    let personal = as_user(&two, page, "_ga=GA1.2; session=bob").await;
    assert_eq!(personal.x_cache(), "BYPASS");
    assert!(personal
        .body()
        .starts_with("hello _ga=GA1.2; session=bob #"));

    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new()
            .default_ttl(Duration::from_secs(30))
            .ignore_all_cookies(true)
    });
    let public = "http://app.test/public";
    let first = as_user(&one, public, "session=alice").await;
    let second = as_user(&two, public, "session=bob").await;
    assert_eq!(
        [first.x_cache(), second.x_cache()],
        ["MISS", "HIT"],
        "every cookie ignored"
    );
    assert_eq!(anonymous(&one, public).await.x_cache(), "HIT");
}

store_test!(vary_cookie_stores_one_variant_per_cookie);
/// `Vary: Cookie` keeps working: a response that says it varies on `Cookie` is stored as one
/// variant per cookie value (without `public`), so each user gets their own page from the
/// cache and never another's. A default TTL is never applied to it: without explicit
/// freshness it is not stored.
async fn vary_cookie_stores_one_variant_per_cookie(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new().default_ttl(Duration::from_secs(30))
    });
    let varied = "http://app.test/mine?cc=max-age%3D30&vary=Cookie";
    let alice = as_user(&one, varied, "session=alice").await;
    let bob = as_user(&two, varied, "session=bob").await;
    assert_eq!([alice.x_cache(), bob.x_cache()], ["MISS", "MISS"]);
    for (app, user, first) in [(&two, "alice", &alice), (&one, "bob", &bob)] {
        let again = as_user(app, varied, &format!("session={user}")).await;
        assert_eq!((again.x_cache(), again.body()), ("HIT", first.body()));
    }
    let heuristic = "http://app.test/mine2?vary=Cookie";
    for _ in 0..2 {
        let answer = as_user(&one, heuristic, "session=alice").await;
        assert_eq!(answer.x_cache(), "BYPASS");
    }
}

store_test!(a_cookie_after_a_comma_counts_as_a_cookie);
/// An ignored cookie cannot smuggle a personal one past the rule: the Cookie syntax of RFC
/// 2965 §3.3.4 separates cookies with `,` as well as `;`, and origins that still accept it
/// (Rack before 3, Tomcat's legacy parser) read `_ga=1,session=mallory` as two cookies. Were
/// the request counted as one with only `_ga`, the attacker's signed-in page would be stored
/// under a default TTL and served to everyone (RFC 9111 §3.5 keeps it to its user).
async fn a_cookie_after_a_comma_counts_as_a_cookie(shared: Shared) {
    let calls = Counter::default();
    let [one, two] = instances(&shared, &calls, || {
        RfcPolicy::new()
            .default_ttl(Duration::from_secs(30))
            .ignore_cookie("_ga")
    });
    let page = "http://app.test/home";
    let attack = as_user(&one, page, "_ga=1,session=mallory").await;
    assert_eq!(attack.x_cache(), "BYPASS");
    for app in [&two, &one] {
        let victim = anonymous(app, page).await;
        assert!(
            victim.body().starts_with("hello nobody #"),
            "the victim got {:?}",
            victim.body()
        );
    }
}

store_test!(analytics_cookies_are_ignored_by_default);
/// Issue 40: the cookies that analytics and advertising scripts set (Google Analytics, Meta,
/// and the like) personalise nothing and are ignored by default: 200 concurrent `GET`s, each
/// with `_ga` and `_gid`, over two instances, load the origin once (a response without
/// `public`, `max-age=60`). Any other cookie still makes the request one with credentials,
/// and `ignore_analytics_cookies(false)` counts them all again. The origin takes 200 ms (of
/// paused time on the embedded store), so that the burst arrives while it loads.
async fn analytics_cookies_are_ignored_by_default(shared: Shared) {
    let calls = Counter::default();
    let apps = instances(&shared, &calls, RfcPolicy::new);
    let uri = "http://app.test/slow?cc=max-age%3D60";
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(200));
    let burst: Vec<_> = (0..200)
        .map(|i| {
            let (app, barrier) = (apps[i % 2].clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                as_user(&app, uri, "_ga=GA1.2.3; _gid=GA1.2.4").await
            })
        })
        .collect();
    let mut bodies = std::collections::BTreeSet::new();
    for answer in burst {
        bodies.insert(answer.await.unwrap().body().to_owned());
    }
    assert_eq!(calls.get(), 1, "{} bodies", bodies.len());
    for cookie in [
        "_ga_ABC123=GS1.1; _gat_UA1=1; __utma=1.2; __utmz=3",
        "_fbp=fb.1.2; _fbc=fb.1.3; _gcl_au=1.1; _hjSessionUser_1=x",
        "_clck=a; _clsk=b; _uetsid=c; _uetvid=d; ajs_anonymous_id=e; mp_abc_mixpanel=f",
    ] {
        let answer = as_user(&apps[1], uri, cookie).await;
        assert_eq!(answer.x_cache(), "HIT", "{cookie}");
    }
    for personal in [
        "_ga=GA1.2.3; session=alice",
        "_GA=1",
        "mp_session=x",
        "ga=1",
    ] {
        let answer = as_user(&apps[0], uri, personal).await;
        assert_eq!(answer.x_cache(), "BYPASS", "{personal}");
        assert!(answer.body().starts_with(&format!("hello {personal} #")));
    }
    let counted = instances(&shared, &calls, || {
        RfcPolicy::new().ignore_analytics_cookies(false)
    });
    let answer = as_user(&counted[0], uri, "_ga=GA1.2.3").await;
    assert_eq!(answer.x_cache(), "BYPASS", "opted out");
}

store_test!(a_pass_for_credentials_says_so);
/// Issue 40: a response not stored because the request had credentials says so in
/// `Cache-Status`'s `detail`.
async fn a_pass_for_credentials_says_so(shared: Shared) {
    let calls = Counter::default();
    let [one, _] = instances(&shared, &calls, RfcPolicy::new);
    let answer = as_user(
        &one,
        "http://app.test/dash?cc=max-age%3D60",
        "session=alice",
    )
    .await;
    let ours = answer
        .headers
        .get_all("cache-status")
        .iter()
        .next_back()
        .unwrap();
    assert_eq!(
        ours,
        "tower-stampede; fwd=bypass; fwd-status=200; detail=credentials"
    );
}
