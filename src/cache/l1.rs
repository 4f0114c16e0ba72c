//! L1: the in-process moka cache in front of the store, bounded in bytes, whose entries never
//! outlive their freshness in the store (nor [`l1_ttl_cap`](super::CacheBuilder::l1_ttl_cap)).
//!
//! L1 is kept in step with the other processes through the store's notifications: each entry
//! carries the [`Stamp`] of what this process had heard of its key before the value was read,
//! and is trusted only while that is still all it has heard. A fill, set, expiry or
//! invalidation of the key anywhere (or a lost subscription) moves the stamp on, and the next
//! call reads the store again. While notifications are not received, nothing read from the
//! store enters L1; what a flight loaded alone because the store failed does, until the store
//! answers again (no notification vouches for it).
//!
//! A cache that hears no notifications (`notifications(false)`, or a store without them)
//! stamps its entries with a notifier of its own, which hears this process's changes alone:
//! a read or load in flight when this process changes its key (or clears, or invalidates a
//! tag) does not enter L1 after the change, as where notifications are heard.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::config::L1Settings;
use super::telemetry::Meter;
use crate::store::{KeyDigest, Notifier, Stamp, StoreKey};

/// What this process had heard of each tag of a value when it was read (empty for an
/// untagged value).
pub(super) type TagStamps = Box<[(KeyDigest, Stamp)]>;

/// The moka cache that holds L1. Its entries are shared: a hit clones a pointer, not the entry.
///
/// moka's `sync` cache, called from async code: its reads never wait, so a hit is answered
/// without a future (the HTTP layer answers it within `call`). A write (an insert or an
/// invalidation, after a load or a notification, never on a hit) may wait when moka's write
/// log is full (384 writes) while another thread holds its housekeeping: it then sleeps the
/// thread 50 µs at a time until the log drains. The `future` cache yields there instead, but
/// costs every hit a future; under a storm of writes that outruns housekeeping, this one
/// holds a worker thread for such short sleeps.
type Moka = moka::sync::Cache<KeyDigest, Arc<L1Entry>>;

/// A value as its reader decoded it, kept with its L1 entry (see [`L1Entry::decoded`]).
type Decoded = Arc<dyn Any + Send + Sync>;

/// An entry of L1: the value, how long it may live there, and what early refresh needs.
pub(super) struct L1Entry {
    pub(super) value: Bytes,
    ttl: Duration,
    /// When the value stops being fresh in the store.
    pub(super) fresh_until: Instant,
    /// When a hit refreshes it early: drawn once, as the value enters L1, so that how often
    /// it is hit does not make its refresh more likely.
    pub(super) refresh_at: Option<Instant>,
    /// What vouches for it: what this process had heard of the key before the value was
    /// read. A value loaded while the store failed, which no notification vouches for, is
    /// kept while notifications are lost too (else a process whose store is down would load
    /// on every call), and only until the store answers again.
    vouch: Vouch,
    /// What this process had heard of the value's tags before they were checked.
    tags: TagStamps,
    /// When the entry leaves L1, on tokio's clock (moka keeps a clock of its own, which
    /// paused test time does not move, and sweeps lazily).
    until: Instant,
    /// The value as the first hit that read it decoded it (an HTTP response, a typed value),
    /// so later hits skip the decode. Set once: it lives and dies with these very bytes.
    decoded: OnceLock<Decoded>,
}

impl L1Entry {
    /// What the entry costs L1: its value and its tags' stamps, plus about what the digest
    /// and moka's own bookkeeping cost per entry.
    fn weight(&self) -> u32 {
        let tags = self.tags.len().saturating_mul(48);
        u32::try_from(self.value.len().saturating_add(tags).saturating_add(96)).unwrap_or(u32::MAX)
    }

    /// The value as `read` decodes it: decoded once, by the first hit, and shared by the hits
    /// after it. `None` if `read` finds no `T` in the bytes. A reader of another type than the
    /// first (two readers of one key) decodes on every hit, and is still answered.
    pub(super) fn decoded<T: Any + Send + Sync>(
        &self,
        read: impl FnOnce(&Bytes) -> Option<T>,
    ) -> Option<Arc<T>> {
        if let Some(kept) = self.decoded.get() {
            if let Ok(value) = Arc::clone(kept).downcast::<T>() {
                return Some(value);
            }
            return read(&self.value).map(Arc::new);
        }
        let value = Arc::new(read(&self.value)?);
        // Two first hits at once both decode; either's value is as good.
        let _ = self.decoded.set(Arc::clone(&value) as Decoded);
        Some(value)
    }
}

/// What L1 answers for a key it holds a trusted entry of.
pub(super) enum L1Hit {
    /// The entry, whose value answers, and when it was read; nothing more to do.
    Fresh(Arc<L1Entry>, Instant),
    /// The entry, whose refresh point has come: its value answers, and the caller starts an
    /// early refresh.
    RefreshDue(Arc<L1Entry>),
}

