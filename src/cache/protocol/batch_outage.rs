//! A batch when the store does not answer: the locks its lookup may have taken, released if
//! the batch goes away before it knows which (a drop guard, as a single key's flight carries
//! on to its end), and one load of every key while the circuit breaker is open (nothing sent
//! to the store; what it loads kept in L1 while the store is down, as a single key's is).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::batch::{Answered, BatchKey, BatchLoad, NOT_RETURNED};
use super::lock::spawn_release;
use crate::cache::l1::TagStamps;
use crate::cache::Inner;
use crate::store::{KeyDigest, LockToken, Store, StoreKey};

/// The locks a batch's lookup may take, under its token, until the lookup's answer hands each
/// key on: dropped before then (the batch's caller gone, or the lookup failed), it releases
/// those left (token-checked), so other processes do not wait for their TTL.
pub(super) struct PendingLocks {
    store: Arc<dyn Store>,
    keys: Vec<Option<StoreKey>>,
    token: LockToken,
}

impl PendingLocks {
    /// The locks of `keys` that a lookup under `token` is about to take.
    pub(super) fn new(store: &Arc<dyn Store>, keys: Vec<StoreKey>, token: LockToken) -> Self {
        PendingLocks {
            store: Arc::clone(store),
            keys: keys.into_iter().map(Some).collect(),
            token,
        }
    }

    /// The key of the `index`th lock, handed on: its lock is no longer this guard's.
    pub(super) fn take(&mut self, index: usize) -> Option<StoreKey> {
        self.keys.get_mut(index).and_then(Option::take)
    }

    /// Forgets every lock: the lookup was never sent (the breaker open), so it took none.
    pub(super) fn never_sent(mut self) {
        self.keys.clear();
    }
}

impl Drop for PendingLocks {
    fn drop(&mut self) {
        for key in self.keys.iter().flatten() {
            spawn_release(&self.store, key, self.token);
        }
    }
}

impl Inner {
    /// Loads `keys` in one call of `load`, without the store (the breaker is open): each
    /// value is kept in L1 for the cache's TTL while the store is down, as a single key loaded
    /// alone is, unless this process changed the key (or cleared) during the load.
    pub(super) async fn load_many_alone<K: BatchKey>(
        &self,
        keys: Vec<(K, KeyDigest)>,
        load: &BatchLoad<K>,
    ) -> Answered<K> {
        let recoveries = self.breaker.recoveries();
        // Taken before the load: a change of the key made here meanwhile moves it on.
        let vouches: Vec<_> = keys
            .iter()
            .map(|(_, digest)| (self.l1.stamp_anyway(digest), recoveries))
            .collect();
        let wanted = keys.iter().map(|(key, _)| key.clone()).collect();
        let started = Instant::now();
        let loaded = self.load_watched(load(wanted)).await;
        let load_time = started.elapsed();
        let ttl: Duration = self.config.ttl;
        match loaded {
            Ok(mut values) => keys
                .into_iter()
                .zip(vouches)
                .map(|((key, digest), vouch)| match values.remove(&key) {
                    Some(bytes) => {
                        let tags = TagStamps::default();
                        self.l1_insert_alone(vouch, tags, digest, &bytes, ttl, load_time);
                        (key, Ok(bytes))
                    }
                    None => (key, Err(crate::cache::Error::load(NOT_RETURNED.into()))),
                })
                .collect(),
            Err(error) => keys
                .into_iter()
                .map(|(key, _)| (key, Err(error.clone())))
                .collect(),
        }
    }
}
