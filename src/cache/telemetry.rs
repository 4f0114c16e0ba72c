//! What the engine reports: `tracing` events and spans always, and metrics through the
//! [`metrics`](https://docs.rs/metrics) facade with the `metrics` feature (a no-op without it).
//!
//! | metric | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `stampede_lookups_total` | counter | `outcome` | calls answered, by [`Outcome::label`](super::Outcome::label) (`hit-l1`, `hit-l2`, `miss-leader`, `follower`, `stale`, `pass`, `uncached`, `degraded`, `revalidated`; the HTTP layer adds `bypass`) |
//! | `stampede_loads_total` | counter | | loads started (loader calls) |
//! | `stampede_load_duration_seconds` | histogram | | how long loads took |
//! | `stampede_lock_total` | counter | `event` | reload locks `acquired`, `contended` (held elsewhere), `lost` (a fill or renewal refused), `extended` (renewed by the watchdog) |
//! | `stampede_follower_wait_seconds` | histogram | `ended` | how long flights waited for another leader, by how the last wait ended: `notified`, `polled`, `timed_out` |
//! | `stampede_store_errors_total` | counter | | store calls that failed or timed out |
//! | `stampede_breaker_open` | gauge | | 1 while the circuit breaker is open, else 0 |
//! | `stampede_l1_bytes` | gauge | | L1's weighted size in bytes (values plus a per-entry overhead) |

use std::time::Duration;

use super::Outcome;

/// Something that happened to a reload lock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LockEvent {
    Acquired,
    Contended,
    Lost,
    Extended,
}

/// How a follower's wait for another leader ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// The store's "filled" notification woke it.
    Notified,
    /// Its backoff poll came first.
    Polled,
    /// The wait timeout.
    TimedOut,
}

impl LockEvent {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            LockEvent::Acquired => "acquired",
            LockEvent::Contended => "contended",
            LockEvent::Lost => "lost",
            LockEvent::Extended => "extended",
        }
    }
}

impl WaitEnd {
    pub(crate) fn label(self) -> &'static str {
        match self {
            WaitEnd::Notified => "notified",
            WaitEnd::Polled => "polled",
            WaitEnd::TimedOut => "timed_out",
        }
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use super::*;

    pub(crate) fn lookup(label: &'static str) {
        metrics::counter!("stampede_lookups_total", "outcome" => label).increment(1);
    }

    pub(crate) fn load(duration: Duration) {
        metrics::counter!("stampede_loads_total").increment(1);
        metrics::histogram!("stampede_load_duration_seconds").record(duration.as_secs_f64());
    }

    pub(crate) fn lock(event: LockEvent) {
        metrics::counter!("stampede_lock_total", "event" => event.label()).increment(1);
    }

    pub(crate) fn follower_wait(duration: Duration, ended: WaitEnd) {
        metrics::histogram!("stampede_follower_wait_seconds", "ended" => ended.label())
            .record(duration.as_secs_f64());
    }

    pub(crate) fn store_error() {
        metrics::counter!("stampede_store_errors_total").increment(1);
    }

    pub(crate) fn breaker_open(open: bool) {
        metrics::gauge!("stampede_breaker_open").set(if open { 1.0 } else { 0.0 });
    }

    pub(crate) fn l1_bytes(bytes: u64) {
        // Precision beyond 2^53 bytes does not matter for a gauge.
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!("stampede_l1_bytes").set(bytes as f64);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::*;

    pub(crate) fn lookup(_label: &'static str) {}
    pub(crate) fn load(_duration: Duration) {}
    pub(crate) fn lock(_event: LockEvent) {}
    pub(crate) fn follower_wait(_duration: Duration, _ended: WaitEnd) {}
    pub(crate) fn store_error() {}
    pub(crate) fn breaker_open(_open: bool) {}
    pub(crate) fn l1_bytes(_bytes: u64) {}
}

pub(crate) use imp::{breaker_open, follower_wait, l1_bytes, load, lock, lookup, store_error};

/// Counts a call answered with `outcome`.
pub(crate) fn outcome(outcome: Outcome) {
    lookup(outcome.label());
}
