//! The one encoder of the layer's cache entries, and its decoder. An entry is a response, or
//! the "vary marker" a response with `Vary` leaves under its URL's key (see [`key`](super::key)):
//!
//! ```text
//! response: version (1) | 0, 3 or 4 | stored at (u64) | status (u16) | header count (u16)
//!           | { name len (u16) | name | value len (u32) | value }* | body
//! waiters:  version (1) | 6 | stored at (u64) | 0 or 3 (u8) | sent with (32 bytes)
//!           | name count (u16) | { name len (u16) | name }*
//!           | status (u16) | header count (u16) | { ... }* | body
//! vary:     version (1) | 2 | stored at (u64) | ttl (u64) | generation (u64)
//!           | name count (u16) | { name len (u16) | name }*
//! ```
//!
//! The version byte is 2; the kind byte says what follows:
//!
//! | kind | entry | read by |
//! | --- | --- | --- |
//! | 0 | a response a load for a missing entry stored ([`Forward::Loaded`]) | every reader of version 2 |
//! | 1 | a vary marker without a generation | none (malformed) |
//! | 2 | a vary marker | every reader of version 2 |
//! | 3 | a response the origin sent to the reload of a stale entry ([`Forward::Refreshed`]) | readers that know kinds 3 and 4; others find it malformed |
//! | 4 | a stale response the origin answered `304`, updated ([`Forward::Revalidated`]) | readers that know kinds 3 and 4; others find it malformed |
//! | 5 | a response for the waiters with a digest but not the names it is over | none (malformed: read as kind 6 is, it would match requests against a list of names of their own) |
//! | 6 | a response not stored, for the requests that waited for its load only ([`Decoded::ForWaiters`]): then the kind of the load as for a response (0 or 3), and the loading request's [`VariantId`]: the digest of its values of the fields it is keyed by, and their names | readers that know kind 6; others find it malformed (and load) |
//!
//! A response's kind tells the requests collapsed onto the load that stored it, here or in
//! another process, how that load went to the origin (RFC 9211 §2.2, §2.3). The bytes of kind
//! 0 are fixed, so processes that know only kinds 0 and 2 share those entries with the others;
//! an entry they find malformed is a miss to them, loaded again and overwritten.
//!
//! Integers are big-endian; times are milliseconds (since the Unix epoch for "stored at"). The
//! body is the rest of the entry, so a decoded body shares the entry's buffer instead of
//! copying it. Anything malformed, including entries of another version of this codec and
//! vary markers of kind 1, decodes to [`Malformed`]: the engine then treats the entry as a
//! miss and overwrites it.

use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::http::rules::parse::MAX_VARY_NAMES;
use crate::http::stored::key::VariantId;
use crate::store::KeyDigest;

/// Why a load went to the origin and what the origin answered, as a request collapsed onto
/// it says (RFC 9211 §2.2, §2.3): the entry the load stored carries it (see
/// [this module](self)), so a request that waited for the load in another process says it
/// too. The names are those of the load's own `Served` (`serving/cache_status.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forward {
    /// No entry to revalidate: `fwd=uri-miss`, and the stored response's status.
    Loaded,
    /// A stale entry, which the origin answered with a new response (a `200` to the
    /// conditional reload, or a server error for the waiters): `fwd=stale`, and its status.
    Refreshed,
    /// A stale entry, which the origin answered `304`: `fwd=stale; fwd-status=304`.
    Revalidated,
}

const VERSION: u8 = 2;
const KIND_RESPONSE: u8 = 0;
/// Kind 1, the vary marker without a generation, is not read (see the table above).
const KIND_VARY: u8 = 2;
/// A response stored by the reload of a stale entry, which the origin answered with it.
const KIND_REFRESHED: u8 = 3;
/// A response stored by the reload of a stale entry, which the origin answered with `304`.
const KIND_REVALIDATED: u8 = 4;
/// A response for the requests that waited for its load only (kind 5, without the names
/// of its variant, is not read: see the table above).
const KIND_FOR_WAITERS: u8 = 6;

/// What a decoded entry holds: a stored response, the vary marker under a URL's key, or a
/// response for the requests that waited for its load.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decoded {
    Response(CachedResponse),
    Vary(VaryMarker),
    /// A response that is not stored, handed to the requests that waited for its load, here
    /// and in other processes (see [`encode_for_waiters`]): only those of the loading
    /// request's variant may take it.
    ForWaiters(CachedResponse, VariantId),
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
    encode(stored_at, (status, headers), body, forward, None)
}

/// Encodes a response for the requests that waited for its load only (see
/// [`Decoded::ForWaiters`]), as [`encode_response`] does, with `sent_with`: the loading
/// request's variant.
pub(crate) fn encode_for_waiters(
    stored_at: SystemTime,
    (status, headers): (StatusCode, &[(&HeaderName, &HeaderValue)]),
    body: &[Bytes],
    forward: Forward,
    sent_with: &VariantId,
) -> Option<Bytes> {
    encode(stored_at, (status, headers), body, forward, Some(sent_with))
}

