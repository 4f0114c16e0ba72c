//! What the protocol roles are handed: the engine's components that a flight reads (the
//! store behind its breaker, L1, known tags, the renewals of held locks, the early refreshes,
//! the meter and counters) and the settings they read, each once. The engine builds one and
//! hands it to every [`Follower`](super::protocol::Follower), leader, batch and early refresh;
//! what only the engine reads (the flights in progress, the key spelling) stays on `Cache`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::breaker::Breaker;
use super::config::{BreakerSettings, Config, L1Settings, Lives, Loads, Waits};
use super::known_tags::KnownTags;
use super::l1::{self, TagStamps, Vouch, L1};
use super::refreshes::Refreshes;
use super::renewals::Renewals;
use super::stats::Counters;
use super::telemetry::Meter;
use crate::store::{KeyDigest, Stamp, Store};

/// The components and settings of one engine that its flights share.
pub(super) struct Parts {
    pub(super) store: Arc<dyn Store>,
    pub(super) breaker: Arc<Breaker>,
    pub(super) l1: L1,
    pub(super) known_tags: KnownTags,
    /// The renewals of the locks this cache's leaders hold.
    pub(super) renewals: Renewals,
    pub(super) refreshes: Refreshes,
    pub(super) meter: Meter,
    pub(super) counters: Counters,
    pub(super) namespace: Arc<str>,
    pub(super) lives: Lives,
    pub(super) loads: Loads,
    pub(super) waits: Waits,
    /// How long a load's answer for its waiters stays in the store (see
    /// [`Config::waiters_ttl`]).
    pub(super) waiters_ttl: Duration,
    /// L1's bounds and whether the store's notifications are used (wake waits, keep L1 in
    /// step); the store calls' timeout and the breaker's thresholds.
    pub(super) l1_settings: L1Settings,
    pub(super) breaker_settings: BreakerSettings,
}

impl Parts {
    /// The parts of an engine over `store` with `config`.
    pub(super) fn new(store: Arc<dyn Store>, config: &Config) -> Self {
        let notifier = config
            .l1
            .notifications
            .then(|| store.notifier().cloned())
            .flatten();
        let breaker = Breaker::new(&config.breaker, &config.namespace, Arc::clone(&store));
        let breaker = Arc::new(breaker);
        let renewals = Renewals::new(
            Arc::clone(&store),
            Arc::clone(&breaker),
            Meter::new(&config.namespace),
            config.loads.lock_ttl,
        );
        Parts {
            meter: Meter::new(&config.namespace),
            l1: L1::new(&config.l1, &config.namespace, notifier),
            renewals,
            breaker,
            store,
            refreshes: Refreshes::new(config.loads.early_refresh_beta),
            known_tags: KnownTags::default(),
            counters: Counters::default(),
            namespace: Arc::clone(&config.namespace),
            lives: config.lives.clone(),
            loads: config.loads.clone(),
            waits: config.waits.clone(),
            waiters_ttl: config.waiters_ttl(),
            l1_settings: config.l1.clone(),
            breaker_settings: config.breaker.clone(),
        }
    }
}

impl Parts {
    /// Counts a value that this flight's caller cannot read (corrupt, foreign, or another
    /// type's), in [`Stats::corrupt_entries`](crate::cache::Stats::corrupt_entries) and its metric:
    /// it is treated as a miss, and overwritten by the load that follows.
    pub(super) fn corrupt_entry(&self, digest: &KeyDigest) {
        self.counters
            .corrupt_entries
            .fetch_add(1, Ordering::Relaxed);
        self.meter.corrupt_entry();
        tracing::warn!(key = ?digest, "corrupt or foreign entry; treating it as a miss");
    }

    /// The L1 entry of a key, if it is there and trusted (see [`l1::L1::get`]).
    pub(super) fn l1_get(&self, digest: &KeyDigest) -> Option<l1::L1Hit> {
        self.l1.get(digest, || self.breaker.recoveries())
    }

    /// The value of a key's entry as `read` decodes it, if fresh, trusted and not due for an
    /// early refresh (see [`l1::L1::get_decoded`]).
    pub(super) fn l1_decoded<T: std::any::Any + Send + Sync>(
        &self,
        digest: &KeyDigest,
        read: impl FnOnce(&Bytes) -> Option<T>,
        local: impl FnOnce(&Arc<T>) -> Arc<T>,
    ) -> Option<l1::DecodedHit<T>> {
        let recoveries = || self.breaker.recoveries();
        self.l1.get_decoded(digest, recoveries, read, local)
    }

    /// Keeps a value read from the store in L1 while it is fresh there, if `stamp` (taken
    /// before the value was read) is still current; its early refresh drawn from `load_time`.
    pub(super) fn l1_insert(
        &self,
        stamp: Option<Stamp>,
        tags: TagStamps,
        digest: KeyDigest,
        value: &Bytes,
        fresh_for: Duration,
        load_time: Duration,
    ) {
        if let Some(stamp) = stamp {
            let refresh_at = |fresh_until| self.refreshes.point(fresh_until, load_time);
            let vouch = Vouch::Heard(stamp);
            self.l1
                .insert(vouch, tags, digest, value, fresh_for, refresh_at);
        }
    }

    /// Keeps a value loaded while the store failed in L1 for `ttl`, even while notifications
    /// are lost, until the store answers again: `stamp` and `recoveries`
    /// ([`Breaker::recoveries`]) were read before the load started; `tags`, the stamps of its
    /// tags, so that this process's invalidation of one drops it.
    pub(super) fn l1_insert_alone(
        &self,
        (stamp, recoveries): (Stamp, u64),
        tags: TagStamps,
        digest: KeyDigest,
        value: &Bytes,
        ttl: Duration,
        load_time: Duration,
    ) {
        let refresh_at = |fresh_until| self.refreshes.point(fresh_until, load_time);
        let vouch = Vouch::Alone(stamp, recoveries);
        self.l1.insert(vouch, tags, digest, value, ttl, refresh_at);
    }
}
