//! The HTTP rules in combination, as a table: every request shape (as users deploy the layer:
//! behind a load balancer, with browser cookies, signed in, attacked) against every response
//! shape (as handlers answer: with and without freshness, failing, varying, private, large),
//! each cell a burst of 20 concurrent requests over two app instances (two processes: their
//! own `Cache`, L1 and flights) on one store, with the origin loads it may cost as data.
//!
//! Every response the origin sends is marked with whom it was made for (what of the request
//! could change the page: its credentials and its forwarding values), and every answer is
//! checked against its own request: no request gets a page made for another credential (unless
//! the response said it may be shared) nor one made for other forwarding values, ever. After
//! each burst a plain request and a balancer's are checked the same way, so that no
//! attacker's page reaches them.
//!
//! A new rule adds a row or a column and the expected loads of its cells; every other cell is
//! checked against it unchanged. A failure names its cell. Over `MemoryStore` on paused time
//! and (feature `redis`) a real `redis-server` on real time, one test per store.

use std::fmt;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use support::http::{send, stampede_held, Answer, Held};
use support::{store_test, Shared, PATIENT};
use tower_stampede::{Cache, StampedeLayer};

/// Requests per burst.
const BURST: usize = 20;
/// How long the burst's loads are held past the start of its last request: every request of
/// a cell that loads once per burst or per process must have joined a load by then, on a
/// machine busy with the rest of the suite too (each makes two store round trips first: the
/// URL's key, then its variant's). Paused time on the memory store; real time on Redis.
const MOMENT: std::time::Duration = std::time::Duration::from_millis(500);
/// The layer's `max_body_bytes`, and its `max_relay_bytes`.
const MAX_BODY: usize = 1024;
const MAX_RELAY: usize = 4096;

/// How a request is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sent {
    /// No header the layer reads.
    Plain,
    /// A load balancer's: the same `X-Forwarded-Proto` and `X-Forwarded-Port` on every
    /// request, and each client's own `X-Forwarded-For`.
    Balancer,
    /// A browser's analytics cookies, each client's own values.
    Analytics,
    /// Both.
    BalancerAnalytics,
    /// A session cookie: each request a user of its own.
    Session,
    /// `Authorization`: each request a user of its own.
    Authorization,
    /// Through the balancer, with an attacker's `X-Forwarded-Host`.
    Attacker,
    /// The balancer's, after 16 attacker values of `X-Forwarded-Host` reached each process
    /// first (a deploy, a scale-out, a new page): the bound on a URL's forwarding variants
    /// must not shut the balancer's out.
    Flooded,
}

/// How the origin answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answered {
    MaxAge,
    SMaxAge,
    /// No `Cache-Control`, no `Expires`.
    NoFreshness,
    /// `503` without freshness.
    Failing,
    /// `503` with `max-age=60`.
    FailingFresh,
    /// `max-age=60` and `Vary: Accept-Encoding`.
    VaryEncoding,
    /// `max-age=60` and `Set-Cookie`.
    SetCookie,
    /// `private, max-age=60`.
    Private,
    /// `max-age=60`, a body over `max_body_bytes` within `max_relay_bytes`.
    OverBody,
    /// `max-age=60`, a body over `max_relay_bytes`.
    OverRelay,
}

const REQUESTS: [Sent; 8] = [
    Sent::Plain,
    Sent::Balancer,
    Sent::Analytics,
    Sent::BalancerAnalytics,
    Sent::Session,
    Sent::Authorization,
    Sent::Attacker,
    Sent::Flooded,
];

const RESPONSES: [Answered; 10] = [
    Answered::MaxAge,
    Answered::SMaxAge,
    Answered::NoFreshness,
    Answered::Failing,
    Answered::FailingFresh,
    Answered::VaryEncoding,
    Answered::SetCookie,
    Answered::Private,
    Answered::OverBody,
    Answered::OverRelay,
];

