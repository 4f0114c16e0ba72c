//! What the engine reports: `tracing` events and spans always, and metrics through the
//! [`metrics`](https://docs.rs/metrics) facade with the `metrics` feature (a no-op without it).
//!
//! Every metric carries a `cache` label, the cache's
//! [`namespace`](super::CacheBuilder::namespace), so two caches of one process (the HTTP
//! layer's and a hot key's) are told apart; the table names the other labels. It is not called
//! `namespace`: Prometheus's Kubernetes discovery sets a target label of that name, which
//! would rename ours `exported_namespace`. No label is named as a scrape's target labels are
//! (`job`, `instance`, `pod`). In PromQL, per cache:
//! `sum by (cache) (rate(stampede_loads_total[5m]))`.
//!
//! | metric | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `stampede_lookups_total` | counter | `outcome` | calls answered, by [`Outcome::label`](super::Outcome::label) (`hit-l1`, `hit-l2`, `miss-leader`, `follower`, `stale`, `pass`, `uncached`, `degraded`, `revalidated`; the HTTP layer adds `bypass`) |
//! | `stampede_loads_total` | counter | | loads started (loader calls) |
//! | `stampede_load_duration_seconds` | histogram | | how long loads took |
//! | `stampede_lock_total` | counter | `event` | reload locks `acquired`, `contended` (held elsewhere), `lost` (a fill or renewal refused), `extended` (renewed by the watchdog) |
//! | `stampede_follower_wait_seconds` | histogram | `ended` | how long callers waited for another caller's load: a flight that followed another leader through the store, by how its last wait ended (`notified`, `polled`, `timed_out`), and a call that joined a flight of this process (`joined`), until the flight answered it |
//! | `stampede_store_errors_total` | counter | | store calls that failed or timed out |
//! | `stampede_corrupt_entries_total` | counter | | stored values this engine (or a typed reader) could not read: each a miss, reloaded and overwritten |
//! | `stampede_breaker_open` | gauge | | 1 while the circuit breaker is open, else 0 |
//! | `stampede_l1_bytes` | gauge | | L1's weighted size in bytes (values plus a per-entry overhead) |
//! | `stampede_http_passes_total` | counter | `reason` | requests the HTTP layer passed (neither answered from the cache nor stored), by the rule that made them pass: the `detail` of their `Cache-Status` without its header (`credentials`, `no-freshness`, `method-override`, `forwarding-header`, `pass-header`, `too-many-variants`, ...; see [the HTTP guide](crate::guide::http#why-a-request-passes)) |
//!
//! Every metric is described (its `# HELP` text, and its unit) by [`describe_metrics`], which
//! each [`CacheBuilder::build`](super::CacheBuilder::build) calls: describing is cheap and
//! idempotent, and doing it per build reaches whichever recorder is installed when the cache
//! is built (a once-per-process description would miss a recorder installed later).

use std::sync::Arc;
use std::time::Duration;

