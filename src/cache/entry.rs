//! The bytes the engine keeps in a store: a small versioned header, then the payload.
//!
//! ```text
//! "TS" | version (2) | kind | load time in ms (u32, big-endian)
//!      | load start in ms since the UNIX epoch (u64, big-endian) | payload
//! ```
//!
//! The load start is where the store's fence looks for it (bytes 8 to 16, see
//! [`store::load_start`](crate::store::load_start)): a write after a wait timeout is refused
//! where the stored value's load started later. Version 1 entries (before the load start)
//! are still read; they carry no load start, so any write may replace them.
//!
//! A value with tags (kind 2) has, between the header and the payload, the tag clock read
//! before its load (u64) and its tags (a u16 count, then each tag's 32-byte digest).
//!
//! The header tells values from "pass" markers and carries how long the load took, and its
//! magic lets the engine tell its own entries from foreign or corrupt bytes, which are treated
//! as a miss and overwritten.

use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::store::KeyDigest;

const MAGIC: &[u8; 2] = b"TS";
const VERSION: u8 = 2;
/// The version before the load start, still read.
const VERSION_1: u8 = 1;
const KIND_VALUE: u8 = 0;
const KIND_PASS: u8 = 1;
const KIND_TAGGED: u8 = 2;
/// The most tags a value may carry.
pub(crate) const MAX_TAGS: usize = 1024;
/// Length of the header in front of the payload.
pub(crate) const HEADER_LEN: usize = 16;
/// Length of a version 1 header.
const HEADER_1_LEN: usize = 8;

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

/// Encodes a value whose load started at `started` and took `load_time` (with at most
/// [`MAX_TAGS`] tags: any more are the caller's error); returns the entry and its payload,
/// which shares the entry's buffer.
pub(crate) fn encode_value(
    payload: &[u8],
    started: SystemTime,
    load_time: Duration,
    tags: Option<&Tagged>,
) -> (Bytes, Bytes) {
    let tags_len = tags.map_or(0, |t| 10 + 32 * t.tags.len().min(MAX_TAGS));
    let mut buf = BytesMut::with_capacity(HEADER_LEN + tags_len + payload.len());
    match tags {
        None => put_header(&mut buf, KIND_VALUE, started, load_time),
        Some(tagged) => {
            put_header(&mut buf, KIND_TAGGED, started, load_time);
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

/// Encodes a pass marker, from a load that started at `started`.
pub(crate) fn encode_pass(started: SystemTime) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN);
    put_header(&mut buf, KIND_PASS, started, Duration::ZERO);
    buf.freeze()
}

fn put_header(buf: &mut BytesMut, kind: u8, started: SystemTime, load_time: Duration) {
    buf.put_slice(MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(kind);
    buf.put_u32(u32::try_from(load_time.as_millis()).unwrap_or(u32::MAX));
    // A clock before 1970 writes 0: the earliest start, which any write may replace.
    let since_epoch = started.duration_since(SystemTime::UNIX_EPOCH);
    let millis = since_epoch.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    buf.put_u64(millis);
}

/// Decodes an entry; anything that is not a well-formed entry of this version (or of
/// version 1) is [`Corrupt`].
pub(crate) fn decode(bytes: &Bytes) -> Result<Entry, Corrupt> {
    let header_len = match bytes.get(..3) {
        Some([m1, m2, VERSION]) if [*m1, *m2] == *MAGIC => HEADER_LEN,
        Some([m1, m2, VERSION_1]) if [*m1, *m2] == *MAGIC => HEADER_1_LEN,
        _ => return Err(Corrupt),
    };
    let header = bytes.get(..header_len).ok_or(Corrupt)?;
    let load_ms = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let load_time = Duration::from_millis(u64::from(load_ms));
    match header[3] {
        KIND_VALUE => Ok(Entry::Value {
            payload: bytes.slice(header_len..),
            load_time,
            tags: None,
        }),
        KIND_TAGGED => {
            let mut rest = bytes.slice(header_len..);
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
        KIND_PASS if bytes.len() == header_len => Ok(Entry::Pass),
        _ => Err(Corrupt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load start, to the millisecond.
    fn at(millis: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(millis)
    }

    #[test]
    fn round_trips() {
        let (v, _) = encode_value(b"hello", at(5), Duration::from_millis(1234), None);
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
        let (v, payload) = encode_value(b"tagged", at(5), Duration::from_millis(7), Some(&tagged));
        assert_eq!(payload, "tagged");
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"tagged"),
                load_time: Duration::from_millis(7),
                tags: Some(tagged),
            })
        );
        assert_eq!(decode(&encode_pass(at(5))), Ok(Entry::Pass));
        assert_eq!(
            decode(&encode_value(b"", at(5), Duration::MAX, None).0),
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
            // Version 2: a header cut short, a pass marker with more.
            b"TS\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            b"TS\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00extra",
        ] {
            assert_eq!(
                decode(&Bytes::copy_from_slice(bad)),
                Err(Corrupt),
                "{bad:?}"
            );
        }
    }

    /// Entries written before the load start (version 1, an 8-byte header) are still read.
    #[test]
    fn version_1_entries_are_read() {
        let v1 = Bytes::from_static(b"TS\x01\x00\x00\x00\x00\x07old");
        assert_eq!(
            decode(&v1),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"old"),
                load_time: Duration::from_millis(7),
                tags: None,
            })
        );
        let pass = Bytes::from_static(b"TS\x01\x01\x00\x00\x00\x00");
        assert_eq!(decode(&pass), Ok(Entry::Pass));
        assert_eq!(
            crate::store::load_start(&v1),
            None,
            "no load start: writable"
        );
    }

    /// The load start sits where the store's fence reads it, for every kind of entry.
    #[test]
    fn the_store_finds_the_load_start() {
        let started = at(1_790_000_000_123);
        let tagged = Tagged {
            clock: 1,
            tags: vec![KeyDigest::of(b"t")],
        };
        for encoded in [
            encode_value(b"v", started, Duration::from_millis(9), None).0,
            encode_value(b"v", started, Duration::ZERO, Some(&tagged)).0,
            encode_pass(started),
        ] {
            assert_eq!(crate::store::load_start(&encoded), Some(1_790_000_000_123));
        }
        let before_1970 = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        let (v, _) = encode_value(b"v", before_1970, Duration::ZERO, None);
        assert_eq!(crate::store::load_start(&v), Some(0));
    }

    #[test]
    fn payload_shares_the_buffer() {
        let (v, _) = encode_value(b"abc", at(5), Duration::ZERO, None);
        let Ok(Entry::Value { payload, .. }) = decode(&v) else {
            panic!("not a value")
        };
        assert_eq!(payload.as_ptr(), v[HEADER_LEN..].as_ptr());
    }
}
