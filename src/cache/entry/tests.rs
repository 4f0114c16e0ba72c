//! The entry format's tests: each kind written and read back, older versions read, and
//! foreign bytes refused.

use super::*;

/// A load start, to the millisecond.
fn at(millis: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(millis)
}

#[test]
fn round_trips() {
    let (v, _) = encode_value(b"hello", at(5), Duration::from_millis(1234), None, None);
    assert_eq!(
        decode(v.clone()),
        Ok(Entry::Value {
            payload: Bytes::from_static(b"hello"),
            load_time: Duration::from_millis(1234),
            tags: None,
            windows: None,
        })
    );
    let tagged = Tagged {
        generation: Some(0x0102_0304_0506_0708),
        clock: 42,
        tags: vec![KeyDigest::of(b"a"), KeyDigest::of(b"b")],
    };
    let (v, payload) = encode_value(
        b"tagged",
        at(5),
        Duration::from_millis(7),
        Some(&tagged),
        None,
    );
    assert_eq!(payload, "tagged");
    assert_eq!(
        decode(v.clone()),
        Ok(Entry::Value {
            payload: Bytes::from_static(b"tagged"),
            load_time: Duration::from_millis(7),
            tags: Some(tagged),
            windows: None,
        })
    );
    assert_eq!(
        decode(encode_pass(at(5), false)),
        Ok(Entry::Pass { shared: false })
    );
    assert_eq!(
        decode(encode_pass(at(5), true)),
        Ok(Entry::Pass { shared: true })
    );
    assert_eq!(
        decode(encode_for_waiters(
            b"503",
            at(5),
            Duration::ZERO,
            Duration::from_millis(2_500)
        )),
        Ok(Entry::ForWaiters {
            payload: Bytes::from_static(b"503"),
            life: Some(Duration::from_millis(2_500)),
            load: (5, 0),
        })
    );
    // An answer without its life: the reader's own idea.
    let mut older = BytesMut::new();
    put_header(&mut older, KIND_WAITERS, at(5), Duration::ZERO);
    older.put_slice(b"503");
    assert_eq!(
        decode(older.freeze()),
        Ok(Entry::ForWaiters {
            payload: Bytes::from_static(b"503"),
            life: None,
            load: (5, 0),
        })
    );
    assert_eq!(
        decode(encode_value(b"", at(5), Duration::MAX, None, None).0),
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
    let (v, payload) = encode_value(b"w", at(5), Duration::from_millis(3), None, Some(windows));
    assert_eq!(payload, "w");
    assert_eq!(
        decode(v.clone()),
        Ok(Entry::Value {
            payload: Bytes::from_static(b"w"),
            load_time: Duration::from_millis(3),
            tags: None,
            windows: Some(windows),
        })
    );
    let tagged = Tagged {
        generation: None,
        clock: 9,
        tags: vec![KeyDigest::of(b"t")],
    };
    // One window said, the other the cache's.
    let windows = Windows {
        while_revalidating: None,
        if_error: Some(Duration::ZERO),
    };
    let (v, _) = encode_value(b"wt", at(5), Duration::ZERO, Some(&tagged), Some(windows));
    assert_eq!(
        decode(v.clone()),
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
        decode(encode_value(b"", at(5), Duration::ZERO, None, Some(huge)).0)
    else {
        panic!("not a value")
    };
    assert_eq!(
        windows.and_then(|w| w.while_revalidating),
        Some(Duration::from_millis(u64::from(u32::MAX - 1)))
    );
    let (plain, _) = encode_value(b"p", at(5), Duration::ZERO, None, Some(Windows::default()));
    assert_eq!(
        plain,
        encode_value(b"p", at(5), Duration::ZERO, None, None).0
    );
}

/// A value without windows of its own is written as kind 0 alone, byte for byte: no
/// windows block, no bit.
#[test]
fn a_value_without_windows_is_written_as_kind_0_alone() {
    let (v, _) = encode_value(b"new", at(0x0102), Duration::from_millis(2), None, None);
    assert_eq!(
        &v[..],
        b"TS\x02\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x01\x02new"
    );
}

/// A tagged value's generation follows its clock, under its kind's bit; a value without
/// the bit has none, and a generation cut short is corrupt.
#[test]
fn the_tag_generation_follows_the_clock() {
    let tagged = Tagged {
        generation: Some(0x1122_3344_5566_7788),
        clock: 5,
        tags: vec![KeyDigest::of(b"t")],
    };
    let (v, _) = encode_value(b"g", at(0), Duration::ZERO, Some(&tagged), None);
    assert_eq!(v[3], KIND_TAGGED | GENERATION);
    assert_eq!(
        &v[HEADER_LEN..HEADER_LEN + 16],
        b"\0\0\0\0\0\0\0\x05\x11\x22\x33\x44\x55\x66\x77\x88"
    );
    let Ok(Entry::Value { tags, .. }) = decode(v.clone()) else {
        panic!("not a value")
    };
    assert_eq!(tags, Some(tagged));
    let cut = v.slice(..HEADER_LEN + 12);
    assert_eq!(decode(cut), Err(Corrupt));
    let mut without = BytesMut::new();
    put_header(&mut without, KIND_TAGGED, at(0), Duration::ZERO);
    without.put_u64(5);
    without.put_u16(0);
    let Ok(Entry::Value { tags, .. }) = decode(without.freeze()) else {
        panic!("not a value")
    };
    assert_eq!(tags.and_then(|t| t.generation), None);
}

/// Entries written before the load start (version 1, an 8-byte header) are still read.
#[test]
fn version_1_entries_are_read() {
    let v1 = Bytes::from_static(b"TS\x01\x00\x00\x00\x00\x07old");
    assert_eq!(
        decode(v1.clone()),
        Ok(Entry::Value {
            payload: Bytes::from_static(b"old"),
            load_time: Duration::from_millis(7),
            tags: None,
            windows: None,
        })
    );
    let pass = Bytes::from_static(b"TS\x01\x01\x00\x00\x00\x00");
    assert_eq!(decode(pass.clone()), Ok(Entry::Pass { shared: false }));
    assert_eq!(
        crate::store::load_start(&v1),
        None,
        "no load start: writable"
    );
}

#[test]
fn foreign_bytes_are_corrupt() {
    for bad in [
        &b""[..],
        b"TS",
        b"hello world",
        b"TS\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        b"TS\x01\x07\x00\x00\x00\x00",
        b"TS\x01\x01\x00\x00\x00\x00extra",
        // Tagged: a clock cut short, and a count of tags that are not there.
        b"TS\x01\x02\x00\x00\x00\x00\x00\x00",
        b"TS\x01\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01",
        // Version 2: a header cut short, a pass marker with more.
        b"TS\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        b"TS\x02\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00extra",
        // Windows cut short, and a pass marker with windows.
        b"TS\x02\x10\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        b"TS\x02\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        // A waiters' answer whose life is cut short; the life bit on a value.
        b"TS\x02\x23\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
        b"TS\x02\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00value",
    ] {
        assert_eq!(
            decode(Bytes::copy_from_slice(bad)),
            Err(Corrupt),
            "{bad:?}"
        );
    }
}

/// The load start sits where the store's fence reads it, for every kind of entry, with
/// windows or without.
#[test]
fn the_store_finds_the_load_start() {
    let started = at(1_790_000_000_123);
    let tagged = Tagged {
        generation: Some(3),
        clock: 1,
        tags: vec![KeyDigest::of(b"t")],
    };
    let windows = Windows {
        while_revalidating: Some(Duration::from_secs(1)),
        if_error: None,
    };
    for encoded in [
        encode_value(b"v", started, Duration::from_millis(9), None, None).0,
        encode_value(b"v", started, Duration::ZERO, Some(&tagged), None).0,
        encode_value(b"v", started, Duration::ZERO, None, Some(windows)).0,
        encode_value(b"v", started, Duration::ZERO, Some(&tagged), Some(windows)).0,
        encode_pass(started, false),
        encode_for_waiters(b"503", started, Duration::ZERO, Duration::from_secs(1)),
    ] {
        assert_eq!(crate::store::load_start(&encoded), Some(1_790_000_000_123));
    }
    let before_1970 = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
    let (v, _) = encode_value(b"v", before_1970, Duration::ZERO, None, None);
    assert_eq!(crate::store::load_start(&v), Some(0));
}

#[test]
fn payload_shares_the_buffer() {
    let (v, _) = encode_value(b"abc", at(5), Duration::ZERO, None, None);
    let Ok(Entry::Value { payload, .. }) = decode(v.clone()) else {
        panic!("not a value")
    };
    assert_eq!(payload.as_ptr(), v[HEADER_LEN..].as_ptr());
}
