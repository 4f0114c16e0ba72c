use super::*;
use http::{HeaderValue, Request, Response};
use std::time::SystemTime;

pub(super) fn request(headers: &[(&'static str, &'static str)]) -> request::Parts {
    let mut request = Request::get("/").body(()).unwrap();
    for (name, value) in headers {
        request
            .headers_mut()
            .append(*name, HeaderValue::from_static(value));
    }
    request.into_parts().0
}

fn response(status: u16, headers: &[(&'static str, String)]) -> response::Parts {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        response
            .headers_mut()
            .append(*name, HeaderValue::from_str(value).unwrap());
    }
    response.into_parts().0
}

fn decide(policy: &RfcPolicy, status: u16, headers: &[(&'static str, &str)]) -> Decision {
    let headers: Vec<_> = headers.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
    policy.decide(&request(&[]), &response(status, &headers))
}

fn secs(s: u64) -> Decision {
    Decision::Store(Duration::from_secs(s))
}

/// Stored for `s` seconds and never served stale.
fn strict(s: u64) -> Decision {
    Decision::StoreWith {
        fresh_for: Duration::from_secs(s),
        stale: Staleness::must_revalidate(),
    }
}

#[test]
fn ttl_comes_from_s_maxage_then_max_age_then_expires() {
    let p = RfcPolicy::new();
    let cc = "cache-control";
    assert_eq!(decide(&p, 200, &[(cc, "public, max-age=30")]), secs(30));
    assert_eq!(
        decide(&p, 200, &[(cc, "max-age=30, S-MAXAGE=\"7\"")]),
        strict(7),
        "s-maxage, which also forbids serving it stale (RFC 9111 §5.2.2.10)"
    );
    assert_eq!(
        decide(&p, 200, &[(cc, "max-age=99999999999999999999999")]),
        secs(1 << 31)
    );
    let date = "Sun, 06 Nov 1994 08:49:37 GMT";
    let expires = "Sun, 06 Nov 1994 08:51:37 GMT";
    assert_eq!(
        decide(&p, 200, &[("date", date), ("expires", expires)]),
        secs(120)
    );
    assert_eq!(
        decide(
            &p,
            200,
            &[("date", date), ("expires", expires), (cc, "max-age=5")]
        ),
        secs(5),
        "max-age wins over Expires"
    );
    assert_eq!(
        decide(&p, 200, &[("date", expires), ("expires", date)]),
        Decision::Pass,
        "already expired"
    );
    assert_eq!(
        decide(&p, 200, &[("expires", "0")]),
        Decision::Pass,
        "an invalid Expires is in the past"
    );
    let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    let Decision::Store(ttl) = decide(&p, 200, &[("expires", &later)]) else {
        panic!("not stored")
    };
    assert!(
        ttl > Duration::from_secs(3000),
        "{ttl:?}: Expires less now without Date"
    );
    assert_eq!(
        decide(&p, 200, &[(cc, "max-age=60"), ("age", "45")]),
        secs(15),
        "less the Age it arrived with"
    );
    assert_eq!(
        decide(&p, 200, &[(cc, "max-age=60"), ("age", "60")]),
        Decision::Pass
    );
}

/// RFC 9111 §5.1: of a list-based `Age`, the first member counts; an invalid one is
/// ignored. §5.3: an invalid `Expires` (`0` included) is in the past; §4.2.1: several
/// `Expires` that disagree make the response stale, identical ones count once.
#[test]
fn age_and_expires_follow_rfc_9111_5_1_and_5_3() {
    let p = RfcPolicy::new();
    let cc = ("cache-control", "max-age=60");
    assert_eq!(decide(&p, 200, &[cc, ("age", "10, 50")]), secs(50));
    assert_eq!(
        decide(&p, 200, &[cc, ("age", "10"), ("age", "50")]),
        secs(50)
    );
    for invalid in ["-5", "ten", "1.5", ""] {
        assert_eq!(
            decide(&p, 200, &[cc, ("age", invalid)]),
            secs(60),
            "{invalid:?}"
        );
    }
    let date = "Sun, 06 Nov 1994 08:49:37 GMT";
    let later = "Sun, 06 Nov 1994 08:51:37 GMT";
    let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
    for expires in ["0", "-1", "tomorrow"] {
        assert_eq!(
            decide(&heuristic, 200, &[("date", date), ("expires", expires)]),
            Decision::Pass,
            "Expires: {expires}: already expired, no heuristic freshness either"
        );
    }
    assert_eq!(
        decide(
            &p,
            200,
            &[("date", date), ("expires", later), ("expires", later)]
        ),
        secs(120)
    );
    assert_eq!(
        decide(
            &p,
            200,
            &[("date", date), ("expires", later), ("expires", date)]
        ),
        Decision::Pass
    );
    assert_eq!(
        decide(&p, 200, &[("date", "not a date"), ("expires", "0")]),
        Decision::Pass
    );
}

/// RFC 9213 §2.1: the first valid, non-empty targeted field decides, and `Cache-Control`
/// and `Expires` are then ignored; §2.2: an invalid or empty one is ignored itself.
#[test]
fn targeted_fields_outrank_cache_control_rfc_9213() {
    let p = RfcPolicy::new();
    let cdn = "cdn-cache-control";
    let cc = "cache-control";
    assert_eq!(
        decide(&p, 200, &[(cdn, "max-age=30"), (cc, "max-age=5")]),
        secs(30)
    );
    assert_eq!(
        decide(&p, 200, &[(cdn, "max-age=30"), (cc, "no-store")]),
        secs(30)
    );
    assert_eq!(
        decide(&p, 200, &[(cdn, "no-store"), (cc, "max-age=60")]),
        Decision::Pass
    );
    assert_eq!(
        decide(&p, 200, &[(cdn, "private"), (cc, "max-age=60")]),
        Decision::Pass
    );
    assert_eq!(
        decide(
            &p,
            200,
            &[(cdn, "max-age=30, s-maxage=10"), (cc, "s-maxage=99")]
        ),
        strict(10)
    );
    let expires = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    assert_eq!(
        decide(&p, 200, &[(cdn, "public"), ("expires", &expires)]),
        Decision::Pass,
        "Expires is ignored with a targeted field"
    );
    for ignored in ["max-age=\"30", "Max-Age=30", "max-age=30,", ""] {
        assert_eq!(
            decide(&p, 200, &[(cdn, ignored), (cc, "max-age=5")]),
            secs(5),
            "{ignored:?}: Cache-Control decides"
        );
    }
    assert_eq!(
        decide(&p, 200, &[(cdn, "max-age=1.5"), (cc, "max-age=5")]),
        Decision::Pass,
        "a valid field whose max-age is no delta-seconds gives no permission"
    );
    let own = RfcPolicy::new().targeted_field(HeaderName::from_static("stampede-cache-control"));
    let fields = [
        ("stampede-cache-control", "max-age=7"),
        (cdn, "max-age=30"),
        (cc, "max-age=5"),
    ];
    assert_eq!(decide(&own, 200, &fields), secs(7));
    assert_eq!(
        decide(&p, 200, &fields),
        secs(30),
        "not on this cache's target list"
    );
    assert_eq!(
        decide(
            &own,
            200,
            &[
                ("stampede-cache-control", "max-age=\"x"),
                (cdn, "max-age=30")
            ]
        ),
        secs(30),
        "an invalid field of its own is ignored"
    );
    assert_eq!(
        decide(
            &own,
            200,
            &[("stampede-cache-control", "max-age=x"), (cdn, "max-age=30")]
        ),
        Decision::Pass,
        "a valid field with a max-age that is no number gives no permission"
    );
}

#[test]
fn statuses_and_the_default_ttl() {
    let strict = RfcPolicy::new();
    let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
    for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
        assert_eq!(decide(&strict, status, &[]), Decision::Pass, "{status}");
        assert_eq!(decide(&heuristic, status, &[]), secs(9), "{status}");
        assert_eq!(
            decide(&strict, status, &[("cache-control", "max-age=3")]),
            secs(3),
            "{status}"
        );
    }
    for status in [302, 307, 400, 403] {
        assert_eq!(decide(&heuristic, status, &[]), Decision::Pass, "{status}");
        assert_eq!(
            decide(&strict, status, &[("cache-control", "max-age=3")]),
            secs(3),
            "{status}: explicit freshness"
        );
    }
    for status in [100, 206, 304] {
        assert_eq!(
            decide(&heuristic, status, &[("cache-control", "max-age=3")]),
            Decision::Pass,
            "{status}"
        );
    }
    for status in [500, 502, 503, 504] {
        assert_eq!(
            decide(&heuristic, status, &[]),
            Decision::Share,
            "{status}: without explicit freshness, the origin's answer to this load only"
        );
        assert_eq!(
            decide(&heuristic, status, &[("cache-control", "max-age=0")]),
            Decision::Share,
            "{status}"
        );
        assert_eq!(
            decide(&heuristic, status, &[("cache-control", "max-age=3")]),
            secs(3),
            "{status}: with explicit freshness, stored like any response"
        );
        for private in [
            ("cache-control", "no-store"),
            ("cache-control", "private"),
            ("set-cookie", "a=b"),
        ] {
            assert_eq!(
                decide(&heuristic, status, &[private]),
                Decision::Fail,
                "{status} {private:?}: private to its request, a stale response may stand in"
            );
        }
    }
}

#[test]
fn what_is_never_stored() {
    let p = RfcPolicy::new().default_ttl(Duration::from_secs(60));
    for pairs in [
        &[("cache-control", "no-store")][..],
        &[
            ("cache-control", "max-age=60"),
            ("cache-control", "Private"),
        ],
        &[("cache-control", "private=\"x-user\", max-age=60")],
        &[("cache-control", "no-cache")],
        &[("cache-control", "no-cache=\"set-cookie\", max-age=60")],
        &[("cache-control", "max-age=0")],
        &[("cache-control", "max-age=-1")],
        &[("cache-control", "max-age=abc")],
        &[("cache-control", "max-age")],
        &[
            ("set-cookie", "a=b"),
            ("cache-control", "public, max-age=60"),
        ],
    ] {
        assert_eq!(decide(&p, 200, pairs), Decision::Pass, "{pairs:?}");
    }
}

#[test]
fn stale_rules_follow_the_response_directives() {
    let p = RfcPolicy::new();
    let cc = "cache-control";
    // RFC 5861 §3, §4: the response's own windows; the first of each counts.
    assert_eq!(
        decide(
            &p,
            200,
            &[(
                cc,
                "max-age=60, stale-while-revalidate=30, stale-if-error=600, stale-if-error=1"
            )]
        ),
        Decision::StoreWith {
            fresh_for: Duration::from_secs(60),
            stale: Staleness::default()
                .while_revalidating(Duration::from_secs(30))
                .if_error(Duration::from_secs(600)),
        }
    );
    assert_eq!(
        decide(&p, 200, &[(cc, "max-age=60, stale-if-error=oops")]),
        secs(60),
        "an unreadable window is no window"
    );
    // RFC 9111 §5.2.2.2, §5.2.2.8, §5.2.2.10: never stale, whatever RFC 5861 says.
    for prohibits in [
        "max-age=60, must-revalidate, stale-while-revalidate=30",
        "max-age=60, proxy-revalidate, stale-if-error=30",
        "s-maxage=60, stale-while-revalidate=30",
    ] {
        assert_eq!(
            decide(&p, 200, &[(cc, prohibits)]),
            strict(60),
            "{prohibits}"
        );
    }
    // RFC 9111 §5.2.2.4: `no-cache` with a validator is stored, fresh for 0 and never
    // served stale (a field-qualified one too, read as unqualified); without one it passes.
    for validator in [
        ("etag", "\"v1\""),
        ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
    ] {
        for directive in ["no-cache, max-age=60", "no-cache=\"x-user\""] {
            assert_eq!(
                decide(&p, 200, &[(cc, directive), validator]),
                strict(0),
                "{directive} {validator:?}"
            );
        }
    }
    // RFC 8246: `immutable` changes nothing for this cache.
    assert_eq!(decide(&p, 200, &[(cc, "max-age=60, immutable")]), secs(60));
}

#[test]
fn authorized_requests_need_the_response_to_allow_it() {
    let authorized = request(&[("authorization", "Bearer a")]);
    let ok = |cc: &str| response(200, &[("cache-control", cc.to_owned())]);
    let p = RfcPolicy::new();
    assert_eq!(p.decide(&authorized, &ok("max-age=60")), Decision::Pass);
    assert_eq!(p.decide(&authorized, &ok("public, max-age=60")), secs(60));
    for allowed in ["s-maxage=60", "must-revalidate, max-age=60"] {
        assert_eq!(p.decide(&authorized, &ok(allowed)), strict(60), "{allowed}");
    }
    assert_eq!(
        p.decide(&authorized, &ok("public, private, max-age=60")),
        Decision::Pass
    );
    let shared = RfcPolicy::new().share_authorized(true);
    assert_eq!(shared.decide(&authorized, &ok("max-age=60")), secs(60));
    // No invented freshness for a request with credentials, even where it may be shared.
    let heuristic = RfcPolicy::new().default_ttl(Duration::from_secs(9));
    assert_eq!(heuristic.decide(&authorized, &ok("public")), Decision::Pass);
    assert_eq!(
        heuristic
            .share_authorized(true)
            .decide(&authorized, &ok("public")),
        secs(9)
    );
}

/// RFC 9111 §3.5 applied to cookies: as for `Authorization`, but for cookies the policy
/// ignores, and for a response that varies on `Cookie` (stored per cookie value).
#[test]
fn cookies_are_credentials_but_those_ignored() {
    let ok = |pairs: &[(&'static str, &str)]| {
        let pairs: Vec<_> = pairs.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
        response(200, &pairs)
    };
    let p = RfcPolicy::new()
        .default_ttl(Duration::from_secs(9))
        .ignore_cookie("_ga");
    let session = request(&[("cookie", "_ga=1; session=a")]);
    let analytics = request(&[("cookie", "_ga=1")]);
    assert!(p.credentialed(&session) && !p.credentialed(&analytics));
    // Without `ignore_cookie`, a cookie counts; an analytics one only when they are counted.
    assert!(RfcPolicy::new()
        .ignore_analytics_cookies(false)
        .credentialed(&analytics));
    assert!(
        !RfcPolicy::new().credentialed(&analytics),
        "ignored by default"
    );
    assert!(RfcPolicy::new().credentialed(&request(&[("cookie", "consent=1")])));
    assert!(RfcPolicy::new()
        .ignore_all_cookies(true)
        .credentialed(&request(&[
            ("cookie", "s=1"),
            ("authorization", "Bearer a")
        ])));
    assert_eq!(p.decide(&session, &ok(&[])), Decision::Pass);
    assert_eq!(p.decide(&analytics, &ok(&[])), secs(9));
    let cc = "cache-control";
    assert_eq!(
        p.decide(&session, &ok(&[(cc, "max-age=60")])),
        Decision::Pass
    );
    assert_eq!(
        p.decide(&session, &ok(&[(cc, "public, max-age=60")])),
        secs(60)
    );
    assert_eq!(p.decide(&session, &ok(&[(cc, "public")])), Decision::Pass);
    assert_eq!(
        p.decide(
            &session,
            &ok(&[(cc, "max-age=60"), ("vary", "Accept, Cookie")])
        ),
        secs(60)
    );
    assert_eq!(
        p.decide(&session, &ok(&[("vary", "cookie")])),
        Decision::Pass
    );
    assert_eq!(
        p.share_authorized(true)
            .decide(&session, &ok(&[(cc, "max-age=60")])),
        Decision::Pass
    );
    let everything = RfcPolicy::new()
        .default_ttl(Duration::from_secs(9))
        .ignore_all_cookies(true);
    assert_eq!(everything.decide(&session, &ok(&[])), secs(9));
    assert_eq!(
        everything.decide(&session, &ok(&[("set-cookie", "a=b")])),
        Decision::Pass
    );
}