/// Origin loads per burst.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loads {
    /// One for the whole burst, across both processes.
    Burst,
    /// One in each process (a body relayed within its process only).
    PerProcess,
    /// One per request: a page private to its request.
    PerRequest,
}

impl Loads {
    fn count(self) -> usize {
        match self {
            Loads::Burst => 1,
            Loads::PerProcess => 2,
            Loads::PerRequest => BURST,
        }
    }
}

use Loads::{Burst as B, PerProcess as P, PerRequest as R};

/// The expected loads of each cell: a row per request shape (in [`REQUESTS`]' order), a
/// column per response shape (in [`RESPONSES`]' order).
///
/// Requests without credentials (the first four rows, and the attacker's) share every page
/// that may be shared: one load per burst, stored or not (RFC 9111 §4: collapsed), but for a
/// body past `max_body_bytes` (relayed to its process's waiters: one load per process) and
/// past `max_relay_bytes` (one per request), and for pages private to their request
/// (`Set-Cookie`, `private`). Requests with credentials get a shared page only where the
/// response says it may be shared (`s-maxage`, §3.5); a server error private to its request
/// costs one load, its waiters answered by the layer's own `502` (a stampede on a failing
/// origin is what the crate is for).
const EXPECTED: [[Loads; 10]; 8] = [
    //  max-age s-max  none  503  503+ma vary  cookie priv  body  relay
    [B, B, B, B, B, B, R, R, P, R], // plain
    [B, B, B, B, B, B, R, R, P, R], // balancer
    [B, B, B, B, B, B, R, R, P, R], // analytics cookies
    [B, B, B, B, B, B, R, R, P, R], // balancer and analytics cookies
    [R, B, R, B, B, R, R, R, R, R], // session cookie
    [R, B, R, B, B, R, R, R, R, R], // authorization
    [B, B, B, B, B, B, R, R, P, R], // attacker's forwarding value
    [B, B, B, B, B, B, R, R, P, R], // balancer after 16 attacker values per process
];

/// The `detail`s a passed answer (`x-cache: BYPASS`) may give in each column (in
/// [`RESPONSES`]' order), beside `credentials` for the rows with credentials: each names the
/// rule that passed it, for the waiters sent to the origin too (never `uncacheable` where the
/// load in their process said why).
const DETAILS: [&[&str]; 10] = [
    &[],
    &[],
    &["no-freshness"],
    &[],
    &[],
    &[],
    &["set-cookie"],
    &["private"],
    &["too-large"],
    &["too-large", "relay-full"],
];

/// One cell: a request shape and a response shape.
#[derive(Clone, Copy)]
struct Cell {
    sent: Sent,
    answered: Answered,
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} × {:?}", self.sent, self.answered)
    }
}

impl Sent {
    /// The header fields of the `i`-th request of a burst.
    fn headers(self, i: usize) -> Vec<(&'static str, String)> {
        let balancer = [
            ("x-forwarded-proto", "https".to_owned()),
            ("x-forwarded-port", "443".to_owned()),
            ("x-forwarded-for", format!("198.51.100.{i}")),
        ];
        let analytics = ("cookie", format!("_ga=GA1.2.{i}; _gid=GA1.2.{i}"));
        let mut headers = vec![("accept-encoding", "gzip".to_owned())];
        match self {
            Sent::Plain => {}
            Sent::Balancer => headers.extend(balancer),
            Sent::Analytics => headers.push(analytics),
            Sent::BalancerAnalytics => {
                headers.extend(balancer);
                headers.push(analytics);
            }
            Sent::Session => headers.push(("cookie", format!("session=user{i}"))),
            Sent::Authorization => headers.push(("authorization", format!("Bearer user{i}"))),
            Sent::Attacker => {
                headers.extend(balancer);
                headers.push(("x-forwarded-host", "evil.example".to_owned()));
            }
            Sent::Flooded => headers.extend(balancer),
        }
        headers
    }

