//! The one encoder of responses into cache bytes, and its decoder.
//!
//! ```text
//! version (1) | status (u16) | header count (u16) | { name len (u16) | name | value len (u32) | value }* | body
//! ```
//!
//! All integers are big-endian. The body is the rest of the entry, so a decoded body shares the
//! entry's buffer instead of copying it. Anything malformed decodes to [`Malformed`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const VERSION: u8 = 1;

/// A response as the cache keeps it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CachedResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// The bytes are not a response encoded by this version of the codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

/// Encodes a status, the headers `store` keeps, and the body chunks, in one buffer.
/// Returns `None` if a header is too long to encode (over 4 GiB) or there are over 65535.
pub(crate) fn encode(
    status: StatusCode,
    headers: &[(&HeaderName, &HeaderValue)],
    body: &[Bytes],
) -> Option<Bytes> {
    let count = u16::try_from(headers.len()).ok()?;
    let header_len: usize = headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum();
    let body_len: usize = body.iter().map(Bytes::len).sum();
    let mut buf = BytesMut::with_capacity(5 + header_len + body_len);
    buf.put_u8(VERSION);
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

/// Decodes an entry written by [`encode`].
pub(crate) fn decode(entry: &Bytes) -> Result<CachedResponse, Malformed> {
    let mut buf = entry.clone();
    if buf.remaining() < 5 || buf.get_u8() != VERSION {
        return Err(Malformed);
    }
    let status = StatusCode::from_u16(buf.get_u16()).map_err(|_| Malformed)?;
    let count = buf.get_u16();
    // The count comes from the entry: reserve little up front, and let `try_append` refuse a
    // map larger than `http` allows instead of panicking.
    let mut headers =
        HeaderMap::try_with_capacity(usize::from(count).min(64)).map_err(|_| Malformed)?;
    for _ in 0..count {
        let name = take(&mut buf, 2)?;
        let name = HeaderName::from_bytes(&name).map_err(|_| Malformed)?;
        let value = take(&mut buf, 4)?;
        let value = HeaderValue::from_maybe_shared(value).map_err(|_| Malformed)?;
        headers.try_append(name, value).map_err(|_| Malformed)?;
    }
    Ok(CachedResponse {
        status,
        headers,
        body: buf,
    })
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

    fn sample() -> (StatusCode, HeaderMap, Vec<Bytes>) {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/html"));
        headers.append("x-multi", HeaderValue::from_static("one"));
        headers.append("x-multi", HeaderValue::from_static("two"));
        headers.insert("x-bin", HeaderValue::from_bytes(b"\xff\x80ok").unwrap());
        let body = vec![Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
        (StatusCode::NOT_FOUND, headers, body)
    }

    #[test]
    fn round_trips_status_headers_and_body() {
        let (status, headers, body) = sample();
        let entry = encode(status, &headers.iter().collect::<Vec<_>>(), &body).unwrap();
        let decoded = decode(&entry).unwrap();
        assert_eq!(decoded.status, status);
        assert_eq!(decoded.headers, headers);
        let values: Vec<_> = decoded.headers.get_all("x-multi").iter().collect();
        assert_eq!(values, ["one", "two"], "order of repeated headers kept");
        assert_eq!(decoded.body, "hello world");
    }

    #[test]
    fn every_truncation_is_malformed_not_a_panic() {
        let (status, headers, body) = sample();
        let entry = encode(status, &headers.iter().collect::<Vec<_>>(), &body).unwrap();
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
        let entry = encode(status, &many, &body).unwrap();
        assert!(decode(&entry).is_err(), "too many headers");
        // A count that promises more than the entry holds.
        let mut lying = entry[..5].to_vec();
        lying[3..5].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(decode(&Bytes::from(lying)).is_err(), "a lying count");
    }

    #[test]
    fn invalid_fields_are_malformed() {
        assert_eq!(
            decode(&Bytes::from_static(b"\x02\x00\xc8\x00\x00")),
            Err(Malformed)
        );
        assert_eq!(
            decode(&Bytes::from_static(b"\x01\x00\x05\x00\x00")),
            Err(Malformed),
            "status 5"
        );
        // A header name with a space.
        let bad = b"\x01\x00\xc8\x00\x01\x00\x03a b\x00\x00\x00\x01v";
        assert_eq!(decode(&Bytes::from_static(bad)), Err(Malformed));
        // A header value with a newline.
        let bad = b"\x01\x00\xc8\x00\x01\x00\x01a\x00\x00\x00\x02\r\n";
        assert_eq!(decode(&Bytes::from_static(bad)), Err(Malformed));
        // A length far past the end.
        let bad = b"\x01\x00\xc8\x00\x01\x00\x01a\xff\xff\xff\xffv";
        assert_eq!(decode(&Bytes::from_static(bad)), Err(Malformed));
    }
}