/// The one writer of responses: kind 0, 3 or 4 as `forward` says, or kind 6 with `sent_with`.
fn encode(
    stored_at: SystemTime,
    (status, headers): (StatusCode, &[(&HeaderName, &HeaderValue)]),
    body: &[Bytes],
    forward: Forward,
    sent_with: Option<&VariantId>,
) -> Option<Bytes> {
    let count = u16::try_from(headers.len()).ok()?;
    let header_len: usize = headers
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum();
    let body_len: usize = body.iter().map(Bytes::len).sum();
    let mut buf = BytesMut::with_capacity(47 + header_len + body_len);
    buf.put_u8(VERSION);
    let kind = match forward {
        Forward::Loaded => KIND_RESPONSE,
        Forward::Refreshed => KIND_REFRESHED,
        Forward::Revalidated => KIND_REVALIDATED,
    };
    buf.put_u8(if sent_with.is_some() {
        KIND_FOR_WAITERS
    } else {
        kind
    });
    buf.put_u64(millis_since_epoch(stored_at));
    if let Some(sent_with) = sent_with {
        buf.put_u8(kind);
        buf.put_slice(sent_with.digest().as_bytes());
        put_names(&mut buf, sent_with.names())?;
    }
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
    let names_len: usize = marker.names.iter().map(|n| 2 + n.as_str().len()).sum();
    let mut buf = BytesMut::with_capacity(28 + names_len);
    buf.put_u8(VERSION);
    buf.put_u8(KIND_VARY);
    buf.put_u64(millis_since_epoch(marker.stored_at));
    buf.put_u64(u64::try_from(marker.ttl.as_millis()).unwrap_or(u64::MAX));
    buf.put_u64(marker.generation);
    put_names(&mut buf, &marker.names)?;
    Some(buf.freeze())
}

/// Writes a list of header names: their count, then each length-prefixed; `None` past
/// [`MAX_VARY_NAMES`].
fn put_names(buf: &mut BytesMut, names: &[HeaderName]) -> Option<()> {
    if names.len() > MAX_VARY_NAMES {
        return None;
    }
    buf.put_u16(u16::try_from(names.len()).ok()?);
    for name in names {
        buf.put_u16(u16::try_from(name.as_str().len()).ok()?);
        buf.put_slice(name.as_str().as_bytes());
    }
    Some(())
}

/// Reads a list written by [`put_names`].
fn take_names(buf: &mut Bytes) -> Result<Vec<HeaderName>, Malformed> {
    if buf.remaining() < 2 {
        return Err(Malformed);
    }
    let count = usize::from(buf.get_u16());
    if count > MAX_VARY_NAMES {
        return Err(Malformed);
    }
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let name = take(buf, 2)?;
        names.push(HeaderName::from_bytes(&name).map_err(|_| Malformed)?);
    }
    Ok(names)
}

/// Fields an answer from the cache adds to the stored ones (`Age`, `x-cache`, `Cache-Status`,
/// and `Content-Length` when missing): room is made for them when an entry is decoded, so the
/// answer does not grow the map again.
pub(crate) const ANSWER_FIELDS: usize = 4;

/// Decodes an entry written by [`encode_response`] or [`encode_vary`].
pub(crate) fn decode(entry: &Bytes) -> Result<Decoded, Malformed> {
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
            decode_response(stored_at, buf).map(Decoded::Response)
        }
        KIND_VARY => decode_vary(stored_at, buf).map(Decoded::Vary),
        KIND_FOR_WAITERS => {
            if buf.remaining() < 33 {
                return Err(Malformed);
            }
            if !matches!(buf.get_u8(), KIND_RESPONSE | KIND_REFRESHED) {
                return Err(Malformed);
            }
            let mut digest = [0u8; 32];
            buf.copy_to_slice(&mut digest);
            let names = take_names(&mut buf)?;
            let sent_with = VariantId::from_parts(names, KeyDigest::from_bytes(digest));
            let response = decode_response(stored_at, buf)?;
            Ok(Decoded::ForWaiters(response, sent_with))
        }
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
    let names = take_names(&mut buf)?;
    if names.is_empty() || buf.has_remaining() {
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
    let kind = match entry.get(1) {
        // The kind of its load follows the time it was made at.
        Some(&KIND_FOR_WAITERS) => entry.get(10),
        kind => kind,
    };
    match kind {
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
/// a response (stored, or for the requests that waited for its load).
pub(crate) fn accepts_variant(entry: &Bytes) -> bool {
    matches!(
        decode(entry),
        Ok(Decoded::Response(_) | Decoded::ForWaiters(..))
    )
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
mod tests;
