//! The engine's settings, a slice for each component that reads them (the builder that sets
//! them is in `builder.rs`).

use std::sync::Arc;
use std::time::Duration;

/// What a follower does when it has waited [`wait_timeout`](crate::CacheBuilder::wait_timeout) for
/// another leader's load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitTimeoutPolicy {
    /// Load from the backend and answer with it, without storing it (as nginx's
    /// `proxy_cache_lock_timeout` does). One load per process, since the process's waiting
    /// callers share one flight.
    #[default]
    LoadUncached,
    /// Load from the backend, answer with it, and store it (with
    /// [`StoreExt::put`](crate::store::StoreExt::put), whatever the lock holds) so later callers
    /// everywhere find it; the slow leader's fill overwrites it when it lands. The write is
    /// refused where the stored value's load started later than this one (a newer value is
    /// never overwritten by an older load). One load per process, as with `LoadUncached`.
    LoadAndCache,
    /// Answer with the stale value seen while waiting, if it is within
    /// [`stale_if_error`](crate::CacheBuilder::stale_if_error); otherwise fail as `Error` does. No
    /// load: for backends that must be protected above all.
    ServeStale,
    /// Fail with [`ErrorKind::WaitTimeout`](crate::ErrorKind::WaitTimeout).
    Error,
}

/// The engine's settings, shared by every clone of a [`Cache`](crate::Cache): a slice for each component
/// that reads them.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) namespace: Arc<str>,
    pub(crate) readable_keys: bool,
    pub(crate) lives: Lives,
    pub(crate) loads: Loads,
    pub(crate) waits: Waits,
    pub(crate) l1: L1Settings,
    pub(crate) breaker: BreakerSettings,
}

/// How long a loaded value stays fresh: its TTL and its jitter, each `None` where the loader
/// left it to the cache.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Life {
    pub(super) ttl: Option<Duration>,
    pub(super) jitter: Option<Duration>,
}

/// How long what a load writes lives in the store: fresh, stale, or as a marker.
#[derive(Clone, Debug)]
pub(crate) struct Lives {
    pub(crate) ttl: Duration,
    pub(crate) ttl_jitter: Duration,
    pub(crate) pass_ttl: Duration,
    pub(crate) failure_ttl: Duration,
    pub(crate) stale: Duration,
    pub(crate) stale_if_error: Option<Duration>,
    pub(crate) keep_for_revalidation: Duration,
}

/// How a leader loads: its lock, its time, and what its callers wait for.
#[derive(Clone, Debug)]
pub(crate) struct Loads {
    pub(crate) lock_ttl: Duration,
    pub(crate) load_timeout: Duration,
    pub(crate) refresh_in_background: bool,
    pub(crate) soft_timeout: Option<Duration>,
    pub(crate) early_refresh_beta: f64,
}

/// How a follower waits for another leader's load.
#[derive(Clone, Debug)]
pub(crate) struct Waits {
    pub(crate) wait_timeout: Duration,
    pub(crate) on_wait_timeout: WaitTimeoutPolicy,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_multiplier: f64,
    pub(crate) backoff_max: Duration,
    pub(crate) poll_while_notified: Duration,
}

/// L1's bounds, and whether it hears of changes made elsewhere.
#[derive(Clone, Debug)]
pub(crate) struct L1Settings {
    pub(crate) capacity: u64,
    pub(crate) ttl_cap: Duration,
    pub(crate) notifications: bool,
}

/// The store calls' timeout, and when the circuit breaker opens.
#[derive(Clone, Debug)]
pub(crate) struct BreakerSettings {
    pub(crate) store_timeout: Duration,
    pub(crate) threshold: u32,
    pub(crate) open_for: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: Arc::from("stampede"),
            readable_keys: false,
            lives: Lives {
                ttl: Duration::from_secs(60),
                ttl_jitter: Duration::ZERO,
                pass_ttl: Duration::from_secs(5),
                failure_ttl: Duration::from_secs(1),
                stale: Duration::ZERO,
                stale_if_error: None,
                keep_for_revalidation: Duration::ZERO,
            },
            loads: Loads {
                lock_ttl: Duration::from_secs(5),
                load_timeout: Duration::from_secs(30),
                refresh_in_background: true,
                soft_timeout: None,
                early_refresh_beta: 1.0,
            },
            waits: Waits {
                wait_timeout: Duration::from_secs(30),
                on_wait_timeout: WaitTimeoutPolicy::LoadUncached,
                backoff_initial: Duration::from_millis(5),
                backoff_multiplier: 1.5,
                backoff_max: Duration::from_millis(200),
                poll_while_notified: Duration::from_secs(1),
            },
            l1: L1Settings {
                capacity: 64 * 1024 * 1024,
                ttl_cap: Duration::from_secs(10),
                notifications: true,
            },
            breaker: BreakerSettings {
                store_timeout: Duration::from_millis(250),
                threshold: 5,
                open_for: Duration::from_secs(1),
            },
        }
    }
}

impl Lives {
    /// The longest a stale value may stand in for a failed (or too slow) load.
    pub(crate) fn stale_if_error(&self) -> Duration {
        self.stale_if_error.unwrap_or(self.stale)
    }

    /// How long a loaded value of `life` stays fresh: its TTL (or the default), plus a share
    /// of its jitter (or the cache's) drawn uniformly at random.
    pub(super) fn fresh_for(&self, life: Life) -> Duration {
        let ttl = life.ttl.unwrap_or(self.ttl);
        let jitter = life.jitter.unwrap_or(self.ttl_jitter);
        if jitter.is_zero() {
            return ttl;
        }
        ttl.saturating_add(jitter.mul_f64(rand::random::<f64>()))
    }

    /// How long a value is kept in the store past its freshness: for its stale windows, and
    /// for a revalidating reload.
    pub(crate) fn keep(&self) -> Duration {
        self.stale
            .max(self.stale_if_error())
            .max(self.keep_for_revalidation)
    }
}

impl Waits {
    /// The longest pause between a follower's reads: its slow poll while notifications are
    /// received (never shorter than the backoff's longest step).
    pub(crate) fn longest_pause(&self) -> Duration {
        self.poll_while_notified.max(self.backoff_max)
    }
}

impl Config {
    /// How long a waiters' answer stays in the store: long enough for every follower to read
    /// it (the longest pause between a follower's reads, twice, and a store call), at least a
    /// second.
    pub(crate) fn waiters_ttl(&self) -> Duration {
        self.waits
            .longest_pause()
            .saturating_mul(2)
            .saturating_add(self.breaker.store_timeout)
            .max(Duration::from_secs(1))
    }
}
