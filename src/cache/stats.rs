//! What the cache has counted ([`Stats`]), and the counters behind it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::breaker::CallCounts;
use super::outcome::Outcome;

/// Counters of what the cache has seen since it was built, for any application (the `metrics`
/// feature counts the same with labels).
///
/// The answers of calls by how they were served, [`Cache::fetch`](crate::Cache::fetch)'s [`Outcome`]: `lookups`
/// counts every call answered, and `l1_hits`, `store_hits`, `stale_answers`, `waits` and
/// `passes` the ones of each kind; the rest loaded (their own loader ran). So the hit ratio
/// is `(l1_hits + store_hits + stale_answers) / lookups`. A call that failed is not an
/// answer, and a batch's keys are not counted.
///
/// ```
/// use bytes::Bytes;
/// use tower_stampede::{store::MemoryStore, Cache};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::builder(MemoryStore::new()).build();
/// for _ in 0..3 {
///     let load = || async { Ok::<_, std::io::Error>(Bytes::from("Ada")) };
///     cache.get_or_load("user:42", load).await.unwrap();
/// }
/// let stats = cache.stats();
/// assert_eq!((stats.lookups, stats.loads, stats.l1_hits), (3, 1, 2));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls answered, whatever the outcome.
    pub lookups: u64,
    /// Calls answered from this process's L1 ([`Outcome::L1Hit`]).
    pub l1_hits: u64,
    /// Calls answered from the shared store, fresh ([`Outcome::L2Hit`]).
    pub store_hits: u64,
    /// Calls answered with a stale value while it was refreshed, or in place of a failed
    /// load ([`Outcome::Stale`]).
    pub stale_answers: u64,
    /// Calls answered by another call's load, in this process or another, which they waited
    /// for ([`Outcome::Follower`]).
    pub waits: u64,
    /// Calls answered "pass": the key's last load was not cacheable, so the caller goes to
    /// its backend ([`Outcome::Pass`]).
    pub passes: u64,
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
    /// [`early_refresh`](crate::CacheBuilder::early_refresh)); each one that takes the lock loads.
    pub early_refreshes: u64,
}

/// The counters behind [`Stats`], bumped as things happen.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) loads: AtomicU64,
    pub(super) corrupt_entries: AtomicU64,
    /// Calls answered, one counter per [`Outcome`] (by [`slot`]): a hit costs one relaxed
    /// add, and the total is summed when read.
    answers: [AtomicU64; OUTCOMES],
}

/// How many outcomes there are.
const OUTCOMES: usize = 9;

/// The counter of `outcome` in [`Counters::answers`].
fn slot(outcome: Outcome) -> usize {
    match outcome {
        Outcome::L1Hit => 0,
        Outcome::L2Hit => 1,
        Outcome::Stale => 2,
        Outcome::Follower => 3,
        Outcome::Pass => 4,
        Outcome::Leader => 5,
        Outcome::Uncached => 6,
        Outcome::Degraded => 7,
        Outcome::Revalidated => 8,
    }
}

impl Counters {
    /// Counts a call answered with `outcome`.
    pub(super) fn answered(&self, outcome: Outcome) {
        self.answers[slot(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot of the counters, with L1's current weight, the early refreshes started
    /// and what the breaker counted of the store calls.
    pub(super) fn stats(&self, l1_bytes: u64, early_refreshes: u64, calls: CallCounts) -> Stats {
        let answers = |outcome| self.answers[slot(outcome)].load(Ordering::Relaxed);
        Stats {
            lookups: self
                .answers
                .iter()
                .map(|count| count.load(Ordering::Relaxed))
                .sum(),
            l1_hits: answers(Outcome::L1Hit),
            store_hits: answers(Outcome::L2Hit),
            stale_answers: answers(Outcome::Stale),
            waits: answers(Outcome::Follower),
            passes: answers(Outcome::Pass),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_counter() {
        let outcomes = [
            Outcome::L1Hit,
            Outcome::L2Hit,
            Outcome::Stale,
            Outcome::Follower,
            Outcome::Pass,
            Outcome::Leader,
            Outcome::Uncached,
            Outcome::Degraded,
            Outcome::Revalidated,
        ];
        let mut slots: Vec<usize> = outcomes.iter().map(|&outcome| slot(outcome)).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..OUTCOMES).collect::<Vec<_>>());
        let counters = Counters::default();
        for (times, &outcome) in outcomes.iter().enumerate() {
            for _ in 0..=times {
                counters.answered(outcome);
            }
        }
        let calls = CallCounts {
            errors: 0,
            skipped: 0,
            opened: 0,
        };
        let stats = counters.stats(0, 0, calls);
        assert_eq!(stats.lookups, (1..=9).sum::<u64>());
        assert_eq!(
            [
                stats.l1_hits,
                stats.store_hits,
                stats.stale_answers,
                stats.waits,
                stats.passes
            ],
            [1, 2, 3, 4, 5]
        );
    }
}
