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
//!
//! | file | holds |
//! | --- | --- |
//! | `mod.rs` | [`L1`]: the moka cache, its entries, what vouches for them, its count of writes |
//! | `front.rs` | each thread's view of the entries it answered last, used while L1 is not written |
//! | `tests.rs` | its tests |

mod front;

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

/// What [`L1::get_decoded`] answers: the decoded value, when it stops being fresh, and when L1
/// was read.
pub(super) type DecodedHit<T> = (Arc<T>, Instant, Instant);

/// An entry's value as it is stored, as [`L1::get_value`] answers it and keeps it in view: a
/// type of its own, so that a reader whose decoded values are `Bytes` (the service layer's,
/// over a service answering `Bytes`) never takes it for one of its own in view, nor the
/// other way round.
pub(super) struct Stored(pub(super) Bytes);

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

    /// Whether the value kept decoded with the entry is a `T`.
    fn decoded_as<T: Any>(&self) -> bool {
        self.decoded.get().is_some_and(|kept| (**kept).is::<T>())
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
    /// Which L1 this is, among the process's, for each thread's view ([`front`]).
    id: u64,
    /// How many times moka was written (an insert, a removal, a clear, an eviction), each
    /// counted once done: an entry a thread keeps in view is moka's own while this has not
    /// moved since it was read there.
    writes: Arc<AtomicU64>,
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
        static IDS: AtomicU64 = AtomicU64::new(0);
        let bytes = Arc::new(AtomicU64::new(0));
        let removed = Arc::clone(&bytes);
        let writes = Arc::new(AtomicU64::new(0));
        let evicted = Arc::clone(&writes);
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
                    evicted.fetch_add(1, Ordering::SeqCst);
                })
                .build()
        });
        L1 {
            cache,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            writes,
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
        if self.trusted(&entry, digest, recoveries, now) {
            return Some(match entry.refresh_at {
                Some(at) if now >= at => L1Hit::RefreshDue(entry),
                _ => L1Hit::Fresh(entry, now),
            });
        }
        l1.invalidate(digest);
        self.written();
        None
    }

    /// Whether an entry of the key may answer at `now`: nothing heard of the key or its tags
    /// since it was read, and its time in L1 not over.
    fn trusted(
        &self,
        entry: &L1Entry,
        digest: &KeyDigest,
        recoveries: impl FnOnce() -> u64,
        now: Instant,
    ) -> bool {
        let vouched = match entry.vouch {
            Vouch::Heard(stamp) => self.stamp(digest) == Some(stamp),
            Vouch::Alone(stamp, since) => {
                since == recoveries() && self.stamp_anyway(digest) == stamp
            }
        };
        vouched
            && now < entry.until
            && entry
                .tags
                .iter()
                .all(|(tag, stamp)| self.stamp_anyway(tag) == *stamp)
    }

    /// The value of a key's entry as `read` decodes it (decoded once per entry), when it
    /// stops being fresh, and when L1 was read: as [`get`](Self::get) finds it, if it is
    /// fresh and not due for an early refresh. From this thread's view ([`front`]) if it holds
    /// the entry and L1 was not written since; else from moka, and then kept in view with
    /// this thread's copy of the value (`local`, for a value small enough).
    pub(super) fn get_decoded<T: Any + Send + Sync>(
        &self,
        digest: &KeyDigest,
        recoveries: impl Fn() -> u64,
        read: impl FnOnce(&Bytes) -> Option<T>,
        local: impl FnOnce(&Arc<T>) -> Arc<T>,
    ) -> Option<DecodedHit<T>> {
        self.viewed(digest, recoveries, |entry, small| {
            let value = entry.decoded(read)?;
            // A reader of another type than the entry's first decodes on every hit, in view
            // or not.
            let kept = (small && entry.decoded_as::<T>()).then(|| local(&value) as front::Local);
            Some((value, kept))
        })
    }

    /// The value of a key's entry as it is stored, as [`get_decoded`](Self::get_decoded) finds
    /// it: from this thread's view, in this thread's own copy, if it holds the entry.
    pub(super) fn get_value(
        &self,
        digest: &KeyDigest,
        recoveries: impl Fn() -> u64,
    ) -> Option<DecodedHit<Stored>> {
        self.viewed(digest, recoveries, |entry, small| {
            if !small {
                return Some((Arc::new(Stored(entry.value.clone())), None));
            }
            let own = Arc::new(Stored(Bytes::copy_from_slice(&entry.value)));
            Some((Arc::clone(&own), Some(own as front::Local)))
        })
    }

    /// A fresh, trusted entry not due for an early refresh: from this thread's view
    /// ([`front`]) if it holds the entry and L1 was not written since (its copy of the value
    /// is answered if it is a `T`); else read from moka, answered as `slow` makes it of the
    /// entry (told whether the value is small enough for the view), and kept in view with
    /// the copy `slow` gives.
    fn viewed<T: Any + Send + Sync>(
        &self,
        digest: &KeyDigest,
        recoveries: impl Fn() -> u64,
        slow: impl FnOnce(&L1Entry, bool) -> Option<(Arc<T>, Option<front::Local>)>,
    ) -> Option<DecodedHit<T>> {
        let l1 = self.cache.as_ref()?;
        // Read before the entry: a write after it moves it, and the view is not used.
        let writes = self.writes.load(Ordering::SeqCst);
        let viewed = front::find(self.id, writes, digest, |entry, value, sample| {
            let now = Instant::now();
            let due = entry.refresh_at.is_some_and(|at| now >= at);
            if due || !self.trusted(entry, digest, &recoveries, now) {
                return None;
            }
            if sample {
                // moka counts the read; its answer is this very entry.
                let _ = l1.get(digest);
            }
            let value = Arc::clone(value).downcast::<T>().ok()?;
            Some((value, entry.fresh_until, now))
        });
        if viewed.is_some() {
            return viewed;
        }
        let L1Hit::Fresh(entry, now) = self.get(digest, &recoveries)? else {
            return None;
        };
        let (value, kept) = slow(&entry, entry.value.len() <= front::LOCAL_MAX)?;
        let fresh_until = entry.fresh_until;
        if let Some(kept) = kept {
            front::keep(self.id, writes, *digest, entry, kept);
        }
        Some((value, fresh_until, now))
    }

    /// Counts a write of moka, once done (see [`writes`](Self::writes)).
    fn written(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
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
            self.written();
        }
    }

    /// Drops every entry, and moves every stamp on, so that no value read before enters
    /// after: the namespace was cleared here. Whether or not the store's clear was made (the
    /// breaker open, the store down), as [`forget_changed`](Self::forget_changed) is.
    pub(super) fn clear(&self) {
        self.stamps().cleared();
        if let Some(l1) = &self.cache {
            l1.invalidate_all();
            self.written();
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
            self.written();
        }
    }
}

#[cfg(test)]
mod tests;