impl L1Hit {
    /// The value the entry holds.
    pub(super) fn value(&self) -> Bytes {
        match self {
            L1Hit::Fresh(entry, _) | L1Hit::RefreshDue(entry) => entry.value.clone(),
        }
    }
}

struct L1Expiry;

impl moka::Expiry<KeyDigest, Arc<L1Entry>> for L1Expiry {
    fn expire_after_create(
        &self,
        _key: &KeyDigest,
        value: &Arc<L1Entry>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &KeyDigest,
        value: &Arc<L1Entry>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// L1: the moka cache, its weight in bytes, and the notifier whose stamps keep it in step
/// with the other processes.
pub(super) struct L1 {
    cache: Option<Moka>,
    /// L1's weight in bytes: added on insert, taken off by moka's eviction listener.
    bytes: Arc<AtomicU64>,
    /// The store's notifier, if this cache listens to notifications: asked of the store once,
    /// not on every hit.
    notifier: Option<Notifier>,
    /// What stamps entries where there is no `notifier`: one of this cache's own, which hears
    /// this process's changes alone (see the module docs).
    own: Notifier,
    /// The longest an entry stays, whatever its freshness.
    ttl_cap: Duration,
    meter: Meter,
}

/// What vouches for an L1 entry.
#[derive(Clone, Copy)]
pub(super) enum Vouch {
    /// Notifications: the stamp of the key before the value was read.
    Heard(Stamp),
    /// Nothing, for a value loaded while the store failed: its stamp, taken even while
    /// notifications are lost, and the count of the store's recoveries
    /// ([`Breaker::recoveries`](super::breaker::Breaker::recoveries)) when its load started.
    Alone(Stamp, u64),
}

impl L1 {
    /// L1 for `config` (none when its capacity is 0), kept in step by `notifier`.
    pub(super) fn new(
        settings: &L1Settings,
        namespace: &Arc<str>,
        notifier: Option<Notifier>,
    ) -> Self {
        let bytes = Arc::new(AtomicU64::new(0));
        let removed = Arc::clone(&bytes);
        let meter = Meter::new(namespace);
        let removals = meter.clone();
        let cache = (settings.capacity > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(settings.capacity)
                .weigher(|_key: &KeyDigest, entry: &Arc<L1Entry>| entry.weight())
                .expire_after(L1Expiry)
                // Replaced, expired or evicted: no longer counted.
                .eviction_listener(move |_key, entry: Arc<L1Entry>, _cause| {
                    let weight = u64::from(entry.weight());
                    let before = removed
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                            Some(b.saturating_sub(weight))
                        })
                        .unwrap_or_default();
                    removals.l1_bytes(before.saturating_sub(weight));
                })
                .build()
        });
        L1 {
            cache,
            bytes,
            notifier,
            own: Notifier::new(),
            ttl_cap: settings.ttl_cap,
            meter,
        }
    }

    /// The store's notifier, when this cache listens to notifications.
    pub(super) fn notifier(&self) -> Option<&Notifier> {
        self.notifier.as_ref()
    }

    /// L1's weight in bytes.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// What stamps the entries: the store's notifier, or this cache's own.
    fn stamps(&self) -> &Notifier {
        self.notifier.as_ref().unwrap_or(&self.own)
    }

    /// What this process has heard of the key so far, to stamp a value about to be read;
    /// `None` while notifications are not received (nothing read now may enter L1). Without
    /// notifications, entries live out their L1 TTL, or until this process changes them.
    pub(super) fn stamp(&self, digest: &KeyDigest) -> Option<Stamp> {
        match &self.notifier {
            Some(notifier) => notifier.stamp(digest),
            None => Some(self.own.stamp_anyway(digest)),
        }
    }

    /// A stamp even while notifications are lost, for values loaded while the store fails;
    /// they go out of date when notifications are received again.
    pub(super) fn stamp_anyway(&self, digest: &KeyDigest) -> Stamp {
        self.stamps().stamp_anyway(digest)
    }

    /// The stamp of a key once this process's own write of it (`stamp` taken before) is
    /// heard: the store notifies it once where this cache hears notifications; its own
    /// notifier hears writes of no value, only changes.
    pub(super) fn after_own_write(&self, stamp: Stamp) -> Stamp {
        match &self.notifier {
            Some(_) => stamp.after_own_change(),
            None => stamp,
        }
    }

    /// The entry of a key, if it is there and nothing has been heard of the key since it was
    /// read; an entry that is no longer trusted is dropped. `recoveries` tells the store's
    /// count of recoveries, asked only of an entry loaded while the store failed. Reads the
    /// clock once, for both the entry's end in L1 and its refresh point.
    pub(super) fn get(
        &self,
        digest: &KeyDigest,
        recoveries: impl FnOnce() -> u64,
    ) -> Option<L1Hit> {
        let l1 = self.cache.as_ref()?;
        let entry = l1.get(digest)?;
        let now = Instant::now();
        let vouched = match entry.vouch {
            Vouch::Heard(stamp) => self.stamp(digest) == Some(stamp),
            Vouch::Alone(stamp, since) => {
                since == recoveries() && self.stamp_anyway(digest) == stamp
            }
        };
        if vouched
            && now < entry.until
            && entry
                .tags
                .iter()
                .all(|(tag, stamp)| self.stamp_anyway(tag) == *stamp)
        {
            return Some(match entry.refresh_at {
                Some(at) if now >= at => L1Hit::RefreshDue(entry),
                _ => L1Hit::Fresh(entry, now),
            });
        }
        l1.invalidate(digest);
        None
    }

    /// Whether L1 holds an entry of the key, trusted or not.
    pub(super) fn contains(&self, digest: &KeyDigest) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|l1| l1.contains_key(digest))
    }

    /// Drops the entry of a key this process changed, and moves the key's stamp on, so that
    /// no value read before the change enters after it.
    pub(super) fn forget_changed(&self, key: &StoreKey) {
        self.stamps().notify(key);
        if let Some(l1) = &self.cache {
            l1.invalidate(key.digest());
        }
    }

    /// Drops every entry, and moves every stamp on, so that no value read before enters
    /// after: the namespace was cleared here. Whether or not the store's clear was made (the
    /// breaker open, the store down), as [`forget_changed`](Self::forget_changed) is.
    pub(super) fn clear(&self) {
        self.stamps().cleared();
        if let Some(l1) = &self.cache {
            l1.invalidate_all();
        }
    }

    /// Keeps `value`, decoded from `bytes`, with the entry of the key if that entry holds
    /// these very bytes (the same buffer: alive, so equal pointers and lengths mean equal
    /// contents), so the first hit on the entry does not decode them again. For typed values.
    #[cfg(feature = "serde")]
    pub(super) fn keep_decoded<T: Any + Send + Sync>(
        &self,
        digest: &KeyDigest,
        bytes: &Bytes,
        value: &Arc<T>,
    ) {
        let Some(l1) = &self.cache else { return };
        if let Some(entry) = l1.get(digest) {
            if entry.value.as_ptr() == bytes.as_ptr() && entry.value.len() == bytes.len() {
                let _ = entry.decoded.set(Arc::clone(value) as Decoded);
            }
        }
    }

    /// Keeps a value while it is fresh in the store for `fresh_for` (and no longer than the
    /// L1 cap), under what vouches for it; `refresh_at` tells, from when it stops being
    /// fresh, when a hit refreshes it early.
    pub(super) fn insert(
        &self,
        vouch: Vouch,
        tags: TagStamps,
        digest: KeyDigest,
        value: &Bytes,
        fresh_for: Duration,
        refresh_at: impl FnOnce(Instant) -> Option<Instant>,
    ) {
        let ttl = fresh_for.min(self.ttl_cap);
        if let (Some(l1), false) = (&self.cache, ttl.is_zero()) {
            let now = Instant::now();
            let fresh_until = crate::sync::later(now, fresh_for);
            let entry = L1Entry {
                refresh_at: refresh_at(fresh_until),
                // Cloned only here: with L1 off (or a value it does not keep), bytes read
                // from the store stay unshared (a clone of bytes from a `Vec` allocates).
                value: value.clone(),
                ttl,
                fresh_until,
                vouch,
                tags,
                until: crate::sync::later(now, ttl),
                decoded: OnceLock::new(),
            };
            // Counted before the insert, so the listener never takes off what was not added.
            let weight = u64::from(entry.weight());
            let bytes = self.bytes.fetch_add(weight, Ordering::Relaxed) + weight;
            self.meter.l1_bytes(bytes);
            l1.insert(digest, Arc::new(entry));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;

    use super::{Vouch, L1};
    use crate::cache::Config;
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
        let first = cache.l1_hit(&digest, number).unwrap().value;
        let second = cache.l1_hit(&digest, number).unwrap().value;
        assert_eq!((*first, decodes.load(Ordering::Relaxed)), (42, 1));
        assert!(std::sync::Arc::ptr_eq(&first, &second));
        let text = |bytes: &Bytes| {
            decodes.fetch_add(1, Ordering::Relaxed);
            Some(String::from_utf8_lossy(bytes).into_owned())
        };
        for _ in 0..2 {
            assert_eq!(*cache.l1_hit(&digest, text).unwrap().value, "42");
        }
        assert_eq!(decodes.load(Ordering::Relaxed), 3);
        // Bytes the reader finds no value in: no hit, and nothing kept.
        let load = || async { Ok::<_, std::io::Error>(Bytes::from_static(b"x")) };
        cache.get_or_load("n", load).await.unwrap();
        let digest = KeyDigest::of(b"n");
        assert!(cache.l1_hit(&digest, number).is_none());
        assert!(cache.l1_hit(&digest, text).is_some());
    }
}