use super::outcome::Outcome;

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
    /// A call that joined a flight of this process (started by another call), until that
    /// flight answered it.
    Joined,
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
            WaitEnd::Joined => "joined",
        }
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use super::*;
    use metrics::Unit;

    /// Bucket bounds, in seconds, for the engine's two histograms
    /// (`stampede_load_duration_seconds` and `stampede_follower_wait_seconds`), from 1 ms to 30 s
    /// (the default load and wait timeouts): give them to an exporter that needs buckets, such as
    /// `metrics_exporter_prometheus::PrometheusBuilder::set_buckets_for_metric`.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub const DURATION_BUCKETS: [f64; 14] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];

    /// The names of the engine's histograms, which take [`DURATION_BUCKETS`].
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub const HISTOGRAMS: [&str; 2] = [LOAD_DURATION, FOLLOWER_WAIT];

    /// What every metric of this crate's name starts with. Every histogram among them is a
    /// duration in seconds, so one call gives them all [`DURATION_BUCKETS`]:
    ///
    /// ```
    /// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    /// use tower_stampede::cache::{DURATION_BUCKETS, METRICS_PREFIX};
    ///
    /// let builder = PrometheusBuilder::new()
    ///     .set_buckets_for_metric(Matcher::Prefix(METRICS_PREFIX.into()), &DURATION_BUCKETS)
    ///     .expect("the buckets are not empty");
    /// # drop(builder);
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub const METRICS_PREFIX: &str = "stampede_";

    const LOOKUPS: &str = "stampede_lookups_total";
    const LOADS: &str = "stampede_loads_total";
    const LOAD_DURATION: &str = "stampede_load_duration_seconds";
    const LOCK: &str = "stampede_lock_total";
    const FOLLOWER_WAIT: &str = "stampede_follower_wait_seconds";
    const STORE_ERRORS: &str = "stampede_store_errors_total";
    const CORRUPT_ENTRIES: &str = "stampede_corrupt_entries_total";
    const BREAKER_OPEN: &str = "stampede_breaker_open";
    const L1_BYTES: &str = "stampede_l1_bytes";
    const HTTP_PASSES: &str = "stampede_http_passes_total";

    /// Describes every metric of the engine to the installed recorder: its `# HELP` text in
    /// Prometheus, and its unit. [`CacheBuilder::build`](crate::CacheBuilder::build) calls it;
    /// call it again after installing a recorder later than that.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn describe_metrics() {
        metrics::describe_counter!(
            LOOKUPS,
            "Cache calls answered, by outcome: hit-l1, hit-l2, stale (served from a cache); \
             miss-leader, follower (answered by a load); revalidated (a stored value the \
             load found unchanged); pass, uncached, degraded; bypass (the HTTP layer did \
             not use the cache)"
        );
        metrics::describe_counter!(LOADS, "Loads started by this process (loader calls)");
        metrics::describe_histogram!(LOAD_DURATION, Unit::Seconds, "How long loads took");
        metrics::describe_counter!(
            LOCK,
            "Reload lock events: acquired, contended (held elsewhere), lost (a fill or \
             renewal refused), extended (renewed while its leader works)"
        );
        metrics::describe_histogram!(
            FOLLOWER_WAIT,
            Unit::Seconds,
            "How long callers waited for another caller's load: a flight that followed \
             another process's leader, by how its wait ended (notified, polled, timed_out), \
             and a call that joined a flight of this process (joined)"
        );
        metrics::describe_counter!(
            STORE_ERRORS,
            "Store calls that failed or timed out (the cache fell back to in-process protection)"
        );
        metrics::describe_counter!(
            CORRUPT_ENTRIES,
            "Stored values that could not be read (corrupt, foreign, another type or schema): \
             each a miss, reloaded and overwritten"
        );
        metrics::describe_gauge!(
            BREAKER_OPEN,
            "1 while the store's circuit breaker is open (store calls skipped), else 0"
        );
        metrics::describe_counter!(
            HTTP_PASSES,
            "Requests the HTTP layer passed (neither answered from the cache nor stored), by \
             the rule that made them pass (the detail of their Cache-Status)"
        );
        metrics::describe_gauge!(
            L1_BYTES,
            Unit::Bytes,
            "Size of the in-process L1 cache: its values plus a per-entry overhead"
        );
    }

    impl Meter {
        pub(crate) fn lookup(&self, label: &'static str) {
            metrics::counter!(LOOKUPS, "cache" => self.label(), "outcome" => label).increment(1);
        }

        pub(crate) fn load(&self, duration: Duration) {
            metrics::counter!(LOADS, "cache" => self.label()).increment(1);
            metrics::histogram!(LOAD_DURATION, "cache" => self.label())
                .record(duration.as_secs_f64());
        }

        pub(crate) fn lock(&self, event: LockEvent) {
            metrics::counter!(LOCK, "cache" => self.label(), "event" => event.label()).increment(1);
        }

        pub(crate) fn follower_wait(&self, duration: Duration, ended: WaitEnd) {
            metrics::histogram!(
                FOLLOWER_WAIT,
                "cache" => self.label(),
                "ended" => ended.label()
            )
            .record(duration.as_secs_f64());
        }

        pub(crate) fn store_error(&self) {
            metrics::counter!(STORE_ERRORS, "cache" => self.label()).increment(1);
        }

        pub(crate) fn corrupt_entry(&self) {
            metrics::counter!(CORRUPT_ENTRIES, "cache" => self.label()).increment(1);
        }

        pub(crate) fn breaker_open(&self, open: bool) {
            metrics::gauge!(BREAKER_OPEN, "cache" => self.label()).set(if open {
                1.0
            } else {
                0.0
            });
        }

        pub(crate) fn l1_bytes(&self, bytes: u64) {
            // Precision beyond 2^53 bytes does not matter for a gauge.
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!(L1_BYTES, "cache" => self.label()).set(bytes as f64);
        }

        pub(crate) fn pass(&self, reason: &'static str) {
            metrics::counter!(HTTP_PASSES, "cache" => self.label(), "reason" => reason)
                .increment(1);
        }

        /// The namespace as a label value: a count's increment, not a copy of the text.
        fn label(&self) -> metrics::SharedString {
            metrics::SharedString::from(Arc::clone(&self.namespace))
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::*;

    impl Meter {
        pub(crate) fn lookup(&self, _label: &'static str) {}
        pub(crate) fn load(&self, _duration: Duration) {}
        pub(crate) fn lock(&self, _event: LockEvent) {}
        pub(crate) fn follower_wait(&self, _duration: Duration, _ended: WaitEnd) {}
        pub(crate) fn store_error(&self) {}
        pub(crate) fn corrupt_entry(&self) {}
        pub(crate) fn breaker_open(&self, _open: bool) {}
        pub(crate) fn l1_bytes(&self, _bytes: u64) {}
        pub(crate) fn pass(&self, _reason: &'static str) {}
    }
}

#[cfg(feature = "metrics")]
pub use imp::{describe_metrics, DURATION_BUCKETS, HISTOGRAMS, METRICS_PREFIX};

/// Where one cache's metrics go: the recorder installed when each is recorded (looked up then,
/// so a recorder installed after the cache was built still gets them), labelled with the
/// cache's namespace (as the `cache` label).
#[derive(Clone, Debug)]
pub(crate) struct Meter {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    namespace: Arc<str>,
}

impl Meter {
    /// The meter of a cache in `namespace`.
    pub(crate) fn new(namespace: &Arc<str>) -> Self {
        Meter {
            namespace: Arc::clone(namespace),
        }
    }

    /// Counts a call answered with `outcome`.
    pub(crate) fn outcome(&self, outcome: Outcome) {
        self.lookup(outcome.label());
    }
}
