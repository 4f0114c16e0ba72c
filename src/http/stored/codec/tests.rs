use super::*;
use proptest::prelude::*;

fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

fn sample() -> (StatusCode, HeaderMap, Vec<Bytes>) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("text/html"));
    headers.append("x-multi", HeaderValue::from_static("one"));
    headers.append("x-multi", HeaderValue::from_static("two"));
    headers.insert("x-bin", HeaderValue::from_bytes(b"\xff\x80ok").unwrap());
    let body = vec![Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
    (StatusCode::NOT_FOUND, headers, body)
}

fn encode_sample() -> Bytes {
    let (status, headers, body) = sample();
    encode_response(
        at(1_700_000_000_123),
        status,
        &headers.iter().collect::<Vec<_>>(),
        &body,
        Forward::Loaded,
    )
    .unwrap()
}

#[test]
fn round_trips_status_headers_and_body() {
    let (status, headers, _) = sample();
    let Ok(Decoded::Response(decoded)) = decode(&encode_sample()) else {
        panic!("not a response")
    };
    assert_eq!(decoded.stored_at, at(1_700_000_000_123));
    assert_eq!(decoded.status, status);
    assert_eq!(decoded.headers, headers);
    let values: Vec<_> = decoded.headers.get_all("x-multi").iter().collect();
    assert_eq!(values, ["one", "two"], "order of repeated headers kept");
    assert_eq!(decoded.body, "hello world");
}

/// How a response's load went forward rides in its kind, which the decoder reads as a
/// response whatever it says; the bytes of kind 0 are fixed, so readers that know only kinds
/// 0 and 2 read these entries too.
#[test]
fn the_load_s_forward_is_kept_and_kind_0_bytes_are_fixed() {
    let (status, headers, body) = sample();
    let fields: Vec<_> = headers.iter().collect();
    let mut decoded = Vec::new();
    for forward in [Forward::Loaded, Forward::Refreshed, Forward::Revalidated] {
        let entry = encode_response(at(7), status, &fields, &body, forward).unwrap();
        assert_eq!(super::forward(&entry), forward);
        assert!(accepts_primary(&entry) && accepts_variant(&entry));
        decoded.push(decode(&entry).unwrap());
    }
    assert!(decoded.windows(2).all(|pair| pair[0] == pair[1]));
    let kind_0 = b"\x02\x00\x00\x00\x00\x00\x00\x00\x00\x07\x00\xc8\x00\x00body";
    let entry = encode_response(
        at(7),
        StatusCode::OK,
        &[],
        &[Bytes::from_static(b"body")],
        Forward::Loaded,
    );
    assert_eq!(entry.as_deref(), Some(&kind_0[..]));
}

#[test]
fn round_trips_a_vary_marker() {
    let marker = VaryMarker {
        stored_at: at(42),
        ttl: Duration::from_secs(60),
        generation: u64::MAX - 7,
        names: vec![
            HeaderName::from_static("accept-encoding"),
            HeaderName::from_static("x-tenant"),
        ],
    };
    let entry = encode_vary(&marker).unwrap();
    assert_eq!(decode(&entry), Ok(Decoded::Vary(marker.clone())));
    assert!(accepts_primary(&entry) && !accepts_variant(&entry));
    assert_eq!(marker.remaining(at(42 + 10_000)), Duration::from_secs(50));
    assert_eq!(marker.remaining(at(0)), Duration::from_secs(60));
    assert_eq!(marker.remaining(at(1 << 50)), Duration::ZERO);
    let mut longer = entry.to_vec();
    longer.push(0);
    assert_eq!(decode(&Bytes::from(longer)), Err(Malformed));
}

#[test]
fn every_truncation_is_malformed_not_a_panic() {
    let entry = encode_sample();
    let body_start = entry.len() - "hello world".len();
    for cut in 0..body_start {
        assert_eq!(decode(&entry.slice(..cut)), Err(Malformed), "cut at {cut}");
    }
}

