//! L1's own rules: trust, freshness and weight, decoding once, and each thread's view.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Vouch, L1};
use crate::cache::config::Config;
use crate::store::{KeyDigest, MemoryStore, Store, StoreKey};
use crate::Cache;

const FRESH: Duration = Duration::from_secs(5);

/// L1 over the notifier of `store`, and the key `k` with its digest.
fn l1_of(store: &MemoryStore) -> (L1, KeyDigest, StoreKey) {
    let config = Config::default();
    let l1 = L1::new(&config.l1, &config.namespace, store.notifier().cloned());
    let digest = KeyDigest::of(b"k");
    (l1, digest, StoreKey::new(Arc::from("stampede"), digest))
}

fn value() -> Bytes {
    Bytes::from_static(b"v")
}

/// Inserts the value `v` for `digest`, untagged, with no early refresh.
fn put(l1: &L1, vouch: Vouch, digest: KeyDigest, fresh_for: Duration) {
    l1.insert(vouch, Box::default(), digest, &value(), fresh_for, |_| None);
}

#[tokio::test(start_paused = true)]
async fn an_entry_is_trusted_until_its_key_is_heard_of_and_its_weight_is_counted() {
    let store = MemoryStore::new();
    let (l1, digest, key) = l1_of(&store);
    let stamp = l1.stamp(&digest).expect("notifications received");
    put(&l1, Vouch::Heard(stamp), digest, FRESH);
    assert!(l1.get(&digest, || 0).is_some());
    assert!(l1.bytes() > 0, "counted on insert");
    store.notifier().expect("a notifier").notify(&key);
    assert!(l1.get(&digest, || 0).is_none(), "heard of since");
    assert!(!l1.contains(&digest), "and dropped");
}

#[tokio::test(start_paused = true)]
async fn a_value_read_before_a_change_heard_meanwhile_never_enters() {
    let store = MemoryStore::new();
    let (l1, digest, key) = l1_of(&store);
    let stamp = l1.stamp(&digest).expect("notifications received");
    store.notifier().expect("a notifier").notify(&key);
    put(&l1, Vouch::Heard(stamp), digest, FRESH);
    assert!(l1.get(&digest, || 0).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_value_loaded_alone_lives_until_the_store_recovers() {
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let vouch = Vouch::Alone(l1.stamp_anyway(&digest), 3);
    put(&l1, vouch, digest, FRESH);
    assert!(l1.get(&digest, || 3).is_some());
    assert!(l1.get(&digest, || 4).is_none(), "the store answered again");
}

#[tokio::test(start_paused = true)]
async fn an_entry_leaves_at_its_freshness_or_the_cap_and_is_due_at_its_refresh_point() {
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let stamp = l1.stamp(&digest).expect("notifications received");
    let heard = Vouch::Heard(stamp);
    let refresh = |fresh_until| Some(fresh_until - Duration::from_secs(1));
    l1.insert(heard, Box::default(), digest, &value(), FRESH, refresh);
    assert!(matches!(
        l1.get(&digest, || 0),
        Some(super::L1Hit::Fresh(..))
    ));
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(matches!(
        l1.get(&digest, || 0),
        Some(super::L1Hit::RefreshDue(_))
    ));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(l1.get(&digest, || 0).is_none(), "no longer fresh");
    // Fresh for an hour: kept for the cap (10 s by default) only.
    put(&l1, heard, digest, FRESH * 720);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(l1.get(&digest, || 0).is_none(), "past the cap");
    // A value with no freshness left is not kept at all.
    put(&l1, heard, digest, Duration::ZERO);
    assert!(!l1.contains(&digest));
}

#[tokio::test(start_paused = true)]
async fn a_hit_decodes_once_per_entry_and_a_reader_of_another_type_each_time() {
    let cache = Cache::builder(MemoryStore::new()).build();
    let load = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"42")) };
    cache.get_or_load("k", load).await.unwrap();
    let digest = KeyDigest::of(b"k");
    let decodes = AtomicUsize::new(0);
    let number = |bytes: &Bytes| {
        decodes.fetch_add(1, Ordering::Relaxed);
        std::str::from_utf8(bytes).ok()?.parse::<u32>().ok()
    };
    let first = cache.l1_hit(&digest, number, Arc::clone).unwrap().value;
    let second = cache.l1_hit(&digest, number, Arc::clone).unwrap().value;
    assert_eq!((*first, decodes.load(Ordering::Relaxed)), (42, 1));
    assert!(std::sync::Arc::ptr_eq(&first, &second));
    let text = |bytes: &Bytes| {
        decodes.fetch_add(1, Ordering::Relaxed);
        Some(String::from_utf8_lossy(bytes).into_owned())
    };
    for _ in 0..2 {
        assert_eq!(
            *cache.l1_hit(&digest, text, Arc::clone).unwrap().value,
            "42"
        );
    }
    assert_eq!(decodes.load(Ordering::Relaxed), 3);
    // Bytes the reader finds no value in: no hit, and nothing kept.
    let load = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"x")) };
    cache.get_or_load("n", load).await.unwrap();
    let digest = KeyDigest::of(b"n");
    assert!(cache.l1_hit(&digest, number, Arc::clone).is_none());
    assert!(cache.l1_hit(&digest, text, Arc::clone).is_some());
}

