use super::*;
use crate::http::rules::tag_fields::tests::headers;

/// The digest of a URL's key, as the layer hands it.
fn url(key: &str) -> KeyDigest {
    KeyDigest::of(key.as_bytes())
}

#[test]
fn sets_are_apart_when_their_fields_or_values_are() {
    let variants = ForwardedVariants::default();
    let keyed = [
        HeaderName::from_static("x-forwarded-host"),
        HeaderName::from_static("x-forwarded-proto"),
        HeaderName::from_static("forwarded"),
    ];
    let set = |fields: &[(&'static str, &'static str)]| {
        variants.count(&url("u"), &keyed, &headers(fields), 1).1
    };
    let sets = [
        set(&[]),
        set(&[("x-forwarded-host", "")]),
        set(&[("x-forwarded-host", "a")]),
        set(&[("x-forwarded-proto", "a")]),
        set(&[("x-forwarded-host", "a"), ("x-forwarded-proto", "a")]),
        set(&[("x-forwarded-host", "a,b")]),
        set(&[("forwarded", "proto=https")]),
    ];
    for (i, a) in sets.iter().enumerate() {
        for b in &sets[i + 1..] {
            assert_ne!(a, b, "set {i}");
        }
    }
    let balancer = [
        ("x-forwarded-proto", "https"),
        ("x-forwarded-for", "192.0.2.1"),
    ];
    let other_client = [
        ("x-forwarded-proto", "https"),
        ("x-forwarded-for", "192.0.2.2"),
    ];
    assert_eq!(
        set(&balancer),
        set(&other_client),
        "unkeyed fields count for nothing"
    );
    assert_eq!(
        set(&[("forwarded", "for=192.0.2.1;proto=https")]),
        set(&[("forwarded", "proto=https;for=192.0.2.9")]),
        "nor does who the client is"
    );
}

#[test]
fn hits_count_as_uses_one_in_eight_at_a_time() {
    let variants = ForwardedVariants::default();
    let keyed = [HeaderName::from_static("x-forwarded-proto")];
    let balancer = headers(&[("x-forwarded-proto", "https")]);
    for _ in 0..80 {
        variants.used(&url("u"), &keyed, &balancer);
    }
    // The thread's tick may start anywhere: 80 hits count 80 uses, give or take a sample.
    let (.., estimate) = variants.count(&url("u"), &keyed, &balancer, 0);
    assert!((72..=88).contains(&estimate), "{estimate}");
}

#[test]
fn a_url_keeps_at_most_16_sets_of_forwarding_values() {
    let variants = ForwardedVariants::default();
    let keyed = [
        HeaderName::from_static("x-forwarded-host"),
        HeaderName::from_static("forwarded"),
    ];
    let with =
        |host: &str| headers(&[("x-forwarded-host", host), ("x-forwarded-for", "192.0.2.1")]);
    for i in 0..MAX_FORWARDED_VARIANTS {
        assert!(
            variants.admit(&url("url"), &keyed, &with(&format!("h{i}"))),
            "{i}"
        );
    }
    assert!(!variants.admit(&url("url"), &keyed, &with("one-too-many")));
    assert!(
        variants.admit(&url("url"), &keyed, &with("h3")),
        "a set it keeps"
    );
    assert!(variants.admit(&url("other-url"), &keyed, &with("one-too-many")));
    // The client's address and `for=` are no part of a set.
    let clients = (0..100).map(|i| {
        headers(&[
            ("x-forwarded-host", "h0"),
            ("x-forwarded-for", &format!("198.51.100.{i}")),
        ])
    });
    for client in clients {
        assert!(variants.admit(&url("url"), &keyed, &client));
    }
    let forwarded = (0..100).map(|i| headers(&[("forwarded", &format!("for=10.0.0.{i}"))]));
    for client in forwarded {
        assert!(variants.admit(&url("third-url"), &keyed, &client));
    }
    assert_eq!(
        variants
            .held
            .get(&ForwardedVariants::url_of(&url("third-url")))
            .unwrap()
            .len(),
        1
    );
}

/// The URL's sets, as held.
fn held(variants: &ForwardedVariants, url: &str) -> Vec<u64> {
    let url = ForwardedVariants::url_of(&self::url(url));
    variants
        .held
        .get(&url)
        .map_or_else(Vec::new, |sets| sets.to_vec())
}