#[test]
fn a_huge_header_count_is_malformed_not_a_panic() {
    let (status, _, body) = sample();
    // More distinct names than `http`'s header map holds (32768).
    let names: Vec<HeaderName> = (0..40_000)
        .map(|i| HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap())
        .collect();
    let value = HeaderValue::from_static("v");
    let many: Vec<_> = names.iter().map(|name| (name, &value)).collect();
    let entry = encode_response(at(0), status, &many, &body, Forward::Loaded).unwrap();
    assert!(decode(&entry).is_err(), "too many headers");
    // A count that promises more than the entry holds.
    let mut lying = entry[..14].to_vec();
    lying[12..14].copy_from_slice(&u16::MAX.to_be_bytes());
    assert!(decode(&Bytes::from(lying)).is_err(), "a lying count");
}

#[test]
fn invalid_fields_are_malformed() {
    let head = |kind: u8| {
        let mut v = vec![VERSION, kind];
        v.extend_from_slice(&0u64.to_be_bytes());
        v
    };
    let response = |rest: &[u8]| Bytes::from([&head(KIND_RESPONSE)[..], rest].concat());
    // The version this codec wrote before.
    assert_eq!(
        decode(&Bytes::from_static(b"\x01\x00\xc8\x00\x00")),
        Err(Malformed)
    );
    assert_eq!(decode(&Bytes::from(head(7))), Err(Malformed), "kind 7");
    assert_eq!(
        decode(&response(b"\x00\x05\x00\x00")),
        Err(Malformed),
        "status 5"
    );
    // A header name with a space.
    let bad = response(b"\x00\xc8\x00\x01\x00\x03a b\x00\x00\x00\x01v");
    assert_eq!(decode(&bad), Err(Malformed));
    // A header value with a newline.
    let bad = response(b"\x00\xc8\x00\x01\x00\x01a\x00\x00\x00\x02\r\n");
    assert_eq!(decode(&bad), Err(Malformed));
    // A length far past the end.
    let bad = response(b"\x00\xc8\x00\x01\x00\x01a\xff\xff\xff\xffv");
    assert_eq!(decode(&bad), Err(Malformed));
    // A stored-at time past what `SystemTime` holds is not a panic.
    let mut far = vec![VERSION, KIND_RESPONSE];
    far.extend_from_slice(&u64::MAX.to_be_bytes());
    far.extend_from_slice(b"\x00\xc8\x00\x00");
    let _ = decode(&Bytes::from(far));
    // Vary markers: no names, too many names, a bad name.
    let vary = |rest: &[u8]| {
        let mut v = head(KIND_VARY);
        v.extend_from_slice(&1000u64.to_be_bytes());
        v.extend_from_slice(&7u64.to_be_bytes());
        v.extend_from_slice(rest);
        Bytes::from(v)
    };
    // A marker of kind 1, without a generation.
    let mut old = head(1);
    old.extend_from_slice(&1000u64.to_be_bytes());
    old.extend_from_slice(b"\x00\x01\x00\x01a");
    assert_eq!(decode(&Bytes::from(old)), Err(Malformed));
    assert_eq!(decode(&vary(b"\x00\x00")), Err(Malformed));
    assert_eq!(decode(&vary(b"\xff\xff\x00\x01a")), Err(Malformed));
    assert_eq!(decode(&vary(b"\x00\x01\x00\x01 ")), Err(Malformed));
    assert!(matches!(
        decode(&vary(b"\x00\x01\x00\x01a")),
        Ok(Decoded::Vary(_))
    ));
}

fn header_name() -> impl Strategy<Value = HeaderName> {
    proptest::string::string_regex("[a-zA-Z0-9!#$%&'*+.^_`|~-]{1,40}")
        .expect("a valid regex")
        .prop_map(|s| HeaderName::from_bytes(s.as_bytes()).expect("a token is a name"))
}

