//! The bytes the engine keeps in a store: a small versioned header, then the payload.
//!
//! ```text
//! "TS" | version (1) | kind | load time in ms (u32, big-endian) | payload
//! ```
//!
//! A value with tags (kind 2) has, between the header and the payload, the tag clock read
//! before its load (u64) and its tags (a u16 count, then each tag's 32-byte digest).
//!
//! A waiters' answer (kind 3) is the payload of a load whose result is not kept (see
//! [`Loaded::for_waiters`](super::Loaded::for_waiters)), for the calls that waited for it.
//!
//! The header tells values from "pass" markers and carries how long the load took, and its
//! magic lets the engine tell its own entries from foreign or corrupt bytes, which are treated
//! as a miss and overwritten.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::store::KeyDigest;

const MAGIC: &[u8; 2] = b"TS";
const VERSION: u8 = 1;
const KIND_VALUE: u8 = 0;
const KIND_PASS: u8 = 1;
const KIND_TAGGED: u8 = 2;
const KIND_WAITERS: u8 = 3;
/// The most tags a value may carry.
pub(crate) const MAX_TAGS: usize = 1024;
/// Length of the header in front of the payload.
pub(crate) const HEADER_LEN: usize = 8;

/// A decoded store entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A cached value; `payload` shares the buffer the entry was read into.
    Value {
        payload: Bytes,
        load_time: Duration,
        tags: Option<Tagged>,
    },
    /// "Do not wait for this key, go to the backend": its last load was not cacheable.
    Pass,
    /// The result of the last load, for the calls that waited for it only: a call that
    /// started after it was written loads again.
    ForWaiters { payload: Bytes },
}

/// The tags of a value: the namespace's tag clock read before the value was loaded, and the
/// digests of its tags. An invalidation of one of them at a later clock makes the value a miss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tagged {
    pub(crate) clock: u64,
    pub(crate) tags: Vec<KeyDigest>,
}

/// The entry's bytes were not written by this engine (or not by this version of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// Encodes a value (with at most [`MAX_TAGS`] tags: any more are the caller's error); returns
/// the entry and its payload, which shares the entry's buffer.
pub(crate) fn encode_value(
    payload: &[u8],
    load_time: Duration,
    tags: Option<&Tagged>,
) -> (Bytes, Bytes) {
    let tags_len = tags.map_or(0, |t| 10 + 32 * t.tags.len().min(MAX_TAGS));
    let mut buf = BytesMut::with_capacity(HEADER_LEN + tags_len + payload.len());
    match tags {
        None => put_header(&mut buf, KIND_VALUE, load_time),
        Some(tagged) => {
            put_header(&mut buf, KIND_TAGGED, load_time);
            buf.put_u64(tagged.clock);
            let count = tagged.tags.len().min(MAX_TAGS);
            buf.put_u16(u16::try_from(count).unwrap_or(u16::MAX));
            for tag in &tagged.tags[..count] {
                buf.put_slice(tag.as_bytes());
            }
        }
    }
    let start = buf.len();
    buf.put_slice(payload);
    let encoded = buf.freeze();
    let payload = encoded.slice(start..);
    (encoded, payload)
}

/// Encodes a waiters' answer.
pub(crate) fn encode_for_waiters(payload: &[u8], load_time: Duration) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + payload.len());
    put_header(&mut buf, KIND_WAITERS, load_time);
    buf.put_slice(payload);
    buf.freeze()
}

/// Encodes a pass marker.
pub(crate) fn encode_pass() -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN);
    put_header(&mut buf, KIND_PASS, Duration::ZERO);
    buf.freeze()
}

fn put_header(buf: &mut BytesMut, kind: u8, load_time: Duration) {
    buf.put_slice(MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(kind);
    buf.put_u32(u32::try_from(load_time.as_millis()).unwrap_or(u32::MAX));
}

/// Decodes an entry; anything that is not a well-formed entry of this version is [`Corrupt`].
pub(crate) fn decode(bytes: &Bytes) -> Result<Entry, Corrupt> {
    let header = bytes.get(..HEADER_LEN).ok_or(Corrupt)?;
    if &header[..2] != MAGIC || header[2] != VERSION {
        return Err(Corrupt);
    }
    let load_ms = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let load_time = Duration::from_millis(u64::from(load_ms));
    match header[3] {
        KIND_VALUE => Ok(Entry::Value {
            payload: bytes.slice(HEADER_LEN..),
            load_time,
            tags: None,
        }),
        KIND_TAGGED => {
            let mut rest = bytes.slice(HEADER_LEN..);
            if rest.remaining() < 10 {
                return Err(Corrupt);
            }
            let clock = rest.get_u64();
            let count = usize::from(rest.get_u16());
            if count > MAX_TAGS || rest.remaining() < 32 * count {
                return Err(Corrupt);
            }
            let tags = (0..count)
                .map(|_| {
                    let mut digest = [0u8; 32];
                    rest.copy_to_slice(&mut digest);
                    KeyDigest::from_bytes(digest)
                })
                .collect();
            Ok(Entry::Value {
                payload: rest,
                load_time,
                tags: Some(Tagged { clock, tags }),
            })
        }
        KIND_PASS if bytes.len() == HEADER_LEN => Ok(Entry::Pass),
        KIND_WAITERS => Ok(Entry::ForWaiters {
            payload: bytes.slice(HEADER_LEN..),
        }),
        _ => Err(Corrupt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let (v, _) = encode_value(b"hello", Duration::from_millis(1234), None);
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"hello"),
                load_time: Duration::from_millis(1234),
                tags: None,
            })
        );
        let tagged = Tagged {
            clock: 42,
            tags: vec![KeyDigest::of(b"a"), KeyDigest::of(b"b")],
        };
        let (v, payload) = encode_value(b"tagged", Duration::from_millis(7), Some(&tagged));
        assert_eq!(payload, "tagged");
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"tagged"),
                load_time: Duration::from_millis(7),
                tags: Some(tagged),
            })
        );
        assert_eq!(decode(&encode_pass()), Ok(Entry::Pass));
        assert_eq!(
            decode(&encode_for_waiters(b"503", Duration::ZERO)),
            Ok(Entry::ForWaiters {
                payload: Bytes::from_static(b"503")
            })
        );
        assert_eq!(
            decode(&encode_value(b"", Duration::MAX, None).0),
            Ok(Entry::Value {
                payload: Bytes::new(),
                load_time: Duration::from_millis(u64::from(u32::MAX)),
                tags: None,
            })
        );
    }

    #[test]
    fn foreign_bytes_are_corrupt() {
        for bad in [
            &b""[..],
            b"TS",
            b"hello world",
            b"TS\x02\x00\x00\x00\x00\x00",
            b"TS\x01\x07\x00\x00\x00\x00",
            b"TS\x01\x01\x00\x00\x00\x00extra",
            // Tagged: a clock cut short, and a count of tags that are not there.
            b"TS\x01\x02\x00\x00\x00\x00\x00\x00",
            b"TS\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01",
        ] {
            assert_eq!(
                decode(&Bytes::copy_from_slice(bad)),
                Err(Corrupt),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn payload_shares_the_buffer() {
        let (v, _) = encode_value(b"abc", Duration::ZERO, None);
        let Ok(Entry::Value { payload, .. }) = decode(&v) else {
            panic!("not a value")
        };
        assert_eq!(payload.as_ptr(), v[HEADER_LEN..].as_ptr());
    }
}
