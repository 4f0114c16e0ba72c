//! Changes made outside a load: [`Cache::invalidate`] (and [`Cache::invalidate_many`]),
//! [`Cache::set`] and [`Cache::expire`] change a key in the store and in every process's L1;
//! [`Cache::clear`] drops every key of the namespace.
//!
//! Each is one store call that also voids the key's reload lock, so a load that started
//! before the change cannot fill its (older) result after it: its fenced fill is refused,
//! as Facebook's memcache leases refuse a fill after a delete. That load still answers its
//! own callers; followers waiting for it are woken by the change and load again. The same
//! notification that wakes followers drops the key from every other process's L1 (each L1
//! entry is stamped with what its process had heard of the key; see the `l1` module): within
//! milliseconds where pub/sub delivers it, and in no case later than
//! [`l1_ttl_cap`](super::CacheBuilder::l1_ttl_cap).
//!
//! This process's L1 forgets the key before the call returns, even when the store fails, and
//! a store that cannot be reached is an error: the caller must know that other processes may
//! still hold the old value.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::config::Life;
use super::engine::Cache;
use super::entry;
use super::error::Error;
use super::flights::Overtaken;
use crate::store::StoreExt;
use crate::store::{KeyDigest, StoreError, StoreKey};

impl Cache {
    /// Removes the value of `key` everywhere: from the store, from this process's L1, and
    /// (through the store's notifications) from every other process's L1.
    ///
    /// A load of `key` in progress anywhere may still answer its own callers, but its fill
    /// is refused: after `invalidate` returns `Ok`, the next read of `key` loads again.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) if the store could not be reached (or
    /// the circuit breaker is open): this process's L1 has forgotten the key, but the store
    /// and other processes may still hold it.
    pub async fn invalidate(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let key = self.store_key(key);
        let store = Arc::clone(&self.inner.parts.store);
        self.change(&key, store.invalidate(&key)).await
    }

    /// [`invalidate`](Self::invalidate)s each of `keys`, in one store call (one round trip on
    /// Redis; on a Redis Cluster, one per slot, all at once) however many there are.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) as for [`invalidate`](Self::invalidate),
    /// for all of them: some keys may have been removed from the store, others not.
    pub async fn invalidate_many<I, K>(&self, keys: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        let keys: Vec<StoreKey> = keys.into_iter().map(|key| self.store_key(key)).collect();
        if keys.is_empty() {
            return Ok(());
        }
        let digests: Vec<KeyDigest> = keys.iter().map(|key| *key.digest()).collect();
        let store = Arc::clone(&self.inner.parts.store);
        let call = store.invalidate_many(&keys);
        self.change_all(&keys, Overtaken::Keys(&digests), call)
            .await
    }

    /// Writes `value` for `key`, fresh for `ttl` (plus a share of the cache's
    /// [`ttl_jitter`](super::CacheBuilder::ttl_jitter)), through to the store, and drops the
    /// key from every process's L1 (the next read there is one store round trip).
    ///
    /// The write voids the key's reload lock, as [`invalidate`](Self::invalidate) does: a
    /// load that started before it cannot overwrite `value` with an older result. Of two
    /// writes of one key, the one made later by its process's clock stands, whichever reaches
    /// the store last: a `set` that failed here (it timed out, its bytes held up on the
    /// network) and lands afterwards never undoes a newer one. Sets of one key from processes
    /// whose clocks disagree, made closer together than that disagreement, are ordered by
    /// the clocks. (An invalidation leaves nothing to compare with: a `set` held up past an
    /// [`invalidate`](Self::invalidate) of the key writes its value when it lands.)
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) as for [`invalidate`](Self::invalidate).
    pub async fn set(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<Bytes>,
        ttl: Duration,
    ) -> Result<(), Error> {
        let key = self.store_key(key);
        let value: Bytes = value.into();
        let clock = match self.inner.parts.tags().clock_for_write().await {
            Ok(clock) => clock,
            Err(error) => {
                let digests = [*key.digest()];
                self.forget(std::slice::from_ref(&key), Overtaken::Keys(&digests));
                return Err(Error::store(error));
            }
        };
        // With the namespace's generation, so that a clear reaches it.
        let tagged = entry::Tagged {
            generation: Some(clock.generation),
            clock: clock.clock,
            tags: Vec::new(),
        };
        // Written now: a load that started before cannot overwrite it after a wait timeout.
        let (encoded, _) = entry::encode_value(
            &value,
            crate::clock::now(),
            Duration::ZERO,
            Some(&tagged),
            None,
        );
        let lives = &self.inner.parts.lives;
        let fresh_for = lives.fresh_for(Life {
            ttl: Some(ttl),
            jitter: None,
        });
        let store_ttl = fresh_for.saturating_add(lives.keep());
        let store = Arc::clone(&self.inner.parts.store);
        self.change(&key, store.set(&key, encoded, fresh_for, store_ttl))
            .await
    }

    /// Marks the value of `key` stale without removing it: the next read reloads it (one
    /// load, as for any stale value), while the cache's
    /// [`stale`](super::CacheBuilder::stale) and
    /// [`stale_if_error`](super::CacheBuilder::stale_if_error) windows may still serve the
    /// old value meanwhile, or in place of a failed reload. Without stale windows, the same
    /// as [`invalidate`](Self::invalidate).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) as for [`invalidate`](Self::invalidate).
    pub async fn expire(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let key = self.store_key(key);
        let store = Arc::clone(&self.inner.parts.store);
        let keep = self.inner.parts.lives.keep();
        self.change(&key, store.expire(&key, keep)).await
    }
}

