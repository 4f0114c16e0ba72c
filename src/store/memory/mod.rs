//! `MemoryStore`: the embedded store, with the semantics of the Redis scripts.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | `MemoryStore`: its state's upkeep (expiry, eviction) and the steps the calls share |
//! | `store.rs` | `impl Store for MemoryStore`: its primitives, each variant of a settlement or a change sent to its step in `mod.rs`; the tag state |
//! | `state.rs` | the values, locks and tag state it keeps |
//! | `tests.rs` | its tests |

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use self::state::{Holder, Lock, State};
use super::key::{LockToken, StoreKey};
use super::lookup::{LockState, LockWhen, Lookup, Stored};
use super::notify::Notifier;
use super::primitives::{millis, LockLife, Settled};

/// The embedded store: values and locks in this process's memory, with Redis's semantics
/// (value TTLs, lock TTLs, owner tokens, fenced fills).
///
/// It is the default store: it needs no server, and several [`Cache`](crate::Cache) instances
/// that share one `MemoryStore` (clones share their state) behave like several processes
/// sharing one Redis. It is not shared across processes; use `RedisStore` for that.
///
/// Time is read from [`tokio::time::Instant`], so tests with paused time can drive it.
/// Expired entries are swept as writes happen, at an amortised constant cost per write.
///
/// Its values are bounded in bytes ([`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) unless
/// [`with_capacity`](Self::with_capacity) says otherwise): past the bound, a write evicts the
/// least recently used of a few sampled values, as Redis's `allkeys-lru` does, so distinct
/// keys (a URL's every query string) cannot grow it without limit before their TTLs pass.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    notifier: Notifier,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_capacity(MemoryStore::DEFAULT_CAPACITY)
    }
}

fn expiry(now: Instant, ttl: Duration) -> Instant {
    now + Duration::from_millis(millis(ttl))
}

/// A leader's lock taken (or renewed) at `now` for `lock_ttl`, kept past it while lapsed.
fn leader_lock(token: LockToken, now: Instant, lock_ttl: Duration) -> Lock {
    Lock {
        holder: Holder::Leader(token),
        lapses: expiry(now, lock_ttl),
        kept: expiry(now, LockLife::of(lock_ttl).whole()),
    }
}

impl MemoryStore {
    /// The bound on a store's values unless [`with_capacity`](Self::with_capacity) gives
    /// another: 256 MiB (values plus about 160 bytes each for their keys).
    pub const DEFAULT_CAPACITY: usize = 256 << 20;

    /// An empty store, its values bounded by [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY).
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// An empty store whose values cost at most `bytes` (each value counts its bytes and about
    /// 160 more for its key); past it, writes evict the least recently used values.
    pub fn with_capacity(bytes: usize) -> Self {
        MemoryStore {
            state: Arc::new(Mutex::new(State {
                capacity: bytes,
                ..State::default()
            })),
            notifier: Notifier::default(),
        }
    }

    /// What the values held cost now, in bytes (see [`with_capacity`](Self::with_capacity)).
    pub fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// How many values the store holds, expired ones that were not swept yet included.
    pub fn len(&self) -> usize {
        self.state().values.len()
    }

    /// Whether the store holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the value of `key` as the store's own eviction would, leaving its lock: to test
    /// what an evicted value costs (Redis evicts values under `maxmemory` as well). Returns
    /// whether there was a live value.
    pub fn evict(&self, key: &StoreKey) -> bool {
        let now = Instant::now();
        let removed = self.state().remove_value(key);
        removed.is_some_and(|(_, expires)| expires > now)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock, and every write leaves the maps
        // consistent, so a poisoned lock still guards valid state.
        crate::sync::lock(&self.state)
    }