/// Hits of `digest` through this thread's view: the value as text, and whether the view
/// answered (the reader runs only on a read through moka of an entry not yet decoded, so
/// a view that answered leaves `reads` alone).
fn decoded(l1: &L1, digest: &KeyDigest) -> Option<String> {
    let read = |bytes: &Bytes| Some(String::from_utf8_lossy(bytes).into_owned());
    let (value, _, _) = l1.get_decoded(digest, || 0, read, |v| Arc::new(String::clone(v)))?;
    Some(String::clone(&value))
}

fn put_value(l1: &L1, stamp: Vouch, digest: KeyDigest, value: &'static [u8]) {
    let value = Bytes::from_static(value);
    l1.insert(stamp, Box::default(), digest, &value, FRESH, |_| None);
}

/// The view answers only what moka would: an entry put in view by a hit is not used once L1
/// is written, even with nothing heard of the key (a cache that hears no notifications
/// stamps a new value of its own write as the old one).
#[tokio::test(start_paused = true)]
async fn the_view_never_answers_a_value_l1_has_replaced() {
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    put_value(&l1, heard, digest, b"v1");
    for _ in 0..3 {
        assert_eq!(decoded(&l1, &digest).as_deref(), Some("v1"));
    }
    assert!(super::front::viewed(&digest), "kept in view");
    put_value(&l1, heard, digest, b"v2");
    assert_eq!(decoded(&l1, &digest).as_deref(), Some("v2"));
    // Another key's write leaves the view out of date too: moka is read again.
    put_value(&l1, heard, KeyDigest::of(b"other"), b"x");
    assert_eq!(decoded(&l1, &digest).as_deref(), Some("v2"));
}

/// An entry in view is checked as any hit: a change heard of its key, its end in L1 and its
/// refresh point each stop the view from answering.
#[tokio::test(start_paused = true)]
async fn the_view_checks_every_hit_as_moka_hits_are_checked() {
    let store = MemoryStore::new();
    let (l1, digest, key) = l1_of(&store);
    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    put_value(&l1, heard, digest, b"v1");
    decoded(&l1, &digest);
    assert!(super::front::viewed(&digest));
    store.notifier().expect("a notifier").notify(&key);
    assert_eq!(decoded(&l1, &digest), None, "heard of since");

    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    put_value(&l1, heard, digest, b"v2");
    decoded(&l1, &digest);
    tokio::time::advance(FRESH).await;
    assert_eq!(decoded(&l1, &digest), None, "no longer fresh");

    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    let refresh = |fresh_until| Some(fresh_until - Duration::from_secs(1));
    let value = Bytes::from_static(b"v3");
    l1.insert(heard, Box::default(), digest, &value, FRESH, refresh);
    assert_eq!(decoded(&l1, &digest).as_deref(), Some("v3"));
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(decoded(&l1, &digest), None, "due for an early refresh");
}