impl Cache {
    /// Drops every value of this cache's namespace, in every process, with one store call
    /// whatever their number: the namespace starts a new generation (the one its tags count
    /// in), which every value the engine stores carries, so every value stored before is a
    /// miss from now on (one load per stampede, as any miss), and its bytes leave the store
    /// with their TTL. Every process's L1 is emptied through the store's notifications (of
    /// every namespace sharing the store in that process: its entries are read again once).
    ///
    /// Fenced as [`invalidate`](Self::invalidate) is: a load that started before the clear
    /// may still answer its own callers, but its value, filled after, is a miss at once. The
    /// clear is kept in the store, so a process started after it reads the new generation.
    ///
    /// Values written by a release of this crate before `clear` existed carry none: a clear
    /// does not reach them, and they live out their TTL. This release writes none without
    /// it, whether loaded, [`set`](Self::set) or filled by a batch: a value whose generation
    /// cannot be read (the store failing at that moment) is not stored, and `set` is then an
    /// error. Every process must run a release that knows `clear` for its L1 to be emptied.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_stampede::Error> {
    /// let cache = Cache::builder(MemoryStore::new()).namespace("catalog").build();
    /// cache
    ///     .get_or_load("sku:1", || async { Ok::<_, std::io::Error>(Bytes::from_static(b"v1")) })
    ///     .await?;
    /// cache.clear().await?;
    /// assert_eq!(cache.get("sku:1").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Store`](super::ErrorKind::Store) if the store could not be reached (or
    /// the circuit breaker is open, or the store cannot clear): this process's L1 is empty all
    /// the same, but the store and other processes may still hold the values.
    pub async fn clear(&self) -> Result<(), Error> {
        let parts = &self.inner.parts;
        let store = Arc::clone(&parts.store);
        let clear = store.clear(&parts.namespace);
        // Before and after the store call, as a change of keys: whatever the store answers (or
        // if the call is not made), a read in flight meanwhile does not enter L1 after it.
        parts.l1.clear();
        parts.known_tags.forget_generation();
        let result = self.change_all(&[], Overtaken::Every, clear).await;
        parts.l1.clear();
        parts.known_tags.forget_generation();
        result
    }

    /// Runs a store call that changes `key`, and makes this process's L1 forget the key
    /// whatever the store answers: before the call, and again after it, so that a flight
    /// that read the old value meanwhile cannot keep it either.
    async fn change(
        &self,
        key: &StoreKey,
        call: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), Error> {
        let digests = [*key.digest()];
        self.change_all(std::slice::from_ref(key), Overtaken::Keys(&digests), call)
            .await
    }

    /// [`change`](Self::change) for a call that changes several keys (or tags), which
    /// overtakes the flights `overtaken` of this process: they are detached before the call
    /// and again after it (a flight started meanwhile may have read the old value), so a
    /// caller that comes after the change never joins a flight from before it.
    pub(super) async fn change_all(
        &self,
        keys: &[StoreKey],
        overtaken: Overtaken<'_>,
        call: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), Error> {
        self.forget(keys, overtaken);
        let result = self.inner.parts.breaker.call(call).await;
        self.forget(keys, overtaken);
        result.map_err(Error::store)
    }

    /// Makes this process's L1 forget `keys`, and detaches the flights `overtaken`.
    fn forget(&self, keys: &[StoreKey], overtaken: Overtaken<'_>) {
        for key in keys {
            self.inner.parts.l1.forget_changed(key);
        }
        self.inner.flights.detach(overtaken);
    }
}
