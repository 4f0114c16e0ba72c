use super::*;

fn marked(status: &CacheStatus, code: u16, served: Served) -> (String, Option<String>) {
    let mut headers = HeaderMap::new();
    status.mark(StatusCode::from_u16(code).unwrap(), &mut headers, served);
    let text = |name: &HeaderName| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    (text(&CACHE_STATUS).unwrap(), text(&X_CACHE))
}

#[test]
fn each_way_of_serving_has_its_rfc_9211_parameters() {
    let status = CacheStatus::default();
    let cases = [
        (200, Served::Hit(None), "tower-stampede; hit", "HIT"),
        (
            200,
            Served::Hit(Some(42)),
            "tower-stampede; hit; ttl=42",
            "HIT",
        ),
        (
            200,
            Served::Stale(None),
            "tower-stampede; hit; detail=stale",
            "STALE",
        ),
        // RFC 9211 §2.4: a stale response has a negative `ttl`.
        (
            200,
            Served::Stale(Some(-7)),
            "tower-stampede; hit; ttl=-7; detail=stale",
            "STALE",
        ),
        (
            503,
            Served::Collapsed(Forward::Loaded),
            "tower-stampede; fwd=uri-miss; fwd-status=503; collapsed",
            "MISS",
        ),
        // RFC 9211 §2.2, §2.3: collapsed onto the reload of a stale entry, which the
        // origin answered with a new response, or with `304`.
        (
            200,
            Served::Collapsed(Forward::Refreshed),
            "tower-stampede; fwd=stale; fwd-status=200; collapsed",
            "MISS",
        ),
        (
            503,
            Served::Collapsed(Forward::Refreshed),
            "tower-stampede; fwd=stale; fwd-status=503; collapsed",
            "MISS",
        ),
        (
            200,
            Served::Collapsed(Forward::Revalidated),
            "tower-stampede; fwd=stale; fwd-status=304; collapsed",
            "MISS",
        ),
        (
            200,
            Served::Loaded(Some(Duration::from_secs(60))),
            "tower-stampede; fwd=uri-miss; fwd-status=200; stored; ttl=60",
            "MISS",
        ),
        (
            500,
            Served::Loaded(None),
            "tower-stampede; fwd=uri-miss; fwd-status=500",
            "MISS",
        ),
        (
            200,
            Served::Refreshed(Some(Duration::from_secs(45))),
            "tower-stampede; fwd=stale; fwd-status=200; stored; ttl=45",
            "MISS",
        ),
        (
            200,
            Served::Revalidated(Some(Duration::from_secs(30))),
            "tower-stampede; fwd=stale; fwd-status=304; stored; ttl=30",
            "MISS",
        ),
        (
            200,
            Served::Revalidated(None),
            "tower-stampede; fwd=stale; fwd-status=304",
            "MISS",
        ),
        (
            200,
            Served::Passed(Pass::NoFreshness),
            "tower-stampede; fwd=uri-miss; fwd-status=200; detail=no-freshness",
            "BYPASS",
        ),
        (
            206,
            Served::Request(Pass::Range),
            "tower-stampede; fwd=request; fwd-status=206; detail=range",
            "BYPASS",
        ),
        (
            200,
            Served::Request(Pass::ForwardingHeader("x_forwarded_host")),
            "tower-stampede; fwd=bypass; fwd-status=200; \
             detail=forwarding-header:x_forwarded_host",
            "BYPASS",
        ),
        // RFC 9211 §2.2: "configured to not handle this request".
        (
            200,
            Served::Passed(Pass::Credentials),
            "tower-stampede; fwd=bypass; fwd-status=200; detail=credentials",
            "BYPASS",
        ),
        (
            200,
            Served::Request(Pass::MethodOverride),
            "tower-stampede; fwd=bypass; fwd-status=200; detail=method-override",
            "BYPASS",
        ),
        (
            200,
            Served::Passed(Pass::TooManyVariants),
            "tower-stampede; fwd=uri-miss; fwd-status=200; detail=too-many-variants",
            "BYPASS",
        ),
        // RFC 9211 §2.2: "the request method's semantics require the request to be
        // forwarded"; RFC 9111 §4.4: what became of the URL.
        (
            204,
            Served::Unsafe(Some(Invalidated::Now)),
            "tower-stampede; fwd=method; fwd-status=204; detail=invalidated",
            "BYPASS",
        ),
        (
            200,
            Served::Unsafe(Some(Invalidated::Coalesced)),
            "tower-stampede; fwd=method; fwd-status=200; detail=invalidation-coalesced",
            "BYPASS",
        ),
        (
            500,
            Served::Unsafe(None),
            "tower-stampede; fwd=method; fwd-status=500; detail=unsafe-method",
            "BYPASS",
        ),
        (
            200,
            Served::Unkeyed,
            "tower-stampede; fwd=bypass; fwd-status=200; detail=no-key",
            "BYPASS",
        ),
        (
            502,
            Served::MadeUp(Detail::NoOriginResponse),
            "tower-stampede; fwd=uri-miss; detail=no-origin-response",
            "MISS",
        ),
        (
            504,
            Served::MadeUp(Detail::Timeout),
            "tower-stampede; fwd=uri-miss; detail=timeout",
            "MISS",
        ),
    ];
    for (code, served, cache_status, x_cache) in cases {
        assert_eq!(
            marked(&status, code, served),
            (cache_status.to_owned(), Some(x_cache.to_owned())),
            "{served:?}"
        );
        assert_eq!(
            x_cache,
            support::http::told_by(cache_status),
            "{served:?}: the two disagree"
        );
    }
}