    fn lookup_now(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> Lookup {
        let now = Instant::now();
        let mut state = self.state();
        let value = state.live_value(key, now);
        let bound = match lock_when {
            LockWhen::LifeAtMost(bound) | LockWhen::Early { life: bound, .. } => Some(bound),
            LockWhen::Always => None,
        };
        if let (Some(Stored { ttl: Some(ttl), .. }), Some(bound)) = (&value, bound) {
            if *ttl > bound {
                return Lookup {
                    value,
                    lock: LockState::NotRequested,
                };
            }
        }
        let lock = match state.lock_holder(key, now) {
            Some(Holder::Failed) => LockState::Failed,
            // A lock held under the caller's own token is its own: taken again, as on Redis.
            Some(Holder::Leader(held)) if held != token => LockState::HeldElsewhere,
            // Free, lapsed, or the caller's own.
            Some(Holder::Leader(_)) | None => {
                state
                    .locks
                    .insert(key.clone(), leader_lock(token, now, lock_ttl));
                state.wrote(now);
                LockState::Acquired
            }
        };
        Lookup { value, lock }
    }

    /// A fill, fenced by the lock and by load starts: where the stored value's load started
    /// later, the value stays (the lock is freed and followers notified all the same).
    fn fill_now(&self, key: &StoreKey, token: LockToken, value: Bytes, ttl: Duration) -> Settled {
        self.fenced_write(key, token, |state, now| {
            if state.newer_stored(key, &value, now) {
                return Settled::KeptNewer;
            }
            state.insert_value(key, value, expiry(now, ttl));
            Settled::Done
        })
    }

    /// If the lock of `key` holds `token`: `write`, then free the lock and notify, as a fill
    /// does (what `write` answers); else nothing ([`Settled::LockLost`]).
    fn fenced_write(
        &self,
        key: &StoreKey,
        token: LockToken,
        write: impl FnOnce(&mut State, Instant) -> Settled,
    ) -> Settled {
        let now = Instant::now();
        let mut state = self.state();
        if !state.owns(key, token, now) {
            return Settled::LockLost;
        }
        let settled = write(&mut state, now);
        state.locks.remove(key);
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        settled
    }

    fn renew_now(&self, key: &StoreKey, token: LockToken, ttl: Duration) -> Settled {
        let now = Instant::now();
        let mut state = self.state();
        if !state.owns(key, token, now) {
            return Settled::LockLost;
        }
        match state.values.get_mut(key) {
            Some((_, expires)) if *expires > now => *expires = expiry(now, ttl),
            _ => return Settled::NoValue,
        }
        state.touch(key);
        state.locks.remove(key);
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        Settled::Done
    }

    fn release_now(&self, key: &StoreKey, token: LockToken) -> Settled {
        let now = Instant::now();
        let mut state = self.state();
        if !state.owns(key, token, now) {
            return Settled::LockLost;
        }
        state.locks.remove(key);
        drop(state);
        self.notifier.notify(key);
        Settled::Done
    }

    fn answer_waiters_now(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> Settled {
        self.fenced_write(key, token, |state, now| {
            state
                .waiters
                .insert(key.clone(), (answer, expiry(now, ttl)));
            Settled::Done
        })
    }

    fn waiters_answer_now(&self, key: &StoreKey) -> Option<Stored> {
        let now = Instant::now();
        self.state()
            .waiters
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(bytes, expires)| Stored {
                bytes: bytes.clone(),
                ttl: Some(state::truncate_to_millis(*expires - now)),
            })
    }

    /// A fenced write, of a put or of a set (which voids the lock as well: `set`): refused
    /// where the stored value was written (or its load started) later; else written, then
    /// notified. Freshness is judged by each lookup from the remaining life: no marker to set.
    fn write_fenced(&self, key: &StoreKey, value: Bytes, ttl: Duration, set: bool) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        if state.newer_stored(key, &value, now) {
            return false;
        }
        state.insert_value(key, value, expiry(now, ttl));
        if set {
            state.locks.remove(key);
        }
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        true
    }

    /// Renews each of `locks` that is its token's, in one step on the state (as one round
    /// trip on Redis).
    fn extend_now(&self, locks: &[(StoreKey, LockToken)], lock_ttl: Duration) -> Vec<bool> {
        let now = Instant::now();
        let mut state = self.state();
        locks
            .iter()
            .map(|(key, token)| {
                let owned = state.owns(key, *token, now);
                if owned {
                    state
                        .locks
                        .insert(key.clone(), leader_lock(*token, now, lock_ttl));
                }
                owned
            })
            .collect()
    }

    /// If the lock of `key` is `token`'s (held, or lapsed while nobody took it), replaces it
    /// by the failure marker for `failure_ttl`.
    fn fail_now(&self, key: &StoreKey, token: LockToken, failure_ttl: Duration) -> Settled {
        let now = Instant::now();
        let mut state = self.state();
        if !state.owns(key, token, now) {
            return Settled::LockLost;
        }
        let lapses = expiry(now, failure_ttl);
        let failed = Lock {
            holder: Holder::Failed,
            lapses,
            kept: lapses,
        };
        state.locks.insert(key.clone(), failed);
        drop(state);
        self.notifier.notify(key);
        Settled::Done
    }

    /// Applies a change of `key` that voids its lock, then notifies. `value` says what becomes
    /// of the value: `None` removes it, `Some(f)` maps (bytes, expiry) to what is kept.
    fn change_now(
        &self,
        key: &StoreKey,
        value: impl FnOnce(Option<(Bytes, Instant)>, Instant) -> Option<(Bytes, Instant)>,
    ) {
        let now = Instant::now();
        let mut state = self.state();
        let old = state
            .remove_value(key)
            .filter(|(_, expires)| *expires > now);
        if let Some((bytes, expires)) = value(old, now) {
            state.insert_value(key, bytes, expires);
        }
        state.locks.remove(key);
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryStore")
            .field("values", &state.values.len())
            .field("locks", &state.locks.len())
            .finish()
    }
}

mod state;
mod store;
#[cfg(test)]
mod tests;
