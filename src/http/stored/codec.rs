//! The one encoder of the layer's cache entries, and its decoder. An entry is a response, or
//! the "vary marker" a response with `Vary` leaves under its URL's key (see [`key`](super::key)):
//!
//! ```text
//! response: version (1) | 0, 3 or 4 | stored at (u64) | status (u16) | header count (u16)
//!           | { name len (u16) | name | value len (u32) | value }* | body
//! vary:     version (1) | 2 | stored at (u64) | ttl (u64) | generation (u64)
//!           | name count (u16) | { name len (u16) | name }*
//! ```
//!
//! A response's kind says how the load that stored it went to the origin ([`Forward`]), for
//! the requests collapsed onto that load, here or in another process (RFC 9211 §2.2, §2.3):
//! 0 for a missing entry, 3 for a stale one the origin answered with a new response, 4 for a
//! stale one it answered `304`. Kind 0 is what the release before kinds 3 and 4 wrote and
//! reads: that release's entries are read as they are, and it reads an entry of kind 3 or 4
//! as malformed (a miss, loaded again and overwritten), as it would any other version's.
//!
//! Integers are big-endian; times are milliseconds (since the Unix epoch for "stored at"). The
//! body is the rest of the entry, so a decoded body shares the entry's buffer instead of
//! copying it. Anything malformed, including entries of another version of this codec and
//! vary markers of kind 1 (from before markers had a generation), decodes to [`Malformed`]:
//! the engine then treats the entry as a miss and overwrites it.
//!
//! Past 500 lines only with its tests: the codec is about 260 lines, and the tests of every
//! kind, of the previous release's bytes and of malformed entries stand next to it.

use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::http::rules::parse::MAX_VARY_NAMES;
use crate::http::serving::cache_status::Forward;

const VERSION: u8 = 2;
const KIND_RESPONSE: u8 = 0;
/// Kind 1 was the vary marker without a generation: no longer read.
const KIND_VARY: u8 = 2;
/// A response stored by the reload of a stale entry, which the origin answered with it.
const KIND_REFRESHED: u8 = 3;
/// A response stored by the reload of a stale entry, which the origin answered with `304`.
const KIND_REVALIDATED: u8 = 4;

/// What a decoded entry holds: a stored response, or the vary marker under a URL's key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stored {
    Response(CachedResponse),
    Vary(VaryMarker),
}

/// A response as the cache keeps it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CachedResponse {
    /// When the response was generated, as far as the cache knows: when it was stored, less
    /// the `Age` it arrived with. `Age` is counted from here.
    pub(crate) stored_at: SystemTime,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// What the entry under a URL's key says when its response has `Vary`: the request header
/// fields that select a variant, how long the marker was stored for, and its generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VaryMarker {
    pub(crate) stored_at: SystemTime,
    pub(crate) ttl: Duration,
    /// Drawn at random for every marker stored, and part of every variant key under it (see
    /// [`key`](super::key#invalidating-a-url)): removing the marker makes its variants
    /// unreachable.
    pub(crate) generation: u64,
    /// Lowercase, sorted, distinct; at most [`MAX_VARY_NAMES`].
    pub(crate) names: Vec<HeaderName>,
}

impl VaryMarker {
    /// How long the marker has left, from its own stored-at time and TTL.
    pub(crate) fn remaining(&self, now: SystemTime) -> Duration {
        let age = now.duration_since(self.stored_at).unwrap_or_default();
        self.ttl.saturating_sub(age)
    }
}

/// The bytes are not an entry encoded by this version of the codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