#[test]
fn the_set_most_requests_carry_takes_its_place_whatever_came_before() {
    let variants = ForwardedVariants::default();
    let keyed = [HeaderName::from_static("x-forwarded-host")];
    let with = |host: &str| headers(&[("x-forwarded-host", host)]);
    let balancer = with("www.example.com");
    // 1,000 attacker values first, each sent once: 16 of them hold the URL's places. (A
    // value whose counters all collide with others' may take one from another attacker
    // value: see `Uses`; fewer than 7 in 2,000 but once in a million runs.)
    let admitted = (0..1000)
        .filter(|i| variants.admit(&url("url"), &keyed, &with(&format!("evil{i}.example"))))
        .count();
    assert!((MAX_FORWARDED_VARIANTS..MAX_FORWARDED_VARIANTS + 6).contains(&admitted));
    // The balancer's first request ties with the attackers' one each: turned away
    // (looked up and coalesced, not stored), unless noise lifted it; its second beats
    // them, and its set holds.
    let turned_away = (0..2)
        .take_while(|_| !variants.admit(&url("url"), &keyed, &balancer))
        .count();
    assert!(turned_away <= 1);
    // 1,000 more attacker values between and after its requests never take its place.
    let mut later = 0;
    for i in 0..1000 {
        let attacker = with(&format!("later{i}.example"));
        later += usize::from(variants.admit(&url("url"), &keyed, &attacker));
        if i % 100 == 0 {
            assert!(
                variants.admit(&url("url"), &keyed, &balancer),
                "balancer after {i}"
            );
        }
    }
    assert!(
        admitted - MAX_FORWARDED_VARIANTS + later < 7,
        "{admitted} then {later}"
    );
    assert!(variants.admit(&url("url"), &keyed, &balancer));
    assert_eq!(held(&variants, "url").len(), MAX_FORWARDED_VARIANTS);
}

#[test]
fn an_attacker_that_repeats_its_values_needs_more_requests_than_the_balancer() {
    let variants = ForwardedVariants::default();
    let keyed = [HeaderName::from_static("x-forwarded-host")];
    let with = |host: &str| headers(&[("x-forwarded-host", host)]);
    // 16 attacker values, 5 requests each, hold every place.
    for _ in 0..5 {
        for i in 0..MAX_FORWARDED_VARIANTS {
            variants.admit(&url("url"), &keyed, &with(&format!("evil{i}")));
        }
    }
    let balancer = with("www.example.com");
    let turned_away = (0..10)
        .take_while(|_| !variants.admit(&url("url"), &keyed, &balancer))
        .count();
    assert_eq!(
        turned_away, 5,
        "stored from its 6th request, past the attackers' 5"
    );
    assert!(variants.admit(&url("url"), &keyed, &balancer));
}

#[test]
fn a_new_set_takes_the_place_of_the_least_used_once_more_requests_carry_it() {
    let variants = ForwardedVariants::default();
    let keyed = [HeaderName::from_static("x-forwarded-host")];
    let with = |host: &str| headers(&[("x-forwarded-host", host)]);
    for i in 0..MAX_FORWARDED_VARIANTS {
        for _ in 0..100 {
            variants.admit(&url("url"), &keyed, &with(&format!("old{i}")));
        }
    }
    // A new balancer value (a deploy): turned away while the old ones weigh more, then
    // stored, as the uses of the old ones are halved and its own are not.
    let new = with("new.example");
    let turned_away = (0..1000)
        .take_while(|_| !variants.admit(&url("url"), &keyed, &new))
        .count();
    assert_eq!(
        turned_away, 100,
        "stored once its uses pass the least used old set's"
    );
}

#[test]
fn uses_are_halved_as_they_age() {
    let uses = Uses::default();
    for _ in 0..8 {
        uses.count(7, 1);
    }
    assert_eq!(uses.estimate(7), 8);
    for _ in 0..Uses::AGE_AFTER {
        uses.count(8, 1);
    }
    assert_eq!(uses.estimate(7), 4);
    assert!(uses.estimate(8) < Uses::AGE_AFTER);
}
