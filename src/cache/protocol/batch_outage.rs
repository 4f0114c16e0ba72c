//! A batch when the store does not answer: one load of every key while the circuit breaker is
//! open (nothing sent to the store; what it loads kept in L1 while the store is down, as a
//! single key's is). The locks its lookup may have taken are `lock::PendingLocks`'.

use std::time::Duration;

use tokio::time::Instant;

use super::batch::{Answered, Batch, BatchKey, NOT_RETURNED};
use crate::cache::l1::TagStamps;
use crate::store::KeyDigest;

impl<K: BatchKey> Batch<K> {
    /// Loads `keys` in one call of `load`, without the store (the breaker is open): each
    /// value is kept in L1 for the cache's TTL while the store is down, as a single key loaded
    /// alone is, unless this process changed the key (or cleared) during the load.
    pub(super) async fn load_many_alone(&self, keys: Vec<(K, KeyDigest)>) -> Answered<K> {
        let load = &self.load;
        let recoveries = self.parts.breaker.recoveries();
        // Taken before the load: a change of the key made here meanwhile moves it on.
        let vouches: Vec<_> = keys
            .iter()
            .map(|(_, digest)| (self.parts.l1.stamp_anyway(digest), recoveries))
            .collect();
        let wanted = keys.iter().map(|(key, _)| key.clone()).collect();
        let started = Instant::now();
        let loaded = self.parts.load_watched(load(wanted)).await;
        let load_time = started.elapsed();
        let ttl: Duration = self.parts.lives.ttl;
        match loaded {
            Ok(mut values) => keys
                .into_iter()
                .zip(vouches)
                .map(|((key, digest), vouch)| match values.remove(&key) {
                    Some(bytes) => {
                        let tags = TagStamps::default();
                        self.parts
                            .l1_insert_alone(vouch, tags, digest, &bytes, ttl, load_time);
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
