//! `MemoryStore`'s keyspace: its values, bounded in bytes and evicted as Redis's
//! `allkeys-lru` does (the least recently used of a few sampled values), its locks, the
//! answers of loads for their waiters, and its tag clocks, each entry with its expiry; expired
//! entries are swept as writes happen.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::store::key::{KeyDigest, LockToken, StoreKey};
use crate::store::lookup::Stored;
use crate::store::primitives::load_start;

/// What a value costs the store besides its bytes: its key and the maps' bookkeeping, about.
const VALUE_OVERHEAD: usize = 160;

/// How many values an eviction compares (Redis's `maxmemory-samples` default).
const EVICTION_SAMPLES: usize = 5;

/// Who holds a lock: a leader, or the marker of a failed load (which no token opens).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    Leader(LockToken),
    Failed,
}

/// A lock: its holder, until when it holds (after which any lookup may take it), and until
/// when it is kept, lapsed, for its holder's fill (see
/// [`LockLife`](crate::store::LockLife)).
#[derive(Clone, Copy)]
pub(super) struct Lock {
    pub(super) holder: Holder,
    pub(super) lapses: Instant,
    pub(super) kept: Instant,
}

/// The keyspace: values (bounded in bytes, evicted as `allkeys-lru` does), locks and tag
/// clocks, each with its expiry.
#[derive(Default)]
pub(super) struct State {
    pub(super) values: HashMap<StoreKey, (Bytes, Instant)>,
    /// When each value was last written or read, on a counter of accesses (for eviction).
    pub(super) used: HashMap<StoreKey, u64>,
    pub(super) accesses: u64,
    /// The bytes the values cost, and the most they may.
    pub(super) bytes: usize,
    pub(super) capacity: usize,
    pub(super) locks: HashMap<StoreKey, Lock>,
    /// Answers of loads for their waiters only, beside the values (see
    /// [`StoreExt::answer_waiters`](crate::store::StoreExt::answer_waiters)): a few seconds each.
    pub(super) waiters: HashMap<StoreKey, (Bytes, Instant)>,
    pub(super) writes_since_sweep: usize,
    /// The tag state of each namespace (see [`store::tags`](crate::store::tags)).
    pub(super) tags: HashMap<String, TagState>,
}

/// A namespace's tag generation, clock, and the clock at which each tag was last invalidated.
pub(super) struct TagState {
    pub(super) generation: u64,
    pub(super) clock: u64,
    pub(super) versions: HashMap<KeyDigest, u64>,
}

impl TagState {
    /// A new generation, at clock 0.
    pub(super) fn new() -> Self {
        TagState {
            generation: crate::store::tags::new_generation(),
            clock: 0,
            versions: HashMap::new(),
        }
    }
}

impl State {
    pub(super) fn live_value(&mut self, key: &StoreKey, now: Instant) -> Option<Stored> {
        let stored = self
            .values
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(bytes, expires)| Stored {
                bytes: bytes.clone(),
                ttl: Some(truncate_to_millis(*expires - now)),
            });
        if stored.is_some() {
            self.touch(key);
        }
        stored
    }

    /// Whether the live value of `key` was loaded later than `value` (both by their
    /// [`load_start`]): then a write of `value` is refused, so a slow load cannot overwrite a
    /// newer value. A value without a load start neither refuses nor is refused.
    pub(super) fn newer_stored(&self, key: &StoreKey, value: &[u8], now: Instant) -> bool {
        let stored = self
            .values
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .and_then(|(stored, _)| load_start(stored));
        matches!((stored, load_start(value)), (Some(stored), Some(new)) if stored > new)
    }

    pub(super) fn touch(&mut self, key: &StoreKey) {
        self.accesses += 1;
        if let Some(used) = self.used.get_mut(key) {
            *used = self.accesses;
        }
    }

    /// Stores a value, then evicts past the capacity.
    pub(super) fn insert_value(&mut self, key: &StoreKey, bytes: Bytes, expires: Instant) {
        self.remove_value(key);
        self.bytes += bytes.len() + VALUE_OVERHEAD;
        self.values.insert(key.clone(), (bytes, expires));
        self.accesses += 1;
        self.used.insert(key.clone(), self.accesses);
        while self.bytes > self.capacity && !self.values.is_empty() {
            self.evict_one();
        }
    }

    pub(super) fn remove_value(&mut self, key: &StoreKey) -> Option<(Bytes, Instant)> {
        let removed = self.values.remove(key)?;
        self.used.remove(key);
        self.bytes = self.bytes.saturating_sub(removed.0.len() + VALUE_OVERHEAD);
        Some(removed)
    }

    /// Evicts the least recently used of a few sampled values.
    pub(super) fn evict_one(&mut self) {
        let victim = self
            .used
            .iter()
            .take(EVICTION_SAMPLES)
            .min_by_key(|(_, used)| **used)
            .map(|(key, _)| key.clone());
        if let Some(key) = victim {
            self.remove_value(&key);
        }
    }

    /// Who holds the lock of `key` now: a lapsed lock holds no more (a lookup may take it).
    pub(super) fn lock_holder(&self, key: &StoreKey, now: Instant) -> Option<Holder> {
        self.locks
            .get(key)
            .filter(|lock| lock.lapses > now)
            .map(|lock| lock.holder)
    }

    /// Whether the lock of `key` is `token`'s, held or lapsed while nobody took it since, as
    /// the fenced writes ask.
    pub(super) fn owns(&self, key: &StoreKey, token: LockToken, now: Instant) -> bool {
        self.locks
            .get(key)
            .is_some_and(|lock| lock.kept > now && lock.holder == Holder::Leader(token))
    }

    /// Counts a write and, once there have been as many writes as live entries, drops every
    /// expired entry: the sweep's cost is spread over the writes that made it necessary.
    pub(super) fn wrote(&mut self, now: Instant) {
        self.writes_since_sweep += 1;
        if self.writes_since_sweep > self.values.len() + self.locks.len() + self.waiters.len() {
            let expired: Vec<StoreKey> = self
                .values
                .iter()
                .filter(|(_, (_, expires))| *expires <= now)
                .map(|(key, _)| key.clone())
                .collect();
            for key in &expired {
                self.remove_value(key);
            }
            self.locks.retain(|_, lock| lock.kept > now);
            self.waiters.retain(|_, (_, expires)| *expires > now);
            self.writes_since_sweep = 0;
        }
    }
}

/// Redis reports remaining life in whole milliseconds; do the same so both stores agree.
pub(super) fn truncate_to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