/// Encodes a response: when it was stored, its status, the headers to keep and the body
/// chunks, in one buffer, and how the load that stored it went `forward`. Returns `None` if a
/// header is too long to encode (over 4 GiB) or there are over 65535.
pub(crate) fn encode_response(
    stored_at: SystemTime,
    status: StatusCode,
    headers: &[(&HeaderName, &HeaderValue)],
    body: &[Bytes],
    forward: Forward,
) -> Option<Bytes> {
    let count = u16::try_from(headers.len()).ok()?;
    let header_len: usize = headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum();
    let body_len: usize = body.iter().map(Bytes::len).sum();
    let mut buf = BytesMut::with_capacity(14 + header_len + body_len);
    buf.put_u8(VERSION);
    buf.put_u8(match forward {
        Forward::Loaded => KIND_RESPONSE,
        Forward::Refreshed => KIND_REFRESHED,
        Forward::Revalidated => KIND_REVALIDATED,
    });
    buf.put_u64(millis_since_epoch(stored_at));
    buf.put_u16(status.as_u16());
    buf.put_u16(count);
    for (name, value) in headers {
        // Header names are at most 64 KiB in `http`, so this cannot fail; checked anyway.
        buf.put_u16(u16::try_from(name.as_str().len()).ok()?);
        buf.put_slice(name.as_str().as_bytes());
        buf.put_u32(u32::try_from(value.len()).ok()?);
        buf.put_slice(value.as_bytes());
    }
    for chunk in body {
        buf.put_slice(chunk);
    }
    Some(buf.freeze())
}

/// Encodes a vary marker; `None` if it names more than [`MAX_VARY_NAMES`] fields.
pub(crate) fn encode_vary(marker: &VaryMarker) -> Option<Bytes> {
    if marker.names.len() > MAX_VARY_NAMES {
        return None;
    }
    let names_len: usize = marker.names.iter().map(|n| 2 + n.as_str().len()).sum();
    let mut buf = BytesMut::with_capacity(28 + names_len);
    buf.put_u8(VERSION);
    buf.put_u8(KIND_VARY);
    buf.put_u64(millis_since_epoch(marker.stored_at));
    buf.put_u64(u64::try_from(marker.ttl.as_millis()).unwrap_or(u64::MAX));
    buf.put_u64(marker.generation);
    buf.put_u16(u16::try_from(marker.names.len()).ok()?);
    for name in &marker.names {
        buf.put_u16(u16::try_from(name.as_str().len()).ok()?);
        buf.put_slice(name.as_str().as_bytes());
    }
    Some(buf.freeze())
}

/// Fields an answer from the cache adds to the stored ones (`Age`, `x-cache`, `Cache-Status`,
/// and `Content-Length` when missing): room is made for them when an entry is decoded, so the
/// answer does not grow the map again.
pub(crate) const ANSWER_FIELDS: usize = 4;

/// Decodes an entry written by [`encode_response`] or [`encode_vary`].
pub(crate) fn decode(entry: &Bytes) -> Result<Stored, Malformed> {
    let mut buf = entry.clone();
    if buf.remaining() < 10 || buf.get_u8() != VERSION {
        return Err(Malformed);
    }
    let kind = buf.get_u8();
    let stored_at = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_millis(buf.get_u64()))
        .ok_or(Malformed)?;
    match kind {
        KIND_RESPONSE | KIND_REFRESHED | KIND_REVALIDATED => {
            decode_response(stored_at, buf).map(Stored::Response)
        }
        KIND_VARY => decode_vary(stored_at, buf).map(Stored::Vary),
        _ => Err(Malformed),
    }
}

fn decode_response(stored_at: SystemTime, mut buf: Bytes) -> Result<CachedResponse, Malformed> {
    if buf.remaining() < 4 {
        return Err(Malformed);
    }
    let status = StatusCode::from_u16(buf.get_u16()).map_err(|_| Malformed)?;
    let count = buf.get_u16();
    // The count comes from the entry: reserve little up front, and let `try_append` refuse a
    // map larger than `http` allows instead of panicking.
    let mut headers = HeaderMap::try_with_capacity(usize::from(count).min(64) + ANSWER_FIELDS)
        .map_err(|_| Malformed)?;
    for _ in 0..count {
        let name = take(&mut buf, 2)?;
        let name = HeaderName::from_bytes(&name).map_err(|_| Malformed)?;
        let value = take(&mut buf, 4)?;
        let value = HeaderValue::from_maybe_shared(value).map_err(|_| Malformed)?;
        headers.try_append(name, value).map_err(|_| Malformed)?;
    }
    Ok(CachedResponse {
        stored_at,
        status,
        headers,
        body: buf,
    })
}