/// Two caches' entries of one key stay apart in a thread's view; a value over the view's
/// limit is answered, but not kept in view (it would be held once per thread).
#[tokio::test(start_paused = true)]
async fn the_view_keeps_caches_apart_and_large_values_out() {
    let store = MemoryStore::new();
    let (one, digest, _) = l1_of(&store);
    let (two, _, _) = l1_of(&store);
    let heard = Vouch::Heard(one.stamp(&digest).expect("notifications received"));
    put_value(&one, heard, digest, b"one");
    put_value(&two, heard, digest, b"two");
    for _ in 0..2 {
        assert_eq!(decoded(&one, &digest).as_deref(), Some("one"));
        assert_eq!(decoded(&two, &digest).as_deref(), Some("two"));
    }

    super::front::empty();
    let large = Bytes::from(vec![b'x'; super::front::LOCAL_MAX + 1]);
    one.insert(heard, Box::default(), digest, &large, FRESH, |_| None);
    assert_eq!(decoded(&one, &digest).map(|v| v.len()), Some(large.len()));
    assert!(!super::front::viewed(&digest));
}

/// The bytes themselves (`get_or_load`'s hits) go through the view too, as this thread's own
/// copy, and never outlive a write of L1.
#[tokio::test(start_paused = true)]
async fn the_view_answers_bytes_in_a_copy_of_its_own() {
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    put_value(&l1, heard, digest, b"v1");
    let value = |l1: &L1| {
        l1.get_value(&digest, || 0)
            .map(|(v, _, _)| Bytes::clone(&v.0))
    };
    let first = value(&l1).expect("a hit");
    let second = value(&l1).expect("a hit from the view");
    assert_eq!(second, "v1");
    assert_ne!(first.as_ptr(), Bytes::from_static(b"v1").as_ptr(), "a copy");
    assert_eq!(first.as_ptr(), second.as_ptr(), "this thread's one copy");
    put_value(&l1, heard, digest, b"v2");
    assert_eq!(value(&l1).as_deref(), Some(&b"v2"[..]));
}

/// Two readers of one key whose values are both `Bytes`: `get_or_load`'s hits answer the
/// stored bytes as they are (`get_value`), a decoder's (`get_decoded`, as the service layer's
/// codec for a service answering `Bytes`) answers what it reads in them. Each must get its
/// own reading, from the view as from moka.
#[tokio::test(start_paused = true)]
async fn the_view_keeps_the_stored_bytes_apart_from_bytes_decoded_of_them() {
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    put_value(&l1, heard, digest, b"Rpayload");
    let stored = |l1: &L1| {
        l1.get_value(&digest, || 0)
            .map(|(v, _, _)| Bytes::clone(&v.0))
    };
    let decoded = |l1: &L1| {
        let payload = |bytes: &Bytes| Some(bytes.slice(1..));
        let own = |v: &Arc<Bytes>| Arc::new(Bytes::copy_from_slice(v));
        let (value, _, _) = l1.get_decoded(&digest, || 0, payload, own)?;
        Some(Bytes::clone(&value))
    };
    // The stored bytes, through moka, kept in view; then a decoder's hit.
    assert_eq!(stored(&l1).as_deref(), Some(&b"Rpayload"[..]));
    assert_eq!(decoded(&l1).as_deref(), Some(&b"payload"[..]), "decoded");
    // The other way round: a decoder's bytes kept in view; then a hit of the stored bytes.
    super::front::empty();
    assert_eq!(decoded(&l1).as_deref(), Some(&b"payload"[..]));
    assert_eq!(stored(&l1).as_deref(), Some(&b"Rpayload"[..]), "stored");
}

/// A write of L1 on another thread is never hidden by this thread's view once it is done: a
/// reader that has seen the writer's insert of `n` return never reads an older value after
/// it (the count of writes moves after moka's write, and is read before the entry). Values
/// replace each other under one stamp, so only the count of writes stops the view.
#[test]
fn a_write_done_on_another_thread_is_never_hidden_by_the_view() {
    const WRITES: u64 = 20_000;
    let store = MemoryStore::new();
    let (l1, digest, _) = l1_of(&store);
    let heard = Vouch::Heard(l1.stamp(&digest).expect("notifications received"));
    let insert = |n: u64| {
        let value = Bytes::from(n.to_string());
        l1.insert(heard, Box::default(), digest, &value, FRESH, |_| None);
    };
    insert(0);
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for n in 1..=WRITES {
                insert(n);
                done.store(n, Ordering::SeqCst);
            }
        });
        loop {
            let seen = done.load(Ordering::SeqCst);
            let read = decoded(&l1, &digest).expect("a hit");
            let read: u64 = read.parse().expect("a number");
            assert!(
                read >= seen,
                "read {read} after the insert of {seen} was done"
            );
            if seen == WRITES {
                break;
            }
        }
    });
}
