//! Unit tests of `MemoryStore`: the semantics every [`Store`] shares (locks taken only when a
//! value is absent or stale, fenced fills, compare-and-delete releases, extensions, failure
//! markers, puts, TTLs), on paused tokio time.

use super::*;
use crate::store::StoreExt;
use crate::store::{KeyDigest, Store};

const SECOND: Duration = Duration::from_secs(1);

fn key(name: &str) -> StoreKey {
    StoreKey::new(Arc::from("test"), KeyDigest::of(name.as_bytes()))
}

/// Lookups that count a value with at most `bound` left as stale.
async fn lookup(store: &MemoryStore, key: &StoreKey, token: LockToken, bound: Duration) -> Lookup {
    let lookup = store.lookup(key, token, 10 * SECOND, LockWhen::LifeAtMost(bound));
    lookup.await.unwrap()
}

/// A store whose `key` holds `value` for `ttl`, filled by a leader that is gone.
async fn filled(key: &StoreKey, value: &'static str, ttl: Duration) -> MemoryStore {
    let store = MemoryStore::new();
    let leader = LockToken::random();
    assert_eq!(
        lookup(&store, key, leader, Duration::ZERO).await.lock,
        LockState::Acquired
    );
    assert!(store.fill(key, leader, value.into(), ttl).await.unwrap());
    store
}

#[tokio::test(start_paused = true)]
async fn an_absent_value_gives_the_lock_to_the_first_lookup_only() {
    let store = MemoryStore::new();
    let key = key("absent");
    let first = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(
        first,
        Lookup {
            value: None,
            lock: LockState::Acquired
        }
    );
    let second = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(second.lock, LockState::HeldElsewhere);
}