fn header_value() -> impl Strategy<Value = HeaderValue> {
    proptest::collection::vec(any::<u8>(), 0..64).prop_map(|mut bytes| {
        // Every byte but the controls `http` refuses.
        bytes.retain(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f));
        HeaderValue::from_bytes(&bytes).expect("no refused bytes")
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_decode_or_fail_without_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        kind in 0u8..5,
        prefixed in any::<bool>(),
    ) {
        let mut entry = Vec::new();
        if prefixed {
            // Reach past the version check most of the time.
            entry.extend_from_slice(&[VERSION, kind]);
        }
        entry.extend_from_slice(&bytes);
        let entry = Bytes::from(entry);
        let decoded = decode(&entry);
        prop_assert_eq!(accepts_primary(&entry), decoded.is_ok());
        prop_assert_eq!(accepts_variant(&entry), matches!(decoded, Ok(Decoded::Response(_))));
    }

    #[test]
    fn responses_round_trip(
        status in 100u16..1000,
        stored_at in 0u64..(1 << 45),
        headers in proptest::collection::vec((header_name(), header_value()), 0..20),
        body in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 0..5),
    ) {
        let status = StatusCode::from_u16(status).unwrap();
        let pairs: Vec<_> = headers.iter().map(|(n, v)| (n, v)).collect();
        let chunks: Vec<Bytes> = body.iter().cloned().map(Bytes::from).collect();
        let entry = encode_response(at(stored_at), status, &pairs, &chunks, Forward::Loaded).unwrap();
        let Ok(Decoded::Response(decoded)) = decode(&entry) else {
            return Err(TestCaseError::fail("not a response"));
        };
        prop_assert_eq!(decoded.stored_at, at(stored_at));
        prop_assert_eq!(decoded.status, status);
        let mut want = HeaderMap::new();
        for (name, value) in &headers {
            want.append(name.clone(), value.clone());
        }
        prop_assert_eq!(decoded.headers, want);
        prop_assert_eq!(decoded.body, body.concat());
    }

    #[test]
    fn vary_markers_round_trip(
        names in proptest::collection::btree_set("[a-z0-9-]{1,20}", 1..=MAX_VARY_NAMES),
        stored_at in 0u64..(1 << 45),
        ttl in 0u64..(1 << 40),
        generation in any::<u64>(),
    ) {
        let marker = VaryMarker {
            stored_at: at(stored_at),
            ttl: Duration::from_millis(ttl),
            generation,
            names: names.iter().map(|n| HeaderName::from_bytes(n.as_bytes()).unwrap()).collect(),
        };
        let entry = encode_vary(&marker).unwrap();
        prop_assert_eq!(decode(&entry), Ok(Decoded::Vary(marker)));
    }
}

/// A response for the requests that waited for its load (kind 6) keeps what a stored one
/// keeps, the kind of its load, and the variant its waiters are matched by (its names and
/// digest); one cut short, or with another kind of load inside, is malformed, and so is
/// kind 5, which carried the digest without its names.
#[test]
fn a_response_for_waiters_round_trips_with_its_variant() {
    let (status, headers, body) = sample();
    let fields = headers.iter().collect::<Vec<_>>();
    let names = vec![
        HeaderName::from_static("accept-language"),
        HeaderName::from_static("x-forwarded-host"),
    ];
    let mut request = HeaderMap::new();
    request.insert("accept-language", HeaderValue::from_static("fr"));
    let variant = VariantId::of("primary", names, &request);
    for forward in [Forward::Loaded, Forward::Refreshed] {
        let entry = encode_for_waiters(at(7), (status, &fields), &body, forward, &variant).unwrap();
        let Ok(Decoded::ForWaiters(decoded, sent_with)) = decode(&entry) else {
            panic!("not a response for waiters")
        };
        assert_eq!(sent_with, variant);
        assert!(sent_with.matches("primary", &request));
        assert_eq!((decoded.status, &decoded.headers), (status, &headers));
        assert_eq!(decoded.body, "hello world");
        assert_eq!(decoded.stored_at, at(7));
        assert_eq!(forward_of(&entry), forward);
        assert!(accepts_primary(&entry) && accepts_variant(&entry));
        assert_eq!(decode(&entry.slice(..40)), Err(Malformed));
        let mut kind_5 = entry.to_vec();
        kind_5[1] = 5;
        assert_eq!(decode(&Bytes::from(kind_5)), Err(Malformed));
    }
    let mut revalidated =
        encode_for_waiters(at(7), (status, &fields), &body, Forward::Loaded, &variant)
            .unwrap()
            .to_vec();
    revalidated[10] = 4;
    assert_eq!(decode(&Bytes::from(revalidated)), Err(Malformed));
}

fn forward_of(entry: &Bytes) -> Forward {
    forward(entry)
}
