//! `MemoryStore`: the embedded store, with the semantics of the Redis scripts.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use self::state::{Holder, State, TagState};
use super::{
    millis, BoxFuture, FillWatch, KeyDigest, LockState, LockToken, LockWhen, Lookup, Notifier,
    Renewal, Store, StoreError, StoreKey, Stored, TagClock, TagVersions, MAX_TAG_VERSIONS,
};

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
            Some(Holder::Leader(_)) | None => {
                state
                    .locks
                    .insert(key.clone(), (Holder::Leader(token), expiry(now, lock_ttl)));
                state.wrote(now);
                LockState::Acquired
            }
        };
        Lookup { value, lock }
    }

    /// A fill, fenced by the lock and by load starts: where the stored value's load started
    /// later, the value stays (the lock is freed and followers notified all the same).
    fn fill_now(&self, key: &StoreKey, token: LockToken, value: Bytes, ttl: Duration) -> bool {
        let mut written = false;
        let held = self.fenced_write(key, token, |state, now| {
            if !state.newer_stored(key, &value, now) {
                state.insert_value(key, value, expiry(now, ttl));
                written = true;
            }
        });
        held && written
    }

    /// If the lock of `key` holds `token`: `write`, then free the lock and notify, as a fill
    /// does (`true`); else nothing (`false`).
    fn fenced_write(
        &self,
        key: &StoreKey,
        token: LockToken,
        write: impl FnOnce(&mut State, Instant),
    ) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        if state.lock_holder(key, now) != Some(Holder::Leader(token)) {
            return false;
        }
        write(&mut state, now);
        state.locks.remove(key);
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        true
    }

    fn renew_now(&self, key: &StoreKey, token: LockToken, ttl: Duration) -> Renewal {
        let now = Instant::now();
        let mut state = self.state();
        if state.lock_holder(key, now) != Some(Holder::Leader(token)) {
            return Renewal::LockLost;
        }
        match state.values.get_mut(key) {
            Some((_, expires)) if *expires > now => *expires = expiry(now, ttl),
            _ => return Renewal::NoValue,
        }
        state.touch(key);
        state.locks.remove(key);
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        Renewal::Renewed
    }

    fn release_now(&self, key: &StoreKey, token: LockToken) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        if state.lock_holder(key, now) != Some(Holder::Leader(token)) {
            return false;
        }
        state.locks.remove(key);
        drop(state);
        self.notifier.notify(key);
        true
    }

    fn answer_waiters_now(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> bool {
        self.fenced_write(key, token, |state, now| {
            state
                .waiters
                .insert(key.clone(), (answer, expiry(now, ttl)));
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

    fn put_now(&self, key: &StoreKey, value: Bytes, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        if state.newer_stored(key, &value, now) {
            return false;
        }
        state.insert_value(key, value, expiry(now, ttl));
        state.wrote(now);
        drop(state);
        self.notifier.notify(key);
        true
    }

    fn extend_now(&self, key: &StoreKey, token: LockToken, lock_ttl: Duration) -> bool {
        self.replace_lock(key, token, Holder::Leader(token), lock_ttl)
    }

    fn fail_now(&self, key: &StoreKey, token: LockToken, failure_ttl: Duration) -> bool {
        let replaced = self.replace_lock(key, token, Holder::Failed, failure_ttl);
        if replaced {
            self.notifier.notify(key);
        }
        replaced
    }

    /// Applies a change of `key` that voids its lock, then notifies. `value` says what becomes
    /// of the value: `None` removes it, `Some(f)` maps (bytes, expiry) to what is kept.
    fn change(
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

    /// If the lock of `key` holds `token`, gives it to `holder` for `ttl`.
    fn replace_lock(
        &self,
        key: &StoreKey,
        token: LockToken,
        holder: Holder,
        ttl: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        if state.lock_holder(key, now) != Some(Holder::Leader(token)) {
            return false;
        }
        state.locks.insert(key.clone(), (holder, expiry(now, ttl)));
        true
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

impl Store for MemoryStore {
    fn lookup(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Lookup, StoreError>> {
        let result = self.lookup_now(key, token, lock_ttl, lock_when);
        Box::pin(async move { Ok(result) })
    }

    fn lookup_many(
        &self,
        keys: &[StoreKey],
        token: LockToken,
        lock_ttl: Duration,
        lock_when: LockWhen,
    ) -> BoxFuture<'_, Result<Vec<Lookup>, StoreError>> {
        let found = keys
            .iter()
            .map(|key| self.lookup_now(key, token, lock_ttl, lock_when))
            .collect();
        Box::pin(async move { Ok(found) })
    }

    fn fill(
        &self,
        key: &StoreKey,
        token: LockToken,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.fill_now(key, token, value, ttl);
        Box::pin(async move { Ok(result) })
    }

    fn renew(
        &self,
        key: &StoreKey,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>> {
        let result = self.renew_now(key, token, ttl);
        Box::pin(async move { Ok(result) })
    }

    fn release(&self, key: &StoreKey, token: LockToken) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.release_now(key, token);
        Box::pin(async move { Ok(result) })
    }

    fn extend(
        &self,
        key: &StoreKey,
        token: LockToken,
        lock_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.extend_now(key, token, lock_ttl);
        Box::pin(async move { Ok(result) })
    }

    fn put(
        &self,
        key: &StoreKey,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.put_now(key, value, ttl);
        Box::pin(async move { Ok(result) })
    }

    fn get(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let result = self.state().live_value(key, Instant::now());
        Box::pin(async move { Ok(result) })
    }

    fn fail(
        &self,
        key: &StoreKey,
        token: LockToken,
        failure_ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.fail_now(key, token, failure_ttl);
        Box::pin(async move { Ok(result) })
    }

    fn answer_waiters(
        &self,
        key: &StoreKey,
        token: LockToken,
        answer: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.answer_waiters_now(key, token, answer, ttl);
        Box::pin(async move { Ok(result) })
    }

    fn waiters_answer(&self, key: &StoreKey) -> BoxFuture<'_, Result<Option<Stored>, StoreError>> {
        let result = self.waiters_answer_now(key);
        Box::pin(async move { Ok(result) })
    }

    fn subscribe<'a>(&'a self, key: &'a StoreKey) -> Option<FillWatch<'a>> {
        Some(self.notifier.watch(key))
    }

    fn invalidate(&self, key: &StoreKey) -> BoxFuture<'_, Result<(), StoreError>> {
        self.change(key, |_, _| None);
        Box::pin(async { Ok(()) })
    }

    fn invalidate_many(&self, keys: &[StoreKey]) -> BoxFuture<'_, Result<(), StoreError>> {
        for key in keys {
            self.change(key, |_, _| None);
        }
        Box::pin(async { Ok(()) })
    }

    fn set(
        &self,
        key: &StoreKey,
        value: Bytes,
        _fresh_for: Duration,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        // Freshness is judged by each lookup from the remaining life; no marker to set.
        self.change(key, |_, now| Some((value, expiry(now, ttl))));
        Box::pin(async { Ok(()) })
    }

    fn expire(&self, key: &StoreKey, keep: Duration) -> BoxFuture<'_, Result<(), StoreError>> {
        self.change(key, |old, now| {
            let (bytes, expires) = old?;
            let kept = (!keep.is_zero()).then(|| expiry(now, keep))?;
            Some((bytes, expires.min(kept)))
        });
        Box::pin(async { Ok(()) })
    }

    fn notifier(&self) -> Option<&Notifier> {
        Some(&self.notifier)
    }

    fn clear(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        self.state()
            .tags
            .insert(namespace.to_owned(), TagState::new());
        self.notifier.cleared();
        Box::pin(async { Ok(()) })
    }

    fn tag_clock(&self, namespace: &str) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        let mut state = self.state();
        let tags = state
            .tags
            .entry(namespace.to_owned())
            .or_insert_with(TagState::new);
        let clock = TagClock {
            generation: tags.generation,
            clock: tags.clock,
        };
        Box::pin(async move { Ok(clock) })
    }

    fn tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        let state = self.state();
        let versions = state.tags.get(namespace).map(|state| TagVersions {
            generation: state.generation,
            versions: tags
                .iter()
                .map(|tag| state.versions.get(tag).copied().unwrap_or(0))
                .collect(),
        });
        Box::pin(async move { Ok(versions) })
    }

    fn invalidate_tags(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        {
            let mut state = self.state();
            let state = state
                .tags
                .entry(namespace.to_owned())
                .or_insert_with(TagState::new);
            if state.versions.len() + tags.len() > MAX_TAG_VERSIONS {
                *state = TagState::new();
            }
            state.clock += 1;
            for tag in tags {
                state.versions.insert(*tag, state.clock);
            }
        }
        let namespace: Arc<str> = Arc::from(namespace);
        for tag in tags {
            self.notifier
                .notify(&StoreKey::new(Arc::clone(&namespace), *tag));
        }
        Box::pin(async { Ok(()) })
    }
}

mod state;
#[cfg(test)]
mod tests;