    /// What reaches each app before the burst: for [`Sent::Flooded`], 16 attacker values.
    async fn before(self, apps: &[Router], uri: &str) {
        if self != Sent::Flooded {
            return;
        }
        for (a, app) in apps.iter().enumerate() {
            for i in 0..16 {
                let host = format!("evil{a}-{i}.example");
                let flood = [("x-forwarded-host", host.as_str()), ("x-flood", "1")];
                send(app, "GET", uri, &flood).await;
            }
        }
    }

    /// Whether its requests carry credentials the layer counts.
    fn credentialed(self) -> bool {
        matches!(self, Sent::Session | Sent::Authorization)
    }
}

/// Whom a response was made for: what of its request could change the page.
#[derive(Clone, Debug, PartialEq)]
struct MadeFor {
    credentials: String,
    forwarding: String,
}

impl MadeFor {
    /// Of a request's header fields, as the origin reads them.
    fn of(headers: &HeaderMap) -> Self {
        let text = |name: &str| {
            headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(",")
        };
        // Analytics cookies change no page.
        let cookies = text("cookie")
            .split("; ")
            .filter(|c| !c.starts_with("_ga=") && !c.starts_with("_gid="))
            .collect::<Vec<_>>()
            .join("; ");
        MadeFor {
            credentials: format!("{cookies}|{}", text("authorization")),
            forwarding: ["x-forwarded-host", "x-forwarded-proto", "x-forwarded-port"]
                .map(text)
                .join("|"),
        }
    }

