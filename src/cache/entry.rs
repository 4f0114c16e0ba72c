//! The bytes the engine keeps in a store: a small versioned header, then the payload.
//!
//! ```text
//! "TS" | version (1) | kind | load time in ms (u32, big-endian) | payload
//! ```
//!
//! The header tells values from "pass" markers and carries how long the load took, and its
//! magic lets the engine tell its own entries from foreign or corrupt bytes, which are treated
//! as a miss and overwritten.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

const MAGIC: &[u8; 2] = b"TS";
const VERSION: u8 = 1;
const KIND_VALUE: u8 = 0;
const KIND_PASS: u8 = 1;
/// Length of the header in front of the payload.
pub(crate) const HEADER_LEN: usize = 8;

/// A decoded store entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A cached value; `payload` shares the buffer the entry was read into.
    Value { payload: Bytes, load_time: Duration },
    /// "Do not wait for this key, go to the backend": its last load was not cacheable.
    Pass,
}

/// The entry's bytes were not written by this engine (or not by this version of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// Encodes a value; the payload of the result is `encoded.slice(HEADER_LEN..)`.
pub(crate) fn encode_value(payload: &[u8], load_time: Duration) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + payload.len());
    put_header(&mut buf, KIND_VALUE, load_time);
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
    match header[3] {
        KIND_VALUE => Ok(Entry::Value {
            payload: bytes.slice(HEADER_LEN..),
            load_time: Duration::from_millis(u64::from(load_ms)),
        }),
        KIND_PASS if bytes.len() == HEADER_LEN => Ok(Entry::Pass),
        _ => Err(Corrupt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let v = encode_value(b"hello", Duration::from_millis(1234));
        assert_eq!(
            decode(&v),
            Ok(Entry::Value {
                payload: Bytes::from_static(b"hello"),
                load_time: Duration::from_millis(1234)
            })
        );
        assert_eq!(decode(&encode_pass()), Ok(Entry::Pass));
        assert_eq!(
            decode(&encode_value(b"", Duration::MAX)),
            Ok(Entry::Value {
                payload: Bytes::new(),
                load_time: Duration::from_millis(u64::from(u32::MAX))
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
        let v = encode_value(b"abc", Duration::ZERO);
        let Ok(Entry::Value { payload, .. }) = decode(&v) else {
            panic!("not a value")
        };
        assert_eq!(payload.as_ptr(), v[HEADER_LEN..].as_ptr());
    }
}
