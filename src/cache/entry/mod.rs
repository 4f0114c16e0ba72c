//! The bytes the engine keeps in a store: a small versioned header, then the payload.
//!
//! ```text
//! "TS" | version (2) | kind | load time in ms (u32, big-endian)
//!      | load start in ms since the UNIX epoch (u64, big-endian)
//!      | [stale windows] | [life] | [tag clock, generation, tags] | payload
//! ```
//!
//! | version | header | read |
//! | --- | --- | --- |
//! | 1 | 8 bytes: no load start | yes: any write may replace it, as the fence finds no load start |
//! | 2 | 16 bytes: the load start at bytes 8 to 16 | yes: written |
//!
//! The load start is where the store's fence looks for it (see
//! [`store::load_start`](crate::store::load_start)): a write after a wait timeout is refused
//! where the stored value's load started later.
//!
//! | kind | holds |
//! | --- | --- |
//! | 0 | a value |
//! | 1 | a "pass" marker: the load's result is not cacheable; a payload of one byte, 1, says that it may be shared within a process (each process's flight loads once: see `Loaded::pass_handing`) |
//! | 2 | a tagged value: after the header (and windows), the tag clock read before its load (u64), then the generation that clock counts in (u64, with [`GENERATION`]), then its tags (a u16 count, then each tag's 32-byte digest) |
//! | 3 | a waiters' answer: the payload of a load whose result is not kept (see [`Loaded::for_waiters`](super::Loaded::for_waiters)), in the value's place or beside a value kept for revalidation (see [`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters)) |
//!
//! | kind bit | follows the header |
//! | --- | --- |
//! | [`WINDOWS`] (0x10) | a value's own stale windows: two u32 milliseconds, big-endian (see [`Windows`]) |
//! | [`LIFE`] (0x20) | a waiters' answer's life in the store (u32 milliseconds): a reader tells its age from that and its remaining life, whatever its own configuration |
//! | [`GENERATION`] (0x40) | a tagged value's tag generation, after its clock |
//!
//! Entries without a bit read as follows: a value without [`WINDOWS`] is served with the
//! reader's configured windows; a tagged value without [`GENERATION`] belongs to no
//! generation, so it is outdated (one reload); a waiters' answer without [`LIFE`] is read
//! with the reader's own idea of that life. A value without windows of its own is written
//! without the bit, so its bytes are those of kind 0 alone. A reader that does not know a
//! bit treats the entry as foreign (a miss, overwritten); the bits never move the load start.
//!
//! The header tells values from "pass" markers and carries how long the load took, and its
//! magic lets the engine tell its own entries from foreign or corrupt bytes, which are treated
//! as a miss and overwritten.

use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::store::KeyDigest;

const MAGIC: &[u8; 2] = b"TS";
const VERSION: u8 = 2;
/// The version without the load start, still read.
const VERSION_1: u8 = 1;
const KIND_VALUE: u8 = 0;
const KIND_PASS: u8 = 1;
const KIND_TAGGED: u8 = 2;
const KIND_WAITERS: u8 = 3;
/// The payload of a pass marker whose result may be shared within a process.
const PASS_SHARED: u8 = 1;
/// The kind bit of a value whose stale windows follow the header.
const WINDOWS: u8 = 0x10;
/// The kind bit of a waiters' answer whose life in the store follows the header.
const LIFE: u8 = 0x20;
/// The kind bit of a tagged value whose tag generation follows its clock.
const GENERATION: u8 = 0x40;
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
        /// The value's own stale windows; `None`: the cache's.
        windows: Option<Windows>,
    },
    /// "Do not wait for this key, go to the backend": its last load was not cacheable.
    /// `shared`: its result may be shared within a process, so a flight loads once for its
    /// callers instead (see `Loaded::pass_handing`).
    Pass { shared: bool },
    /// The result of the last load, for the calls that waited for it only: a call that
    /// started after it was written loads again. `life`: how long its writer had the store
    /// keep it (its age is that less its remaining life); `None` if it does not say. `load`:
    /// when its load started and how long it took, in the writer's milliseconds, which with
    /// the payload tell this answer from another.
    ForWaiters {
        payload: Bytes,
        life: Option<Duration>,
        load: (u64, u32),
    },
}

/// The tags of a value: the namespace's tag generation and clock read before the value was
/// loaded, and the digests of its tags. An invalidation of one of them at a later clock, or a
/// new generation, makes the value a miss; so does no generation (`None`: the clock was not
/// read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tagged {
    pub(crate) generation: Option<u64>,
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

