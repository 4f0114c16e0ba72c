//! The bytes the engine keeps in a store: a small versioned header, then the payload.
//!
//! ```text
//! "TS" | version (1) | kind | load time in ms (u32, big-endian) | payload
//! ```
//!
//! A value with tags (kind 2) has, between the header and the payload, the tag clock read
//! before its load (u64) and its tags (a u16 count, then each tag's 32-byte digest).
//!
//! A value with stale windows of its own (see [`Windows`]) has the [`WINDOWS`] bit set in its
//! kind, and the two windows (each u32 milliseconds, big-endian) right after the header,
//! before its tags. Values without windows of their own are written exactly as before the bit
//! existed, so processes of an older release still read them (in a fleet of mixed versions,
//! an older process reads a value with windows as a foreign entry: a miss, overwritten).
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
/// The kind bit of a value whose stale windows follow the header.
const WINDOWS: u8 = 0x10;
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
        /// The value's own stale windows; `None`: the cache's.
        windows: Option<Windows>,
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

/// A value's own stale windows (RFC 5861): how long past its freshness it may be served
/// while a reload runs, and in place of a failed reload; `None`: the cache's window. Both
/// zero: never served stale ("must revalidate", RFC 9111 §4.2.4). Kept to the millisecond, up
/// to about 49 days (`u32::MAX` ms in the header means `None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Windows {
    pub(crate) while_revalidating: Option<Duration>,
    pub(crate) if_error: Option<Duration>,
}

impl Windows {
    /// Whether the value says anything of its own (else the header carries no windows).
    pub(crate) fn any(self) -> bool {
        self.while_revalidating.is_some() || self.if_error.is_some()
    }
}

fn put_window(buf: &mut BytesMut, window: Option<Duration>) {
    buf.put_u32(window.map_or(u32::MAX, |w| saturating_millis(w).min(u32::MAX - 1)));
}

