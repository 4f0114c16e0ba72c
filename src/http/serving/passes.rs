//! The layer's report of its passes, beside `Cache-Status`'s `detail`: a metric by reason
//! (`stampede_http_passes_total{reason}`, with the `metrics` feature) and a `WARN` that names
//! the rule and its header, at most once a minute per rule (and header) per layer, so that a
//! route the layer never caches is seen in the logs without flooding them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::cache::telemetry::Meter;
use crate::http::rules::pass::Pass;

/// How long a rule's warning keeps quiet after it was logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where a layer reports its passes; clones share the rate limiter.
#[derive(Clone, Debug, Default)]
pub(crate) struct Passes {
    /// The cache's meter (its namespace labels the metric); none for a layer's settings
    /// before it has a cache, as in unit tests.
    meter: Option<Meter>,
    warnings: Arc<RateLimit>,
}

impl Passes {
    /// Reports to `meter`.
    pub(crate) fn new(meter: Meter) -> Self {
        Passes {
            meter: Some(meter),
            warnings: Arc::default(),
        }
    }

    /// Counts a pass, and warns of it unless this rule (with this header) warned less than a
    /// minute ago.
    pub(crate) fn report(&self, pass: Pass) {
        if let Some(meter) = &self.meter {
            meter.pass(pass.rule());
        }
        if !self.warnings.allows(pass, Instant::now()) {
            return;
        }
        let remedy = pass.remedy();
        match pass.header() {
            Some(header) => warn!(
                rule = pass.rule(),
                header,
                "a request passed the cache (neither answered from it nor stored); its \
                 Cache-Status says why in `detail` (one warning a minute per rule): {remedy}"
            ),
            None => warn!(
                rule = pass.rule(),
                "a request passed the cache (neither answered from it nor stored); its \
                 Cache-Status says why in `detail` (one warning a minute per rule): {remedy}"
            ),
        }
    }
}

/// When each rule last warned.
#[derive(Debug, Default)]
struct RateLimit {
    last: Mutex<HashMap<Pass, Instant>>,
}

impl RateLimit {
    /// Whether `pass` may warn `now`: it never did, or did [`WARN_EVERY`] ago or more (then
    /// it is counted as warning now). The rules, each with its headers, are few: the map
    /// stays small.
    fn allows(&self, pass: Pass, now: Instant) -> bool {
        let mut last = crate::sync::lock(&self.last);
        match last.get(&pass) {
            Some(at) if now.saturating_duration_since(*at) < WARN_EVERY => false,
            _ => {
                last.insert(pass, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_rule_warns_at_most_once_a_minute() {
        let limit = RateLimit::default();
        let allowed = |pass| limit.allows(pass, Instant::now());
        assert!(allowed(Pass::Credentials));
        assert!(!allowed(Pass::Credentials));
        assert!(allowed(Pass::NoFreshness), "each rule has its own minute");
        assert!(allowed(Pass::NamedHeader("x-theme")));
        assert!(allowed(Pass::NamedHeader("x-debug")), "and each header");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!allowed(Pass::Credentials));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(allowed(Pass::Credentials));
        assert!(!allowed(Pass::Credentials));
        assert!(allowed(Pass::NoFreshness));
    }
}