/// Encodes a value whose load started at `started` and took `load_time` (with at most
/// [`MAX_TAGS`] tags: any more are the caller's error, and its own stale windows if any);
/// returns the entry and its payload, which shares the entry's buffer.
pub(crate) fn encode_value(
    payload: &[u8],
    started: SystemTime,
    load_time: Duration,
    tags: Option<&Tagged>,
    windows: Option<Windows>,
) -> (Bytes, Bytes) {
    let tags_len = tags.map_or(0, |t| 18 + 32 * t.tags.len().min(MAX_TAGS));
    let windows = windows.filter(|w| w.any());
    let windows_len = windows.map_or(0, |_| 8);
    let mut buf = BytesMut::with_capacity(HEADER_LEN + windows_len + tags_len + payload.len());
    let kind = match tags {
        Some(Tagged {
            generation: Some(_),
            ..
        }) => KIND_TAGGED | GENERATION,
        Some(_) => KIND_TAGGED,
        None => KIND_VALUE,
    };
    match windows {
        None => put_header(&mut buf, kind, started, load_time),
        Some(windows) => {
            put_header(&mut buf, kind | WINDOWS, started, load_time);
            put_window(&mut buf, windows.while_revalidating);
            put_window(&mut buf, windows.if_error);
        }
    }
    if let Some(tagged) = tags {
        buf.put_u64(tagged.clock);
        if let Some(generation) = tagged.generation {
            buf.put_u64(generation);
        }
        let count = tagged.tags.len().min(MAX_TAGS);
        buf.put_u16(u16::try_from(count).unwrap_or(u16::MAX));
        for tag in &tagged.tags[..count] {
            buf.put_slice(tag.as_bytes());
        }
    }
    let start = buf.len();
    buf.put_slice(payload);
    let encoded = buf.freeze();
    let payload = encoded.slice(start..);
    (encoded, payload)
}

/// Encodes a waiters' answer, from a load that started at `started` and took `load_time`, to
/// be kept in the store for `life`.
pub(crate) fn encode_for_waiters(
    payload: &[u8],
    started: SystemTime,
    load_time: Duration,
    life: Duration,
) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + 4 + payload.len());
    put_header(&mut buf, KIND_WAITERS | LIFE, started, load_time);
    buf.put_u32(saturating_millis(life));
    buf.put_slice(payload);
    buf.freeze()
}

/// Encodes a pass marker, from a load that started at `started`; `shared` if its result may be
/// shared within a process.
pub(crate) fn encode_pass(started: SystemTime, shared: bool) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN + 1);
    put_header(&mut buf, KIND_PASS, started, Duration::ZERO);
    if shared {
        buf.put_u8(PASS_SHARED);
    }
    buf.freeze()
}

fn put_header(buf: &mut BytesMut, kind: u8, started: SystemTime, load_time: Duration) {
    buf.put_slice(MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(kind);
    buf.put_u32(saturating_millis(load_time));
    // A clock before 1970 writes 0: the earliest start, which any write may replace.
    let since_epoch = started.duration_since(SystemTime::UNIX_EPOCH);
    let millis = since_epoch.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    buf.put_u64(millis);
}

fn saturating_millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Decodes an entry; anything that is not a well-formed entry of this version (or of
/// version 1) is [`Corrupt`].
pub(crate) fn decode(mut bytes: Bytes) -> Result<Entry, Corrupt> {
    let header_len = match bytes.get(..3) {
        Some([m1, m2, VERSION]) if [*m1, *m2] == *MAGIC => HEADER_LEN,
        Some([m1, m2, VERSION_1]) if [*m1, *m2] == *MAGIC => HEADER_1_LEN,
        _ => return Err(Corrupt),
    };
    let header = bytes.get(..header_len).ok_or(Corrupt)?;
    let (flags, load_ms) = (
        header[3],
        u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
    );
    let load_time = Duration::from_millis(u64::from(load_ms));
    // Version 1 carries none: 0, the earliest.
    let load_start = crate::store::load_start(header).unwrap_or(0);
    // What follows the header, in place: a slice would make the bytes shared (one allocation,
    // when they came from a `Vec`) only to drop the header.
    bytes.advance(header_len);
    let mut rest = bytes;
    let windows = if flags & WINDOWS != 0 {
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
    match flags & !WINDOWS {
        KIND_VALUE => Ok(Entry::Value {
            payload: rest,
            load_time,
            tags: None,
            windows,
        }),
        kind if kind & !GENERATION == KIND_TAGGED => {
            let generation_len = if kind & GENERATION != 0 { 8 } else { 0 };
            if rest.remaining() < 10 + generation_len {
                return Err(Corrupt);
            }
            let clock = rest.get_u64();
            let generation = (generation_len != 0).then(|| rest.get_u64());
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
                tags: Some(Tagged {
                    generation,
                    clock,
                    tags,
                }),
                windows,
            })
        }
        KIND_PASS if windows.is_none() && !rest.has_remaining() => {
            Ok(Entry::Pass { shared: false })
        }
        KIND_PASS if windows.is_none() && rest[..] == [PASS_SHARED] => {
            Ok(Entry::Pass { shared: true })
        }
        KIND_WAITERS if windows.is_none() => Ok(Entry::ForWaiters {
            payload: rest,
            life: None,
            load: (load_start, load_ms),
        }),
        kind if kind == KIND_WAITERS | LIFE && windows.is_none() && rest.remaining() >= 4 => {
            let life = Duration::from_millis(u64::from(rest.get_u32()));
            Ok(Entry::ForWaiters {
                payload: rest,
                life: Some(life),
                load: (load_start, load_ms),
            })
        }
        _ => Err(Corrupt),
    }
}

#[cfg(test)]
mod tests;
