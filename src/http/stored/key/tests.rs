use super::variant::Present;
use super::*;
use crate::store::KeyDigest;
use http::HeaderName;
use http::{HeaderMap, HeaderValue, Request};

fn parts(uri: &str, headers: &[(&'static str, &'static str)]) -> Parts {
    let mut request = Request::get(uri).body(()).unwrap();
    for (name, value) in headers {
        request
            .headers_mut()
            .append(*name, HeaderValue::from_static(value));
    }
    request.into_parts().0
}

#[test]
fn the_default_key() {
    let a = DefaultKey.key(&parts("http://a.example/x?y=1", &[]));
    assert_eq!(a, "http\0GET\0http\0a.example\0/x?y=1");
    let hosted = DefaultKey.key(&parts("/x?y=1", &[("host", "a.example")]));
    assert_eq!(a, hosted, "absolute-form and Host give one key");
    assert_ne!(a, DefaultKey.key(&parts("http://a.example/x?y=2", &[])));
    assert_ne!(a, DefaultKey.key(&parts("http://b.example/x?y=1", &[])));
    assert_ne!(a, DefaultKey.key(&parts("https://a.example/x?y=1", &[])));
    let odd = DefaultKey.key(&parts("/", &[]));
    assert_eq!(odd, "http\0GET\0http\0\0/");
}

#[test]
fn a_site_is_keyed_under_one_authority() {
    let shop = Authority::from_static("shop.example");
    let fixed = DefaultKey.authority(shop.clone());
    let aliased = DefaultKey.aliases(shop, [Authority::from_static("10.0.0.1:8080")]);
    let canonical = DefaultKey.key(&parts("/p?q=1", &[("host", "shop.example")]));
    for host in [
        "shop.example",
        "SHOP.example",
        "shop.example:80",
        "10.0.0.1:8080",
    ] {
        let request = parts("/p?q=1", &[("host", host)]);
        assert_eq!(fixed.key(&request), canonical, "{host}");
        assert_eq!(aliased.key(&request), canonical, "{host}");
    }
    let absolute = parts("http://10.0.0.1:8080/p?q=1", &[]);
    assert_eq!(aliased.key(&absolute), canonical, "absolute form");
    let other = parts("/p?q=1", &[("host", "10.0.0.1:9090")]);
    assert_eq!(fixed.key(&other), canonical);
    assert_eq!(aliased.key(&other), DefaultKey.key(&other), "not an alias");
    let secure = parts("https://10.0.0.1:8080/p?q=1", &[]);
    assert_ne!(aliased.key(&secure), canonical, "the scheme stays");
}

#[test]
fn authorities_are_keyed_normalized() {
    let plain = DefaultKey.key(&parts("/p", &[("host", "shop.example")]));
    for host in [
        "Shop.Example",
        "shop.example:80",
        "SHOP.EXAMPLE:",
        "shop.example:0080",
    ] {
        let key = DefaultKey.key(&parts("/p", &[("host", host)]));
        assert_eq!(key, plain, "{host}");
    }
    for host in [
        "shop.example:8080",
        "shop.example:443",
        "shop.example:99999",
    ] {
        let key = DefaultKey.key(&parts("/p", &[("host", host)]));
        assert_ne!(key, plain, "{host}");
    }
    let secure = DefaultKey.key(&parts("https://shop.example/p", &[]));
    assert_eq!(
        DefaultKey.key(&parts("HTTPS://Shop.Example:443/p", &[])),
        secure
    );
    assert_ne!(
        DefaultKey.key(&parts("https://shop.example:80/p", &[])),
        secure
    );
    for (literal, normal) in [
        ("[::1]", "[::1]"),
        ("[::1]:80", "[::1]"),
        ("[::AB]:81", "[::ab]:81"),
    ] {
        assert_eq!(&*normalized("http", literal.as_bytes()), normal.as_bytes());
    }
}

#[test]
fn authorities_are_copied_as_escape_ascii_leaves_them() {
    for byte in 0..=u8::MAX {
        let escaped: Vec<u8> = [byte].escape_ascii().collect();
        assert_eq!(needs_no_escape(byte), escaped == [byte], "{byte:#x}");
    }
}

#[test]
fn requests_with_credentials_are_keyed_apart() {
    assert_eq!(primary("k".into(), false, false), "k");
    assert_ne!(primary("k".into(), true, false), "k");
}

#[test]
fn requests_with_forwarding_headers_are_keyed_apart() {
    let keys = [(false, false), (true, false), (false, true), (true, true)]
        .map(|(credentialed, forwarded)| primary("k".into(), credentialed, forwarded));
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b);
        }
        assert_eq!(is_forwarded(a), i >= 2, "{a:?}");
    }
    assert_eq!(primaries("k", true).len(), 4);
    assert!(keys.iter().all(|key| primaries("k", true).contains(key)));
    assert_eq!(primaries("k", false), [keys[1].clone(), keys[0].clone()]);
}

/// RFC 7239: under a forwarded primary key, `Forwarded` is keyed without `for=` and `by=`;
/// under any other (a response's own `Vary: Forwarded`), as it is.
#[test]
fn forwarded_is_keyed_without_the_client_under_a_forwarded_key() {
    let names = [HeaderName::from_static("forwarded")];
    let forwarded = primary("k".into(), false, true);
    let key = |primary: &str, value: &'static str| {
        variant(
            primary,
            1,
            &names,
            &parts("/", &[("forwarded", value)]).headers,
        )
    };
    assert_eq!(
        key(&forwarded, "for=192.0.2.1;proto=https"),
        key(&forwarded, "for=192.0.2.2;proto=https;by=10.0.0.1")
    );
    assert_ne!(
        key(&forwarded, "for=192.0.2.1;proto=https"),
        key(&forwarded, "for=192.0.2.1;proto=http")
    );
    assert_ne!(
        key("k", "for=192.0.2.1;proto=https"),
        key("k", "for=192.0.2.2;proto=https")
    );
}