fn get_window(rest: &mut Bytes) -> Option<Duration> {
    let ms = rest.get_u32();
    (ms != u32::MAX).then(|| Duration::from_millis(u64::from(ms)))
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
    windows: Option<Windows>,
) -> (Bytes, Bytes) {
    let tags_len = tags.map_or(0, |t| 10 + 32 * t.tags.len().min(MAX_TAGS));
    let windows = windows.filter(|w| w.any());
    let windows_len = windows.map_or(0, |_| 8);
    let mut buf = BytesMut::with_capacity(HEADER_LEN + windows_len + tags_len + payload.len());
    let kind = if tags.is_some() {
        KIND_TAGGED
    } else {
        KIND_VALUE
    };
    match windows {
        None => put_header(&mut buf, kind, load_time),
        Some(windows) => {
            put_header(&mut buf, kind | WINDOWS, load_time);
            put_window(&mut buf, windows.while_revalidating);
            put_window(&mut buf, windows.if_error);
        }
    }
    match tags {
        None => {}
        Some(tagged) => {
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
    buf.put_u32(saturating_millis(load_time));
}

fn saturating_millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Decodes an entry; anything that is not a well-formed entry of this version is [`Corrupt`].
pub(crate) fn decode(bytes: &Bytes) -> Result<Entry, Corrupt> {
    let header = bytes.get(..HEADER_LEN).ok_or(Corrupt)?;
    if &header[..2] != MAGIC || header[2] != VERSION {
        return Err(Corrupt);
    }
    let load_ms = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let load_time = Duration::from_millis(u64::from(load_ms));
    let mut rest = bytes.slice(HEADER_LEN..);
    let windows = if header[3] & WINDOWS != 0 {
        if rest.remaining() < 8 {
            return Err(Corrupt);
        }
        let while_revalidating = get_window(&mut rest);
        let if_error = get_window(&mut rest);
        Some(Windows {
            while_revalidating,
            if_error,
        })
    } else {
        None
    };
    match header[3] & !WINDOWS {
        KIND_VALUE => Ok(Entry::Value {
            payload: rest,
            load_time,
            tags: None,
            windows,
        }),
        KIND_TAGGED => {
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
                windows,
            })
        }
        KIND_PASS if windows.is_none() && bytes.len() == HEADER_LEN => Ok(Entry::Pass),
        _ => Err(Corrupt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let (v, _) = encode_value(b"hello", Duration::from_millis(1234), None, None);
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"hello"),
                load_time: Duration::from_millis(1234),
                tags: None,
                windows: None,
            })
        );
        let tagged = Tagged {
            clock: 42,
            tags: vec![KeyDigest::of(b"a"), KeyDigest::of(b"b")],
        };
        let (v, payload) = encode_value(b"tagged", Duration::from_millis(7), Some(&tagged), None);
        assert_eq!(payload, "tagged");
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"tagged"),
                load_time: Duration::from_millis(7),
                tags: Some(tagged),
                windows: None,
            })
        );
        assert_eq!(decode(&encode_pass()), Ok(Entry::Pass));
        assert_eq!(
            decode(&encode_value(b"", Duration::MAX, None, None).0),
            Ok(Entry::Value {
                payload: Bytes::new(),
                load_time: Duration::from_millis(u64::from(u32::MAX)),
                tags: None,
                windows: None,
            })
        );
    }

    #[test]
    fn windows_round_trip_with_and_without_tags() {
        let windows = Windows {
            while_revalidating: Some(Duration::from_secs(30)),
            if_error: Some(Duration::from_millis(1500)),
        };
        let (v, payload) = encode_value(b"w", Duration::from_millis(3), None, Some(windows));
        assert_eq!(payload, "w");
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"w"),
                load_time: Duration::from_millis(3),
                tags: None,
                windows: Some(windows),
            })
        );
        let tagged = Tagged {
            clock: 9,
            tags: vec![KeyDigest::of(b"t")],
        };
        // One window said, the other the cache's.
        let windows = Windows {
            while_revalidating: None,
            if_error: Some(Duration::ZERO),
        };
        let (v, _) = encode_value(b"wt", Duration::ZERO, Some(&tagged), Some(windows));
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"wt"),
                load_time: Duration::ZERO,
                tags: Some(tagged),
                windows: Some(windows),
            })
        );
        // Windows past what the header holds saturate (about 49 days); windows that say
        // nothing are not written.
        let huge = Windows {
            while_revalidating: Some(Duration::MAX),
            if_error: None,
        };
        let Ok(Entry::Value { windows, .. }) =
            decode(&encode_value(b"", Duration::ZERO, None, Some(huge)).0)
        else {
            panic!("not a value")
        };
        assert_eq!(
            windows.and_then(|w| w.while_revalidating),
            Some(Duration::from_millis(u64::from(u32::MAX - 1)))
        );
        let (plain, _) = encode_value(b"p", Duration::ZERO, None, Some(Windows::default()));
        assert_eq!(plain, encode_value(b"p", Duration::ZERO, None, None).0);
    }

    #[test]
    fn values_without_windows_keep_the_first_release_bytes() {
        // What a process of the first release writes and reads: kind 0, no windows block.
        let (v, _) = encode_value(b"old", Duration::from_millis(2), None, None);
        assert_eq!(&v[..], b"TS\x01\x00\x00\x00\x00\x02old");
        let written_by_older = Bytes::from_static(b"TS\x01\x00\x00\x00\x00\x05x");
        assert_eq!(
            decode(&written_by_older),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"x"),
                load_time: Duration::from_millis(5),
                tags: None,
                windows: None,
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
            // Windows cut short, and a pass marker with windows.
            b"TS\x01\x10\x00\x00\x00\x00\x00\x00\x00",
            b"TS\x01\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
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
        let (v, _) = encode_value(b"abc", Duration::ZERO, None, None);
        let Ok(Entry::Value { payload, .. }) = decode(&v) else {
            panic!("not a value")
        };
        assert_eq!(payload.as_ptr(), v[HEADER_LEN..].as_ptr());
    }
}
