//! The health check: whether the shared store answers, whether its notifications are
//! received, and whether the circuit breaker is closed (see [`Cache::health`]).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::engine::Cache;

/// How recently the store must have answered a call for the health check to take it as
/// answering without asking it.
const RECENT: Duration = Duration::from_secs(1);

/// What [`Cache::health`] found. [`is_healthy`](Self::is_healthy) is the answer for a
/// dashboard or an alert; the other methods say what is wrong.
///
/// An unhealthy cache still answers every call (the store is an optimisation): loads are
/// then protected within this process only, one per key per process, and L1 keeps what this
/// process loads. So it is no reason to fail a readiness probe: every instance shares the
/// store, and a probe that failed with it would take them all out of service at once.
///
/// `Display` is one line of `name=value` pairs, for a health route or a log:
/// `healthy=true store_answers=true last_answer_ago_ms=12 notifications_live=true
/// breaker_closed=true` (`last_answer_ago_ms=never` for a store that never answered,
/// `notifications_live=unused` for a cache without notifications). With the `serde` feature
/// it serializes as a struct of the same names (`last_answer_ago_ms` and `notifications_live`
/// `null` where `Display` says `never` and `unused`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    last_answer_ago: Option<Duration>,
    notifications: Option<bool>,
    breaker_closed: bool,
}

impl Health {
    /// Whether all is well: the store answered within the last second (or answered the
    /// check), its notifications are received (or the cache does not use any), and the
    /// circuit breaker is closed.
    pub fn is_healthy(&self) -> bool {
        self.store_answers() && self.notifications != Some(false) && self.breaker_closed
    }

    /// Whether the store answered a call within the last second, or answered the check.
    pub fn store_answers(&self) -> bool {
        self.last_answer_ago.is_some_and(|ago| ago <= RECENT)
    }

    /// How long ago the store last answered; `None` if it never did.
    pub fn last_answer_ago(&self) -> Option<Duration> {
        self.last_answer_ago
    }

    /// [`last_answer_ago`](Self::last_answer_ago) in whole milliseconds.
    fn last_answer_ago_ms(&self) -> Option<u64> {
        self.last_answer_ago
            .map(|ago| u64::try_from(ago.as_millis()).unwrap_or(u64::MAX))
    }

    /// Whether the store's notifications are received (`Some(false)` while its subscription
    /// is down or on its way, or, on one Redis server, while its connection leaves a `PING`
    /// unanswered for a second: L1 then keeps nothing read from the store); `None` if the
    /// cache uses none.
    pub fn notifications_live(&self) -> Option<bool> {
        self.notifications
    }

    /// Whether the circuit breaker is closed (the store's calls are made).
    pub fn breaker_closed(&self) -> bool {
        self.breaker_closed
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "healthy={} store_answers={} last_answer_ago_ms=",
            self.is_healthy(),
            self.store_answers()
        )?;
        match self.last_answer_ago_ms() {
            Some(ms) => write!(f, "{ms}")?,
            None => f.write_str("never")?,
        }
        f.write_str(" notifications_live=")?;
        match self.notifications {
            Some(live) => write!(f, "{live}")?,
            None => f.write_str("unused")?,
        }
        write!(f, " breaker_closed={}", self.breaker_closed)
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for Health {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut health = serializer.serialize_struct("Health", 5)?;
        health.serialize_field("healthy", &self.is_healthy())?;
        health.serialize_field("store_answers", &self.store_answers())?;
        health.serialize_field("last_answer_ago_ms", &self.last_answer_ago_ms())?;
        health.serialize_field("notifications_live", &self.notifications)?;
        health.serialize_field("breaker_closed", &self.breaker_closed)?;
        health.end()
    }
}

impl Cache {
    /// Checks the store, for a dashboard or an alert (not a readiness probe: see [`Health`]):
    /// whether it answered a call within
    /// the last second, and if not, whether it answers a read now (one store call, within
    /// [`store_timeout`](crate::CacheBuilder::store_timeout), counted by the circuit breaker
    /// as any other); whether its notifications are received (the check also makes sure this
    /// cache's namespace is subscribed, so they come back after an outage without traffic);
    /// and whether the circuit breaker is closed. See [`Health`].
    ///
    /// With no traffic, a store that stopped answering is found out by the first check more
    /// than a second after its last answer.
    ///
    /// ```
    /// use tower_stampede::{store::MemoryStore, Cache};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = Cache::builder(MemoryStore::new()).build();
    /// let health = cache.health().await;
    /// assert!(health.is_healthy(), "{health:?}");
    /// # }
    /// ```
    pub async fn health(&self) -> Health {
        let parts = &self.inner.parts;
        let key = parts.breaker.probe_key();
        if parts.l1.notifier().is_some() {
            // A watch subscribes its namespace if it is not (any more): dropped at once.
            drop(parts.store.subscribe(key));
        }
        let now = Instant::now();
        let recent = parts
            .breaker
            .answered()
            .is_some_and(|at| now.saturating_duration_since(at) <= RECENT);
        if !recent {
            let _ = parts.breaker.call(parts.store.get(key)).await;
        }
        Health {
            last_answer_ago: parts
                .breaker
                .answered()
                .map(|at| Instant::now().saturating_duration_since(at)),
            notifications: parts.l1.notifier().map(|n| n.receiving()),
            breaker_closed: parts.breaker.is_closed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(last_answer_ago: Option<Duration>, notifications: Option<bool>) -> Health {
        Health {
            last_answer_ago,
            notifications,
            breaker_closed: true,
        }
    }

    #[test]
    fn display_names_what_each_value_measures() {
        let well = health(Some(Duration::from_micros(12_400)), Some(true));
        assert_eq!(
            well.to_string(),
            "healthy=true store_answers=true last_answer_ago_ms=12 notifications_live=true \
             breaker_closed=true"
        );
        let silent = health(None, None);
        assert_eq!(
            silent.to_string(),
            "healthy=false store_answers=false last_answer_ago_ms=never \
             notifications_live=unused breaker_closed=true"
        );
    }
}
