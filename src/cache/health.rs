//! The health check: whether the shared store answers, whether its notifications are
//! received, and whether the circuit breaker is closed (see [`Cache::health`]).

use std::time::Duration;

use tokio::time::Instant;

use super::Cache;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    answered: Option<Duration>,
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
        self.answered.is_some_and(|ago| ago <= RECENT)
    }

    /// How long ago the store last answered; `None` if it never did.
    pub fn last_answer(&self) -> Option<Duration> {
        self.answered
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
        let inner = &self.inner;
        let key = inner.breaker.probe_key();
        if inner.l1.notifier().is_some() {
            // A watch subscribes its namespace if it is not (any more): dropped at once.
            drop(inner.store.subscribe(key));
        }
        let now = Instant::now();
        let recent = inner
            .breaker
            .answered()
            .is_some_and(|at| now.saturating_duration_since(at) <= RECENT);
        if !recent {
            let _ = inner.breaker.call(inner.store.get(key)).await;
        }
        Health {
            answered: inner
                .breaker
                .answered()
                .map(|at| Instant::now().saturating_duration_since(at)),
            notifications: inner.l1.notifier().map(|n| n.receiving()),
            breaker_closed: inner.breaker.is_closed(),
        }
    }
}
