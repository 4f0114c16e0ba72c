//! L1: the in-process moka cache in front of the store, bounded in bytes, whose entries never
//! outlive their freshness in the store (nor [`l1_ttl_cap`](super::CacheBuilder::l1_ttl_cap)).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{telemetry, Config, Inner};
use crate::store::KeyDigest;

/// The moka cache that holds L1.
pub(super) type L1 = moka::future::Cache<KeyDigest, L1Entry>;

/// An entry of L1: the value, how long it may live there, and what early refresh needs.
#[derive(Clone)]
pub(super) struct L1Entry {
    pub(super) value: Bytes,
    ttl: Duration,
    /// When the value stops being fresh in the store.
    pub(super) fresh_until: Instant,
    /// How long its load took (XFetch's δ).
    pub(super) load_time: Duration,
}

impl L1Entry {
    /// What the entry costs L1: its value, plus about what the digest and moka's own
    /// bookkeeping cost per entry.
    fn weight(&self) -> u32 {
        u32::try_from(self.value.len().saturating_add(96)).unwrap_or(u32::MAX)
    }
}

struct L1Expiry;

impl moka::Expiry<KeyDigest, L1Entry> for L1Expiry {
    fn expire_after_create(
        &self,
        _key: &KeyDigest,
        value: &L1Entry,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &KeyDigest,
        value: &L1Entry,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// L1 for `config`, or `None` when its capacity is 0. `bytes` follows its weight: the insert
/// adds an entry's weight, and moka's eviction listener takes it off.
pub(super) fn build(config: &Config, bytes: &Arc<AtomicU64>) -> Option<L1> {
    (config.l1_capacity > 0).then(|| {
        let removed = Arc::clone(bytes);
        moka::future::Cache::builder()
            .max_capacity(config.l1_capacity)
            .weigher(|_key: &KeyDigest, entry: &L1Entry| entry.weight())
            .expire_after(L1Expiry)
            // Replaced, expired or evicted: no longer counted.
            .eviction_listener(move |_key, entry: L1Entry, _cause| {
                let weight = u64::from(entry.weight());
                let before = removed
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                        Some(b.saturating_sub(weight))
                    })
                    .unwrap_or_default();
                telemetry::l1_bytes(before.saturating_sub(weight));
            })
            .build()
    })
}

impl Inner {
    /// Keeps a value in L1 while it is fresh in the store (and no longer than the L1 cap).
    pub(super) async fn l1_insert(
        &self,
        digest: KeyDigest,
        value: Bytes,
        fresh_for: Duration,
        load_time: Duration,
    ) {
        let ttl = fresh_for.min(self.config.l1_ttl_cap);
        if let (Some(l1), false) = (&self.l1, ttl.is_zero()) {
            let entry = L1Entry {
                value,
                ttl,
                fresh_until: Instant::now() + fresh_for,
                load_time,
            };
            // Counted before the insert, so the listener never takes off what was not added.
            let weight = u64::from(entry.weight());
            let bytes = self.l1_bytes.fetch_add(weight, Ordering::Relaxed) + weight;
            telemetry::l1_bytes(bytes);
            l1.insert(digest, entry).await;
        }
    }
}
