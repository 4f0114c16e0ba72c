//! What the cache has counted ([`Stats`]), and the counters behind it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::breaker::CallCounts;
#[cfg(doc)]
use super::CacheBuilder;

/// Counters of what the cache has seen since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Loads started (this process's loader calls).
    pub loads: u64,
    /// Store entries that were not this engine's (corrupt or foreign): treated as a miss.
    pub corrupt_entries: u64,
    /// Store calls that failed or timed out.
    pub store_errors: u64,
    /// Store calls not made because the circuit breaker was open.
    pub store_calls_skipped: u64,
    /// Times the circuit breaker opened.
    pub breaker_opened: u64,
    /// Bytes held by L1 (values plus a per-entry overhead); entries that expired are taken
    /// off when L1 sweeps them.
    pub l1_bytes: u64,
    /// Early refreshes started by this process (see
    /// [`early_refresh`](CacheBuilder::early_refresh)); each one that takes the lock loads.
    pub early_refreshes: u64,
}

/// The counters behind [`Stats`], bumped as things happen.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) loads: AtomicU64,
    pub(super) corrupt_entries: AtomicU64,
}

impl Counters {
    /// A snapshot of the counters, with L1's current weight, the early refreshes started
    /// and what the breaker counted of the store calls.
    pub(super) fn stats(&self, l1_bytes: u64, early_refreshes: u64, calls: CallCounts) -> Stats {
        Stats {
            loads: self.loads.load(Ordering::Relaxed),
            corrupt_entries: self.corrupt_entries.load(Ordering::Relaxed),
            store_errors: calls.errors,
            store_calls_skipped: calls.skipped,
            l1_bytes,
            breaker_opened: calls.opened,
            early_refreshes,
        }
    }
}