    /// Of a request sent with `headers`.
    fn of_sent(headers: &[(&'static str, String)]) -> Self {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, value.parse().unwrap());
        }
        Self::of(&map)
    }

    /// As the origin marks its response.
    fn mark(&self) -> String {
        format!("made-for {}#{}", self.credentials, self.forwarding)
    }

    /// As a response's body says it.
    fn read(body: &str) -> Option<Self> {
        let mark = body.strip_prefix("made-for ")?.split('\n').next()?;
        let (credentials, forwarding) = mark.split_once('#')?;
        Some(MadeFor {
            credentials: credentials.to_owned(),
            forwarding: forwarding.to_owned(),
        })
    }
}

/// The origin: answers `/{shape}/...` as that shape says, its body marked with whom it was
/// made for, every load held until the burst is in (see [`Held::all`]); the loads of a flood before the burst
/// (`x-flood`) are neither counted nor held.
fn origin(held: Held) -> Router {
    Router::new().fallback(move |request: Request<Body>| {
        let held = held.clone();
        async move {
            if !request.headers().contains_key("x-flood") {
                held.load().await;
            }
            let made_for = MadeFor::of(request.headers()).mark();
            let shape = request.uri().path().split('/').nth(1).unwrap_or("");
            answer(shape, made_for)
        }
    })
}

/// The response of a shape, its body starting with `made_for`.
fn answer(shape: &str, made_for: String) -> Response {
    let body = |size: usize| format!("{made_for}\n{}", "x".repeat(size));
    let cache_control = |value: &'static str| [("cache-control", value)];
    match shape {
        "MaxAge" => (cache_control("max-age=60"), body(10)).into_response(),
        "SMaxAge" => (cache_control("s-maxage=60"), body(10)).into_response(),
        "NoFreshness" => body(10).into_response(),
        "Failing" => (StatusCode::SERVICE_UNAVAILABLE, body(10)).into_response(),
        "FailingFresh" => (
            StatusCode::SERVICE_UNAVAILABLE,
            cache_control("max-age=60"),
            body(10),
        )
            .into_response(),
        "VaryEncoding" => (
            [("cache-control", "max-age=60"), ("vary", "accept-encoding")],
            body(10),
        )
            .into_response(),
        "SetCookie" => (
            [("cache-control", "max-age=60"), ("set-cookie", "id=1")],
            body(10),
        )
            .into_response(),
        "Private" => (cache_control("private, max-age=60"), body(10)).into_response(),
        "OverBody" => (cache_control("max-age=60"), body(MAX_BODY * 2)).into_response(),
        "OverRelay" => (cache_control("max-age=60"), body(MAX_RELAY * 2)).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Two app instances (processes) over the shared store, each its own `Cache`, before `origin`.
async fn instances(shared: &Shared, origin: &Router) -> [Router; 2] {
    instances_and_caches(shared, origin).await.0
}

/// [`instances`], and their caches.
async fn instances_and_caches(shared: &Shared, origin: &Router) -> ([Router; 2], [Cache; 2]) {
    let other = shared.other_process().await;
    let caches = [
        shared.cache().build(),
        Cache::builder_shared(other)
            .namespace("test")
            .store_timeout(PATIENT)
            .build(),
    ];
    let apps = caches.clone().map(|cache| {
        let layer = StampedeLayer::new(cache)
            .max_body_bytes(MAX_BODY)
            .max_relay_bytes(MAX_RELAY);
        origin.clone().layer(layer)
    });
    (apps, caches)
}

/// Whether `answer`, to a request of `sent` with `headers`, was made for it: always for its
/// forwarding values, and for its credentials unless the response may be shared with them.
fn check_private(cell: &str, answer: &Answer, headers: &[(&'static str, String)], shared: bool) {
    let own = MadeFor::of_sent(headers);
    let Some(made_for) = MadeFor::read(answer.body()) else {
        // The layer's own gateway error: made for nobody.
        assert_eq!(
            answer.status,
            StatusCode::BAD_GATEWAY,
            "{cell}: {}",
            answer.body()
        );
        return;
    };
    assert_eq!(
        made_for.forwarding, own.forwarding,
        "{cell}: a page made for other forwarding values"
    );
    if !shared {
        assert_eq!(
            made_for.credentials, own.credentials,
            "{cell}: a page made for another user"
        );
    }
}

/// The layer's `Cache-Status` member (the last).
fn ours(answer: &Answer) -> &str {
    let mut members = answer.headers.get_all("cache-status").iter();
    members.next_back().map_or("", |v| v.to_str().unwrap())
}

store_test!(every_request_shape_meets_every_response_shape);
async fn every_request_shape_meets_every_response_shape(shared: Shared) {
    let mut failures = Vec::new();
    for (row, &sent) in REQUESTS.iter().enumerate() {
        for (column, &answered) in RESPONSES.iter().enumerate() {
            let cell = Cell { sent, answered };
            let name = format!("{cell}");
            let held = Held::all();
            let apps = instances(&shared, &origin(held.clone())).await;
            let uri = format!("http://app.test/{answered:?}/{row}");
            sent.before(&apps, &uri).await;
            let answers =
                stampede_held(MOMENT, &held, &apps, BURST, &uri, |i| sent.headers(i)).await;
            let expected = EXPECTED[row][column];
            let loads = held.loads.get();
            if loads != expected.count() {
                failures.push(format!("{name}: {loads} loads, not {expected:?}"));
            }
            // A page the response lets every user share (`s-maxage`), or a failing origin's.
            let shareable = matches!(
                answered,
                Answered::SMaxAge | Answered::Failing | Answered::FailingFresh
            ) || !sent.credentialed();
            for (i, answer) in answers.iter().enumerate() {
                check_private(&name, answer, &sent.headers(i), shareable);
                let (x_cache, ours) = (answer.x_cache(), ours(answer));
                assert_eq!(
                    x_cache,
                    support::http::told_by(ours),
                    "{name}: {ours} says {x_cache}"
                );
                if x_cache == "BYPASS" {
                    let detail = ours.split("; detail=").nth(1).unwrap_or("");
                    // The balancer's first request after a flood ties with each attacker
                    // value (one request each): coalesced, not stored.
                    let allowed = DETAILS[column].contains(&detail)
                        || (sent.credentialed() && detail == "credentials")
                        || (sent == Sent::Flooded && detail == "too-many-variants");
                    assert!(allowed, "{name}: passed for {detail:?}");
                }
            }
            // A page that is stored is a hit for the row's next request, twice over: stored
            // by the burst's load or by the next, whatever came before.
            let stored = matches!(
                answered,
                Answered::MaxAge
                    | Answered::SMaxAge
                    | Answered::FailingFresh
                    | Answered::VaryEncoding
            ) && (!sent.credentialed() || answered == Answered::SMaxAge);
            if stored {
                let headers = sent.headers(0);
                let pairs: Vec<(&str, &str)> =
                    headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                send(&apps[1], "GET", &uri, &pairs).await;
                let again = send(&apps[1], "GET", &uri, &pairs).await;
                assert_eq!(again.x_cache(), "HIT", "{name}: {}", ours(&again));
            }
            // Then a plain request and a balancer's: neither gets a page made for another.
            for (after, headers) in [
                (Sent::Plain, vec![]),
                (Sent::Balancer, Sent::Balancer.headers(99)),
            ] {
                let headers: Vec<_> = headers;
                let pairs: Vec<(&str, &str)> =
                    headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                let answer = send(&apps[0], "GET", &uri, &pairs).await;
                check_private(&format!("{name}, then {after:?}"), &answer, &headers, false);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cells failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

store_test!(a_balancer_burst_after_a_thousand_attacker_values_loads_once);
/// Issue 52: 1,000 distinct attacker values of `X-Forwarded-Host` reach each of two processes
/// before the balancer's first request (a page under attack since before a deploy); then a
/// burst of 100 balancer requests over both costs the origin one load, and the balancer's
/// page is stored: its next requests are hits, in both processes. What the attacker's values
/// hold stays bounded: the variants each process stores for the URL (at most 16, those most
/// requests carry, plus the few a collision in the sketch of uses lets in), reported.
async fn a_balancer_burst_after_a_thousand_attacker_values_loads_once(shared: Shared) {
    const ATTACKERS: usize = 1_000;
    let held = Held::all();
    let (apps, caches) = instances_and_caches(&shared, &origin(held.clone())).await;
    let uri = "http://app.test/MaxAge/attacked";
    for (a, app) in apps.iter().enumerate() {
        for i in 0..ATTACKERS {
            let host = format!("evil{a}-{i}.example");
            let flood = [("x-forwarded-host", host.as_str()), ("x-flood", "1")];
            let answer = send(app, "GET", uri, &flood).await;
            let made_for = MadeFor::read(answer.body()).unwrap();
            assert!(made_for.forwarding.starts_with(&host));
        }
    }
    let balancer = |i| Sent::Balancer.headers(i);
    let answers = stampede_held(MOMENT, &held, &apps, 100, uri, balancer).await;
    assert_eq!(held.loads.get(), 1, "one load for the burst");
    for (i, answer) in answers.iter().enumerate() {
        check_private(shared.name, answer, &balancer(i), false);
    }
    for app in &apps {
        let pairs: Vec<(&str, String)> = balancer(7);
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        send(app, "GET", uri, &pairs).await;
        let hit = send(app, "GET", uri, &pairs).await;
        assert_eq!(hit.x_cache(), "HIT", "{}", ours(&hit));
    }
    // Each process's L1 holds the URL's marker and the variants it stored: at most 16 sets
    // (and the few a collision lets in), each entry a few hundred bytes here.
    for (i, cache) in caches.iter().enumerate() {
        let l1 = cache.stats().l1_bytes;
        eprintln!("L1 of process {i}: {l1} bytes");
        assert!(l1 < 16 * 1024, "{l1} bytes in L1");
    }
    // The only kind of store without the `redis` feature.
    #[allow(irrefutable_let_patterns)]
    if let support::Backing::Memory(memory) = &shared.backing {
        // Every value turned away left its answer for its waiters (a few seconds, swept later).
        let (entries, bytes) = (memory.len(), memory.bytes());
        eprintln!(
            "store: {entries} values ({bytes} bytes) after {ATTACKERS} attacker values per process"
        );
    }
}