#[test]
fn variant_keys_normalise_and_tell_absent_from_empty() {
    let names = [
        HeaderName::from_static("accept-encoding"),
        HeaderName::from_static("x-tenant"),
    ];
    let key = |headers: &[(&'static str, &'static str)]| {
        variant("p", 1, &names, &parts("/", headers).headers)
    };
    let gzip = key(&[("Accept-Encoding", " gzip ")]);
    assert_eq!(gzip, key(&[("accept-encoding", "gzip")]));
    assert_ne!(gzip, key(&[("accept-encoding", "identity")]));
    assert_ne!(key(&[]), key(&[("accept-encoding", "")]));
    assert_eq!(
        key(&[("accept-encoding", "gzip"), ("accept-encoding", " br")]),
        key(&[("accept-encoding", "gzip,br")]),
        "field lines combine"
    );
    assert_ne!(
        key(&[("accept-encoding", "gzip"), ("x-tenant", "a")]),
        key(&[("accept-encoding", "gzip"), ("x-tenant", "b")])
    );
    assert_ne!(
        variant("p", 1, &names, &HeaderMap::new()),
        variant("q", 1, &names, &HeaderMap::new())
    );
    assert_ne!(
        variant("p", 1, &names, &HeaderMap::new()),
        variant("p", 2, &names, &HeaderMap::new()),
        "another generation"
    );
}

/// Any byte a header value may hold.
fn value_byte() -> impl proptest::strategy::Strategy<Value = u8> {
    proptest::prop_oneof![proptest::strategy::Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff]
}

proptest::proptest! {
    /// Any request bytes make a key without a panic, and two requests whose values of the
    /// varied field differ (after trimming) never share a variant key.
    #[test]
    fn variant_keys_tell_values_apart(
        a in proptest::collection::vec(value_byte(), 0..40),
        b in proptest::collection::vec(value_byte(), 0..40),
    ) {
        let names = [HeaderName::from_static("accept-encoding")];
        let key = |bytes: &[u8]| {
            let mut headers = HeaderMap::new();
            let value = HeaderValue::from_bytes(bytes).ok()?;
            headers.insert("accept-encoding", value);
            Some(variant("p", 1, &names, &headers))
        };
        if let (Some(ka), Some(kb)) = (key(&a), key(&b)) {
            proptest::prop_assert_eq!(ka == kb, a.trim_ascii() == b.trim_ascii());
        }
    }
}

#[test]
fn keys_are_spelled_as_stored_entries_hold_them() {
    // Entries already in a store are found only under the same spelling.
    let names = [HeaderName::from_static("accept-encoding")];
    let headers = parts("/", &[("accept-encoding", "gzip")]).headers;
    let key = variant("p", 0x1f, &names, &headers);
    assert_eq!(
        key,
        "vary\u{0}1\u{0}p\u{0}000000000000001f\u{0}accept-encoding=gzip"
    );
    assert_eq!(
        variant_digest("p", 0x1f, &names, &headers),
        KeyDigest::of(key.as_bytes())
    );
    assert_eq!(authorized("ab"), "authorized\u{0}2\u{0}ab");
    let long = "k".repeat(1234);
    assert_eq!(
        forwarded_key(&long),
        format!("forwarded\u{0}1234\u{0}{long}")
    );
    assert_eq!(
        variant(&"p".repeat(10), u64::MAX, &[], &HeaderMap::new()),
        format!("vary\u{0}10\u{0}{}\u{0}ffffffffffffffff", "p".repeat(10))
    );
}

/// The forwarding headers and a few others, as a request behind a balancer may hold them.
const FIELDS: [&str; 14] = [
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "accept-encoding",
    "accept",
    "cookie",
    "user-agent",
    "x-original-url",
    "x-tenant",
    "host",
    "x-rewrite-url",
];

proptest::proptest! {
    /// A variant's digest made without its key is the digest of its key, and the names a
    /// request is found not to hold are never among its fields, whatever the request holds
    /// and however many names it is keyed by.
    #[test]
    fn variant_digests_are_the_digests_of_variant_keys(
        fields in proptest::collection::vec((0..FIELDS.len(), "[ -~]{0,12}"), 0..20),
        names in proptest::collection::vec(0..FIELDS.len(), 0..FIELDS.len()),
        forwarded in proptest::bool::ANY,
    ) {
        let mut headers = HeaderMap::new();
        for (field, value) in &fields {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.append(FIELDS[*field], value);
            }
        }
        let names: Vec<HeaderName> =
            names.iter().map(|&i| HeaderName::from_static(FIELDS[i])).collect();
        let primary = if forwarded { forwarded_key("p") } else { "p".to_owned() };
        proptest::prop_assert_eq!(
            variant_digest(&primary, 7, &names, &headers),
            KeyDigest::of(variant(&primary, 7, &names, &headers).as_bytes())
        );
        let present = Present::of(&names, &headers);
        for (i, name) in names.iter().enumerate() {
            proptest::prop_assert!(present.may_hold(i) || !headers.contains_key(name));
        }
    }
}