/// A lock under the caller's own token is the caller's: taken again with a new TTL, as the
/// Redis lookup does (the differential test found `HeldElsewhere` here).
#[tokio::test(start_paused = true)]
async fn a_lookup_under_its_own_token_takes_its_lock_again() {
    let store = MemoryStore::new();
    let key = key("own");
    let token = LockToken::random();
    let short = store.lookup(&key, token, SECOND, LockWhen::Always);
    assert_eq!(short.await.unwrap().lock, LockState::Acquired);
    let long = store.lookup(&key, token, 10 * SECOND, LockWhen::Always);
    assert_eq!(long.await.unwrap().lock, LockState::Acquired);
    tokio::time::advance(2 * SECOND).await;
    let other = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(other.lock, LockState::HeldElsewhere, "its TTL was renewed");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_value_is_returned_without_the_lock_and_a_stale_one_with_it() {
    let key = key("aging");
    let store = filled(&key, "v", 60 * SECOND).await;
    // 60 s left, stale below 30 s: fresh.
    let fresh = lookup(&store, &key, LockToken::random(), 30 * SECOND).await;
    assert_eq!(fresh.lock, LockState::NotRequested);
    let stored = fresh.value.unwrap();
    assert_eq!(
        (stored.bytes.as_ref(), stored.ttl),
        (&b"v"[..], Some(60 * SECOND))
    );
    // 30 s later, 30 s are left: stale, so the lookup takes the lock and gets the value.
    tokio::time::advance(30 * SECOND).await;
    let stale = lookup(&store, &key, LockToken::random(), 30 * SECOND).await;
    assert_eq!(stale.lock, LockState::Acquired);
    assert_eq!(stale.value.unwrap().ttl, Some(30 * SECOND));
    let follower = lookup(&store, &key, LockToken::random(), 30 * SECOND).await;
    assert_eq!(follower.lock, LockState::HeldElsewhere);
    assert!(follower.value.is_some(), "a follower sees the stale value");
}

#[tokio::test(start_paused = true)]
async fn lock_always_takes_the_lock_of_a_fresh_value() {
    let key = key("corrupt");
    let store = filled(&key, "v", 60 * SECOND).await;
    let lookup = store.lookup(&key, LockToken::random(), SECOND, LockWhen::Always);
    let lookup = lookup.await.unwrap();
    assert_eq!(lookup.lock, LockState::Acquired);
    assert_eq!(lookup.value.unwrap().bytes, "v");
    let again = store.lookup(&key, LockToken::random(), SECOND, LockWhen::Always);
    assert_eq!(again.await.unwrap().lock, LockState::HeldElsewhere);
}

#[tokio::test(start_paused = true)]
async fn a_fill_is_fenced_by_the_token_and_frees_the_lock() {
    let store = MemoryStore::new();
    let key = key("fenced");
    let (leader, intruder) = (LockToken::random(), LockToken::random());
    lookup(&store, &key, leader, Duration::ZERO).await;
    assert!(!store
        .fill(&key, intruder, "x".into(), SECOND)
        .await
        .unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert!(store.fill(&key, leader, "v".into(), SECOND).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap().unwrap().bytes, "v");
    // The lock is gone: a second fill under it is refused, and a stale-minded lookup
    // takes the lock again.
    assert!(!store.fill(&key, leader, "w".into(), SECOND).await.unwrap());
    let next = lookup(&store, &key, LockToken::random(), SECOND).await;
    assert_eq!(next.lock, LockState::Acquired);
}

/// A lock that lapsed is its holder's only while nobody takes it, and for ten times its TTL
/// (see the `Store` trait's "Locks that lapse"): past that, the fill is refused.
#[tokio::test(start_paused = true)]
async fn a_leader_whose_lock_expired_cannot_fill() {
    let store = MemoryStore::new();
    let key = key("late");
    let late = LockToken::random();
    let lock_ttl = Duration::from_millis(50);
    let taken = store.lookup(&key, late, lock_ttl, LockWhen::LifeAtMost(Duration::ZERO));
    assert_eq!(taken.await.unwrap().lock, LockState::Acquired);
    tokio::time::advance(lock_ttl * 11).await;
    assert!(!store.fill(&key, late, "late".into(), SECOND).await.unwrap());
    assert_eq!(store.get(&key).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn release_deletes_only_its_own_lock() {
    let store = MemoryStore::new();
    let key = key("owned");
    let (owner, intruder) = (LockToken::random(), LockToken::random());
    lookup(&store, &key, owner, Duration::ZERO).await;
    assert!(!store.release(&key, intruder).await.unwrap());
    let held = lookup(&store, &key, intruder, Duration::ZERO).await;
    assert_eq!(held.lock, LockState::HeldElsewhere);
    assert!(store.release(&key, owner).await.unwrap());
    assert!(!store.release(&key, owner).await.unwrap(), "already gone");
    let free = lookup(&store, &key, intruder, Duration::ZERO).await;
    assert_eq!(free.lock, LockState::Acquired);
}

#[tokio::test(start_paused = true)]
async fn extend_renews_only_its_own_lock() {
    let store = MemoryStore::new();
    let key = key("renewed");
    let (owner, intruder) = (LockToken::random(), LockToken::random());
    let taken = store.lookup(&key, owner, SECOND, LockWhen::LifeAtMost(Duration::ZERO));
    assert_eq!(taken.await.unwrap().lock, LockState::Acquired);
    assert!(
        !store
            .extend(&[(key.clone(), intruder)], 10 * SECOND)
            .await
            .unwrap()[0]
    );
    tokio::time::advance(SECOND / 2).await;
    assert!(store.extend(&[(key.clone(), owner)], SECOND).await.unwrap()[0]);
    // Past the first TTL, within the renewed one.
    tokio::time::advance(SECOND * 3 / 4).await;
    let held = lookup(&store, &key, intruder, Duration::ZERO).await;
    assert_eq!(held.lock, LockState::HeldElsewhere);
    tokio::time::advance(SECOND / 4).await;
    // Lapsed: the next lookup takes it, and the owner renews it no more.
    let free = lookup(&store, &key, intruder, Duration::ZERO).await;
    assert_eq!(free.lock, LockState::Acquired);
    assert!(
        !store.extend(&[(key.clone(), owner)], SECOND).await.unwrap()[0],
        "taken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_marker_holds_the_lock_until_it_expires() {
    let store = MemoryStore::new();
    let key = key("failing");
    let leader = LockToken::random();
    lookup(&store, &key, leader, Duration::ZERO).await;
    assert!(!store.fail(&key, LockToken::random(), SECOND).await.unwrap());
    assert!(store.fail(&key, leader, SECOND).await.unwrap());
    let failed = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(failed.lock, LockState::Failed);
    // No token opens the marker, the failed leader's included.
    assert!(!store.release(&key, leader).await.unwrap());
    assert!(
        !store
            .extend(&[(key.clone(), leader)], SECOND)
            .await
            .unwrap()[0]
    );
    assert!(!store.fill(&key, leader, "v".into(), SECOND).await.unwrap());
    tokio::time::advance(SECOND).await;
    let retry = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(retry.lock, LockState::Acquired);
}

#[tokio::test(start_paused = true)]
async fn put_writes_whatever_the_lock_holds_and_leaves_it() {
    let store = MemoryStore::new();
    let key = key("put");
    let leader = LockToken::random();
    lookup(&store, &key, leader, Duration::ZERO).await;
    store.put(&key, "put".into(), SECOND).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap().unwrap().bytes, "put");
    let held = lookup(&store, &key, LockToken::random(), SECOND).await;
    assert_eq!(held.lock, LockState::HeldElsewhere, "the lock is untouched");
    // The leader still holds it, and its fill overwrites the put.
    assert!(store
        .fill(&key, leader, "filled".into(), SECOND)
        .await
        .unwrap());
    assert_eq!(store.get(&key).await.unwrap().unwrap().bytes, "filled");
}

/// An engine entry's first 16 bytes, version 2: its load started `started` ms after 1970.
fn entry_started(started: u64, payload: &str) -> Bytes {
    let mut bytes = b"TS\x02\x00\x00\x00\x00\x00".to_vec();
    bytes.extend_from_slice(&started.to_be_bytes());
    bytes.extend_from_slice(payload.as_bytes());
    Bytes::from(bytes)
}

/// Issue 16 #6: a put is refused where the stored value's load started later; values
/// without a load start (version 1 entries of a mixed-version fleet, foreign bytes) stay
/// writable, and write whatever is stored.
#[tokio::test(start_paused = true)]
async fn a_put_never_overwrites_a_value_whose_load_started_later() {
    let store = MemoryStore::new();
    let key = key("fenced");
    assert!(store
        .put(&key, entry_started(20, "new"), SECOND)
        .await
        .unwrap());
    assert!(!store
        .put(&key, entry_started(10, "old"), SECOND)
        .await
        .unwrap());
    assert!(store
        .get(&key)
        .await
        .unwrap()
        .unwrap()
        .bytes
        .ends_with(b"new"));
    assert!(store
        .put(&key, entry_started(20, "same"), SECOND)
        .await
        .unwrap());
    assert!(store
        .put(&key, entry_started(30, "newer"), SECOND)
        .await
        .unwrap());
    // A value without a load start is neither refused nor refusing.
    assert!(store.put(&key, "foreign".into(), SECOND).await.unwrap());
    let version_1 = Bytes::from_static(b"TS\x01\x00\x00\x00\x00\x00v1");
    assert!(store.put(&key, version_1, SECOND).await.unwrap());
    assert!(store
        .put(&key, entry_started(1, "any"), SECOND)
        .await
        .unwrap());
    // An expired value refuses nothing.
    tokio::time::advance(SECOND).await;
    assert!(store
        .put(&key, entry_started(0, "after"), SECOND)
        .await
        .unwrap());
}

#[tokio::test(start_paused = true)]
async fn values_expire_and_report_their_remaining_life_in_whole_milliseconds() {
    let store = MemoryStore::new();
    let key = key("expiring");
    store.put(&key, "v".into(), SECOND).await.unwrap();
    tokio::time::advance(Duration::from_micros(250_500)).await;
    let left = store.get(&key).await.unwrap().unwrap().ttl;
    assert_eq!(left, Some(Duration::from_millis(749)));
    tokio::time::advance(Duration::from_micros(749_500)).await;
    assert_eq!(store.get(&key).await.unwrap(), None);
    let lookup = lookup(&store, &key, LockToken::random(), Duration::ZERO).await;
    assert_eq!(
        lookup,
        Lookup {
            value: None,
            lock: LockState::Acquired
        }
    );
    // A TTL below a millisecond is a millisecond, as on Redis.
    store.put(&key, "v".into(), Duration::ZERO).await.unwrap();
    let stored = store.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.ttl, Some(Duration::from_millis(1)));
}

#[tokio::test(start_paused = true)]
async fn expired_entries_are_swept_once_writes_outnumber_entries() {
    let store = MemoryStore::new();
    for i in 0..10 {
        let old = key(&format!("old-{i}"));
        store.put(&old, "v".into(), SECOND).await.unwrap();
    }
    tokio::time::advance(SECOND).await;
    assert_eq!(store.len(), 10, "expired, not swept yet");
    let new = key("new");
    store.put(&new, "v".into(), SECOND).await.unwrap();
    assert_eq!(store.len(), 11);
    store.put(&new, "w".into(), SECOND).await.unwrap();
    assert_eq!(store.len(), 1, "12 writes, 11 entries: swept");
}

#[tokio::test(start_paused = true)]
async fn fills_releases_puts_and_failures_wake_watchers() {
    let store = MemoryStore::new();
    let key = key("watched");
    let mut watch = store.subscribe(&key).unwrap();
    for way in ["fill", "release", "put", "fail"] {
        let token = LockToken::random();
        let taken = store.lookup(&key, token, SECOND, LockWhen::Always);
        assert_eq!(taken.await.unwrap().lock, LockState::Acquired, "{way}");
        watch.mark_seen();
        let done = match way {
            "fill" => store.fill(&key, token, "v".into(), SECOND).await.unwrap(),
            "release" => store.release(&key, token).await.unwrap(),
            "put" => store.put(&key, "v".into(), SECOND).await.is_ok(),
            _ => store.fail(&key, token, SECOND).await.unwrap(),
        };
        assert!(done, "{way}");
        let woken = tokio::time::timeout(SECOND, watch.changed()).await;
        assert!(woken.is_ok(), "{way} wakes the watch");
        // Past the lock (or failure marker) of this round.
        tokio::time::advance(SECOND).await;
    }
    // Lookups and extensions wake nobody.
    watch.mark_seen();
    let token = LockToken::random();
    lookup(&store, &key, token, Duration::ZERO).await;
    assert!(store.extend(&[(key.clone(), token)], SECOND).await.unwrap()[0]);
    let woken = tokio::time::timeout(SECOND, watch.changed()).await;
    assert!(woken.is_err(), "no notification, no wake");
}

/// A flood of distinct keys (a URL's every query string) stays under the store's capacity:
/// writes past it evict the least recently used values (issue 16: the embedded default had no
/// bound), and a value read all along is never the one evicted.
#[tokio::test(start_paused = true)]
async fn a_flood_of_distinct_keys_stays_under_the_capacity() {
    let capacity = 64 * 1024;
    let store = MemoryStore::with_capacity(capacity);
    let hot = key("hot");
    store
        .put(&hot, Bytes::from(vec![b'h'; 1024]), 60 * SECOND)
        .await
        .unwrap();
    for i in 0..2000 {
        let flood = key(&format!("flood-{i}"));
        store
            .put(&flood, Bytes::from(vec![b'x'; 1024]), 60 * SECOND)
            .await
            .unwrap();
        assert!(
            store.bytes() <= capacity,
            "{} bytes after {i}",
            store.bytes()
        );
        assert!(
            store.get(&hot).await.unwrap().is_some(),
            "the hot value evicted at {i}"
        );
    }
    assert!(store.len() < 2000 / 10, "{} values kept", store.len());
    // Values that expire or are removed give their bytes back.
    store.invalidate(&hot).await.unwrap();
    let before = store.bytes();
    tokio::time::advance(61 * SECOND).await;
    for i in 0..200 {
        let fresh = key(&format!("later-{i}"));
        store
            .put(&fresh, Bytes::from_static(b"v"), SECOND)
            .await
            .unwrap();
    }
    assert!(store.bytes() < before, "{} then {}", before, store.bytes());
    assert_eq!(MemoryStore::new().bytes(), 0);
}