fn decode_vary(stored_at: SystemTime, mut buf: Bytes) -> Result<VaryMarker, Malformed> {
    if buf.remaining() < 18 {
        return Err(Malformed);
    }
    let ttl = Duration::from_millis(buf.get_u64());
    let generation = buf.get_u64();
    let count = usize::from(buf.get_u16());
    if count == 0 || count > MAX_VARY_NAMES {
        return Err(Malformed);
    }
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let name = take(&mut buf, 2)?;
        names.push(HeaderName::from_bytes(&name).map_err(|_| Malformed)?);
    }
    if buf.has_remaining() {
        return Err(Malformed);
    }
    Ok(VaryMarker {
        stored_at,
        ttl,
        generation,
        names,
    })
}

/// How the load that stored the response `entry` (one [`decode`] accepts) went to the origin;
/// read only for a request collapsed onto that load, or the load's own.
pub(crate) fn forward(entry: &Bytes) -> Forward {
    match entry.get(1) {
        Some(&KIND_REFRESHED) => Forward::Refreshed,
        Some(&KIND_REVALIDATED) => Forward::Revalidated,
        _ => Forward::Loaded,
    }
}

/// Whether the engine may hand these bytes to the layer as the entry under a URL's key: a
/// response or a vary marker. Anything else is a corrupt entry to the engine.
pub(crate) fn accepts_primary(entry: &Bytes) -> bool {
    decode(entry).is_ok()
}

/// Whether the engine may hand these bytes to the layer as the entry under a variant's key:
/// a response only.
pub(crate) fn accepts_variant(entry: &Bytes) -> bool {
    matches!(decode(entry), Ok(Stored::Response(_)))
}

/// Milliseconds since the Unix epoch; 0 before it.
pub(crate) fn millis_since_epoch(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Takes a length-prefixed field (`len_bytes` of big-endian length, then the field).
fn take(buf: &mut Bytes, len_bytes: usize) -> Result<Bytes, Malformed> {
    if buf.remaining() < len_bytes {
        return Err(Malformed);
    }
    let len = if len_bytes == 2 {
        usize::from(buf.get_u16())
    } else {
        usize::try_from(buf.get_u32()).map_err(|_| Malformed)?
    };
    if buf.remaining() < len {
        return Err(Malformed);
    }
    Ok(buf.split_to(len))
}

#[cfg(test)]
mod tests {
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
        let Ok(Stored::Response(decoded)) = decode(&encode_sample()) else {
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
    /// response whatever it says; kind 0 is byte for byte what the release before the other
    /// kinds wrote, so each release reads the other's plain entries.
    #[test]
    fn the_load_s_forward_is_kept_and_kind_0_is_the_previous_release_s() {
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
        let previous = b"\x02\x00\x00\x00\x00\x00\x00\x00\x00\x07\x00\xc8\x00\x00body";
        let entry = encode_response(
            at(7),
            StatusCode::OK,
            &[],
            &[Bytes::from_static(b"body")],
            Forward::Loaded,
        );
        assert_eq!(entry.as_deref(), Some(&previous[..]));
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
        assert_eq!(decode(&entry), Ok(Stored::Vary(marker.clone())));
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
        // A marker of kind 1, from before markers had a generation.
        let mut old = head(1);
        old.extend_from_slice(&1000u64.to_be_bytes());
        old.extend_from_slice(b"\x00\x01\x00\x01a");
        assert_eq!(decode(&Bytes::from(old)), Err(Malformed));
        assert_eq!(decode(&vary(b"\x00\x00")), Err(Malformed));
        assert_eq!(decode(&vary(b"\xff\xff\x00\x01a")), Err(Malformed));
        assert_eq!(decode(&vary(b"\x00\x01\x00\x01 ")), Err(Malformed));
        assert!(matches!(
            decode(&vary(b"\x00\x01\x00\x01a")),
            Ok(Stored::Vary(_))
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
            prop_assert_eq!(accepts_variant(&entry), matches!(decoded, Ok(Stored::Response(_))));
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
            let Ok(Stored::Response(decoded)) = decode(&entry) else {
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
            prop_assert_eq!(decode(&entry), Ok(Stored::Vary(marker)));
        }
    }
}