#[test]
fn ttl_is_whole_seconds_left_or_negative_once_stale_rfc_9211_2_4() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    assert_eq!(ttl(None, now), None);
    assert_eq!(ttl(Some(now + ms(59_700)), now), Some(59));
    assert_eq!(ttl(Some(now + ms(300)), now), Some(0));
    assert_eq!(ttl(Some(now), now), Some(0));
    let later = now + ms(10_000);
    assert_eq!(ttl(Some(later - ms(300)), later), Some(-1));
    assert_eq!(ttl(Some(later - ms(2_000)), later), Some(-2));
    assert_eq!(ttl(Some(later - ms(2_500)), later), Some(-3));
}

#[test]
fn a_hit_value_made_again_says_its_own_name_and_ttl() {
    // The last value made on a thread is reused only for the same name and ttl.
    let (ours, theirs) = (CacheStatus::default(), CacheStatus::new("edge", false));
    for _ in 0..2 {
        for ttl in [59, 59, 58, -1, 58] {
            for (status, name) in [(&ours, DEFAULT_NAME), (&theirs, "edge")] {
                let value = status.hit(Some(ttl));
                assert_eq!(value.to_str().unwrap(), format!("{name}; hit; ttl={ttl}"));
            }
        }
    }
}

#[test]
fn names_are_tokens_or_strings_and_x_cache_is_optional() {
    let status = CacheStatus::new("edge \"7\"\u{e9}", false);
    assert_eq!(
        marked(&status, 200, Served::Hit(None)),
        ("\"edge \\\"7\\\"\"; hit".to_owned(), None)
    );
    let status = CacheStatus::new("", true);
    assert_eq!(marked(&status, 200, Served::Hit(None)).0, "\"\"; hit");
}

#[test]
fn an_origin_cache_status_stays_first() {
    let mut headers = HeaderMap::new();
    headers.insert(&CACHE_STATUS, HeaderValue::from_static("OriginCache; hit"));
    CacheStatus::default().mark(StatusCode::OK, &mut headers, Served::Hit(None));
    let values: Vec<_> = headers.get_all(&CACHE_STATUS).iter().collect();
    assert_eq!(values, ["OriginCache; hit", "tower-stampede; hit"]);
}
